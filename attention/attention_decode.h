// Decode attention: one query per token against its sequence's KV cache (KV-cache
// autoregressive decoding, model/decode_cuda.h). The CPU fp32 version is the oracle;
// the CUDA bf16 twin (attention_decode_cuda.h) takes the same arguments in the same order.
//
// Layouts (row-major):
//   q, out:           [n_tokens, n_heads, head_dim]
//   k_cache, v_cache: [n_seqs, max_len, n_kv_heads, head_dim]  (GQA: n_heads % n_kv_heads == 0)
//   slot:             [n_tokens] the sequence (cache row) of each token, in [0, n_seqs)
//   n_keys:           [n_tokens] token i attends to cache positions [0, n_keys[i]) of its
//                      slot, n_keys[i] in [0, max_keys]; 0 keys give a zero output
#pragma once
#include <stdint.h>

typedef struct {
    int n_tokens, n_heads, n_kv_heads, head_dim;
    int n_seqs, max_len;  // the cache's first two dimensions
    int max_keys;         // bound of every n_keys[i], <= max_len (sizes the CUDA split-K grid)
    float scale;          // softmax scale, usually 1/sqrt(head_dim)
} DecodeShape;

void attention_decode_cpu(const DecodeShape *shape, const float *q, const float *k_cache,
                          const float *v_cache, const int32_t *slot, const int32_t *n_keys,
                          float *out);

// Fatal (CHECK) unless the shape is one the functions run: positive sizes, GQA groups,
// max_keys within the cache. Both versions call it.
void decode_shape_check(const DecodeShape *shape);
