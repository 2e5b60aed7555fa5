// Block-sparse flash-attention backward: the D = rowsum(dO*O) pre-pass, dK/dV over the
// key-major tile lists (wgmma, sm_90a) with dQ added by bulk fp32 reductions, or a
// query-major dQ pass for bitwise-reproducible gradients (see attention_kernels.cuh and
// docs/KERNEL_NOTES.md).
#include "attention/attention_kernels.cuh"

namespace {

// ---------------------------------------------------------------- backward

// Per (batch, head, query) padded to whole query tiles: dsum = rowsum(dO * O) and
// lse2 = lse * log2(e), +inf for a query that sees nothing or lies past seq_len (its
// probabilities come out exactly 0). One warp per query row.
template <int D>
__global__ void attn_bwd_prep_kernel(const AttnShape shape, int s_pad, const bf16 *out,
                                     const bf16 *dout, const float *lse, float *dsum, float *lse2) {
    const int S = shape.seq_len, H = shape.n_heads;
    const int64_t row = (int64_t)blockIdx.x * NUM_WARPS + threadIdx.x / 32;  // (b, h, q) padded
    if (row >= (int64_t)shape.batch * H * s_pad) return;
    const int qi = (int)(row % s_pad), h = (int)(row / s_pad % H), b = (int)(row / s_pad / H);
    float acc = 0.0f, l2 = INFINITY;
    if (qi < S) {
        const int64_t off = ((int64_t)(b * S + qi) * H + h) * D;
        for (int d = 2 * lane_id(); d < D; d += 64) {
            float2 o = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(out + off + d));
            float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(dout + off + d));
            acc += o.x * g.x + o.y * g.y;
        }
        const float ls = lse[((int64_t)b * H + h) * S + qi];
        if (ls != -INFINITY) l2 = ls * LOG2E;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffff, acc, off);
    if (lane_id() == 0) {
        dsum[row] = acc;
        lse2[row] = l2;
    }
}

