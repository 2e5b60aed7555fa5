// Shared by the model/*_cuda.cu files only (not part of the ops interface):
// launch-size helpers, warp/block reductions, and access to the process-wide
// state that ops_cuda_init creates (model/ops_cuda.cu).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include "common/cuda_check.h"

typedef __nv_bfloat16 bf16;

#define cublasCheck(call)                                                            \
    do {                                                                             \
        cublasStatus_t status_ = (call);                                             \
        if (status_ != CUBLAS_STATUS_SUCCESS)                                        \
            fatal("cuBLAS error %d at %s:%d: %s", (int)status_, __FILE__, __LINE__,  \
                  cublasLtGetStatusString(status_));                                 \
    } while (0)

enum { ELEMENTWISE_THREADS = 256 };

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, capped
// so the grid dimension stays far below its limit whatever n is.
static inline unsigned grid_for(int64_t n, int threads) {
    const int64_t max_blocks = 1 << 16;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > max_blocks) blocks = max_blocks;
    return (unsigned)(blocks > 0 ? blocks : 1);
}

__device__ inline float warp_reduce_sum(float x) {
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Sum over the whole block, in a fixed order (deterministic); every thread gets it.
// blockDim.x must be a multiple of 32. Contains __syncthreads: call from all threads.
__device__ inline float block_reduce_sum(float x) {
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int n_warps = blockDim.x / 32;
    x = warp_reduce_sum(x);
    __syncthreads();  // warp_sums may still be read by a previous call
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    x = lane < n_warps ? warp_sums[lane] : 0.0f;
    return warp_reduce_sum(x);
}

// State owned by ops_cuda_init / ops_cuda_destroy (fatal if used before init).
typedef struct {
    int max_tokens, max_channels;
    cublasLtHandle_t cublaslt;
    void *cublaslt_workspace;  // [CUBLASLT_WORKSPACE_BYTES]
    size_t cublaslt_workspace_bytes;
    // embedding backward: stable sort of (token, index) pairs
    int32_t *sort_keys_out;    // [max_tokens]
    int32_t *sort_values_in;   // [max_tokens]
    int32_t *sort_values_out;  // [max_tokens]
    void *sort_temp;           // [sort_temp_bytes] CUB radix-sort scratch
    size_t sort_temp_bytes;
    // two-stage reductions: per-group partial sums
    float *partials;           // [partials_len]
    size_t partials_len;
} OpsCudaState;

const OpsCudaState *ops_cuda_state(const char *op);

// Row groups of rmsnorm's dweight reduction and blocks of the grad-norm reduction;
// fixed (not device-dependent) so results are identical on any GPU.
enum { RMSNORM_MAX_GROUPS = 256, GRAD_NORM_BLOCKS = 1024 };
