// Block-sparse flash-attention forward over the query-major tile lists, on Hopper wgmma
// (sm_90a; see attention_kernels.cuh for the shared pieces, wgmma.cuh for the instruction
// layer and docs/KERNEL_NOTES.md for measurements).
#include "attention/attention_kernels.cuh"

namespace {

// ---------------------------------------------------------------- forward

// The forward block takes two adjacent query tiles (2j, 2j+1), one per warpgroup; the two
// warpgroups share every K/V tile loaded into shared memory.
constexpr int FWD_Q_TILES = 2;
constexpr int FWD_THREADS = FWD_Q_TILES * NUM_THREADS;  // one warpgroup (128) per query tile

// The block's key tiles: the union of the lists of its two query tiles (MergedLines in
// shared memory, advanced by thread 0 only: per-thread state would hold 16 registers
// across the main loop). A step is packed into one int: -1 when done, else
// k_tile << 4 | MergedLines flags (bit 2t: query tile t lists the key tile, bit 2t + 1:
// sees it whole).
typedef MergedLines<FWD_Q_TILES> TileWalk;
static_assert(2 * FWD_Q_TILES <= 4, "the flags fit below the key tile");
__device__ int next_packed_step(TileWalk &walk) {
    int flags;
    const int k_tile = walk.next(flags);
    return k_tile == INT_MAX ? -1 : k_tile << 4 | flags;
}

// K/V ring depth: tile j + 1 must be resident while tile j's P V runs, and tile
// j + FWD_STAGES - 1 is loaded meanwhile (two tiles of lead for the copies).
constexpr int FWD_STAGES = 4;

// cp.async.wait_group N: all but the N most recent groups of this thread have landed.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared memory: the K/V ring of swizzled bf16 tiles (1024-byte aligned) then the key
// intervals; 1024 bytes of slack to align the dynamic base. 131 KB at D = 128.
template <int D>
constexpr size_t fwd_smem_bytes() {
    return 1024 + sizeof(bf16) * 2 * FWD_STAGES * BN * D + sizeof(int32_t) * 2 * FWD_STAGES * BN;
}

// Grid (n_heads, ceil(n_q_tiles / 2), batch); query tiles in reverse so the longest
// (causal) start first. Warpgroup w owns query tile first_q_tile + w (warp w' of it rows
// 16w'..16w'+15, wgmma.cuh's accumulator layout); both walk the merged key tiles and
// share each K/V tile of the ring. Q stays in registers as the A operand of S = Q K^T:
// m64n64k16 with both operands in shared memory needs 128 bytes per clock, all of its
// bandwidth (measured: the same time as Q in shared memory, 2.86 ms at S = 16384 causal,
// so that was not the limit; registers are free here and it saves 32 KB and half the
// shared-memory reads of S). Per key tile j, software-pipelined inside the warpgroup
// (FA3's intra-warpgroup overlap): issue S(j+1) = Q K(j+1)^T and O += P(j) V(j), then
// mask and softmax S(j+1) while P(j) V(j) still runs on the tensor cores, then rescale O
// once it has landed. Registers: Q 32 + O 64 + S 32 + P 16 per thread at
// D = 128, so one block of 256 threads per SM (no register cap below 255).
template <int D>
__global__ void __launch_bounds__(FWD_THREADS, 1)
    attn_fwd_kernel(const AttnShape shape, const AttnMask mask, const int32_t *lo, const int32_t *hi,
                    const bf16 *q, const bf16 *k, const bf16 *v, bf16 *out, float *lse) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Aligned by offsetting smem_raw itself, so the compiler still sees shared memory.
    bf16 *s_k = reinterpret_cast<bf16 *>(smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024);  // [FWD_STAGES][BN][D] swizzled
    bf16 *s_v = s_k + FWD_STAGES * BN * D;                                    // [FWD_STAGES][BN][D] swizzled
    int32_t *s_lo = reinterpret_cast<int32_t *>(s_v + FWD_STAGES * BN * D);  // [FWD_STAGES][BN]
    int32_t *s_hi = s_lo + FWD_STAGES * BN;                                   // [FWD_STAGES][BN]
    __shared__ TileWalk walk;
    __shared__ int s_step[FWD_STAGES];  // packed steps (next_packed_step) j.. j + FWD_STAGES - 1, by j % FWD_STAGES

