// Elementwise CUDA helpers: fp32 <-> bf16 conversion, the residual add, Linear biases.
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

// ---------------------------------------------------------------- Linear biases

__global__ void bias_forward_kernel(bf16 *out, const bf16 *bias, int N, int C) {
    const int64_t total = (int64_t)N * C;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x)
        out[idx] = __float2bfloat16_rn(__bfloat162float(out[idx]) +
                                       __bfloat162float(bias[idx % C]));
}

void bias_forward_cuda(bf16 *out, const bf16 *bias, int N, int C, cudaStream_t stream) {
    CHECK(N >= 0 && C > 0, "bias_forward_cuda: bad shape N=%d C=%d", N, C);
    if (N == 0) return;
    bias_forward_kernel<<<grid_for((int64_t)N * C, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0,
                          stream>>>(out, bias, N, C);
    cudaCheckLaunch();
}

// A block per 32 columns: its BIAS_ROW_LANES rows of threads each sum a fixed stride of
// rows, then lane 0 of each column adds the partial sums in order: deterministic.
enum { BIAS_COLUMNS = 32, BIAS_ROW_LANES = 8 };
__global__ void bias_backward_kernel(float *dbias, const bf16 *dout, int N, int C) {
    __shared__ float partial[BIAS_ROW_LANES][BIAS_COLUMNS];
    const int c = blockIdx.x * BIAS_COLUMNS + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += BIAS_ROW_LANES)
            acc += __bfloat162float(dout[(int64_t)n * C + c]);
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sum = 0.0f;
        for (int r = 0; r < BIAS_ROW_LANES; r++) sum += partial[r][threadIdx.x];
        dbias[c] += sum;
    }
}

void bias_backward_cuda(float *dbias, const bf16 *dout, int N, int C, cudaStream_t stream) {
    CHECK(N >= 0 && C > 0, "bias_backward_cuda: bad shape N=%d C=%d", N, C);
    if (N == 0) return;
    const dim3 block(BIAS_COLUMNS, BIAS_ROW_LANES);
    bias_backward_kernel<<<(C + BIAS_COLUMNS - 1) / BIAS_COLUMNS, block, 0, stream>>>(dbias, dout,
                                                                                     N, C);
    cudaCheckLaunch();
}
