// A decoder behind function pointers (the seam of trainer/backend.h, for inference):
// model/decode.h on the CPU; the CUDA decoder (model/decode_cuda.h,
// trainer/decode_ops_cuda.h) plugs in the same way. trainer/generate.h's decode_ops
// picks one for a backend.
#pragma once
#include <stdint.h>
#include "model/model.h"

typedef struct {
    const char *name;
    // A KV cache for max_seqs sequences of max_len tokens, running the fp32 host
    // weights params [param table total] (a backend may copy and convert them).
    void *(*create)(const ModelConfig *cfg, const float *params, int max_seqs, int max_len);
    void (*destroy)(void *decoder);
    void (*reset)(void *decoder, int slot);
    // cpu_decoder_forward's contract (host arrays): n tokens, logits [n, vocab_size].
    void (*forward)(void *decoder, int n, const int32_t *slot, const int32_t *token,
                    const int32_t *pos, float *logits);
} DecodeOps;
