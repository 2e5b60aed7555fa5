#include "data/batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// Reports a bad sample (message names the file and line): fatal unless skip_bad,
// else a warning and a count.
static void bad_sample(const DataOptions *opt, PackedDataset *out, const char *message) {
    if (!opt->skip_bad) fatal("%s", message);
    fprintf(stderr, "onepass: warning: skipping sample: %s\n", message);
    out->n_skipped_bad++;
}

void packed_dataset_load(const Tokenizer *tok, const char *path, DataOptions opt,
                         PackedDataset *out) {
    memset(out, 0, sizeof *out);
    Dataset data;
    dataset_load(path, opt.skip_bad, &data);
    out->n_skipped_bad = data.n_skipped;
    out->samples = xcalloc((size_t)data.n_samples, sizeof(TokenizedSample));
    char err[1024];
    for (int i = 0; i < data.n_samples; i++) {
        if (opt.max_samples > 0 && out->n_samples == opt.max_samples) break;
        TokenizedSample *ts = &out->samples[out->n_samples];
        // sample_tokenize's message starts with the path, layout_sample's does not.
        if (sample_tokenize(tok, &data.samples[i], path, ts, err, sizeof err) != 0) {
            bad_sample(&opt, out, err);
            continue;
        }
        if (layout_sample(opt.layout, ts, out->n_samples, &out->docs, err, sizeof err) != 0) {
            char message[1100];
            snprintf(message, sizeof message, "%s: %s", path, err);
            bad_sample(&opt, out, message);
            tokenized_sample_free(ts);
            continue;
        }
        out->n_samples++;
    }
    dataset_free(&data);
    if (out->n_samples == 0)
        fatal("%s: no usable samples (%d skipped)", path, out->n_skipped_bad);
    if (pack_docs(&out->docs, opt.seq_len, opt.pack, &out->rows, &out->n_skipped_too_long, err,
                  sizeof err) != 0)
        fatal("%s: %s", path, err);
}

void packed_dataset_free(PackedDataset *d) {
    for (int i = 0; i < d->n_samples; i++) tokenized_sample_free(&d->samples[i]);
    free(d->samples);
    doc_list_free(&d->docs);
    packed_rows_free(&d->rows);
    memset(d, 0, sizeof *d);
}