    const int h = blockIdx.x, first_q_tile = (gridDim.y - 1 - blockIdx.y) * FWD_Q_TILES, b = blockIdx.z;
    const int S = shape.seq_len, H = shape.n_heads, KVH = shape.n_kv_heads;
    const int kv_head = h / (H / KVH);
    const int wg = threadIdx.x / NUM_THREADS, warp = (threadIdx.x / 32) % NUM_WARPS, l = lane_id();
    const float scale_log2 = shape.scale * LOG2E;
    const bf16 *q_head = q + (int64_t)b * S * H * D + h * D;
    const bf16 *k_head = k + (int64_t)b * S * KVH * D + kv_head * D;
    const bf16 *v_head = v + (int64_t)b * S * KVH * D + kv_head * D;
    const int32_t *row_lo = lo + (int64_t)b * S, *row_hi = hi + (int64_t)b * S;
    const int q_row = (first_q_tile + wg) * BM + warp * WARP_ROWS + l / 4;  // accumulator row lane/4

    auto load_kv = [&](int step, int stage) {  // one cp.async group per step, empty past the end
        if (step >= 0) {
            const int k0 = (step >> 4) * BN;
            load_tile_swizzled<BN, D, FWD_THREADS>(s_k + stage * BN * D, k_head, KVH * D, k0, S);
            load_tile_swizzled<BN, D, FWD_THREADS>(s_v + stage * BN * D, v_head, KVH * D, k0, S);
            if (threadIdx.x < NUM_THREADS) load_pair64(s_lo + stage * BN, s_hi + stage * BN, row_lo, row_hi, k0, S);
        }
        cp_async_commit();
    };
    if (threadIdx.x == 0) {
        TileList lines[FWD_Q_TILES];
#pragma unroll
        for (int t = 0; t < FWD_Q_TILES; t++) lines[t] = query_major_list(mask, b, first_q_tile + t);
        walk.init(lines);
#pragma unroll
        for (int i = 0; i < FWD_STAGES; i++) s_step[i] = next_packed_step(walk);
    }
    __syncthreads();  // s_step
    int step = s_step[0];
#pragma unroll
    for (int i = 0; i < FWD_STAGES - 1; i++) load_kv(s_step[i], i);
    // This warp's 16 query rows as A fragments (the mma.sync layout wgmma takes from
    // registers), straight from global memory; rows past seq_len are zeros.
    uint32_t q_frag[D / 16][4];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = q_row + 8 * r;
        const uint32_t *src = reinterpret_cast<const uint32_t *>(q_head + (int64_t)qi * H * D + 2 * (l % 4));
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            q_frag[kk][r] = qi < S && step >= 0 ? src[8 * kk] : 0u;
            q_frag[kk][2 + r] = qi < S && step >= 0 ? src[8 * kk + 4] : 0u;
        }
    }

    float o[D / 8][4];  // [64 x D] unnormalised output over the warpgroup
    float s[BN / 8][4];  // [64 x BN] scores of the next key tile
    uint32_t p_frag[BN / 16][4];  // P of this key tile as A fragments (k = keys)
    float row_max[2], row_sum[2], rescale[2];  // scaled base-2 units, rows lane/4 and +8; partial sums
    zero(o);
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;

    auto issue_scores = [&](int stage) {  // S = Q K^T, K from the ring's stage (K-major)
        const bf16 *t_k = s_k + stage * BN * D;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma::mma_rs_n64<0>(s, q_frag[kk], wgmma::desc_k_major(t_k, BN, 16 * kk), kk > 0);
        wgmma::commit();
    };
    // Mask (partial or ragged tiles; all of a tile this query tile's lists do not show,
    // the other's merged in), then s becomes P in base 2 against the new row maximum;
    // row_sum is updated, rescale[r] is what O must be multiplied by.
    auto softmax = [&](int step, int stage) {
        const int flags = step >> (2 * wg);
        const bool ragged = ((step >> 4) + 1) * BN > S;  // keys past seq_len: lo = hi = 0
        if (!(flags & 2) || ragged) {
            if (flags & 1) mask_scores(s, s_lo + stage * BN, s_hi + stage * BN, q_row);
            else
#pragma unroll
                for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = -INFINITY;
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float tile_max = -INFINITY;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) tile_max = fmaxf(tile_max, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
            const float new_max = fmaxf(row_max[r], tile_max * scale_log2);
            const float base = new_max == -INFINITY ? 0.0f : new_max;  // all hidden so far: p = 0
            rescale[r] = fast_exp2(row_max[r] - base);
            row_max[r] = new_max;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = fast_exp2(fmaf(s[j][2 * r + e], scale_log2, -base));
                    s[j][2 * r + e] = p;
                    sum += p;
                }
            }
            row_sum[r] = row_sum[r] * rescale[r] + sum;
        }
    };

    if (step >= 0) {  // step 0: scores and P before the pipelined loop
        cp_async_wait<FWD_STAGES - 2>();
        wgmma::fence_async_shared();
        __syncthreads();  // step 0 landed
        wgmma::fence();
        issue_scores(0);
        wgmma::wait<0>();
        wgmma::pin(s);
        softmax(step, 0);
        acc_to_a<BN>(p_frag, s);  // O is still 0: no rescale
    }
    // Step j's P is in p_frag. The wgmma sequences carry no branch between issue and
    // wait (ptxas serializes them otherwise), so the last step's P V is peeled off.
    for (int j = 0; step >= 0; j++) {
        const int stage = j % FWD_STAGES, next_stage = (j + 1) % FWD_STAGES;
        const int next_step = s_step[next_stage];
        const bf16 *t_v = s_v + stage * BN * D;
        if (next_step < 0) {
            wgmma::fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                wgmma::mma_rs<D, 1>(o, p_frag[kk], wgmma::desc_mn_major(t_v, BN, 16 * kk, 0), true);
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::pin(o);
            wgmma::pin(p_frag);
            break;
        }
        cp_async_wait<FWD_STAGES - 3>();
        wgmma::fence_async_shared();
        // Step j + 1 landed; every warpgroup has finished step j - 1, so its stage
        // (the slot of step j + FWD_STAGES - 1) is free, and s_step's slot of step j + 1
        // is read by everyone before thread 0 reuses the slot of step j.
        __syncthreads();
        load_kv(s_step[(j + FWD_STAGES - 1) % FWD_STAGES], (j + FWD_STAGES - 1) % FWD_STAGES);
        if (threadIdx.x == 0) s_step[stage] = next_packed_step(walk);  // step j + FWD_STAGES

        wgmma::fence();
        issue_scores(next_stage);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)  // O += P V, V MN-major
            wgmma::mma_rs<D, 1>(o, p_frag[kk], wgmma::desc_mn_major(t_v, BN, 16 * kk, 0), true);
        wgmma::commit();
        wgmma::wait<1>();  // the scores; P V may still run
        wgmma::pin(s);
        softmax(next_step, next_stage);
        wgmma::wait<0>();
        wgmma::pin(o);
        wgmma::pin(p_frag);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= rescale[0];
            o[n][1] *= rescale[0];
            o[n][2] *= rescale[1];
            o[n][3] *= rescale[1];
        }
        acc_to_a<BN>(p_frag, s);
        step = next_step;
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        const int qi = q_row + 8 * r;
        if (qi >= S) continue;
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a query that sees nothing outputs 0
        bf16 *dst = out + ((int64_t)(b * S + qi) * H + h) * D + 2 * (l % 4);
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * n) =
                __floats2bfloat162_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (l % 4 == 0)
            lse[((int64_t)b * H + h) * S + qi] = sum > 0.0f ? (row_max[r] + log2f(sum)) * LN2 : -INFINITY;
    }
}

template <int D>
void forward(const AttnShape *s, const AttnMask *m, const bf16 *q, const bf16 *k, const bf16 *v, bf16 *out, float *lse, cudaStream_t stream) {
    const int n_blocks_q = (m->by_query.n_lines + FWD_Q_TILES - 1) / FWD_Q_TILES;
    launch(attn_fwd_kernel<D>, dim3(s->n_heads, n_blocks_q, s->batch), FWD_THREADS, fwd_smem_bytes<D>(), stream,
           *s, *m, m->lo, m->hi, q, k, v, out, lse);
}

}  // namespace

extern "C" void attention_forward_cuda(const AttnShape *shape, const AttnMask *mask, const attn_bf16 *q,
                                       const attn_bf16 *k, const attn_bf16 *v, attn_bf16 *out,
                                       float *lse, cudaStream_t stream) {
    check_args(shape, mask);
    if (shape->head_dim == 64) forward<64>(shape, mask, q, k, v, out, lse, stream);
    else forward<128>(shape, mask, q, k, v, out, lse, stream);
}
