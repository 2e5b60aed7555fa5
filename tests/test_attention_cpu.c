// CPU block-sparse attention (attention/attention_cpu.c) against a plain dense O(S^2)
// attention in double, a finite-difference check of the backward, fully masked
// queries, and a poisoned empty key tile that must never be read.
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "attention/attention.h"
#include "common/check.h"
#include "tests/test_util.h"

typedef struct {
    AttnShape shape;
    int block_m, block_n;
    int32_t *lo, *hi;                  // [batch, seq_len]
    float *q, *k, *v, *dout;           // inputs; q/dout [B,S,H,D], k/v [B,S,KVH,D]
    float *out, *lse, *dq, *dk, *dv;   // results of the code under test
} Case;

static size_t q_elems(const AttnShape *s) { return (size_t)s->batch * s->seq_len * s->n_heads * s->head_dim; }
static size_t kv_elems(const AttnShape *s) { return (size_t)s->batch * s->seq_len * s->n_kv_heads * s->head_dim; }

static float *random_tensor(TestRng *rng, size_t n) {
    float *t = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) t[i] = test_rng_uniform(rng);
    return t;
}

static Case case_new(TestRng *rng, AttnShape shape, int block_m, int block_n) {
    Case c = {.shape = shape, .block_m = block_m, .block_n = block_n};
    size_t slots = (size_t)shape.batch * shape.seq_len;
    c.lo = xmalloc(slots * sizeof(int32_t));
    c.hi = xmalloc(slots * sizeof(int32_t));
    c.q = random_tensor(rng, q_elems(&shape));
    c.k = random_tensor(rng, kv_elems(&shape));
    c.v = random_tensor(rng, kv_elems(&shape));
    c.dout = random_tensor(rng, q_elems(&shape));
    c.out = xmalloc(q_elems(&shape) * sizeof(float));
    c.lse = xmalloc(slots * shape.n_heads * sizeof(float));
    c.dq = xmalloc(q_elems(&shape) * sizeof(float));
    c.dk = xmalloc(kv_elems(&shape) * sizeof(float));
    c.dv = xmalloc(kv_elems(&shape) * sizeof(float));
    // Stale values: the backward must overwrite, not accumulate.
    for (size_t i = 0; i < q_elems(&shape); i++) c.dq[i] = 7.0f;
    for (size_t i = 0; i < kv_elems(&shape); i++) c.dk[i] = c.dv[i] = 7.0f;
    return c;
}

static void case_free(Case *c) {
    void *buffers[] = {c->lo, c->hi, c->q, c->k, c->v, c->dout, c->out, c->lse, c->dq, c->dk, c->dv};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++) free(buffers[i]);
}

// Random intervals of one row: causal documents, arbitrary intervals, padding, and
// (sometimes) a stretch of queries that no key reaches.
static void random_row_intervals(TestRng *rng, int seq_len, int32_t *lo, int32_t *hi) {
    int style = test_rng_int(rng, 0, 2), doc_end = 0;
    int blind_from = test_rng_int(rng, 0, seq_len), blind_to = blind_from + test_rng_int(rng, 0, 9);
    for (int k = 0; k < seq_len; k++) {
        if (test_rng_int(rng, 0, 11) == 0) {
            lo[k] = hi[k] = k;
        } else if (style == 0 || (style == 2 && test_rng_int(rng, 0, 1))) {
            if (k >= doc_end) doc_end = k + test_rng_int(rng, 1, seq_len);
            lo[k] = k;
            hi[k] = doc_end < seq_len ? doc_end : seq_len;
        } else {
            int a = test_rng_int(rng, 0, seq_len), b = test_rng_int(rng, 0, seq_len);
            lo[k] = a < b ? a : b;
            hi[k] = a < b ? b : a;
        }
        // Queries in [blind_from, blind_to) see no key at all.
        if (lo[k] < blind_to && hi[k] > blind_from) {
            if (lo[k] >= blind_from) lo[k] = blind_to < hi[k] ? blind_to : hi[k];
            else hi[k] = blind_from;
        }
    }
}

// Dense reference in double: out, lse, and gradients for upstream dout. dq and dk are sums of
// terms P_ij (dP_ij - delta_i) that cancel (a query with one visible key has dq = 0 exactly), so
// their error is measured against the summed magnitude of those terms, dq_size and dk_size.
typedef struct {
    double *out, *lse, *dq, *dk, *dv, *dq_size, *dk_size;
} Reference;

