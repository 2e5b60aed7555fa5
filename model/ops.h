// Model ops, CPU fp32 reference. Each `<op>_cpu` has a CUDA twin `<op>_cuda` in
// model/ops_cuda.h with the same parameters in the same order (bf16 activations
// where these take float activations, device pointers, plus a trailing stream), so
// tests compare them directly. N = rows*seq_len tokens, C = hidden size.
// "Accumulate" means the op ADDS into the gradient buffer (micro-batch accumulation).
#pragma once
#include <stdint.h>
#include "model/model.h"

// out[N,C] = wte[tokens[n], :]
void embedding_forward_cpu(float *out, const int32_t *tokens, const float *wte, int N, int C);
// dwte[V,C] += scatter of dout[N,C] by tokens (accumulate; deterministic order)
void embedding_backward_cpu(float *dwte, const float *dout, const int32_t *tokens, int N, int C);

// out[N,C] = inp / rms(inp) * weight; rstd[N] saved for backward
void rmsnorm_forward_cpu(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps);
// dinp[N,C] += ..., dweight[C] += ... (both accumulate; dweight NULL: a frozen weight,
// skipped on the CPU)
void rmsnorm_backward_cpu(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C);

// Rotate-half RoPE in place on x[N, n_heads, head_dim] with per-token position ids
// pos[N]: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin over halves of head_dim,
// angle = pos * inv_freq[i], inv_freq from theta under the scaling (rope_inv_freq in
// model/model.h; NULL scaling: theta^(-2i/head_dim)). backward applies the inverse
// rotation to dx.
void rope_forward_cpu(float *x, const int32_t *pos, int N, int n_heads, int head_dim, float theta,
                      const RopeScaling *scaling);
void rope_backward_cpu(float *dx, const int32_t *pos, int N, int n_heads, int head_dim,
                       float theta, const RopeScaling *scaling);

// out[N,C] += bias[C] on every row (a Linear's bias)
void bias_forward_cpu(float *out, const float *bias, int N, int C);
// dbias[C] += sum over rows of dout[N,C] (accumulate; fixed order)
void bias_backward_cpu(float *dbias, const float *dout, int N, int C);

// out[n] = silu(gate[n]) * up[n] over n elements
void swiglu_forward_cpu(float *out, const float *gate, const float *up, int64_t n);
// dgate[n], dup[n] overwritten
void swiglu_backward_cpu(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n);

// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T  (HF Linear layout)
void matmul_forward_cpu(float *out, const float *inp, const float *weight, int N, int IC, int OC);
// dinp[N,IC] += dout @ weight (skipped when dinp is NULL); dweight[OC,IC] += dout^T @ inp
// (skipped on the CPU when dweight is NULL: a frozen weight)
void matmul_backward_cpu(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int IC, int OC);

// Cross-entropy over rows of logits[N,V] with targets[N] (-1 = no loss).
// losses[N] = -log softmax(logits)[target] (0 where target is -1).
// dlogits[N,V] = (softmax - onehot) * loss_scale for target rows, 0 elsewhere
// (dlogits may alias logits; NULL dlogits computes the loss only, NULL losses
// skips the per-row output). Returns the sum of losses.
double cross_entropy_forward_backward_cpu(float *losses, float *dlogits, const float *logits,
                                          const int32_t *targets, int N, int V, float loss_scale);
