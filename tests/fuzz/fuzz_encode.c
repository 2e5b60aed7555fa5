// Encoding and decoding text: the shipped SentencePiece model, a SentencePiece model with
// a dummy prefix and Qwen2's byte-level BPE (tests/data/tokenizers), picked by the first
// byte with the encode flags; the rest is the text (encoded, decoded, and re-encoded as a
// continuation) and, read as 16-bit values, ids to decode (out of range: refused).
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    static Tokenizer *toks[3];
    static const char *const files[3] = {"datasets/synthetic/tokenizer.model",
                                         "tests/data/tokenizers/sp_dummy/tokenizer.model",
                                         "tests/data/tokenizers/qwen2/tokenizer.json"};
    char err[1024];
    for (int i = 0; i < 3; i++)
        if (!toks[i] && !(toks[i] = tokenizer_load(fuzz_source_path(files[i]), err, sizeof err)))
            abort();
    if (size < 1) return 0;
    const Tokenizer *tok = toks[data[0] % 3];
    const unsigned flags = (data[0] >> 2) & 3;
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    int cap = 64;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = tokenizer_encode_flags(tok, text, flags, ids, cap);
    if (n > cap) {
        cap = n;
        ids = realloc(ids, (size_t)cap * sizeof *ids);
        if (tokenizer_encode_flags(tok, text, flags, ids, cap) != n) abort();  // deterministic
    }
    if (n > 0) free(tokenizer_decode(tok, ids, n));
    // Arbitrary ids: in range they decode, out of range the decoder says NULL.
    const int vocab = tokenizer_vocab_size(tok);
    const int n_ids = (int)((size - 1) / 2);
    int32_t *raw = malloc((size_t)(n_ids + 1) * sizeof *raw);
    for (int i = 0; i < n_ids; i++) raw[i] = (int32_t)(data[1 + 2 * i] | data[2 + 2 * i] << 8) - 256;
    char *decoded = tokenizer_decode(tok, raw, n_ids);
    bool out_of_range = false;
    for (int i = 0; i < n_ids; i++) out_of_range |= raw[i] < 0 || raw[i] >= vocab;
    if (out_of_range && decoded) abort();  // an id past the vocabulary must be refused
    free(decoded);
    free(raw);
    free(ids);
    free(text);
    return 0;
}
