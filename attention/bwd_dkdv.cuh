// The attention backward's dK/dV kernel over the key-major tile lists, on Hopper wgmma
// (sm_90a), warp-specialised as the forward: a producer thread brings the tiles (TMA) onto
// mbarriers, two consumer warpgroups compute dK and dV of their key tiles and take turns
// at the pair's dQ (bwd_dq.cuh). Parts, in order: layout (threads, registers, resident
// K/V, shared memory), producer, the recomputed products S^T and dP^T, gradient element
// work, epilogue, consumer and the kernel.
#pragma once
#include "attention/bwd_dq.cuh"
#include "attention/bwd_params.cuh"
#include "attention/copy_sm90.cuh"
#include "attention/fragments.cuh"
#include "attention/kernel_config.cuh"
#include "attention/tile_walk.cuh"
#include "attention/wgmma.cuh"

namespace {

// ---------------------------------------------------------------- layout

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

// ---------------------------------------------------------------- producer

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

// ---------------------------------------------------------------- recomputed products

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
// index, being negative, which it never is. Without such a read ptxas (CUDA 13.0) may
// give their registers to the step's P^T and dS^T fragments, so that from the second step
// on S^T and dP^T read those; an empty asm or a mov vanishes before register allocation
// and does not help (docs/KERNELS.md).
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
// so that its exponentials overlap dp, measures slower: docs/KERNELS.md).
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

// ---------------------------------------------------------------- gradient element work

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

// ---------------------------------------------------------------- epilogue

// This thread's two key rows below seq_len: dK (times the softmax scale) and dV as bf16
// (store_row_bf16), or with GQA the head's fp32 partial sums at dkv_part[head % group]
// (8-byte stores: 16-byte ones after swaps between lane pairs measure slower at D = 64;
// docs/KERNELS.md).
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

// ---------------------------------------------------------------- consumer

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

// ---------------------------------------------------------------- kernel

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

}  // namespace
