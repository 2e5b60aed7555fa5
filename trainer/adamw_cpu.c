// AdamW and gradient clipping on the CPU (trainer/adamw.h).
#include "trainer/adamw.h"

#include <math.h>
#include <string.h>

#include "common/check.h"

void adamw_init(AdamWState *s, size_t n) {
    s->n = n;
    s->m = xcalloc(n, sizeof(float));
    s->v = xcalloc(n, sizeof(float));
    s->step = 0;
}

void adamw_free(AdamWState *s) {
    free(s->m);
    free(s->v);
    memset(s, 0, sizeof *s);
}

bool adamw_decays(const ParamTensor *t, const AdamWHyper *h) {
    if (t->is_norm || t->is_bias) return h->decay_norms;  // the 1-D tensors
    if (t->is_embedding) return h->decay_embeddings;
    return true;
}

void adamw_step_cpu(AdamWState *s, const ParamTable *table, const AdamWHyper *h, float *params,
                    const float *grads) {
    CHECK(s->n == table->total, "optimizer state has %zu elements, model %zu", s->n, table->total);
    s->step++;
    // Bias corrections folded into the step size and the denominator, in double.
    const double bias1 = 1.0 - pow(h->beta1, (double)s->step);
    const double bias2 = 1.0 - pow(h->beta2, (double)s->step);
    const float step_size = (float)(h->lr / bias1);
    const float inv_sqrt_bias2 = (float)(1.0 / sqrt(bias2));
    const float b1 = h->beta1, b2 = h->beta2, eps = h->eps;
    for (int ti = 0; ti < table->n_tensors; ti++) {
        const ParamTensor *t = &table->tensors[ti];
        const float decay = adamw_decays(t, h) ? 1.0f - h->lr * h->weight_decay : 1.0f;
        float *p = params + t->offset;
        const float *g = grads + t->offset;
        float *m = s->m + t->offset;
        float *v = s->v + t->offset;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t->numel; i++) {
            m[i] = b1 * m[i] + (1.0f - b1) * g[i];
            v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
            float denom = sqrtf(v[i]) * inv_sqrt_bias2 + eps;
            p[i] = p[i] * decay - step_size * m[i] / denom;
        }
    }
}

double grad_global_norm_cpu(const float *grads, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)grads[i] * grads[i];
    return sqrt(sum);
}

float grad_clip_cpu(float *grads, size_t n, double norm, double max_norm) {
    if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0f;
    const float scale = (float)(max_norm / (norm + 1e-6));
    for (size_t i = 0; i < n; i++) grads[i] *= scale;
    return scale;
}
