// Block-sparse flash-attention backward on Hopper wgmma (sm_90a): the pre-pass
// D = rowsum(dO * O), dK/dV over the key-major tile lists with dQ added by bulk
// reductions into one accumulator, fp32 (fast mode) or 32-bit fixed point whose integer
// adds give the same sum in any order (deterministic mode: bitwise-reproducible
// gradients), then the small conversion passes. The dK/dV kernel is warp-specialised as
// the forward: a producer warp brings the tiles (TMA) onto mbarriers, two consumer
// warpgroups compute. Parts, in order: params and workspace (BwdParams, bwd_params,
// BwdWorkspace), the pre-passes (the fixed point's bounds and scales among them), the
// products the pass recomputes, the dK/dV kernel (shared memory, scheduler, producer,
// gradient element work, the dQ staging and reduction, the dK/dV epilogue, the consumer,
// the kernel), the conversion kernels, and the host entry. Shared pieces:
// attention_kernels.cuh.
#include "attention/attention_kernels.cuh"

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

constexpr size_t WORKSPACE_ALIGNMENT = 256;

// Bump allocation of n floats at offset *used of base (nullptr: sizing only).
float *take_floats(void *base, size_t *used, int64_t n) {
    float *at = base ? reinterpret_cast<float *>(static_cast<char *>(base) + *used) : nullptr;
    *used += ((size_t)n * sizeof(float) + WORKSPACE_ALIGNMENT - 1) / WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT;
    return at;
}

BwdWorkspace bwd_workspace(const AttnDims &d, bool deterministic, void *base) {
    const int64_t n_pad = (int64_t)d.batch * d.n_heads * d.s_pad;
    BwdWorkspace w;
    w.bytes = 0;
    w.dsum = take_floats(base, &w.bytes, n_pad);
    w.lse2 = take_floats(base, &w.bytes, n_pad);
    w.dq_accum = take_floats(base, &w.bytes, n_pad * d.head_dim);
    w.dq_scale = deterministic ? take_floats(base, &w.bytes, n_pad) : nullptr;
    w.kv_bound = deterministic ? reinterpret_cast<unsigned long long *>(
                                     take_floats(base, &w.bytes, 4 * (int64_t)d.batch * d.n_kv_heads))
                               : nullptr;
    w.dkv_part = d.group > 1 ? take_floats(base, &w.bytes, 2 * d.group * d.n_kv) : nullptr;
    return w;
}

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

// Heads per L2 section of a backward kernel's blocks (l2_section_heads), or one section of
// every head where they fit twice the budget together: LPT holds only inside a section, so
// the last section's longest blocks start late, which costs small problems more than their
// L2 misses (H=12 KV=4 D=64 S=8192 shared_prefix / strip_thinking: +9 / +12% in sections;
// docs/KERNEL_NOTES.md).
int bwd_l2_heads(int64_t group_bytes, int n_groups, int group) {
    return n_groups * group_bytes <= 2 * L2_SECTION_BYTES ? n_groups * group
                                                          : l2_section_heads(group_bytes, n_groups, group);
}

BwdParams bwd_params(const AttnShape *shape, const AttnMask *mask, const bf16 *q, const bf16 *k,
                     const bf16 *v, const bf16 *out, const float *lse, const bf16 *dout, bf16 *dq,
                     bf16 *dk, bf16 *dv, bool deterministic, void *workspace) {
    BwdParams p;
    static_cast<AttnInputs &>(p) = attn_inputs(shape, mask, q, k, v);
    p.out = out;
    p.dout = dout;
    p.lse = lse;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    CHECK(workspace && (uintptr_t)workspace % WORKSPACE_ALIGNMENT == 0,
          "attention_backward_cuda: workspace %p must be non-null and %zu-byte aligned", workspace,
          WORKSPACE_ALIGNMENT);
    p.ws = bwd_workspace(p.dims, deterministic, workspace);
    const AttnDims &d = p.dims;
    p.map_q = tensor_map_bf16(q, d.q_row_stride, d.seq_len, d.batch, d.q_row_stride, d.q_batch_stride);
    p.map_dout = tensor_map_bf16(dout, d.q_row_stride, d.seq_len, d.batch, d.q_row_stride, d.q_batch_stride);
    p.map_k = tensor_map_bf16(k, d.kv_row_stride, d.seq_len, d.batch, d.kv_row_stride, d.kv_batch_stride);
    p.map_v = tensor_map_bf16(v, d.kv_row_stride, d.seq_len, d.batch, d.kv_row_stride, d.kv_batch_stride);
    const int64_t n_pad = (int64_t)d.batch * d.n_heads * d.s_pad;
    p.map_lse2 = tensor_map_f32(p.ws.lse2, n_pad, BM, 1);
    p.map_dsum = tensor_map_f32(p.ws.dsum, n_pad, BM, 1);
    // What a head's blocks read and add into: Q, dO and dq_accum.
    const int64_t head_elems = (int64_t)d.seq_len * d.head_dim;
    p.dkdv_l2_heads = bwd_l2_heads(head_elems * (2 * (int64_t)sizeof(bf16) + (int64_t)sizeof(float)),
                                   d.batch * d.n_heads, 1);
    return p;
}

