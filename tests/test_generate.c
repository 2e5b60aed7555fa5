// Generation and its checker on hand-written cases (trainer/generate.h, trainer/eval.h):
// where the answer of a generated text starts, the synthetic check (the answer's last
// integer, never the thinking's), exact match of other answers, sample_token's greedy,
// temperature and top-p choices on logits whose probabilities are known (1/4 and 3/4),
// and the scheduler over a fake decoder whose next token is a known function of the
// last token and its position: every prompt's continuation, its stop, and the positions
// (0..n-1 of the view, a reused slot reset) whatever the batch size. On the shipped eval
// set, every turn's prompt ends with the assistant header and holds no thinking, and
// its gold answer passes the synthetic check while the number next to it fails. Under
// every chat template (the fixture tokenizers of tests/data/templates), the prompt of
// turn t equals the ids training puts before turn t's think: its inference view. A line of
// many turns builds no prompt longer than the cap (data.seq_len).
#define _POSIX_C_SOURCE 200809L  // mkstemp, fdopen
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "data/template.h"
#include "data/tokenize.h"
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

// A decoder whose logits pick next = (3 * token + pos) % V and that checks each slot's
// positions run 0, 1, 2, ... from its last reset.
enum { FAKE_V = 11, FAKE_SLOTS = 8 };
typedef struct {
    int length[FAKE_SLOTS];
    int bad_positions;
} FakeDecoder;
static FakeDecoder fake;
static void *fake_create(const ModelConfig *cfg, const float *params, int max_seqs, int max_len) {
    (void)cfg, (void)params, (void)max_len;
    EXPECT(max_seqs <= FAKE_SLOTS, "%d slots", max_seqs);
    memset(&fake, 0, sizeof fake);
    for (int s = 0; s < FAKE_SLOTS; s++) fake.length[s] = -1000;  // unusable before a reset
    return &fake;
}
static void fake_destroy(void *d) { (void)d; }
static void fake_reset(void *d, int slot) { ((FakeDecoder *)d)->length[slot] = 0; }
static int fake_next(int32_t token, int32_t pos) { return (3 * token + pos) % FAKE_V; }
static void fake_forward(void *d, int n, const int32_t *slot, const int32_t *token,
                         const int32_t *pos, float *logits) {
    FakeDecoder *f = d;
    for (int i = 0; i < n; i++) {
        f->bad_positions += pos[i] != f->length[slot[i]]++;
        for (int v = 0; v < FAKE_V; v++) logits[i * FAKE_V + v] = v == fake_next(token[i], pos[i]);
    }
}
static const DecodeOps FAKE = {"fake", fake_create, fake_destroy, fake_reset, fake_forward};

static void test_scheduler(void) {
    // Prompts of lengths 1..5; end of turn is id 0, at most 6 new tokens.
    int32_t ids[5][5] = {{4}, {1, 2}, {7, 7, 7}, {2, 9, 5, 3}, {10, 1, 6, 6, 8}};
    TokenSpan prompts[5];
    for (int i = 0; i < 5; i++) prompts[i] = (TokenSpan){ids[i], i + 1};
    const ModelConfig cfg = {.vocab_size = FAKE_V};
    for (int batch = 1; batch <= 5; batch += 2) {
        const GenerateOptions opt = {.max_new_tokens = 6, .temperature = 0, .top_p = 1,
                                     .batch = batch};
        Generation out[5];
        GenerateStats stats;
        generate(&FAKE, &cfg, NULL, &opt, 0, prompts, 5, out, &stats);
        EXPECT(fake.bad_positions == 0, "batch %d: %d tokens off their view's position", batch,
               fake.bad_positions);
        long long total = 0;
        for (int i = 0; i < 5; i++) {
            // The continuation by hand: from the prompt's last token at position n-1.
            int32_t t = ids[i][i], want[6];
            int n = 0;
            for (int p = i; n < 6;) {
                want[n++] = t = fake_next(t, p++);
                if (t == 0) break;
            }
            EXPECT(out[i].n == n && memcmp(out[i].tokens, want, (size_t)n * sizeof(int32_t)) == 0 &&
                       out[i].ended == (want[n - 1] == 0),
                   "batch %d: prompt %d: %d tokens, want %d", batch, i, out[i].n, n);
            total += out[i].n;
            generation_free(&out[i]);
        }
        EXPECT(stats.generated_tokens == total && stats.prompt_tokens == 15,
               "batch %d: stats %lld / %lld", batch, stats.generated_tokens, stats.prompt_tokens);
    }
}

