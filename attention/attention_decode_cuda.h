// Decode attention on the GPU (bf16 in/out, fp32 accumulation), the twin of
// attention_decode.h's CPU oracle: the same parameters in the same order with bf16
// tensors and device pointers (q, k_cache, v_cache, slot, n_keys, out), plus a
// caller-provided workspace and a trailing stream. Asynchronous on `stream`.
// Any even head_dim up to 256; n_heads / n_kv_heads at most 32.
// Split-K: long caches are cut into splits of whole 32-key steps that separate blocks
// reduce, merged by a second kernel. The split count depends only on the shape (not
// on the device), so results are reproducible run to run and across GPUs.
#pragma once
#include <stddef.h>
#include "attention/attention_cuda.h"  // attn_bf16

#ifdef __cplusplus
extern "C" {  // the C header below carries no guards of its own
#endif
#include "attention/attention_decode.h"

// Workspace bytes for every call whose n_tokens and max_keys do not exceed the shape's.
size_t attention_decode_workspace_bytes(const DecodeShape *shape);
// workspace: device memory of at least attention_decode_workspace_bytes(shape) bytes,
// 16-byte aligned, scratch of the call's kernels until they finish on `stream`.
void attention_decode_cuda(const DecodeShape *shape, const attn_bf16 *q,
                           const attn_bf16 *k_cache, const attn_bf16 *v_cache,
                           const int32_t *slot, const int32_t *n_keys, attn_bf16 *out,
                           void *workspace, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