// ---------------------------------------------------------------- pre-pass

// Pair i (bf16 elements 2i, 2i + 1) of a 16-byte load of 8 bf16, as floats.
__device__ __forceinline__ float2 bf16_pair(const uint4 &w, int i) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u[i]));
}

// Deterministic mode's fixed point. Row q's dQ before the softmax scale, and each partial
// sum of it over some keys, is at most max|K| (||dO_q|| max_k ||V_k|| + |dsum_q|) in
// magnitude when the row's probabilities sum to 1 (|dP_qk| <= ||dO_q|| ||V_k||, and
// |dsum_q| <= max_k |dP_qk| for the sum dS_qk = P_qk (dP_qk - dsum_q) weighs): scaled by
// 2^f that puts it below 2^FIXED_DQ_BITS, so partials and sums fit 32-bit integers with
// room for rounding, and a partial past FIXED_DQ_LIMIT (a NaN, an infinity: inputs that
// are not finite) makes the row NaN.
constexpr int FIXED_DQ_BITS = 29;
constexpr float FIXED_DQ_LIMIT = 1073741824.0f;  // 2^30

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

// ---------------------------------------------------------------- recomputed products

// Loads four 8 x 8 bf16 matrices, matrix i into register i of every lane in the mma
// fragment layout (row lane / 4, columns 2 (lane % 4) + {0, 1}); lane l gives the
// 16-byte-aligned address of row l % 8 of matrix l / 8 (stmatrix_x4's inverse).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16 *row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row_addr))
                 : "memory");
}

// This warp's 16 rows of the first SLICES 16-wide column slices of a 64-row swizzled tile
// (a K-major operand: rows are the product's M, columns its reduction) as A fragments, an
// operand that stays in registers. A fragment kk (columns 16 kk ..) holds, as acc_to_a builds them from an
// accumulator, register 0 = (row r, columns 2 t + {0, 1}), 1 = (r + 8, same columns),
// 2 = (r, 8 + 2 t + {0, 1}), 3 = (r + 8, 8 + 2 t + {0, 1}), r = 16 w + lane / 4 (warp w of
// the warpgroup), t = lane % 4: register i is the 8 x 8 matrix at rows 16 w + 8 (i % 2),
// columns 16 kk + 8 (i / 2), whose row lane / 4 ldmatrix delivers to that lane. So lane l
// addresses row 16 w + l % 8 + 8 (l / 8 % 2), columns 16 kk + 8 (l / 16): the addresses
// stage_ds gives stmatrix for the same fragments, each 16-byte chunk found through the
// tile's swizzle (wgmma.cuh: chunk c of row r at c ^ (r % 8), the layout TMA writes).
template <int SLICES>
__device__ __forceinline__ void tile_to_a(uint32_t (&a)[SLICES][4], const bf16 *tile) {
    const int l = lane_id();
    const int row = (threadIdx.x / 32) % NUM_WARPS * WARP_ROWS + l % 8 + 8 * (l / 8 % 2);
#pragma unroll
    for (int kk = 0; kk < SLICES; kk++) ldmatrix_x4(a[kk], tile + wgmma::swizzled_offset(row, 16 * kk + 8 * (l / 16), BM));
}

// A recomputed product's A operand: a 64-row swizzled tile whose first R 16-wide column
// slices this warp also holds as A fragments (tile_to_a), read from there.
template <int R>
struct ResidentA {
    const uint32_t (&frags)[R][4];
    const bf16 *tile;
};

// One 16-wide slice kk of a recomputed product s (+)= A B^T over head_dim, B a 64-row
// swizzled tile read K-major, A the same from shared memory or, where resident, from
// registers.
__device__ __forceinline__ void mma_s_slice(float (&s)[BN / 8][4], const bf16 *a, const bf16 *b, int kk) {
    wgmma::mma_ss_n64<0, 0>(s, wgmma::desc_k_major(a, BM, 16 * kk), wgmma::desc_k_major(b, BM, 16 * kk), kk > 0);
}
template <int R>
__device__ __forceinline__ void mma_s_slice(float (&s)[BN / 8][4], const ResidentA<R> &a, const bf16 *b, int kk) {
    if (kk < R) wgmma::mma_rs_n64<0>(s, a.frags[kk < R ? kk : 0], wgmma::desc_k_major(b, BM, 16 * kk), kk > 0);
    else mma_s_slice(s, a.tile, b, kk);
}

