// Synthetic data: determinism, formats, turn counts, thinking/answer ratio, the
// answer checker, digit-by-digit thinking that adds up, and that the shipped
// data sets are what `train gen-data` writes and fit data.seq_len = 1024.
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "data/conversation.h"
#include "data/layout.h"
#include "data/synthetic.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

#define SHIPPED_DIR "datasets/synthetic"
#define SHIPPED_SEED 1234
#define SEQ_LEN 1024

typedef void (*Writer)(FILE *, uint64_t, int);

// The writer's output as one malloc'd string.
static char *generate(Writer writer, uint64_t seed, int n, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    writer(f, seed, n);
    fclose(f);
    return buf;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    *len = fread(buf, 1, *len, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

// Parses every line of generated text; returns the sample count (all must parse).
static int parse_all(const char *text, Sample **out) {
    int n = 0, cap = 0, line = 0;
    *out = NULL;
    char err[512];
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        Sample s;
        line++;
        int rc = sample_parse_line(p, len, "generated", line, NULL, &s, err, sizeof err);
        EXPECT(rc == 0, "%s", err);
        if (rc == 0) {
            if (n == cap) *out = realloc(*out, (size_t)(cap = cap ? 2 * cap : 64) * sizeof(Sample));
            (*out)[n++] = s;
        }
        p += len + (end != NULL);
    }
    return n;
}

static void free_samples(Sample *samples, int n) {
    for (int i = 0; i < n; i++) sample_free(&samples[i]);
    free(samples);
}

static void test_determinism(uint64_t seed) {
    const Writer writers[] = {synthetic_write_conversations, synthetic_write_shared_prefix};
    for (int w = 0; w < 2; w++) {
        size_t la, lb, lc;
        char *a = generate(writers[w], seed, 50, &la);
        char *b = generate(writers[w], seed, 50, &lb);
        char *c = generate(writers[w], seed + 1, 50, &lc);
        EXPECT(la == lb && memcmp(a, b, la) == 0, "writer %d: same seed, different bytes", w);
        EXPECT(la != lc || memcmp(a, c, la) != 0, "writer %d: seeds %llu and %llu agree", w,
              (unsigned long long)seed, (unsigned long long)seed + 1);
        free(a), free(b), free(c);
    }
    EXPECT(synthetic_split_seed(seed, 0) != synthetic_split_seed(seed, 1) &&
              synthetic_split_seed(seed, 1) != synthetic_split_seed(seed, 2),
          "split seeds collide");
}

// Every format appears: reasoning_content, inline <think>, ShareGPT.
static void test_formats(const char *text) {
    int n_field = 0, n_inline = 0, n_sharegpt = 0, n_system = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *line = strndup(p, len);
        n_sharegpt += strncmp(line, "{\"conversations\"", 16) == 0;
        n_field += strstr(line, "\"reasoning_content\"") != NULL;
        n_inline += strncmp(line, "{\"messages\"", 11) == 0 && strstr(line, "<think>") != NULL;
        n_system += strstr(line, "\"system\"") != NULL;
        free(line);
    }
    EXPECT(n_field > 0 && n_inline > 0 && n_sharegpt > 0 && n_system > 0,
          "formats: %d reasoning_content, %d inline, %d ShareGPT, %d with system", n_field,
          n_inline, n_sharegpt, n_system);
}

static int count_role(const Sample *s, MessageRole role) {
    int n = 0;
    for (int i = 0; i < s->n_messages; i++) n += s->messages[i].role == role;
    return n;
}

// Turns in 1..8 (both ends reached); thinking on average >= 5x the answer bytes.
static void test_turns_and_ratio(const Sample *samples, int n) {
    int min_turns = 1 << 30, max_turns = 0;
    size_t think_bytes = 0, answer_bytes = 0;
    for (int i = 0; i < n; i++) {
        int turns = count_role(&samples[i], MSG_ASSISTANT);
        min_turns = turns < min_turns ? turns : min_turns;
        max_turns = turns > max_turns ? turns : max_turns;
        for (int m = 0; m < samples[i].n_messages; m++) {
            const Message *msg = &samples[i].messages[m];
            if (msg->role != MSG_ASSISTANT) continue;
            answer_bytes += strlen(msg->content);
            think_bytes += msg->reasoning ? strlen(msg->reasoning) : 0;
        }
    }
    EXPECT(min_turns == 1 && max_turns == 8, "turns range %d..%d, want 1..8", min_turns, max_turns);
    double ratio = (double)think_bytes / (double)answer_bytes;
    printf("thinking/answer bytes: %.1f\n", ratio);
    EXPECT(ratio >= 5.0, "thinking/answer ratio %.2f < 5", ratio);
}