static void test_shipped_eval_set(void) {
    char err[1024];
    Tokenizer *tok = tokenizer_load("datasets/synthetic/tokenizer.model", err, sizeof err);
    if (!tok) {
        printf("SKIP shipped eval set: %s\n", err);
        return;
    }
    const int assistant = tokenizer_piece_to_id(tok, "<|assistant|>");
    const int think = tokenizer_piece_to_id(tok, "<think>");
    AccuracySet set;
    const DataOptions opt = {.special_in_text = SPECIAL_IN_TEXT_PLAIN};
    accuracy_set_load(&set, tok, &opt, "datasets/synthetic/eval.jsonl", 0);
    int bad_prompt = 0, not_numeric = 0, gold_wrong = 0, off_by_one_right = 0, later = 0;
    for (int i = 0; i < set.n_items; i++) {
        const AccuracyItem *it = &set.items[i];
        const TokenSpan *p = &it->prompt;
        bool has_think = false;
        for (int k = 0; k < p->n; k++) has_think |= p->ids[k] == think;
        bad_prompt += p->ids[p->n - 1] != assistant || has_think;
        not_numeric += !it->numeric;
        char text[512], wrong[64];
        snprintf(text, sizeof text, "<think>work</think>%s", it->gold);
        gold_wrong += !answer_correct(text, &TMPL, it->gold, it->numeric, it->expected);
        snprintf(wrong, sizeof wrong, "The result is %lld.", it->expected + 1);
        off_by_one_right += answer_correct(wrong, &TMPL, it->gold, it->numeric, it->expected);
        later += it->turn > 0;
    }
    EXPECT(set.n_conversations == 200 && set.n_items > 400 && later > 200,
           "%d conversations, %d turns, %d later", set.n_conversations, set.n_items, later);
    EXPECT(bad_prompt == 0, "%d prompts without the assistant header last or with thinking",
           bad_prompt);
    EXPECT(not_numeric == 0 && gold_wrong == 0 && off_by_one_right == 0,
           "synthetic checks: %d not numeric, %d gold answers wrong, %d wrong numbers right",
           not_numeric, gold_wrong, off_by_one_right);
    accuracy_set_free(&set);
    tokenizer_free(tok);
}

static void test_prompts_under_templates(void) {
    static const char *const NAMES[] = {"qwen3",  "deepseek_r1", "chatml",  "qwen2.5",     "smollm2",
                                        "llama3", "zephyr",      "onepass", "onepass_keep"};
    static const char LINE[] =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"Be exact.\"},"
        "{\"role\":\"user\",\"content\":\"Add 12 and 30.\"},"
        "{\"role\":\"assistant\",\"content\":\"It is 42.\",\"reasoning_content\":\"12 + 30 = 42.\"},"
        "{\"role\":\"user\",\"content\":\"Double it.\"},"
        "{\"role\":\"assistant\",\"content\":\"It is 84.\",\"reasoning_content\":\"42 * 2 = 84.\"},"
        "{\"role\":\"user\",\"content\":\"Add 1.\"},"
        "{\"role\":\"assistant\",\"content\":\"It is 85.\"}]}";
    for (size_t k = 0; k < sizeof NAMES / sizeof NAMES[0]; k++) {
        char dir[256], err[1024];
        snprintf(dir, sizeof dir, "tests/data/templates/%s", NAMES[k]);
        Tokenizer *tok = tokenizer_load(dir, err, sizeof err);
        // onepass_keep: onepass under data.history_thinking "keep", whose history keeps its
        // thinking in the prompt too.
        const bool keep = strcmp(NAMES[k], "onepass_keep") == 0;
        const ChatTemplate *t = keep ? template_with_history(&TEMPLATE_ONEPASS, HISTORY_THINKING_KEEP, err, sizeof err)
                                     : template_by_name(NAMES[k]);
        EXPECT(tok && t, "%s: %s", dir, err);
        if (!tok || !t) continue;
        Sample s;
        CHECK(sample_parse_line(LINE, strlen(LINE), "case.jsonl", 1, NULL, &s, err, sizeof err) == 0, "%s", err);
        TokenizedSample ts;
        EXPECT(sample_tokenize(tok, t, &s, SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err) == 0,
               "%s: %s", NAMES[k], err);
        for (int turn = 0, m = 0; turn < ts.n_turns; turn++, m++) {
            while (s.messages[m].role != MSG_ASSISTANT) m++;
            int32_t want[1024];
            int n = 0;
            for (int i = 0; i <= turn; i++) {
                const TokenSpan *parts[3] = {&ts.turns[i].prompt, keep ? &ts.turns[i].think : &ts.turns[i].answer,
                                             &ts.turns[i].answer};
                for (int j = 0; j < (i < turn ? (keep ? 3 : 2) : 1); j++) {
                    CHECK(n + parts[j]->n <= 1024, "view too long");
                    memcpy(want + n, parts[j]->ids, (size_t)parts[j]->n * sizeof(int32_t));
                    n += parts[j]->n;
                }
            }
            Sample upto = s;
            upto.n_messages = m;
            TokenSpan got;
            const int rc = generate_prompt(tok, t, &upto, SPECIAL_IN_TEXT_PLAIN, &got, err, sizeof err);
            EXPECT(rc == 0 && got.n == n && memcmp(got.ids, want, (size_t)n * sizeof(int32_t)) == 0,
                   "%s: turn %d: prompt of %d ids, the training view has %d (%s)", NAMES[k], turn,
                   rc == 0 ? got.n : -1, n, rc == 0 ? "" : err);
            if (rc == 0) free(got.ids);
        }
        TokenSpan none;
        EXPECT(generate_prompt(tok, t, &s, SPECIAL_IN_TEXT_PLAIN, &none, err, sizeof err) == -1 &&
                   strstr(err, "the last message must be a user message"),
               "%s: a conversation ending in a reply is no prompt: %s", NAMES[k], err);
        tokenized_sample_free(&ts);
        sample_free(&s);
        tokenizer_free(tok);
    }
}

