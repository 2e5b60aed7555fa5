// The CPU training backend: fp32 weights, gradients and AdamW moments in host memory,
// the model of model/model_cpu.c (OpenBLAS + OpenMP).
#include "trainer/backend_cpu.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

typedef struct {
    const ParamTable *table;  // the trainable parameters: the model's, or the adapters'
    CpuModel *model;
    const LoraLayout *lora;   // NULL: full fine-tuning
    float *base;              // [base table total] the frozen base weights under LoRA
    float *params;  // [table->total]
    float *grads;   // [table->total]
    float *micro_grads;  // [table->total] a later micro-batch's own; NULL until a step has one
    bool grads_zero;     // no micro-batch accumulated since zero_grads
    AdamWState opt;
} CpuTrainer;

static void *cpu_create(const BackendSetup *setup) {
    CpuTrainer *t = xcalloc(1, sizeof *t);
    t->table = setup->table;
    t->model = cpu_model_create(setup->mc, setup->micro_rows, setup->seq_len,
                                setup->recompute);
    t->params = xcalloc(setup->table->total, sizeof(float));
    t->grads = xcalloc(setup->table->total, sizeof(float));
    if (setup->lora) {
        CHECK(setup->table->total == setup->lora->table.total && setup->base_params,
              "cpu backend: the LoRA table is not the trainable table, or no base weights");
        t->lora = setup->lora;
        t->base = xmalloc(setup->base_table->total * sizeof(float));
        memcpy(t->base, setup->base_params, setup->base_table->total * sizeof(float));
    }
    adamw_init(&t->opt, setup->table->total);
    return t;
}

static void cpu_destroy(void *state) {
    CpuTrainer *t = state;
    cpu_model_free(t->model);
    free(t->params);
    free(t->grads);
    free(t->micro_grads);
    free(t->base);
    adamw_free(&t->opt);
    free(t);
}

static void cpu_set_state(void *state, const float *params, const AdamWState *opt) {
    CpuTrainer *t = state;
    CHECK(opt->n == t->opt.n, "optimizer state has %zu elements, model %zu", opt->n, t->opt.n);
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

static void cpu_zero_grads(void *state) {
    CpuTrainer *t = state;
    memset(t->grads, 0, t->table->total * sizeof(float));
    t->grads_zero = true;
}

// Each micro-batch's gradients are computed from zero (the first one's in place, a later
// one's in micro_grads, then added), so a step's gradients are its micro-batches' summed
// in order, one addition each: N ranks of one micro-batch each, summed in rank order,
// hold the one-rank step's bits (the model's backward adds into the buffer in K-blocks
// and row by row, so accumulating a second micro-batch in place rounds differently).
// The model's forward_backward into grads: the whole model's, or under LoRA the
// adapters' with the base frozen.
static double model_forward_backward(CpuTrainer *t, float *grads, const ModelBatch *batch,
                                     float loss_scale) {
    if (!t->lora) return cpu_model_forward_backward(t->model, t->params, grads, batch, loss_scale);
    cpu_model_set_lora(t->model, t->lora, t->params, grads);
    return cpu_model_forward_backward(t->model, t->base, NULL, batch, loss_scale);
}

static double cpu_forward_backward(void *state, const ModelBatch *batch, float loss_scale) {
    CpuTrainer *t = state;
    const size_t n = t->table->total;
    if (t->grads_zero) {
        t->grads_zero = false;
        return model_forward_backward(t, t->grads, batch, loss_scale);
    }
    if (!t->micro_grads) t->micro_grads = xmalloc(n * sizeof(float));
    memset(t->micro_grads, 0, n * sizeof(float));
    const double sum = model_forward_backward(t, t->micro_grads, batch, loss_scale);
    for (size_t i = 0; i < n; i++) t->grads[i] += t->micro_grads[i];
    return sum;
}

static double cpu_forward(void *state, const ModelBatch *batch, float *losses) {
    CpuTrainer *t = state;
    if (!t->lora) return cpu_model_forward(t->model, t->params, batch, losses);
    cpu_model_set_lora(t->model, t->lora, t->params, NULL);
    return cpu_model_forward(t->model, t->base, batch, losses);
}

static void cpu_all_reduce_grads(void *state, const DistComm *comm) {
    CpuTrainer *t = state;
    CHECK(!comm->device, "the cpu backend's gradients are in host memory, not the device's");
    comm->sum_floats(comm, t->grads, t->table->total, NULL);
}

static void cpu_get_grads(void *state, float *grads) {
    CpuTrainer *t = state;
    memcpy(grads, t->grads, t->table->total * sizeof(float));
}

static double cpu_grad_norm(void *state) {
    CpuTrainer *t = state;
    return grad_global_norm_cpu(t->grads, t->table->total);
}

static void cpu_optimizer_step(void *state, const AdamWHyper *h, double grad_norm,
                               double max_grad_norm) {
    CpuTrainer *t = state;
    grad_clip_cpu(t->grads, t->table->total, grad_norm, max_grad_norm);
    adamw_step_cpu(&t->opt, t->table, h, t->params, t->grads);
}

static const char *cpu_first_nonfinite(void *state, bool grads) {
    CpuTrainer *t = state;
    return param_table_first_nonfinite(t->table, grads ? t->grads : t->params);
}

static void *host_malloc(size_t bytes) { return xmalloc(bytes); }

static const TrainBackendOps CPU_BACKEND = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .set_state = cpu_set_state,
    .get_state = cpu_get_state,
    .zero_grads = cpu_zero_grads,
    .forward_backward = cpu_forward_backward,
    .forward = cpu_forward,
    .all_reduce_grads = cpu_all_reduce_grads,
    .get_grads = cpu_get_grads,
    .grad_norm = cpu_grad_norm,
    .optimizer_step = cpu_optimizer_step,
    .first_nonfinite = cpu_first_nonfinite,
    .device_memory = NULL,
    .host_allocator = {host_malloc, free},
};

const TrainBackendOps *cpu_train_backend(void) { return &CPU_BACKEND; }
