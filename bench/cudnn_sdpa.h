// cuDNN's fused attention forward (SDPA, causal, bf16) as a baseline for bench_attention,
// built through the cuDNN backend (graph) API. libcudnn is loaded at run time with dlopen,
// so the benchmark links nothing of cuDNN and bench/device_bundle.sh never bundles it
// (hundreds of MB): the GPU machine has it system-wide. Benchmark code, not a library.
#pragma once
#include <stddef.h>
#include <cuda_runtime_api.h>

typedef struct CudnnSdpa CudnnSdpa;

// One causal SDPA forward graph for q, out [1, S, H, D] and k, v [1, S, KV, D] (bf16,
// the row-major layout of attention_cuda.h) with stats [1, H, S] fp32 (natural-log LSE).
// Returns NULL with the reason in why when cuDNN is not there or no engine supports it.
CudnnSdpa *cudnn_sdpa_create(int S, int H, int KV, int D, float scale, char *why, size_t why_len);
// Runs the plan on `stream` (asynchronous); 0 on success, else writes why.
int cudnn_sdpa_run(CudnnSdpa *s, const void *q, const void *k, const void *v, void *out,
                   float *stats, cudaStream_t stream, char *why, size_t why_len);
void cudnn_sdpa_destroy(CudnnSdpa *s);
