// Shared pieces of the attention kernels (attention_fwd.cu, attention_bwd.cu). Internal to
// attention/. Each kernel is split the way FlashAttention-3's Hopper kernels are: a params
// struct built on the host, a typed shared-memory struct, a block scheduler (which tiles a
// block owns), a main loop of loads and wgmma products (wgmma.cuh), softmax or gradient
// element work, and epilogue functions that write the results. This header holds what
// more than one kernel uses:
//   - primitives: cp.async, bulk and tensor (TMA) copies, mbarriers,
//     register reallocation, register-fragment helpers;
//   - the mask as the kernels read it (MaskView) and the tile walk over it (TileList,
//     TileStep, MergedLines);
//   - the ring of key tiles with their intervals (KeyRing);
//   - score masking (the per-element interval test);
//   - host: the shape and mask checks (AttnDims, mask_view) and the launch helper.
// A kernel's shared memory is one struct (FwdSmem, DkdvSmem, DqSmem) laid over the whole
// dynamic allocation, whose size is sizeof the struct. No kernel declares a static
// __shared__ variable, so the allocation starts at the base of the block's shared window,
// which is 1024-byte aligned as the swizzled tiles' alignas(1024) members need.
// Shared tiles use the 128-byte swizzle and are filled by TMA (the key intervals by 4-byte
// cp.async); products are bf16 with fp32 accumulators; softmax runs in base 2; P and dS stay in registers as the A operand of the next product. Every
// kernel works in warpgroups whose warp w holds rows 16w..16w+15 of each 64-row tile
// (queries in the forward, keys in the backward), so row reductions
// need only a 4-lane shuffle. docs/KERNEL_NOTES.md has the design and the measurements
// behind it.
#pragma once
#include "attention/attention_cuda.h"

#include <cuda.h>  // CUtensorMap (the encoder is fetched from the driver at run time)
#include <cudaTypedefs.h>
#include <limits.h>
#include <math.h>
#include "attention/wgmma.cuh"
#include "common/cuda_check.h"

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
// sm_90 shared memory: what one block may opt into, and per SM, where every resident
// block also takes 1 KiB reserved by the system.
constexpr size_t MAX_SMEM_PER_BLOCK = 227 * 1024;
constexpr size_t SMEM_PER_SM = 228 * 1024, SMEM_RESERVED_PER_BLOCK = 1024;

// ---------------------------------------------------------------- primitives

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }

// The accumulator row of this thread inside its warpgroup's 64-row tile: lane/4 of the
// warp's 16 rows (the thread also holds that row + 8).
__device__ __forceinline__ int warp_row() { return (threadIdx.x / 32) % NUM_WARPS * WARP_ROWS + lane_id() / 4; }

// Whether tile `tile` (BN keys from tile * BN) runs past seq_len.
__device__ __forceinline__ bool ragged_tile(int tile, int seq_len) { return (tile + 1) * BN > seq_len; }

// 4 bytes global -> shared, asynchronously; zero-filled when !valid (src is not read).
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}

// dst[0 .. bytes/4) += src[...] in fp32, done by the copy engine from shared memory
// (asynchronous; 16-byte aligned, bytes a multiple of 16). Groups as cp.async's: commit,
// then wait until the source may be overwritten (the reads; the adds complete with the
// grid, which is all the kernels after need).
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const float *src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}
// The same for 32-bit integers: adds that wrap modulo 2^32, so their order does not matter.
__device__ __forceinline__ void bulk_reduce_add_s32(int *dst, const int *src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// mbarrier in shared memory: a phase completes when `count` arrivals and the expected
// transaction bytes (of TMA copies) have come. Phase k of a barrier completes with its
// k-th use; a wait names the parity k % 2 and returns at once if that phase has completed
// (so parity 1 passes on a fresh barrier: "the use before the first").
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// After the inits, before the block synchronises: the barriers are visible to the copy engine.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// An arrival that ptxas cannot schedule before the instructions computing `after` (any
// value but a negative one; NaN arrives too): the arrival is predicated on it. ptxas
// places a wgmma.wait_group as early as the memory operations before it allow, and the
// independent arithmetic between goes after the wait; an arrival that depends on that
// arithmetic keeps the wait behind it.
__device__ __forceinline__ void mbar_arrive_after(uint64_t *bar, float after) {
    asm volatile(
        "{\n.reg .pred neg;\nsetp.lt.f32 neg, %1, 0f00000000;\n"
        "@!neg mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(smem_addr(bar)),
        "f"(after)
        : "memory");
}
// One arrival that also expects `bytes` more of transactions in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
// An arrival once this thread's earlier cp.async copies have landed (counted in the init
// count: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}

// One box of a tensor map (host: tensor_map_bf16) at coordinates (c0, c1, c2), innermost
// first, into shared memory; its bytes complete a transaction on `bar`. Coordinates past
// the tensor's extent read zeros (and still count their bytes).
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
        "%4}], [%5];\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
}