// Both recomputed products of a backward step, in flight together: s = A_s B_s^T and
// dp = A_dp B_dp^T over head_dim, every operand a 64-row swizzled tile read K-major
// (the dK/dV pass: S^T = K Q^T, dP^T = V dO^T; the dQ pass: S = Q K^T, dP = dO V^T).
// Returns with both landed in registers.
template <int D>
__device__ __forceinline__ void recompute_s_dp(float (&s)[BN / 8][4], float (&dp)[BN / 8][4], const bf16 *a_s,
                                               const bf16 *b_s, const bf16 *a_dp, const bf16 *b_dp) {
    static_assert(BM == BN, "the four tiles share one row count");
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma::mma_ss_n64<0, 0>(s, wgmma::desc_k_major(a_s, BM, 16 * kk), wgmma::desc_k_major(b_s, BM, 16 * kk),
                                kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma::mma_ss_n64<0, 0>(dp, wgmma::desc_k_major(a_dp, BM, 16 * kk), wgmma::desc_k_major(b_dp, BM, 16 * kk),
                                kk > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(s);
    wgmma::pin(dp);
}

// The dK/dV block: two warpgroups, warpgroup g owning key tile 2j + g of the block's pair
// (128 keys), both walking the merged key-major lists of the pair. Sharing the query
// tiles halves their loads per key, and dQ = dS K is summed over all 128 keys before it
// is added into the fp32 accumulator, which halves that traffic.
constexpr int DKDV_KEY_TILES = 2;
constexpr int DKDV_THREADS = DKDV_KEY_TILES * NUM_THREADS;
// Row pitch (floats) of the staged dQ tile: 32 bytes past the row, so the float2 stores
// of a warp's 8 rows spread over all banks (two wavefronts, the minimum).
template <int D>
constexpr int dq_stage_pitch() { return D + 8; }

// Shared memory of the dK/dV kernel: swizzled bf16 tiles (1024-byte aligned), the staged
// fp32 dQ tile (ATOMIC_DQ), the per-query fp32 rows; 1024 bytes of slack to align the
// dynamic base.
template <int D, bool ATOMIC_DQ>
constexpr size_t dkdv_smem_bytes() {
    return 1024 +
           sizeof(bf16) * (2 * DKDV_KEY_TILES * BN * D + 4 * BM * D + (ATOMIC_DQ ? DKDV_KEY_TILES * BN * BM : 0)) +
           sizeof(float) * ((ATOMIC_DQ ? BM * dq_stage_pitch<D>() : 0) + 4 * BM);
}

// One block per (key-tile pair, KV head, head split, batch): K and V stay resident while
// the block walks its query heads of the GQA group (group / splits of them) over the
// merged key-major lists, so their dK/dV are summed in registers. With splits == 1 the
// block writes dK/dV (bf16); otherwise it writes its fp32 partial sums into
// dkv_part[split][dK|dV][batch, seq_len, n_kv_heads, head_dim] and dkv_reduce_kernel
// adds the splits. Splitting trades that small pass for parallelism: with GQA groups of
// 8 and a few KV heads, one block per KV head leaves too few, too unequal blocks.
// Per query tile, warpgroup g (keys k0 + 64g..): S^T = K Q^T and dP^T = V dO^T (keys are
// the 64 accumulator rows, warp w keys 16w..16w+15), then dV += P^T dO and dK += dS^T Q
// with P^T, dS^T as register A operands. ATOMIC_DQ: dS^T of both warpgroups staged in
// shared memory, warpgroup g computes dQ columns [g*D/2, (g+1)*D/2) over all 128 keys,
// stages them in shared memory, and the copy engine adds them row by row into
// dq_accum [batch, n_heads, s_pad, head_dim] fp32 (bulk asynchronous reductions: the
// warps go on while the adds run; rows past seq_len add zeros into the padding).
template <int D, bool ATOMIC_DQ>
__global__ void __launch_bounds__(DKDV_THREADS, 1)
    attn_bwd_dkdv_kernel(const AttnShape shape, const TileMask mask, const int32_t *lo,
                         const int32_t *hi, const bf16 *q, const bf16 *k, const bf16 *v,
                         const bf16 *dout, const float *lse2, const float *dsum, int s_pad,
                         float *dq_accum, bf16 *dk, bf16 *dv, int splits, float *dkv_part) {
    constexpr int KT = DKDV_KEY_TILES, DQ_N = D / KT;  // dQ columns per warpgroup
    constexpr int DQ_PITCH = dq_stage_pitch<D>();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Aligned by offsetting smem_raw itself, so the compiler still sees shared memory
    // (LDS/STS rather than generic loads and stores).
    bf16 *s_k = reinterpret_cast<bf16 *>(smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024);  // [KT][BN][D] swizzled
    bf16 *s_v = s_k + KT * BN * D;   // [KT][BN][D] swizzled
    bf16 *s_q = s_v + KT * BN * D;   // [2][BM][D] swizzled
    bf16 *s_do = s_q + 2 * BM * D;   // [2][BM][D] swizzled
    bf16 *s_ds = s_do + 2 * BM * D;  // [KT][BN][BM] dS^T swizzled (ATOMIC_DQ)
    float *s_dq = reinterpret_cast<float *>(s_ds + (ATOMIC_DQ ? KT * BN * BM : 0));  // [BM][DQ_PITCH] (ATOMIC_DQ)
    float *s_lse2 = s_dq + (ATOMIC_DQ ? BM * DQ_PITCH : 0);                          // [2][BM]
    float *s_dsum = s_lse2 + 2 * BM;                                                   // [2][BM]

    const int kv_head = blockIdx.x / splits, split = blockIdx.x % splits, b = blockIdx.z;
    const int S = shape.seq_len, H = shape.n_heads, KVH = shape.n_kv_heads;
    const int heads = H / KVH / splits, first_head = kv_head * (H / KVH) + split * heads;
    const int wg = threadIdx.x / NUM_THREADS, warp = (threadIdx.x / 32) % NUM_WARPS, l = lane_id();
    const int block_k0 = blockIdx.y * KT * BN, k0 = block_k0 + wg * BN;  // block's and warpgroup's first key
    const float scale_log2 = shape.scale * LOG2E;
    TileList lines[KT];
#pragma unroll
    for (int t = 0; t < KT; t++) lines[t] = key_major_list(mask, b, blockIdx.y * KT + t);
    // Steps are (head, query tile) pairs: each head of the block over the merged lines.
    MergedLines<KT> cursor;
    cursor.init(lines);
    auto next_step = [&](int &head, int &flags) {
        int q_tile = cursor.next(flags);
        if (q_tile == INT_MAX && head + 1 < first_head + heads) {
            head++;
            cursor.restart();
            q_tile = cursor.next(flags);
        }
        return q_tile;
    };
    auto load_step = [&](int h, int q_tile, int stage) {
        const int q0 = q_tile * BM;
        const int64_t head_off = (int64_t)b * S * H * D + h * D;
        load_tile_swizzled<BM, D, DKDV_THREADS>(s_q + stage * BM * D, q + head_off, H * D, q0, S);
        load_tile_swizzled<BM, D, DKDV_THREADS>(s_do + stage * BM * D, dout + head_off, H * D, q0, S);
        const int64_t pad_off = ((int64_t)b * H + h) * s_pad;
        if (threadIdx.x < NUM_THREADS)
            load_pair64(s_lse2 + stage * BM, s_dsum + stage * BM, lse2 + pad_off, dsum + pad_off, q0, s_pad);
    };

    int head = first_head, flags;  // flags: MergedLines's, of the step's query tile
    int q_tile = cursor.next(flags);
    if (q_tile != INT_MAX) {  // keys nobody sees skip all loads and store zero gradients
        const int64_t kv_off = (int64_t)b * S * KVH * D + kv_head * D;
#pragma unroll
        for (int t = 0; t < KT; t++) {
            load_tile_swizzled<BN, D, DKDV_THREADS>(s_k + t * BN * D, k + kv_off, KVH * D, block_k0 + t * BN, S);
            load_tile_swizzled<BN, D, DKDV_THREADS>(s_v + t * BN * D, v + kv_off, KVH * D, block_k0 + t * BN, S);
        }
        load_step(head, q_tile, 0);
    }
    cp_async_commit();
    int next_head = head, next_flags;
    int next_q_tile = next_step(next_head, next_flags);

    // This thread's two keys (accumulator rows); keys past seq_len are visible to nobody.
    const int key_row = k0 + warp * WARP_ROWS + l / 4;
    int key_lo[2], key_hi[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key_row + 8 * r;
        key_lo[r] = key < S ? lo[(int64_t)b * S + key] : 0;
        key_hi[r] = key < S ? hi[(int64_t)b * S + key] : 0;
    }
    const bool ragged = k0 + BN > S;
    const bf16 *wg_k = s_k + wg * BN * D, *wg_v = s_v + wg * BN * D;

    float dk_acc[D / 8][4], dv_acc[D / 8][4];  // [64 keys x D] over the warpgroup
    zero(dk_acc);
    zero(dv_acc);

    for (int stage = 0; q_tile != INT_MAX; stage ^= 1) {
        cp_async_wait_all();
        wgmma::fence_async_shared();
        __syncthreads();  // this step landed; every wgmma of the last step has completed
        if (next_q_tile != INT_MAX) load_step(next_head, next_q_tile, stage ^ 1);
        cp_async_commit();
        const bf16 *t_q = s_q + stage * BM * D, *t_do = s_do + stage * BM * D;
        const float *t_lse2 = s_lse2 + stage * BM, *t_dsum = s_dsum + stage * BM;
        const int q0 = q_tile * BM;
        const bool masked = !MergedLines<KT>::sees_whole(flags, wg) || ragged;

        float pt[BM / 8][4], dpt[BM / 8][4];  // S^T then P^T then dS^T; dP^T [64 keys x BM queries]
        recompute_s_dp<D>(pt, dpt, wg_k, t_q, wg_v, t_do);
#pragma unroll
        for (int j = 0; j < BM / 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float l2 = t_lse2[8 * j + 2 * (l % 4) + e];
                pt[j][e] = fast_exp2(fmaf(pt[j][e], scale_log2, -l2));
                pt[j][2 + e] = fast_exp2(fmaf(pt[j][2 + e], scale_log2, -l2));
            }
        }
        if (masked) {  // a branch, not predication: full tiles must not pay for the test
#pragma unroll
            for (int j = 0; j < BM / 8; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int query = q0 + 8 * j + 2 * (l % 4) + c % 2, r = c / 2;
                    if (!(key_lo[r] <= query && query < key_hi[r])) pt[j][c] = 0.0f;
                }
        }
        uint32_t p_frag[BM / 16][4];  // P^T as A fragments (k = queries)
        acc_to_a<BM>(p_frag, pt);
#pragma unroll
        for (int j = 0; j < BM / 8; j++) {  // dS^T = P^T * (dP^T - dsum), unscaled
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float ds = t_dsum[8 * j + 2 * (l % 4) + e];
                pt[j][e] *= dpt[j][e] - ds;
                pt[j][2 + e] *= dpt[j][2 + e] - ds;
            }
        }
        uint32_t ds_frag[BM / 16][4];
        acc_to_a<BM>(ds_frag, pt);

        wgmma::fence();
        wgmma::pin(dv_acc);
        wgmma::pin(dk_acc);
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)  // dV += P^T dO
            wgmma::mma_rs<D, 1>(dv_acc, p_frag[kk], wgmma::desc_mn_major(t_do, BM, 16 * kk, 0), true);
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)  // dK += dS^T Q
            wgmma::mma_rs<D, 1>(dk_acc, ds_frag[kk], wgmma::desc_mn_major(t_q, BM, 16 * kk, 0), true);
        wgmma::commit();

        if (ATOMIC_DQ) {
            // dS^T [keys][queries] to shared memory, the MN-major A operand of dQ = dS K.
            bf16 *wg_ds = s_ds + wg * BN * BM;
            const int ds_row = warp * WARP_ROWS + l / 4;
#pragma unroll
            for (int j = 0; j < BM / 16; j++) {
                const int col = 16 * j + 2 * (l % 4);
                *reinterpret_cast<uint32_t *>(wg_ds + wgmma::swizzled_offset(ds_row, col, BN)) = ds_frag[j][0];
                *reinterpret_cast<uint32_t *>(wg_ds + wgmma::swizzled_offset(ds_row + 8, col, BN)) = ds_frag[j][1];
                *reinterpret_cast<uint32_t *>(wg_ds + wgmma::swizzled_offset(ds_row, col + 8, BN)) = ds_frag[j][2];
                *reinterpret_cast<uint32_t *>(wg_ds + wgmma::swizzled_offset(ds_row + 8, col + 8, BN)) = ds_frag[j][3];
            }
            const int stage_row = threadIdx.x % NUM_THREADS;  // < BM: issues that dQ row's reduction
            if (stage_row < BM) bulk_wait_read_all();      // the last step's rows have left s_dq
            wgmma::fence_async_shared();
            __syncthreads();  // both warpgroups' dS^T are in place; s_dq is free
            // dQ [64 queries x DQ_N] = dS [64 x 128 keys] K [128 keys x DQ_N]; each 16-key
            // slice lies in one key tile. Accumulator rows are queries (warp w rows 16w..).
            float dq_part[DQ_N / 8][4];
            wgmma::fence();
#pragma unroll
            for (int kk = 0; kk < KT * BN / 16; kk++) {
                const int t = kk / (BN / 16), k_in = 16 * (kk % (BN / 16));
                wgmma::mma_ss<DQ_N, 1, 1>(dq_part, wgmma::desc_mn_major(s_ds + t * BN * BM, BN, k_in, 0),
                                          wgmma::desc_mn_major(s_k + t * BN * D, BN, k_in, wg * DQ_N),
                                          kk > 0);
            }
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::pin(dq_part);
            float *wg_dq = s_dq + wg * DQ_N;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float *dst = wg_dq + (warp * WARP_ROWS + l / 4 + 8 * r) * DQ_PITCH + 2 * (l % 4);
#pragma unroll
                for (int n = 0; n < DQ_N / 8; n++)
                    *reinterpret_cast<float2 *>(dst + 8 * n) = make_float2(dq_part[n][2 * r], dq_part[n][2 * r + 1]);
            }
            wgmma::fence_async_shared();
            named_barrier_sync(1 + wg, NUM_THREADS);  // this warpgroup's dQ columns are staged
            if (stage_row < BM) {
                bulk_reduce_add_f32(dq_accum + (((int64_t)b * H + head) * s_pad + q0 + stage_row) * D + wg * DQ_N,
                                    wg_dq + stage_row * DQ_PITCH, DQ_N * (int)sizeof(float));
                bulk_commit();
            }
        }
        wgmma::wait<0>();
        wgmma::pin(dv_acc);
        wgmma::pin(dk_acc);
        wgmma::pin(p_frag);
        wgmma::pin(ds_frag);
        q_tile = next_q_tile;
        head = next_head;
        flags = next_flags;
        next_q_tile = next_step(next_head, next_flags);
    }

    if (ATOMIC_DQ) bulk_wait_all();  // shared memory must outlive the reductions reading it

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key_row + 8 * r;
        if (key >= S) continue;
        const int64_t off = ((int64_t)(b * S + key) * KVH + kv_head) * D + 2 * (l % 4);
        if (splits > 1) {
            const int64_t n_kv = (int64_t)shape.batch * S * KVH * D;
            float *part_k = dkv_part + 2 * split * n_kv + off, *part_v = part_k + n_kv;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                *reinterpret_cast<float2 *>(part_k + 8 * n) =
                    make_float2(dk_acc[n][2 * r], dk_acc[n][2 * r + 1]);
                *reinterpret_cast<float2 *>(part_v + 8 * n) =
                    make_float2(dv_acc[n][2 * r], dv_acc[n][2 * r + 1]);
            }
            continue;
        }
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *reinterpret_cast<__nv_bfloat162 *>(dk + off + 8 * n) = __floats2bfloat162_rn(
                dk_acc[n][2 * r] * shape.scale, dk_acc[n][2 * r + 1] * shape.scale);
            *reinterpret_cast<__nv_bfloat162 *>(dv + off + 8 * n) =
                __floats2bfloat162_rn(dv_acc[n][2 * r], dv_acc[n][2 * r + 1]);
        }
    }
}

