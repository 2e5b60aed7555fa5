// Tile metadata (attention/mask.c) against brute force over the dense interval mask,
// on random intervals, random (ragged, non-power-of-two) tile sizes and both orientations.
#include <stdlib.h>
#include "attention/mask.h"
#include "common/check.h"
#include "tests/test_util.h"

// Fills one row's intervals; the style varies so that empty, partial and full tiles all occur.
static void random_intervals(TestRng *rng, int seq_len, int32_t *lo, int32_t *hi) {
    int style = test_rng_int(rng, 0, 3);
    int doc_end = 0;
    for (int k = 0; k < seq_len; k++) {
        int key_style = style == 3 ? test_rng_int(rng, 0, 2) : style;
        if (test_rng_int(rng, 0, 9) == 0) {  // padding: visible to nobody
            lo[k] = hi[k] = test_rng_int(rng, 0, seq_len);
            continue;
        }
        if (key_style == 0) {  // any interval, not necessarily causal
            int a = test_rng_int(rng, 0, seq_len), b = test_rng_int(rng, 0, seq_len);
            lo[k] = a < b ? a : b;
            hi[k] = a < b ? b : a;
        } else if (key_style == 1) {  // causal inside random documents
            if (k >= doc_end) doc_end = k + test_rng_int(rng, 1, seq_len);
            lo[k] = k;
            hi[k] = doc_end < seq_len ? doc_end : seq_len;
        } else {  // wide intervals: many full tiles
            lo[k] = test_rng_int(rng, 0, seq_len / 8);
            hi[k] = seq_len - test_rng_int(rng, 0, seq_len / 8);
        }
    }
}

// Brute-force kinds of one row: counts visible pairs per tile over existing slots.
static void brute_kinds(const int32_t *lo, const int32_t *hi, int seq_len, int block_m,
                        int block_n, int n_q_tiles, int n_k_tiles, uint8_t *kinds) {
    for (int qt = 0; qt < n_q_tiles; qt++)
        for (int kt = 0; kt < n_k_tiles; kt++) {
            int pairs = 0, visible = 0;
            for (int q = qt * block_m; q < (qt + 1) * block_m && q < seq_len; q++)
                for (int k = kt * block_n; k < (kt + 1) * block_n && k < seq_len; k++) {
                    pairs++;
                    visible += lo[k] <= q && q < hi[k];
                }
            kinds[qt * n_k_tiles + kt] =
                visible == 0 ? TILE_EMPTY : visible == pairs ? TILE_FULL : TILE_PARTIAL;
        }
}

// Checks one list (count + ascending entries) against the tiles of `kind` along one
// line of the brute-force kind matrix: kinds[first + i * stride], i < n.
static void check_list(const uint8_t *kinds, size_t first, size_t stride, int n, TileKind kind,
                       int32_t count, const int32_t *idx, const char *what, int row, int tile) {
    int expected = 0;
    for (int i = 0; i < n; i++) {
        if (kinds[first + (size_t)i * stride] != kind) continue;
        EXPECT(expected < count && idx[expected] == i, "%s row %d tile %d: entry %d should be %d",
              what, row, tile, expected, i);
        expected++;
    }
    EXPECT(count == expected, "%s row %d tile %d: count %d, expected %d", what, row, tile, count,
          expected);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    for (int trial = 0; trial < 300; trial++) {
        int n_rows = test_rng_int(&rng, 1, 3);
        int seq_len = test_rng_int(&rng, 1, 260);
        int block_m = test_rng_int(&rng, 1, 70), block_n = test_rng_int(&rng, 1, 70);
        if (trial % 5 == 0) block_m = 64, block_n = 32;  // typical power-of-two tiles too
        int32_t *lo = xmalloc((size_t)n_rows * seq_len * sizeof(int32_t));  // [n_rows, seq_len]
        int32_t *hi = xmalloc((size_t)n_rows * seq_len * sizeof(int32_t));  // [n_rows, seq_len]
        for (int r = 0; r < n_rows; r++)
            random_intervals(&rng, seq_len, lo + (size_t)r * seq_len, hi + (size_t)r * seq_len);

        AttnMask m;
        attn_mask_build(lo, hi, n_rows, seq_len, block_m, block_n, &m);
        int nq = m.by_query.n_lines, nk = m.by_key.n_lines;
        EXPECT(nq == (seq_len + block_m - 1) / block_m && nk == (seq_len + block_n - 1) / block_n,
              "tile counts %d %d", nq, nk);
        uint8_t *expected = xmalloc((size_t)nq * nk);  // [n_q_tiles, n_k_tiles]
        uint8_t *got = xmalloc((size_t)nq * nk);       // [n_q_tiles, n_k_tiles]
        long n_empty = 0;
        for (int r = 0; r < n_rows; r++) {
            const int32_t *row_lo = lo + (size_t)r * seq_len, *row_hi = hi + (size_t)r * seq_len;
            brute_kinds(row_lo, row_hi, seq_len, block_m, block_n, nq, nk, expected);
            tile_classify(row_lo, row_hi, seq_len, block_m, block_n, got);
            int mismatches = 0;
            for (int t = 0; t < nq * nk; t++) {
                mismatches += got[t] != expected[t];
                n_empty += expected[t] == TILE_EMPTY;
            }
            EXPECT(mismatches == 0, "trial %d row %d S=%d %dx%d: %d tiles misclassified", trial, r,
                  seq_len, block_m, block_n, mismatches);
            for (int qt = 0; qt < nq; qt++) {
                size_t slot = (size_t)r * nq + qt;
                check_list(expected, (size_t)qt * nk, 1, nk, TILE_PARTIAL, m.by_query.partial_count[slot],
                           m.by_query.partial_idx + slot * nk, "forward partial", r, qt);
                check_list(expected, (size_t)qt * nk, 1, nk, TILE_FULL, m.by_query.full_count[slot],
                           m.by_query.full_idx + slot * nk, "forward full", r, qt);
            }
            for (int kt = 0; kt < nk; kt++) {
                size_t slot = (size_t)r * nk + kt;
                check_list(expected, (size_t)kt, (size_t)nk, nq, TILE_PARTIAL, m.by_key.partial_count[slot],
                           m.by_key.partial_idx + slot * nq, "backward partial", r, kt);
                check_list(expected, (size_t)kt, (size_t)nk, nq, TILE_FULL, m.by_key.full_count[slot],
                           m.by_key.full_idx + slot * nq, "backward full", r, kt);
            }
        }
        double sparsity = (double)n_empty / ((double)n_rows * nq * nk);
        EXPECT(fabs(attn_mask_sparsity(&m) - sparsity) < 1e-12, "sparsity %g, expected %g",
              attn_mask_sparsity(&m), sparsity);
        attn_mask_free(&m);
        free(expected);
        free(got);
        free(lo);
        free(hi);
    }
    return test_finish();
}
