// fp32 reference block-sparse attention over interval masks (DESIGN.md §4, §6).
// Visits only the tiles listed in the AttnMask: empty tiles are never read, full tiles
// run without mask tests, partial tiles test lo[k] <= q < hi[k] per element.
#include "attention/attention.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>
#include "common/check.h"

// A line's two lists as an array: partial first, then full.
typedef struct {
    const int32_t *idx[2];
    int count[2];
} LineLists;

static const bool LIST_IS_PARTIAL[2] = {true, false};

static LineLists line_lists(const TileLists *lists, int row, int line) {
    TileLine t = tile_line(lists, row, line);
    return (LineLists){{t.partial, t.full}, {t.n_partial, t.n_full}};
}

static void check_shapes(const AttnShape *s, const AttnMask *m) {
    CHECK(s->batch > 0 && s->seq_len > 0 && s->n_heads > 0 && s->n_kv_heads > 0 && s->head_dim > 0,
          "attention: batch %d, seq_len %d, n_heads %d, n_kv_heads %d, head_dim %d must be "
          "positive", s->batch, s->seq_len, s->n_heads, s->n_kv_heads, s->head_dim);
    CHECK(s->n_heads % s->n_kv_heads == 0,
          "attention: n_heads %d is not a multiple of n_kv_heads %d", s->n_heads, s->n_kv_heads);
    CHECK(m->n_rows == s->batch && m->seq_len == s->seq_len,
          "attention: mask built for %d rows x %d, inputs are %d x %d", m->n_rows, m->seq_len,
          s->batch, s->seq_len);
}

// One (query tile, key tile) pair of one row and head, with clipped ragged edges.
typedef struct {
    int q0, q1, k0, k1;  // query slots [q0, q1), key slots [k0, k1)
    bool partial;        // needs per-element mask tests
} TilePair;

static TilePair tile_pair(const AttnMask *m, int q_tile, int k_tile, bool partial) {
    TilePair t = {q_tile * m->block_m, (q_tile + 1) * m->block_m, k_tile * m->block_n,
                  (k_tile + 1) * m->block_n, partial};
    if (t.q1 > m->seq_len) t.q1 = m->seq_len;
    if (t.k1 > m->seq_len) t.k1 = m->seq_len;
    return t;
}

