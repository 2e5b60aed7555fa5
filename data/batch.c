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

// What the longest document of a sample holds at the least, known before tokenizing:
// bytes of text (message contents and reasoning) and template tokens (the control tokens
// around every message, template_min_tokens).
typedef struct {
    size_t bytes;
    long long controls;
} TextBound;

static size_t content_bytes(const Message *m) { return m->content ? strlen(m->content) : 0; }
static size_t reasoning_bytes(const Message *m) { return m->reasoning ? strlen(m->reasoning) : 0; }

// The bound in tokens: each token stands for at most piece_bytes bytes of text.
static size_t bound_tokens(TextBound b, size_t piece_bytes) {
    return (b.bytes + piece_bytes - 1) / piece_bytes + (size_t)b.controls;
}

// Every layout's longest document holds the inference view of each trained reply (npass's
// document of its user turn is that view or longer; the one-document layouts hold every
// view): the messages before it without reasoning, then it with its reasoning. The
// one-document layouts also hold every message up to the last reply. A shared-prefix set:
// its prompt, then one completion (npass) or all of them.
static TextBound min_document(const Sample *s, const ChatTemplate *t, LayoutKind layout,
                              size_t piece_bytes) {
    TextBound best = {0}, before = {0}, all = {0};
    for (int i = 0; i < s->n_messages; i++) {
        const Message *m = &s->messages[i];
        before.bytes += content_bytes(m);
        before.controls += template_min_tokens(t, m->role);
        if (m->role != MSG_ASSISTANT) continue;
        all = before;  // messages after the last reply are not rendered
        const TextBound view = {before.bytes + reasoning_bytes(m), before.controls};
        if (!m->context && bound_tokens(view, piece_bytes) > bound_tokens(best, piece_bytes))
            best = view;
    }
    if (s->kind == SAMPLE_SHARED_PREFIX) {
        all = best = before;
        size_t longest = 0;
        for (int i = 0; i < s->n_completions; i++) {
            const size_t n = content_bytes(&s->completions[i]) + reasoning_bytes(&s->completions[i]);
            all.bytes += n;
            if (n > longest) longest = n;
        }
        best.bytes += longest;
    }
    if (layout == LAYOUT_NPASS || bound_tokens(best, piece_bytes) > bound_tokens(all, piece_bytes))
        return best;
    return all;
}

// Whether a sample is too long for seq_len whatever its text tokenizes to: checked on the
// bytes and the template's tokens, before tokenizing, so a huge line costs no more than
// its parse.
static bool cannot_fit(const Sample *s, const ChatTemplate *t, LayoutKind layout, int seq_len,
                       size_t piece_bytes, char *why, size_t why_len) {
    const TextBound bound = min_document(s, t, layout, piece_bytes);
    const size_t min_tokens = bound_tokens(bound, piece_bytes);
    if (min_tokens <= (size_t)seq_len) return false;
    snprintf(why, why_len, "a document of at least %zu tokens (%zu bytes of text) does not fit "
             "seq_len %d (raise data.seq_len, or set data.skip_too_long to skip it)",
             min_tokens, bound.bytes, seq_len);
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
    int skipped_before_layout = data.n_too_long;  // samples
    for (int i = 0; i < data.n_samples; i++) {
        if (opt.max_samples > 0 && out->n_samples == opt.max_samples) break;
        const Sample *sample = &data.samples[i];
        TokenizedSample *ts = &out->samples[out->n_samples];
        if (cannot_fit(sample, tmpl, opt.layout, opt.seq_len, piece_bytes, why, sizeof why)) {
            if (!opt.pack.skip_too_long) {
                char message[1200];
                fail_at(message, sizeof message, path, sample->line, "%s", why);
                fatal("%s", message);
            }
            skipped_before_layout++;
            continue;
        }
        if (sample_tokenize(tok, tmpl, sample, opt.special_in_text, ts, why, sizeof why) != 0) {
            bad_sample(&opt, out, path, sample->line, why);
            continue;
        }
        // No layout builds a document that cannot fit (npass's views of a line of many
        // short turns would grow quadratically before pack_docs saw one).
        const long long longest = layout_longest_doc(opt.layout, &opt.loss, ts);
        if (longest > opt.seq_len) {
            char message[1200];
            fail_at(message, sizeof message, path, sample->line,
                    "a document of %lld tokens does not fit seq_len %d (raise data.seq_len, or "
                    "set data.skip_too_long to skip it)", longest, opt.seq_len);
            if (!opt.pack.skip_too_long) fatal("%s", message);
            tokenized_sample_free(ts);
            skipped_before_layout++;
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
    out->n_skipped_too_long += skipped_before_layout;
}

void packed_dataset_free(PackedDataset *d) {
    for (int i = 0; i < d->n_samples; i++) tokenized_sample_free(&d->samples[i]);
    free(d->samples);
    doc_list_free(&d->docs);
    packed_rows_free(&d->rows);
    memset(d, 0, sizeof *d);
}