static Reference reference_attention(const Case *c) {
    const AttnShape *s = &c->shape;
    const int S = s->seq_len, H = s->n_heads, KVH = s->n_kv_heads, D = s->head_dim;
    Reference r = {xcalloc(q_elems(s), sizeof(double)), xcalloc((size_t)s->batch * H * S, sizeof(double)),
                   xcalloc(q_elems(s), sizeof(double)), xcalloc(kv_elems(s), sizeof(double)),
                   xcalloc(kv_elems(s), sizeof(double)), xcalloc(q_elems(s), sizeof(double)),
                   xcalloc(kv_elems(s), sizeof(double))};
    double *prob = xmalloc((size_t)S * sizeof(double));  // [seq_len] one query's probabilities
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                int kvh = h / (H / KVH);
                const float *qi = c->q + (((size_t)b * S + i) * H + h) * D;
                const float *doi = c->dout + (((size_t)b * S + i) * H + h) * D;
                double *oi = r.out + (((size_t)b * S + i) * H + h) * D;
                double *dqi = r.dq + (((size_t)b * S + i) * H + h) * D;
                double *dqi_size = r.dq_size + (((size_t)b * S + i) * H + h) * D;
                double max = -INFINITY, sum = 0;
                for (int j = 0; j < S; j++) {
                    bool visible = c->lo[b * S + j] <= i && i < c->hi[b * S + j];
                    prob[j] = -INFINITY;
                    if (!visible) continue;
                    const float *kj = c->k + (((size_t)b * S + j) * KVH + kvh) * D;
                    double dotp = 0;
                    for (int d = 0; d < D; d++) dotp += (double)qi[d] * kj[d];
                    prob[j] = dotp * s->scale;
                    if (prob[j] > max) max = prob[j];
                }
                for (int j = 0; j < S; j++) {
                    prob[j] = prob[j] == -INFINITY ? 0.0 : exp(prob[j] - max);
                    sum += prob[j];
                }
                r.lse[((size_t)b * H + h) * S + i] = sum > 0 ? max + log(sum) : -INFINITY;
                if (sum == 0) continue;
                for (int j = 0; j < S; j++) {
                    if (prob[j] == 0) continue;
                    prob[j] /= sum;
                    const float *vj = c->v + (((size_t)b * S + j) * KVH + kvh) * D;
                    for (int d = 0; d < D; d++) oi[d] += prob[j] * vj[d];
                }
                double delta = 0;  // sum_j P_ij dP_ij = dO_i . O_i
                for (int d = 0; d < D; d++) delta += doi[d] * oi[d];
                for (int j = 0; j < S; j++) {
                    if (prob[j] == 0) continue;
                    size_t kv_at = (((size_t)b * S + j) * KVH + kvh) * D;
                    double dp = 0;
                    for (int d = 0; d < D; d++) dp += (double)doi[d] * c->v[kv_at + d];
                    double ds = prob[j] * (dp - delta) * s->scale;
                    double ds_size = prob[j] * (fabs(dp) + fabs(delta)) * s->scale;
                    for (int d = 0; d < D; d++) {
                        dqi[d] += ds * c->k[kv_at + d];
                        dqi_size[d] += ds_size * fabs(c->k[kv_at + d]);
                        r.dk[kv_at + d] += ds * qi[d];
                        r.dk_size[kv_at + d] += ds_size * fabs(qi[d]);
                        r.dv[kv_at + d] += prob[j] * doi[d];
                    }
                }
            }
    free(prob);
    return r;
}

static void reference_free(Reference *r) {
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->dq_size);
    free(r->dk_size);
}

// Largest |got - want| over the largest summed term size (see Reference).
static double error_against_size(const float *got, const double *want, const double *size, size_t n) {
    double max_diff = 0.0, max_size = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        max_diff = fmax(max_diff, fabs(got[i] - want[i]));
        max_size = fmax(max_size, size[i]);
    }
    return max_diff / max_size;
}

static void run_case(Case *c) {
    AttnMask mask;
    attn_mask_build(c->lo, c->hi, c->shape.batch, c->shape.seq_len, c->block_m, c->block_n, &mask);
    attention_forward_cpu(&c->shape, &mask, c->q, c->k, c->v, c->out, c->lse);
    attention_backward_cpu(&c->shape, &mask, c->q, c->k, c->v, c->out, c->lse,
                           c->dout, c->dq, c->dk, c->dv);
    attn_mask_free(&mask);
}

