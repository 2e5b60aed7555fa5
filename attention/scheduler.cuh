// Which work item a block of the attention kernels takes: items in L2 sections, runs of
// heads whose tensors fit L2 together (FA3's order). The forward and the dK/dV kernel
// build their block schedules on l2_item (fwd_kernel.cuh, bwd_params.cuh).
#pragma once
#include "attention/kernel_params.cuh"

namespace {

// The bytes that the heads of one L2 section may span (FA3's budget; an H200 has 50 MB of
// L2, which also holds the other tensors and the lists).
constexpr int64_t L2_SECTION_BYTES = 32 << 20;

// Heads per L2 section: whole groups of `group` heads (GQA: the query heads of one KV
// head), a power of two of the n_groups groups of group_bytes each that fit
// L2_SECTION_BYTES together, at least one.
inline int l2_section_heads(int64_t group_bytes, int n_groups, int group) {
    int groups = 1;
    while (groups < n_groups && 2 * groups * group_bytes <= L2_SECTION_BYTES) groups *= 2;
    return groups * group;
}

// Work item `item` of a grid over the (batch, head) pairs x n_work tiles, in L2 sections
// (FA3's order): the pairs, batch-major, in runs of `section` heads; inside a run tile 0
// first and the pair fastest. The blocks running at a time so touch the tensors of a few
// heads, which stay in L2 however far apart the blocks are in their walks (head-fastest
// over all heads spans every head: 16 of them at S = 16384 are several times L2). Gives
// the item's head, its KV head, its batch row and its tile in the run's order.
struct L2Item {
    int head, kv_head, batch, tile;
};

__device__ __forceinline__ L2Item l2_item(const AttnDims &d, int item, int n_work, int section) {
    const int run = item / (section * n_work), bh0 = run * section;
    const int w = min(section, d.batch * d.n_heads - bh0), r = item - bh0 * n_work;  // the last run may be short
    const int tile = r / w, bh = bh0 + r - tile * w, head = bh % d.n_heads;
    return {head, head / d.group, bh / d.n_heads, tile};
}

}  // namespace
