// LoRA adapters (model/lora.h): the table under PEFT's names, PEFT's init, the merge and
// the CPU math of one adapted projection.
#include "model/lora.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "common/check.h"

static const char *const TARGET_NAMES[LORA_TARGETS] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};
static const char *const TARGET_MODULES[LORA_TARGETS] = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp",
};
static const LayerTensor TARGET_TENSORS[LORA_TARGETS] = {
    W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN,
};

const char *lora_target_name(LoraTarget t) {
    return t >= 0 && t < LORA_TARGETS ? TARGET_NAMES[t] : "?";
}

int lora_target_from_name(const char *name) {
    for (int t = 0; t < LORA_TARGETS; t++)
        if (name && strcmp(name, TARGET_NAMES[t]) == 0) return t;
    return -1;
}

LayerTensor lora_target_tensor(LoraTarget t) { return TARGET_TENSORS[t]; }

double lora_scale(const LoraConfig *lc) {
    return lc->rslora ? lc->alpha / sqrt((double)lc->r) : lc->alpha / lc->r;
}

static void push_tensor(ParamTable *t, int *cap, int64_t rows, int64_t cols, const char *name) {
    if (t->n_tensors == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        t->tensors = xrealloc(t->tensors, (size_t)*cap * sizeof(ParamTensor));
    }
    ParamTensor *p = &t->tensors[t->n_tensors++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = 2;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->numel = (size_t)rows * (size_t)cols;
    p->offset = t->total;
    t->total += p->numel;
}

void lora_layout_build(const ModelConfig *mc, const LoraConfig *lc, LoraLayout *out) {
    CHECK(lc->r >= 1 && lc->r <= LORA_MAX_RANK, "lora.r %d outside [1, %d]", lc->r, LORA_MAX_RANK);
    CHECK(isfinite(lc->alpha) && lc->alpha > 0, "lora.alpha %g is not positive", lc->alpha);
    bool any = false;
    for (int t = 0; t < LORA_TARGETS; t++) any |= lc->target[t];
    CHECK(any, "lora.targets names no projection");
    const ModelDims d = model_dims(mc);
    memset(out, 0, sizeof *out);
    out->cfg = *lc;
    out->scale = (float)lora_scale(lc);
    out->num_hidden_layers = mc->num_hidden_layers;
    const int C = mc->hidden_size, F = mc->intermediate_size;
    const int in[LORA_TARGETS] = {C, C, C, d.q_dim, C, C, F};
    const int outf[LORA_TARGETS] = {d.q_dim, d.kv_dim, d.kv_dim, C, F, F, C};
    memcpy(out->in, in, sizeof in);
    memcpy(out->out, outf, sizeof outf);
    const size_t n = (size_t)mc->num_hidden_layers * LORA_TARGETS;
    out->a = xmalloc(n * sizeof(size_t));
    out->b = xmalloc(n * sizeof(size_t));
    int cap = 0;
    for (int l = 0; l < mc->num_hidden_layers; l++)
        for (int t = 0; t < LORA_TARGETS; t++) {
            const size_t i = (size_t)l * LORA_TARGETS + t;
            out->a[i] = out->b[i] = PARAM_ABSENT;
            if (!lc->target[t]) continue;
            char name[96];
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s.lora_A.weight", l,
                     TARGET_MODULES[t], TARGET_NAMES[t]);
            out->a[i] = out->table.total;
            push_tensor(&out->table, &cap, lc->r, in[t], name);
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s.lora_B.weight", l,
                     TARGET_MODULES[t], TARGET_NAMES[t]);
            out->b[i] = out->table.total;
            push_tensor(&out->table, &cap, outf[t], lc->r, name);
        }
}

void lora_layout_free(LoraLayout *l) {
    param_table_free(&l->table);
    free(l->a);
    free(l->b);
    memset(l, 0, sizeof *l);
}

void lora_init(const LoraLayout *l, uint64_t seed, float *adapter) {
    for (int i = 0; i < l->table.n_tensors; i++) {
        const ParamTensor *p = &l->table.tensors[i];
        float *w = adapter + p->offset;
        const bool is_a = i % 2 == 0;  // A, B, A, B, ...
        if (!is_a) {
            memset(w, 0, p->numel * sizeof(float));
            continue;
        }
        const double bound = 1.0 / sqrt((double)p->shape[1]);
        uint64_t state = seed ^ (0x9E6C63D0676A9A99ULL * (uint64_t)(i + 1));
        for (size_t j = 0; j < p->numel; j++) {
            const double u = (double)(splitmix64(&state) >> 11) * (1.0 / 9007199254740992.0);
            w[j] = (float)((2.0 * u - 1.0) * bound);
        }
    }
}

void lora_merge(const LoraLayout *l, const ParamTable *base, float *params,
                const float *adapter) {
    for (int layer = 0; layer < l->num_hidden_layers; layer++)
        for (int t = 0; t < LORA_TARGETS; t++) {
            const size_t i = (size_t)layer * LORA_TARGETS + t;
            if (l->a[i] == PARAM_ABSENT) continue;
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.%s.%s.weight", layer, TARGET_MODULES[t],
                     TARGET_NAMES[t]);
            const ParamTensor *w = param_table_find(base, name);
            CHECK(w && w->shape[0] == l->out[t] && w->shape[1] == l->in[t],
                  "lora_merge: %s missing or of another shape", name);
            // W[out, in] += s * B[out, r] @ A[r, in]
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, l->out[t], l->in[t],
                        l->cfg.r, l->scale, adapter + l->b[i], l->cfg.r, adapter + l->a[i],
                        l->in[t], 1.0f, params + w->offset, l->in[t]);
        }
}

void lora_forward_cpu(float *out, int ld_out, float *u, const float *x, const float *A,
                      const float *B, int T, int IC, int OC, int r, float scale) {
    // u[T, r] = x A^T; out[T, OC] += s u B^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, r, IC, 1.0f, x, IC, A, IC, 0.0f, u,
                r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, OC, r, scale, u, r, B, r, 1.0f, out,
                ld_out);
}

void lora_backward_cpu(float *dx, float *dA, float *dB, float *u, float *du, const float *dout,
                       int ld_dout, const float *x, const float *A, const float *B, int T,
                       int IC, int OC, int r, float scale) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, r, IC, 1.0f, x, IC, A, IC, 0.0f, u,
                r);
    // dB[OC, r] += s dout^T u
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, r, T, scale, dout, ld_dout, u, r, 1.0f,
                dB, r);
    // du[T, r] = s dout B
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, r, OC, scale, dout, ld_dout, B, r,
                0.0f, du, r);
    // dA[r, IC] += du^T x
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, IC, T, 1.0f, du, r, x, IC, 1.0f, dA,
                IC);
    // dx[T, IC] += du A
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, IC, r, 1.0f, du, r, A, IC, 1.0f,
                    dx, IC);
}