// Keeps resident fragments, which only wgmma reads, in their registers into the next step:
// a store of them (to `at`) that ptxas must assume may run, predicated on `tile`, a tile
// index, being negative, which it never is. Without such a read ptxas (CUDA 13.0) gave
// their registers to the step's P^T and dS^T fragments in a dK/dV kernel without dQ,
// so from the second step on S^T and dP^T read those (bwdy-d1's SASS; an empty asm or a
// mov vanishes before register allocation and does not help: docs/KERNEL_NOTES.md).
template <int N>
__device__ __forceinline__ void keep_frags(const uint32_t (&a)[N][4], const void *at, int tile) {
#pragma unroll
    for (int j = 0; j < N; j++)
        asm volatile(
            "{\n.reg .pred neg;\nsetp.lt.s32 neg, %5, 0;\n"
            "@neg st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n}\n" ::"r"(smem_addr(at)),
            "r"(a[j][0]), "r"(a[j][1]), "r"(a[j][2]), "r"(a[j][3]), "r"(tile)
            : "memory");
}

// The A operand of a recomputed product with R resident slices (the tile alone for none).
template <int R, int N>
__device__ __forceinline__ auto a_operand(const uint32_t (&frags)[N][4], const bf16 *tile) {
    if constexpr (R > 0) return ResidentA<R>{frags, tile};
    else return tile;
}

// Issues both recomputed products of a backward step as two wgmma groups, s first:
// s = A_s B_s^T and dp = A_dp B_dp^T over head_dim, every operand a 64-row swizzled tile
// read K-major (S^T = K Q^T, dP^T = V dO^T), each A from shared memory or resident in
// registers (mma_s_slice); the caller then waits for both (landing s alone with wait<1>,
// so that its exponentials overlap dp, was slower in lock step: docs/KERNEL_NOTES.md, v19).
template <int D, typename AS, typename ADP>
__device__ __forceinline__ void issue_s_dp(float (&s)[BN / 8][4], float (&dp)[BN / 8][4], const AS &a_s,
                                           const bf16 *b_s, const ADP &a_dp, const bf16 *b_dp) {
    static_assert(BM == BN, "the four tiles share one row count");
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) mma_s_slice(s, a_s, b_s, kk);
    wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) mma_s_slice(dp, a_dp, b_dp, kk);
    wgmma::commit();
}

// ---------------------------------------------------------------- dK/dV: layout

// The dK/dV block: two consumer warpgroups, warpgroup g owning key tile 2j + g of the
// block's pair (128 keys), both reading the query tiles of the merged key-major lists of
// the pair, and a producer warpgroup of which one thread walks those lists and has the
// copy engine load the tiles (`setmaxnreg`: the producer's warpgroup 24 registers, the
// consumers 240). Sharing the query tiles halves their loads per key. The
// warpgroups take turns at the pair's dQ, warpgroup m % 2 adding step m's over both key
// tiles and reading both warpgroups' dS^T a step late, so neither waits for the other's
// dS^T of the step it is in (a dQ per warpgroup over its own keys, v24-v30, added twice
// the bytes; FA3's split of the columns, X2, read dS^T twice: docs/KERNEL_NOTES.md).
constexpr int DKDV_KEY_TILES = 2;
constexpr int DKDV_THREADS = (DKDV_KEY_TILES + 1) * NUM_THREADS;  // the consumers, then the producer's warpgroup
constexpr int DKDV_PRODUCER_REGS = 24, DKDV_CONSUMER_REGS = 240;
static_assert((DKDV_KEY_TILES * DKDV_CONSUMER_REGS + DKDV_PRODUCER_REGS) * NUM_THREADS <=
                  DKDV_THREADS * (65536 / DKDV_THREADS / 8 * 8),
              "the reallocation keeps the block's registers at launch (65536 per SM, in eights per thread)");
typedef TileStep<DKDV_KEY_TILES> DkdvStep;

// The consumers keep the warpgroup's K and V (64 keys x D) resident as the A fragments of
// S^T = K Q^T and dP^T = V dO^T, loaded once: those products then read only Q and dO from
// shared memory, which bounds them (an SS m64n64k16 reads 4 KiB per 32 tensor clocks, the
// 128 B per clock shared memory delivers; RS reads half). Counted in 16-wide column slices
// of 4 registers: all D / 16 of both at D = 64 (with the 32-register dQ accumulator:
// R0-R210 of 240, R0-R180 without the fragments). At D = 128 dK, dV, S^T and dP^T take 192
// of the 240 registers (the most two consumers can take beside the producer's 24 within
// the launch's 168 per thread), and the 64-register dQ leaves no room.
template <int D>
constexpr int DKDV_RESIDENT = D == 64 ? D / 16 : 0;

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

