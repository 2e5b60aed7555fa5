// Register fragments of the attention kernels: packing accumulators into bf16 A operands
// (P and dS stay in registers as the A operand of the next product), 8 x 8 matrix moves
// between fragments and shared memory (ldmatrix, stmatrix), and accumulator rows stored to
// global memory as bf16. Layouts: wgmma.cuh's accumulator layout.
#pragma once
#include "attention/copy_sm90.cuh"
#include "attention/kernel_config.cuh"

namespace {

// 2^x by the special-function unit (ex2.approx; 2^-inf = 0), one instruction.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// A warp's accumulator rows [16 x N] (wgmma.cuh's layout: d[j][0..1] at row lane/4,
// columns 8j + 2*(lane%4) + {0,1}; d[j][2..3] at row lane/4 + 8) as bf16 A fragments of
// the next product (k = its columns).
template <int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[N / 16][4], const float (&acc)[N / 8][4]) {
#pragma unroll
    for (int j = 0; j < N / 16; j++) {
        a[j][0] = pack_bf16(acc[2 * j][0], acc[2 * j][1]);
        a[j][1] = pack_bf16(acc[2 * j][2], acc[2 * j][3]);
        a[j][2] = pack_bf16(acc[2 * j + 1][0], acc[2 * j + 1][1]);
        a[j][3] = pack_bf16(acc[2 * j + 1][2], acc[2 * j + 1][3]);
    }
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}
template <int N>
__device__ __forceinline__ void copy(float (&dst)[N][4], const float (&src)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dst[i][e] = src[i][e];
}

// A 4 x 4 transpose of 32-bit words inside each quad of lanes (4q .. 4q + 3): lane t's a[j]
// becomes lane j's a[t]. Two exchange stages (partners t ^ 1, then t ^ 2), each word
// chosen by the lane's bit; every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4]) {
    const int t = lane_id() % 4;
#pragma unroll
    for (int stage = 1; stage <= 2; stage *= 2) {
        const bool upper = t & stage;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (j & stage) continue;
            const uint32_t got = __shfl_xor_sync(0xffffffff, upper ? a[j] : a[j + stage], stage);
            if (upper) a[j] = got;
            else a[j + stage] = got;
        }
    }
}

// Row r (0: the thread's accumulator row lane / 4, 1: that row + 8) of a warp's [16 x D]
// accumulator (acc_to_a's layout), times scale, to dst[0 .. D) as bf16 where store holds.
// A quad holds a row's columns as 4-byte pairs, 8-column block n spread over its lanes; after
// quad_transpose lane t holds blocks 4k + t whole and writes each with one 16-byte store: a
// quarter of the 4-byte stores' instructions, each writing whole 32-byte sectors (a warp's
// 4-byte store wrote half of 8). Every lane of the warp must call it.
template <int D>
__device__ __forceinline__ void store_row_bf16(bf16 *dst, const float (&acc)[D / 8][4], int r, float scale,
                                               bool store) {
    const int t = lane_id() % 4;
#pragma unroll
    for (int k = 0; k < D / 32; k++) {
        uint32_t a[4];
#pragma unroll
        for (int j = 0; j < 4; j++) a[j] = pack_bf16(acc[4 * k + j][2 * r] * scale, acc[4 * k + j][2 * r + 1] * scale);
        quad_transpose(a);
        if (store) *reinterpret_cast<uint4 *>(dst + 8 * (4 * k + t)) = make_uint4(a[0], a[1], a[2], a[3]);
    }
}

// Loads four 8 x 8 bf16 matrices, matrix i into register i of every lane in the mma
// fragment layout (row lane / 4, columns 2 (lane % 4) + {0, 1}); lane l gives the
// 16-byte-aligned address of row l % 8 of matrix l / 8 (stmatrix_x4's inverse).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16 *row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row_addr))
                 : "memory");
}

// Stores four 8 x 8 bf16 matrices, matrix i from register i of every lane (the mma
// fragment layout: row lane / 4, columns 2 (lane % 4) + {0, 1}); lane l gives the
// 16-byte-aligned address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4(bf16 *row_addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row_addr)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

}  // namespace
