// Optimizer kernels, twins of trainer/optim.c: the global gradient norm (two
// fixed-order stages) and the AdamW update with clipping folded in.
#include <math.h>
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

enum { GRAD_NORM_THREADS = 256, GRAD_NORM_FINISH_THREADS = 1024 };

// Stage 1: a fixed grid strides over the buffer; partials[block] = its sum of squares.
__global__ void sum_squares_partials_kernel(float *partials, const float *x, size_t n) {
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        sum += x[i] * x[i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Stage 2: one block sums the partials and takes the square root.
__global__ void sqrt_of_partials_sum_kernel(float *out, const float *partials, int n_partials) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n_partials; i += blockDim.x) sum += partials[i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *out = sqrtf(sum);
}

void grad_global_norm_cuda(float *norm_out, const float *grads, size_t n, cudaStream_t stream) {
    const OpsCudaState *s = ops_cuda_state("grad_global_norm_cuda");
    sum_squares_partials_kernel<<<GRAD_NORM_BLOCKS, GRAD_NORM_THREADS, 0, stream>>>(s->partials,
                                                                                   grads, n);
    cudaCheckLaunch();
    sqrt_of_partials_sum_kernel<<<1, GRAD_NORM_FINISH_THREADS, 0, stream>>>(norm_out, s->partials,
                                                                           GRAD_NORM_BLOCKS);
    cudaCheckLaunch();
}

// Same arithmetic, in the same order, as adamw_step in trainer/optim.c.
__global__ void adamw_kernel(float *params, bf16 *params_bf16, float *m, float *v,
                             const float *grads, size_t n, float step_size, float inv_sqrt_bias2,
                             float beta1, float beta2, float eps, float decay,
                             const float *grad_norm, float max_grad_norm) {
    float clip_scale = 1.0f;
    if (grad_norm && max_grad_norm > 0.0f) {
        const float norm = *grad_norm;
        if (norm > max_grad_norm) clip_scale = (float)((double)max_grad_norm / (norm + 1e-6));
    }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = grads[i] * clip_scale;
        const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
        const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
        const float denom = sqrtf(v_i) * inv_sqrt_bias2 + eps;
        const float p = params[i] * decay - step_size * m_i / denom;
        m[i] = m_i;
        v[i] = v_i;
        params[i] = p;
        if (params_bf16) params_bf16[i] = __float2bfloat16_rn(p);
    }
}

void adamw_update_cuda(float *params, bf16 *params_bf16, float *m, float *v, const float *grads,
                       size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                       long step, const float *grad_norm, float max_grad_norm,
                       cudaStream_t stream) {
    if (step < 1) fatal("adamw_update_cuda: step %ld must be >= 1 (count after increment)", step);
    if (n == 0) return;
    // Bias corrections in double, folded into the step size and the denominator.
    const double bias1 = 1.0 - pow(beta1, (double)step);
    const double bias2 = 1.0 - pow(beta2, (double)step);
    const float step_size = (float)(lr / bias1);
    const float inv_sqrt_bias2 = (float)(1.0 / sqrt(bias2));
    const float decay = 1.0f - lr * weight_decay;
    adamw_kernel<<<grid_for((int64_t)n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        params, params_bf16, m, v, grads, n, step_size, inv_sqrt_bias2, beta1, beta2, eps, decay,
        grad_norm, max_grad_norm);
    cudaCheckLaunch();
}