// Eight independent partial sums so the compiler can vectorise without -ffast-math.
static float dot(const float *a, const float *b, int n) {
    float lanes[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lanes[l] += a[i + l] * b[i + l];
    float sum = 0.0f;
    for (; i < n; i++) sum += a[i] * b[i];
    for (int l = 0; l < 8; l++) sum += lanes[l];
    return sum;
}

// scores[i * block_n + j] = scale * q_{q0+i} . k_{k0+j}, or -INFINITY where masked.
// q_head: row b, head h at slot 0 (stride q_stride); k_head likewise for the kv head.
static void tile_scores(const AttnShape *s, const TilePair *t, int block_n, const int32_t *lo,
                        const int32_t *hi, const float *q_head, size_t q_stride,
                        const float *k_head, size_t k_stride, float *scores) {
    for (int q = t->q0; q < t->q1; q++) {
        float *row = scores + (size_t)(q - t->q0) * block_n;
        for (int k = t->k0; k < t->k1; k++) {
            if (t->partial && !(lo[k] <= q && q < hi[k])) {
                row[k - t->k0] = -INFINITY;
                continue;
            }
            row[k - t->k0] = s->scale * dot(q_head + q * q_stride, k_head + k * k_stride, s->head_dim);
        }
    }
}

void attention_forward_cpu(const AttnShape *shape, const AttnMask *mask, const float *q,
                           const float *k, const float *v,
                           float *out, float *lse) {
    check_shapes(shape, mask);
    const int S = shape->seq_len, H = shape->n_heads, D = shape->head_dim;
    const int group = H / shape->n_kv_heads, bm = mask->block_m, bn = mask->block_n;
    const size_t q_stride = (size_t)H * D, k_stride = (size_t)shape->n_kv_heads * D;
#pragma omp parallel
    {
        float *scores = xmalloc((size_t)bm * bn * sizeof(float));  // [block_m, block_n]
        float *acc = xmalloc((size_t)bm * D * sizeof(float));      // [block_m, head_dim] unnormalised
        float *run_max = xmalloc((size_t)bm * sizeof(float));      // [block_m]
        float *run_sum = xmalloc((size_t)bm * sizeof(float));      // [block_m]
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < shape->batch; b++)
            for (int h = 0; h < H; h++)
                for (int qt = 0; qt < mask->by_query.n_lines; qt++) {
                    const float *q_head = q + (size_t)b * S * q_stride + (size_t)h * D;
                    const float *k_head = k + (size_t)b * S * k_stride + (size_t)(h / group) * D;
                    const float *v_head = v + (size_t)b * S * k_stride + (size_t)(h / group) * D;
                    const int32_t *row_lo = mask->lo + (size_t)b * S;
                    const int32_t *row_hi = mask->hi + (size_t)b * S;
                    for (int i = 0; i < bm; i++) run_max[i] = -INFINITY, run_sum[i] = 0.0f;
                    memset(acc, 0, (size_t)bm * D * sizeof(float));
                    LineLists lists = line_lists(&mask->by_query, b, qt);
                    for (int l = 0; l < 2; l++)
                        for (int e = 0; e < lists.count[l]; e++) {
                            TilePair t = tile_pair(mask, qt, lists.idx[l][e], LIST_IS_PARTIAL[l]);
                            tile_scores(shape, &t, bn, row_lo, row_hi, q_head, q_stride, k_head,
                                        k_stride, scores);
                            for (int i = 0; i < t.q1 - t.q0; i++) {  // online softmax update
                                const float *row = scores + (size_t)i * bn;
                                float tile_max = -INFINITY;
                                for (int j = 0; j < t.k1 - t.k0; j++) tile_max = fmaxf(tile_max, row[j]);
                                if (tile_max == -INFINITY) continue;  // row sees nothing here
                                float new_max = fmaxf(run_max[i], tile_max);
                                float rescale = expf(run_max[i] - new_max);  // 0 on the first visit
                                float *acc_row = acc + (size_t)i * D;
                                run_sum[i] *= rescale;
                                for (int d = 0; d < D; d++) acc_row[d] *= rescale;
                                for (int j = 0; j < t.k1 - t.k0; j++) {
                                    float p = expf(row[j] - new_max);
                                    if (p == 0.0f) continue;
                                    run_sum[i] += p;
                                    const float *v_row = v_head + (size_t)(t.k0 + j) * k_stride;
                                    for (int d = 0; d < D; d++) acc_row[d] += p * v_row[d];
                                }
                                run_max[i] = new_max;
                            }
                        }
                    for (int qi = qt * bm; qi < (qt + 1) * bm && qi < S; qi++) {
                        int i = qi - qt * bm;
                        float *out_row = out + ((size_t)b * S + qi) * q_stride + (size_t)h * D;
                        float *lse_out = lse + ((size_t)b * H + h) * S + qi;
                        if (run_sum[i] == 0.0f) {  // no visible key: zero output, no NaN
                            memset(out_row, 0, (size_t)D * sizeof(float));
                            *lse_out = -INFINITY;
                            continue;
                        }
                        float inv_sum = 1.0f / run_sum[i];
                        for (int d = 0; d < D; d++) out_row[d] = acc[(size_t)i * D + d] * inv_sum;
                        *lse_out = run_max[i] + logf(run_sum[i]);
                    }
                }
        free(scores);
        free(acc);
        free(run_max);
        free(run_sum);
    }
}

// Inputs of the backward shared by the dK/dV pass and the dQ pass.
typedef struct {
    const AttnShape *shape;
    const AttnMask *mask;
    const float *q, *k, *v, *lse, *dout;
    const float *delta;  // [batch, n_heads, seq_len] D_i = rowsum(dO * O)
    size_t q_stride, k_stride;
} BackwardInputs;

