// Copies and barriers of the attention kernels (sm_90): 4-byte cp.async, TMA tensor
// copies onto mbarriers, bulk asynchronous reductions from shared memory into global
// memory, the mbarrier operations, and the register reallocation of warp-specialised
// blocks. A kernel's shared memory is one struct laid over the whole dynamic allocation,
// whose size is sizeof the struct; no kernel declares a static __shared__ variable, so
// the allocation starts at the base of the block's shared window, which is 1024-byte
// aligned as the swizzled tiles' alignas(1024) members need.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <stdint.h>
#include "attention/kernel_config.cuh"

namespace {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 4 bytes global -> shared, asynchronously; zero-filled when !valid (src is not read).
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}

// dst[0 .. bytes/4) += src[...] in fp32, done by the copy engine from shared memory
// (asynchronous; 16-byte aligned, bytes a multiple of 16). Groups as cp.async's: commit,
// then wait until the source may be overwritten (the reads; the adds complete with the
// grid, which is all the kernels after need).
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const float *src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}
// The same for 32-bit integers: adds that wrap modulo 2^32, so their order does not matter.
__device__ __forceinline__ void bulk_reduce_add_s32(int *dst, const int *src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// mbarrier in shared memory: a phase completes when `count` arrivals and the expected
// transaction bytes (of TMA copies) have come. Phase k of a barrier completes with its
// k-th use; a wait names the parity k % 2 and returns at once if that phase has completed
// (so parity 1 passes on a fresh barrier: "the use before the first").
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// After the inits, before the block synchronises: the barriers are visible to the copy engine.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// An arrival that ptxas cannot schedule before the instructions computing `after` (any
// value but a negative one; NaN arrives too): the arrival is predicated on it. ptxas
// places a wgmma.wait_group as early as the memory operations before it allow, and the
// independent arithmetic between goes after the wait; an arrival that depends on that
// arithmetic keeps the wait behind it.
__device__ __forceinline__ void mbar_arrive_after(uint64_t *bar, float after) {
    asm volatile(
        "{\n.reg .pred neg;\nsetp.lt.f32 neg, %1, 0f00000000;\n"
        "@!neg mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(smem_addr(bar)),
        "f"(after)
        : "memory");
}
// One arrival that also expects `bytes` more of transactions in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
// An arrival once this thread's earlier cp.async copies have landed (counted in the init
// count: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}

// One box of a tensor map (host: tensor_map_bf16) at coordinates (c0, c1, c2), innermost
// first, into shared memory; its bytes complete a transaction on `bar`. Coordinates past
// the tensor's extent read zeros (and still count their bytes).
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
        "%4}], [%5];\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
}

// A [ROWS x D] bf16 tile of one head (columns head * D ..) of a tensor map, rows row0 ..,
// as D / 64 boxes into a 128-byte-swizzled shared tile (wgmma.cuh's layout: 64-column
// blocks of ROWS rows); its bytes complete a transaction on `bar`.
template <int ROWS, int D>
__device__ __forceinline__ void tma_load_tile(bf16 *tile, const CUtensorMap *map, int head, int row0, int batch,
                                              uint64_t *bar) {
#pragma unroll
    for (int c = 0; c < D / 64; c++) tma_load_3d(tile + c * ROWS * 64, map, head * D + 64 * c, row0, batch, bar);
}

// One box of a 2-D tensor map (host: tensor_map_f32) at coordinates (c0, c1), innermost
// first, into shared memory (128-byte aligned); its bytes complete a transaction on `bar`.
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
        : "memory");
}

// Register reallocation between the warpgroups of a warp-specialised block (each
// warpgroup as a whole): a producer gives registers back, consumers take them.
template <int N>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

}  // namespace