// A [ROWS x D] bf16 tile of one head (columns head * D ..) of a tensor map, rows row0 ..,
// as D / 64 boxes into a 128-byte-swizzled shared tile (wgmma.cuh's layout: 64-column
// blocks of ROWS rows); its bytes complete a transaction on `bar`.
template <int ROWS, int D>
__device__ __forceinline__ void tma_load_tile(bf16 *tile, const CUtensorMap *map, int head, int row0, int batch,
                                              uint64_t *bar) {
#pragma unroll
    for (int c = 0; c < D / 64; c++) tma_load_3d(tile + c * ROWS * 64, map, head * D + 64 * c, row0, batch, bar);
}

// One box of a 2-D tensor map (host: tensor_map_f32) at coordinates (c0, c1), innermost
// first, into shared memory (128-byte aligned); its bytes complete a transaction on `bar`.
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
        : "memory");
}

// Register reallocation between the warpgroups of a warp-specialised block (each
// warpgroup as a whole): a producer gives registers back, consumers take them.
template <int N>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

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
template <int N>
__device__ __forceinline__ void copy(float (&dst)[N][4], const float (&src)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dst[i][e] = src[i][e];
}

// ---------------------------------------------------------------- accumulator rows to global memory

// A 4 x 4 transpose of 32-bit words inside each quad of lanes (4q .. 4q + 3): lane t's a[j]
// becomes lane j's a[t]. Two exchange stages (partners t ^ 1, then t ^ 2), each word
// chosen by the lane's bit; every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4]) {
    const int t = lane_id() % 4;
#pragma unroll
    for (int stage = 1; stage <= 2; stage *= 2) {
        const bool upper = t & stage;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (j & stage) continue;
            const uint32_t got = __shfl_xor_sync(0xffffffff, upper ? a[j] : a[j + stage], stage);
            if (upper) a[j] = got;
            else a[j + stage] = got;
        }
    }
}

// Row r (0: the thread's accumulator row lane / 4, 1: that row + 8) of a warp's [16 x D]
// accumulator (acc_to_a's layout), times scale, to dst[0 .. D) as bf16 where store holds.
// A quad holds a row's columns as 4-byte pairs, 8-column block n spread over its lanes; after
// quad_transpose lane t holds blocks 4k + t whole and writes each with one 16-byte store: a
// quarter of the 4-byte stores' instructions, each writing whole 32-byte sectors (a warp's
// 4-byte store wrote half of 8). Every lane of the warp must call it.
template <int D>
__device__ __forceinline__ void store_row_bf16(bf16 *dst, const float (&acc)[D / 8][4], int r, float scale,
                                               bool store) {
    const int t = lane_id() % 4;
#pragma unroll
    for (int k = 0; k < D / 32; k++) {
        uint32_t a[4];
#pragma unroll
        for (int j = 0; j < 4; j++) a[j] = pack_bf16(acc[4 * k + j][2 * r] * scale, acc[4 * k + j][2 * r + 1] * scale);
        quad_transpose(a);
        if (store) *reinterpret_cast<uint4 *>(dst + 8 * (4 * k + t)) = make_uint4(a[0], a[1], a[2], a[3]);
    }
}

// ---------------------------------------------------------------- the mask, device side

// How a tile line sees a tile (mask.h's TileKind): not at all, partly, or whole.
enum class TileClass : uint8_t { Empty, Partial, Full };

// One line of a row's tile matrix: full tiles first (no mask work), then partial.
struct TileList {
    const int32_t *full, *partial;
    int n_full, n_total;
};

// One orientation of a mask's tile lists (device pointers): for line i of row r (slot
// r * n_lines + i), full_count[slot] full and partial_count[slot] partial tiles, ascending,
// at full_idx / partial_idx + slot * line_len. Query-major lines are query tiles listing
// key tiles; key-major the reverse.
struct TileListsView {
    const int32_t *partial_count, *full_count, *partial_idx, *full_idx;
    int n_lines, line_len;

    // A line past the last (the missing partner of an odd last tile) is empty.
    __device__ TileList line(int row, int i) const {
        if (i >= n_lines) return {nullptr, nullptr, 0, 0};
        const int64_t slot = (int64_t)row * n_lines + i;
        const int n_full = full_count[slot];
        return {full_idx + slot * line_len, partial_idx + slot * line_len, n_full, n_full + partial_count[slot]};
    }
};

