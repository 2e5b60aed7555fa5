// Shared pieces of the attention kernels (attention_fwd.cu, attention_bwd.cu): tile sizes,
// cp.async and bulk-copy primitives, register-fragment helpers, the swizzled tile loader,
// the tile-list views of an AttnMask, and the host-side argument check. Internal to
// attention/. FlashAttention-2/3 structure (KERNELS.md) on Hopper wgmma (wgmma.cuh):
// 128-byte-swizzled shared tiles filled by cp.async, bf16 products with fp32 accumulators,
// online softmax in base 2, P and dS kept in registers as the A operand of the next product.
//
// Every kernel works in warpgroups whose warp w holds rows 16w..16w+15 of each 64-row tile
// (queries in the forward and the dQ pass, keys in the dK/dV pass), so row reductions
// need only a 4-lane shuffle. Measurements and the reasons for these choices:
// docs/KERNEL_NOTES.md.
#pragma once
#include "attention/attention_cuda.h"

#include <limits.h>
#include <math.h>
#include "attention/wgmma.cuh"
#include "common/cuda_check.h"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int BM = ATTN_TILE;  // query rows per tile
constexpr int BN = ATTN_TILE;  // key rows per tile
constexpr int NUM_WARPS = 4;
constexpr int NUM_THREADS = 32 * NUM_WARPS;
constexpr int WARP_ROWS = 16;  // accumulator rows per warp
static_assert(BM == NUM_WARPS * WARP_ROWS && BN == NUM_WARPS * WARP_ROWS,
              "each warp owns 16 rows of a 64-row tile");
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

// A warp's accumulator rows [16 x N] (wgmma.cuh's layout: d[j][0..1] at row lane/4,
// columns 8j + 2*(lane%4) + {0,1}; d[j][2..3] at row lane/4 + 8) as bf16 A fragments of
// the next product (k = its columns).
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

// The line of query tile q_tile (key-major: of key tile k_tile) of a row; a tile past the
// last (the missing partner of an odd last tile) has an empty line.
__device__ TileList line_list(const TileLists &l, int row, int line) {
    if (line >= l.n_lines) return {nullptr, nullptr, 0, 0};
    int64_t slot = (int64_t)row * l.n_lines + line;
    int n_full = l.full_count[slot];
    return {l.full_idx + slot * l.line_len, l.partial_idx + slot * l.line_len, n_full,
            n_full + l.partial_count[slot]};
}
__device__ TileList query_major_list(const AttnMask &m, int row, int q_tile) {
    return line_list(m.by_query, row, q_tile);
}
__device__ TileList key_major_list(const AttnMask &m, int row, int k_tile) {
    return line_list(m.by_key, row, k_tile);
}

// The union of N tile lines (each a full and a partial list, both ascending), visited in
// ascending order. Per tile, flags: bit 2i set when line i lists it, bit 2i + 1 when
// line i sees it whole (no mask work). A line that does not list a tile (empty for it)
// must hide every pair of it. A plain aggregate, so a block can keep one in shared memory.
template <int N>
struct MergedLines {
    TileList line[N];
    int pos_full[N], pos_partial[N];

    __device__ void init(const TileList (&lines)[N]) {
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
    // The next tile, INT_MAX when done; its flags as above.
    __device__ int next(int &flags) {
        int t = INT_MAX;
#pragma unroll
        for (int i = 0; i < N; i++) t = min(t, min(head_full(i), head_partial(i)));
        flags = 0;
        if (t == INT_MAX) return t;
#pragma unroll
        for (int i = 0; i < N; i++) {
            const bool full = head_full(i) == t, partial = head_partial(i) == t;
            flags |= ((full || partial) | full << 1) << (2 * i);
            pos_full[i] += full;
            pos_partial[i] += partial;
        }
        return t;
    }
    __device__ static bool sees_whole(int flags, int i) { return flags >> (2 * i + 1) & 1; }
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
// 128-byte-swizzled shared tile (wgmma.cuh) by all THREADS threads of the block; rows past
// seq_len become zeros. A thread copies the same 16-byte column chunk of rows r0,
// r0 + PASS_ROWS, ...: PASS_ROWS is a multiple of 8, so the swizzle pattern is the same
// for each and one shared offset and one source pointer serve every pass (few registers
// held across the main loops).
template <int ROWS, int D, int THREADS = NUM_THREADS>
__device__ __forceinline__ void load_tile_swizzled(bf16 *tile, const bf16 *head_base, int row_stride,
                                                   int row0, int seq_len) {
    constexpr int CHUNKS = D / 8, PASS_ROWS = THREADS / CHUNKS;  // 16-byte pieces per row
    static_assert(PASS_ROWS % 8 == 0 && ROWS % PASS_ROWS == 0, "whole swizzle periods per pass");
    const int r0 = threadIdx.x / CHUNKS, c = (threadIdx.x % CHUNKS) * 8;
    bf16 *dst = tile + wgmma::swizzled_offset(r0, c, ROWS);
    const bf16 *src = head_base + (int64_t)(row0 + r0) * row_stride + c;
#pragma unroll
    for (int n = 0; n < ROWS / PASS_ROWS; n++) {
        const bool valid = row0 + r0 + n * PASS_ROWS < seq_len;
        cp_async16(dst + n * PASS_ROWS * 64, valid ? src + (int64_t)n * PASS_ROWS * row_stride : head_base, valid);
    }
}

// ---------------------------------------------------------------- host side

inline void check_args(const AttnShape *s, const AttnMask *m) {
    CHECK(s->batch > 0 && s->seq_len > 0 && s->n_heads > 0 && s->n_kv_heads > 0,
          "attention_cuda: batch %d, seq_len %d, n_heads %d, n_kv_heads %d must be positive",
          s->batch, s->seq_len, s->n_heads, s->n_kv_heads);
    CHECK(s->n_heads % s->n_kv_heads == 0,
          "attention_cuda: n_heads %d is not a multiple of n_kv_heads %d", s->n_heads, s->n_kv_heads);
    CHECK(s->head_dim == 64 || s->head_dim == 128, "attention_cuda: head_dim %d (supported: 64, 128)",
          s->head_dim);
    CHECK(s->scale > 0.0f, "attention_cuda: scale %g must be positive", s->scale);
    CHECK(m->block_m == ATTN_TILE && m->block_n == ATTN_TILE,
          "attention_cuda: mask tiles %dx%d, the kernels need %dx%d", m->block_m, m->block_n,
          ATTN_TILE, ATTN_TILE);
    CHECK(m->n_rows == s->batch && m->seq_len == s->seq_len,
          "attention_cuda: mask built for %d rows x %d, inputs are %d x %d", m->n_rows, m->seq_len,
          s->batch, s->seq_len);
}

// Launches kernel<<<grid, threads, smem>>> after raising its dynamic shared-memory limit.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, Args... args) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, threads, smem, stream>>>(args...);
    cudaCheckLaunch();
}

}  // namespace