// K and V of the key pair stay resident; Q, dO and the per-query rows go through STAGES
// stages: step n (of the walk, the closing done step included) in stage n % STAGES, its
// TileStep published there by the producer, with a full barrier (the producer's arrival
// and the copies' bytes; step 0's also covers the key pair) and an empty one (every
// consumer thread is done with the stage).
template <int D, int STAGES>
struct DkdvSmemStages {
    alignas(1024) bf16 k[DKDV_KEY_TILES][BN * D];  // swizzled
    alignas(1024) bf16 v[DKDV_KEY_TILES][BN * D];
    alignas(1024) bf16 q[STAGES][BM * D];
    alignas(1024) bf16 dout[STAGES][BM * D];
    DqStaging<D> dq;
    alignas(128) float lse2[STAGES][BM];  // TMA destinations
    alignas(128) float dsum[STAGES][BM];
    DkdvStep step[STAGES];
    uint64_t full[STAGES], empty[STAGES];  // mbarriers: 1 producer arrival + bytes, every consumer thread
};

// Three stages where they fit (both head dims; 227 KiB is the bound), so the producer can
// run two tiles ahead and a warpgroup up to about two steps ahead of the other.
template <int D>
constexpr int DKDV_STAGES = sizeof(DkdvSmemStages<D, 3>) <= MAX_SMEM_PER_BLOCK ? 3 : 2;
template <int D>
using DkdvSmem = DkdvSmemStages<D, DKDV_STAGES<D>>;

// ---------------------------------------------------------------- dK/dV: scheduler

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

dim3 dkdv_grid(const AttnDims &d) { return dim3(d.batch * d.n_heads * n_tiles(d.n_k_tiles, DKDV_KEY_TILES)); }

// The block's first row in the padded per-query buffers [batch, n_heads, s_pad] (lse2,
// dsum, dq_scale; dq_accum's rows).
__device__ __forceinline__ int64_t head_rows(const AttnDims &d, const DkdvBlock &blk) {
    return ((int64_t)blk.batch * d.n_heads + blk.head) * d.s_pad;
}

// ---------------------------------------------------------------- dK/dV: producer

// Thread 0 of the producer's warpgroup: walks the merged key-major lists of the pair and,
// per step n, waits until stage n % STAGES is free (step n - STAGES released by every
// consumer thread), publishes the step there and has the copy engine bring the query
// tile's Q and dO (TMA, 128-byte swizzle, zeros past seq_len) and its lse2/dsum rows (TMA
// too; padded, always in range) onto the stage's full barrier; step 0 also brings the
// key pair (a missing second tile reads zeros past the end). The walk's end is published
// as a done step; keys nobody sees load nothing.
template <int D, int STAGES>
__device__ __forceinline__ void produce_dkdv(DkdvSmemStages<D, STAGES> &smem, const BwdParams &p,
                                             const DkdvBlock &blk) {
    constexpr int TILE_BYTES = BM * D * (int)sizeof(bf16), ROW_BYTES = BM * (int)sizeof(float);
    constexpr int QUERY_BYTES = 2 * TILE_BYTES + 2 * ROW_BYTES, PAIR_BYTES = 2 * DKDV_KEY_TILES * TILE_BYTES;
    const AttnDims &d = p.dims;
    const int64_t pad_off = head_rows(d, blk);
    MergedLines<DKDV_KEY_TILES> walk;
    walk.init(p.mask.by_key, blk.batch, blk.k_tile0);
#pragma unroll 1
    for (int n = 0;; n++) {
        const DkdvStep step = walk.next();
        const int stage = n % STAGES;
        uint64_t *full = &smem.full[stage];
        if (n >= STAGES) mbar_wait(&smem.empty[stage], (n / STAGES + 1) % 2);  // step n - STAGES released it
        smem.step[stage] = step;
        if (step.done()) {
            mbar_arrive(full);
            return;
        }
        mbar_arrive_expect_tx(full, QUERY_BYTES + (n == 0 ? PAIR_BYTES : 0));
        if (n == 0)
#pragma unroll
            for (int t = 0; t < DKDV_KEY_TILES; t++) {
                const int key0 = (blk.k_tile0 + t) * BN;
                tma_load_tile<BN, D>(smem.k[t], &p.map_k, blk.kv_head, key0, blk.batch, full);
                tma_load_tile<BN, D>(smem.v[t], &p.map_v, blk.kv_head, key0, blk.batch, full);
            }
        const int q0 = step.tile * BM;
        tma_load_tile<BM, D>(smem.q[stage], &p.map_q, blk.head, q0, blk.batch, full);
        tma_load_tile<BM, D>(smem.dout[stage], &p.map_dout, blk.head, q0, blk.batch, full);
        tma_load_2d(smem.lse2[stage], &p.map_lse2, 0, (int)((pad_off + q0) / BM), full);
        tma_load_2d(smem.dsum[stage], &p.map_dsum, 0, (int)((pad_off + q0) / BM), full);
    }
}

