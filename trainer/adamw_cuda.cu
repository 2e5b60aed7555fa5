// AdamW on the GPU, the twin of trainer/adamw_cpu.c (trainer/adamw.h): the global
// gradient norm (two fixed-order stages) and the AdamW update with clipping folded in,
// on master weights split into bf16 high and 16-bit low halves (trainer/split_float.h).
#include <math.h>
#include "common/check.h"
#include "model/ops_cuda_internal.cuh"
#include "trainer/adamw.h"
#include "trainer/split_float.h"

enum { GRAD_NORM_THREADS = 256, GRAD_NORM_FINISH_THREADS = 1024 };

// The fp32 values a norm reads: a plain buffer, or split master weights decoded
// (trainer/split_float.h). to_aligned: the elements before the first 4-wide load.
struct FloatValues {
    const float *x;
    size_t to_aligned() const { return ((16 - (uintptr_t)x % 16) % 16) / sizeof(float); }
    __device__ float at(size_t i) const { return x[i]; }
    __device__ float4 at4(size_t i) const { return *reinterpret_cast<const float4 *>(x + i); }
};

struct SplitValues {
    const uint16_t *hi, *lo;
    size_t to_aligned() const {  // both halves 8-byte aligned at the same element, or no packs
        const size_t head = ((8 - (uintptr_t)hi % 8) % 8) / sizeof(uint16_t);
        return (uintptr_t)hi % 8 == (uintptr_t)lo % 8 ? head : SIZE_MAX;
    }
    __device__ float at(size_t i) const { return __uint_as_float(split_float_join(hi[i], lo[i])); }
    __device__ float4 at4(size_t i) const {
        const Pack<uint16_t, 4> h = *reinterpret_cast<const Pack<uint16_t, 4> *>(hi + i);
        const Pack<uint16_t, 4> l = *reinterpret_cast<const Pack<uint16_t, 4> *>(lo + i);
        return make_float4(__uint_as_float(split_float_join(h.x[0], l.x[0])),
                           __uint_as_float(split_float_join(h.x[1], l.x[1])),
                           __uint_as_float(split_float_join(h.x[2], l.x[2])),
                           __uint_as_float(split_float_join(h.x[3], l.x[3])));
    }
};

// Stage 1: a fixed grid strides over the values, 4 per load where the address allows
// (a scalar head of `head` elements first); partials[block] = its sum of squares.
template <typename Values>
__global__ void sum_squares_partials_kernel(float *partials, Values x, size_t head, size_t n) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    float sum = 0.0f;
    if (tid < head) {
        const float a = x.at(tid);
        sum += a * a;
    }
    const size_t n4 = (n - head) / 4;
    for (size_t i = tid; i < n4; i += stride) {
        const float4 v = x.at4(head + 4 * i);
        sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (size_t i = head + 4 * n4 + tid; i < n; i += stride) {
        const float a = x.at(i);
        sum += a * a;
    }
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

template <typename Values>
static void global_norm_cuda(float *norm_out, Values x, size_t n, cudaStream_t stream) {
    const OpsCudaState *s = ops_cuda_state("grad_global_norm_cuda");
    const size_t head = x.to_aligned() < n ? x.to_aligned() : n;
    sum_squares_partials_kernel<<<GRAD_NORM_BLOCKS, GRAD_NORM_THREADS, 0, stream>>>(s->partials,
                                                                                   x, head, n);
    cudaCheckLaunch();
    sqrt_of_partials_sum_kernel<<<1, GRAD_NORM_FINISH_THREADS, 0, stream>>>(norm_out, s->partials,
                                                                           GRAD_NORM_BLOCKS);
    cudaCheckLaunch();
}

void grad_global_norm_cuda(float *norm_out, const float *grads, size_t n, cudaStream_t stream) {
    global_norm_cuda(norm_out, FloatValues{grads}, n, stream);
}

void split_global_norm_cuda(float *norm_out, const bf16 *hi, const uint16_t *lo, size_t n,
                            cudaStream_t stream) {
    global_norm_cuda(norm_out, SplitValues{reinterpret_cast<const uint16_t *>(hi), lo}, n,
                     stream);
}

struct AdamwHyper {
    float step_size, inv_sqrt_bias2, beta1, beta2, eps, decay;
};

// Same arithmetic, in the same order, as adamw_step_cpu in trainer/adamw_cpu.c, bit for
// bit: the _rn intrinsics keep nvcc from contracting a multiply and an add into an FMA
// (the host build, x86-64-v2, has none), and division and square root are IEEE's.
__device__ inline void adamw_element(float &p, float &m, float &v, float g, const AdamwHyper &h) {
    m = __fadd_rn(__fmul_rn(h.beta1, m), __fmul_rn(1.0f - h.beta1, g));
    v = __fadd_rn(__fmul_rn(h.beta2, v), __fmul_rn(__fmul_rn(1.0f - h.beta2, g), g));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), h.inv_sqrt_bias2), h.eps);
    p = __fsub_rn(__fmul_rn(p, h.decay), __fdiv_rn(__fmul_rn(h.step_size, m), denom));
}

