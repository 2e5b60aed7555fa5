// The dataset loader on whole files, under the options the first two bytes pick (layout,
// seq_len, skip_bad, ignore_unknown_keys, special_in_text, max_line_bytes, train_on,
// skip_empty_think, skip_too_long, unpacked). Each line goes through what
// packed_dataset_load does with it, by the calls that return errors instead of exiting:
// sample_parse_line, sample_tokenize (the shipped tokenizer, onepass template),
// layout_sample, then pack_docs over the documents. When some line parses, the file is
// also read whole by dataset_load (skipping the rest), which must find the same samples.
#include <stdlib.h>
#include <string.h>

#include "data/batch.h"
#include "data/conversation.h"
#include "data/template.h"
#include "data/tokenize.h"
#include "fuzz_util.h"

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    static Tokenizer *tok;
    char err[1024];
    if (!tok && !(tok = tokenizer_load(fuzz_source_path("datasets/synthetic/tokenizer.model"), err,
                                       sizeof err)))
        abort();
    if (size < 2) return 0;
    const uint8_t a = data[0], b = data[1];
    const LayoutKind layout = (LayoutKind)(a % 4);
    const int seq_len = 32 << ((a >> 2) & 3);
    const bool ignore_unknown_keys = a & 32;
    const SpecialInText special = (a & 64) ? SPECIAL_IN_TEXT_ERROR : SPECIAL_IN_TEXT_PLAIN;
    const size_t max_line_bytes = (b & 1) ? 256 : 65536;
    const LossOptions loss = {.train_on = (b & 2) ? TRAIN_ANSWER : TRAIN_THINK_ANSWER,
                              .skip_empty_think = b & 4};
    const PackOptions pack = {.unpacked = b & 8, .skip_too_long = a & 128};
    const char *text = (const char *)data + 2;
    const size_t len = size - 2;

    KeyTally tally = {0};
    const ParseOptions parse = {.ignore_unknown_keys = ignore_unknown_keys, .ignored = &tally};
    TokenizedSample *samples = calloc(len + 1, sizeof *samples);
    DocList docs = {0};
    int n_parsed = 0, n_tokenized = 0, line = 0;
    for (size_t start = 0; start < len;) {
        const char *nl = memchr(text + start, '\n', len - start);
        const size_t end = nl ? (size_t)(nl - text) : len;
        size_t n = end - start;
        if (n > 0 && text[start + n - 1] == '\r') n--;
        line++;
        if (n <= max_line_bytes && !blank(text + start, n)) {
            Sample s;
            if (sample_parse_line(text + start, n, "fuzz.jsonl", line, &parse, &s, err, sizeof err) == 0) {
                n_parsed++;
                TokenizedSample *ts = &samples[n_tokenized];
                if (sample_tokenize(tok, &TEMPLATE_ONEPASS, &s, special, ts, err, sizeof err) == 0) {
                    if (layout_sample(layout, &loss, ts, n_tokenized, &docs, err, sizeof err) == 0)
                        n_tokenized++;
                    else
                        tokenized_sample_free(ts);
                }
                sample_free(&s);
            }
        }
        start = end + 1;
    }
    PackedRows rows = {0};
    int n_skipped = 0;
    if (n_tokenized > 0 && pack_docs(&docs, seq_len, pack, &rows, &n_skipped, err, sizeof err) == 0)
        packed_rows_free(&rows);
    doc_list_free(&docs);
    for (int i = 0; i < n_tokenized; i++) tokenized_sample_free(&samples[i]);
    free(samples);
    key_tally_free(&tally);

    if (n_parsed > 0) {  // dataset_load exits only when no line is usable
        const char *path = fuzz_temp_file(".jsonl", (const uint8_t *)text, len);
        const LoadOptions load = {.skip_bad = true, .ignore_unknown_keys = ignore_unknown_keys,
                                  .max_line_bytes = max_line_bytes, .skip_too_long = true};
        Dataset d;
        dataset_load(path, &load, &d);
        if (d.n_samples != n_parsed) abort();  // the file reader and the line parser disagree
        dataset_free(&d);
    }
    return 0;
}
