// The multi-turn checker and the sampler on hand-written cases (trainer/eval.h,
// trainer/generate.h): where the answer of a generated text starts, the synthetic
// check (the answer's last integer, never the thinking's), exact match of other
// answers, and sample_token's greedy, temperature and top-p choices on logits whose
// probabilities are known (1/4 and 3/4).
#include <math.h>
#include <string.h>

#include "trainer/eval.h"
#include "trainer/generate.h"
#include "tests/test_util.h"

static const GenerateTemplate TMPL = {.end_of_turn = 6, .think_open = "<think>",
                                      .think_close = "</think>"};

static void expect_answer(const char *text, const char *want) {
    size_t len = 0;
    const char *got = answer_part(text, TMPL.think_open, TMPL.think_close, &len);
    if (!want) {
        EXPECT(got == NULL, "answer of '%s': want none, got '%.*s'", text, (int)len, got);
        return;
    }
    EXPECT(got && len == strlen(want) && memcmp(got, want, len) == 0,
           "answer of '%s': want '%s', got '%.*s'", text, want, got ? (int)len : 4,
           got ? got : "NULL");
}

static void test_answer_part(void) {
    expect_answer("<think>\n2+3=5\n</think>\n\nThe result is 5.", "The result is 5.");
    expect_answer("The result is 5.  \n", "The result is 5.");
    expect_answer("<think>2+3=5 and on and on", NULL);
    expect_answer("  <think>unclosed", NULL);
    expect_answer("<think>a</think>", "");
    expect_answer("<think>a</think>b</think>c", "b</think>c");  // the first close ends the thinking
}

static void test_answer_correct(void) {
    const char *right = "<think>\n9702 + 2605 = 12307.\n</think>\n\nThe result is 12307.";
    EXPECT(answer_correct(right, &TMPL, "The result is 12307.", true, 12307), "numeric right");
    EXPECT(!answer_correct(right, &TMPL, "", true, 12306), "numeric wrong number");
    EXPECT(!answer_correct("<think>So it is 12307.</think>The result is 1.", &TMPL, "", true, 12307),
           "the thinking's number does not count");
    EXPECT(!answer_correct("<think>So it is 12307.", &TMPL, "", true, 12307),
           "unclosed thinking has no answer");
    EXPECT(answer_correct("The result is 12307.", &TMPL, "", true, 12307), "no thinking at all");
    EXPECT(!answer_correct("<think></think>The result is.", &TMPL, "", true, 0), "no number");
    EXPECT(answer_correct("<think>x</think>\nParis.", &TMPL, " Paris.\n", false, 0),
           "exact match, whitespace at the ends aside");
    EXPECT(!answer_correct("<think>x</think>paris.", &TMPL, "Paris.", false, 0), "case counts");
    EXPECT(!answer_correct("<think>x</think>Paris. Yes.", &TMPL, "Paris.", false, 0),
           "a longer answer is wrong");
}

static void test_sample_token(void) {
    float prob[3];
    int32_t order[3];
    const float quarter[2] = {0.0f, (float)log(3.0)};  // softmax: 1/4, 3/4
    EXPECT(sample_token(quarter, 2, 0.0, 1.0, 0.99, prob, order) == 1, "greedy: argmax");
    const float tie[3] = {1.0f, 2.0f, 2.0f};
    EXPECT(sample_token(tie, 3, 0.0, 1.0, 0.0, prob, order) == 1, "greedy: the lowest id on a tie");
    // Ordered by probability: id 1 (3/4) covers u in [0, 0.75), id 0 the rest.
    EXPECT(sample_token(quarter, 2, 1.0, 1.0, 0.74, prob, order) == 1, "u 0.74 draws id 1");
    EXPECT(sample_token(quarter, 2, 1.0, 1.0, 0.76, prob, order) == 0, "u 0.76 draws id 0");
    EXPECT(sample_token(quarter, 2, 1.0, 0.5, 0.99, prob, order) == 1, "top_p 0.5 keeps id 1 only");
    EXPECT(sample_token(quarter, 2, 1.0, 0.8, 0.99, prob, order) == 0, "top_p 0.8 keeps both");
    // Temperature 2: probabilities sqrt(1):sqrt(3), i.e. 0.366 and 0.634.
    EXPECT(sample_token(quarter, 2, 2.0, 1.0, 0.62, prob, order) == 1, "T 2: u 0.62 draws id 1");
    EXPECT(sample_token(quarter, 2, 2.0, 1.0, 0.65, prob, order) == 0, "T 2: u 0.65 draws id 0");
}

int main(void) {
    test_answer_part();
    test_answer_correct();
    test_sample_token();
    return test_finish();
}
