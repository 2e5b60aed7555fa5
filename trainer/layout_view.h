// What `train show` draws, computed: one layout's documents and packed rows of a few
// samples, their statistics (trainer/data_stats.h), and of the first row its attention
// tiles (ATTN_TILE) and, for the one-pass layouts, its pairs against the N-pass views
// (trainer/slot_context.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "data/batch.h"
#include "data/layout.h"
#include "data/pack.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "trainer/data_stats.h"
#include "trainer/slot_context.h"

typedef struct {
    LayoutKind layout;
    DocList docs;
    PackedRows rows;
    DatasetStats stats;      // of the rows, tiles of ATTN_TILE
    uint8_t *kinds;          // [n_tiles, n_tiles] TileKind of row 0 (tile_classify)
    long long tiles[3];      // row 0's tiles per TileKind
    uint8_t *pairs;          // [seq_len, seq_len] PairKind of row 0; NULL for npass
    PairCounts pair_counts;  // row 0's, with pairs
} LayoutView;

// The samples of `path` from the one on line `line` on, `count` at most, tokenized under
// opt; their number goes to *n_out. Fatal, naming path and line, when no sample starts on
// that line or one does not tokenize.
TokenizedSample *samples_from_line(const Tokenizer *tok, const char *path, int line, int count,
                                   const DataOptions *opt, int *n_out);

// Lays out and packs the samples under `layout` into v. Returns 0, or -1 with the
// reason in err when the layout does not apply to them (v is then empty); fatal when
// packing fails.
int layout_view_build(LayoutKind layout, const TokenizedSample *samples, int n_samples,
                      DataOptions opt, LayoutView *v, char *err, size_t err_len);
void layout_view_free(LayoutView *v);