// For one tile of (row b, head h): probs = exp(scores - lse), masked entries 0, and
// dscores = probs * (dO_q . v_k - D_q), both [block_m, block_n].
static void tile_probs_and_dscores(const BackwardInputs *in, int b, int h, const TilePair *t,
                                   float *probs, float *dscores) {
    const AttnShape *s = in->shape;
    const int S = s->seq_len, D = s->head_dim, bn = in->mask->block_n;
    const int kv_head = h / (s->n_heads / s->n_kv_heads);
    const float *q_head = in->q + (size_t)b * S * in->q_stride + (size_t)h * D;
    const float *do_head = in->dout + (size_t)b * S * in->q_stride + (size_t)h * D;
    const float *k_head = in->k + (size_t)b * S * in->k_stride + (size_t)kv_head * D;
    const float *v_head = in->v + (size_t)b * S * in->k_stride + (size_t)kv_head * D;
    const float *lse = in->lse + ((size_t)b * s->n_heads + h) * S;
    const float *delta = in->delta + ((size_t)b * s->n_heads + h) * S;
    tile_scores(s, t, bn, in->mask->lo + (size_t)b * S, in->mask->hi + (size_t)b * S, q_head,
                in->q_stride, k_head, in->k_stride, probs);
    for (int q = t->q0; q < t->q1; q++) {
        float *p_row = probs + (size_t)(q - t->q0) * bn, *ds_row = dscores + (size_t)(q - t->q0) * bn;
        for (int k = t->k0; k < t->k1; k++) {
            int j = k - t->k0;
            // lse is -inf only for a query that sees no key; its pairs are all masked.
            float p = lse[q] == -INFINITY ? 0.0f : expf(p_row[j] - lse[q]);
            p_row[j] = p;
            ds_row[j] = p == 0.0f ? 0.0f
                                  : p * (dot(do_head + q * in->q_stride, v_head + k * in->k_stride, D) - delta[q]);
        }
    }
}

// dK, dV of one key tile of (row b, kv head): sums over the query heads of the group
// and over the query tiles of the backward lists.
static void key_tile_grads(const BackwardInputs *in, int b, int kv_head, int kt, float *probs,
                           float *dscores, float *dk, float *dv) {
    const AttnShape *s = in->shape;
    const int S = s->seq_len, D = s->head_dim, group = s->n_heads / s->n_kv_heads;
    const int bn = in->mask->block_n;
    int k0 = kt * bn, k1 = k0 + bn < S ? k0 + bn : S;
    float *dk_acc = xcalloc((size_t)(k1 - k0) * D, sizeof(float));  // [keys of the tile, head_dim]
    float *dv_acc = xcalloc((size_t)(k1 - k0) * D, sizeof(float));  // [keys of the tile, head_dim]
    LineLists lists = line_lists(&in->mask->by_key, b, kt);
    for (int h = kv_head * group; h < (kv_head + 1) * group; h++) {
        const float *q_head = in->q + (size_t)b * S * in->q_stride + (size_t)h * D;
        const float *do_head = in->dout + (size_t)b * S * in->q_stride + (size_t)h * D;
        for (int l = 0; l < 2; l++)
            for (int e = 0; e < lists.count[l]; e++) {
                TilePair t = tile_pair(in->mask, lists.idx[l][e], kt, LIST_IS_PARTIAL[l]);
                tile_probs_and_dscores(in, b, h, &t, probs, dscores);
                for (int q = t.q0; q < t.q1; q++) {
                    const float *q_row = q_head + q * in->q_stride, *do_row = do_head + q * in->q_stride;
                    for (int j = 0; j < k1 - k0; j++) {
                        float p = probs[(size_t)(q - t.q0) * bn + j];
                        float ds = dscores[(size_t)(q - t.q0) * bn + j] * s->scale;
                        if (p == 0.0f) continue;
                        for (int d = 0; d < D; d++) {
                            dv_acc[(size_t)j * D + d] += p * do_row[d];
                            dk_acc[(size_t)j * D + d] += ds * q_row[d];
                        }
                    }
                }
            }
    }
    for (int key = k0; key < k1; key++) {
        size_t at = ((size_t)b * S + key) * in->k_stride + (size_t)kv_head * D;
        memcpy(dk + at, dk_acc + (size_t)(key - k0) * D, (size_t)D * sizeof(float));
        memcpy(dv + at, dv_acc + (size_t)(key - k0) * D, (size_t)D * sizeof(float));
    }
    free(dk_acc);
    free(dv_acc);
}

