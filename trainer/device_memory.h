// The CUDA backend's device memory, estimated before anything is allocated:
// a micro-batch or a model too large for the GPU is refused naming the keys that decide
// it, instead of a CUDA "out of memory" midway. Pure arithmetic (no CUDA), so the CPU
// tests check it. The activation arena is the layout cuda_model_create carves
// (model/model_arena.h); tests/test_device_memory_cuda.cu checks it against the arena
// the model really allocates.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "model/model.h"

typedef struct {
    size_t state;      // bf16 weights + their low halves (the fp32 master), fp32 gradients,
                       // AdamW m, v
    size_t arena;      // the model's activation arena for micro_rows x seq_len, with the
                       // attention backward's workspace (cuda_arena_layout)
    size_t scratch;    // the ops' process-wide scratch (cuBLASLt workspace, embedding sort,
                       // norm partials) and a margin for the CUDA runtime's own allocations
    size_t total;
    long long tokens;  // micro_rows x seq_len
} CudaMemoryEstimate;

// attn_workspace_bytes: the attention backward's workspace for micro_rows x seq_len
// (cuda_model_attention_workspace_bytes, model/model_cuda.h, in a CUDA build);
// recompute as cuda_model_create's.
CudaMemoryEstimate cuda_memory_estimate(const ModelConfig *mc, int micro_rows, int seq_len,
                                        ModelRecompute recompute, size_t attn_workspace_bytes);

// Refuses an estimate above free_bytes (what cudaMemGetInfo reports free), or a
// micro-batch of more tokens than the kernels index (2^31 - 1), with a message naming
// the estimate, what is free of total_bytes, and the keys: train.micro_rows x
// data.seq_len for the arena, the model.* sizes for the state. Returns 0 or -1.
int cuda_memory_check(const CudaMemoryEstimate *e, size_t free_bytes, size_t total_bytes,
                      int micro_rows, int seq_len, char *err, size_t err_len);
