// Block-sparse mask metadata from per-key visible intervals (DESIGN.md §4), and the
// dense boolean oracle built from the layout's tags.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "data/layout.h"

typedef enum { TILE_EMPTY = 0, TILE_PARTIAL = 1, TILE_FULL = 2 } TileKind;

// Tile lists for a batch of rows, both orientations (like FlexAttention's BlockMask).
// Lists are ascending; only the first `count` entries of each list are valid.
typedef struct {
    int n_rows, seq_len, block_m, block_n;
    int n_q_tiles, n_k_tiles;   // ceil(seq_len / block_m), ceil(seq_len / block_n)
    // forward: per (row, query tile), key tiles
    int32_t *q_partial_count;   // [n_rows, n_q_tiles]
    int32_t *q_full_count;      // [n_rows, n_q_tiles]
    int32_t *q_partial_idx;     // [n_rows, n_q_tiles, n_k_tiles]
    int32_t *q_full_idx;        // [n_rows, n_q_tiles, n_k_tiles]
    // backward: per (row, key tile), query tiles
    int32_t *k_partial_count;   // [n_rows, n_k_tiles]
    int32_t *k_full_count;      // [n_rows, n_k_tiles]
    int32_t *k_partial_idx;     // [n_rows, n_k_tiles, n_q_tiles]
    int32_t *k_full_idx;        // [n_rows, n_k_tiles, n_q_tiles]
} TileMask;

// Classifies every tile of one row: kinds[qt * n_k_tiles + kt] (TileKind).
// A tile is full iff every (q, k) in it is visible, empty iff none is. Slots
// past seq_len in the last tiles do not exist and are ignored.
void tile_classify(const int32_t *lo, const int32_t *hi, int seq_len, int block_m, int block_n,
                   uint8_t *kinds);

// Builds both orientations for n_rows rows (lo/hi: [n_rows, seq_len]).
void tile_mask_build(const int32_t *lo, const int32_t *hi, int n_rows, int seq_len, int block_m,
                     int block_n, TileMask *out);
void tile_mask_free(TileMask *m);
// Fraction of (row, q tile, k tile) triples that are empty.
double tile_mask_sparsity(const TileMask *m);

// The oracle: visibility written as a predicate over tags (doc, turn, role) and
// the layout, independent of lo/hi. mask[q * seq_len + k] = 1 iff k is visible to q.
void dense_mask_from_tags(LayoutKind layout, const int32_t *doc, const int32_t *turn,
                          const int32_t *role, int seq_len, uint8_t *mask);