// Independent of the generator: the digits written by the column method ("write
// D", read right to left, plus a final carry) must spell the result of the "So
// x op y = r." line, and r must be what the answer states.
static void check_column_digits(const char *reasoning, const char *answer) {
    if (!strstr(reasoning, "by columns") && !strstr(reasoning, "by digits")) return;
    char digits[32];
    int n = 0;
    for (const char *p = reasoning; (p = strstr(p, "rite ")) && n < 31; p++) {
        const char *d = p + 5;
        if (strncmp(d, "the last carry ", 15) == 0) d += 15;
        digits[n++] = *d;
    }
    char written[32];
    for (int i = 0; i < n; i++) written[i] = digits[n - 1 - i];
    written[n] = '\0';
    long long from_digits = strtoll(written, NULL, 10);
    const char *so = strstr(reasoning, "So ");
    const char *eq = so ? strrchr(so, '=') : NULL;
    long long stated = eq ? strtoll(eq + 1, NULL, 10) : -1;
    EXPECT(from_digits == stated, "written digits %s != %lld in: %s", written, stated, reasoning);
    EXPECT(synthetic_check_answer(answer, stated), "answer '%s' vs thinking %lld", answer, stated);
}

static void test_checker(Sample *samples, int n, TestRng *rng) {
    char err[512];
    int n_bad = 0;
    for (int i = 0; i < n; i++) {
        n_bad += synthetic_check_sample(&samples[i], err, sizeof err) != 0;
        for (int m = 0; m < samples[i].n_messages; m++)
            if (samples[i].messages[m].reasoning)
                check_column_digits(samples[i].messages[m].reasoning, samples[i].messages[m].content);
        for (int c = 0; c < samples[i].n_completions; c++)
            check_column_digits(samples[i].completions[c].reasoning, samples[i].completions[c].content);
    }
    EXPECT(n_bad == 0, "%d of %d samples fail the checker", n_bad, n);

    // Corrupt one digit of one answer (answers or completions): the check must fail.
    for (int trial = 0; trial < 50; trial++) {
        Sample *s = &samples[test_rng_int(rng, 0, n - 1)];
        Message *msg;
        if (s->n_completions)
            msg = &s->completions[test_rng_int(rng, 0, s->n_completions - 1)];
        else {
            int k = test_rng_int(rng, 0, count_role(s, MSG_ASSISTANT) - 1), m = 0;
            while (s->messages[m].role != MSG_ASSISTANT || k-- > 0) m++;
            msg = &s->messages[m];
        }
        char *digit = strpbrk(msg->content, "0123456789");
        EXPECT(digit != NULL, "answer without a number: '%s'", msg->content);
        if (!digit) continue;
        char saved = *digit;
        *digit = (char)('0' + (saved - '0' + test_rng_int(rng, 1, 9)) % 10);
        EXPECT(synthetic_check_sample(s, err, sizeof err) != 0, "corrupted '%s' passes",
              msg->content);
        *digit = saved;
    }

    // synthetic_check_answer against a hand-written form of random numbers.
    for (int trial = 0; trial < 100; trial++) {
        long long v = test_rng_int(rng, 0, 999999);
        char text[64];
        snprintf(text, sizeof text, "I get %d here, and the result is %lld.",
                 test_rng_int(rng, 0, 99), v);
        EXPECT(synthetic_check_answer(text, v), "'%s' should state %lld", text, v);
        EXPECT(!synthetic_check_answer(text, v + 1), "'%s' should not state %lld", text, v + 1);
    }
    EXPECT(!synthetic_check_answer("no number", 0), "an answer without digits passes");
}

// The shipped files are byte for byte what gen-data writes with the README seed.
static void test_shipped_files_reproduce(void) {
    const struct {
        const char *name;
        Writer writer;
        int split, n;
    } files[] = {{"train.jsonl", synthetic_write_conversations, 0, 2000},
                 {"eval.jsonl", synthetic_write_conversations, 1, 200},
                 {"shared_prefix.jsonl", synthetic_write_shared_prefix, 2, 200}};
    for (int i = 0; i < 3; i++) {
        char path[256];
        snprintf(path, sizeof path, SHIPPED_DIR "/%s", files[i].name);
        size_t shipped_len, regen_len;
        char *shipped = read_file(path, &shipped_len);
        EXPECT(shipped != NULL, "cannot read %s", path);
        if (!shipped) continue;
        char *regen = generate(files[i].writer, synthetic_split_seed(SHIPPED_SEED, files[i].split),
                               files[i].n, &regen_len);
        EXPECT(shipped_len == regen_len && memcmp(shipped, regen, regen_len) == 0,
              "%s differs from gen-data --seed %d", path, SHIPPED_SEED);
        free(shipped), free(regen);
    }
}

