// Block-sparse flash attention kernels, FlashAttention-2 structure on mma.sync
// (KERNELS.md): bf16 m16n8k16 tensor-core products with fp32 accumulators, ldmatrix
// from row-padded shared memory, cp.async double buffering, online softmax in base 2,
// P kept in registers as the A operand of the next product.
//
// Every kernel uses 4 warps and 64x64 tiles; each warp owns 16 rows of each 64-row tile
// (queries in the forward and the dQ pass, keys in the dK/dV pass), so row reductions
// need only a 4-lane shuffle and dK/dV need no cross-warp reduction. The forward block
// takes two query tiles (32 rows per warp) so each K/V fragment feeds two products.
// Measurements and the reasons for these choices: docs/KERNEL_NOTES.md.
#include "attention/attention_cuda.h"

#include <limits.h>
#include <math.h>
#include "attention/wgmma.cuh"
#include "common/cuda_check.h"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int BM = ATTN_CUDA_BLOCK_M;  // query rows per tile
constexpr int BN = ATTN_CUDA_BLOCK_N;  // key rows per tile
constexpr int NUM_WARPS = 4;
constexpr int NUM_THREADS = 32 * NUM_WARPS;
constexpr int WARP_ROWS = 16;  // rows of one m16n8k16 product
static_assert(BM == NUM_WARPS * WARP_ROWS && BN == NUM_WARPS * WARP_ROWS,
              "each warp owns 16 rows of a 64-row tile");
// bf16 elements of padding per shared-memory row: a row pitch of 16 bytes past a
// multiple of 128 puts the 8 rows of one ldmatrix in 8 different bank groups.
constexpr int PAD = 8;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// ---------------------------------------------------------------- primitives

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is not read).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c[16x8] += a[16x16] * b[16x8], bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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

// Fragment loads. Accumulator layout of a 16x8 tile: c[0], c[1] at row lane/4, columns
// 2*(lane%4) + {0,1}; c[2], c[3] the same columns at row lane/4 + 8.

// A fragment (16 rows m0.. x 16 k k0..) of a row-major shared matrix A[m][k].
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16 *A, int lda, int m0, int k0) {
    int l = lane_id();
    ldsm_x4(a, A + (m0 + l % 16) * lda + k0 + (l / 16) * 8);
}
// The same fragment of A stored transposed, At[k][m].
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16 *At, int lda, int m0,
                                             int k0) {
    int l = lane_id();
    ldsm_x4_trans(a, At + (k0 + l % 8 + (l / 16) * 8) * lda + m0 + ((l / 8) % 2) * 8);
}
// B fragments of two 16x8 blocks (columns n0.. and n0+8..): b[0], b[1] for n0; b[2],
// b[3] for n0+8. B_KN: B stored k-major, B[k][n]; otherwise n-major, Bt[n][k].
template <bool B_KN>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const bf16 *B, int ldb, int n0, int k0) {
    int l = lane_id();
    if (B_KN)
        ldsm_x4_trans(b, B + (k0 + l % 8 + ((l / 8) % 2) * 8) * ldb + n0 + (l / 16) * 8);
    else
        ldsm_x4(b, B + (n0 + l % 8 + (l / 16) * 8) * ldb + k0 + ((l / 8) % 2) * 8);
}

// Warp products over MB row blocks of 16, acc[mb][16 x N] += A_mb[16 x K] * B[K x N]:
// each B fragment loaded from shared memory feeds MB products (MB = 2 halves the
// shared-memory traffic per flop). A given as register fragments (K/16 per block):
template <int MB, int N, int K, bool B_KN>
__device__ __forceinline__ void gemm_reg_a_mb(float (&acc)[MB][N / 8][4],
                                           const uint32_t (&a)[MB][K / 16][4], const bf16 *B, int ldb) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t b[4];
            load_b<B_KN>(b, B, ldb, nn * 16, kk * 16);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                mma16816(acc[mb][2 * nn], a[mb][kk], b[0], b[1]);
                mma16816(acc[mb][2 * nn + 1], a[mb][kk], b[2], b[3]);
            }
        }
    }
}
// A read from shared memory, block mb at rows m0 + mb * m_step (A_TRANS: stored At[k][m]):
template <int MB, int N, int K, bool A_TRANS, bool B_KN>
__device__ __forceinline__ void gemm_smem_a_mb(float (&acc)[MB][N / 8][4], const bf16 *A, int lda,
                                            int m0, int m_step, const bf16 *B, int ldb) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[MB][4];