// Shared memory of the dQ kernel: swizzled bf16 tiles (1024-byte aligned), the key
// intervals; 1024 bytes of slack to align the dynamic base.
template <int D>
constexpr size_t dq_smem_bytes() {
    return 1024 + sizeof(bf16) * (2 * BM + 4 * BN) * D + sizeof(int32_t) * 4 * BN;
}

// Deterministic dQ: one block (one warpgroup, wgmma) per (head, query tile, batch) over
// the query-major list, Q and dO resident, K/V double-buffered; per key tile S = Q K^T and
// dP = dO V^T from shared memory, then dQ += dS K with dS as the register A operand (three
// products per tile, no atomics). Accumulator rows are queries: warp w rows 16w..16w+15.
template <int D>
__global__ void __launch_bounds__(NUM_THREADS, 2)
    attn_bwd_dq_kernel(const AttnShape shape, const TileMask mask, const int32_t *lo,
                       const int32_t *hi, const bf16 *q, const bf16 *k, const bf16 *v,
                       const bf16 *dout, const float *lse2, const float *dsum, int s_pad, bf16 *dq) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Aligned by offsetting smem_raw itself, so the compiler still sees shared memory.
    bf16 *s_q = reinterpret_cast<bf16 *>(smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024);  // [BM][D] swizzled
    bf16 *s_do = s_q + BM * D;     // [BM][D] swizzled
    bf16 *s_k = s_do + BM * D;     // [2][BN][D] swizzled
    bf16 *s_v = s_k + 2 * BN * D;  // [2][BN][D] swizzled
    int32_t *s_lo = reinterpret_cast<int32_t *>(s_v + 2 * BN * D);  // [2][BN]
    int32_t *s_hi = s_lo + 2 * BN;                                   // [2][BN]

    const int h = blockIdx.x, q_tile = gridDim.y - 1 - blockIdx.y, b = blockIdx.z;
    const int S = shape.seq_len, H = shape.n_heads, KVH = shape.n_kv_heads;
    const int kv_head = h / (H / KVH);
    const int warp = threadIdx.x / 32, l = lane_id();
    const int q0 = q_tile * BM;
    const float scale_log2 = shape.scale * LOG2E;
    const int64_t q_off = (int64_t)b * S * H * D + h * D, kv_off = (int64_t)b * S * KVH * D + kv_head * D;
    const int32_t *row_lo = lo + (int64_t)b * S, *row_hi = hi + (int64_t)b * S;
    const TileList list = query_major_list(mask, b, q_tile);

    auto load_kv = [&](int i, int stage) {
        int k0 = list.tile(i) * BN;
        load_tile_swizzled<BN, D>(s_k + stage * BN * D, k + kv_off, KVH * D, k0, S);
        load_tile_swizzled<BN, D>(s_v + stage * BN * D, v + kv_off, KVH * D, k0, S);
        load_pair64(s_lo + stage * BN, s_hi + stage * BN, row_lo, row_hi, k0, S);
    };
    if (list.n_total > 0) {  // a query tile that sees nothing gets dQ = 0 without loads
        load_tile_swizzled<BM, D>(s_q, q + q_off, H * D, q0, S);
        load_tile_swizzled<BM, D>(s_do, dout + q_off, H * D, q0, S);
        load_kv(0, 0);
    }
    cp_async_commit();

    const int q_row = q0 + warp * WARP_ROWS + l / 4;
    float row_lse2[2], row_dsum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t at = ((int64_t)b * H + h) * s_pad + q_row + 8 * r;  // padded: always in range
        row_lse2[r] = lse2[at];
        row_dsum[r] = dsum[at];
    }
    float dq_acc[D / 8][4];  // [64 queries x D] over the warpgroup
    zero(dq_acc);

    for (int i = 0; i < list.n_total; i++) {
        const int stage = i & 1;
        cp_async_wait_all();
        wgmma::fence_async_shared();
        __syncthreads();  // tile i landed; the last tile's products have completed
        if (i + 1 < list.n_total) load_kv(i + 1, stage ^ 1);
        cp_async_commit();
        const bf16 *t_k = s_k + stage * BN * D, *t_v = s_v + stage * BN * D;

        float p[BN / 8][4], dp[BN / 8][4];  // S then P then dS; dP [64 queries x BN keys]
        recompute_s_dp<D>(p, dp, s_q, t_k, s_do, t_v);
        const bool ragged = (list.tile(i) + 1) * BN > S;
        if (list.is_partial(i) || ragged) mask_scores(p, s_lo + stage * BN, s_hi + stage * BN, q_row);
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                p[j][c] = fast_exp2(fmaf(p[j][c], scale_log2, -row_lse2[c / 2]));
                p[j][c] *= dp[j][c] - row_dsum[c / 2];
            }
        uint32_t ds_frag[BN / 16][4];
        acc_to_a<BN>(ds_frag, p);
        wgmma::fence();
        wgmma::pin(dq_acc);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)  // dQ += dS K
            wgmma::mma_rs<D, 1>(dq_acc, ds_frag[kk], wgmma::desc_mn_major(t_k, BN, 16 * kk, 0), true);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(dq_acc);
        wgmma::pin(ds_frag);
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = q_row + 8 * r;
        if (qi >= S) continue;
        bf16 *dst = dq + ((int64_t)(b * S + qi) * H + h) * D + 2 * (l % 4);
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * n) = __floats2bfloat162_rn(
                dq_acc[n][2 * r] * shape.scale, dq_acc[n][2 * r + 1] * shape.scale);
    }
}

