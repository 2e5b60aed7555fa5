// The geometry every part of the attention kernels shares (attention_fwd.cu,
// attention_bwd.cu and the .cuh parts they include; internal to attention/): bf16 data,
// 64 x 64 tiles (mask.h's ATTN_TILE), and warpgroups of four warps in which warp w holds
// rows 16w..16w+15 of each 64-row tile (queries in the forward, keys in the backward), so
// a row reduction needs only a 4-lane shuffle. Products are bf16 with fp32 accumulators
// (wgmma.cuh) and softmax runs in base 2.
//
// The kernel parts, by role:
//   kernel_config.cuh  this geometry and a thread's place in it
//   copy_sm90.cuh      copies and barriers: cp.async, TMA and bulk reductions, mbarriers,
//                      register reallocation
//   wgmma.cuh          the tensor-core products, the swizzled tile layout, descriptors
//   fragments.cuh      register fragments: packing, ldmatrix/stmatrix, rows to global memory
//   tile_walk.cuh      the mask as the kernels read it, the walks over its tile lists, and
//                      the per-element score mask
//   kernel_params.cuh  host side: shape checks, the mask's view, TMA descriptors, launch
//   scheduler.cuh      L2 sections: which work item a block takes
//   softmax.cuh        the forward's online softmax
//   fwd_kernel.cuh     the forward kernel: shared memory, schedule, main loop, epilogue
//   bwd_params.cuh     the backward's params and workspace, its fixed point, and which
//                      tiles a dK/dV block owns
//   bwd_passes.cuh     the backward's small passes: K/V bound, dsum / lse2 / row scales,
//                      the GQA sum of dK/dV partials
//   bwd_dq.cuh         dQ: staging of dS^T, the fp32 or fixed-point reductions, conversion
//   bwd_dkdv.cuh       the dK/dV kernel: shared memory, producer, products, element work,
//                      epilogue
// docs/KERNELS.md has the design and the measurements behind it.
#pragma once
#include "attention/attention_cuda.h"  // ATTN_TILE, __nv_bfloat16

typedef __nv_bfloat16 bf16;

namespace {

constexpr int BM = ATTN_TILE;  // query rows per tile
constexpr int BN = ATTN_TILE;  // key rows per tile
constexpr int NUM_WARPS = 4;
constexpr int NUM_THREADS = 32 * NUM_WARPS;  // one warpgroup
constexpr int WARP_ROWS = 16;  // accumulator rows per warp
static_assert(BM == NUM_WARPS * WARP_ROWS && BN == NUM_WARPS * WARP_ROWS,
              "each warp owns 16 rows of a 64-row tile");
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
// The shared memory one block may opt into on sm_90.
constexpr size_t MAX_SMEM_PER_BLOCK = 227 * 1024;

constexpr int n_tiles(int seq_len, int block) { return (seq_len + block - 1) / block; }

__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }

// The accumulator row of this thread inside its warpgroup's 64-row tile: lane/4 of the
// warp's 16 rows (the thread also holds that row + 8).
__device__ __forceinline__ int warp_row() { return (threadIdx.x / 32) % NUM_WARPS * WARP_ROWS + lane_id() / 4; }

// Whether tile `tile` (BN keys from tile * BN) runs past seq_len.
__device__ __forceinline__ bool ragged_tile(int tile, int seq_len) { return (tile + 1) * BN > seq_len; }

}  // namespace