// ---------------------------------------------------------------- dK/dV: gradient element work

// The intervals of this thread's two keys (accumulator rows key_row, key_row + 8); keys
// past seq_len are visible to nobody.
struct KeyIntervals {
    int lo[2], hi[2];
};

__device__ __forceinline__ KeyIntervals key_intervals(const BwdParams &p, int batch, int key_row) {
    const AttnDims &d = p.dims;
    KeyIntervals iv;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key_row + 8 * r;
        iv.lo[r] = key < d.seq_len ? p.mask.lo[(int64_t)batch * d.seq_len + key] : 0;
        iv.hi[r] = key < d.seq_len ? p.mask.hi[(int64_t)batch * d.seq_len + key] : 0;
    }
    return iv;
}

// S^T [64 keys x BM queries] becomes P^T = 2^(S^T * scale_log2 - lse2[query]).
__device__ __forceinline__ void probs_t(float (&pt)[BM / 8][4], const float *t_lse2, float scale_log2) {
    const int l = lane_id();
#pragma unroll
    for (int j = 0; j < BM / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float l2 = t_lse2[8 * j + 2 * (l % 4) + e];
            pt[j][e] = fast_exp2(fmaf(pt[j][e], scale_log2, -l2));
            pt[j][2 + e] = fast_exp2(fmaf(pt[j][2 + e], scale_log2, -l2));
        }
    }
}

// P^T = 0 where query q0 + column is hidden from this thread's keys.
__device__ __forceinline__ void mask_probs_t(float (&pt)[BM / 8][4], const KeyIntervals &iv, int q0) {
    const int l = lane_id();
#pragma unroll
    for (int j = 0; j < BM / 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int query = q0 + 8 * j + 2 * (l % 4) + c % 2, r = c / 2;
            if (!(iv.lo[r] <= query && query < iv.hi[r])) pt[j][c] = 0.0f;
        }
}

// P^T becomes dS^T = P^T * (dP^T - dsum[query]), unscaled.
__device__ __forceinline__ void ds_t(float (&pt)[BM / 8][4], const float (&dpt)[BM / 8][4], const float *t_dsum) {
    const int l = lane_id();
#pragma unroll
    for (int j = 0; j < BM / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float ds = t_dsum[8 * j + 2 * (l % 4) + e];
            pt[j][e] *= dpt[j][e] - ds;
            pt[j][2 + e] *= dpt[j][2 + e] - ds;
        }
    }
}

// Issues acc += A^T B as one wgmma group: dV += P^T dO or dK += dS^T Q, the A operand
// (P^T or dS^T, k = queries) from registers, B (dO or Q) MN-major.
template <int D>
__device__ __forceinline__ void issue_dkv(float (&acc)[D / 8][4], const uint32_t (&a_frag)[BM / 16][4],
                                          const bf16 *b) {
    wgmma::fence();
    wgmma::pin(acc);
#pragma unroll
    for (int kk = 0; kk < BM / 16; kk++)
        wgmma::mma_rs<D, 1>(acc, a_frag[kk], wgmma::desc_mn_major(b, BM, 16 * kk, 0), true);
    wgmma::commit();
}

// ---------------------------------------------------------------- dK/dV: dQ staging and reduction

// Stores four 8 x 8 bf16 matrices, matrix i from register i of every lane (the mma
// fragment layout: row lane / 4, columns 2 (lane % 4) + {0, 1}); lane l gives the
// 16-byte-aligned address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4(bf16 *row_addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row_addr)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

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

// ---------------------------------------------------------------- dK/dV: epilogue