static void compare_with_reference(const Case *c, const char *label) {
    const AttnShape *s = &c->shape;
    Reference r = reference_attention(c);
    const double tol = 1e-5;
    double e_out = test_relative_error(c->out, r.out, q_elems(s));
    double e_dq = error_against_size(c->dq, r.dq, r.dq_size, q_elems(s));
    double e_dk = error_against_size(c->dk, r.dk, r.dk_size, kv_elems(s));
    double e_dv = test_relative_error(c->dv, r.dv, kv_elems(s));
    EXPECT(e_out <= tol && e_dq <= tol && e_dk <= tol && e_dv <= tol,
          "%s (B%d S%d H%d KVH%d D%d tiles %dx%d): relative error out %.2e dq %.2e dk %.2e dv %.2e",
          label, s->batch, s->seq_len, s->n_heads, s->n_kv_heads, s->head_dim, c->block_m,
          c->block_n, e_out, e_dq, e_dk, e_dv);
    // lse: same -inf pattern, finite values close; fully masked queries give exact zeros.
    int lse_bad = 0, blind_bad = 0;
    for (size_t i = 0; i < (size_t)s->batch * s->n_heads * s->seq_len; i++) {
        if (isinf(r.lse[i])) {
            lse_bad += !(isinf(c->lse[i]) && c->lse[i] < 0);
            size_t b = i / ((size_t)s->n_heads * s->seq_len), h = i / s->seq_len % s->n_heads,
                   q = i % s->seq_len;
            size_t at = ((b * s->seq_len + q) * s->n_heads + h) * s->head_dim;
            for (int d = 0; d < s->head_dim; d++) blind_bad += c->out[at + d] != 0.0f || c->dq[at + d] != 0.0f;
        } else {
            lse_bad += !(fabs(c->lse[i] - r.lse[i]) <= 1e-5 * fmax(1.0, fabs(r.lse[i])));
        }
    }
    EXPECT(lse_bad == 0, "%s: %d lse values wrong", label, lse_bad);
    EXPECT(blind_bad == 0, "%s: %d nonzero out/dq values of queries that see no key", label, blind_bad);
    reference_free(&r);
}

static AttnShape random_shape(TestRng *rng, int max_seq_len) {
    static const int head_pairs[][2] = {{1, 1}, {2, 1}, {4, 2}, {3, 3}, {4, 1}, {6, 2}};
    const int *heads = head_pairs[test_rng_int(rng, 0, 5)];
    int head_dim = test_rng_int(rng, 0, 1) ? 64 : 128;
    AttnShape s = {test_rng_int(rng, 1, 2), test_rng_int(rng, 1, max_seq_len), heads[0], heads[1],
                   head_dim, 1.0f / sqrtf((float)head_dim)};
    return s;
}

static void test_random_interval_masks(TestRng *rng) {
    for (int trial = 0; trial < 40; trial++) {
        AttnShape shape = random_shape(rng, 200);
        int block_m = test_rng_int(rng, 1, 70), block_n = test_rng_int(rng, 1, 70);
        if (trial % 4 == 0) block_m = 64, block_n = 32;
        Case c = case_new(rng, shape, block_m, block_n);
        for (int b = 0; b < shape.batch; b++)
            random_row_intervals(rng, shape.seq_len, c.lo + (size_t)b * shape.seq_len,
                                 c.hi + (size_t)b * shape.seq_len);
        run_case(&c);
        compare_with_reference(&c, "random intervals");
        case_free(&c);
    }
}

// The worked example of DESIGN.md §3 (duplicate layout, two turns, 19 tokens) and a
// shared-prefix set, packed into one row with padding, as intervals in row slots.
static void test_layout_masks(TestRng *rng) {
    static const int dup_hi[19] = {19, 19, 19, 9, 9, 9, 9, 9, 9, 19, 19, 19, 19, 19, 19, 19, 19, 19, 19};
    for (int trial = 0; trial < 6; trial++) {
        AttnShape shape = random_shape(rng, 1);
        shape.seq_len = 61;
        int block_m = test_rng_int(rng, 1, 40), block_n = test_rng_int(rng, 1, 40);
        Case c = case_new(rng, shape, block_m, block_n);
        for (int b = 0; b < shape.batch; b++) {
            int32_t *lo = c.lo + (size_t)b * shape.seq_len, *hi = c.hi + (size_t)b * shape.seq_len;
            int slot = 0;
            for (int i = 0; i < 19; i++, slot++) lo[slot] = slot, hi[slot] = dup_hi[i];
            // Shared prefix P[0:-1] (10 tokens) | P[-1] S_1 (12) | P[-1] S_2 (9) | P[-1] S_3 (7).
            int start = slot, prefix_end = start + 10, end = prefix_end + 12 + 9 + 7;
            for (; slot < prefix_end; slot++) lo[slot] = slot, hi[slot] = end;
            for (int block = 12, block_end; slot < end; block = block == 12 ? 9 : 7)
                for (block_end = slot + block; slot < block_end; slot++) lo[slot] = slot, hi[slot] = block_end;
            for (; slot < shape.seq_len; slot++) lo[slot] = hi[slot] = slot;  // padding
        }
        run_case(&c);
        compare_with_reference(&c, "layout masks");
        case_free(&c);
    }
}

