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

// The most bytes of text one token stands for: the longest piece (decoded, a piece is
// never longer than its text).
static size_t max_piece_bytes(const Tokenizer *tok) {
    size_t longest = 1;
    for (int id = 0; id < tokenizer_vocab_size(tok); id++) {
        const char *piece = tokenizer_id_to_piece(tok, id);
        if (piece && strlen(piece) > longest) longest = strlen(piece);
    }
    return longest;
}

static size_t text_bytes(const Message *m, bool with_reasoning) {
    return strlen(m->content) + (with_reasoning && m->reasoning ? strlen(m->reasoning) : 0);
}

// Bytes of text that the sample's longest document holds at the least: every text of
// the sample (one document in every layout but npass); for npass, the last view (all
// prompts and answers) or one turn's reasoning, whichever is more.
static size_t min_document_bytes(const Sample *s, LayoutKind layout) {
    size_t all = 0, visible = 0, reasoning = 0;
    for (int pass = 0; pass < 2; pass++) {
        const Message *ms = pass ? s->completions : s->messages;
        const int n = pass ? s->n_completions : s->n_messages;
        for (int i = 0; i < n; i++) {
            all += text_bytes(&ms[i], true);
            visible += text_bytes(&ms[i], false);
            const size_t r = ms[i].reasoning ? strlen(ms[i].reasoning) : 0;
            if (r > reasoning) reasoning = r;
        }
    }
    if (layout != LAYOUT_NPASS) return all;
    return visible > reasoning ? visible : reasoning;
}

// Whether a sample's text is too long for seq_len whatever it tokenizes to: checked on
// the bytes, before tokenizing, so a huge line costs no more than its parse.
static bool cannot_fit(const Sample *s, LayoutKind layout, int seq_len, size_t piece_bytes,
                       char *why, size_t why_len) {
    const size_t bytes = min_document_bytes(s, layout);
    const size_t min_tokens = (bytes + piece_bytes - 1) / piece_bytes;
    if (min_tokens <= (size_t)seq_len) return false;
    snprintf(why, why_len, "a document of at least %zu tokens (%zu bytes of text) does not fit "
             "seq_len %d (raise data.seq_len, or set data.skip_too_long to skip it)",
             min_tokens, bytes, seq_len);
    return true;
}

LoadOptions data_load_options(const DataOptions *opt) {
    return (LoadOptions){.skip_bad = opt->skip_bad, .ignore_unknown_keys = opt->ignore_unknown_keys,
                         .max_line_bytes = opt->max_line_bytes,
                         .skip_too_long = opt->pack.skip_too_long};
}

void packed_dataset_load(const Tokenizer *tok, const char *path, DataOptions opt,
                         PackedDataset *out) {
    memset(out, 0, sizeof *out);
    char why[1024];
    const ChatTemplate *tmpl = opt.chat_template ? opt.chat_template : &TEMPLATE_ONEPASS;
    if (template_check_tokenizer(tok, tmpl, why, sizeof why) != 0) fatal("%s", why);
    Dataset data;
    const LoadOptions load = data_load_options(&opt);
    dataset_load(path, &load, &data);
    out->n_skipped_bad = data.n_skipped;
    out->samples = xcalloc((size_t)data.n_samples, sizeof(TokenizedSample));
    const size_t piece_bytes = max_piece_bytes(tok);
    int skipped_before_tokenizing = data.n_too_long;
    for (int i = 0; i < data.n_samples; i++) {
        if (opt.max_samples > 0 && out->n_samples == opt.max_samples) break;
        const Sample *sample = &data.samples[i];
        TokenizedSample *ts = &out->samples[out->n_samples];
        if (cannot_fit(sample, opt.layout, opt.seq_len, piece_bytes, why, sizeof why)) {
            if (!opt.pack.skip_too_long) {
                char message[1200];
                fail_at(message, sizeof message, path, sample->line, "%s", why);
                fatal("%s", message);
            }
            skipped_before_tokenizing++;
            continue;
        }
        if (sample_tokenize(tok, tmpl, sample, opt.special_in_text, ts, why, sizeof why) != 0) {
            bad_sample(&opt, out, path, sample->line, why);
            continue;
        }
        if (layout_sample(opt.layout, &opt.loss, ts, out->n_samples, &out->docs, why, sizeof why) != 0) {
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
    out->n_skipped_too_long += skipped_before_tokenizing;
}

void packed_dataset_free(PackedDataset *d) {
    for (int i = 0; i < d->n_samples; i++) tokenized_sample_free(&d->samples[i]);
    free(d->samples);
    doc_list_free(&d->docs);
    packed_rows_free(&d->rows);
    memset(d, 0, sizeof *d);
}
