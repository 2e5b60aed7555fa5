// The mask as the attention kernels read it (MaskView: mask.h's tile lists and key
// intervals on the device), the walks over the tile lists of a block's tiles (one thread:
// MergedLines; a whole warp: WarpWalk), and the per-element interval test of the
// scores of a partial tile.
#pragma once
#include <limits.h>
#include <math.h>
#include "attention/kernel_config.cuh"

namespace {

// ---------------------------------------------------------------- tile lists and walks

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

}  // namespace