// The mask as the kernels read it: both orientations of the tile lists and the key
// intervals lo/hi [batch, seq_len] (key k visible to query q iff lo[k] <= q < hi[k]).
struct MaskView {
    TileListsView by_query, by_key;
    const int32_t *lo, *hi;
};

// One step of a walk over the tile lines of a block's N tiles: the tile, and how each
// line sees it.
template <int N>
struct TileStep {
    int tile;  // INT_MAX past the last step
    TileClass cls[N];

    __device__ bool done() const { return tile == INT_MAX; }
    // cls[line] for a run-time line, as selects (an indexed register array would go to
    // local memory).
    __device__ TileClass of(int line) const {
        TileClass c = cls[0];
#pragma unroll
        for (int i = 1; i < N; i++)
            if (line == i) c = cls[i];
        return c;
    }
};

// The union of N tile lines (each a full and a partial list, both ascending), visited in
// ascending order by one thread (the dK/dV kernel's producer). A line that does not list
// a step's tile (Empty) must hide every pair of it. A plain aggregate, so a block can
// keep one in shared memory.
template <int N>
struct MergedLines {
    TileList line[N];
    int pos_full[N], pos_partial[N];

    // Lines [line0, line0 + N) of row `row`.
    __device__ void init(const TileListsView &lists, int row, int line0) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            line[i] = lists.line(row, line0 + i);
            pos_full[i] = pos_partial[i] = 0;
        }
    }
    __device__ int head_full(int i) const {
        return pos_full[i] < line[i].n_full ? line[i].full[pos_full[i]] : INT_MAX;
    }
    __device__ int head_partial(int i) const {
        return pos_partial[i] < line[i].n_total - line[i].n_full ? line[i].partial[pos_partial[i]] : INT_MAX;
    }
    __device__ TileStep<N> next() {
        TileStep<N> step;
        step.tile = INT_MAX;
#pragma unroll
        for (int i = 0; i < N; i++) {
            step.tile = min(step.tile, min(head_full(i), head_partial(i)));
            step.cls[i] = TileClass::Empty;
        }
        if (step.done()) return step;
#pragma unroll
        for (int i = 0; i < N; i++) {
            const bool full = head_full(i) == step.tile, partial = head_partial(i) == step.tile;
            step.cls[i] = full ? TileClass::Full : partial ? TileClass::Partial : TileClass::Empty;
            pos_full[i] += full;
            pos_partial[i] += partial;
        }
        return step;
    }
};

// The same walk for a whole warp, every lane calling with the same arguments and getting
// the same steps, 32 tiles at a time: the lanes load the next 32 entries of each of the
// 4N lists at once, and a window of 32 tiles from the lowest head becomes a bit mask per
// list (each list ascends without repeats, so its entries inside a window are among its
// next 32). A step then costs a few bit operations instead of MergedLines' loads and
// compares of every list head, which matters where the walk shares issue slots with the
// consumers (the forward's producer warp).
template <int N>
struct WarpWalk {
    const int32_t *full_list[N];  // line i's partial list is at full_list[i] + to_partial:
    int64_t to_partial;           // every line's lists sit at the same slot of both arrays
    int n_full[N], n_partial[N];
    int pos_full[N], pos_partial[N];  // entries before the window
    uint32_t full[N], partial[N];     // bit i: tile base + i is listed, in the window
    int base;

