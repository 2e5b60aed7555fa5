// The tokenizer C API against the reference packages, offline: the fixture tokenizers of
// tests/data/tokenizers/ (scripts/fixtures/make_tokenizer_fixtures.py) and the ids
// `tokenizers` / `sentencepiece` gave for every string there. Also: model folders, refusals
// by name, plain encoding, and (DESIGN.md §8) each turn's view tokenized segment by segment
// equal to the whole rendered view, with the dummy-prefix SentencePiece model too.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/conversation.h"
#include "data/template.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

#define FIXTURES "tests/data/tokenizers"
#define MAX_IDS 65536

typedef struct {
    const char *name;
    bool has_template_tokens;
    bool plain_reference;  // reference.json has "plain_ids" (the BPE fixtures)
    bool lossless;         // decode(encode(x)) == x for every x (no NFC, no SentencePiece "▁")
} Fixture;

static const Fixture FIXTURE_LIST[] = {
    {"gpt2", false, true, true},
    {"llama3", true, true, true},
    {"qwen2", true, true, false},  // NFC: decodes to NFC(x), as the reference does
    {"sp_dummy", true, false, false},
};

static bool ids_equal(const int32_t *got, int n, const json_t *want) {
    if (n != (int)json_array_size(want)) return false;
    for (int i = 0; i < n; i++)
        if (got[i] != json_integer_value(json_array_get(want, (size_t)i))) return false;
    return true;
}

static int control_ids(const Tokenizer *t, const int32_t *ids, int n) {
    int count = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < TEMPLATE_ONEPASS.n_controls; k++)
            count += ids[i] == tokenizer_piece_to_id(t, TEMPLATE_ONEPASS.controls[k]);
    return count;
}

static void test_reference_ids(const Fixture *f, const Tokenizer *t, int32_t *ids) {
    char path[256];
    snprintf(path, sizeof path, FIXTURES "/%s/reference.json", f->name);
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    EXPECT(ref && json_array_size(ref) > 100, "%s: %s", path, jerr.text);
    size_t i;
    json_t *item;
    int bad_ids = 0, bad_plain = 0, bad_decode = 0, bad_round_trip = 0;
    json_array_foreach(ref, i, item) {
        const char *text = json_string_value(json_object_get(item, "text"));
        int n = tokenizer_encode(t, text, ids, MAX_IDS);
        if (!ids_equal(ids, n, json_object_get(item, "ids")) && bad_ids++ < 3)
            fprintf(stderr, "%s: string %zu '%s': ids differ from the reference\n", f->name, i, text);
        char *back = tokenizer_decode(t, ids, n);
        const char *want_back = json_string_value(json_object_get(item, "decoded"));
        if ((!back || strcmp(back, want_back) != 0) && bad_decode++ < 3)
            fprintf(stderr, "%s: string %zu: decodes to '%s', reference '%s'\n", f->name, i, back ? back : "(null)", want_back);
        if (f->lossless && (!back || strcmp(back, text) != 0)) bad_round_trip++;
        free(back);
        int np = tokenizer_encode_flags(t, text, TOKENIZER_PLAIN, ids, MAX_IDS);
        if (f->plain_reference && !ids_equal(ids, np, json_object_get(item, "plain_ids")) && bad_plain++ < 3)
            fprintf(stderr, "%s: string %zu '%s': plain ids differ from the reference\n", f->name, i, text);
        // Plain ids never hold a template token's id, and decode to the text's own decode.
        char *plain_back = tokenizer_decode(t, ids, np);
        if (f->has_template_tokens && (control_ids(t, ids, np) != 0 || !plain_back ||
                                       strcmp(plain_back, want_back) != 0))
            bad_plain++;
        free(plain_back);
    }
    EXPECT(bad_ids == 0, "%s: %d strings with other ids than the reference", f->name, bad_ids);
    EXPECT(bad_decode == 0, "%s: %d strings decode otherwise than the reference", f->name, bad_decode);
    EXPECT(bad_round_trip == 0, "%s: %d strings do not survive decode(encode(x))", f->name, bad_round_trip);
    EXPECT(bad_plain == 0, "%s: %d strings' plain ids are wrong", f->name, bad_plain);
    json_decref(ref);
}

// The text of message m in a view (the template of data/tokenize.c), appended to buf.
static void render_message(char *buf, const Message *m, bool with_reasoning) {
    if (m->role != MSG_ASSISTANT) {
        strcat(buf, m->role == MSG_SYSTEM ? TEMPLATE_SYSTEM_HEADER : TEMPLATE_USER_HEADER);
        strcat(buf, m->content);
        return;
    }
    strcat(buf, TEMPLATE_ASSISTANT_HEADER);
    if (with_reasoning && m->reasoning) {
        strcat(buf, TEMPLATE_THINK_OPEN);
        strcat(buf, m->reasoning);
        strcat(buf, TEMPLATE_THINK_CLOSE);
    }
    strcat(buf, m->content);
    strcat(buf, TEMPLATE_END_OF_TURN);
}