#pragma unroll
        for (int mb = 0; mb < MB; mb++) {
            if (A_TRANS) load_a_trans(a[mb], A, lda, m0 + mb * m_step, kk * 16);
            else load_a(a[mb], A, lda, m0 + mb * m_step, kk * 16);
        }
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t b[4];
            load_b<B_KN>(b, B, ldb, nn * 16, kk * 16);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                mma16816(acc[mb][2 * nn], a[mb], b[0], b[1]);
                mma16816(acc[mb][2 * nn + 1], a[mb], b[2], b[3]);
            }
        }
    }
}
// One-block forms (the backward kernels).
template <int N, int K, bool B_KN>
__device__ __forceinline__ void gemm_reg_a(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4],
                                           const bf16 *B, int ldb) {
    gemm_reg_a_mb<1, N, K, B_KN>(reinterpret_cast<float(&)[1][N / 8][4]>(acc),
                              reinterpret_cast<const uint32_t(&)[1][K / 16][4]>(a), B, ldb);
}
template <int N, int K, bool A_TRANS, bool B_KN>
__device__ __forceinline__ void gemm_smem_a(float (&acc)[N / 8][4], const bf16 *A, int lda, int m0,
                                            const bf16 *B, int ldb) {
    gemm_smem_a_mb<1, N, K, A_TRANS, B_KN>(reinterpret_cast<float(&)[1][N / 8][4]>(acc), A, lda, m0, 0,
                                        B, ldb);
}

// An accumulator [16 x N] as bf16 A fragments of the next product (k = its columns).
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

// Rows [row0, row0 + ROWS) of one head of a [seq_len, row_stride] bf16 matrix into a
// shared tile [ROWS][D + PAD]; rows past seq_len become zeros.
template <int ROWS, int D>
__device__ __forceinline__ void load_tile(bf16 *tile, const bf16 *head_base, int row_stride,
                                          int row0, int seq_len) {
    constexpr int CHUNKS = D / 8;  // 16-byte pieces per row
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NUM_THREADS) {
        int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        bool valid = row0 + r < seq_len;
        const bf16 *src = head_base + (valid ? (int64_t)(row0 + r) * row_stride + c : 0);
        cp_async16(tile + r * (D + PAD) + c, src, valid);
    }
}

// 64 entries [i0, i0 + 64) of two int/float arrays into shared memory, zero past `end`.
// For key intervals, zero means lo = hi = 0: visible to nobody.
template <typename T>
__device__ __forceinline__ void load_pair64(T *dst_a, T *dst_b, const T *a, const T *b, int i0,
                                            int end) {
    static_assert(NUM_THREADS == 128, "one thread per entry of the two arrays");
    int i = threadIdx.x % 64;
    bool valid = i0 + i < end;
    if (threadIdx.x < 64) cp_async4(dst_a + i, a + (valid ? i0 + i : 0), valid);
    else cp_async4(dst_b + i, b + (valid ? i0 + i : 0), valid);
}

// ---------------------------------------------------------------- tile lists

// One line of a row's tile matrix: full tiles first (no mask work), then partial.
struct TileList {
    const int32_t *full, *partial;
    int n_full, n_total;
    __device__ int tile(int i) const { return i < n_full ? full[i] : partial[i - n_full]; }
    __device__ bool is_partial(int i) const { return i >= n_full; }
};

__device__ TileList query_major_list(const TileMask &m, int row, int q_tile) {
    int64_t slot = (int64_t)row * m.n_q_tiles + q_tile;
    int n_full = m.q_full_count[slot];
    return {m.q_full_idx + slot * m.n_k_tiles, m.q_partial_idx + slot * m.n_k_tiles, n_full,
            n_full + m.q_partial_count[slot]};
}

__device__ TileList key_major_list(const TileMask &m, int row, int k_tile) {
    int64_t slot = (int64_t)row * m.n_k_tiles + k_tile;
    int n_full = m.k_full_count[slot];
    return {m.k_full_idx + slot * m.n_q_tiles, m.k_partial_idx + slot * m.n_q_tiles, n_full,
            n_full + m.k_partial_count[slot]};
}

