// Block-sparse flash attention on the GPU (bf16 in/out, fp32 accumulation), the twin of
// attention.h's CPU oracle: the same parameters in the same order, with bf16 tensors,
// device pointers, a trailing stream, and for the backward a determinism flag and a
// caller-provided workspace.
//
// Layouts (row-major, device memory, exactly attention.h's):
//   q, out, dq, dout: [batch, seq_len, n_heads, head_dim]         bf16
//   k, v, dk, dv:     [batch, seq_len, n_kv_heads, head_dim]      bf16 (GQA: n_heads % n_kv_heads == 0)
//   lse:              [batch, n_heads, seq_len]  fp32, natural-log sum-exp of the scaled
//                      scores; -INFINITY for a query that sees no key (its output is 0)
//   mask:             an AttnMask whose intervals and lists live on the device
//                      (mask_cuda.h: attn_mask_upload or attn_mask_build_cuda), with
//                      ATTN_TILE x ATTN_TILE tiles; the struct itself is read on the host.
// head_dim must be 64 or 128. Every call is asynchronous on `stream`. The kernels use
// Hopper instructions (wgmma, bulk asynchronous copies): sm_90a only, like the build.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "attention/mask_cuda.h"  // the device mask the kernels take

#ifdef __cplusplus
#include <cuda_bf16.h>
typedef __nv_bfloat16 attn_bf16;
extern "C" {  // the C headers below carry no guards of their own
#else
typedef uint16_t attn_bf16;  // bit pattern of a bf16 (C has no __nv_bfloat16)
#endif
#include "attention/attention.h"

// Forward. Overwrites out and lse. Visits only the non-empty tiles of the query-major
// lists; per-element mask tests only on partial tiles.
void attention_forward_cuda(const AttnShape *shape, const AttnMask *mask, const attn_bf16 *q,
                            const attn_bf16 *k, const attn_bf16 *v, attn_bf16 *out, float *lse,
                            cudaStream_t stream);

// Backward. Overwrites dq, dk, dv (not accumulated); GQA gradients summed over the query
// heads sharing a KV head (per-head partials added in a fixed order, no atomics). dK/dV
// iterate the key-major lists. dQ is summed over key blocks by reductions in L2:
// deterministic == false adds fp32 (not reproducible bit for bit); deterministic == true
// adds 32-bit fixed point, each query row scaled by a power of two from a bound on its dQ
// (max|K| (||dO_q|| max_k ||V_k|| + |rowsum(dO_q O_q)|), which holds when lse is the
// forward's; each key block's partial is rounded to within 2^-29 of that bound), so that
// every gradient is bitwise identical run to run. A row whose inputs are not finite comes
// out NaN in both modes.
// workspace: device memory of at least attention_backward_workspace_bytes(shape,
// deterministic) bytes, 256-byte aligned, which the call's kernels use as scratch until
// they finish on `stream`; the backward allocates nothing.
size_t attention_backward_workspace_bytes(const AttnShape *shape, bool deterministic);
void attention_backward_cuda(const AttnShape *shape, const AttnMask *mask, const attn_bf16 *q,
                             const attn_bf16 *k, const attn_bf16 *v, const attn_bf16 *out,
                             const float *lse,
                             const attn_bf16 *dout, attn_bf16 *dq, attn_bf16 *dk, attn_bf16 *dv,
                             bool deterministic, void *workspace, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