// dQ of one query tile of (row b, head h), over the key tiles of the forward lists.
static void query_tile_grads(const BackwardInputs *in, int b, int h, int qt, float *probs,
                             float *dscores, float *dq) {
    const AttnShape *s = in->shape;
    const int S = s->seq_len, D = s->head_dim, kv_head = h / (s->n_heads / s->n_kv_heads);
    const int bm = in->mask->block_m, bn = in->mask->block_n;
    const float *k_head = in->k + (size_t)b * S * in->k_stride + (size_t)kv_head * D;
    int q0 = qt * bm, q1 = q0 + bm < S ? q0 + bm : S;
    for (int q = q0; q < q1; q++)
        memset(dq + ((size_t)b * S + q) * in->q_stride + (size_t)h * D, 0, (size_t)D * sizeof(float));
    LineLists lists = line_lists(&in->mask->by_query, b, qt);
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < lists.count[l]; e++) {
            TilePair t = tile_pair(in->mask, qt, lists.idx[l][e], LIST_IS_PARTIAL[l]);
            tile_probs_and_dscores(in, b, h, &t, probs, dscores);
            for (int q = q0; q < q1; q++) {
                float *dq_row = dq + ((size_t)b * S + q) * in->q_stride + (size_t)h * D;
                for (int key = t.k0; key < t.k1; key++) {
                    float ds = dscores[(size_t)(q - q0) * bn + (key - t.k0)] * s->scale;
                    if (ds == 0.0f) continue;
                    const float *k_row = k_head + key * in->k_stride;
                    for (int d = 0; d < D; d++) dq_row[d] += ds * k_row[d];
                }
            }
        }
}

void attention_backward_cpu(const AttnShape *shape, const AttnMask *mask, const float *q,
                            const float *k, const float *v,
                            const float *out, const float *lse, const float *dout, float *dq,
                            float *dk, float *dv) {
    check_shapes(shape, mask);
    const int S = shape->seq_len, H = shape->n_heads, D = shape->head_dim;
    const size_t q_stride = (size_t)H * D;
    float *delta = xmalloc((size_t)shape->batch * H * S * sizeof(float));  // [batch, n_heads, seq_len]
#pragma omp parallel for collapse(2)
    for (int b = 0; b < shape->batch; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                size_t at = ((size_t)b * S + i) * q_stride + (size_t)h * D;
                delta[((size_t)b * H + h) * S + i] = dot(dout + at, out + at, D);
            }
    BackwardInputs in = {shape, mask, q, k, v, lse, dout, delta, q_stride,
                         (size_t)shape->n_kv_heads * D};
    const size_t tile_elems = (size_t)mask->block_m * mask->block_n;
#pragma omp parallel
    {
        float *probs = xmalloc(tile_elems * sizeof(float));    // [block_m, block_n]
        float *dscores = xmalloc(tile_elems * sizeof(float));  // [block_m, block_n]
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < shape->batch; b++)
            for (int kv_head = 0; kv_head < shape->n_kv_heads; kv_head++)
                for (int kt = 0; kt < mask->by_key.n_lines; kt++)
                    key_tile_grads(&in, b, kv_head, kt, probs, dscores, dk, dv);
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < shape->batch; b++)
            for (int h = 0; h < H; h++)
                for (int qt = 0; qt < mask->by_query.n_lines; qt++)
                    query_tile_grads(&in, b, h, qt, probs, dscores, dq);
        free(probs);
        free(dscores);
    }
    free(delta);
}
