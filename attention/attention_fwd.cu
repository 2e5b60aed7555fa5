// Block-sparse flash-attention forward over the query-major tile lists (see
// attention_kernels.cuh for the shared pieces and docs/KERNEL_NOTES.md for measurements).
#include "attention/attention_kernels.cuh"

namespace {

// ---------------------------------------------------------------- forward

// The forward block takes two adjacent query tiles (2j, 2j+1): each warp owns 16 rows of
// each, so every K/V fragment read from shared memory feeds two products.
constexpr int FWD_Q_TILES = 2;

// Key tiles of the block's query tiles, merged in ascending order: the union of the
// full and partial lists of both; per key tile, whether each query tile sees it whole.
struct MergedKeyTiles {
    const int32_t *list[2 * FWD_Q_TILES];  // per query tile: full, partial
    int count[2 * FWD_Q_TILES], pos[2 * FWD_Q_TILES];

    __device__ MergedKeyTiles(const TileMask &m, int row, int first_q_tile) {
#pragma unroll
        for (int t = 0; t < FWD_Q_TILES; t++) {
            const int q_tile = first_q_tile + t;
            const bool exists = q_tile < m.n_q_tiles;  // an odd last tile has no partner
            const int64_t slot = (int64_t)row * m.n_q_tiles + q_tile;
            list[2 * t] = m.q_full_idx + slot * m.n_k_tiles;
            list[2 * t + 1] = m.q_partial_idx + slot * m.n_k_tiles;
            count[2 * t] = exists ? m.q_full_count[slot] : 0;
            count[2 * t + 1] = exists ? m.q_partial_count[slot] : 0;
            pos[2 * t] = pos[2 * t + 1] = 0;
        }
    }
    __device__ int head(int i) const { return pos[i] < count[i] ? list[i][pos[i]] : INT_MAX; }
    // The next key tile (INT_MAX when done); full[t]: query tile t sees all of it.
    __device__ int next(bool (&full)[FWD_Q_TILES]) {
        int k_tile = INT_MAX;
#pragma unroll
        for (int i = 0; i < 2 * FWD_Q_TILES; i++) k_tile = min(k_tile, head(i));
#pragma unroll
        for (int t = 0; t < FWD_Q_TILES; t++) full[t] = head(2 * t) == k_tile;
#pragma unroll
        for (int i = 0; i < 2 * FWD_Q_TILES; i++) pos[i] += head(i) == k_tile;
        return k_tile;
    }
};

template <int D>
constexpr size_t fwd_smem_bytes() {
    return sizeof(bf16) * (FWD_Q_TILES * BM + 4 * BN) * (D + PAD) + sizeof(int32_t) * 4 * BN;
}

// Grid (n_heads, ceil(n_q_tiles / 2), batch); query tiles in reverse so the longest
// (causal) start first. Query tiles the merged list does not show in a key tile (empty
// for them) take the per-element test like partial ones: lo/hi hide every pair.
template <int D>
__global__ void __launch_bounds__(NUM_THREADS)
    attn_fwd_kernel(const AttnShape shape, const TileMask mask, const int32_t *lo, const int32_t *hi,
                    const bf16 *q, const bf16 *k, const bf16 *v, bf16 *out, float *lse) {
    constexpr int LD = D + PAD, MB = FWD_Q_TILES;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *s_q = reinterpret_cast<bf16 *>(smem);   // [MB * BM][LD]
    bf16 *s_k = s_q + MB * BM * LD;                // [2][BN][LD]
    bf16 *s_v = s_k + 2 * BN * LD;                 // [2][BN][LD]
    int32_t *s_lo = reinterpret_cast<int32_t *>(s_v + 2 * BN * LD);  // [2][BN]
    int32_t *s_hi = s_lo + 2 * BN;                                   // [2][BN]

    const int h = blockIdx.x, first_q_tile = (gridDim.y - 1 - blockIdx.y) * MB, b = blockIdx.z;
    const int S = shape.seq_len, H = shape.n_heads, KVH = shape.n_kv_heads;
    const int kv_head = h / (H / KVH);
    const int warp = threadIdx.x / 32, l = lane_id();
    const int q0 = first_q_tile * BM;
    const float scale_log2 = shape.scale * LOG2E;
    const bf16 *q_head = q + (int64_t)b * S * H * D + h * D;
    const bf16 *k_head = k + (int64_t)b * S * KVH * D + kv_head * D;
    const bf16 *v_head = v + (int64_t)b * S * KVH * D + kv_head * D;
    const int32_t *row_lo = lo + (int64_t)b * S, *row_hi = hi + (int64_t)b * S;
    MergedKeyTiles tiles(mask, b, first_q_tile);

    auto load_kv = [&](int k_tile, int stage) {
        const int k0 = k_tile * BN;
        load_tile<BN, D>(s_k + stage * BN * LD, k_head, KVH * D, k0, S);
        load_tile<BN, D>(s_v + stage * BN * LD, v_head, KVH * D, k0, S);
        load_pair64(s_lo + stage * BN, s_hi + stage * BN, row_lo, row_hi, k0, S);
    };
    bool full[MB];
    int k_tile = tiles.next(full);
    load_tile<MB * BM, D>(s_q, q_head, H * D, q0, S);
    if (k_tile != INT_MAX) load_kv(k_tile, 0);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    float o[MB][D / 8][4];  // [16 x D] unnormalised output per query tile
    float row_max[MB][2], row_sum[MB][2];  // scaled base-2 units, rows lane/4 and +8; partial sums
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
        zero(o[mb]);
        row_max[mb][0] = row_max[mb][1] = -INFINITY;
        row_sum[mb][0] = row_sum[mb][1] = 0.0f;
    }
    // Accumulator row lane/4 of block mb is query q0 + mb*BM + warp*16 + lane/4.
    const int q_row = q0 + warp * WARP_ROWS + l / 4;

