// AdamW and gradient clipping on the CPU (trainer/adamw.h).
#include "trainer/adamw.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/check.h"

void adamw_init(AdamWState *s, size_t n) {
    s->n = n;
    s->m = xcalloc(n, sizeof(float));
    s->v = xcalloc(n, sizeof(float));
    s->step = 0;
}

void adamw_free(AdamWState *s) {
    adamw_free_from(s, free);
}

void adamw_init_from(AdamWState *s, size_t n, void *(*alloc)(size_t bytes)) {
    *s = (AdamWState){.n = n, .m = alloc(n * sizeof(float)), .v = alloc(n * sizeof(float))};
    memset(s->m, 0, n * sizeof(float));
    memset(s->v, 0, n * sizeof(float));
}

void adamw_free_from(AdamWState *s, void (*free_fn)(void *ptr)) {
    free_fn(s->m);
    free_fn(s->v);
    memset(s, 0, sizeof *s);
}

// The step's scalars, bias corrections folded into the step size and the denominator
// (in double), as adamw_update_cuda computes them.
typedef struct {
    float step_size, inv_sqrt_bias2, b1, b2, eps;
} AdamWScalars;

static AdamWScalars adamw_scalars(const AdamWHyper *h, long step) {
    const double bias1 = 1.0 - pow(h->beta1, (double)step);
    const double bias2 = 1.0 - pow(h->beta2, (double)step);
    return (AdamWScalars){(float)(h->lr / bias1), (float)(1.0 / sqrt(bias2)), h->beta1, h->beta2,
                          h->eps};
}

// One element: the one host arithmetic of adamw_step_cpu and adamw_master_range_cpu, in
// adamw_element's order (trainer/adamw_cuda.cu). This file is compiled with
// -ffp-contract=off (CMakeLists.txt), so no multiply and add fuse into an FMA.
static inline void adamw_element(float *p, float *m, float *v, float g, const AdamWScalars *k,
                                 float decay) {
    *m = k->b1 * *m + (1.0f - k->b1) * g;
    *v = k->b2 * *v + (1.0f - k->b2) * g * g;
    const float denom = sqrtf(*v) * k->inv_sqrt_bias2 + k->eps;
    *p = *p * decay - k->step_size * *m / denom;
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
    const AdamWScalars k = adamw_scalars(h, s->step);
    for (int ti = 0; ti < table->n_tensors; ti++) {
        const ParamTensor *t = &table->tensors[ti];
        const float decay = adamw_decays(t, h) ? 1.0f - h->lr * h->weight_decay : 1.0f;
        float *p = params + t->offset;
        const float *g = grads + t->offset;
        float *m = s->m + t->offset;
        float *v = s->v + t->offset;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t->numel; i++) adamw_element(&p[i], &m[i], &v[i], g[i], &k, decay);
    }
}

float adamw_clip_scale(float grad_norm, float max_grad_norm) {
    if (!(max_grad_norm > 0.0f) || !(grad_norm > max_grad_norm)) return 1.0f;
    return (float)((double)max_grad_norm / (grad_norm + 1e-6));
}

// adamw_master_range_cpu's elements [a, b) of one tensor, one thread's share (hi indexed
// from the range's start): a branch-free body (split_float_hi as a select) so the loop
// vectorizes, built for AVX2 where the host has it (chosen at load time) and SSE2
// otherwise; both give the same bits (IEEE sqrt and division, no FMA). Returns whether a
// non-finite weight came out.
__attribute__((target_clones("avx2", "default")))
static bool adamw_master_elements(float *restrict m, float *restrict v, float *restrict p,
                                  uint16_t *restrict hi, const float *restrict g, size_t a,
                                  size_t b, const AdamWScalars *k, float decay, float clip_scale) {
    const AdamWScalars kk = *k;
    uint32_t nonfinite = 0;
    for (size_t i = a; i < b; i++) {
        adamw_element(&p[i], &m[i], &v[i], g[i] * clip_scale, &kk, decay);
        uint32_t bits;
        memcpy(&bits, &p[i], sizeof bits);
        const uint32_t magnitude = bits & 0x7FFFFFFFu;
        hi[i] = magnitude > 0x7F800000u ? (uint16_t)((bits >> 16) | 0x0040u)
                                        : (uint16_t)((bits + 0x8000u) >> 16);
        nonfinite |= magnitude >= 0x7F800000u;
    }
    return nonfinite != 0;
}

bool adamw_master_range_cpu(const AdamWState *s, const ParamTable *table, const AdamWHyper *h,
                            size_t from, size_t to, float *params, uint16_t *hi,
                            const float *grads, float clip_scale) {
    CHECK(s->n == table->total && to <= s->n && s->step >= 1,
          "optimizer state of %zu elements at step %ld, model %zu, range to %zu", s->n, s->step,
          table->total, to);
    const AdamWScalars k = adamw_scalars(h, s->step);
    bool nonfinite = false;
    for (int ti = 0; ti < table->n_tensors; ti++) {
        const ParamTensor *t = &table->tensors[ti];
        const size_t a = t->offset > from ? t->offset : from;
        const size_t b = t->offset + t->numel < to ? t->offset + t->numel : to;
        if (a >= b) continue;
        // As adamw_update_cuda: weight decay 0 for the tensors it skips.
        const float decay = 1.0f - h->lr * (adamw_decays(t, h) ? h->weight_decay : 0.0f);
#pragma omp parallel reduction(|| : nonfinite)
        {
            const size_t threads = (size_t)omp_get_num_threads(), me = (size_t)omp_get_thread_num();
            const size_t share = (b - a + threads - 1) / threads;
            const size_t start = a + me * share < b ? a + me * share : b;
            const size_t end = start + share < b ? start + share : b;
            nonfinite = adamw_master_elements(s->m, s->v, params, hi - from, grads - from, start,
                                              end, &k, decay, clip_scale);
        }
    }
    return !nonfinite;
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
