// dQ of the attention backward: the dK/dV kernel adds each step's dQ = dS K over its key
// pair into one accumulator by bulk reductions in L2, fp32 (fast mode) or 32-bit fixed
// point whose integer adds give the same sum in any order (deterministic mode); the
// accumulator's layout, the staging of dS^T between the warpgroups, the reductions, and
// the conversion to bf16 dq (dq_convert_kernel).
#pragma once
#include <math.h>
#include "attention/bwd_params.cuh"
#include "attention/copy_sm90.cuh"
#include "attention/fragments.cuh"
#include "attention/kernel_config.cuh"
#include "attention/wgmma.cuh"

namespace {

// ---------------------------------------------------------------- accumulator layout

// The dQ accumulator keeps each 64-row query tile ([64 x head_dim] words, at the
// tile's rows of dq_accum) in the order the dK/dV kernel's registers hold it, FA3's way:
// warp w's 16 rows, then its accumulator column groups n of 8, each as 32 lanes' float4
// (d[n][0..3] of wgmma.cuh's layout). A warp then stores its rows with conflict-free
// 16-byte stores and hands them to the copy engine as one reduction; dq_convert_kernel
// reads the order back (dq_frag_offset).
// The warpgroups take turns: warpgroup m % 2 adds all columns of step m's dQ over the
// pair, so each product reads dS^T once (m64nDk16; FA3's split of the columns into
// halves reads it twice, and at D = 64 its m64n32 halves are bound by shared-memory
// reads), and the reductions' bytes are halved.
// Whether warpgroup wg computes the dQ of step m.
__device__ __forceinline__ bool dq_owner(int m, int wg) { return m % 2 == wg; }
// At D = 128 the owner's accumulator [64 x 128] is 64 registers, which fit beside dK and
// dV only once P^T's are free: the owner waits for the step's dV, then issues the dQ and
// dK (the dQ's staging and reduction run under dK), and the warpgroups share one staging
// chunk per warp index (32 KiB, so three query stages still fit), handed over by dq_free.
__host__ __device__ constexpr bool dq_wide(int head_dim) { return head_dim > 64; }
__host__ __device__ constexpr int dq_frag_offset(int row, int col, int head_dim) {  // in the tile
    return (row / WARP_ROWS) * WARP_ROWS * head_dim + ((col / 8 * 32 + row % 8 * 4 + col % 8 / 2) * 4) +
           row % WARP_ROWS / 8 * 2 + col % 2;
}

// The dQ staging: both warpgroups' dS^T (the MN-major A operand of dQ = dS K), two
// buffers (step n in n % 2: the product of step n - 1 reads the other while step n is
// written), with mbarriers (full: the writer warpgroup's threads have stored a step;
// empty: warpgroup b's 128 threads, the readers of buffer b, are past their dQ product),
// and each warp's dQ rows (fp32, or fixed point): per warpgroup at D = 64, shared at
// D = 128 (dq_free[w]: warp w's 32 threads, after the copy engine has read the chunk of
// their last reduction).
template <int D>
struct DqStaging {
    static constexpr int CHUNK_SETS = dq_wide(D) ? 1 : DKDV_KEY_TILES;
    alignas(1024) bf16 ds[2][DKDV_KEY_TILES][BN * BM];  // [step % 2][warpgroup][keys][queries] swizzled
    alignas(128) float dq[CHUNK_SETS][NUM_WARPS][WARP_ROWS * D];  // [warpgroup or shared][warp][fragment order]
    uint64_t ds_full[2][DKDV_KEY_TILES], ds_empty[2];  // mbarriers: NUM_THREADS writers, NUM_THREADS readers
    uint64_t dq_free[NUM_WARPS];                       // mbarriers (D = 128): 32 threads
};

// ---------------------------------------------------------------- staging and reduction

// dQ [64 queries x D] = dS [64 x 128 keys] K [128 keys x D] over the block's
// key pair, added into dq_accum [batch, n_heads, s_pad, head_dim] (each query tile in
// fragment order, dq_frag_offset), by warpgroup m % 2 for step m. Step n stages the
// warpgroup's dS^T (stage_ds) and, every other step, computes the dQ of step n - 1
// (issue_dq, reduce_dq), whose dS^T both warpgroups staged a step ago: a warpgroup waits
// for the other only when it runs a whole step ahead.
//
// Barrier phases (buffer b = m % 2 holds step m, its u-th use, u = m / 2): ds_full[b][g]
// completes phase u when warpgroup g's 128 threads have stored dS^T(m), ds_empty[b] when
// warpgroup b's 128 threads, its only readers, have read both halves. The writer of step
// m waits for ds_empty[b] phase u - 1 (parity (u + 1) % 2, a fresh barrier passes 1),
// readers for ds_full[b][0..1] phase u. Each parity wait is sound because its barrier is
// at most one phase away: the waiting thread itself waited for the phase before (its step
// m - 2, which the same warpgroup read), and the phase after needs its own later arrival
// (no dS^T(m + 2) before every read of dS^T(m); no read of dS^T(m + 2), and so no arrival
// on ds_empty[b] for it, before both writers passed ds_empty[b] phase u), which also keeps
// any arrival out of an earlier phase.
//
// At D = 128, dq_free[w] completes phase m when the copy engine has read warp w's chunk
// of dQ(m) (the owner's warp w arrives in its step m + 2, or after the walk, once its
// lane 0 has waited for the reads: release_dq_chunk). The writer of dQ(m) waits for phase
// m - 1 (parity (m + 1) % 2; a fresh barrier passes 1 for m = 0). Sound for the same
// reasons: phase m - 2 is the same warp's own arrival, before its wait in program order,
// and phase m needs its own later arrival; each arrival follows the writer's wait for the
// phase before, so it falls in its own phase.

// Writes this warpgroup's dS^T of step n ([64 keys x 64 queries] bf16, swizzled) into
// buffer n % 2 once every dQ of step n - 2 has read it; each warp then arrives on ds_full.
template <int D>
__device__ __forceinline__ void stage_ds(DqStaging<D> &st, int wg, int n, const uint32_t (&ds_frag)[BM / 16][4]) {
    const int l = lane_id(), b = n % 2;
    // stmatrix: lane l gives the address of row l % 8 of 8 x 8 matrix l / 8, which for A
    // fragment j is (rows + 8 (i % 2), columns 16 j + 8 (i / 2)) as ds_frag[j][i] holds it.
    const int row = (threadIdx.x / 32) % NUM_WARPS * WARP_ROWS + l % 8 + 8 * (l / 8 % 2);
    mbar_wait(&st.ds_empty[b], (n / 2 + 1) % 2);
    bf16 *wg_ds = st.ds[b][wg];
#pragma unroll
    for (int j = 0; j < BM / 16; j++)
        stmatrix_x4(wg_ds + wgmma::swizzled_offset(row, 16 * j + 8 * (l / 16), BN), ds_frag[j]);
    wgmma::fence_async_shared();
    mbar_arrive(&st.ds_full[b][wg]);  // every thread its own stores (racecheck follows no __syncwarp into it)
}

// Issues step m's dQ as one wgmma group (2 x BN / 16 products of m64nDk16, both
// operands MN-major from shared memory) once both dS^T are in place.
template <int D, typename Smem>
__device__ __forceinline__ void issue_dq(float (&dq_part)[D / 8][4], Smem &smem, int m) {
    DqStaging<D> &st = smem.dq;
    const int b = m % 2;
#pragma unroll
    for (int t = 0; t < DKDV_KEY_TILES; t++) mbar_wait(&st.ds_full[b][t], m / 2 % 2);
    wgmma::fence();
#pragma unroll
    for (int t = 0; t < DKDV_KEY_TILES; t++)
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma::mma_ss<D, 1, 1>(dq_part, wgmma::desc_mn_major(st.ds[b][t], BN, 16 * kk, 0),
                                   wgmma::desc_mn_major(smem.k[t], BN, 16 * kk, 0), t > 0 || kk > 0);
    wgmma::commit();
}

// This thread's two dQ rows' fixed-point scales (dq_scale) in query tile q0, loaded before
// the product whose partials they scale (FIXED; fast mode: 1, unused).
template <bool FIXED>
__device__ __forceinline__ void load_row_scales(float (&row_scale)[2], const BwdParams &p, const DkdvBlock &blk,
                                                int q0) {
    row_scale[0] = row_scale[1] = 1.0f;
    if constexpr (FIXED) {
        const float *rows = p.ws.dq_scale + head_rows(p.dims, blk) + q0;
        row_scale[0] = rows[warp_row()];
        row_scale[1] = rows[warp_row() + 8];
    }
}

__device__ __forceinline__ float max_nan(float a, float b) {  // NaN if either is
    float r;
    asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Once the warp's dQ product of step m (query tile q0) has completed: releases dS^T(m)
// (ds_empty), stores its 16 rows in fragment order once the chunk is free and hands them
// to the copy engine as one bulk asynchronous reduction (the warp goes on while the adds
// run; rows past seq_len add zeros into the padding). FIXED (deterministic mode): as
// integers, round(partial * row_scale); a row whose partial is not below FIXED_DQ_LIMIT
// gets the scale NaN.
template <int D, bool FIXED, typename Smem>
__device__ __forceinline__ void reduce_dq(Smem &smem, const BwdParams &p, const DkdvBlock &blk, int wg, int m,
                                          int q0, float (&dq_part)[D / 8][4], const float (&row_scale)[2]) {
    DqStaging<D> &st = smem.dq;
    const int l = lane_id(), warp = (threadIdx.x / 32) % NUM_WARPS;
    float *chunk = st.dq[dq_wide(D) ? 0 : wg][warp];
    wgmma::pin(dq_part);
    mbar_arrive(&st.ds_empty[m % 2]);
    if constexpr (dq_wide(D)) {
        mbar_wait(&st.dq_free[warp], (m + 1) % 2);  // the reduction of dQ(m - 1) has left the chunk
    } else {
        if (l == 0) bulk_wait_read_all();  // the warp's last reduction has left the chunk
        __syncwarp();
    }
    const AttnDims &d = p.dims;
    const int64_t tile_row = head_rows(d, blk) + q0;
    if constexpr (FIXED) {
        float worst[2] = {0.0f, 0.0f};  // per row: the largest |scaled partial|
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            int w[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float y = dq_part[j][e] * row_scale[e / 2];
                w[e] = __float2int_rn(y);
                worst[e / 2] = max_nan(worst[e / 2], fabsf(y));
            }
            *reinterpret_cast<int4 *>(chunk + (j * 32 + l) * 4) = make_int4(w[0], w[1], w[2], w[3]);
        }
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (!(worst[r] < FIXED_DQ_LIMIT)) p.ws.dq_scale[tile_row + warp_row() + 8 * r] = NAN;
    } else {
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            *reinterpret_cast<float4 *>(chunk + (j * 32 + l) * 4) =
                make_float4(dq_part[j][0], dq_part[j][1], dq_part[j][2], dq_part[j][3]);
    }
    wgmma::fence_async_shared();
    __syncwarp();  // the warp's slice is in place
    if (l == 0) {
        float *dq_rows = p.ws.dq_accum + (tile_row + warp * WARP_ROWS) * D;  // fragment order from its first row
        if constexpr (FIXED)
            bulk_reduce_add_s32(reinterpret_cast<int *>(dq_rows), reinterpret_cast<const int *>(chunk),
                                WARP_ROWS * D * (int)sizeof(int));
        else
            bulk_reduce_add_f32(dq_rows, chunk, WARP_ROWS * D * (int)sizeof(float));
        bulk_commit();
    }
}

// At D = 128, after the warp's reduction of dQ(m) (and before the other warpgroup's
// writer of dQ(m + 1) needs the chunk): waits until the copy engine has read it and
// completes dq_free[warp]'s phase m (every thread: racecheck).
template <int D>
__device__ __forceinline__ void release_dq_chunk(DqStaging<D> &st) {
    if (lane_id() == 0) bulk_wait_read_all();
    __syncwarp();
    mbar_arrive(&st.dq_free[(threadIdx.x / 32) % NUM_WARPS]);
}

// ---------------------------------------------------------------- conversion

// dq[b, s, h, :] = bf16(scale * dQ) from dq_accum [batch, n_heads, s_pad, head_dim], whose
// query tiles are in the dK/dV kernel's fragment order (dq_frag_offset): one block per
// (batch, head, query tile); a thread's 16-byte load holds columns c, c + 1 of rows r and
// r + 8, so the loads use every byte they fetch and a warp stores runs of whole rows.
constexpr int CONVERT_THREADS = 256;
__global__ void __launch_bounds__(CONVERT_THREADS) dq_convert_kernel(const __grid_constant__ BwdParams p) {
    const AttnDims &d = p.dims;
    const int D = d.head_dim, H = d.n_heads, S = d.seq_len, n_qtiles = d.s_pad / BM;
    const int bh = blockIdx.x / n_qtiles, q0 = blockIdx.x % n_qtiles * BM, h = bh % H, b = bh / H;
    const float *tile = p.ws.dq_accum + ((int64_t)bh * d.s_pad + q0) * D;
    const float *row_scale = p.ws.dq_scale ? p.ws.dq_scale + (int64_t)bh * d.s_pad + q0 : nullptr;
    __nv_bfloat162 *dq = reinterpret_cast<__nv_bfloat162 *>(p.dq);
    for (int item = threadIdx.x; item < BM / 2 * (D / 2); item += CONVERT_THREADS) {
        const int pair = item / (D / 2), c = item % (D / 2) * 2;  // the rows r and r + 8, columns c, c + 1
        const int r = pair / 8 * WARP_ROWS + pair % 8;
        const float *at = tile + dq_frag_offset(r, c, D);
        float4 x;
        float s0 = d.scale, s8 = d.scale;
        if (row_scale) {  // deterministic mode: fixed point at the row's 2^f
            const int4 w = *reinterpret_cast<const int4 *>(at);
            x = make_float4((float)w.x, (float)w.y, (float)w.z, (float)w.w);
            s0 /= row_scale[r];
            s8 /= row_scale[r + 8];
        } else {
            x = *reinterpret_cast<const float4 *>(at);
        }
        const int64_t row0 = ((int64_t)b * S + q0 + r) * H + h, row8 = row0 + 8 * (int64_t)H;  // (b, s, h)
        if (q0 + r < S) dq[(row0 * D + c) / 2] = __floats2bfloat162_rn(x.x * s0, x.y * s0);
        if (q0 + r + 8 < S) dq[(row8 * D + c) / 2] = __floats2bfloat162_rn(x.z * s8, x.w * s8);
    }
}

}  // namespace