    for (int stage = 0; k_tile != INT_MAX; stage ^= 1) {
        bool next_full[MB];
        const int next_tile = tiles.next(next_full);
        if (next_tile != INT_MAX) load_kv(next_tile, stage ^ 1);
        cp_async_commit();

        float s[MB][BN / 8][4];  // [16 x BN] scores per query tile
#pragma unroll
        for (int mb = 0; mb < MB; mb++) zero(s[mb]);
        gemm_smem_a_mb<MB, BN, D, false, false>(s, s_q, LD, warp * WARP_ROWS, BM, s_k + stage * BN * LD, LD);
        const bool ragged = (k_tile + 1) * BN > S;  // keys past seq_len: lo = hi = 0
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
            if (!full[mb] || ragged) mask_scores(s[mb], s_lo + stage * BN, s_hi + stage * BN, q_row + mb * BM);

#pragma unroll
        for (int mb = 0; mb < MB; mb++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float tile_max = -INFINITY;
#pragma unroll
                for (int j = 0; j < BN / 8; j++)
                    tile_max = fmaxf(tile_max, fmaxf(s[mb][j][2 * r], s[mb][j][2 * r + 1]));
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
                const float new_max = fmaxf(row_max[mb][r], tile_max * scale_log2);
                const float base = new_max == -INFINITY ? 0.0f : new_max;  // all hidden so far: p = 0
                const float rescale = fast_exp2(row_max[mb][r] - base);
                row_max[mb][r] = new_max;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < BN / 8; j++) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float p = fast_exp2(fmaf(s[mb][j][2 * r + e], scale_log2, -base));
                        s[mb][j][2 * r + e] = p;
                        sum += p;
                    }
                }
                row_sum[mb][r] = row_sum[mb][r] * rescale + sum;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    o[mb][n][2 * r] *= rescale;
                    o[mb][n][2 * r + 1] *= rescale;
                }
            }
        }
        uint32_t p_frag[MB][BN / 16][4];
#pragma unroll
        for (int mb = 0; mb < MB; mb++) acc_to_a<BN>(p_frag[mb], s[mb]);
        gemm_reg_a_mb<MB, D, BN, true>(o, p_frag, s_v + stage * BN * LD, LD);

        k_tile = next_tile;
#pragma unroll
        for (int mb = 0; mb < MB; mb++) full[mb] = next_full[mb];
        cp_async_wait_all();
        __syncthreads();  // the next tile landed; everyone is done with this one's buffers
    }

#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = row_sum[mb][r];
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            const int qi = q_row + mb * BM + 8 * r;
            if (qi >= S) continue;
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a query that sees nothing outputs 0
            bf16 *dst = out + ((int64_t)(b * S + qi) * H + h) * D + 2 * (l % 4);
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * n) =
                    __floats2bfloat162_rn(o[mb][n][2 * r] * inv, o[mb][n][2 * r + 1] * inv);
            if (l % 4 == 0)
                lse[((int64_t)b * H + h) * S + qi] =
                    sum > 0.0f ? (row_max[mb][r] + log2f(sum)) * LN2 : -INFINITY;
        }
    }
}

template <int D>
void forward(const AttnShape *s, const TileMask *m, const int32_t *lo, const int32_t *hi,
             const bf16 *q, const bf16 *k, const bf16 *v, bf16 *out, float *lse, cudaStream_t stream) {
    const int n_blocks_q = (m->n_q_tiles + FWD_Q_TILES - 1) / FWD_Q_TILES;
    launch(attn_fwd_kernel<D>, dim3(s->n_heads, n_blocks_q, s->batch), NUM_THREADS, fwd_smem_bytes<D>(), stream,
           *s, *m, lo, hi, q, k, v, out, lse);
}

}  // namespace

extern "C" void attention_forward_cuda(const AttnShape *shape, const TileMask *mask,
                                       const int32_t *lo, const int32_t *hi, const attn_bf16 *q,
                                       const attn_bf16 *k, const attn_bf16 *v, attn_bf16 *out,
                                       float *lse, cudaStream_t stream) {
    check_args(shape, mask);
    if (shape->head_dim == 64) forward<64>(shape, mask, lo, hi, q, k, v, out, lse, stream);
    else forward<128>(shape, mask, lo, hi, q, k, v, out, lse, stream);
}