// Longest document of each applicable layout over a shipped file must fit SEQ_LEN.
static void test_shipped_lengths(const Tokenizer *tok, const char *name) {
    char path[256], err[512];
    snprintf(path, sizeof path, SHIPPED_DIR "/%s", name);
    Dataset d;
    dataset_load(path, &(LoadOptions){0}, &d);
    const LayoutKind kinds[] = {LAYOUT_NPASS, LAYOUT_MASK_ONLY, LAYOUT_DUPLICATE,
                                LAYOUT_SHARED_PREFIX};
    int longest[4] = {0};
    long think_tokens = 0, answer_tokens = 0;
    for (int i = 0; i < d.n_samples; i++) {
        TokenizedSample ts;
        int rc = sample_tokenize(tok, &TEMPLATE_ONEPASS, &d.samples[i], SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err);
        EXPECT(rc == 0, "%s", err);
        if (rc != 0) continue;
        for (int t = 0; t < ts.n_turns; t++) {
            think_tokens += ts.turns[t].think.n;
            answer_tokens += ts.turns[t].answer.n;
        }
        for (int k = 0; k < 4; k++) {
            bool applies = (kinds[k] == LAYOUT_SHARED_PREFIX) == (ts.kind == SAMPLE_SHARED_PREFIX) ||
                           kinds[k] == LAYOUT_NPASS;
            if (!applies) continue;
            DocList docs = {0};
            EXPECT(layout_sample(kinds[k], NULL, &ts, i, &docs, err, sizeof err) == 0, "%s", err);
            for (int j = 0; j < docs.n_docs; j++)
                if (docs.docs[j].n > longest[k]) longest[k] = docs.docs[j].n;
            doc_list_free(&docs);
        }
        tokenized_sample_free(&ts);
    }
    printf("%s: longest documents npass %d, mask_only %d, duplicate %d, shared_prefix %d; "
           "thinking/answer tokens %.1f\n",
           name, longest[0], longest[1], longest[2], longest[3],
           (double)think_tokens / (double)answer_tokens);
    for (int k = 0; k < 4; k++)
        EXPECT(longest[k] <= SEQ_LEN, "%s: a %s document has %d tokens > %d", name,
              layout_name(kinds[k]), longest[k], SEQ_LEN);
    dataset_free(&d);
}

// The oracle refuses what a long long cannot hold instead of wrapping: an operand out of
// range (strtoll's ERANGE) or a result that overflows gives -1 (not a synthetic
// question), so accuracy never scores against a wrapped number.
static void test_oracle_overflow(void) {
    const struct { const char *first, *second; int want_n; long long want_last; } cases[] = {
        {"Multiply 3037000499 by 3037000499.", NULL, 1, 9223372030926249001LL},
        {"Multiply 9999999999 by 9999999999.", NULL, -1, 0},
        {"Multiply 3037000500 by 3037000500.", NULL, -1, 0},
        {"Add 99999999999999999999 and 1.", NULL, -1, 0},
        {"Add 9223372036854775807 and 0.", "Now add 1 to the result.", -1, 0},
        {"What is 5 minus 9223372036854775807?", "Take away 9.", -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Message msgs[2] = {{.role = MSG_USER, .content = (char *)cases[i].first},
                           {.role = MSG_USER, .content = (char *)cases[i].second}};
        long long results[2] = {0, 0};
        const int n = synthetic_expected_results(msgs, cases[i].second ? 2 : 1, results, 2);
        EXPECT(n == cases[i].want_n && (n < 0 || results[n - 1] == cases[i].want_last),
               "'%s' '%s': %d results, last %lld", cases[i].first,
               cases[i].second ? cases[i].second : "", n, n > 0 ? results[n - 1] : 0);
    }
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_oracle_overflow();
    uint64_t seed = test_rng_next(&rng);
    test_determinism(seed);

    size_t len;
    char *conversations = generate(synthetic_write_conversations, seed, 400, &len);
    test_formats(conversations);
    Sample *samples;
    int n = parse_all(conversations, &samples);
    test_turns_and_ratio(samples, n);
    test_checker(samples, n, &rng);
    free_samples(samples, n);
    free(conversations);

    char *shared = generate(synthetic_write_shared_prefix, seed, 100, &len);
    n = parse_all(shared, &samples);
    for (int i = 0; i < n; i++)
        EXPECT(samples[i].n_completions >= 2, "line %d: %d completions", samples[i].line,
              samples[i].n_completions);
    test_checker(samples, n, &rng);
    free_samples(samples, n);
    free(shared);

    test_shipped_files_reproduce();
    char err[512];
    Tokenizer *tok = tokenizer_load(SHIPPED_DIR "/tokenizer.model", err, sizeof err);
    EXPECT(tok != NULL, "%s", err);
    if (tok) {
        test_shipped_lengths(tok, "train.jsonl");
        test_shipped_lengths(tok, "eval.jsonl");
        test_shipped_lengths(tok, "shared_prefix.jsonl");
        tokenizer_free(tok);
    }
    return test_finish();
}
