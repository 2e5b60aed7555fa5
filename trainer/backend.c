// Backend choice and the CPU backend (fp32, OpenBLAS + OpenMP, the reference).
#include "trainer/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#ifdef ONEPASS_HAVE_CUDA
#include "trainer/step_cuda.h"
#endif

#ifdef ONEPASS_HAVE_CUDA
// The head dimensions the CUDA attention kernels are built for.
static bool cuda_head_dim_supported(const ModelConfig *mc) {
    const int head_dim = mc->hidden_size / mc->num_attention_heads;
    return mc->hidden_size % mc->num_attention_heads == 0 && (head_dim == 64 || head_dim == 128);
}
#endif

Backend backend_choose(const char *name, const ModelConfig *mc, char *why, size_t why_len) {
    if (!name) fatal("config key 'backend': must be \"auto\", \"cpu\" or \"cuda\", got null");
    const bool want_cuda = strcmp(name, "cuda") == 0, want_auto = strcmp(name, "auto") == 0;
    if (strcmp(name, "cpu") == 0) {
        snprintf(why, why_len, "backend: cpu (requested)");
        return BACKEND_CPU;
    }
    if (!want_cuda && !want_auto)
        fatal("config key 'backend': must be \"auto\", \"cpu\" or \"cuda\", got \"%s\"", name);
#ifdef ONEPASS_HAVE_CUDA
    char device[256] = "";
    const int n_devices = cuda_device_count(device, sizeof device);
    if (n_devices == 0) {
        if (want_cuda)
            fatal("config key 'backend': \"cuda\" requested but no CUDA device was found");
        snprintf(why, why_len, "backend: cpu (no CUDA device found)");
        return BACKEND_CPU;
    }
    if (want_auto && !cuda_head_dim_supported(mc)) {
        snprintf(why, why_len, "backend: cpu (a CUDA device is visible, but the CUDA kernels need "
                 "head_dim 64 or 128 and model.hidden_size / model.num_attention_heads is %d / %d)",
                 mc->hidden_size, mc->num_attention_heads);
        return BACKEND_CPU;
    }
    snprintf(why, why_len, "backend: cuda (%s; %d CUDA device%s visible, using device 0: %s)",
             want_cuda ? "requested" : "auto", n_devices, n_devices == 1 ? "" : "s", device);
    return BACKEND_CUDA;
#else
    (void)mc;
    if (want_cuda)
        fatal("config key 'backend': \"cuda\" requested but this binary was built without CUDA");
    snprintf(why, why_len, "backend: cpu (built without CUDA)");
    return BACKEND_CPU;
#endif
}

// ------------------------------------------------------------------ CPU backend

typedef struct {
    const ParamTable *table;
    CpuModel *model;
    float *params;  // [table->total]
    float *grads;   // [table->total]
    AdamWState opt;
} CpuTrainer;

static void *cpu_create(const BackendSetup *setup) {
    CpuTrainer *t = xcalloc(1, sizeof *t);
    t->table = setup->table;
    t->model = cpu_model_create(setup->mc, setup->micro_rows, setup->seq_len);
    t->params = xcalloc(setup->table->total, sizeof(float));
    t->grads = xcalloc(setup->table->total, sizeof(float));
    adamw_init(&t->opt, setup->table->total);
    return t;
}

static void cpu_destroy(void *state) {
    CpuTrainer *t = state;
    cpu_model_free(t->model);
    free(t->params);
    free(t->grads);
    adamw_free(&t->opt);
    free(t);
}

static void cpu_set_state(void *state, const float *params, const AdamWState *opt) {
    CpuTrainer *t = state;
    const size_t bytes = t->table->total * sizeof(float);
    memcpy(t->params, params, bytes);
    memcpy(t->opt.m, opt->m, bytes);
    memcpy(t->opt.v, opt->v, bytes);
    t->opt.step = opt->step;
}

static void cpu_get_state(void *state, float *params, AdamWState *opt) {
    CpuTrainer *t = state;
    const size_t bytes = t->table->total * sizeof(float);
    memcpy(params, t->params, bytes);
    memcpy(opt->m, t->opt.m, bytes);
    memcpy(opt->v, t->opt.v, bytes);
    opt->step = t->opt.step;
}

static double cpu_forward_backward(void *state, const MicroBatches *mb, float loss_scale) {
    CpuTrainer *t = state;
    memset(t->grads, 0, t->table->total * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < mb->n_micro; i++) {
        const ModelBatch b = micro_batch(mb, i);
        sum += cpu_model_forward_backward(t->model, t->params, t->grads, &b, loss_scale);
    }
    return sum;
}

static void cpu_get_grads(void *state, float *grads) {
    CpuTrainer *t = state;
    memcpy(grads, t->grads, t->table->total * sizeof(float));
}

static double cpu_grad_norm(void *state) {
    CpuTrainer *t = state;
    return grad_global_norm(t->grads, t->table->total);
}

static void cpu_optimizer_step(void *state, const AdamWHyper *h, double grad_norm,
                               double max_grad_norm) {
    CpuTrainer *t = state;
    grad_clip(t->grads, t->table->total, grad_norm, max_grad_norm);
    adamw_step(&t->opt, t->table, h, t->params, t->grads);
}

static const char *cpu_first_nonfinite(void *state, bool grads) {
    CpuTrainer *t = state;
    const float *buffer = grads ? t->grads : t->params;
    for (int i = 0; i < t->table->n_tensors; i++) {
        const ParamTensor *pt = &t->table->tensors[i];
        for (size_t k = 0; k < pt->numel; k++)
            if (!isfinite(buffer[pt->offset + k])) return pt->name;
    }
    return NULL;
}

static double cpu_forward(void *state, const MicroBatches *mb, float *losses) {
    CpuTrainer *t = state;
    double sum = 0.0;
    for (int i = 0; i < mb->n_micro; i++) {
        const ModelBatch b = micro_batch(mb, i);
        const size_t off = (size_t)i * (size_t)mb->micro_rows * (size_t)mb->rows.seq_len;
        sum += cpu_model_forward(t->model, t->params, &b, losses ? losses + off : NULL);
    }
    return sum;
}

static void *host_malloc(size_t bytes) { return xmalloc(bytes); }

static const TrainBackendOps CPU_BACKEND = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .set_state = cpu_set_state,
    .get_state = cpu_get_state,
    .forward_backward = cpu_forward_backward,
    .get_grads = cpu_get_grads,
    .grad_norm = cpu_grad_norm,
    .optimizer_step = cpu_optimizer_step,
    .first_nonfinite = cpu_first_nonfinite,
    .forward = cpu_forward,
    .device_memory = NULL,
    .host_allocator = {host_malloc, free},
};

const TrainBackendOps *backend_ops(Backend backend) {
#ifdef ONEPASS_HAVE_CUDA
    if (backend == BACKEND_CUDA) return cuda_train_backend();
#endif
    if (backend != BACKEND_CPU) fatal("internal: backend %d is not in this binary", (int)backend);
    return &CPU_BACKEND;
}
