// Model ops, CUDA backend: the twins of model/ops.h. Each `<op>_cuda` takes the
// same parameters in the same order as `<op>_cpu`, with bf16 activations and weights
// where the CPU op takes float, fp32 where precision matters (rstd, losses, weight
// gradients, master weights, optimizer state), DEVICE pointers throughout, plus a
// trailing stream. All launches are asynchronous on that stream.
// N = tokens, C = channels, V = vocabulary. "Accumulate" means the op ADDS into
// the output (micro-batch gradient accumulation), exactly like the CPU op.
//
// Ops that use scratch (embedding_backward, rmsnorm_backward, matmul_*, and
// trainer/adamw.h's grad_global_norm_cuda) share the buffers made by ops_cuda_init,
// so they must be ordered on one stream (or the streams synchronised) — never run
// concurrently.
// Every reduction that feeds a gradient runs in a fixed order: results are
// bitwise reproducible run to run (no float atomics).
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_bf16.h>
#ifndef __cplusplus
typedef struct __nv_bfloat16 __nv_bfloat16;  // opaque in C: device pointers only
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "model/model.h"  // RopeScaling (a plain C header, inside the guard)

// Creates the process-wide state for the current device: the cuBLASLt handle and
// its workspace, and scratch for calls of up to max_tokens tokens (embedding) and
// max_channels channels (embedding, rmsnorm: its rows are not bounded, so it may run over
// tokens x heads rows of head_dim). Larger calls are a fatal error. Call once, before
// any op; ops_cuda_destroy frees it all (after the stream work is done).
void ops_cuda_init(int max_tokens, int max_channels);
void ops_cuda_destroy(void);
// Whether ops_cuda_init has run (and ops_cuda_destroy not since).
bool ops_cuda_ready(void);

// out[N,C] (bf16) = wte[tokens[n], :]; wte [V,C] bf16. Tokens must be in [0, V):
// the op has no V to check against (the data pipeline validates token ids).
void embedding_forward_cuda(__nv_bfloat16 *out, const int32_t *tokens, const __nv_bfloat16 *wte,
                            int N, int C, cudaStream_t stream);
// dwte[V,C] (fp32) += scatter of dout[N,C] (bf16) by tokens. Deterministic: the
// tokens are stably sorted, then each distinct token's rows are summed in order.
void embedding_backward_cuda(float *dwte, const __nv_bfloat16 *dout, const int32_t *tokens, int N,
                             int C, cudaStream_t stream);

// out[N,C] (bf16) = inp / rms(inp) * weight[C] (bf16); rstd[N] (fp32) saved.
void rmsnorm_forward_cuda(__nv_bfloat16 *out, float *rstd, const __nv_bfloat16 *inp,
                          const __nv_bfloat16 *weight, int N, int C, float eps,
                          cudaStream_t stream);
// dinp[N,C] (bf16) += ..., dweight[C] (fp32) += ... (both accumulate). dweight is
// reduced in two fixed-order stages (per-row-group partials, then over groups); NULL: a
// frozen weight, none.
void rmsnorm_backward_cuda(__nv_bfloat16 *dinp, float *dweight, const __nv_bfloat16 *dout,
                           const __nv_bfloat16 *inp, const __nv_bfloat16 *weight,
                           const float *rstd, int N, int C, cudaStream_t stream);

// Residual add fused into the norm that follows it: sum[N,C] (bf16) = a + b, rounded
// to bf16 (exactly residual_add_cuda), then out/rstd = rmsnorm_forward_cuda of that
// rounded sum. sum may alias a or b.
void add_rmsnorm_forward_cuda(__nv_bfloat16 *sum, __nv_bfloat16 *out, float *rstd,
                              const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                              const __nv_bfloat16 *weight, int N, int C, float eps,
                              cudaStream_t stream);

// Rotate-half RoPE in place on x[N, n_heads, head_dim] (bf16) with positions pos[N];
// angles in double from the host's rope_inv_freq (theta under the scaling, NULL: none)
// like the CPU op. backward applies the inverse rotation to dx.
void rope_forward_cuda(__nv_bfloat16 *x, const int32_t *pos, int N, int n_heads, int head_dim,
                       float theta, const RopeScaling *scaling, cudaStream_t stream);
