// The shipped SentencePiece model through the C API: exact round trips of random
// UTF-8 (segments too), special tokens as single ids, piece <-> id, byte
// fallback instead of <unk>, and deterministic training.
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/template.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

#define MODEL_PATH "datasets/synthetic/tokenizer.model"
#define MAX_IDS 4096

// Random text mixing ASCII, runs of spaces, newlines, tabs, multi-byte UTF-8
// (Latin, Cyrillic, CJK, emoji), digits and the template's special tokens.
// Leaves out U+2581 "▁", which SentencePiece decodes as a space.
static char *random_text(TestRng *rng) {
    static const char *const PIECES[] = {
        "a", "The", " result", "q", "Z", "0", "9", "42", " ", "   ", "\n", "\t", "\r", ".", ",",
        "<", ">", "|", "\\", "\"", "é", "Grüße", "Ж", "漢字", "😀", "×", "÷", "\x7f", "~"};
    const int n_pieces = (int)(sizeof(PIECES) / sizeof(PIECES[0]));
    int n = test_rng_int(rng, 0, 60);
    char *s = calloc((size_t)n * 16 + 1, 1);
    for (int i = 0; i < n; i++) {
        if (test_rng_int(rng, 0, 9) == 0)
            strcat(s, TEMPLATE_ONEPASS.controls[test_rng_int(rng, 0, TEMPLATE_ONEPASS.n_controls - 1)]);
        else
            strcat(s, PIECES[test_rng_int(rng, 0, n_pieces - 1)]);
    }
    return s;
}

static int encode(const Tokenizer *t, const char *text, int32_t *ids) {
    int n = tokenizer_encode(t, text, ids, MAX_IDS);
    EXPECT(n >= 0 && n <= MAX_IDS, "encode returned %d for '%s'", n, text);
    return n < 0 ? 0 : n;
}

static void test_round_trips(const Tokenizer *t, TestRng *rng) {
    int32_t ids[2 * MAX_IDS];
    for (int trial = 0; trial < 500; trial++) {
        char *a = random_text(rng), *b = random_text(rng);
        int na = encode(t, a, ids);
        int unk = 0;
        for (int i = 0; i < na; i++) unk += ids[i] == 0;
        EXPECT(unk == 0, "'%s' encodes to <unk> %d times", a, unk);
        char *back = tokenizer_decode(t, ids, na);
        EXPECT(back && strcmp(back, a) == 0, "round trip '%s' -> '%s'", a, back ? back : "(null)");
        free(back);
        // Segments tokenized on their own concatenate to the concatenated text.
        int nb = encode(t, b, ids + na);
        char *joined = tokenizer_decode(t, ids, na + nb);
        size_t la = strlen(a);
        EXPECT(joined && strncmp(joined, a, la) == 0 && strcmp(joined + la, b) == 0,
              "segments '%s' + '%s' -> '%s'", a, b, joined ? joined : "(null)");
        free(joined), free(a), free(b);
    }
    // A short buffer still reports the full count.
    const char *text = "The result is 5198.";
    int full = encode(t, text, ids);
    EXPECT(tokenizer_encode(t, text, ids, 1) == full, "cap 1 changes the count");
    EXPECT(tokenizer_encode(t, "", ids, MAX_IDS) == 0, "empty text has ids");
}

static void test_special_tokens(const Tokenizer *t, TestRng *rng) {
    int32_t ids[MAX_IDS];
    for (int s = 0; s < TEMPLATE_ONEPASS.n_controls; s++) {
        const char *special = TEMPLATE_ONEPASS.controls[s];
        int id = tokenizer_piece_to_id(t, special);
        // Fixed layout written down in data/tokenizer.cc: <unk>=0, specials 1..6.
        EXPECT(id == s + 1, "%s has id %d, want %d", special, id, s + 1);
        EXPECT(id >= 0 && strcmp(tokenizer_id_to_piece(t, id), special) == 0, "%s: piece '%s'",
              special, id >= 0 ? tokenizer_id_to_piece(t, id) : "");
        int n = encode(t, special, ids);
        EXPECT(n == 1 && ids[0] == id, "%s alone: %d ids", special, n);
        // Inside random text it is still one id, and the text decodes back.
        for (int trial = 0; trial < 20; trial++) {
            char *left = random_text(rng), *right = random_text(rng);
            size_t len = strlen(left) + strlen(special) + strlen(right) + 1;
            char *text = malloc(len);
            snprintf(text, len, "%s%s%s", left, special, right);
            int32_t left_ids[MAX_IDS], right_ids[MAX_IDS];
            int nl = encode(t, left, left_ids), nr = encode(t, right, right_ids);
            n = encode(t, text, ids);
            // The special token cuts the text: ids = left's, then the token, then right's.
            bool split = n == nl + 1 + nr && ids[nl] == id &&
                         memcmp(ids, left_ids, (size_t)nl * sizeof(int32_t)) == 0 &&
                         memcmp(ids + nl + 1, right_ids, (size_t)nr * sizeof(int32_t)) == 0;
            EXPECT(split, "'%s' does not split at %s", text, special);
            char *back = tokenizer_decode(t, ids, n);
            EXPECT(back && strcmp(back, text) == 0, "'%s' -> '%s'", text, back ? back : "(null)");
            free(back), free(text), free(left), free(right);
        }
    }
}

