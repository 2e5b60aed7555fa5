#include "data/batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// Reports a bad sample, its location in front: fatal unless skip_bad, else a warning and
// a count.
static void bad_sample(const DataOptions *opt, PackedDataset *out, const char *path, int line,
                       const char *why) {
    char message[1200];
    fail_at(message, sizeof message, path, line, "%s", why);
    if (!opt->skip_bad) fatal("%s", message);
    fprintf(stderr, "onepass: warning: skipping sample: %s\n", message);
    out->n_skipped_bad++;
}

void packed_dataset_load(const Tokenizer *tok, const char *path, DataOptions opt,
                         PackedDataset *out) {
    memset(out, 0, sizeof *out);
    char why[1024];
    if (template_check_tokenizer(tok, why, sizeof why) != 0) fatal("%s", why);
    Dataset data;
    dataset_load(path, opt.skip_bad, &data);
    out->n_skipped_bad = data.n_skipped;
    out->samples = xcalloc((size_t)data.n_samples, sizeof(TokenizedSample));
    for (int i = 0; i < data.n_samples; i++) {
        if (opt.max_samples > 0 && out->n_samples == opt.max_samples) break;
        const Sample *sample = &data.samples[i];
        TokenizedSample *ts = &out->samples[out->n_samples];
        if (sample_tokenize(tok, sample, opt.special_in_text, ts, why, sizeof why) != 0) {
            bad_sample(&opt, out, path, sample->line, why);
            continue;
        }
        if (layout_sample(opt.layout, ts, out->n_samples, &out->docs, why, sizeof why) != 0) {
            bad_sample(&opt, out, path, sample->line, why);
            tokenized_sample_free(ts);
            continue;
        }
        out->n_samples++;
    }
    dataset_free(&data);
    if (out->n_samples == 0)
        fatal("%s: no usable samples (%d skipped)", path, out->n_skipped_bad);
    if (pack_docs(&out->docs, opt.seq_len, opt.pack, &out->rows, &out->n_skipped_too_long, why,
                  sizeof why) != 0) {
        const Doc *too_long = &out->docs.docs[first_doc_too_long(&out->docs, opt.seq_len)];
        char message[1200];
        fail_at(message, sizeof message, path, too_long->line, "%s", why);
        fatal("%s", message);
    }
}

void packed_dataset_free(PackedDataset *d) {
    for (int i = 0; i < d->n_samples; i++) tokenized_sample_free(&d->samples[i]);
    free(d->samples);
    doc_list_free(&d->docs);
    packed_rows_free(&d->rows);
    memset(d, 0, sizeof *d);
}