// Finite differences of L = sum(out * dout) in double against the analytic backward.
static void test_finite_differences(TestRng *rng) {
    AttnShape shape = {1, 9, 4, 2, 6, 0.7f};
    Case c = case_new(rng, shape, 4, 3);
    random_row_intervals(rng, shape.seq_len, c.lo, c.hi);
    c.lo[2] = 0, c.hi[2] = 9;  // at least one key visible to many queries
    run_case(&c);
    AttnMask mask;
    attn_mask_build(c.lo, c.hi, 1, shape.seq_len, c.block_m, c.block_n, &mask);
    float *out = xmalloc(q_elems(&shape) * sizeof(float));
    float *lse = xmalloc((size_t)shape.n_heads * shape.seq_len * sizeof(float));
    struct { float *x, *grad; size_t n; const char *name; } inputs[] = {
        {c.q, c.dq, q_elems(&shape), "q"}, {c.k, c.dk, kv_elems(&shape), "k"}, {c.v, c.dv, kv_elems(&shape), "v"}};
    const float eps = 1e-2f;
    for (int t = 0; t < 3; t++) {
        double max_err = 0, max_grad = 1e-30;
        for (size_t i = 0; i < inputs[t].n; i++) {
            float saved = inputs[t].x[i];
            double loss[2];
            for (int side = 0; side < 2; side++) {
                inputs[t].x[i] = saved + (side ? eps : -eps);
                attention_forward_cpu(&shape, &mask, c.q, c.k, c.v, out, lse);
                loss[side] = 0;
                for (size_t j = 0; j < q_elems(&shape); j++) loss[side] += (double)out[j] * c.dout[j];
            }
            inputs[t].x[i] = saved;
            double numeric = (loss[1] - loss[0]) / (2.0 * eps);
            max_err = fmax(max_err, fabs(numeric - inputs[t].grad[i]));
            max_grad = fmax(max_grad, fabs(inputs[t].grad[i]));
        }
        EXPECT(max_err <= 2e-3 * max_grad, "finite differences d%s: max error %.3e, max grad %.3e",
              inputs[t].name, max_err, max_grad);
    }
    free(out);
    free(lse);
    attn_mask_free(&mask);
    case_free(&c);
}

// A key tile that the mask leaves empty is filled with NaN (and so are the queries of a
// query tile that sees nothing): results must be finite and equal the clean reference.
static void test_empty_tiles_are_skipped(TestRng *rng) {
    AttnShape shape = {1, 80, 4, 2, 64, 0.125f};
    const int block = 16, poisoned_k0 = 32, poisoned_q0 = 64;
    Case c = case_new(rng, shape, block, block);
    for (int k = 0; k < shape.seq_len; k++) {
        c.lo[k] = k;
        c.hi[k] = k < poisoned_q0 ? poisoned_q0 : k;  // causal; the last query tile sees nothing
        if (k >= poisoned_k0 && k < poisoned_k0 + block) c.hi[k] = c.lo[k];  // a padding tile
    }
    size_t kv_row = (size_t)shape.n_kv_heads * shape.head_dim, q_row = (size_t)shape.n_heads * shape.head_dim;
    for (size_t i = poisoned_k0 * kv_row; i < (poisoned_k0 + block) * kv_row; i++) c.k[i] = c.v[i] = NAN;
    for (size_t i = poisoned_q0 * q_row; i < shape.seq_len * q_row; i++) c.q[i] = c.dout[i] = NAN;
    run_case(&c);
    compare_with_reference(&c, "poisoned empty tiles");
    int nonzero = 0;
    for (size_t i = poisoned_k0 * kv_row; i < (poisoned_k0 + block) * kv_row; i++)
        nonzero += c.dk[i] != 0.0f || c.dv[i] != 0.0f;
    EXPECT(nonzero == 0, "%d nonzero dk/dv values of keys visible to nobody", nonzero);
    case_free(&c);
}