// This thread's two key rows below seq_len: dK (times the softmax scale) and dV as bf16
// (store_row_bf16), or with GQA the head's fp32 partial sums at dkv_part[head % group]
// (8-byte stores: 16-byte ones after swaps between lane pairs measured slower at D = 64 and
// made ptxas spill in a dK/dV kernel's loop at D = 128; docs/KERNEL_NOTES.md).
template <int D>
__device__ __forceinline__ void store_dk_dv(const BwdParams &p, const DkdvBlock &blk, int key_row,
                                            const float (&dk_acc)[D / 8][4], const float (&dv_acc)[D / 8][4]) {
    const AttnDims &d = p.dims;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key_row + 8 * r;
        const bool live = key < d.seq_len;
        const int64_t off = ((int64_t)(blk.batch * d.seq_len + (live ? key : 0)) * d.n_kv_heads + blk.kv_head) * D;
        if (d.group == 1) {
            store_row_bf16<D>(p.dk + off, dk_acc, r, d.scale, live);
            store_row_bf16<D>(p.dv + off, dv_acc, r, 1.0f, live);
        } else if (live) {
            float *part_k = p.ws.dkv_part + 2 * (blk.head % d.group) * d.n_kv + off, *part_v = part_k + d.n_kv;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                const int col = 8 * n + 2 * (lane_id() % 4);
                *reinterpret_cast<float2 *>(part_k + col) = make_float2(dk_acc[n][2 * r], dk_acc[n][2 * r + 1]);
                *reinterpret_cast<float2 *>(part_v + col) = make_float2(dv_acc[n][2 * r], dv_acc[n][2 * r + 1]);
            }
        }
    }
}

// ---------------------------------------------------------------- dK/dV: consumer