// One element of the split master weights (trainer/split_float.h): decoded, updated,
// encoded again, so the high half stays the bf16 weight the model runs on.
__device__ inline void adamw_split_element(uint16_t &hi, uint16_t &lo, float &m, float &v,
                                           float g, const AdamwHyper &h) {
    float p = __uint_as_float(split_float_join(hi, lo));
    adamw_element(p, m, v, g, h);
    const uint32_t bits = __float_as_uint(p);
    hi = split_float_hi(bits);
    lo = (uint16_t)bits;
}

// VEC = 4: 8-byte loads and stores of the halves, 16-byte ones of m, v, grads; the
// caller checks the alignment. The last n % VEC elements go one by one.
template <int VEC>
__global__ void adamw_kernel(uint16_t *hi, uint16_t *lo, float *m, float *v, const float *grads,
                             size_t n, AdamwHyper h, const float *grad_norm, float max_grad_norm) {
    float clip_scale = 1.0f;
    if (grad_norm && max_grad_norm > 0.0f) {
        const float norm = *grad_norm;
        if (norm > max_grad_norm) clip_scale = (float)((double)max_grad_norm / (norm + 1e-6));
    }
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x, n_packs = n / VEC;
    for (size_t i = tid; i < n_packs; i += stride) {
        Pack<uint16_t, VEC> hi_i = reinterpret_cast<const Pack<uint16_t, VEC> *>(hi)[i];
        Pack<uint16_t, VEC> lo_i = reinterpret_cast<const Pack<uint16_t, VEC> *>(lo)[i];
        Pack<float, VEC> m_i = reinterpret_cast<const Pack<float, VEC> *>(m)[i];
        Pack<float, VEC> v_i = reinterpret_cast<const Pack<float, VEC> *>(v)[i];
        const Pack<float, VEC> g = reinterpret_cast<const Pack<float, VEC> *>(grads)[i];
#pragma unroll
        for (int j = 0; j < VEC; j++)
            adamw_split_element(hi_i.x[j], lo_i.x[j], m_i.x[j], v_i.x[j],
                                __fmul_rn(g.x[j], clip_scale), h);
        reinterpret_cast<Pack<uint16_t, VEC> *>(hi)[i] = hi_i;
        reinterpret_cast<Pack<uint16_t, VEC> *>(lo)[i] = lo_i;
        reinterpret_cast<Pack<float, VEC> *>(m)[i] = m_i;
        reinterpret_cast<Pack<float, VEC> *>(v)[i] = v_i;
    }
    for (size_t i = n_packs * VEC + tid; i < n; i += stride)
        adamw_split_element(hi[i], lo[i], m[i], v[i], __fmul_rn(grads[i], clip_scale), h);
}

// One contiguous range of n elements; weight_decay 0 for tensors that are not decayed,
// `step` the update count after incrementing.
static void adamw_update_cuda(uint16_t *hi, uint16_t *lo, float *m, float *v, const float *grads,
                              size_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, long step, const float *grad_norm,
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
    const bool packed = pack_aligned(hi, 8) && pack_aligned(lo, 8) && pack_aligned(m, 16) &&
                        pack_aligned(v, 16) && pack_aligned(grads, 16);
    if (packed)
        adamw_kernel<4><<<grid_for((int64_t)(n / 4 + 1), ELEMENTWISE_THREADS),
                          ELEMENTWISE_THREADS, 0, stream>>>(hi, lo, m, v, grads, n, h, grad_norm,
                                                            max_grad_norm);
    else
        adamw_kernel<1><<<grid_for((int64_t)n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0,
                          stream>>>(hi, lo, m, v, grads, n, h, grad_norm, max_grad_norm);
    cudaCheckLaunch();
}

void adamw_step_cuda(AdamWState *s, const ParamTable *table, const AdamWHyper *h, bf16 *params_hi,
                     uint16_t *params_lo, const float *grads, const float *grad_norm,
                     float max_grad_norm, cudaStream_t stream) {
    CHECK(s->n == table->total, "optimizer state has %zu elements, model %zu", s->n, table->total);
    s->step++;
    uint16_t *hi = reinterpret_cast<uint16_t *>(params_hi);
    for (int first = 0, last; first < table->n_tensors; first = last) {
        const bool decays = adamw_decays(&table->tensors[first], h);
        for (last = first + 1; last < table->n_tensors; last++)
            if (adamw_decays(&table->tensors[last], h) != decays ||
                table->tensors[last].offset !=
                    table->tensors[last - 1].offset + table->tensors[last - 1].numel)
                break;
        const size_t off = table->tensors[first].offset;
        const size_t n = table->tensors[last - 1].offset + table->tensors[last - 1].numel - off;
        adamw_update_cuda(hi + off, params_lo + off, s->m + off, s->v + off, grads + off, n,
                          h->lr, h->beta1, h->beta2, h->eps, decays ? h->weight_decay : 0.0f,
                          s->step, grad_norm, max_grad_norm, stream);
    }
}
