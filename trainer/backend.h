// The training backends behind one interface: the CPU fp32 reference
// (trainer/backend_cpu.c) and the CUDA bf16 one (trainer/backend_cuda.cu, present when
// ONEPASS_HAVE_CUDA); the registry that picks one is trainer/backend_registry.h. The
// trainer and the parity command call a backend only through TrainBackendOps, so the
// core library links without CUDA.
//
// A backend works on ONE micro-batch at a time; the loop over a step's micro-batches
// (zero the gradients, accumulate every micro-batch's) is trainer/step.h's, the same
// for every backend.
//
// A backend holds the model's whole training state: weights, gradients and AdamW
// moments (on the GPU: the bf16 weights the model runs on, which with 16-bit low halves
// are the fp32 master weights, trainer/split_float.h; m, v, fp32 gradients). The
// host-side fp32 params [table.total] and AdamWState are the exchange format with
// checkpoints: set_state copies them in, get_state copies back.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "model/lora.h"
#include "model/model.h"
#include "trainer/adamw.h"
#include "dist/distributed.h"
#include "trainer/prefetch.h"

typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } Backend;

typedef struct {
    const ModelConfig *mc;
    const ParamTable *table;
    int micro_rows, seq_len;  // the largest micro-batch
    bool deterministic;       // bitwise reproducible gradients (GPU attention backward)
    ModelRecompute recompute;  // what the backward recomputes instead of keeping
    // LoRA (model/lora.h): table is the adapters' (the trainable parameters: params,
    // gradients and moments are theirs) and the frozen base weights base_params
    // [base_table->total] are copied in at create. NULL: full fine-tuning.
    const LoraLayout *lora;
    const ParamTable *base_table;
    const float *base_params;
    bool offload_optimizer;    // cuda: master weights and AdamW m, v in host memory
    // cuda, with recompute MODEL_RECOMPUTE_LAYER: the layer inputs in pinned host memory
    // between the forward and the backward (docs/DESIGN.md, activation memory)
    bool offload_activations;
    // cuda with offload_optimizer, full fine-tuning: the caller's fp32 params and AdamW
    // m, v [table->total] from host_allocator (pinned), which the backend then updates in
    // place as its master weights and moments instead of holding copies: set_state and
    // get_state with these same arrays copy nothing. NULL: the backend allocates its own.
    float *host_params, *host_m, *host_v;
} BackendSetup;

typedef struct {
    const char *name;
    // Allocates everything a step needs (a step then allocates nothing on the device).
    // The weights are undefined until set_state.
    void *(*create)(const BackendSetup *setup);
    void (*destroy)(void *state);
    // params [table.total] fp32 and opt (n == table.total) in and out.
    void (*set_state)(void *state, const float *params, const AdamWState *opt);
    void (*get_state)(void *state, float *params, AdamWState *opt);

    // One micro-batch (host arrays, at most setup's micro_rows x seq_len) at a time.
    void (*zero_grads)(void *state);
    // Forward+backward, ADDING the gradients of sum(CE) * loss_scale to those already
    // accumulated. Returns the unscaled CE sum over the micro-batch's targets.
    double (*forward_backward)(void *state, const ModelBatch *batch, float loss_scale);
    // Forward only: per-position CE into losses [n_rows, seq_len] (host; NULL: not
    // wanted). Returns the CE sum.
    double (*forward)(void *state, const ModelBatch *batch, float *losses);

    // Sums the accumulated gradients over comm's ranks in place (comm->sum_floats on
    // the backend's gradient buffer: host for cpu, device for cuda with NCCL's comm).
    void (*all_reduce_grads)(void *state, const DistComm *comm);
    // The next forward_backward (a step's last micro-batch) hands each part of the
    // gradients to comm->sum_floats_ready as its backward completes it, so the sums run
    // behind the rest of the backward; all_reduce_grads then finishes them. NULL: the
    // backend cannot (cpu); also a no-op for a comm without sum_floats_ready.
    void (*reduce_grads_during_backward)(void *state, const DistComm *comm);
    void (*get_grads)(void *state, float *grads);  // grads [table.total] fp32
    double (*grad_norm)(void *state);              // L2 norm over all gradients
    // Clips the gradients to max_grad_norm (grad_norm is grad_norm()'s result) and
    // applies one AdamW update with h (h->lr is this step's rate). The cuda backend's
    // offloaded optimizer returns while the update runs on the host (every later call
    // sees its result) and zeroes the gradients as they come down.
    void (*optimizer_step)(void *state, const AdamWHyper *h, double grad_norm,
                           double max_grad_norm);
    // The first tensor (table order) whose gradients (grads true) or weights hold a
    // non-finite value; NULL when all are finite. An offloaded update still running is
    // checked when it finishes: a non-finite weight then stops the process.
    const char *(*first_nonfinite)(void *state, bool grads);
    // Device memory in use and in total (bytes); false when the backend has no device.
    bool (*device_memory)(size_t *used, size_t *total);
    // Host buffers the backend reads batches from fastest (pinned memory on the GPU).
    HostAllocator host_allocator;
} TrainBackendOps;

// For the backends: the first tensor (table order) of values [table->total] (host) that
// holds a non-finite value; NULL when all are finite.
const char *param_table_first_nonfinite(const ParamTable *table, const float *values);
