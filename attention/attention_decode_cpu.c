// fp32 reference of decode attention (attention_decode.h): per (token, head) the plain
// two-pass softmax over the visible cache positions.
#include "attention/attention_decode.h"

#include <math.h>
#include <string.h>
#include "common/check.h"

void decode_shape_check(const DecodeShape *s) {
    CHECK(s->n_tokens >= 0 && s->n_heads > 0 && s->n_kv_heads > 0 && s->head_dim > 0 &&
              s->n_seqs > 0 && s->max_len > 0,
          "decode attention: n_tokens %d, n_heads %d, n_kv_heads %d, head_dim %d, n_seqs %d, "
          "max_len %d: sizes must be positive",
          s->n_tokens, s->n_heads, s->n_kv_heads, s->head_dim, s->n_seqs, s->max_len);
    CHECK(s->n_heads % s->n_kv_heads == 0,
          "decode attention: n_heads %d is not a multiple of n_kv_heads %d", s->n_heads,
          s->n_kv_heads);
    CHECK(s->max_keys >= 0 && s->max_keys <= s->max_len,
          "decode attention: max_keys %d outside [0, max_len %d]", s->max_keys, s->max_len);
}

void attention_decode_cpu(const DecodeShape *shape, const float *q, const float *k_cache,
                          const float *v_cache, const int32_t *slot, const int32_t *n_keys,
                          float *out) {
    decode_shape_check(shape);
    const int H = shape->n_heads, KV = shape->n_kv_heads, D = shape->head_dim;
    const int group = H / KV;
    const size_t row = (size_t)KV * D;  // one cache position
    for (int i = 0; i < shape->n_tokens; i++)
        CHECK(slot[i] >= 0 && slot[i] < shape->n_seqs && n_keys[i] >= 0 &&
                  n_keys[i] <= shape->max_keys,
              "decode attention: token %d: slot %d outside [0, %d) or n_keys %d outside [0, %d]",
              i, slot[i], shape->n_seqs, n_keys[i], shape->max_keys);
#pragma omp parallel
    {
        float *scores = xmalloc((size_t)(shape->max_keys ? shape->max_keys : 1) * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic)
        for (int i = 0; i < shape->n_tokens; i++)
            for (int h = 0; h < H; h++) {
                const float *qh = q + ((size_t)i * H + h) * D;
                const size_t base = (size_t)slot[i] * shape->max_len * row + (size_t)(h / group) * D;
                float *o = out + ((size_t)i * H + h) * D;
                memset(o, 0, (size_t)D * sizeof(float));
                const int n = n_keys[i];
                if (n == 0) continue;
                float max_score = -INFINITY;
                for (int k = 0; k < n; k++) {
                    const float *kr = k_cache + base + (size_t)k * row;
                    float dot = 0.0f;
                    for (int d = 0; d < D; d++) dot += qh[d] * kr[d];
                    scores[k] = shape->scale * dot;
                    max_score = fmaxf(max_score, scores[k]);
                }
                float sum = 0.0f;
                for (int k = 0; k < n; k++) {
                    const float p = expf(scores[k] - max_score);
                    const float *vr = v_cache + base + (size_t)k * row;
                    sum += p;
                    for (int d = 0; d < D; d++) o[d] += p * vr[d];
                }
                for (int d = 0; d < D; d++) o[d] /= sum;
            }
        free(scores);
    }
}
