// AdamW on the GPU, the twin of trainer/adamw_cpu.c (trainer/adamw.h): the global
// gradient norm (two fixed-order stages) and the AdamW update with clipping folded in.
#include <math.h>
#include "common/check.h"
#include "model/ops_cuda_internal.cuh"
#include "trainer/adamw.h"

enum { GRAD_NORM_THREADS = 256, GRAD_NORM_FINISH_THREADS = 1024 };

// Stage 1: a fixed grid strides over the buffer, 4 floats per 16-byte load where the
// address allows (a scalar head first); partials[block] = its sum of squares.
__global__ void sum_squares_partials_kernel(float *partials, const float *x, size_t n) {
    const size_t to_aligned = ((16 - (uintptr_t)x % 16) % 16) / sizeof(float);
    const size_t head = to_aligned < n ? to_aligned : n;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    float sum = 0.0f;
    if (tid < head) sum += x[tid] * x[tid];
    const float4 *x4 = reinterpret_cast<const float4 *>(x + head);
    const size_t n4 = (n - head) / 4;
    for (size_t i = tid; i < n4; i += stride) {
        const float4 v = x4[i];
        sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (size_t i = head + 4 * n4 + tid; i < n; i += stride) sum += x[i] * x[i];
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

struct AdamwHyper {
    float step_size, inv_sqrt_bias2, beta1, beta2, eps, decay;
};

// Same arithmetic, in the same order, as adamw_step_cpu in trainer/adamw_cpu.c.
__device__ inline void adamw_element(float &p, float &m, float &v, float g, const AdamwHyper &h) {
    m = h.beta1 * m + (1.0f - h.beta1) * g;
    v = h.beta2 * v + (1.0f - h.beta2) * g * g;
    const float denom = sqrtf(v) * h.inv_sqrt_bias2 + h.eps;
    p = p * h.decay - h.step_size * m / denom;
}

// VEC = 4: 16-byte loads and stores of params, m, v, grads (8-byte bf16 stores); the
// caller checks the alignment. The last n % VEC elements go one by one.
template <int VEC>
__global__ void adamw_kernel(float *params, bf16 *params_bf16, float *m, float *v,
                             const float *grads, size_t n, AdamwHyper h, const float *grad_norm,
                             float max_grad_norm) {
    float clip_scale = 1.0f;
    if (grad_norm && max_grad_norm > 0.0f) {
        const float norm = *grad_norm;
        if (norm > max_grad_norm) clip_scale = (float)((double)max_grad_norm / (norm + 1e-6));
    }
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x, n_packs = n / VEC;
    for (size_t i = tid; i < n_packs; i += stride) {
        Pack<float, VEC> p = reinterpret_cast<const Pack<float, VEC> *>(params)[i];
        Pack<float, VEC> m_i = reinterpret_cast<const Pack<float, VEC> *>(m)[i];
        Pack<float, VEC> v_i = reinterpret_cast<const Pack<float, VEC> *>(v)[i];
        const Pack<float, VEC> g = reinterpret_cast<const Pack<float, VEC> *>(grads)[i];
        Pack<bf16, VEC> p_bf16;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            adamw_element(p.x[j], m_i.x[j], v_i.x[j], g.x[j] * clip_scale, h);
            p_bf16.x[j] = __float2bfloat16_rn(p.x[j]);
        }
        reinterpret_cast<Pack<float, VEC> *>(params)[i] = p;
        reinterpret_cast<Pack<float, VEC> *>(m)[i] = m_i;
        reinterpret_cast<Pack<float, VEC> *>(v)[i] = v_i;
        if (params_bf16) reinterpret_cast<Pack<bf16, VEC> *>(params_bf16)[i] = p_bf16;
    }
    for (size_t i = n_packs * VEC + tid; i < n; i += stride) {
        adamw_element(params[i], m[i], v[i], grads[i] * clip_scale, h);
        if (params_bf16) params_bf16[i] = __float2bfloat16_rn(params[i]);
    }
}

// One contiguous range of n elements; weight_decay 0 for tensors that are not decayed,
// `step` the update count after incrementing.
static void adamw_update_cuda(float *params, bf16 *params_bf16, float *m, float *v,
                              const float *grads, size_t n, float lr, float beta1, float beta2,
                              float eps, float weight_decay, long step, const float *grad_norm,
                              float max_grad_norm, cudaStream_t stream) {
    CHECK(step >= 1, "step %ld must be >= 1 (count after increment)", step);
    if (n == 0) return;
    // Bias corrections in double, folded into the step size and the denominator.
    const double bias1 = 1.0 - pow(beta1, (double)step);
    const double bias2 = 1.0 - pow(beta2, (double)step);
    const float step_size = (float)(lr / bias1);
    const float inv_sqrt_bias2 = (float)(1.0 / sqrt(bias2));
    const float decay = 1.0f - lr * weight_decay;
    const AdamwHyper h = {step_size, inv_sqrt_bias2, beta1, beta2, eps, decay};
    const bool packed = pack_aligned(params, 16) && pack_aligned(m, 16) && pack_aligned(v, 16) &&
                        pack_aligned(grads, 16) && (!params_bf16 || pack_aligned(params_bf16, 8));
    if (packed)
        adamw_kernel<4><<<grid_for((int64_t)(n / 4 + 1), ELEMENTWISE_THREADS),
                          ELEMENTWISE_THREADS, 0, stream>>>(params, params_bf16, m, v, grads, n,
                                                            h, grad_norm, max_grad_norm);
    else
        adamw_kernel<1><<<grid_for((int64_t)n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0,
                          stream>>>(params, params_bf16, m, v, grads, n, h, grad_norm,
                                    max_grad_norm);
    cudaCheckLaunch();
}

void adamw_step_cuda(AdamWState *s, const ParamTable *table, const AdamWHyper *h, float *params,
                     const float *grads, bf16 *params_bf16, const float *grad_norm,
                     float max_grad_norm, cudaStream_t stream) {
    CHECK(s->n == table->total, "optimizer state has %zu elements, model %zu", s->n, table->total);
    s->step++;
    for (int first = 0, last; first < table->n_tensors; first = last) {
        const bool decays = adamw_decays(&table->tensors[first], h);
        for (last = first + 1; last < table->n_tensors; last++)
            if (adamw_decays(&table->tensors[last], h) != decays ||
                table->tensors[last].offset !=
                    table->tensors[last - 1].offset + table->tensors[last - 1].numel)
                break;
        const size_t off = table->tensors[first].offset;
        const size_t n = table->tensors[last - 1].offset + table->tensors[last - 1].numel - off;
        adamw_update_cuda(params + off, params_bf16 ? params_bf16 + off : nullptr, s->m + off,
                          s->v + off, grads + off, n, h->lr, h->beta1, h->beta2, h->eps,
                          decays ? h->weight_decay : 0.0f, s->step, grad_norm, max_grad_norm,
                          stream);
    }
}