static void append(int32_t *dst, int *n, TokenSpan s) {
    if (s.n > 0) memcpy(dst + *n, s.ids, (size_t)s.n * sizeof(int32_t));
    *n += s.n;
}

// Every turn's view: its segments' ids concatenated == tokenizing the rendered view.
static void test_views(const Fixture *f, const Tokenizer *t, int32_t *ids) {
    Dataset d;
    dataset_load("datasets/synthetic/eval.jsonl", &(LoadOptions){0}, &d);
    int32_t *whole = malloc(MAX_IDS * sizeof(int32_t));
    char *text = malloc(1 << 20);
    int views = 0, bad = 0;
    for (int s = 0; s < d.n_samples && s < 40; s++) {
        const Sample *sample = &d.samples[s];
        if (sample->kind != SAMPLE_CONVERSATION) continue;
        TokenizedSample ts;
        char err[256];
        EXPECT(sample_tokenize(t, &TEMPLATE_ONEPASS, sample, SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err) == 0, "%s", err);
        int turn = 0, n = 0;
        text[0] = '\0';
        for (int m = 0; m < sample->n_messages && turn < ts.n_turns; m++) {
            const Message *msg = &sample->messages[m];
            if (msg->role != MSG_ASSISTANT) continue;
            // The view of this turn: the history as rendered so far, then this reply.
            int first = m;
            while (first > 0 && sample->messages[first - 1].role != MSG_ASSISTANT) first--;
            for (int k = first; k < m; k++) render_message(text, &sample->messages[k], false);
            size_t prompt_end = strlen(text);
            render_message(text, msg, true);
            int nw = tokenizer_encode(t, text, whole, MAX_IDS);
            int nv = n;
            append(ids, &nv, ts.turns[turn].prompt);
            append(ids, &nv, ts.turns[turn].think);
            append(ids, &nv, ts.turns[turn].answer);
            views++;
            if (nv != nw || memcmp(ids, whole, (size_t)nw * sizeof(int32_t)) != 0) {
                if (bad++ == 0) fprintf(stderr, "%s: line %d turn %d: view ids differ (%d vs %d)\n",
                                        f->name, sample->line, turn, nv, nw);
            }
            // The next view keeps this turn without its reasoning.
            text[prompt_end] = '\0';
            render_message(text, msg, false);
            append(ids, &n, ts.turns[turn].prompt);
            append(ids, &n, ts.turns[turn].answer);
            turn++;
        }
        tokenized_sample_free(&ts);
    }
    EXPECT(views > 50 && bad == 0, "%s: %d of %d views differ from the whole view's ids", f->name, bad, views);
    free(whole);
    free(text);
    dataset_free(&d);
}

static void test_fixture(const Fixture *f) {
    char path[256], err[512];
    snprintf(path, sizeof path, FIXTURES "/%s", f->name);  // a model folder
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    EXPECT(t != NULL, "%s", err);
    if (!t) return;
    int32_t *ids = malloc(MAX_IDS * sizeof(int32_t));
    test_reference_ids(f, t, ids);
    // Invalid UTF-8 is an error, not a guess (the data parser refuses it before this).
    if (f->plain_reference) EXPECT(tokenizer_encode(t, "ok\xff\xfe", ids, MAX_IDS) == -1, "%s: invalid UTF-8", f->name);
    int rc = template_check_tokenizer(t, &TEMPLATE_ONEPASS, err, sizeof err);
    if (f->has_template_tokens) {
        EXPECT(rc == 0, "%s: %s", f->name, err);
        test_views(f, t, ids);
    } else {
        EXPECT(rc == -1 && strstr(err, "'<|system|>'"), "%s: template check: '%s'", f->name, err);
    }
    free(ids);
    tokenizer_free(t);
}