// Scores [16 x BN] of one warp: -inf where key k (columns, lo/hi from shared memory)
// is hidden from query q_row (accumulator row lane/4) or q_row + 8.
__device__ __forceinline__ void mask_scores(float (&s)[BN / 8][4], const int32_t *tile_lo,
                                            const int32_t *tile_hi, int q_row) {
    int l = lane_id();
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int col = 8 * j + 2 * (l % 4) + e;
            int lo = tile_lo[col], hi = tile_hi[col];
            if (!(lo <= q_row && q_row < hi)) s[j][e] = -INFINITY;
            if (!(lo <= q_row + 8 && q_row + 8 < hi)) s[j][2 + e] = -INFINITY;
        }
    }
}

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

// Rows [row0, row0 + ROWS) of one head of a [seq_len, row_stride] bf16 matrix into a
// 128-byte-swizzled shared tile (wgmma.cuh); rows past seq_len become zeros.
template <int ROWS, int D>
__device__ __forceinline__ void load_tile_swizzled(bf16 *tile, const bf16 *head_base, int row_stride,
                                                   int row0, int seq_len) {
    constexpr int CHUNKS = D / 8;  // 16-byte pieces per row
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NUM_THREADS) {
        int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        bool valid = row0 + r < seq_len;
        const bf16 *src = head_base + (valid ? (int64_t)(row0 + r) * row_stride + c : 0);
        cp_async16(tile + wgmma::swizzled_offset(r, c, ROWS), src, valid);
    }
}

// Shared memory of the dK/dV kernel: swizzled bf16 tiles (1024-byte aligned), then the
// per-query fp32 rows; 1024 bytes of slack to align the dynamic base.
template <int D, bool ATOMIC_DQ>
constexpr size_t dkdv_smem_bytes() {
    return 1024 + sizeof(bf16) * (2 * BN * D + 4 * BM * D + (ATOMIC_DQ ? BN * BM : 0)) +
           sizeof(float) * 4 * BM;
}