    __device__ void init(const TileListsView &lists, int row, int line0) {
        to_partial = lists.partial_idx - lists.full_idx;
#pragma unroll
        for (int i = 0; i < N; i++) {
            const TileList t = lists.line(row, line0 + i);
            full_list[i] = t.full;
            n_full[i] = t.n_full;
            n_partial[i] = t.n_total - t.n_full;
            pos_full[i] = pos_partial[i] = 0;
            full[i] = partial[i] = 0;
        }
    }
    // The next window: from the lowest head of the lists (INT_MAX once all are done).
    __device__ void refill() {
        const int l = lane_id();
        int e_full[N], e_partial[N];  // entry pos + l of each list (INT_MAX past its end)
        base = INT_MAX;
#pragma unroll
        for (int i = 0; i < N; i++) {
            e_full[i] = pos_full[i] + l < n_full[i] ? full_list[i][pos_full[i] + l] : INT_MAX;
            e_partial[i] = pos_partial[i] + l < n_partial[i] ? full_list[i][to_partial + pos_partial[i] + l] : INT_MAX;
            base = min(base, min(__shfl_sync(0xffffffff, e_full[i], 0), __shfl_sync(0xffffffff, e_partial[i], 0)));
        }
        if (base == INT_MAX) return;
#pragma unroll
        for (int i = 0; i < N; i++) {
            full[i] = window_bits(e_full[i], pos_full[i]);
            partial[i] = window_bits(e_partial[i], pos_partial[i]);
        }
    }
    __device__ uint32_t window_bits(int e, int &pos) const {
        const uint32_t bits = __reduce_or_sync(0xffffffff, e - base < 32 ? 1u << (e - base) : 0u);
        pos += __popc(bits);
        return bits;
    }
    __device__ uint32_t any() const {
        uint32_t u = 0;
#pragma unroll
        for (int i = 0; i < N; i++) u |= full[i] | partial[i];
        return u;
    }
    __device__ TileStep<N> next() {
        TileStep<N> step;
        uint32_t u = any();
        if (u == 0) {
            refill();
            u = any();
        }
        if (u == 0) {  // every list done
            step.tile = INT_MAX;
#pragma unroll
            for (int i = 0; i < N; i++) step.cls[i] = TileClass::Empty;
            return step;
        }
        const int b = __ffs(u) - 1;
        step.tile = base + b;
#pragma unroll
        for (int i = 0; i < N; i++) {
            step.cls[i] = full[i] >> b & 1 ? TileClass::Full : partial[i] >> b & 1 ? TileClass::Partial : TileClass::Empty;
            full[i] &= ~(1u << b);
            partial[i] &= ~(1u << b);
        }
        return step;
    }
};

// ---------------------------------------------------------------- score masking

// Scores [16 x BN] of one warp (column groups [j0, j0 + BN / 8) of s, one key tile): -inf
// where key k (columns, lo/hi from shared memory) is hidden from query q_row (accumulator
// row lane/4) or q_row + 8.
template <int NJ>
__device__ __forceinline__ void mask_scores(float (&s)[NJ][4], const int32_t *tile_lo, const int32_t *tile_hi,
                                            int q_row, int j0) {
    int l = lane_id();
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int col = 8 * j + 2 * (l % 4) + e;
            int lo = tile_lo[col], hi = tile_hi[col];
            if (!(lo <= q_row && q_row < hi)) s[j0 + j][e] = -INFINITY;
            if (!(lo <= q_row + 8 && q_row + 8 < hi)) s[j0 + j][2 + e] = -INFINITY;
        }
    }
}

// ---------------------------------------------------------------- host side

constexpr int n_tiles(int seq_len, int block) { return (seq_len + block - 1) / block; }

// ---------------------------------------------------------------- L2 sections

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

// Shape and strides of the tensors (attention_cuda.h's layouts, elements), shared by the
// forward and backward params.
struct AttnDims {
    int batch, seq_len, n_heads, n_kv_heads, head_dim;
    int group;                     // query heads per KV head
    int n_q_tiles, n_k_tiles;
    int s_pad;                     // seq_len padded to whole query tiles
    int64_t n_kv;                  // elements of K (of V, dK, dV)
    int q_row_stride, kv_row_stride;  // one token: n_heads * head_dim, n_kv_heads * head_dim
    int64_t q_batch_stride, kv_batch_stride;
    float scale, scale_log2;  // softmax scale, and times log2(e) for the base-2 exponent
};