static void test_pieces(const Tokenizer *t) {
    int vocab = tokenizer_vocab_size(t);
    EXPECT(vocab == 512, "vocab size %d, want 512 (model.vocab_size)", vocab);
    int bad = 0;
    for (int id = 0; id < vocab; id++) {
        const char *piece = tokenizer_id_to_piece(t, id);
        bad += !piece || tokenizer_piece_to_id(t, piece) != id;
    }
    EXPECT(bad == 0, "%d ids do not survive id -> piece -> id", bad);
    EXPECT(tokenizer_id_to_piece(t, -1) == NULL && tokenizer_id_to_piece(t, vocab) == NULL,
          "out-of-range ids have pieces");
    EXPECT(tokenizer_piece_to_id(t, "no-such-piece-in-vocab") == -1, "unknown piece has an id");
    EXPECT(tokenizer_piece_to_id(t, "<unk>") == 0, "<unk> is not id 0");
    // Byte fallback: an unseen character is its UTF-8 bytes, one byte piece each.
    int32_t ids[8];
    EXPECT(tokenizer_encode(t, "\xe5\x97\xaf", ids, 8) == 3 &&
              strcmp(tokenizer_id_to_piece(t, ids[0]), "<0xE5>") == 0 &&
              strcmp(tokenizer_id_to_piece(t, ids[2]), "<0xAF>") == 0,
          "U+55EF is not three byte pieces");
}

static char *read_bytes(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)*len + 1);
    *len = (long)fread(buf, 1, (size_t)*len, f);
    fclose(f);
    return buf;
}

// Same corpus, same model bytes; the special tokens get the fixed ids.
static void test_training(TestRng *rng) {
    char dir[] = "/tmp/onepass_tok_XXXXXX", corpus[64], prefix[64], model[80], vocab[80], err[512];
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp failed");
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "wb");
    for (int i = 0; i < 300; i++) {
        char *line = random_text(rng);
        for (char *p = line; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
        fprintf(f, "%s\n", line);
        free(line);
    }
    fclose(f);
    // The model records its prefix, so both runs write the same path.
    snprintf(prefix, sizeof prefix, "%s/m", dir);
    snprintf(model, sizeof model, "%s.model", prefix);
    char *bytes[2] = {NULL, NULL};
    long len[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        EXPECT(tokenizer_train(corpus, prefix, 300, &TEMPLATE_ONEPASS, err, sizeof err) == 0, "train: %s", err);
        bytes[k] = read_bytes(model, &len[k]);
    }
    EXPECT(bytes[0] && bytes[1] && len[0] == len[1] && memcmp(bytes[0], bytes[1], (size_t)len[0]) == 0,
          "two trainings on one corpus differ");
    free(bytes[0]), free(bytes[1]);
    Tokenizer *t = tokenizer_load(model, err, sizeof err);
    EXPECT(t != NULL, "%s", err);
    if (t) {
        for (int s = 0; s < TEMPLATE_ONEPASS.n_controls; s++)
            EXPECT(tokenizer_piece_to_id(t, TEMPLATE_ONEPASS.controls[s]) == s + 1, "trained %s id",
                  TEMPLATE_ONEPASS.controls[s]);
        tokenizer_free(t);
    }
    EXPECT(tokenizer_train("/nonexistent/corpus.txt", prefix, 300, &TEMPLATE_ONEPASS, err, sizeof err) == -1,
          "training on a missing corpus succeeded");
    snprintf(vocab, sizeof vocab, "%s.vocab", prefix);
    remove(model);
    remove(vocab);
    remove(corpus);
    rmdir(dir);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    char err[512];
    EXPECT(tokenizer_load("/nonexistent/tok.model", err, sizeof err) == NULL &&
              strstr(err, "/nonexistent/tok.model"),
          "loading a missing model: '%s'", err);
    Tokenizer *t = tokenizer_load(MODEL_PATH, err, sizeof err);
    EXPECT(t != NULL, "%s", err);
    if (!t) return test_finish();
    test_pieces(t);
    test_round_trips(t, &rng);
    test_special_tokens(t, &rng);
    tokenizer_free(t);
    test_training(&rng);
    return test_finish();
}
