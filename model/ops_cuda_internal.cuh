// Shared by the CUDA op files (model/*_cuda.cu) and the CUDA AdamW (trainer/adamw_cuda.cu),
// not part of the ops interface: launch-size helpers, warp/block reductions, and access to
// the process-wide state that ops_cuda_init creates (model/ops_cuda_state.cu).
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
// The state, after checking that an N x C call of `op` fits the scratch made at init.
const OpsCudaState *ops_cuda_state_for_tokens(const char *op, int N, int C);

// Scratch bytes of the embedding backward's radix sort of n (token, row) pairs; a pure
// host query (model/embedding_cuda.cu), which ops_cuda_init sizes the scratch by.
size_t embedding_sort_temp_bytes(int n);

// Row groups of rmsnorm's dweight reduction and blocks of the grad-norm reduction;
// fixed (not device-dependent) so results are identical on any GPU.
enum { RMSNORM_MAX_GROUPS = 256, GRAD_NORM_BLOCKS = 1024 };

// Row copies by slot, C bf16 channels per row, one block per row (model/embedding_cuda.cu;
// the embedding forward is a gather from the table): gather dst[r, :] = src[slots[r], :],
// scatter dst[slots[r], :] = src[r, :] (slots distinct), for r < rows.
void gather_rows_cuda(bf16 *dst, const bf16 *src, const int32_t *slots, int rows, int C,
                      cudaStream_t stream);
void scatter_rows_cuda(bf16 *dst, const bf16 *src, const int32_t *slots, int rows, int C,
                       cudaStream_t stream);

// Empties matmul_cuda.cu's cache of cuBLASLt plans (ops_cuda_destroy calls it).
void matmul_plans_clear(void);

// VEC consecutive values moved as one access: 16 bytes for 8 bf16 or 4 floats (the
// widest load a thread can issue), down to one element for the unaligned fallback.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
    T x[VEC];
};

template <int VEC>
__device__ inline Pack<bf16, VEC> load_bf16s(const bf16 *p) {
    return *reinterpret_cast<const Pack<bf16, VEC> *>(p);
}
template <int VEC>
__device__ inline void store_bf16s(bf16 *p, const Pack<bf16, VEC> &v) {
    *reinterpret_cast<Pack<bf16, VEC> *>(p) = v;
}

// True when p may be read as Pack<T, VEC> (its address a multiple of the pack size).
static inline bool pack_aligned(const void *p, size_t pack_bytes) {
    return (uintptr_t)p % pack_bytes == 0;
}
