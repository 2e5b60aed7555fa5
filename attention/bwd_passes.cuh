// The attention backward's small passes around the dK/dV kernel: the K/V bound of
// deterministic mode (kv_bound_kernel), the pre-pass (dsum = rowsum(dO * O), lse2, the
// zeroed dQ accumulator, and deterministic mode's per-row fixed-point scales), and with
// GQA the sum of the heads' dK/dV partials (dkv_reduce_kernel).
#pragma once
#include <math.h>
#include "attention/bwd_params.cuh"
#include "attention/kernel_config.cuh"

namespace {

// ---------------------------------------------------------------- pre-passes

// Pair i (bf16 elements 2i, 2i + 1) of a 16-byte load of 8 bf16, as floats.
__device__ __forceinline__ float2 bf16_pair(const uint4 &w, int i) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u[i]));
}

// Per (batch, KV head): the largest finite |K| element and the largest finite ||V_k||, as
// atomicMax of non-negative doubles' bits into kv_bound (zeroed before). A key that is not
// finite reaches only the rows that see it, whose partials then fail their limit.
// Block (KV head x, row group y, batch z): D / 8 adjacent threads hold a key's row of the
// head (16 bytes each), KV_BOUND_THREADS / (D / 8) keys at a time, KV_BOUND_ROWS times;
// one atomicMax pair per block (one per row group and head: per word a few dozen).
constexpr int KV_BOUND_THREADS = 256, KV_BOUND_ROWS = 8;
template <int D>
constexpr int kv_bound_keys() { return KV_BOUND_THREADS / (D / 8) * KV_BOUND_ROWS; }  // per block
template <int D>
__global__ void __launch_bounds__(KV_BOUND_THREADS) kv_bound_kernel(const __grid_constant__ BwdParams p) {
    constexpr int LANES = D / 8, GROUPS = KV_BOUND_THREADS / LANES;
    const AttnDims &d = p.dims;
    const int b = blockIdx.z, kv_head = blockIdx.x, col = kv_head * D + threadIdx.x % LANES * 8;
    uint4 kw[KV_BOUND_ROWS], vw[KV_BOUND_ROWS];
#pragma unroll
    for (int r = 0; r < KV_BOUND_ROWS; r++) {
        const int s = blockIdx.y * kv_bound_keys<D>() + r * GROUPS + threadIdx.x / LANES;
        const int64_t off = ((int64_t)b * d.seq_len + s) * d.kv_row_stride + col;
        kw[r] = vw[r] = make_uint4(0, 0, 0, 0);
        if (s < d.seq_len) {
            kw[r] = *reinterpret_cast<const uint4 *>(p.k + off);
            vw[r] = *reinterpret_cast<const uint4 *>(p.v + off);
        }
    }
    float k_max = 0.0f;
    double v_sq_max = 0.0;
#pragma unroll
    for (int r = 0; r < KV_BOUND_ROWS; r++) {
        double v_sq = 0.0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 kf = bf16_pair(kw[r], i), vf = bf16_pair(vw[r], i);
            if (fabsf(kf.x) < INFINITY) k_max = fmaxf(k_max, fabsf(kf.x));  // false for NaN too
            if (fabsf(kf.y) < INFINITY) k_max = fmaxf(k_max, fabsf(kf.y));
            v_sq += (double)vf.x * vf.x + (double)vf.y * vf.y;
        }
#pragma unroll
        for (int off = LANES / 2; off > 0; off /= 2) v_sq += __shfl_xor_sync(0xffffffff, v_sq, off);
        if (isfinite(v_sq)) v_sq_max = fmax(v_sq_max, v_sq);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        k_max = fmaxf(k_max, __shfl_xor_sync(0xffffffff, k_max, off));
        v_sq_max = fmax(v_sq_max, __shfl_xor_sync(0xffffffff, v_sq_max, off));
    }
    __shared__ float warp_k[KV_BOUND_THREADS / 32];
    __shared__ double warp_v[KV_BOUND_THREADS / 32];
    if (lane_id() == 0) {
        warp_k[threadIdx.x / 32] = k_max;
        warp_v[threadIdx.x / 32] = v_sq_max;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < KV_BOUND_THREADS / 32; w++) {
            k_max = fmaxf(k_max, warp_k[w]);
            v_sq_max = fmax(v_sq_max, warp_v[w]);
        }
        unsigned long long *bound = p.ws.kv_bound + 2 * ((int64_t)b * d.n_kv_heads + kv_head);
        atomicMax(&bound[0], (unsigned long long)__double_as_longlong((double)k_max));
        atomicMax(&bound[1], (unsigned long long)__double_as_longlong(sqrt(v_sq_max)));
    }
}

