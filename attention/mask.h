// The attention mask of a batch of rows (DESIGN.md §4): per-key visible intervals and
// the block-sparse tile lists derived from them, in one struct that every attention
// function takes. The attention stage owns the tile size.
#pragma once
#include <stddef.h>
#include <stdint.h>

// The tile (queries x keys) of the CUDA kernels. Masks the trainer builds use it for
// both backends; the CPU oracle accepts any tile sizes (the tests vary them).
enum { ATTN_TILE = 64 };

typedef enum { TILE_EMPTY = 0, TILE_PARTIAL = 1, TILE_FULL = 2 } TileKind;

// The tile lists of one orientation. A line is a query tile (by_query: its key tiles,
// what the forward walks) or a key tile (by_key: its query tiles, for the backward).
// Each list ascends; only the first `count` entries are valid.
typedef struct {
    int n_lines, line_len;   // lines per row; tiles across a line (a list's capacity)
    int32_t *partial_count;  // [n_rows, n_lines]
    int32_t *full_count;     // [n_rows, n_lines]
    int32_t *partial_idx;    // [n_rows, n_lines, line_len]
    int32_t *full_idx;       // [n_rows, n_lines, line_len]
} TileLists;

// Key k is visible to query q (slots of one row) iff lo[k] <= q < hi[k]. The lists of
// both orientations live in one allocation, `storage`; lo and hi are the batch's
// columns, referenced. All pointers are host memory, or all device memory (the CUDA
// functions of mask_cuda.h).
typedef struct {
    int n_rows, seq_len, block_m, block_n;  // block_m queries x block_n keys per tile
    const int32_t *lo, *hi;                 // [n_rows, seq_len]
    TileLists by_query;  // n_lines = ceil(seq_len / block_m), line_len = ceil(seq_len / block_n)
    TileLists by_key;    // n_lines = ceil(seq_len / block_n), line_len = ceil(seq_len / block_m)
    int32_t *storage;    // [attn_mask_storage_count(...)]: every array of both orientations
} AttnMask;

// Elements of `storage` for this shape.
size_t attn_mask_storage_count(int n_rows, int seq_len, int block_m, int block_n);
// A mask whose lists point into `storage` (not allocated, not written here): how a
// mask is placed in memory someone else owns (an arena, a pinned buffer, the device).
AttnMask attn_mask_view(int n_rows, int seq_len, int block_m, int block_n, const int32_t *lo,
                        const int32_t *hi, int32_t *storage);

// The non-empty tiles of one line of one row: partial ones, then full ones.
typedef struct {
    const int32_t *partial, *full;
    int n_partial, n_full;
} TileLine;
static inline TileLine tile_line(const TileLists *lists, int row, int line) {
    size_t slot = (size_t)row * lists->n_lines + line;
    TileLine t = {lists->partial_idx + slot * lists->line_len,
                  lists->full_idx + slot * lists->line_len, lists->partial_count[slot],
                  lists->full_count[slot]};
    return t;
}

// Classifies every tile of one row: kinds[qt * n_k_tiles + kt] (TileKind).
// A tile is full iff every (q, k) in it is visible, empty iff none is. Slots
// past seq_len in the last tiles do not exist and are ignored.
void tile_classify(const int32_t *lo, const int32_t *hi, int seq_len, int block_m, int block_n,
                   uint8_t *kinds);

// Builds the mask of n_rows rows (lo/hi: host, [n_rows, seq_len], referenced by the
// result), allocating its storage; free with attn_mask_free.
void attn_mask_build(const int32_t *lo, const int32_t *hi, int n_rows, int seq_len, int block_m,
                     int block_n, AttnMask *out);
void attn_mask_free(AttnMask *m);
// Copies src's lists into dst's storage; both masks must have the same shape.
void attn_mask_copy_lists(AttnMask *dst, const AttnMask *src);
// Fraction of (row, q tile, k tile) triples that are empty.
double attn_mask_sparsity(const AttnMask *m);