// dq[b, s, h, :] = bf16(scale * dq_accum[b, h, s, :]) (dq_accum has s_pad rows per head),
// 4 elements per thread (head_dim is a multiple of 4).
__global__ void dq_convert_kernel(const float4 *dq_accum, __nv_bfloat162 *dq, const AttnShape shape, int s_pad) {
    const int D4 = shape.head_dim / 4, H = shape.n_heads, S = shape.seq_len;
    const int64_t n4 = (int64_t)shape.batch * S * H * D4;
    const float scale = shape.scale;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / D4;  // (b, s, h)
        const int h = (int)(row % H), si = (int)(row / H % S), b = (int)(row / H / S);
        float4 a = dq_accum[(((int64_t)b * H + h) * s_pad + si) * D4 + i % D4];
        dq[2 * i] = __floats2bfloat162_rn(a.x * scale, a.y * scale);
        dq[2 * i + 1] = __floats2bfloat162_rn(a.z * scale, a.w * scale);
    }
}

// dk = bf16(scale * sum of the splits' dK partials), dv = bf16(sum of dV partials), the
// splits added in ascending order (deterministic); 4 elements per thread.
__global__ void dkv_reduce_kernel(const float4 *dkv_part, int splits, __nv_bfloat162 *dk,
                                  __nv_bfloat162 *dv, int64_t n4, float scale) {
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

// The scratch buffers of one backward call, carved from the caller's workspace (every
// buffer 256-byte aligned); with base == nullptr only `bytes` is computed.
struct BwdWorkspace {
    float *dsum, *lse2;  // [batch, n_heads, s_pad] each
    float *dq_accum;     // [batch, n_heads, s_pad, head_dim], fast mode only
    float *dkv_part;     // [group][dK | dV][batch, seq_len, n_kv_heads, head_dim], GQA only
    size_t bytes;
};

constexpr size_t WORKSPACE_ALIGNMENT = 256;

// Bump allocation of n floats at offset *used of base (nullptr: sizing only).
float *take_floats(void *base, size_t *used, int64_t n) {
    float *at = base ? reinterpret_cast<float *>(static_cast<char *>(base) + *used) : nullptr;
    *used += ((size_t)n * sizeof(float) + WORKSPACE_ALIGNMENT - 1) / WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT;
    return at;
}

BwdWorkspace bwd_workspace(const AttnShape *s, bool deterministic, void *base) {
    const int64_t n_pad = (int64_t)s->batch * s->n_heads * ((s->seq_len + BM - 1) / BM * BM);
    const int64_t n_kv = (int64_t)s->batch * s->seq_len * s->n_kv_heads * s->head_dim;
    const int group = s->n_heads / s->n_kv_heads;
    BwdWorkspace w;
    w.bytes = 0;
    w.dsum = take_floats(base, &w.bytes, n_pad);
    w.lse2 = take_floats(base, &w.bytes, n_pad);
    w.dq_accum = deterministic ? nullptr : take_floats(base, &w.bytes, n_pad * s->head_dim);
    w.dkv_part = group > 1 ? take_floats(base, &w.bytes, 2 * group * n_kv) : nullptr;
    return w;
}

template <int D>
void backward(const AttnShape *s, const TileMask *m, const int32_t *lo, const int32_t *hi,
              const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out, const float *lse,
              const bf16 *dout, bf16 *dq, bf16 *dk, bf16 *dv, bool deterministic, void *workspace,
              cudaStream_t stream) {
    const int s_pad = m->n_q_tiles * BM;
    const int64_t n_pad = (int64_t)s->batch * s->n_heads * s_pad;
    const int64_t n_dq = n_pad * D;
    const BwdWorkspace ws = bwd_workspace(s, deterministic, workspace);
    attn_bwd_prep_kernel<D><<<(unsigned)((n_pad + NUM_WARPS - 1) / NUM_WARPS), NUM_THREADS, 0, stream>>>(
        *s, s_pad, out, dout, lse, ws.dsum, ws.lse2);
    cudaCheckLaunch();
    // One query head per dK/dV block (splits = the GQA group): see attn_bwd_dkdv_kernel.
    const int splits = s->n_heads / s->n_kv_heads;
    const int64_t n_kv = (int64_t)s->batch * s->seq_len * s->n_kv_heads * D;
    const dim3 kv_grid(s->n_kv_heads * splits, (m->n_k_tiles + DKDV_KEY_TILES - 1) / DKDV_KEY_TILES, s->batch);
    if (deterministic) {
        launch(attn_bwd_dkdv_kernel<D, false>, kv_grid, DKDV_THREADS, dkdv_smem_bytes<D, false>(), stream, *s, *m,
               lo, hi, q, k, v, dout, (const float *)ws.lse2, (const float *)ws.dsum, s_pad, ws.dq_accum, dk, dv,
               splits, ws.dkv_part);
        launch(attn_bwd_dq_kernel<D>, dim3(s->n_heads, m->n_q_tiles, s->batch), NUM_THREADS, dq_smem_bytes<D>(),
               stream, *s, *m, lo, hi, q, k, v, dout, (const float *)ws.lse2, (const float *)ws.dsum, s_pad, dq);
    } else {
        cudaCheck(cudaMemsetAsync(ws.dq_accum, 0, n_dq * sizeof(float), stream));
        launch(attn_bwd_dkdv_kernel<D, true>, kv_grid, DKDV_THREADS, dkdv_smem_bytes<D, true>(), stream, *s, *m,
               lo, hi, q, k, v, dout, (const float *)ws.lse2, (const float *)ws.dsum, s_pad, ws.dq_accum, dk, dv,
               splits, ws.dkv_part);
        dq_convert_kernel<<<1024, 256, 0, stream>>>(reinterpret_cast<const float4 *>(ws.dq_accum),
                                                    reinterpret_cast<__nv_bfloat162 *>(dq), *s, s_pad);
        cudaCheckLaunch();
    }
    if (splits > 1) {
        dkv_reduce_kernel<<<1024, 256, 0, stream>>>(reinterpret_cast<const float4 *>(ws.dkv_part), splits,
                                                    reinterpret_cast<__nv_bfloat162 *>(dk),
                                                    reinterpret_cast<__nv_bfloat162 *>(dv), n_kv / 4,
                                                    s->scale);
        cudaCheckLaunch();
    }
}

}  // namespace

