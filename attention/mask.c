// Tile lists from per-key visible intervals (DESIGN.md §4).
#include "attention/mask.h"

#include <string.h>
#include "common/check.h"

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Per key tile: a difference array over query tiles marks the tiles that some key's
// clamped [lo, hi) reaches (non-empty); the tile is full iff every key's interval
// covers the whole query range, i.e. max(lo) <= q0 and min(hi) >= q1.
// Cost O(seq_len + n_q_tiles * n_k_tiles), not O(seq_len^2).
void tile_classify(const int32_t *lo, const int32_t *hi, int seq_len, int block_m, int block_n,
                   uint8_t *kinds) {
    CHECK(seq_len > 0 && block_m > 0 && block_n > 0,
          "tile_classify: seq_len %d, block_m %d, block_n %d must be positive", seq_len, block_m,
          block_n);
    int n_q_tiles = ceil_div(seq_len, block_m), n_k_tiles = ceil_div(seq_len, block_n);
    int *reach = xmalloc((size_t)(n_q_tiles + 1) * sizeof(int));  // [n_q_tiles + 1] difference array
    for (int kt = 0; kt < n_k_tiles; kt++) {
        int k0 = kt * block_n, k1 = k0 + block_n < seq_len ? k0 + block_n : seq_len;
        memset(reach, 0, (size_t)(n_q_tiles + 1) * sizeof(int));
        int32_t max_lo = INT32_MIN, min_hi = INT32_MAX;
        for (int k = k0; k < k1; k++) {
            if (lo[k] > max_lo) max_lo = lo[k];
            if (hi[k] < min_hi) min_hi = hi[k];
            int first = lo[k] > 0 ? lo[k] : 0, end = hi[k] < seq_len ? hi[k] : seq_len;
            if (first >= end) continue;  // visible to no query of this row
            reach[first / block_m]++;
            reach[(end - 1) / block_m + 1]--;
        }
        int reaching = 0;
        for (int qt = 0; qt < n_q_tiles; qt++) {
            reaching += reach[qt];
            int q0 = qt * block_m, q1 = q0 + block_m < seq_len ? q0 + block_m : seq_len;
            uint8_t kind = TILE_EMPTY;
            if (max_lo <= q0 && min_hi >= q1) kind = TILE_FULL;
            else if (reaching > 0) kind = TILE_PARTIAL;
            kinds[(size_t)qt * n_k_tiles + kt] = kind;
        }
    }
    free(reach);
}

size_t attn_mask_storage_count(int n_rows, int seq_len, int block_m, int block_n) {
    size_t nq = (size_t)ceil_div(seq_len, block_m), nk = (size_t)ceil_div(seq_len, block_n);
    // per orientation: two count arrays [rows, lines] and two index arrays [rows, lines, len]
    return (size_t)n_rows * (2 * nq + 2 * nq * nk + 2 * nk + 2 * nk * nq);
}

// Places the four arrays of one orientation at *cursor and advances it.
static TileLists lists_at(int32_t **cursor, int n_rows, int n_lines, int line_len) {
    size_t counts = (size_t)n_rows * n_lines, lists = counts * line_len;
    TileLists l = {.n_lines = n_lines, .line_len = line_len};
    l.partial_count = *cursor;
    l.full_count = l.partial_count + counts;
    l.partial_idx = l.full_count + counts;
    l.full_idx = l.partial_idx + lists;
    *cursor = l.full_idx + lists;
    return l;
}

AttnMask attn_mask_view(int n_rows, int seq_len, int block_m, int block_n, const int32_t *lo,
                        const int32_t *hi, int32_t *storage) {
    CHECK(n_rows > 0 && seq_len > 0 && block_m > 0 && block_n > 0,
          "attn_mask_view: n_rows %d, seq_len %d, block_m %d, block_n %d must be positive",
          n_rows, seq_len, block_m, block_n);
    AttnMask m = {.n_rows = n_rows, .seq_len = seq_len, .block_m = block_m, .block_n = block_n,
                  .lo = lo, .hi = hi, .storage = storage};
    int n_q_tiles = ceil_div(seq_len, block_m), n_k_tiles = ceil_div(seq_len, block_n);
    int32_t *cursor = storage;
    m.by_query = lists_at(&cursor, n_rows, n_q_tiles, n_k_tiles);
    m.by_key = lists_at(&cursor, n_rows, n_k_tiles, n_q_tiles);
    return m;
}

// Appends tile t of `kind` to line `slot` of `lists` when it is not empty.
static void lists_append(TileLists *lists, size_t slot, uint8_t kind, int32_t t) {
    const size_t list = slot * lists->line_len;
    if (kind == TILE_PARTIAL) lists->partial_idx[list + lists->partial_count[slot]++] = t;
    else if (kind == TILE_FULL) lists->full_idx[list + lists->full_count[slot]++] = t;
}

void attn_mask_build(const int32_t *lo, const int32_t *hi, int n_rows, int seq_len, int block_m,
                     int block_n, AttnMask *out) {
    size_t count = attn_mask_storage_count(n_rows, seq_len, block_m, block_n);
    AttnMask m = attn_mask_view(n_rows, seq_len, block_m, block_n, lo, hi,
                                xcalloc(count, sizeof(int32_t)));
    size_t nq = (size_t)m.by_query.n_lines, nk = (size_t)m.by_key.n_lines;
#pragma omp parallel
    {
        uint8_t *kinds = xmalloc(nq * nk);  // [n_q_tiles, n_k_tiles] of one row
#pragma omp for schedule(dynamic)
        for (int row = 0; row < n_rows; row++) {
            size_t r = (size_t)row;
            tile_classify(lo + r * seq_len, hi + r * seq_len, seq_len, block_m, block_n, kinds);
            for (size_t qt = 0; qt < nq; qt++)
                for (size_t kt = 0; kt < nk; kt++)
                    lists_append(&m.by_query, r * nq + qt, kinds[qt * nk + kt], (int32_t)kt);
            for (size_t kt = 0; kt < nk; kt++)
                for (size_t qt = 0; qt < nq; qt++)
                    lists_append(&m.by_key, r * nk + kt, kinds[qt * nk + kt], (int32_t)qt);
        }
        free(kinds);
    }
    *out = m;
}

void attn_mask_free(AttnMask *m) {
    free(m->storage);
    memset(m, 0, sizeof(*m));
}

void attn_mask_copy_lists(AttnMask *dst, const AttnMask *src) {
    CHECK(dst->n_rows == src->n_rows && dst->seq_len == src->seq_len &&
              dst->block_m == src->block_m && dst->block_n == src->block_n,
          "attn_mask_copy_lists: masks of different shapes");
    memcpy(dst->storage, src->storage,
           attn_mask_storage_count(src->n_rows, src->seq_len, src->block_m, src->block_n) *
               sizeof(int32_t));
}

double attn_mask_sparsity(const AttnMask *m) {
    const TileLists *l = &m->by_query;
    size_t n_slots = (size_t)m->n_rows * l->n_lines;
    double total = (double)n_slots * l->line_len, non_empty = 0;
    for (size_t i = 0; i < n_slots; i++) non_empty += l->partial_count[i] + l->full_count[i];
    return total > 0 ? (total - non_empty) / total : 0.0;
}
