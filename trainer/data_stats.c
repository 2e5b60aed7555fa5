#include "trainer/data_stats.h"

#include <stdlib.h>
#include <string.h>

#include "attention/mask.h"
#include "common/check.h"

// longest_line: NULL, or the line of the first longest document.
static void count_docs(const DocList *docs, long long *tokens, long long *trained, int *longest,
                       int *longest_line) {
    for (int d = 0; d < docs->n_docs; d++) {
        if (docs->docs[d].n > *longest) {
            *longest = docs->docs[d].n;
            if (longest_line) *longest_line = docs->docs[d].line;
        }
        *tokens += docs->docs[d].n;
        for (int i = 0; i < docs->docs[d].n; i++) *trained += docs->docs[d].target[i] != -1;
    }
}

void stats_compute(const TokenizedSample *samples, int n_samples, LayoutKind layout,
                   const LossOptions *loss, const DocList *docs, const PackedRows *rows, int tile, DatasetStats *out) {
    memset(out, 0, sizeof *out);
    out->layout = layout;
    out->n_samples = n_samples;
    out->n_docs = docs->n_docs;
    out->n_rows = rows->n_rows;
    out->seq_len = rows->seq_len;
    out->tile = tile;
    count_docs(docs, &out->layout_tokens, &out->layout_trained, &out->longest_doc,
               &out->longest_line);
    for (int s = 0; s < n_samples; s++) {
        out->n_turns += samples[s].n_turns;
        DocList npass = {0};
        char err[256];
        if (layout_sample(LAYOUT_NPASS, loss, &samples[s], s, &npass, err, sizeof err) != 0)
            fatal("statistics: %s", err);
        int npass_longest = 0;
        count_docs(&npass, &out->npass_tokens, &out->npass_trained, &npass_longest, NULL);
        doc_list_free(&npass);
    }
    size_t n_slots = (size_t)rows->n_rows * (size_t)rows->seq_len;
    for (size_t slot = 0; slot < n_slots; slot++) out->real_slots += rows->doc[slot] != -1;
    if (tile <= 0 || rows->n_rows == 0) return;
    int n_tiles = (rows->seq_len + tile - 1) / tile;
    uint8_t *kinds = xmalloc((size_t)n_tiles * (size_t)n_tiles);  // [n_tiles, n_tiles]
    for (int r = 0; r < rows->n_rows; r++) {
        size_t base = (size_t)r * (size_t)rows->seq_len;
        tile_classify(rows->lo + base, rows->hi + base, rows->seq_len, tile, tile, kinds);
        for (int i = 0; i < n_tiles * n_tiles; i++) {
            out->tiles_empty += kinds[i] == TILE_EMPTY;
            out->tiles_partial += kinds[i] == TILE_PARTIAL;
            out->tiles_full += kinds[i] == TILE_FULL;
        }
    }
    free(kinds);
}

static double percent(long long part, long long whole) {
    return whole > 0 ? 100.0 * (double)part / (double)whole : 0.0;
}

void stats_print(const DatasetStats *s, FILE *f) {
    long long slots = (long long)s->n_rows * s->seq_len;
    long long tiles = s->tiles_empty + s->tiles_partial + s->tiles_full;
    fprintf(f, "%-22s %s\n", "layout", layout_name(s->layout));
    fprintf(f, "%-22s %d\n", "conversations", s->n_samples);
    fprintf(f, "%-22s %d\n", "turns", s->n_turns);
    // Under keep no view strips anything: every layout is the one causal pass of each
    // conversation, and duplicate and mask_only lay out exactly what npass does.
    fprintf(f, "%-22s %s\n", "history thinking",
            s->keep_thinking ? "keep: every layout is one causal pass per conversation "
                               "(duplicate = mask_only = npass)"
                             : "strip");
    fprintf(f, "%-22s %d (longest %d tokens)\n", "documents", s->n_docs, s->longest_doc);
    // A document is laid out whole in one row: the longest decides data.seq_len.
    if (s->longest_line > 0)
        fprintf(f, "%-22s line %d: %d tokens in one row, so data.seq_len >= %d (it is %d)\n",
                "longest conversation", s->longest_line, s->longest_doc, s->longest_doc,
                s->seq_len);
    fprintf(f, "%-22s %lld (%.3f x npass)\n", "tokens", s->layout_tokens,
            s->npass_tokens ? (double)s->layout_tokens / (double)s->npass_tokens : 0.0);
    fprintf(f, "%-22s %lld\n", "npass tokens", s->npass_tokens);
    fprintf(f, "%-22s %lld (npass %lld)\n", "trained tokens", s->layout_trained,
            s->npass_trained);
    fprintf(f, "%-22s %d x %d\n", "rows x seq_len", s->n_rows, s->seq_len);
    fprintf(f, "%-22s %.1f%% (%lld of %lld slots)\n", "packing efficiency",
            percent(s->real_slots, slots), s->real_slots, slots);
    char label[32];
    snprintf(label, sizeof label, "tiles %dx%d", s->tile, s->tile);
    fprintf(f, "%-22s empty %.1f%%  partial %.1f%%  full %.1f%%  (%lld tiles)\n", label,
            percent(s->tiles_empty, tiles), percent(s->tiles_partial, tiles),
            percent(s->tiles_full, tiles), tiles);
    fprintf(f, "%-22s %d bad, %d too long\n", "skipped", s->n_skipped_bad,
            s->n_skipped_too_long);
}
