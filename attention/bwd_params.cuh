// The attention backward's params (built on the host by attention_bwd.cu), the scratch
// workspace of one call, deterministic mode's fixed point of dQ, and the dK/dV kernel's
// block shape and schedule (which key tiles a block owns), which every backward part
// reads.
#pragma once
#include "attention/kernel_config.cuh"
#include "attention/kernel_params.cuh"
#include "attention/scheduler.cuh"

namespace {

// ---------------------------------------------------------------- params and workspace

// The scratch buffers of one backward call, carved from the caller's workspace (every
// buffer 256-byte aligned); with base == nullptr only `bytes` is computed.
struct BwdWorkspace {
    float *dsum, *lse2;  // [batch, n_heads, s_pad] each
    // [batch, n_heads, s_pad, head_dim]: fp32 sums (fast mode), or 32-bit fixed point with
    // 2^f = dq_scale of its row (deterministic mode: integer adds in any order, the same sum)
    float *dq_accum;
    float *dq_scale;                // [batch, n_heads, s_pad], deterministic mode; NaN: the row's dq is NaN
    unsigned long long *kv_bound;  // [batch, n_kv_heads][max |K|, max_k ||V_k||] as doubles' bits, deterministic
    float *dkv_part;                // [group][dK | dV][batch, seq_len, n_kv_heads, head_dim], GQA only
    size_t bytes;
};

// Deterministic mode's fixed point. Row q's dQ before the softmax scale, and each partial
// sum of it over some keys, is at most max|K| (||dO_q|| max_k ||V_k|| + |dsum_q|) in
// magnitude when the row's probabilities sum to 1 (|dP_qk| <= ||dO_q|| ||V_k||, and
// |dsum_q| <= max_k |dP_qk| for the sum dS_qk = P_qk (dP_qk - dsum_q) weighs): scaled by
// 2^f that puts it below 2^FIXED_DQ_BITS, so partials and sums fit 32-bit integers with
// room for rounding, and a partial past FIXED_DQ_LIMIT (a NaN, an infinity: inputs that
// are not finite) makes the row NaN.
constexpr int FIXED_DQ_BITS = 29;
constexpr float FIXED_DQ_LIMIT = 1073741824.0f;  // 2^30

struct BwdParams : AttnInputs {
    const bf16 *out, *dout;
    const float *lse;
    bf16 *dq, *dk, *dv;
    BwdWorkspace ws;
    CUtensorMap map_q, map_k, map_v, map_dout;  // TMA descriptors of the dK/dV kernel's tiles
    // The dK/dV kernel's fp32 copies by tensor map too (racecheck attributes raw-address bulk
    // copies to the issuing thread and reports hazards the mbarriers exclude): lse2 and dsum
    // rows of a query tile.
    CUtensorMap map_lse2, map_dsum;
    int dkdv_l2_heads;  // query heads per L2 section of the dK/dV kernel's blocks (l2_item)
};

// ---------------------------------------------------------------- dK/dV blocks

// The dK/dV block: two consumer warpgroups, warpgroup g owning key tile 2j + g of the
// block's pair (128 keys), both reading the query tiles of the merged key-major lists of
// the pair, and a producer warpgroup of which one thread walks those lists and has the
// copy engine load the tiles (`setmaxnreg`: the producer's warpgroup 24 registers, the
// consumers 240). Sharing the query tiles halves their loads per key. The
// warpgroups take turns at the pair's dQ, warpgroup m % 2 adding step m's over both key
// tiles and reading both warpgroups' dS^T a step late, so neither waits for the other's
// dS^T of the step it is in (a dQ per warpgroup over its own keys adds twice the bytes;
// FA3's split of the columns reads dS^T twice: docs/KERNELS.md).
constexpr int DKDV_KEY_TILES = 2;

// One block per (batch, query head, key pair) in L2 sections of dkdv_l2_heads heads
// (l2_item), the key pairs ascending (the longest under causal first): one query head per
// block (its KV head head / group), so GQA groups spread over more, more equal blocks;
// key tiles k_tile0 + g for warpgroup g. With GQA the block's dK/dV are fp32 partial sums
// of its head, which dkv_reduce_kernel adds up.
struct DkdvBlock {
    int head, kv_head, batch, k_tile0;
};

__device__ __forceinline__ DkdvBlock dkdv_block(const BwdParams &p) {
    const AttnDims &d = p.dims;
    const L2Item it = l2_item(d, blockIdx.x, n_tiles(d.n_k_tiles, DKDV_KEY_TILES), p.dkdv_l2_heads);
    return {it.head, it.kv_head, it.batch, it.tile * DKDV_KEY_TILES};
}

inline dim3 dkdv_grid(const AttnDims &d) { return dim3(d.batch * d.n_heads * n_tiles(d.n_k_tiles, DKDV_KEY_TILES)); }

// The block's first row in the padded per-query buffers [batch, n_heads, s_pad] (lse2,
// dsum, dq_scale; dq_accum's rows).
__device__ __forceinline__ int64_t head_rows(const AttnDims &d, const DkdvBlock &blk) {
    return ((int64_t)blk.batch * d.n_heads + blk.head) * d.s_pad;
}

}  // namespace
