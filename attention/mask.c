// Tile metadata from per-key visible intervals, and the dense oracle from tags (DESIGN.md §4).
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
    if (seq_len <= 0 || block_m <= 0 || block_n <= 0)
        fatal("%s:%d: tile_classify: seq_len %d, block_m %d, block_n %d must be positive",
              __FILE__, __LINE__, seq_len, block_m, block_n);
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

void tile_mask_build(const int32_t *lo, const int32_t *hi, int n_rows, int seq_len, int block_m,
                     int block_n, TileMask *out) {
    if (n_rows <= 0 || seq_len <= 0 || block_m <= 0 || block_n <= 0)
        fatal("%s:%d: tile_mask_build: n_rows %d, seq_len %d, block_m %d, block_n %d must be "
              "positive", __FILE__, __LINE__, n_rows, seq_len, block_m, block_n);
    TileMask m = {.n_rows = n_rows, .seq_len = seq_len, .block_m = block_m, .block_n = block_n};
    m.n_q_tiles = ceil_div(seq_len, block_m);
    m.n_k_tiles = ceil_div(seq_len, block_n);
    size_t nq = (size_t)m.n_q_tiles, nk = (size_t)m.n_k_tiles, rows = (size_t)n_rows;
    m.q_partial_count = xcalloc(rows * nq, sizeof(int32_t));
    m.q_full_count = xcalloc(rows * nq, sizeof(int32_t));
    m.q_partial_idx = xcalloc(rows * nq * nk, sizeof(int32_t));
    m.q_full_idx = xcalloc(rows * nq * nk, sizeof(int32_t));
    m.k_partial_count = xcalloc(rows * nk, sizeof(int32_t));
    m.k_full_count = xcalloc(rows * nk, sizeof(int32_t));
    m.k_partial_idx = xcalloc(rows * nk * nq, sizeof(int32_t));
    m.k_full_idx = xcalloc(rows * nk * nq, sizeof(int32_t));

#pragma omp parallel
    {
        uint8_t *kinds = xmalloc(nq * nk);  // [n_q_tiles, n_k_tiles] of one row
#pragma omp for schedule(dynamic)
        for (int row = 0; row < n_rows; row++) {
            size_t r = (size_t)row;
            tile_classify(lo + r * seq_len, hi + r * seq_len, seq_len, block_m, block_n, kinds);
            for (size_t qt = 0; qt < nq; qt++) {  // forward: key tiles of each query tile
                size_t slot = r * nq + qt;
                for (size_t kt = 0; kt < nk; kt++) {
                    uint8_t kind = kinds[qt * nk + kt];
                    if (kind == TILE_PARTIAL) m.q_partial_idx[slot * nk + m.q_partial_count[slot]++] = (int32_t)kt;
                    else if (kind == TILE_FULL) m.q_full_idx[slot * nk + m.q_full_count[slot]++] = (int32_t)kt;
                }
            }
            for (size_t kt = 0; kt < nk; kt++) {  // backward: query tiles of each key tile
                size_t slot = r * nk + kt;
                for (size_t qt = 0; qt < nq; qt++) {
                    uint8_t kind = kinds[qt * nk + kt];
                    if (kind == TILE_PARTIAL) m.k_partial_idx[slot * nq + m.k_partial_count[slot]++] = (int32_t)qt;
                    else if (kind == TILE_FULL) m.k_full_idx[slot * nq + m.k_full_count[slot]++] = (int32_t)qt;
                }
            }
        }
        free(kinds);
    }
    *out = m;
}

void tile_mask_free(TileMask *m) {
    free(m->q_partial_count);
    free(m->q_full_count);
    free(m->q_partial_idx);
    free(m->q_full_idx);
    free(m->k_partial_count);
    free(m->k_full_count);
    free(m->k_partial_idx);
    free(m->k_full_idx);
    memset(m, 0, sizeof(*m));
}

double tile_mask_sparsity(const TileMask *m) {
    size_t n_slots = (size_t)m->n_rows * m->n_q_tiles;
    double total = (double)n_slots * m->n_k_tiles, non_empty = 0;
    for (size_t i = 0; i < n_slots; i++) non_empty += m->q_partial_count[i] + m->q_full_count[i];
    return total > 0 ? (total - non_empty) / total : 0.0;
}

// Strip-thinking visibility of key k to query q (same document, k <= q), shared by
// mask_only and duplicate. answer_has_history: k's (doc, turn) has a history copy aB.
static bool strip_thinking_visible(int32_t turn_q, int32_t role_q, int32_t turn_k, int32_t role_k,
                                   bool answer_has_history) {
    bool later_turn_or_history = turn_k < turn_q || role_q == ROLE_ANSWER_HISTORY;
    if (role_k == ROLE_THINK) return !later_turn_or_history;
    if (role_k == ROLE_ANSWER && answer_has_history) return !later_turn_or_history;
    if (role_k == ROLE_ANSWER_HISTORY)
        return turn_q > turn_k || (role_q == ROLE_ANSWER_HISTORY && turn_q == turn_k);
    return true;
}

void dense_mask_from_tags(LayoutKind layout, const int32_t *doc, const int32_t *turn,
                          const int32_t *role, int seq_len, uint8_t *mask) {
    size_t n = (size_t)seq_len;
    // has_history[k]: some token of k's (doc, turn) is an answer history copy.
    bool *has_history = xcalloc(n, sizeof(bool));  // [seq_len]
    for (size_t j = 0; j < n; j++) {
        if (doc[j] == -1 || role[j] != ROLE_ANSWER_HISTORY) continue;
        for (size_t k = 0; k < n; k++)
            if (doc[k] == doc[j] && turn[k] == turn[j]) has_history[k] = true;
    }
    for (size_t q = 0; q < n; q++) {
        for (size_t k = 0; k < n; k++) {
            bool visible = doc[k] != -1 && doc[k] == doc[q] && k <= q;
            if (visible) {
                switch (layout) {
                case LAYOUT_NPASS: break;
                case LAYOUT_SHARED_PREFIX: visible = turn[k] == 0 || turn[k] == turn[q]; break;
                case LAYOUT_MASK_ONLY:
                case LAYOUT_DUPLICATE:
                    visible = strip_thinking_visible(turn[q], role[q], turn[k], role[k], has_history[k]);
                    break;
                default: fatal("%s:%d: dense_mask_from_tags: unknown layout %d", __FILE__, __LINE__, (int)layout);
                }
            }
            mask[q * n + k] = visible;
        }
    }
    free(has_history);
}
