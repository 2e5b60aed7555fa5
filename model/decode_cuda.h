// KV-cache autoregressive decoding on the GPU (bf16 weights, activations and cache, fp32
// accumulation): the twin of model/decode.h's CpuDecoder, same calls, same semantics.
// The model is model_cuda.cu's forward with n fed tokens as the rows: the same ops
// (model/ops_cuda.h), every architecture the trainer runs (llama, qwen2's q/k/v biases,
// qwen3's q_norm/k_norm, GQA, head_dim != hidden / heads, tied or untied head), and
// attention over the cache by attention/attention_decode_cuda.h (any even head_dim <= 256).
//
// Memory: the KV cache is bf16 [max_seqs, max_len, kv_heads, head_dim] for K and for V
// per layer, allocated at creation with the activations of one chunk of tokens (a call
// with more tokens runs chunk by chunk, in order). The weights belong to the caller
// (device bf16 [ParamTable.total], the ParamTable's offsets, as cuda_model_forward takes).
// Requires ops_cuda_init (any sizes: the decoder runs forward ops only, which need the
// cuBLASLt handle). Work runs on the decoder's own stream; cuda_decoder_forward returns
// when the logits are in host memory. The matmuls share the ops' cuBLASLt workspace with
// any CudaModel, so a decoder call must not overlap a model step (one host thread, as the
// trainer runs them, is fine: both return synchronised).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {  // model.h is a plain C header without guards of its own
#endif
#include "model/model.h"

typedef struct CudaDecoder CudaDecoder;

// Validates the config (model_dims; head_dim even and <= 256, at most 32 query heads per
// KV head: fatal, naming the fields) and allocates max_seqs caches of max_len tokens.
CudaDecoder *cuda_decoder_create(const ModelConfig *cfg, int max_seqs, int max_len);
void cuda_decoder_free(CudaDecoder *d);
// Empties one sequence's cache (its next token goes to cache position 0).
void cuda_decoder_reset(CudaDecoder *d, int slot);
// Feeds n tokens (host arrays): token[i] at RoPE position pos[i] is appended to the cache
// of sequence slot[i] (a slot may appear several times, in order: a prompt's prefill)
// and attends to every earlier token of its slot and itself. Writes the logits of token
// i into logits[i * vocab_size] (host fp32, [n, vocab_size]; bf16 precision). Fatal if a
// slot, token or position is out of range or a sequence would exceed max_len tokens
// (nothing is appended then).
void cuda_decoder_forward(CudaDecoder *d, const void *params_bf16, int n, const int32_t *slot,
                          const int32_t *token, const int32_t *pos, float *logits);

// Tokens in a cache: how many have been fed to a slot since its last reset.
int cuda_decoder_length(const CudaDecoder *d, int slot);
// Caps the tokens of one chunk (default 1024, clamped to [1, the default]); tests use
// it to cut a prefill across chunks.
void cuda_decoder_set_chunk_tokens(CudaDecoder *d, int tokens);
// Bytes of the KV cache and of the activations (for memory reports).
size_t cuda_decoder_cache_bytes(const CudaDecoder *d);
size_t cuda_decoder_arena_bytes(const CudaDecoder *d);

#ifdef __cplusplus
}
#endif
