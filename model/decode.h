// KV-cache autoregressive decoding, CPU fp32: the inference-side twin of
// cpu_model_logits. Each of up to max_seqs sequences ("slots") keeps the keys and
// values of its tokens (after RoPE, so a position is whatever the caller gives);
// a call feeds any mix of prompt tokens (prefill) and single next tokens of several
// slots and returns their logits. The CUDA twin is model/decode_cuda.h (bf16).
#pragma once
#include <stdint.h>
#include "model/model.h"

typedef struct CpuDecoder CpuDecoder;
// A KV cache for up to max_seqs sequences of up to max_len tokens each.
CpuDecoder *cpu_decoder_create(const ModelConfig *cfg, int max_seqs, int max_len);
void cpu_decoder_free(CpuDecoder *d);
void cpu_decoder_reset(CpuDecoder *d, int slot);  // empties one sequence's cache
// Feeds n tokens: token[i] at position pos[i] is appended to the cache of sequence
// slot[i] (a slot may appear several times, in order: a prompt's prefill) and attends to
// every earlier token of its slot and itself. Writes the logits of token i into
// logits[i * vocab_size] (logits [n, vocab_size], host memory). Fatal if a slot, token
// or position is out of range or a sequence would pass max_len tokens (nothing is
// appended then: model_decode_check).
void cpu_decoder_forward(CpuDecoder *d, const float *params, int n, const int32_t *slot,
                         const int32_t *token, const int32_t *pos, float *logits);
// Tokens now in the cache of one slot.
int cpu_decoder_length(const CpuDecoder *d, int slot);