void rope_backward_cuda(__nv_bfloat16 *dx, const int32_t *pos, int N, int n_heads, int head_dim,
                        float theta, const RopeScaling *scaling, cudaStream_t stream);

// out[N,C] (bf16) += bias[C] (bf16) on every row, rounded once to bf16.
void bias_forward_cuda(__nv_bfloat16 *out, const __nv_bfloat16 *bias, int N, int C,
                       cudaStream_t stream);
// dbias[C] (fp32) += sum over rows of dout[N,C] (bf16), in a fixed order (deterministic).
void bias_backward_cuda(float *dbias, const __nv_bfloat16 *dout, int N, int C,
                        cudaStream_t stream);

// out[n] = silu(gate[n]) * up[n] (all bf16). out may alias gate or up.
void swiglu_forward_cuda(__nv_bfloat16 *out, const __nv_bfloat16 *gate, const __nv_bfloat16 *up,
                         int64_t n, cudaStream_t stream);
// dgate[n], dup[n] overwritten (bf16); they may alias gate and up respectively.
void swiglu_backward_cuda(__nv_bfloat16 *dgate, __nv_bfloat16 *dup, const __nv_bfloat16 *dout,
                          const __nv_bfloat16 *gate, const __nv_bfloat16 *up, int64_t n,
                          cudaStream_t stream);

// RoPE angles of N positions, computed once per batch and reused by every layer:
// cos_sin[N, head_dim / 2] = (cos, sin) of pos * inv_freq[i] (rope_inv_freq of theta
// under the scaling), in double and rounded to float, exactly the factors
// rope_forward_cuda multiplies by.
void rope_angles_cuda(float2 *cos_sin, const int32_t *pos, int N, int head_dim, float theta,
                      const RopeScaling *scaling, cudaStream_t stream);

// The stacked projections: one matmul with the weights [q; k; v] (consecutive in the
// ParamTable) gives rows qkv[N, (H + 2 KV) D] = [q | k | v]. split: q[N,H,D] and
// k[N,KV,D] get RoPE with the angles of rope_angles_cuda (the same values as
// rope_forward_cuda), v[N,KV,D] is copied. merge (the backward): dqkv =
// [rope_backward(dq) | rope_backward(dk) | dv], overwritten. cos_sin NULL: q and k are
// copied unrotated too (qk_norm: RoPE follows the norms, qk_norm_rope_*_cuda).
void rope_split_qkv_cuda(__nv_bfloat16 *q, __nv_bfloat16 *k, __nv_bfloat16 *v,
                         const __nv_bfloat16 *qkv, const float2 *cos_sin, int N, int n_heads,
                         int n_kv_heads, int head_dim, cudaStream_t stream);
void rope_merge_qkv_backward_cuda(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dq,
                                  const __nv_bfloat16 *dk, const __nv_bfloat16 *dv,
                                  const float2 *cos_sin, int N, int n_heads, int n_kv_heads,
                                  int head_dim, cudaStream_t stream);

// Qwen3's q_norm / k_norm followed by RoPE, one launch each way (head_dim D one of
// qk_norm_rope_supports_head_dim's). forward: q_out[N,H,D] = rope(rmsnorm(q[N,H,D],
// q_weight[D])) with the angles of rope_angles_cuda, in fp32 and rounded to bf16 once;
// k likewise over [N,KV,D]; q_rstd[N*H], k_rstd[N*KV] saved (NULL: not wanted). backward: from the attention's gradients dq, dk (rotated)
// and dv, dqkv[N, (H + 2 KV) D] = [dq before q_norm | dk before k_norm | dv],
// overwritten; dq_weight[D], dk_weight[D] (fp32) accumulate in a fixed order (NULL both:
// frozen norms, none).
bool qk_norm_rope_supports_head_dim(int head_dim);
void qk_norm_rope_forward_cuda(__nv_bfloat16 *q_out, __nv_bfloat16 *k_out, float *q_rstd,
                               float *k_rstd, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                               const __nv_bfloat16 *q_weight, const __nv_bfloat16 *k_weight,
                               const float2 *cos_sin, int N, int H, int KV, int D, float eps,
                               cudaStream_t stream);
