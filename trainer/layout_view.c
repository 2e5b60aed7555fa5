// What `train show` draws, computed (trainer/layout_view.h).
#include "trainer/layout_view.h"

#include <stdlib.h>
#include <string.h>

#include "attention/mask.h"
#include "common/check.h"
#include "data/conversation.h"
#include "data/template.h"

TokenizedSample *samples_from_line(const Tokenizer *tok, const char *path, int line, int count,
                                   const DataOptions *opt, int *n_out) {
    Dataset data;
    const LoadOptions load = data_load_options(opt);
    dataset_load(path, &load, &data);
    int first = 0;
    while (first < data.n_samples && data.samples[first].line != line) first++;
    if (first == data.n_samples)
        fatal("show: --conversation %d: %s has no sample on line %d", line, path, line);
    if (count > data.n_samples - first) count = data.n_samples - first;
    TokenizedSample *samples = xcalloc((size_t)count, sizeof(TokenizedSample));
    const ChatTemplate *t = opt->chat_template ? opt->chat_template : &TEMPLATE_ONEPASS;
    char why[1024], message[1200];
    for (int i = 0; i < count; i++) {
        if (sample_tokenize(tok, t, &data.samples[first + i], opt->special_in_text, &samples[i],
                            why, sizeof why) != 0) {
            fail_at(message, sizeof message, path, data.samples[first + i].line, "%s", why);
            fatal("%s", message);
        }
    }
    dataset_free(&data);
    *n_out = count;
    return samples;
}

int layout_view_build(LayoutKind layout, const TokenizedSample *samples, int n_samples,
                      DataOptions opt, LayoutView *v, char *err, size_t err_len) {
    memset(v, 0, sizeof *v);
    v->layout = layout;
    for (int s = 0; s < n_samples; s++) {
        // Checked before laying out (the statistics lay out npass too, never longer than
        // the one-document layouts, data/layout.h): no document is built that cannot fit.
        const long long longest = layout_longest_doc(layout, &opt.loss, &samples[s]);
        if (longest > opt.seq_len)
            fatal("show: %s: line %d: a document of %lld tokens does not fit seq_len %d (raise "
                  "data.seq_len)", layout_name(layout), samples[s].line, longest, opt.seq_len);
        if (layout_sample(layout, &opt.loss, &samples[s], s, &v->docs, err, err_len) != 0) {
            doc_list_free(&v->docs);
            return -1;
        }
    }
    int n_skipped;
    char why[1024];
    if (pack_docs(&v->docs, opt.seq_len, opt.pack, &v->rows, &n_skipped, why, sizeof why) != 0)
        fatal("show: %s: %s", layout_name(layout), why);
    stats_compute(samples, n_samples, layout, &opt.loss, &v->docs, &v->rows, ATTN_TILE, &v->stats);
    v->stats.n_skipped_too_long = n_skipped;
    v->stats.keep_thinking = opt.chat_template && opt.chat_template->keep_thinking;

    const int seq_len = v->rows.seq_len, n_tiles = (seq_len + ATTN_TILE - 1) / ATTN_TILE;
    v->kinds = xmalloc((size_t)n_tiles * (size_t)n_tiles);
    tile_classify(v->rows.lo, v->rows.hi, seq_len, ATTN_TILE, ATTN_TILE, v->kinds);
    for (int i = 0; i < n_tiles * n_tiles; i++) v->tiles[v->kinds[i]]++;
    if (layout != LAYOUT_NPASS) {
        v->pairs = xmalloc((size_t)seq_len * (size_t)seq_len);
        pair_kinds_against_npass(samples, &v->docs, &v->rows, 0, v->pairs, &v->pair_counts);
    }
    return 0;
}

void layout_view_free(LayoutView *v) {
    doc_list_free(&v->docs);
    packed_rows_free(&v->rows);
    free(v->kinds);
    free(v->pairs);
}
