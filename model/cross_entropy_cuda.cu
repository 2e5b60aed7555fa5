// Fused cross-entropy forward+backward over one chunk of logit rows: one block per
// row, an online (max, sum-of-exp) pass, then dlogits written over the logits.
#include <math.h>
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

enum { CROSS_ENTROPY_THREADS = 512 };

// Running softmax normaliser: sum of exp(x - max) over the values seen.
struct MaxSum {
    float max, sum;
};

// Commutative (both lanes of a shuffle get bitwise the same result).
__device__ inline MaxSum max_sum_combine(MaxSum a, MaxSum b) {
    const float max = fmaxf(a.max, b.max);
    if (max == -INFINITY) return MaxSum{max, 0.0f};
    return MaxSum{max, a.sum * expf(a.max - max) + b.sum * expf(b.max - max)};
}

__device__ inline MaxSum max_sum_warp_reduce(MaxSum x) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const MaxSum other = {__shfl_xor_sync(0xffffffffu, x.max, offset),
                              __shfl_xor_sync(0xffffffffu, x.sum, offset)};
        x = max_sum_combine(x, other);
    }
    return x;
}

// Called once per kernel by every thread; every thread gets the row's total.
__device__ inline MaxSum max_sum_block_reduce(MaxSum x) {
    __shared__ MaxSum warp_values[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    x = max_sum_warp_reduce(x);
    if (lane == 0) warp_values[warp] = x;
    __syncthreads();
    x = lane < (int)(blockDim.x / 32) ? warp_values[lane] : MaxSum{-INFINITY, 0.0f};
    return max_sum_warp_reduce(x);
}

// One block per row; each thread walks packs of VEC logits (16-byte loads when the
// rows allow it).
template <int VEC>
__global__ void cross_entropy_kernel(float *losses, bf16 *dlogits, const bf16 *logits,
                                     const int32_t *targets, int V, float loss_scale) {
    const int64_t row = blockIdx.x;
    const bf16 *z = logits + row * V;
    bf16 *dz = dlogits ? dlogits + row * V : nullptr;
    const int target = targets[row];
    if (target < 0 || target >= V) {
        // -1: no loss here. Anything else is a caller bug, made visible as NaN.
        const float fill = target == -1 ? 0.0f : NAN;
        if (losses && threadIdx.x == 0) losses[row] = fill;
        if (dz)
            for (int v = threadIdx.x; v < V; v += blockDim.x) dz[v] = __float2bfloat16_rn(fill);
        return;
    }
    // Read before the reduction's barrier, so before any thread overwrites the row.
    const float target_logit = __bfloat162float(z[target]);
    MaxSum local = {-INFINITY, 0.0f};
    for (int v = threadIdx.x * VEC; v < V; v += blockDim.x * VEC) {
        const Pack<bf16, VEC> pack = load_bf16s<VEC>(z + v);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float x = __bfloat162float(pack.x[j]);
            if (x > local.max) {
                local.sum = local.sum * expf(local.max - x) + 1.0f;
                local.max = x;
            } else {
                local.sum += expf(x - local.max);
            }
        }
    }
    const MaxSum total = max_sum_block_reduce(local);
    const float log_sum_exp = total.max + logf(total.sum);
    if (losses && threadIdx.x == 0) losses[row] = log_sum_exp - target_logit;
    if (!dz) return;
    for (int v = threadIdx.x * VEC; v < V; v += blockDim.x * VEC) {
        Pack<bf16, VEC> pack = load_bf16s<VEC>(z + v);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float p = expf(__bfloat162float(pack.x[j]) - log_sum_exp);
            pack.x[j] = __float2bfloat16_rn((p - (v + j == target ? 1.0f : 0.0f)) * loss_scale);
        }
        store_bf16s<VEC>(dz + v, pack);
    }
}

void cross_entropy_forward_backward_cuda(float *losses, bf16 *dlogits, const bf16 *logits,
                                         const int32_t *targets, int N, int V, float loss_scale,
                                         cudaStream_t stream) {
    CHECK(N >= 0 && V > 0, "cross_entropy_forward_backward_cuda: bad shape N=%d V=%d", N, V);
    if (N == 0) return;
    const bool packed = V % 8 == 0 && pack_aligned(logits, 16) &&
                        (!dlogits || pack_aligned(dlogits, 16));
    if (packed)
        cross_entropy_kernel<8><<<N, CROSS_ENTROPY_THREADS, 0, stream>>>(
            losses, dlogits, logits, targets, V, loss_scale);
    else
        cross_entropy_kernel<1><<<N, CROSS_ENTROPY_THREADS, 0, stream>>>(
            losses, dlogits, logits, targets, V, loss_scale);
    cudaCheckLaunch();
}
