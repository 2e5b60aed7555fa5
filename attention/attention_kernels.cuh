// Shared pieces of the attention kernels (attention_fwd.cu, attention_bwd.cu): tile sizes,
// mma.sync/ldmatrix/cp.async primitives, register-fragment products, tile loaders, the
// tile-list views of a TileMask, and the host-side argument check. Internal to attention/.
// FlashAttention-2 structure (KERNELS.md): bf16 m16n8k16 tensor-core products with fp32
// accumulators, ldmatrix from row-padded shared memory, cp.async double buffering, online
// softmax in base 2, P kept in registers as the A operand of the next product; the
// Hopper kernels use wgmma.cuh on 128-byte-swizzled tiles instead of ldmatrix.
//
// Every kernel uses warps of 16 rows of each 64-row tile (queries in the forward and the
// dQ pass, keys in the dK/dV pass), so row reductions need only a 4-lane shuffle.
// Measurements and the reasons for these choices: docs/KERNEL_NOTES.md.
#pragma once
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

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads, e.g. one warpgroup.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// dst[0 .. bytes/4) += src[...] in fp32, done by the copy engine from shared memory
// (asynchronous; 16-byte aligned, bytes a multiple of 16). Groups as cp.async's: commit,
// then wait until the source may be overwritten (read) or the adds are done.
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const float *src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

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

// The union of N tile lines (each a full and a partial list, both ascending), visited in
// ascending order; per tile, which lines see it whole. A line that does not list the tile
// at all (empty for it) reports "not whole": its per-element test hides every pair.
template <int N>
struct MergedLines {
    TileList line[N];
    int pos_full[N], pos_partial[N];

    __device__ explicit MergedLines(const TileList (&lines)[N]) {
#pragma unroll
        for (int i = 0; i < N; i++) line[i] = lines[i];
        restart();
    }
    __device__ void restart() {
#pragma unroll
        for (int i = 0; i < N; i++) pos_full[i] = pos_partial[i] = 0;
    }
    __device__ int head_full(int i) const {
        return pos_full[i] < line[i].n_full ? line[i].full[pos_full[i]] : INT_MAX;
    }
    __device__ int head_partial(int i) const {
        return pos_partial[i] < line[i].n_total - line[i].n_full ? line[i].partial[pos_partial[i]] : INT_MAX;
    }
    // The next tile (INT_MAX when done); full[i]: line i sees all of it.
    __device__ int next(bool (&full)[N]) {
        int t = INT_MAX;
#pragma unroll
        for (int i = 0; i < N; i++) t = min(t, min(head_full(i), head_partial(i)));
#pragma unroll
        for (int i = 0; i < N; i++) {
            full[i] = t != INT_MAX && head_full(i) == t;
            pos_full[i] += full[i];
            pos_partial[i] += t != INT_MAX && head_partial(i) == t;
        }
        return t;
    }
};

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

// Rows [row0, row0 + ROWS) of one head of a [seq_len, row_stride] bf16 matrix into a
// 128-byte-swizzled shared tile (wgmma.cuh); rows past seq_len become zeros.
// THREADS: the block size (every thread takes part). The trip count is a compile-time
// constant so the loop unrolls and each thread's offsets fold into constants.
template <int ROWS, int D, int THREADS = NUM_THREADS>
__device__ __forceinline__ void load_tile_swizzled(bf16 *tile, const bf16 *head_base, int row_stride,
                                                   int row0, int seq_len) {
    constexpr int CHUNKS = D / 8;  // 16-byte pieces per row
    static_assert(ROWS * CHUNKS % THREADS == 0, "every thread loads the same number of pieces");
#pragma unroll
    for (int it = 0; it < ROWS * CHUNKS / THREADS; it++) {
        const int i = threadIdx.x + it * THREADS;
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const bool valid = row0 + r < seq_len;
        const bf16 *src = head_base + (valid ? (int64_t)(row0 + r) * row_stride + c : 0);
        cp_async16(tile + wgmma::swizzled_offset(r, c, ROWS), src, valid);
    }
}

// ---------------------------------------------------------------- host side

inline void check_args(const AttnShape *s, const TileMask *m) {
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

// Launches kernel<<<grid, threads, smem>>> after raising its dynamic shared-memory limit.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, Args... args) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, threads, smem, stream>>>(args...);
    cudaCheckLaunch();
}

}  // namespace