// A line of 16,000 empty turns (under 1 MiB): its prompts grow by 3 template tokens a turn,
// so all of them would be ~384 million ids. With data.seq_len's cap each prompt is at most
// that long, the turns past it are counted, not built.
static void test_prompts_bounded(void) {
    char err[1024];
    Tokenizer *tok = tokenizer_load("datasets/synthetic/tokenizer.model", err, sizeof err);
    if (!tok) {
        printf("SKIP bounded prompts: %s\n", err);
        return;
    }
    char path[] = "/tmp/onepass_test_prompts_XXXXXX";
    const int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    enum { TURNS = 16000, CAP = 1024 };
    fputs("{\"messages\":[", f);
    for (int t = 0; t < TURNS; t++)
        fprintf(f, "%s{\"role\":\"user\",\"content\":\"\"},{\"role\":\"assistant\",\"content\":\"\"}",
                t ? "," : "");
    fputs("]}\n{\"messages\":[{\"role\":\"user\",\"content\":\"1+1\"},"
          "{\"role\":\"assistant\",\"content\":\"2\"}]}\n", f);
    fclose(f);
    AccuracySet set;
    const DataOptions opt = {.special_in_text = SPECIAL_IN_TEXT_PLAIN, .seq_len = CAP,
                             .max_line_bytes = 1 << 22};
    accuracy_set_load(&set, tok, &opt, path, 0);
    int longest = 0;
    for (int i = 0; i < set.n_items; i++)
        if (set.items[i].prompt.n > longest) longest = set.items[i].prompt.n;
    EXPECT(set.n_items > 100 && set.n_items <= CAP / 3 + 2 && longest <= CAP,
           "%d prompts kept, the longest %d tokens (cap %d)", set.n_items, longest, CAP);
    EXPECT(set.n_items + set.n_too_long == TURNS + 1 && set.n_conversations == 2,
           "%d kept + %d too long, want %d turns of 2 conversations (%d)", set.n_items, set.n_too_long,
           TURNS + 1, set.n_conversations);
    EXPECT(set.n_items > 0 && set.items[set.n_items - 1].prompt.n < 16,
           "the short conversation's turn is kept after the long one");
    accuracy_set_free(&set);
    unlink(path);
    tokenizer_free(tok);
}

int main(void) {
    test_scheduler();
    test_prompts_under_templates();
    test_shipped_eval_set();
    test_prompts_bounded();
    test_answer_part();
    test_answer_correct();
    test_sample_token();
    return test_finish();
}