void qk_norm_rope_merge_qkv_backward_cuda(__nv_bfloat16 *dqkv, float *dq_weight, float *dk_weight,
                                          const __nv_bfloat16 *dq, const __nv_bfloat16 *dk,
                                          const __nv_bfloat16 *dv, const __nv_bfloat16 *q,
                                          const __nv_bfloat16 *k, const __nv_bfloat16 *q_weight,
                                          const __nv_bfloat16 *k_weight, const float *q_rstd,
                                          const float *k_rstd, const float2 *cos_sin, int N,
                                          int H, int KV, int D, cudaStream_t stream);

// SwiGLU over stacked rows gate_up[N, 2F] = [gate | up] (one matmul with the weights
// [gate; up]): out[N,F] = silu(gate) * up; the backward overwrites d_gate_up[N, 2F]
// = [d gate | d up] and may alias gate_up. Same arithmetic as swiglu_*_cuda.
void swiglu_stacked_forward_cuda(__nv_bfloat16 *out, const __nv_bfloat16 *gate_up, int N, int F,
                                 cudaStream_t stream);
void swiglu_stacked_backward_cuda(__nv_bfloat16 *d_gate_up, const __nv_bfloat16 *dout,
                                  const __nv_bfloat16 *gate_up, int N, int F,
                                  cudaStream_t stream);

// cuBLASLt, bf16 inputs, fp32 compute. out[N,OC] (bf16) = inp[N,IC] @ weight[OC,IC]^T.
void matmul_forward_cuda(__nv_bfloat16 *out, const __nv_bfloat16 *inp,
                         const __nv_bfloat16 *weight, int N, int IC, int OC, cudaStream_t stream);
// dinp[N,IC] (bf16) += dout @ weight (skipped when dinp is NULL; beta = 1, so the
// sum is rounded to bf16 once per call); dweight[OC,IC] (fp32) += dout^T @ inp,
// accumulated by cuBLASLt directly into the fp32 gradient (beta = 1, fp32 C/D); NULL: a
// frozen weight, no weight-gradient product.
void matmul_backward_cuda(__nv_bfloat16 *dinp, float *dweight, const __nv_bfloat16 *dout,
                          const __nv_bfloat16 *inp, const __nv_bfloat16 *weight, int N, int IC,
                          int OC, cudaStream_t stream);

// As matmul_backward_cuda, but dinp (when not NULL) is OVERWRITTEN with dout @ weight
// (beta = 0: no zeroing pass, no read of the old values); dweight still accumulates.
void matmul_backward_overwrite_cuda(__nv_bfloat16 *dinp, float *dweight,
                                    const __nv_bfloat16 *dout, const __nv_bfloat16 *inp,
                                    const __nv_bfloat16 *weight, int N, int IC, int OC,
                                    cudaStream_t stream);

// Cross-entropy over one chunk of rows: logits[N,V] bf16, targets[N] (-1 = none).
// losses[N] (fp32) = -log softmax[target] (0 where target is -1; NaN where the
// target is outside [-1, V): kernels cannot fail, the caller validates targets).
// dlogits[N,V] (bf16) = (softmax - onehot) * loss_scale, 0 on rows without target;
// dlogits may alias logits (in place). losses or dlogits may be NULL (skipped).
// Unlike the CPU op this returns nothing: sum `losses` when the total is needed.
void cross_entropy_forward_backward_cuda(float *losses, __nv_bfloat16 *dlogits,
                                         const __nv_bfloat16 *logits, const int32_t *targets,
                                         int N, int V, float loss_scale, cudaStream_t stream);

// out[n] = a[n] + b[n] (bf16, summed in fp32); out may alias a or b.
void residual_add_cuda(__nv_bfloat16 *out, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                       int64_t n, cudaStream_t stream);
void float_to_bf16_cuda(__nv_bfloat16 *out, const float *in, int64_t n, cudaStream_t stream);
void bf16_to_float_cuda(float *out, const __nv_bfloat16 *in, int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
