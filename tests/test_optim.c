// AdamW, clipping and the schedule against straightforward double-precision
// re-derivations written here from the PyTorch definitions.
#include <math.h>
#include <string.h>

#include "common/check.h"
#include "test_util.h"
#include "trainer/adamw.h"
#include "trainer/lr_schedule.h"

// A hand-made table: a matrix, a norm weight and an embedding (no model code needed).
static ParamTable make_table(void) {
    static ParamTensor tensors[3] = {
        {.name = "model.embed_tokens.weight", .ndim = 2, .shape = {7, 5}, .is_embedding = true},
        {.name = "model.layers.0.input_layernorm.weight", .ndim = 1, .shape = {5}, .is_norm = true},
        {.name = "model.layers.0.self_attn.q_proj.weight", .ndim = 2, .shape = {5, 5}},
    };
    size_t offset = 0;
    for (int i = 0; i < 3; i++) {
        tensors[i].numel = (size_t)tensors[i].shape[0] * (tensors[i].ndim == 2 ? (size_t)tensors[i].shape[1] : 1);
        tensors[i].offset = offset;
        offset += tensors[i].numel;
    }
    return (ParamTable){.tensors = tensors, .n_tensors = 3, .total = offset};
}

// Reference AdamW (torch.optim.AdamW, amsgrad off) on one element, in double.
typedef struct { double p, m, v; } RefElem;
static void ref_adamw(RefElem *e, double g, int t, double lr, double b1, double b2, double eps,
                      double wd, bool decayed) {
    if (decayed) e->p -= lr * wd * e->p;
    e->m = b1 * e->m + (1 - b1) * g;
    e->v = b2 * e->v + (1 - b2) * g * g;
    double m_hat = e->m / (1 - pow(b1, t));
    double v_hat = e->v / (1 - pow(b2, t));
    e->p -= lr * m_hat / (sqrt(v_hat) + eps);
}

static void test_adamw_matches_reference(TestRng *rng) {
    ParamTable table = make_table();
    for (int flags = 0; flags < 4; flags++) {
        AdamWHyper h = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                        .decay_norms = flags & 1, .decay_embeddings = flags & 2};
        AdamWState s;
        adamw_init(&s, table.total);
        float *p = xmalloc(table.total * sizeof(float));
        float *g = xmalloc(table.total * sizeof(float));
        RefElem *ref = xcalloc(table.total, sizeof(RefElem));
        for (size_t i = 0; i < table.total; i++) ref[i].p = p[i] = test_rng_uniform(rng);
        double max_rel = 0;
        for (int t = 1; t <= 6; t++) {
            h.lr = 1e-3f * (float)t;  // a changing learning rate, as under the schedule
            for (size_t i = 0; i < table.total; i++) g[i] = test_rng_uniform(rng) * 0.1f;
            adamw_step_cpu(&s, &table, &h, p, g);
            for (int ti = 0; ti < table.n_tensors; ti++) {
                const ParamTensor *pt = &table.tensors[ti];
                bool decayed = pt->is_norm ? h.decay_norms : pt->is_embedding ? h.decay_embeddings : true;
                for (size_t i = pt->offset; i < pt->offset + pt->numel; i++) {
                    ref_adamw(&ref[i], g[i], t, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, decayed);
                    double rel = fabs(p[i] - ref[i].p) / fmax(fabs(ref[i].p), 1e-3);
                    if (rel > max_rel) max_rel = rel;
                }
            }
        }
        EXPECT(max_rel < 1e-5, "flags %d: max relative error %g vs reference AdamW", flags, max_rel);
        EXPECT(s.step == 6, "step count %ld", s.step);
        adamw_free(&s);
        free(p);
        free(g);
        free(ref);
    }
}