// One block (one warpgroup, wgmma on sm_90a) per (key tile, KV head, head split, batch):
// K and V stay resident while the block walks its query heads of the GQA group (group /
// splits of them) over the key-major list, so their dK/dV are summed in registers. With
// splits == 1 the block writes dK/dV (bf16); otherwise it writes its fp32 partial sums
// into dkv_part[split][dK|dV][batch, seq_len, n_kv_heads, head_dim] and dkv_reduce_kernel
// adds the splits. Splitting trades that small pass for parallelism: with GQA groups of
// 8 and a few KV heads, one block per KV head leaves too few, too unequal blocks.
// Per query tile: S^T = K Q^T and dP^T = V dO^T (keys are the 64 accumulator rows, warp w
// keys 16w..16w+15), then dV += P^T dO and dK += dS^T Q with P^T, dS^T as register A
// operands. ATOMIC_DQ: also dQ += dS K (dS^T staged in shared memory) added into an fp32
// accumulator with atomics.
template <int D, bool ATOMIC_DQ>
__global__ void __launch_bounds__(NUM_THREADS, 2)
    attn_bwd_dkdv_kernel(const AttnShape shape, const TileMask mask, const int32_t *lo,
                         const int32_t *hi, const bf16 *q, const bf16 *k, const bf16 *v,
                         const bf16 *dout, const float *lse2, const float *dsum, int s_pad,
                         float *dq_accum, bf16 *dk, bf16 *dv, int splits, float *dkv_part) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *s_k = reinterpret_cast<bf16 *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);  // [BN][D] swizzled
    bf16 *s_v = s_k + BN * D;      // [BN][D] swizzled
    bf16 *s_q = s_v + BN * D;      // [2][BM][D] swizzled
    bf16 *s_do = s_q + 2 * BM * D;  // [2][BM][D] swizzled
    bf16 *s_ds = s_do + 2 * BM * D;  // [BN][BM] dS^T swizzled (ATOMIC_DQ)
    float *s_lse2 = reinterpret_cast<float *>(s_ds + (ATOMIC_DQ ? BN * BM : 0));  // [2][BM]
    float *s_dsum = s_lse2 + 2 * BM;                                              // [2][BM]

    const int kv_head = blockIdx.x / splits, split = blockIdx.x % splits;
    const int k_tile = blockIdx.y, b = blockIdx.z;
    const int S = shape.seq_len, H = shape.n_heads, KVH = shape.n_kv_heads;
    const int heads = H / KVH / splits, first_head = kv_head * (H / KVH) + split * heads;
    const int warp = threadIdx.x / 32, l = lane_id();
    const int k0 = k_tile * BN;
    const float scale_log2 = shape.scale * LOG2E;
    const TileList list = key_major_list(mask, b, k_tile);
    const int n_steps = heads * list.n_total;  // (head of the block, query tile) pairs

    auto load_step = [&](int i, int stage) {
        const int h = first_head + i / list.n_total;
        const int q0 = list.tile(i % list.n_total) * BM;
        const int64_t head_off = (int64_t)b * S * H * D + h * D;
        load_tile_swizzled<BM, D>(s_q + stage * BM * D, q + head_off, H * D, q0, S);
        load_tile_swizzled<BM, D>(s_do + stage * BM * D, dout + head_off, H * D, q0, S);
        const int64_t pad_off = ((int64_t)b * H + h) * s_pad;
        load_pair64(s_lse2 + stage * BM, s_dsum + stage * BM, lse2 + pad_off, dsum + pad_off, q0, s_pad);
    };
    if (n_steps > 0) {  // keys nobody sees skip all loads and store zero gradients
        load_tile_swizzled<BN, D>(s_k, k + (int64_t)b * S * KVH * D + kv_head * D, KVH * D, k0, S);
        load_tile_swizzled<BN, D>(s_v, v + (int64_t)b * S * KVH * D + kv_head * D, KVH * D, k0, S);
        load_step(0, 0);
    }
    cp_async_commit();

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

    float dk_acc[D / 8][4], dv_acc[D / 8][4];  // [64 keys x D] over the warpgroup
    zero(dk_acc);
    zero(dv_acc);

    for (int i = 0; i < n_steps; i++) {
        const int stage = i & 1;
        cp_async_wait_all();
        wgmma::fence_async_shared();
        __syncthreads();  // step i landed; every wgmma of step i-1 has completed
        if (i + 1 < n_steps) load_step(i + 1, stage ^ 1);
        cp_async_commit();
        const bf16 *t_q = s_q + stage * BM * D, *t_do = s_do + stage * BM * D;
        const float *t_lse2 = s_lse2 + stage * BM, *t_dsum = s_dsum + stage * BM;
        const int list_i = i % list.n_total;
        const int q0 = list.tile(list_i) * BM;
        const bool masked = list.is_partial(list_i) || ragged;

        float pt[BM / 8][4], dpt[BM / 8][4];  // S^T then P^T then dS^T; dP^T [64 keys x BM queries]
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma::mma_ss_n64<0, 0>(pt, wgmma::desc_k_major(s_k, BN, 16 * kk),
                                    wgmma::desc_k_major(t_q, BM, 16 * kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma::mma_ss_n64<0, 0>(dpt, wgmma::desc_k_major(s_v, BN, 16 * kk),
                                    wgmma::desc_k_major(t_do, BM, 16 * kk), kk > 0);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(pt);
        wgmma::pin(dpt);
#pragma unroll
        for (int j = 0; j < BM / 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = 8 * j + 2 * (l % 4) + e;
                const float l2 = t_lse2[col];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float p = fast_exp2(fmaf(pt[j][2 * r + e], scale_log2, -l2));
                    if (masked && !(key_lo[r] <= q0 + col && q0 + col < key_hi[r])) p = 0.0f;
                    pt[j][2 * r + e] = p;
                }
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
            const int ds_row = warp * WARP_ROWS + l / 4;
#pragma unroll
            for (int j = 0; j < BM / 16; j++) {
                const int col = 16 * j + 2 * (l % 4);
                *reinterpret_cast<uint32_t *>(s_ds + wgmma::swizzled_offset(ds_row, col, BN)) = ds_frag[j][0];
                *reinterpret_cast<uint32_t *>(s_ds + wgmma::swizzled_offset(ds_row + 8, col, BN)) = ds_frag[j][1];
                *reinterpret_cast<uint32_t *>(s_ds + wgmma::swizzled_offset(ds_row, col + 8, BN)) = ds_frag[j][2];
                *reinterpret_cast<uint32_t *>(s_ds + wgmma::swizzled_offset(ds_row + 8, col + 8, BN)) = ds_frag[j][3];
            }
            wgmma::fence_async_shared();
            __syncthreads();
            const int h = first_head + i / list.n_total;
            // Accumulator rows are queries: warp w rows 16w + lane/4 (+ 8).
#pragma unroll
            for (int c = 0; c < D / 64; c++) {  // 64 dQ columns per pass, to bound registers
                float dq_part[8][4];
                wgmma::fence();
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++)
                    wgmma::mma_ss_n64<1, 1>(dq_part, wgmma::desc_mn_major(s_ds, BN, 16 * kk, 0),
                                            wgmma::desc_mn_major(s_k, BN, 16 * kk, 64 * c), kk > 0);
                wgmma::commit();
                wgmma::wait<0>();
                wgmma::pin(dq_part);
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int qi = q0 + warp * WARP_ROWS + l / 4 + 8 * r;
                    if (qi >= S) continue;
                    float *dst = dq_accum + ((int64_t)(b * S + qi) * H + h) * D + 64 * c + 2 * (l % 4);
#pragma unroll
                    for (int n = 0; n < 8; n++)
                        atomicAdd(reinterpret_cast<float2 *>(dst + 8 * n),
                                  make_float2(dq_part[n][2 * r], dq_part[n][2 * r + 1]));
                }
            }
        }
        wgmma::wait<0>();
        wgmma::pin(dv_acc);
        wgmma::pin(dk_acc);
        wgmma::pin(p_frag);
        wgmma::pin(ds_frag);
    }

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

