// Token embedding on the GPU (twin of embedding_*_cpu): the forward gathers rows of
// the table, the backward sums rows per token in a fixed order after a stable sort.
#include <cub/device/device_radix_sort.cuh>
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

enum { ROW_COPY_THREADS = 256, EMBEDDING_THREADS = 256 };

// dst[r, :] = src[slots[r], :] for r < rows (one block per row).
__global__ void gather_rows_kernel(bf16 *dst, const bf16 *src, const int32_t *slots, int C) {
    const int64_t r = blockIdx.x;
    const bf16 *from = src + (int64_t)slots[r] * C;
    bf16 *to = dst + r * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) to[c] = from[c];
}

// dst[slots[r], :] = src[r, :] for r < rows (slots distinct, so no two blocks collide).
__global__ void scatter_rows_kernel(bf16 *dst, const bf16 *src, const int32_t *slots, int C) {
    const int64_t r = blockIdx.x;
    const bf16 *from = src + r * C;
    bf16 *to = dst + (int64_t)slots[r] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) to[c] = from[c];
}

void gather_rows_cuda(bf16 *dst, const bf16 *src, const int32_t *slots, int rows, int C,
                      cudaStream_t stream) {
    if (rows == 0) return;
    gather_rows_kernel<<<rows, ROW_COPY_THREADS, 0, stream>>>(dst, src, slots, C);
    cudaCheckLaunch();
}

void scatter_rows_cuda(bf16 *dst, const bf16 *src, const int32_t *slots, int rows, int C,
                       cudaStream_t stream) {
    if (rows == 0) return;
    scatter_rows_kernel<<<rows, ROW_COPY_THREADS, 0, stream>>>(dst, src, slots, C);
    cudaCheckLaunch();
}

// Scratch bytes CUB's radix sort needs for n (token, row) pairs; a pure host query.
size_t embedding_sort_temp_bytes(int n) {
    size_t bytes = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const int32_t *)nullptr,
                                              (int32_t *)nullptr, (const int32_t *)nullptr,
                                              (int32_t *)nullptr, n));
    return bytes;
}

// One block per position of the sorted token list; only the first position of
// each run of equal tokens works: it walks that token's rows (ascending, as the
// sort is stable) in chunks of blockDim rows staged in shared memory, and adds
// each chunk's sum to the token's dwte row. Each dwte row has exactly one writer
// and a fixed summation order; the staged row list keeps the dout loads of a long
// run (a frequent token) independent of each other instead of a dependent chain.
__global__ void embedding_backward_kernel(float *dwte, const bf16 *dout,
                                          const int32_t *sorted_tokens,
                                          const int32_t *sorted_rows, int N, int C) {
    __shared__ int32_t chunk_rows[EMBEDDING_THREADS];
    const int first = blockIdx.x;
    const int32_t token = sorted_tokens[first];
    if (first > 0 && sorted_tokens[first - 1] == token) return;
    float *dst = dwte + (int64_t)token * C;
    for (int chunk = first;; chunk += EMBEDDING_THREADS) {
        const int j = chunk + threadIdx.x;
        const bool in_run = j < N && sorted_tokens[j] == token;
        chunk_rows[threadIdx.x] = in_run ? sorted_rows[j] : 0;
        // Sorted keys: the run's entries are a prefix of the chunk.
        const int n_rows = __syncthreads_count(in_run);
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float sum = 0.0f;
#pragma unroll 8
            for (int k = 0; k < n_rows; k++)
                sum += __bfloat162float(dout[(int64_t)chunk_rows[k] * C + c]);
            if (n_rows > 0) dst[c] += sum;
        }
        if (n_rows < EMBEDDING_THREADS) break;
        __syncthreads();  // every thread is done with chunk_rows before it is refilled
    }
}

void embedding_forward_cuda(bf16 *out, const int32_t *tokens, const bf16 *wte, int N, int C,
                            cudaStream_t stream) {
    CHECK(N >= 0 && C > 0, "embedding_forward_cuda: bad shape N=%d C=%d", N, C);
    gather_rows_cuda(out, wte, tokens, N, C, stream);
}

void embedding_backward_cuda(float *dwte, const bf16 *dout, const int32_t *tokens, int N, int C,
                             cudaStream_t stream) {
    const OpsCudaState *s = ops_cuda_state_for_tokens("embedding_backward_cuda", N, C);
    if (N == 0) return;
    size_t temp_bytes = embedding_sort_temp_bytes(N);
    CHECK(temp_bytes <= s->sort_temp_bytes,
          "embedding_backward_cuda: sort needs %zu scratch bytes, init made %zu", temp_bytes,
          s->sort_temp_bytes);
    cudaCheck(cub::DeviceRadixSort::SortPairs(s->sort_temp, temp_bytes, tokens, s->sort_keys_out,
                                              s->sort_values_in, s->sort_values_out, N, 0,
                                              (int)(8 * sizeof(int32_t)), stream));
    // EMBEDDING_THREADS per block: the kernel stages that many rows per chunk.
    embedding_backward_kernel<<<N, EMBEDDING_THREADS, 0, stream>>>(
        dwte, dout, s->sort_keys_out, s->sort_values_out, N, C);
    cudaCheckLaunch();
}