// Moves every partial tile into the full list of the same slot (lists stay ascending).
static void promote_partial_to_full(int32_t *partial_count, const int32_t *partial_idx,
                                    int32_t *full_count, int32_t *full_idx, int n_slots, int list_len) {
    int32_t *merged = xmalloc((size_t)list_len * sizeof(int32_t));  // [list_len]
    for (int slot = 0; slot < n_slots; slot++) {
        const int32_t *p = partial_idx + (size_t)slot * list_len;
        int32_t *f = full_idx + (size_t)slot * list_len;
        int np = partial_count[slot], nf = full_count[slot], i = 0, j = 0, n = 0;
        while (i < np || j < nf) merged[n++] = (j == nf || (i < np && p[i] < f[j])) ? p[i++] : f[j++];
        memcpy(f, merged, (size_t)n * sizeof(int32_t));
        full_count[slot] = n;
        partial_count[slot] = 0;
    }
    free(merged);
}

// The kernels follow the lists they are given: with every list emptied, nothing is
// visible (no dense fallback); with partial tiles listed as full, no mask test runs in
// them, which equals widening each causal key's interval to its whole diagonal tile.
static void test_follows_tile_lists(TestRng *rng) {
    AttnShape shape = {2, 45, 4, 1, 64, 0.125f};
    const int block = 8;
    Case c = case_new(rng, shape, block, block);
    for (int i = 0; i < shape.batch * shape.seq_len; i++) c.lo[i] = i % shape.seq_len, c.hi[i] = shape.seq_len;
    AttnMask mask;
    attn_mask_build(c.lo, c.hi, shape.batch, shape.seq_len, block, block, &mask);
    int nq_slots = shape.batch * mask.by_query.n_lines, nk_slots = shape.batch * mask.by_key.n_lines;
    promote_partial_to_full(mask.by_query.partial_count, mask.by_query.partial_idx, mask.by_query.full_count,
                            mask.by_query.full_idx, nq_slots, mask.by_key.n_lines);
    promote_partial_to_full(mask.by_key.partial_count, mask.by_key.partial_idx, mask.by_key.full_count,
                            mask.by_key.full_idx, nk_slots, mask.by_query.n_lines);
    attention_forward_cpu(&shape, &mask, c.q, c.k, c.v, c.out, c.lse);
    attention_backward_cpu(&shape, &mask, c.q, c.k, c.v, c.out, c.lse, c.dout, c.dq,
                           c.dk, c.dv);
    for (int i = 0; i < shape.batch * shape.seq_len; i++) c.lo[i] = c.lo[i] / block * block;
    compare_with_reference(&c, "partial tiles listed as full");

    memset(mask.by_query.partial_count, 0, (size_t)nq_slots * sizeof(int32_t));
    memset(mask.by_query.full_count, 0, (size_t)nq_slots * sizeof(int32_t));
    memset(mask.by_key.partial_count, 0, (size_t)nk_slots * sizeof(int32_t));
    memset(mask.by_key.full_count, 0, (size_t)nk_slots * sizeof(int32_t));
    attention_forward_cpu(&shape, &mask, c.q, c.k, c.v, c.out, c.lse);
    attention_backward_cpu(&shape, &mask, c.q, c.k, c.v, c.out, c.lse, c.dout, c.dq,
                           c.dk, c.dv);
    int nonzero = 0, finite_lse = 0;
    for (size_t i = 0; i < q_elems(&shape); i++) nonzero += c.out[i] != 0.0f || c.dq[i] != 0.0f;
    for (size_t i = 0; i < kv_elems(&shape); i++) nonzero += c.dk[i] != 0.0f || c.dv[i] != 0.0f;
    for (int i = 0; i < shape.batch * shape.n_heads * shape.seq_len; i++) finite_lse += isfinite(c.lse[i]);
    EXPECT(nonzero == 0 && finite_lse == 0, "empty lists: %d nonzero values, %d finite lse", nonzero,
          finite_lse);
    attn_mask_free(&mask);
    case_free(&c);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_random_interval_masks(&rng);
    test_layout_masks(&rng);
    test_finite_differences(&rng);
    test_empty_tiles_are_skipped(&rng);
    test_follows_tile_lists(&rng);
    return test_finish();
}