// With zero gradients, the only change is decay: excluded tensors stay bit-identical.
static void test_decay_exclusion(TestRng *rng) {
    ParamTable table = make_table();
    for (int flags = 0; flags < 4; flags++) {
        AdamWHyper h = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                        .weight_decay = 0.5f, .decay_norms = flags & 1, .decay_embeddings = flags & 2};
        AdamWState s;
        adamw_init(&s, table.total);
        float *p = xmalloc(table.total * sizeof(float));
        float *before = xmalloc(table.total * sizeof(float));
        float *g = xcalloc(table.total, sizeof(float));
        for (size_t i = 0; i < table.total; i++) before[i] = p[i] = test_rng_uniform(rng) + 2.0f;
        adamw_step_cpu(&s, &table, &h, p, g);
        for (int ti = 0; ti < table.n_tensors; ti++) {
            const ParamTensor *pt = &table.tensors[ti];
            bool want_decay = pt->is_norm ? (flags & 1) : pt->is_embedding ? (flags & 2) : true;
            int wrong = 0;
            for (size_t i = pt->offset; i < pt->offset + pt->numel; i++) {
                float expect = want_decay ? before[i] * (1.0f - 0.01f * 0.5f) : before[i];
                if (fabsf(p[i] - expect) > 1e-6f * fabsf(expect)) wrong++;
            }
            EXPECT(wrong == 0, "flags %d tensor %s: %d elements not %s", flags, pt->name, wrong,
                  want_decay ? "decayed" : "left unchanged");
        }
        adamw_free(&s);
        free(p);
        free(before);
        free(g);
    }
}

static void test_clipping(TestRng *rng) {
    enum { N = 1000 };
    float g[N], orig[N];
    for (int trial = 0; trial < 5; trial++) {
        double sum = 0;
        for (int i = 0; i < N; i++) {
            orig[i] = g[i] = test_rng_uniform(rng) * (float)(trial + 1);
            sum += (double)g[i] * g[i];
        }
        double norm = grad_global_norm_cpu(g, N);
        EXPECT(fabs(norm - sqrt(sum)) < 1e-9 * sqrt(sum), "norm %g vs %g", norm, sqrt(sum));
        double max_norm = norm * 0.25;
        float scale = grad_clip_cpu(g, N, norm, max_norm);
        EXPECT(fabs(grad_global_norm_cpu(g, N) - max_norm) < 1e-4 * max_norm,
               "clipped norm %g, want %g", grad_global_norm_cpu(g, N), max_norm);
        EXPECT(fabsf(g[17] - orig[17] * scale) == 0.0f, "every element scaled by the same factor");
        // Below the threshold, and with clipping disabled: untouched.
        memcpy(g, orig, sizeof g);
        EXPECT(grad_clip_cpu(g, N, norm, norm * 2) == 1.0f && memcmp(g, orig, sizeof g) == 0,
              "no clipping below the threshold");
        EXPECT(grad_clip_cpu(g, N, norm, 0.0) == 1.0f && memcmp(g, orig, sizeof g) == 0,
              "grad_clip 0 disables clipping");
    }
}

static void test_schedule(void) {
    const double lr = 3e-3, ratio = 0.1;
    const long total = 100, warmup = 10;
    EXPECT(fabs(lr_schedule(0, total, warmup, lr, ratio) - lr / warmup) < 1e-15, "first warm-up step");
    EXPECT(fabs(lr_schedule(4, total, warmup, lr, ratio) - lr * 5 / warmup) < 1e-15, "mid warm-up");
    EXPECT(fabs(lr_schedule(warmup - 1, total, warmup, lr, ratio) - lr) < 1e-15, "warm-up ends at lr");
    EXPECT(fabs(lr_schedule(warmup, total, warmup, lr, ratio) - lr) < 1e-15, "cosine starts at lr");
    EXPECT(fabs(lr_schedule(total - 1, total, warmup, lr, ratio) - lr * ratio) < 1e-15,
          "last step at lr*min_lr_ratio: %g", lr_schedule(total - 1, total, warmup, lr, ratio));
    // The cosine spans steps warmup..total-1.
    const double pi = 3.14159265358979323846;
    long decay_steps = total - 1 - warmup;
    double at = lr_schedule(warmup + decay_steps / 3, total, warmup, lr, ratio);
    double expect = lr * ratio + 0.5 * (lr - lr * ratio) * (1 + cos(pi * (decay_steps / 3) / (double)decay_steps));
    EXPECT(fabs(at - expect) < 1e-12, "cosine value %g vs %g", at, expect);
    bool monotone = true;
    for (long s = warmup + 1; s < total; s++)
        if (lr_schedule(s, total, warmup, lr, ratio) > lr_schedule(s - 1, total, warmup, lr, ratio)) monotone = false;
    EXPECT(monotone, "non-increasing after warm-up");
    EXPECT(fabs(lr_schedule(0, total, 0, lr, ratio) - lr) < 1e-15, "no warm-up: starts at lr");
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_adamw_matches_reference(&rng);
    test_decay_exclusion(&rng);
    test_clipping(&rng);
    test_schedule();
    return test_finish();
}