template <int D>
constexpr size_t dq_smem_bytes() {
    return sizeof(bf16) * (2 * BM + 4 * BN) * (D + PAD) + sizeof(int32_t) * 4 * BN;
}

// Deterministic dQ: one block per (head, query tile, batch) over the query-major list,
// recomputing P and dP (three products per tile, no atomics).
template <int D>
__global__ void __launch_bounds__(NUM_THREADS)
    attn_bwd_dq_kernel(const AttnShape shape, const TileMask mask, const int32_t *lo,
                       const int32_t *hi, const bf16 *q, const bf16 *k, const bf16 *v,
                       const bf16 *dout, const float *lse2, const float *dsum, int s_pad, bf16 *dq) {
    constexpr int LD = D + PAD;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *s_q = reinterpret_cast<bf16 *>(smem);  // [BM][LD]
    bf16 *s_do = s_q + BM * LD;                   // [BM][LD]
    bf16 *s_k = s_do + BM * LD;                   // [2][BN][LD]
    bf16 *s_v = s_k + 2 * BN * LD;                // [2][BN][LD]
    int32_t *s_lo = reinterpret_cast<int32_t *>(s_v + 2 * BN * LD);  // [2][BN]
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
        load_tile<BN, D>(s_k + stage * BN * LD, k + kv_off, KVH * D, k0, S);
        load_tile<BN, D>(s_v + stage * BN * LD, v + kv_off, KVH * D, k0, S);
        load_pair64(s_lo + stage * BN, s_hi + stage * BN, row_lo, row_hi, k0, S);
    };
    if (list.n_total > 0) {  // a query tile that sees nothing gets dQ = 0 without loads
        load_tile<BM, D>(s_q, q + q_off, H * D, q0, S);
        load_tile<BM, D>(s_do, dout + q_off, H * D, q0, S);
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
    float dq_acc[D / 8][4];  // [16 queries x D]
    zero(dq_acc);

    for (int i = 0; i < list.n_total; i++) {
        const int stage = i & 1;
        cp_async_wait_all();
        __syncthreads();
        if (i + 1 < list.n_total) load_kv(i + 1, stage ^ 1);
        cp_async_commit();
        const bf16 *t_k = s_k + stage * BN * LD, *t_v = s_v + stage * BN * LD;

        float p[BN / 8][4];  // P [16 x BN]
        zero(p);
        gemm_smem_a<BN, D, false, false>(p, s_q, LD, warp * WARP_ROWS, t_k, LD);
        const bool ragged = (list.tile(i) + 1) * BN > S;
        if (list.is_partial(i) || ragged) mask_scores(p, s_lo + stage * BN, s_hi + stage * BN, q_row);
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) p[j][c] = fast_exp2(fmaf(p[j][c], scale_log2, -row_lse2[c / 2]));
        float dp[BN / 8][4];  // dP [16 x BN]
        zero(dp);
        gemm_smem_a<BN, D, false, false>(dp, s_do, LD, warp * WARP_ROWS, t_v, LD);
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) p[j][c] *= dp[j][c] - row_dsum[c / 2];
        uint32_t ds_frag[BN / 16][4];
        acc_to_a<BN>(ds_frag, p);
        gemm_reg_a<D, BN, true>(dq_acc, ds_frag, t_k, LD);  // dQ += dS K
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