extern "C" size_t attention_backward_workspace_bytes(const AttnShape *shape, bool deterministic) {
    return bwd_workspace(shape, deterministic, nullptr).bytes;
}

extern "C" void attention_backward_cuda(const AttnShape *shape, const TileMask *mask,
                                        const int32_t *lo, const int32_t *hi, const attn_bf16 *q,
                                        const attn_bf16 *k, const attn_bf16 *v,
                                        const attn_bf16 *out, const float *lse,
                                        const attn_bf16 *dout, attn_bf16 *dq, attn_bf16 *dk,
                                        attn_bf16 *dv, bool deterministic, void *workspace,
                                        cudaStream_t stream) {
    check_args(shape, mask);
    if (!workspace || (uintptr_t)workspace % WORKSPACE_ALIGNMENT)
        fatal("%s:%d: attention_backward_cuda: workspace %p must be non-null and %zu-byte aligned", __FILE__,
              __LINE__, workspace, WORKSPACE_ALIGNMENT);
    if (shape->head_dim == 64)
        backward<64>(shape, mask, lo, hi, q, k, v, out, lse, dout, dq, dk, dv, deterministic, workspace, stream);
    else
        backward<128>(shape, mask, lo, hi, q, k, v, out, lse, dout, dq, dk, dv, deterministic, workspace, stream);
}
