// Tokenizer files from bytes: a tokenizer.json (byte-level BPE, data/bpe.c) when the
// first byte is even, else a SentencePiece .model; a file that loads encodes and decodes
// a fixed text.
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    if (size < 1) return 0;
    const char *path = fuzz_temp_file(data[0] % 2 ? ".model" : ".json", data + 1, size - 1);
    char err[1024];
    Tokenizer *tok = NULL;
    FUZZ_TRY(tok = tokenizer_load(path, err, sizeof err));
    if (!tok) return 0;
    static const char *const texts[] = {"Hello <|assistant|> world, 123 + 456 = 579.\n\n",
                                        "\xc3\xa9t\xc3\xa9 \xe2\x96\x81 <think>x</think>", ""};
    int32_t ids[256];
    for (int i = 0; i < 3; i++)
        for (unsigned flags = 0; flags < 4; flags++) {
            int n = 0;
            FUZZ_TRY(n = tokenizer_encode_flags(tok, texts[i], flags, ids, 256));
            if (n > 0 && n <= 256) {
                char *back = NULL;
                FUZZ_TRY(back = tokenizer_decode(tok, ids, n));
                free(back);
            }
        }
    FUZZ_TRY(tokenizer_free(tok));
    return 0;
}