inline AttnDims attn_dims(const AttnShape *s) {
    CHECK(s->batch > 0 && s->seq_len > 0 && s->n_heads > 0 && s->n_kv_heads > 0,
          "attention_cuda: batch %d, seq_len %d, n_heads %d, n_kv_heads %d must be positive",
          s->batch, s->seq_len, s->n_heads, s->n_kv_heads);
    CHECK(s->n_heads % s->n_kv_heads == 0,
          "attention_cuda: n_heads %d is not a multiple of n_kv_heads %d", s->n_heads, s->n_kv_heads);
    CHECK(s->head_dim == 64 || s->head_dim == 128,
          "attention_cuda: head_dim %d (supported: 64, 128)", s->head_dim);
    CHECK(s->scale > 0.0f, "attention_cuda: scale %g must be positive", s->scale);
    AttnDims d;
    d.batch = s->batch;
    d.seq_len = s->seq_len;
    d.n_heads = s->n_heads;
    d.n_kv_heads = s->n_kv_heads;
    d.head_dim = s->head_dim;
    d.group = s->n_heads / s->n_kv_heads;
    d.n_q_tiles = n_tiles(s->seq_len, BM);
    d.n_k_tiles = n_tiles(s->seq_len, BN);
    d.s_pad = d.n_q_tiles * BM;
    d.n_kv = (int64_t)s->batch * s->seq_len * s->n_kv_heads * s->head_dim;
    d.q_row_stride = s->n_heads * s->head_dim;
    d.kv_row_stride = s->n_kv_heads * s->head_dim;
    d.q_batch_stride = (int64_t)s->seq_len * d.q_row_stride;
    d.kv_batch_stride = (int64_t)s->seq_len * d.kv_row_stride;
    d.scale = s->scale;
    d.scale_log2 = s->scale * LOG2E;
    return d;
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

// The one host function that reads the caller's mask and intervals: checks that the mask
// was built for these inputs and the kernels' tiles, and returns the kernels' view of it.
inline TileListsView lists_view(const TileLists &l) {
    return {l.partial_count, l.full_count, l.partial_idx, l.full_idx, l.n_lines, l.line_len};
}

inline MaskView mask_view(const AttnDims &d, const AttnMask *m) {
    CHECK(m->block_m == BM && m->block_n == BN,
          "attention_cuda: mask tiles %dx%d, the kernels need %dx%d (ATTN_TILE)", m->block_m,
          m->block_n, BM, BN);
    CHECK(m->n_rows == d.batch && m->seq_len == d.seq_len,
          "attention_cuda: mask built for %d rows x %d, inputs are %d x %d", m->n_rows, m->seq_len,
          d.batch, d.seq_len);
    return {lists_view(m->by_query), lists_view(m->by_key), m->lo, m->hi};
}

// What both kernel families read: the shape, the mask and the inputs q, k, v.
struct AttnInputs {
    AttnDims dims;
    MaskView mask;
    const bf16 *q, *k, *v;
};

inline AttnInputs attn_inputs(const AttnShape *shape, const AttnMask *mask, const bf16 *q,
                              const bf16 *k, const bf16 *v) {
    AttnInputs in;
    in.dims = attn_dims(shape);
    in.mask = mask_view(in.dims, mask);
    in.q = q;
    in.k = k;
    in.v = v;
    return in;
}

// The driver's tensor-map encoder, fetched once (so nothing links libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                                   cudaEnableDefault, &found));
        CHECK(found == cudaDriverEntryPointSuccess && encode, "attention_cuda: no cuTensorMapEncodeTiled in the driver");
    }
    return encode;
}

// A TMA descriptor of one bf16 tensor [batch][rows][row_stride] (strides in elements), of
// which `cols` columns are read, in boxes of 64 rows x 64 columns (128 bytes: the
// 128-byte swizzle of wgmma.cuh); rows past `rows` read as zeros.
inline CUtensorMap tensor_map_bf16(const bf16 *base, int cols, int rows, int batch, int64_t row_stride,
                                   int64_t batch_stride) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    CUtensorMap map;
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)batch};
    const cuuint64_t strides[2] = {(cuuint64_t)row_stride * sizeof(bf16), (cuuint64_t)batch_stride * sizeof(bf16)};
    const cuuint32_t box[3] = {64, 64, 1}, elem_strides[3] = {1, 1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box,
                              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CHECK(r == CUDA_SUCCESS, "attention_cuda: cuTensorMapEncodeTiled failed (%d)", (int)r);
    return map;
}

// A TMA descriptor of n contiguous floats (16-byte aligned) seen as [n / row][row], in boxes
// of box_rows x row (no swizzle: a box is box_rows * row contiguous floats in shared memory).
inline CUtensorMap tensor_map_f32(const float *base, int64_t n, int row, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    CHECK(n % row == 0, "tensor_map_f32: %lld floats are not whole rows of %d", (long long)n, row);
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)row, (cuuint64_t)(n / row)};
    const cuuint64_t strides[1] = {(cuuint64_t)row * sizeof(float)};
    const cuuint32_t box[2] = {(cuuint32_t)row, (cuuint32_t)box_rows}, elem_strides[2] = {1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)base, dims, strides, box,
                              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CHECK(r == CUDA_SUCCESS, "attention_cuda: cuTensorMapEncodeTiled failed (%d)", (int)r);
    return map;
}

// Launches kernel<<<grid, threads, smem>>>(params) after raising its dynamic shared-memory
// limit.
template <typename Params>
void launch(void (*kernel)(Params), dim3 grid, int threads, size_t smem, cudaStream_t stream, const Params &params) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, threads, smem, stream>>>(params);
    cudaCheckLaunch();
}

}  // namespace