// 2^f for row (b, h, .) with dsum and ||dO_q||^2 = dout_sq (FIXED_DQ_BITS); NaN where dO
// or O is not finite (the row's dq is NaN, as in fast mode).
__device__ __forceinline__ float fixed_dq_scale(const BwdParams &p, int b, int h, float dsum, double dout_sq) {
    if (!isfinite(dsum) || !isfinite(dout_sq)) return NAN;
    const unsigned long long *kv = p.ws.kv_bound + 2 * ((int64_t)b * p.dims.n_kv_heads + h / p.dims.group);
    const double bound = __longlong_as_double((long long)kv[0]) *
                         (sqrt(dout_sq) * __longlong_as_double((long long)kv[1]) + fabs((double)dsum));
    if (!(bound > 0.0)) return 1.0f;  // a row of zeros
    return ldexpf(1.0f, max(-126, min(126, FIXED_DQ_BITS - 1 - ilogb(bound))));
}

// Per (batch, head, query) padded to whole query tiles: dsum = rowsum(dO * O) and
// lse2 = lse * log2(e), +inf for a query that sees nothing or lies past seq_len (its
// probabilities come out exactly 0), the row's D words of dq_accum zeroed (the same padded
// rows, a separate memset pass saved) and in deterministic mode its fixed-point scale.
// D / 8 adjacent threads per query row, 16 bytes of O and of dO each (a warp per row with
// 4-byte loads kept too few loads in flight).
constexpr int PREP_THREADS = 256;
template <int D>
__global__ void __launch_bounds__(PREP_THREADS) attn_bwd_prep_kernel(const __grid_constant__ BwdParams p) {
    constexpr int LANES = D / 8;  // threads per row: a power of two that divides 32
    const AttnDims &d = p.dims;
    const int S = d.seq_len, H = d.n_heads, s_pad = d.s_pad;
    const int64_t row = (int64_t)blockIdx.x * (PREP_THREADS / LANES) + threadIdx.x / LANES;  // (b, h, q) padded
    const int col = threadIdx.x % LANES * 8;
    const bool live = row < (int64_t)d.batch * H * s_pad;
    const int qi = (int)(row % s_pad), h = (int)(row / s_pad % H), b = (int)(row / s_pad / H);
    const bool fixed = p.ws.dq_scale != nullptr;
    float acc = 0.0f, l2 = INFINITY;
    double dout_sq = 0.0;
    if (live && qi < S) {
        const int64_t off = ((int64_t)(b * S + qi) * H + h) * D + col;
        const uint4 o = *reinterpret_cast<const uint4 *>(p.out + off);
        const uint4 g = *reinterpret_cast<const uint4 *>(p.dout + off);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 of = bf16_pair(o, i), gf = bf16_pair(g, i);
            acc += of.x * gf.x + of.y * gf.y;
            if (fixed) dout_sq += (double)gf.x * gf.x + (double)gf.y * gf.y;
        }
        const float ls = p.lse[((int64_t)b * H + h) * S + qi];
        if (ls != -INFINITY) l2 = ls * LOG2E;
    }
#pragma unroll
    for (int off = LANES / 2; off > 0; off /= 2) {
        acc += __shfl_xor_sync(0xffffffff, acc, off);
        if (fixed) dout_sq += __shfl_xor_sync(0xffffffff, dout_sq, off);
    }
    if (live && col == 0) {
        p.ws.dsum[row] = acc;
        p.ws.lse2[row] = l2;
        if (fixed) p.ws.dq_scale[row] = fixed_dq_scale(p, b, h, acc, dout_sq);
    }
    if (live) {
        float4 *z = reinterpret_cast<float4 *>(p.ws.dq_accum + row * D + col);
        z[0] = z[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// ---------------------------------------------------------------- GQA: dK/dV partials

// dk = bf16(scale * sum of the group's dK partials), dv = bf16(sum of dV partials), the
// partials added in ascending order (deterministic); 4 elements per thread.
__global__ void dkv_reduce_kernel(const __grid_constant__ BwdParams p) {
    const AttnDims &d = p.dims;
    const int64_t n4 = d.n_kv / 4;
    const int splits = d.group;
    const float scale = d.scale;
    const float4 *dkv_part = reinterpret_cast<const float4 *>(p.ws.dkv_part);
    __nv_bfloat162 *dk = reinterpret_cast<__nv_bfloat162 *>(p.dk), *dv = reinterpret_cast<__nv_bfloat162 *>(p.dv);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 k = dkv_part[i], v = dkv_part[n4 + i];
        for (int s = 1; s < splits; s++) {
            const float4 pk = dkv_part[2 * s * n4 + i], pv = dkv_part[(2 * s + 1) * n4 + i];
            k.x += pk.x, k.y += pk.y, k.z += pk.z, k.w += pk.w;
            v.x += pv.x, v.y += pv.y, v.z += pv.z, v.w += pv.w;
        }
        dk[2 * i] = __floats2bfloat162_rn(k.x * scale, k.y * scale);
        dk[2 * i + 1] = __floats2bfloat162_rn(k.z * scale, k.w * scale);
        dv[2 * i] = __floats2bfloat162_rn(v.x, v.y);
        dv[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
}

}  // namespace
