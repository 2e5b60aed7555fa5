// The dataset loader on whole files: packed_dataset_load (parse every line, tokenize with
// the shipped tokenizer, lay out, pack) under the options the first byte picks (layout,
// seq_len, skip_bad, ignore_unknown_keys, special_in_text, skip_too_long, unpacked).
#include <stdlib.h>

#include "data/batch.h"
#include "data/template.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    static Tokenizer *tok;
    char err[1024];
    if (!tok && !(tok = tokenizer_load(fuzz_source_path("datasets/synthetic/tokenizer.model"), err,
                                       sizeof err)))
        abort();
    if (size < 2) return 0;
    const uint8_t a = data[0], b = data[1];
    DataOptions opt = {
        .layout = (LayoutKind)(a % 4),
        .seq_len = 32 << ((a >> 2) & 3),
        .skip_bad = a & 16,
        .ignore_unknown_keys = a & 32,
        .special_in_text = (a & 64) ? SPECIAL_IN_TEXT_ERROR : SPECIAL_IN_TEXT_PLAIN,
        .max_line_bytes = (b & 1) ? 256 : 65536,
        .loss = {.train_on = (b & 2) ? TRAIN_ANSWER : TRAIN_THINK_ANSWER, .skip_empty_think = b & 4},
    };
    opt.pack.skip_too_long = a & 128;
    opt.pack.unpacked = b & 8;
    const char *path = fuzz_temp_file(".jsonl", data + 2, size - 2);
    PackedDataset d;
    FUZZ_TRY(packed_dataset_load(tok, path, opt, &d); packed_dataset_free(&d));
    return 0;
}
