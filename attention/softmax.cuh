// The forward's online softmax: per thread two query rows (accumulator rows lane/4 and
// lane/4 + 8), in scaled base-2 units, with the row maximum taken up only when it grows
// by more than RESCALE_SLACK, and a fast path (update_fixed) that keeps the maximum.
#pragma once
#include <math.h>
#include "attention/fragments.cuh"
#include "attention/kernel_config.cuh"

namespace {

// A row maximum that grows by at most RESCALE_SLACK (base-2 units) is not taken up (FA4):
// P stays relative to the older maximum, so P <= 2^8 (fine for the fp32 sums and bf16 P),
// and since the final normalisation and the LSE use that same maximum the result is the
// same softmax. O is rescaled only when a row of the warp moved further, which after the
// first steps is rare.
constexpr float RESCALE_SLACK = 8.0f;
// The most that update_fixed lets one thread's P of a row sum to (P then stays far from
// bf16's and the fp32 sums' range); above it the step takes update's maximum.
constexpr float FIXED_SUM_LIMIT = 65536.0f;

// Running softmax state of this thread's two rows (accumulator rows lane/4 and lane/4 + 8)
// in scaled base-2 units: the row maximum used so far and this thread's part of the row sum.
struct OnlineSoftmax {
    float row_max[2], row_sum[2];

    __device__ void init() {
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.0f;
    }

    // The masked scores of one step become P = 2^(s * scale_log2 - row maximum); where a
    // row's maximum moved, rescale[r] is what O's row r must be multiplied by (else 1).
    // Returns whether either row moved.
    template <int NJ>
    __device__ bool update(float (&s)[NJ][4], float scale_log2, float (&rescale)[2]) {
        bool moved = false;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            // A tree (depth 1 + log2 NJ, not NJ): the row maximum is on the path from S's
            // wait to the first exponential.
            float m[NJ];
#pragma unroll
            for (int j = 0; j < NJ; j++) m[j] = fmaxf(s[j][2 * r], s[j][2 * r + 1]);
#pragma unroll
            for (int lvl = 1; lvl < NJ; lvl *= 2)
#pragma unroll
                for (int j = 0; j + lvl < NJ; j += 2 * lvl) m[j] = fmaxf(m[j], m[j + lvl]);
            float tile_max = m[0];
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
            tile_max *= scale_log2;
            const bool grow = tile_max > row_max[r] + RESCALE_SLACK;  // -inf + 8: the first visible step
            rescale[r] = grow ? fast_exp2(row_max[r] - tile_max) : 1.0f;
            if (grow) row_max[r] = tile_max;
            moved |= grow;
            const float base = row_max[r] == -INFINITY ? 0.0f : row_max[r];  // all hidden so far: p = 0
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = fast_exp2(fmaf(s[j][2 * r + e], scale_log2, -base));
                    s[j][2 * r + e] = p;
                    sum += p;
                }
            }
            row_sum[r] = row_sum[r] * rescale[r] + sum;
        }
        return moved;
    }

    // The common case of update, without a new row maximum (FlashDecoding++'s unified
    // maximum): P against the maximum used so far, packed into p as A fragments
    // (acc_to_a's order), and the row sums. It is exact when this thread's P of each row sum
    // to at most FIXED_SUM_LIMIT: then no P is above it, and none is inf or NaN (a row with
    // no maximum yet gives inf or NaN). The warp agrees: true if that held for all of its
    // rows, which then add the sums; else nothing changed, and the caller runs update on
    // the same scores. No max reduction and no rescale vote on the path from S's wait to
    // the exponentials.
    template <int NJ>
    __device__ bool update_fixed(const float (&s)[NJ][4], float scale_log2, uint32_t (&p)[NJ / 2][4]) {
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < NJ / 2; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {  // register i: row i % 2 of accumulator 2j + i / 2
                const float(&acc)[4] = s[2 * j + i / 2];
                const int r = i % 2;
                const float p0 = fast_exp2(fmaf(acc[2 * r], scale_log2, -row_max[r]));
                const float p1 = fast_exp2(fmaf(acc[2 * r + 1], scale_log2, -row_max[r]));
                p[j][i] = pack_bf16(p0, p1);
                sum[r] += p0 + p1;
            }
        const bool exact = __all_sync(0xffffffff, sum[0] <= FIXED_SUM_LIMIT && sum[1] <= FIXED_SUM_LIMIT);
        if (exact) {
            row_sum[0] += sum[0];
            row_sum[1] += sum[1];
        }
        return exact;
    }

    template <int N>
    __device__ static void rescale_o(float (&o)[N][4], const float (&rescale)[2]) {
#pragma unroll
        for (int n = 0; n < N; n++) {
            o[n][0] *= rescale[0];
            o[n][1] *= rescale[0];
            o[n][2] *= rescale[1];
            o[n][3] *= rescale[1];
        }
    }

    // After the last tile: row_sum becomes the whole row's sum (the row's 4 lanes).
    __device__ void finalize() {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 1);
            row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 2);
        }
    }
    // The output scale of row r; a query that sees nothing outputs 0.
    __device__ float inv_sum(int r) const { return row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f; }
    // Natural-log sum-exp of row r's scaled scores, -inf for a query that sees nothing.
    __device__ float lse(int r) const {
        return row_sum[r] > 0.0f ? (row_max[r] + log2f(row_sum[r])) * LN2 : -INFINITY;
    }
};

}  // namespace