// Consumer warpgroup g (keys k0 + 64g..) walks the published steps: per query tile, once
// its stage is full, S^T = K Q^T and dP^T = V dO^T (keys are the 64 accumulator rows),
// (K and V as A fragments in registers where DKDV_RESIDENT says so), then dV += P^T dO
// and dK += dS^T Q with P^T, dS^T as register A operands; it stages dS^T and every other
// step adds the last step's dQ while dK runs (at D = 128 issued once dV has completed;
// the last step's after the walk), in fp32 or, FIXED, as fixed point.
// Each thread releases the stage after its warp's last product reading it; the step
// itself is read before (the producer refills the slot only after every thread's
// release). Every thread arrives on the barriers it releases or fills (not lane 0 after
// __syncwarp): racecheck orders a thread's shared-memory accesses only before its own
// arrivals. No copies and no walk here: only products and element work.
template <int D, bool FIXED, int STAGES>
__device__ __forceinline__ void consume_dkdv(DkdvSmemStages<D, STAGES> &smem, const BwdParams &p,
                                             const DkdvBlock &blk, int wg) {
    const AttnDims &d = p.dims;
    const int key_row = (blk.k_tile0 + wg) * BN + warp_row();
    const KeyIntervals keys = key_intervals(p, blk.batch, key_row);
    const bool ragged = ragged_tile(blk.k_tile0 + wg, d.seq_len);

    float dk_acc[D / 8][4], dv_acc[D / 8][4];  // [64 keys x D] over the warpgroup
    zero(dk_acc);
    zero(dv_acc);
    constexpr int RES = DKDV_RESIDENT<D>;
    uint32_t k_frag[RES > 0 ? RES : 1][4], v_frag[RES > 0 ? RES : 1][4];  // this warp's 16 rows of K, V
    if constexpr (RES > 0) {
        // Step 0's stage brought the key pair. A second wait for phase 0 of full[0] (the
        // other is the first issue's): its phase 1 needs the producer's refill for step
        // STAGES, which waits for every consumer thread's release of step 0. An empty walk
        // brings no key pair and uses no fragment. Before the loop, so that ptxas need not
        // keep the ldmatrix addresses.
        mbar_wait(&smem.full[0], 0);
        tile_to_a(k_frag, smem.k[wg]);
        tile_to_a(v_frag, smem.v[wg]);
    }
    int n = 0, last_q0 = 0;  // last_q0: the last step's query tile
    // Step n + 1's S^T and dP^T are issued at the end of step n, right behind its dK, so
    // that the warpgroup's products follow one another without a gap; step n then waits
    // for all of them (no wgmma group crosses the loop's back edge), and the walk's last
    // step issues its own again, which nobody reads: a branch around that issue makes
    // ptxas serialise every wgmma of the kernel (C7512).
    // Issues step `stage`'s S^T and dP^T into s, dp (each declared where it is issued: an
    // accumulator's older values count as inputs of its first product, and would stay live
    // through the step) and waits for every product in flight.
    auto s_dp = [&](float (&s)[BM / 8][4], float (&dp)[BM / 8][4], int stage) {
        issue_s_dp<D>(s, dp, a_operand<RES>(k_frag, smem.k[wg]), smem.q[stage], a_operand<RES>(v_frag, smem.v[wg]),
                      smem.dout[stage]);
        wgmma::wait<0>();
        wgmma::pin(s);
        wgmma::pin(dp);
    };
    float s_ahead[BM / 8][4], dp_ahead[BM / 8][4];  // S^T and dP^T of the next step
    mbar_wait(&smem.full[0], 0);                     // step 0's tile and the key pair landed
    DkdvStep step_ahead = smem.step[0];              // the next step
    if (!step_ahead.done()) s_dp(s_ahead, dp_ahead, 0);

#pragma unroll 1
    for (;; n++) {
        const int stage = n % STAGES;
        const DkdvStep step = step_ahead;
        if (step.done()) break;
        float pt[BM / 8][4], dpt[BM / 8][4];  // S^T then P^T then dS^T; dP^T [64 keys x BM queries]
        copy(pt, s_ahead);
        copy(dpt, dp_ahead);
        const bf16 *t_q = smem.q[stage], *t_do = smem.dout[stage];
        const int q0 = step.tile * BM;
        probs_t(pt, smem.lse2[stage], d.scale_log2);
        // A branch, not predication: full tiles must not pay for the test.
        if (step.of(wg) != TileClass::Full || ragged) mask_probs_t(pt, keys, q0);
        uint32_t p_frag[BM / 16][4];  // P^T as A fragments (k = queries)
        acc_to_a<BM>(p_frag, pt);
        ds_t(pt, dpt, smem.dsum[stage]);
        uint32_t ds_frag[BM / 16][4];
        acc_to_a<BM>(ds_frag, pt);

        issue_dkv<D>(dv_acc, p_frag, t_do);
        // Once dV has landed, P^T's registers are free (for dQ, then the next S^T): waited
        // for where that comes first.
        auto dv_landed = [&] {
            wgmma::pin(dv_acc);
            wgmma::pin(p_frag);
        };
        stage_ds<D>(smem.dq, wg, n, ds_frag);  // under dV
        if (n > 0 && dq_owner(n - 1, wg)) {
            float dq_part[D / 8][4];  // [64 queries x D] of step n - 1
            float row_scale[2];
            load_row_scales<FIXED>(row_scale, p, blk, last_q0);  // under the products
            if constexpr (dq_wide(D)) {
                wgmma::wait<0>();  // dV: P^T's registers hold the dQ accumulator
                dv_landed();
            }
            issue_dq<D>(dq_part, smem, n - 1);
            issue_dkv<D>(dk_acc, ds_frag, t_q);
            wgmma::wait<1>();  // dV and dQ; dK runs on
            if constexpr (!dq_wide(D)) dv_landed();
            reduce_dq<D, FIXED>(smem, p, blk, wg, n - 1, last_q0, dq_part, row_scale);
        } else {
            issue_dkv<D>(dk_acc, ds_frag, t_q);
            if constexpr (dq_wide(D))
                if (n >= 2) release_dq_chunk<D>(smem.dq);  // dQ(n - 2), reduced at step n - 1
            wgmma::wait<1>();  // dV; dK runs on
            dv_landed();
        }
        last_q0 = q0;
        const int next = (n + 1) % STAGES;
        mbar_wait(&smem.full[next], (n + 1) / STAGES % 2);  // step n + 1's tile landed
        step_ahead = smem.step[next];
        float s_next[BM / 8][4], dp_next[BM / 8][4];
        s_dp(s_next, dp_next, step_ahead.done() ? stage : next);  // behind dK; at the walk's end this step's again
        copy(s_ahead, s_next);
        copy(dp_ahead, dp_next);
        wgmma::pin(dk_acc);
        wgmma::pin(ds_frag);
        if constexpr (RES > 0) {
            keep_frags(k_frag, smem.k[wg], step.tile);
            keep_frags(v_frag, smem.v[wg], step.tile);
        }
        mbar_arrive(&smem.empty[stage]);  // this thread is done with the stage (every thread: racecheck)
    }

    if (n > 0 && dq_owner(n - 1, wg)) {
        float dq_part[D / 8][4];
        float row_scale[2];
        load_row_scales<FIXED>(row_scale, p, blk, last_q0);
        issue_dq<D>(dq_part, smem, n - 1);
        wgmma::wait<0>();
        reduce_dq<D, FIXED>(smem, p, blk, wg, n - 1, last_q0, dq_part, row_scale);
    } else if constexpr (dq_wide(D)) {
        if (n >= 2) release_dq_chunk<D>(smem.dq);  // dQ(n - 2), for the other warpgroup's dQ(n - 1)
    }
    bulk_wait_read_all();  // shared memory must outlive the reductions reading it
    store_dk_dv<D>(p, blk, key_row, dk_acc, dv_acc);
}

// ---------------------------------------------------------------- dK/dV: kernel

