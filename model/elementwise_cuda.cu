// Elementwise CUDA helpers: fp32 <-> bf16 conversion and the residual add.
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

__global__ void float_to_bf16_kernel(bf16 *out, const float *in, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void bf16_to_float_kernel(float *out, const bf16 *in, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

__global__ void residual_add_kernel(bf16 *out, const bf16 *a, const bf16 *b, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

void float_to_bf16_cuda(bf16 *out, const float *in, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    float_to_bf16_kernel<<<grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        out, in, n);
    cudaCheckLaunch();
}

void bf16_to_float_cuda(float *out, const bf16 *in, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    bf16_to_float_kernel<<<grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        out, in, n);
    cudaCheckLaunch();
}

void residual_add_cuda(bf16 *out, const bf16 *a, const bf16 *b, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    residual_add_kernel<<<grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        out, a, b, n);
    cudaCheckLaunch();
}
