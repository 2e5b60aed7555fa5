// AdamW with decoupled weight decay, global-norm gradient clipping, and the
// learning-rate schedule (linear warm-up, then cosine decay to lr * min_lr_ratio).
// Parameters, gradients and both moment buffers share the ParamTable's offsets.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
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
    float *m;   // [n] first moment
    float *v;   // [n] second moment
    long step;  // updates applied so far (bias correction uses step after increment)
} AdamWState;

void adamw_init(AdamWState *s, size_t n);
void adamw_free(AdamWState *s);

// One update of every tensor in the table (PyTorch AdamW order: params *= 1 - lr*wd
// for decayed tensors, then params -= lr * m_hat / (sqrt(v_hat) + eps)).
void adamw_step(AdamWState *s, const ParamTable *table, const AdamWHyper *h, float *params,
                const float *grads);

// Whether the tensor gets weight decay under these settings.
bool adamw_decays(const ParamTensor *t, const AdamWHyper *h);

// L2 norm over all n gradient elements (accumulated in double, fixed order).
double grad_global_norm(const float *grads, size_t n);
// Scales grads so their global norm is at most max_norm (no-op when max_norm <= 0 or
// norm <= max_norm). `norm` is grad_global_norm's result. Returns the scale applied.
float grad_clip(float *grads, size_t n, double norm, double max_norm);

// Learning rate for 0-based step `step` of `total_steps`: linear warm-up
// lr * (step+1)/warmup over the first `warmup` steps, then cosine from lr down to
// lr * min_lr_ratio, reached exactly at the last step.
double lr_schedule(long step, long total_steps, long warmup, double lr, double min_lr_ratio);