// dq = bf16(dq_accum * scale), 4 elements per thread (n is a multiple of 4: head_dim is).
__global__ void dq_convert_kernel(const float4 *dq_accum, __nv_bfloat162 *dq, int64_t n4, float scale) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = dq_accum[i];
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

// ---------------------------------------------------------------- host side

void check_args(const AttnShape *s, const TileMask *m) {
    if (s->batch <= 0 || s->seq_len <= 0 || s->n_heads <= 0 || s->n_kv_heads <= 0)
        fatal("%s:%d: attention_cuda: batch %d, seq_len %d, n_heads %d, n_kv_heads %d must be "
              "positive", __FILE__, __LINE__, s->batch, s->seq_len, s->n_heads, s->n_kv_heads);
    if (s->n_heads % s->n_kv_heads)
        fatal("%s:%d: attention_cuda: n_heads %d is not a multiple of n_kv_heads %d", __FILE__,
              __LINE__, s->n_heads, s->n_kv_heads);
    if (s->head_dim != 64 && s->head_dim != 128)
        fatal("%s:%d: attention_cuda: head_dim %d (supported: 64, 128)", __FILE__, __LINE__,
              s->head_dim);
    if (!(s->scale > 0.0f))
        fatal("%s:%d: attention_cuda: scale %g must be positive", __FILE__, __LINE__, s->scale);
    if (m->block_m != BM || m->block_n != BN)
        fatal("%s:%d: attention_cuda: tile mask blocks %dx%d, the kernels need %dx%d", __FILE__,
              __LINE__, m->block_m, m->block_n, BM, BN);
    if (m->n_rows != s->batch || m->seq_len != s->seq_len)
        fatal("%s:%d: attention_cuda: tile mask built for %d rows x %d, inputs are %d x %d",
              __FILE__, __LINE__, m->n_rows, m->seq_len, s->batch, s->seq_len);
}

// Launches kernel<<<grid, NUM_THREADS, smem>>> after raising its dynamic shared-memory limit.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream, Args... args) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, NUM_THREADS, smem, stream>>>(args...);
    cudaCheckLaunch();
}

template <int D>
void forward(const AttnShape *s, const TileMask *m, const int32_t *lo, const int32_t *hi,
             const bf16 *q, const bf16 *k, const bf16 *v, bf16 *out, float *lse, cudaStream_t stream) {
    const int n_blocks_q = (m->n_q_tiles + FWD_Q_TILES - 1) / FWD_Q_TILES;
    launch(attn_fwd_kernel<D>, dim3(s->n_heads, n_blocks_q, s->batch), fwd_smem_bytes<D>(), stream,
           *s, *m, lo, hi, q, k, v, out, lse);
}