// A copy of the qwen2 fixture with one key changed must be refused, naming what.
static void test_refusals(void) {
    char dir[] = "/tmp/onepass_tokfix_XXXXXX", path[96], err[1024];
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    static const struct {
        const char *object, *key, *json, *message;
    } CASES[] = {
        {NULL, "normalizer", "{\"type\": \"Lowercase\"}", "normalizer 'Lowercase' is not implemented"},
        {NULL, "pre_tokenizer", "{\"type\": \"Whitespace\"}", "pre_tokenizer 'Whitespace' is not implemented"},
        {NULL, "pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", "add_prefix_space"},
        {NULL, "decoder", "{\"type\": \"WordPiece\"}", "decoder 'WordPiece' is not implemented"},
        {NULL, "decoder", "null", "decoder 'null' is not implemented"},
        {"model", "type", "\"Unigram\"", "model type 'Unigram' is not implemented"},
        {"model", "byte_fallback", "true", "BPE byte_fallback is not implemented"},
        {"model", "dropout", "0.1", "BPE dropout is not implemented"},
        {"model", "continuing_subword_prefix", "\"##\"", "BPE continuing_subword_prefix is not implemented"},
    };
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        json_t *root = json_load_file(FIXTURES "/qwen2/tokenizer.json", 0, NULL);
        json_t *value = json_loads(CASES[c].json, JSON_DECODE_ANY, NULL);
        json_object_set_new(CASES[c].object ? json_object_get(root, CASES[c].object) : root, CASES[c].key, value);
        json_dump_file(root, path, 0);
        json_decref(root);
        Tokenizer *t = tokenizer_load(path, err, sizeof err);
        EXPECT(!t && strstr(err, CASES[c].message) && strstr(err, path), "%s: got '%s'", CASES[c].message,
               t ? "(loaded)" : err);
        tokenizer_free(t);
    }
    // A folder with both files and a tokenizer.json it cannot use: its tokenizer.model.
    char model[96], cwd[512], target[640];
    snprintf(model, sizeof model, "%s/tokenizer.model", dir);
    EXPECT(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    snprintf(target, sizeof target, "%s/" FIXTURES "/sp_dummy/tokenizer.model", cwd);
    EXPECT(symlink(target, model) == 0, "symlink %s", target);
    Tokenizer *t = tokenizer_load(dir, err, sizeof err);
    EXPECT(t && tokenizer_vocab_size(t) == 1500 && tokenizer_piece_to_id(t, "<0xFF>") >= 0,
           "folder with an unusable tokenizer.json: '%s'", t ? "(not the .model)" : err);
    tokenizer_free(t);
    remove(model);
    remove(path);
    EXPECT(!tokenizer_load(dir, err, sizeof err) && strstr(err, "neither tokenizer.json nor tokenizer.model"),
           "an empty folder: '%s'", err);
    snprintf(path, sizeof path, "%s/fifo.model", dir);
    EXPECT(mkfifo(path, 0600) == 0, "mkfifo");
    EXPECT(!tokenizer_load(path, err, sizeof err) && strstr(err, "not a regular file"), "a FIFO: '%s'", err);
    remove(path);
    rmdir(dir);
    EXPECT(!tokenizer_load("/nonexistent/tokenizer.json", err, sizeof err) && strstr(err, "/nonexistent"),
           "missing: '%s'", err);
}

// ignore_merges: a pre-token that is a vocabulary entry is that one id, whatever the
// merges say (the ids below are those of the `tokenizers` package on the same file).
static void test_ignore_merges(void) {
    char dir[] = "/tmp/onepass_tokfix_XXXXXX", path[96], err[1024];
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    static const int32_t WANT[2][6] = {{90, 81, 74, 735, 81, 74}, {1500, 735, 81, 74}};
    static const int WANT_N[2] = {6, 4};
    for (int ignore = 0; ignore < 2; ignore++) {
        json_t *root = json_load_file(FIXTURES "/gpt2/tokenizer.json", 0, NULL);
        json_t *model = json_object_get(root, "model");
        json_object_set_new(json_object_get(model, "vocab"), "zqj", json_integer(1500));
        json_object_set_new(model, "ignore_merges", json_boolean(ignore));
        json_dump_file(root, path, 0);
        json_decref(root);
        Tokenizer *t = tokenizer_load(path, err, sizeof err);
        EXPECT(t != NULL, "%s", err);
        if (!t) continue;
        int32_t ids[16];
        int n = tokenizer_encode(t, "zqj zqj", ids, 16);
        EXPECT(n == WANT_N[ignore] && memcmp(ids, WANT[ignore], (size_t)n * sizeof(int32_t)) == 0,
               "ignore_merges %d: %d ids, first %d", ignore, n, n > 0 ? ids[0] : -1);
        tokenizer_free(t);
    }
    remove(path);
    rmdir(dir);
}

int main(void) {
    for (size_t i = 0; i < sizeof FIXTURE_LIST / sizeof FIXTURE_LIST[0]; i++) test_fixture(&FIXTURE_LIST[i]);
    test_refusals();
    test_ignore_merges();
    return test_finish();
}