// Thread 0 sets up the barriers (the block's only block-wide barrier follows); then the
// producer's warpgroup gives its registers to the consumers and its thread 0 produces
// while the others leave. One block per SM. FIXED: deterministic mode's dQ.
template <int D, bool FIXED>
__global__ void __launch_bounds__(DKDV_THREADS, 1) attn_bwd_dkdv_kernel(const __grid_constant__ BwdParams p) {
    typedef DkdvSmem<D> Smem;
    constexpr int STAGES = DKDV_STAGES<D>;
    static_assert(sizeof(Smem) <= MAX_SMEM_PER_BLOCK, "shared memory of one block");
    extern __shared__ unsigned char smem_raw[];
    Smem &smem = *reinterpret_cast<Smem *>(smem_raw);
    const DkdvBlock blk = dkdv_block(p);
    // Through a shuffle, so that ptxas knows it warp-uniform and keeps the wgmma descriptors
    // of the warpgroup's own tiles in uniform registers.
    const int wg = __shfl_sync(0xffffffff, threadIdx.x / NUM_THREADS, 0);

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&smem.full[s], 1);                              // the producer's arrival (and bytes)
            mbar_init(&smem.empty[s], DKDV_KEY_TILES * NUM_THREADS);  // every consumer thread's release
        }
#pragma unroll
        for (int b = 0; b < 2; b++) {
#pragma unroll
            for (int t = 0; t < DKDV_KEY_TILES; t++) mbar_init(&smem.dq.ds_full[b][t], NUM_THREADS);
            mbar_init(&smem.dq.ds_empty[b], NUM_THREADS);  // warpgroup b, its readers
        }
        if constexpr (dq_wide(D))
#pragma unroll
            for (int w = 0; w < NUM_WARPS; w++) mbar_init(&smem.dq.dq_free[w], 32);  // warp w of the owner
        mbar_fence_init();
    }
    __syncthreads();
    if (wg == DKDV_KEY_TILES) {
        regs_dec<DKDV_PRODUCER_REGS>();
        if (threadIdx.x % NUM_THREADS == 0) produce_dkdv(smem, p, blk);
        return;
    }
    regs_inc<DKDV_CONSUMER_REGS>();
    consume_dkdv<D, FIXED>(smem, p, blk, wg);
}

// ---------------------------------------------------------------- conversion kernels

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

// ---------------------------------------------------------------- host

template <int D>
void backward(const BwdParams &p, bool deterministic, cudaStream_t stream) {
    const AttnDims &d = p.dims;
    const int64_t n_pad = (int64_t)d.batch * d.n_heads * d.s_pad;
    constexpr int prep_rows = PREP_THREADS / (D / 8);
    if (deterministic) {
        cudaCheck(cudaMemsetAsync(p.ws.kv_bound, 0, 2 * sizeof(unsigned long long) * d.batch * d.n_kv_heads, stream));
        const dim3 grid((unsigned)d.n_kv_heads, (unsigned)n_tiles(d.seq_len, kv_bound_keys<D>()), (unsigned)d.batch);
        kv_bound_kernel<D><<<grid, KV_BOUND_THREADS, 0, stream>>>(p);
        cudaCheckLaunch();
    }
    attn_bwd_prep_kernel<D><<<(unsigned)((n_pad + prep_rows - 1) / prep_rows), PREP_THREADS, 0, stream>>>(p);
    cudaCheckLaunch();
    if (deterministic) {
        launch(attn_bwd_dkdv_kernel<D, true>, dkdv_grid(d), DKDV_THREADS, sizeof(DkdvSmem<D>), stream, p);
    } else {
        launch(attn_bwd_dkdv_kernel<D, false>, dkdv_grid(d), DKDV_THREADS, sizeof(DkdvSmem<D>), stream, p);
    }
    dq_convert_kernel<<<(unsigned)(n_pad / BM), CONVERT_THREADS, 0, stream>>>(p);
    cudaCheckLaunch();
    if (d.group > 1) {
        dkv_reduce_kernel<<<1024, 256, 0, stream>>>(p);
        cudaCheckLaunch();
    }
}

}  // namespace

extern "C" size_t attention_backward_workspace_bytes(const AttnShape *shape, bool deterministic) {
    return bwd_workspace(attn_dims(shape), deterministic, nullptr).bytes;
}

extern "C" void attention_backward_cuda(const AttnShape *shape, const AttnMask *mask, const attn_bf16 *q,
                                        const attn_bf16 *k, const attn_bf16 *v,
                                        const attn_bf16 *out, const float *lse,
                                        const attn_bf16 *dout, attn_bf16 *dq, attn_bf16 *dk,
                                        attn_bf16 *dv, bool deterministic, void *workspace,
                                        cudaStream_t stream) {
    const BwdParams p = bwd_params(shape, mask, q, k, v, out, lse, dout, dq, dk, dv, deterministic, workspace);
    if (p.dims.head_dim == 64) backward<64>(p, deterministic, stream);
    else backward<128>(p, deterministic, stream);
}
