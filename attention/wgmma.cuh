// Hopper warpgroup matrix multiply (wgmma, sm_90a) for the attention kernels: shared-memory
// tile layout, operand descriptors, the asynchronous-group fences, and the few instruction
// shapes the kernels issue. A warpgroup is 4 consecutive warps (128 threads) starting at a
// warp index divisible by 4; warp w of it holds rows 16w..16w+15 of every 64-row
// accumulator, in the mma.sync m16n8 accumulator layout: d[j][0..1] at row lane/4, columns
// 8j + 2*(lane%4) + {0,1}; d[j][2..3] the same columns at row lane/4 + 8.
//
// Shared-memory tiles use the 128-byte swizzle (the layout TMA's SWIZZLE_128B writes): a
// tile of ROWS rows is stored as consecutive blocks of 64 bf16 columns, each block ROWS x
// 128 bytes, and the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its row. Every
// tile base must be 1024-byte aligned (the swizzle is a function of the address).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace wgmma {

// Element offset of (row, col) in a swizzled bf16 tile of `rows` rows.
__device__ __forceinline__ int swizzled_offset(int row, int col, int rows) {
    return (col / 64) * rows * 64 + row * 64 + ((((col % 64) / 8) ^ (row % 8)) * 8) + col % 8;
}

// Descriptor fields: start address, leading and stride byte offsets (all >> 4), and the
// 128-byte swizzle mode (1 in bits 62-63).
__device__ __forceinline__ uint64_t make_desc(const void *smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo_bytes >> 4) << 16 |
           (uint64_t)(sbo_bytes >> 4) << 32 | 1ull << 62;
}

// Operand whose 16-wide reduction slice [k0, k0 + 16) runs along the tile's columns
// (K-major: a row-major [M or N][K] matrix), tile of `rows` rows: 8-row groups 1024 bytes
// apart; the slice is an address offset inside one 64-column block.
// The offset is added to the address field of the tile's own descriptor, so with constant
// rows and k0 (unrolled loops) each slice costs one add.
__device__ __forceinline__ uint64_t desc_k_major(const __nv_bfloat16 *tile, int rows, int k0) {
    return make_desc(tile, 16, 1024) + (uint64_t)((((k0 / 64) * rows * 64 + k0 % 64) * 2) >> 4);
}

// Operand whose reduction runs along the tile's rows (MN-major: a row-major [K][M or N]
// matrix), reduction rows [k0, k0 + 16), columns from col0: 64-column blocks rows*128
// bytes apart (leading), 8-row groups 1024 bytes apart (stride). A col0 inside a block (a
// multiple of 8, for N < 64) moves the start within the swizzled row, as k0 does for
// K-major operands.
__device__ __forceinline__ uint64_t desc_mn_major(const __nv_bfloat16 *tile, int rows, int k0, int col0) {
    return make_desc(tile, rows * 128, 1024) +
           (uint64_t)((((col0 / 64) * rows * 64 + k0 * 64 + col0 % 64) * 2) >> 4);
}

// Orders this thread's earlier register and shared-memory writes before the next wgmma.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by ordinary stores or cp.async, read next by wgmma: each writer
// fences, then the threads synchronise.
__device__ __forceinline__ void fence_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins registers at this point of the program: accumulators an asynchronous wgmma writes,
// and A fragments it reads, must not be read, moved or reused across the wait.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[j][e])::"memory");
}

// The instruction wrappers name every accumulator register as an asm operand:
// WGMMA_ACC_N lists the "+f" operands of an accumulator d[N/8][4], in register order.
#define WGMMA_ACC_8(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WGMMA_ACC_32(d) WGMMA_ACC_8(d, 0), WGMMA_ACC_8(d, 1), WGMMA_ACC_8(d, 2), WGMMA_ACC_8(d, 3)
#define WGMMA_ACC_64(d) WGMMA_ACC_32(d), WGMMA_ACC_8(d, 4), WGMMA_ACC_8(d, 5), WGMMA_ACC_8(d, 6), WGMMA_ACC_8(d, 7)
#define WGMMA_ACC_128(d)                                                                              \
    WGMMA_ACC_64(d), WGMMA_ACC_8(d, 8), WGMMA_ACC_8(d, 9), WGMMA_ACC_8(d, 10), WGMMA_ACC_8(d, 11), \
        WGMMA_ACC_8(d, 12), WGMMA_ACC_8(d, 13), WGMMA_ACC_8(d, 14), WGMMA_ACC_8(d, 15)

// d[64 x 64] (+)= A[64 x 16] * B[16 x 64], both from shared memory by descriptor;
// TRANS_A / TRANS_B: the operand is stored MN-major (see desc_mn_major).
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_ss_n64(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                          bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, "
        "%35, %36;\n}\n"
        : WGMMA_ACC_64(d)
        : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(TRANS_A), "n"(TRANS_B));
}

// d[64 x 128] (+)= A[64 x 16] * B[16 x 128], both from shared memory by descriptor;
// TRANS_A / TRANS_B: the operand is stored MN-major (see desc_mn_major).
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_ss_n128(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b,
                                           bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, "
        "%67, %68;\n}\n"
        : WGMMA_ACC_128(d)
        : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(TRANS_A), "n"(TRANS_B));
}

// d[64 x 64] (+)= A[64 x 16] * B[16 x 64], A from registers (each warp its 16 rows, the
// mma.sync A-fragment layout), B from shared memory by descriptor.
template <int TRANS_B>
__device__ __forceinline__ void mma_rs_n64(float (&d)[8][4], const uint32_t (&a)[4],
                                          uint64_t desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : WGMMA_ACC_64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"((int)accumulate), "n"(TRANS_B));
}

// d[64 x 128] (+)= A[64 x 16] * B[16 x 128], A from registers (each warp its 16 rows, the
// mma.sync A-fragment layout), B from shared memory by descriptor.
template <int TRANS_B>
__device__ __forceinline__ void mma_rs_n128(float (&d)[16][4], const uint32_t (&a)[4],
                                          uint64_t desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : WGMMA_ACC_128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"((int)accumulate), "n"(TRANS_B));
}

// d[64 x N] (+)= A * B over one 16-wide slice, both from shared memory, N = 64 or 128.
template <int N, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    static_assert(N == 64 || N == 128, "instruction shapes m64n64k16 and m64n128k16");
    if constexpr (N == 64) mma_ss_n64<TRANS_A, TRANS_B>(d, desc_a, desc_b, accumulate);
    else mma_ss_n128<TRANS_A, TRANS_B>(d, desc_a, desc_b, accumulate);
}

// d[64 x N] (+)= A * B over one 16-wide slice, A from registers, N = 64 or 128.
template <int N, int TRANS_B>
__device__ __forceinline__ void mma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                       bool accumulate) {
    static_assert(N == 64 || N == 128, "instruction shapes m64n64k16 and m64n128k16");
    if constexpr (N == 64) mma_rs_n64<TRANS_B>(d, a, desc_b, accumulate);
    else mma_rs_n128<TRANS_B>(d, a, desc_b, accumulate);
}

}  // namespace wgmma
