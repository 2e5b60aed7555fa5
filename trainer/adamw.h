// AdamW with decoupled weight decay and global-norm gradient clipping, as twins: the
// CPU one (trainer/adamw_cpu.c, host memory) and the CUDA one (trainer/adamw_cuda.cu,
// device memory; declared for CUDA translation units only). Parameters, gradients and
// both moment buffers share the ParamTable's offsets.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#endif

#ifdef __cplusplus
extern "C" {  // model.h is a plain C header without guards of its own
#endif
#include "model/model.h"

typedef struct {
    float lr;            // this step's learning rate (from lr_schedule)
    float beta1, beta2, eps;
    float weight_decay;
    bool decay_norms;       // apply weight decay to RMSNorm weights
    bool decay_embeddings;  // apply weight decay to embed_tokens / lm_head
} AdamWHyper;

typedef struct {
    size_t n;   // elements (ParamTable.total)
    float *m;   // [n] first moment (host for adamw_step_cpu, device for adamw_step_cuda)
    float *v;   // [n] second moment (likewise)
    long step;  // updates applied so far (bias correction uses step after increment)
} AdamWState;

// Host moments, zeroed, at step 0.
void adamw_init(AdamWState *s, size_t n);
void adamw_free(AdamWState *s);
// The same from an allocator (the CUDA backend's pinned host memory), zeroed here;
// adamw_free_from gives them back to its free.
void adamw_init_from(AdamWState *s, size_t n, void *(*alloc)(size_t bytes));
void adamw_free_from(AdamWState *s, void (*free_fn)(void *ptr));

// Whether the tensor gets weight decay under these settings.
bool adamw_decays(const ParamTensor *t, const AdamWHyper *h);

// One update of every tensor in the table (PyTorch AdamW order: params *= 1 - lr*wd
// for decayed tensors, then params -= lr * m_hat / (sqrt(v_hat) + eps)). Host memory;
// clip the gradients first with grad_clip_cpu.
void adamw_step_cpu(AdamWState *s, const ParamTable *table, const AdamWHyper *h, float *params,
                    const float *grads);

// The clipping scale the CUDA AdamW kernel applies for the device norm grad_norm:
// max_grad_norm / (grad_norm + 1e-6) in double, rounded to float, when max_grad_norm > 0
// and grad_norm exceeds it; else 1.
float adamw_clip_scale(float grad_norm, float max_grad_norm);

// adamw_step_cuda's arithmetic on the host (the offloaded optimizer,
// trainer/backend_cuda.cu), for the elements [from, to) of the table's flat buffers: the
// fp32 master weights params, s->m and s->v, host memory indexed by the table's offsets;
// grads[0 .. to - from) are the range's gradients (the chunk that came down) and
// hi[0 .. to - from) receives the updated weights' high halves (split_float_hi: the bf16
// weights the model runs on). Each gradient is multiplied by clip_scale
// (adamw_clip_scale's) as it is read. s->step is the update count after incrementing
// (the caller increments it once per step, before the first range). Bit for bit
// adamw_step_cpu (after grads *= clip_scale) and the CUDA kernel's decoded weights.
// Returns whether every updated weight is finite.
bool adamw_master_range_cpu(const AdamWState *s, const ParamTable *table, const AdamWHyper *h,
                            size_t from, size_t to, float *params, uint16_t *hi,
                            const float *grads, float clip_scale);

// L2 norm over all n gradient elements (accumulated in double, fixed order).
double grad_global_norm_cpu(const float *grads, size_t n);
// Scales grads so their global norm is at most max_norm (no-op when max_norm <= 0 or
// norm <= max_norm). `norm` is grad_global_norm_cpu's result. Returns the scale applied.
float grad_clip_cpu(float *grads, size_t n, double norm, double max_norm);

#ifdef __CUDACC__
struct __nv_bfloat16;  // cuda_bf16.h's; only pointers here

// adamw_step_cpu's twin, bit for bit the same arithmetic, on device pointers (s->m, s->v
// too), asynchronous on `stream`: one launch per run of consecutive tensors that share
// the weight decay. The fp32 params are split master weights [table->total] each
// (trainer/split_float.h): params_hi, the bf16 weights the model runs on, is their high
// half, params_lo the low half; each element is decoded, updated and encoded again, so
// the decoded values are exactly adamw_step_cpu's params (given the same clipping scale:
// grad_global_norm_cpu sums in another order) and params_hi their bf16 rounding.
// Clipping is folded in, so the host never waits for the norm: when max_grad_norm > 0
// and the device scalar grad_norm (grad_global_norm_cuda's) exceeds it, the gradients
// are scaled by max_grad_norm / (norm + 1e-6) as they are read (grads themselves are
// not modified).
void adamw_step_cuda(AdamWState *s, const ParamTable *table, const AdamWHyper *h,
                     struct __nv_bfloat16 *params_hi, uint16_t *params_lo, const float *grads,
                     const float *grad_norm, float max_grad_norm, cudaStream_t stream);

// norm_out[1] (device fp32) = L2 norm of grads[n] (device); two fixed-order stages
// (GRAD_NORM_BLOCKS grid-stride partials, then one block), so deterministic. Uses the
// scratch of model/ops_cuda.h's ops_cuda_init.
void grad_global_norm_cuda(float *norm_out, const float *grads, size_t n, cudaStream_t stream);
// The same norm of split fp32 values (hi | lo, trainer/split_float.h), decoded as read.
void split_global_norm_cuda(float *norm_out, const struct __nv_bfloat16 *hi, const uint16_t *lo,
                            size_t n, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
