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
// The group that reads each target's input; a group's targets are consecutive here, so
// their A's, placed in target order, are stacked.
static const LoraGroupId TARGET_GROUP[LORA_TARGETS] = {
    LORA_GROUP_QKV, LORA_GROUP_QKV, LORA_GROUP_QKV, LORA_GROUP_O,
    LORA_GROUP_GATE_UP, LORA_GROUP_GATE_UP, LORA_GROUP_DOWN,
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
    // Each target's first column in its group's output rows (the stacked q|k|v, gate|up).
    const int col[LORA_TARGETS] = {0, d.q_dim, d.q_dim + d.kv_dim, 0, 0, F, 0};
    const size_t n = (size_t)mc->num_hidden_layers * LORA_TARGETS;
    out->a = xmalloc(n * sizeof(size_t));
    out->b = xmalloc(n * sizeof(size_t));
    out->groups = xcalloc((size_t)mc->num_hidden_layers * LORA_GROUPS, sizeof(LoraGroup));
    int cap = 0;
    for (int l = 0; l < mc->num_hidden_layers; l++) {
        // The layer's A's first, in target order (a group's A's end up stacked), then its B's.
        for (int t = 0; t < LORA_TARGETS; t++) {
            const size_t i = (size_t)l * LORA_TARGETS + t;
            out->a[i] = out->b[i] = PARAM_ABSENT;
            if (!lc->target[t]) continue;
            char name[96];
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s.lora_A.weight", l,
                     TARGET_MODULES[t], TARGET_NAMES[t]);
            out->a[i] = out->table.total;
            push_tensor(&out->table, &cap, lc->r, in[t], name);
        }
        for (int t = 0; t < LORA_TARGETS; t++) {
            const size_t i = (size_t)l * LORA_TARGETS + t;
            if (!lc->target[t]) continue;
            char name[96];
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s.lora_B.weight", l,
                     TARGET_MODULES[t], TARGET_NAMES[t]);
            out->b[i] = out->table.total;
            push_tensor(&out->table, &cap, outf[t], lc->r, name);
            LoraGroup *g = &out->groups[(size_t)l * LORA_GROUPS + TARGET_GROUP[t]];
            if (g->n == 0) *g = (LoraGroup){.in = in[t], .r = lc->r, .scale = out->scale,
                                            .a = out->a[i]};
            const int j = g->n++;
            CHECK(out->a[i] == g->a + (size_t)j * lc->r * in[t], "lora: %s's A is not stacked "
                  "after its group's", TARGET_NAMES[t]);
            g->b[j] = out->b[i], g->out[j] = outf[t], g->col[j] = col[t];
            if (g->n > out->max_group) out->max_group = g->n;
        }
    }
}

void lora_layout_free(LoraLayout *l) {
    param_table_free(&l->table);
    free(l->a);
    free(l->b);
    free(l->groups);
    memset(l, 0, sizeof *l);
}

void lora_init(const LoraLayout *l, uint64_t seed, float *adapter) {
    // Tensor k's stream (k counts A, B, A, B, ... over the targeted projections in layer
    // and target order) is seeded from k, whatever the buffer's order.
    uint64_t k = 0;
    for (size_t i = 0; i < (size_t)l->num_hidden_layers * LORA_TARGETS; i++) {
        if (l->a[i] == PARAM_ABSENT) continue;
        const int t = (int)(i % LORA_TARGETS), in = l->in[t];
        memset(adapter + l->b[i], 0, (size_t)l->out[t] * l->cfg.r * sizeof(float));
        float *w = adapter + l->a[i];
        const double bound = 1.0 / sqrt((double)in);
        uint64_t state = seed ^ (0x9E6C63D0676A9A99ULL * (k + 1));
        for (size_t j = 0; j < (size_t)l->cfg.r * in; j++) {
            const double u = (double)(splitmix64(&state) >> 11) * (1.0 / 9007199254740992.0);
            w[j] = (float)((2.0 * u - 1.0) * bound);
        }
        k += 2;
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

const LoraGroup *lora_group(const LoraLayout *l, int layer, LoraGroupId g) {
    return &l->groups[(size_t)layer * LORA_GROUPS + g];
}

LoraGroup lora_target_group(const LoraLayout *l, int layer, LoraTarget t) {
    const size_t i = (size_t)layer * LORA_TARGETS + t;
    if (l->a[i] == PARAM_ABSENT) return (LoraGroup){0};
    return (LoraGroup){.n = 1, .in = l->in[t], .r = l->cfg.r, .scale = l->scale, .a = l->a[i],
                       .b = {l->b[i]}, .out = {l->out[t]}, .col = {0}};
}

void lora_forward_cpu(float *out, int ld_out, float *u, const float *x, const float *adapter,
                      const LoraGroup *g, int T) {
    const int r = g->r, nr = g->n * r;
    // u[T, n r] = x A^T (the members' A's stacked)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, nr, g->in, 1.0f, x, g->in,
                adapter + g->a, g->in, 0.0f, u, nr);
    // member j: out[T, col_j ..] += s u_j B_j^T
    for (int j = 0; j < g->n; j++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, g->out[j], r, g->scale,
                    u + (size_t)j * r, nr, adapter + g->b[j], r, 1.0f, out + g->col[j], ld_out);
}

void lora_backward_cpu(float *dx, float *adapter_grads, float *u, float *du, const float *dout,
                       int ld_dout, const float *x, const float *adapter, const LoraGroup *g,
                       int T) {
    const int r = g->r, nr = g->n * r, in = g->in;
    const float *A = adapter + g->a;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, nr, in, 1.0f, x, in, A, in, 0.0f, u,
                nr);
    for (int j = 0; j < g->n; j++) {
        const float *dout_j = dout + g->col[j];
        // dB_j[out_j, r] += s dout_j^T u_j
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g->out[j], r, T, g->scale, dout_j,
                    ld_dout, u + (size_t)j * r, nr, 1.0f, adapter_grads + g->b[j], r);
        // du_j[T, r] = s dout_j B_j
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, r, g->out[j], g->scale, dout_j,
                    ld_dout, adapter + g->b[j], r, 0.0f, du + (size_t)j * r, nr);
    }
    // dA[n r, in] += du^T x (the stacked A's gradients)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nr, in, T, 1.0f, du, nr, x, in, 1.0f,
                adapter_grads + g->a, in);
    // dx[T, in] += du A
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, nr, 1.0f, du, nr, A, in,
                    1.0f, dx, in);
}