template <int D>
void backward(const AttnShape *s, const TileMask *m, const int32_t *lo, const int32_t *hi,
              const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out, const float *lse,
              const bf16 *dout, bf16 *dq, bf16 *dk, bf16 *dv, cudaStream_t stream,
              bool deterministic) {
    const int s_pad = m->n_q_tiles * BM;
    const int64_t n_pad = (int64_t)s->batch * s->n_heads * s_pad;
    const int64_t n_dq = (int64_t)s->batch * s->seq_len * s->n_heads * D;
    float *dsum, *lse2, *dq_accum = nullptr;  // [batch, n_heads, s_pad] x2, [batch, seq_len, n_heads, D]
    cudaCheck(cudaMallocAsync(&dsum, n_pad * sizeof(float), stream));
    cudaCheck(cudaMallocAsync(&lse2, n_pad * sizeof(float), stream));
    attn_bwd_prep_kernel<D><<<(unsigned)((n_pad + NUM_WARPS - 1) / NUM_WARPS), NUM_THREADS, 0, stream>>>(
        *s, s_pad, out, dout, lse, dsum, lse2);
    cudaCheckLaunch();
    // One query head per dK/dV block (splits = the GQA group): see attn_bwd_dkdv_kernel.
    const int splits = s->n_heads / s->n_kv_heads;
    const int64_t n_kv = (int64_t)s->batch * s->seq_len * s->n_kv_heads * D;
    float *dkv_part = nullptr;  // [splits][2][batch, seq_len, n_kv_heads, D] when splits > 1
    if (splits > 1) cudaCheck(cudaMallocAsync(&dkv_part, 2 * splits * n_kv * sizeof(float), stream));
    const dim3 kv_grid(s->n_kv_heads * splits, m->n_k_tiles, s->batch);
    if (deterministic) {
        launch(attn_bwd_dkdv_kernel<D, false>, kv_grid, dkdv_smem_bytes<D, false>(), stream, *s, *m,
               lo, hi, q, k, v, dout, (const float *)lse2, (const float *)dsum, s_pad, dq_accum, dk, dv,
               splits, dkv_part);
        launch(attn_bwd_dq_kernel<D>, dim3(s->n_heads, m->n_q_tiles, s->batch), dq_smem_bytes<D>(),
               stream, *s, *m, lo, hi, q, k, v, dout, (const float *)lse2, (const float *)dsum, s_pad, dq);
    } else {
        cudaCheck(cudaMallocAsync(&dq_accum, n_dq * sizeof(float), stream));
        cudaCheck(cudaMemsetAsync(dq_accum, 0, n_dq * sizeof(float), stream));
        launch(attn_bwd_dkdv_kernel<D, true>, kv_grid, dkdv_smem_bytes<D, true>(), stream, *s, *m,
               lo, hi, q, k, v, dout, (const float *)lse2, (const float *)dsum, s_pad, dq_accum, dk, dv,
               splits, dkv_part);
        dq_convert_kernel<<<1024, 256, 0, stream>>>(reinterpret_cast<const float4 *>(dq_accum),
                                                    reinterpret_cast<__nv_bfloat162 *>(dq), n_dq / 4, s->scale);
        cudaCheckLaunch();
        cudaCheck(cudaFreeAsync(dq_accum, stream));
    }
    if (splits > 1) {
        dkv_reduce_kernel<<<1024, 256, 0, stream>>>(reinterpret_cast<const float4 *>(dkv_part), splits,
                                                    reinterpret_cast<__nv_bfloat162 *>(dk),
                                                    reinterpret_cast<__nv_bfloat162 *>(dv), n_kv / 4,
                                                    s->scale);
        cudaCheckLaunch();
        cudaCheck(cudaFreeAsync(dkv_part, stream));
    }
    cudaCheck(cudaFreeAsync(dsum, stream));
    cudaCheck(cudaFreeAsync(lse2, stream));
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

extern "C" void attention_backward_cuda(const AttnShape *shape, const TileMask *mask,
                                        const int32_t *lo, const int32_t *hi, const attn_bf16 *q,
                                        const attn_bf16 *k, const attn_bf16 *v,
                                        const attn_bf16 *out, const float *lse,
                                        const attn_bf16 *dout, attn_bf16 *dq, attn_bf16 *dk,
                                        attn_bf16 *dv, cudaStream_t stream, bool deterministic) {
    check_args(shape, mask);
    if (shape->head_dim == 64)
        backward<64>(shape, mask, lo, hi, q, k, v, out, lse, dout, dq, dk, dv, stream, deterministic);
    else
        backward<128>(shape, mask, lo, hi, q, k, v, out, lse, dout, dq, dk, dv, stream, deterministic);
}
