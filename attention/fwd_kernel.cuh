// The block-sparse flash-attention forward kernel over the query-major tile lists, on
// Hopper wgmma (sm_90a), warp-specialised as FlashAttention-3's: a producer warp issues
// the copies (TMA) onto mbarriers, two consumer warpgroups compute, each at its own pace.
// Parts, in order: configuration (FwdConfig), params (FwdParams; built on the host by
// attention_fwd.cu), shared memory (FwdSmem), scheduler (FwdBlock, the tile walk),
// main-loop pieces (products, masking), epilogue (store_out_lse), producer, consumer and
// the kernel. The online softmax: softmax.cuh.
#pragma once
#include "attention/copy_sm90.cuh"
#include "attention/fragments.cuh"
#include "attention/kernel_params.cuh"
#include "attention/scheduler.cuh"
#include "attention/softmax.cuh"
#include "attention/tile_walk.cuh"
#include "attention/wgmma.cuh"

namespace {

// A forward block takes Q_TILES adjacent query tiles, one per consumer warpgroup, which
// share every K/V tile loaded into shared memory, and walks the union of their key tiles
// STEP_TILES tiles (a step) at a time: per step each consumer computes S = Q K^T over the
// step's 64 * STEP_TILES keys and O += P V. Two consumers (232 registers each; the
// producer's warpgroup keeps 40) with 128-key steps: O (D/2) + S 64 + P 32 registers, Q
// in shared memory. The copies of step j + LEAD are issued while step j runs: K is LEAD
// steps deep, V LEAD + 1 (at D = 128 one step's K and V are 64 KiB). A block runs ITEMS
// work items in turn (the scheduler below); two are faster than one at both head dims
// (docs/KERNELS.md).
template <int D>
struct FwdConfig {
    static constexpr int Q_TILES = 2, STEP_TILES = 2, LEAD = D == 64 ? 3 : 2, ITEMS = 2;
};
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
// The consumer warpgroups and the producer's.
template <int D>
constexpr int fwd_threads() { return (FwdConfig<D>::Q_TILES + 1) * NUM_THREADS; }

// ---------------------------------------------------------------- params

struct FwdParams : AttnInputs {
    bf16 *out;
    float *lse;               // [batch, n_heads, seq_len]
    CUtensorMap map_q, map_k, map_v;  // TMA descriptors of q, k, v
    int l2_heads;             // query heads per L2 section of the work items (fwd_block)
};

// ---------------------------------------------------------------- shared memory

// The block's key tiles are the union of the lists of its query tiles, walked by the
// producer warp, which publishes each step in shared memory. A step's later tiles may be
// past the end of the walk (done): those are staged as zeros that no query sees.
template <int D>
struct FwdStep {
    TileStep<FwdConfig<D>::Q_TILES> tile[FwdConfig<D>::STEP_TILES];
    __device__ bool done() const { return tile[0].done(); }
};

// The ring of steps: step j's K in k[j % LEAD] (with its intervals), its V in
// v[j % (LEAD + 1)]. S(j + 1) and P(j) V(j) run together, so K(j + 1 .. j + LEAD) and
// V(j .. j + LEAD) are resident or in flight. A slot holds a step's tiles as one swizzled
// tile of 64 * STEP_TILES rows (the B operand of one wgmma per 16-wide slice).
template <int D, int LEAD = FwdConfig<D>::LEAD, int KEYS = FwdConfig<D>::STEP_TILES * BN>
struct FwdRing {
    alignas(1024) bf16 k[LEAD][KEYS * D];
    alignas(1024) bf16 v[LEAD + 1][KEYS * D];
    int32_t lo[LEAD][KEYS], hi[LEAD][KEYS];
};

// How the producer hands steps over: step j (counted over the block's work items, each
// item's closing done step included) in step[j % LEAD], published with K(j); per slot a
// full barrier (the producer's copies have landed) and an empty one (every consumer
// thread is done with it), for K (with the intervals and the step) and V apart (V counts
// only steps with keys), and the same pair for the Q tiles (loaded for items with keys).
template <int D, int LEAD = FwdConfig<D>::LEAD>
struct FwdSync {
    FwdStep<D> step[LEAD];
    uint64_t full_k[LEAD], empty_k[LEAD], full_v[LEAD + 1], empty_v[LEAD + 1], full_q, empty_q;
};

template <int D>
struct FwdSmem {
    FwdRing<D> ring;
    alignas(1024) bf16 q[FwdConfig<D>::Q_TILES][BM * D];  // the Q tiles, swizzled (K-major A operands)
    FwdSync<D> sync;
};

// ---------------------------------------------------------------- scheduler

// Work items (batch, query tiles, head) in L2 sections (l2_item): runs of l2_heads whose K
// and V fit L2_SECTION_BYTES together; inside a run the query tiles in reverse, so the
// longest (causal) come first. With two items per block,
// block b takes items 2b and 2b + 1 (the same query tiles of adjacent heads): half as
// many blocks start, the blocks still come longest first, and while the consumers finish
// the first item (its last P V and the stores) the producer already loads the second's.
// Warpgroup w owns query tile q_tile0 + w.
struct FwdBlock {
    int head, kv_head, batch, q_tile0;
};

template <int D>
__device__ __forceinline__ int fwd_work_items(const AttnDims &d) {
    return d.batch * n_tiles(d.n_q_tiles, FwdConfig<D>::Q_TILES) * d.n_heads;
}

template <int D>
__device__ __forceinline__ FwdBlock fwd_block(const FwdParams &p, int item) {
    const AttnDims &d = p.dims;
    const int n_groups = n_tiles(d.n_q_tiles, FwdConfig<D>::Q_TILES);
    const L2Item it = l2_item(d, item, n_groups, p.l2_heads);
    return {it.head, it.kv_head, it.batch, (n_groups - 1 - it.tile) * FwdConfig<D>::Q_TILES};
}

// Block b's k-th item (k < ITEMS), -1 past its last.
template <int D>
__device__ __forceinline__ int fwd_item(const AttnDims &d, int k) {
    const int item = blockIdx.x * FwdConfig<D>::ITEMS + k;
    return item < fwd_work_items<D>(d) ? item : -1;
}

template <int D>
dim3 fwd_grid(const AttnDims &d) {
    return dim3(n_tiles(d.batch * n_tiles(d.n_q_tiles, FwdConfig<D>::Q_TILES) * d.n_heads,
                        FwdConfig<D>::ITEMS));
}

// The next step of a walk.
template <int D>
__device__ __forceinline__ FwdStep<D> next_step(WarpWalk<FwdConfig<D>::Q_TILES> &walk) {
    FwdStep<D> step;
#pragma unroll
    for (int t = 0; t < FwdConfig<D>::STEP_TILES; t++) step.tile[t] = walk.next();
    return step;
}

// ---------------------------------------------------------------- main-loop pieces

// Issues S = Q K^T for the KEYS keys of one step, Q from the warpgroup's shared-memory
// tile, K from the ring (both K-major); the caller commits.
template <int D, int KEYS>
__device__ __forceinline__ void issue_scores(float (&s)[KEYS / 8][4], const bf16 *t_q, const bf16 *t_k) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma::mma_ss<KEYS, 0, 0>(s, wgmma::desc_k_major(t_q, BM, 16 * kk), wgmma::desc_k_major(t_k, KEYS, 16 * kk),
                                  kk > 0);
}

// Issues O += P V for the KEYS keys of one step (V MN-major, from the ring); the caller commits.
template <int D, int KEYS>
__device__ __forceinline__ void issue_pv(float (&o)[D / 8][4], const uint32_t (&p_frag)[KEYS / 16][4],
                                         const bf16 *t_v) {
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; kk++)
        wgmma::mma_rs<D, 1>(o, p_frag[kk], wgmma::desc_mn_major(t_v, KEYS, 16 * kk, 0), true);
}

// The hidden scores of a step whose K slot is `ks`, for the query tile of warpgroup wg:
// full tiles untouched, partial ones by the per-element interval test, and a tile the
// warpgroup's lists do not show by that same test, as a query row that no key admits. A
// separate -inf fill for those made the scores reach the softmax through a three-way merge
// that ptxas did not coalesce: 64 register moves per step on the common path.
template <int D>
__device__ __forceinline__ void mask_step(float (&s)[FwdConfig<D>::STEP_TILES * BN / 8][4], const FwdStep<D> &step,
                                          int wg, const FwdRing<D> &ring, int ks, int seq_len, int q_row) {
    constexpr int NO_ROW = INT_MIN / 2;  // below every lo, also NO_ROW + 8
#pragma unroll
    for (int t = 0; t < FwdConfig<D>::STEP_TILES; t++) {
        const TileStep<FwdConfig<D>::Q_TILES> &tile = step.tile[t];
        const TileClass cls = tile.of(wg);
        if (cls == TileClass::Full && !(!tile.done() && ragged_tile(tile.tile, seq_len))) continue;
        mask_scores(s, ring.lo[ks] + t * BN, ring.hi[ks] + t * BN, cls == TileClass::Empty ? NO_ROW : q_row,
                    t * BN / 8);
    }
}

// ---------------------------------------------------------------- epilogue

// O = o / row sum as bf16 (store_row_bf16), and the LSE, for this thread's rows below seq_len.
template <int D>
__device__ __forceinline__ void store_out_lse(const FwdParams &p, const FwdBlock &blk, int q_row,
                                              const float (&o)[D / 8][4], const OnlineSoftmax &softmax) {
    const AttnDims &d = p.dims;
    bf16 *out_head = p.out + blk.batch * d.q_batch_stride + blk.head * D;
    float *lse_row = p.lse + ((int64_t)blk.batch * d.n_heads + blk.head) * d.seq_len;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = q_row + 8 * r;
        const bool live = qi < d.seq_len;
        store_row_bf16<D>(out_head + (int64_t)(live ? qi : 0) * d.q_row_stride, o, r, softmax.inv_sum(r), live);
        if (live && lane_id() % 4 == 0) lse_row[qi] = softmax.lse(r);
    }
}

// ---------------------------------------------------------------- producer

// The Q tiles of one work item onto full_q (lane 0 issues).
template <int D>
__device__ __forceinline__ void load_q(FwdSmem<D> &smem, const FwdParams &p, const FwdBlock &blk) {
    typedef FwdConfig<D> C;
    mbar_arrive_expect_tx(&smem.sync.full_q, C::Q_TILES * BM * D * (int)sizeof(bf16));
#pragma unroll
    for (int t = 0; t < C::Q_TILES; t++)
#pragma unroll
        for (int c = 0; c < D / 64; c++)
            tma_load_3d(smem.q[t] + c * BM * 64, &p.map_q, blk.head * D + 64 * c, (blk.q_tile0 + t) * BM, blk.batch,
                        &smem.sync.full_q);
}

// One step j of a work item (jv: the steps with keys before it, over the block): waits
// until K slot j % LEAD is free, publishes the step there and has the copy engine bring
// K(j) (TMA, 128-byte swizzle; a missing tile is read past the tensor's end, as zeros)
// while the lanes copy the intervals, then the same for V in slot jv % (LEAD + 1). A done
// step is only published. Returns whether the step had keys.
template <int D>
__device__ __forceinline__ bool produce_step(FwdSmem<D> &smem, const FwdParams &p, const FwdBlock &blk,
                                             const int32_t *lo, const int32_t *hi, const FwdStep<D> &step, int j,
                                             int jv) {
    typedef FwdConfig<D> C;
    constexpr int LEAD = C::LEAD, KEYS = C::STEP_TILES * BN, STEP_BYTES = KEYS * D * (int)sizeof(bf16);
    FwdSync<D> &sync = smem.sync;
    const AttnDims &d = p.dims;
    const int l = lane_id();
    const int ks = j % LEAD, vs = jv % (LEAD + 1);
    if (j >= LEAD) mbar_wait(&sync.empty_k[ks], (j / LEAD + 1) & 1);
    if (l == 0) {
        sync.step[ks] = step;
        mbar_arrive_expect_tx(&sync.full_k[ks], step.done() ? 0 : STEP_BYTES);
    }
    if (!step.done()) {
#pragma unroll
        for (int t = 0; t < C::STEP_TILES; t++) {
            const bool missing = step.tile[t].done();
            const int k0 = missing ? d.s_pad : step.tile[t].tile * BN;
            if (l == 0)
#pragma unroll
                for (int c = 0; c < D / 64; c++)
                    tma_load_3d(smem.ring.k[ks] + c * KEYS * 64 + t * BN * 64, &p.map_k, blk.kv_head * D + 64 * c, k0,
                                blk.batch, &sync.full_k[ks]);
            // Only mask_step reads the intervals: for a tile some warpgroup does not see
            // whole, or the ragged last one.
            bool all_full = true;
#pragma unroll
            for (int w = 0; w < C::Q_TILES; w++) all_full &= step.tile[t].cls[w] == TileClass::Full;
            if (all_full && !ragged_tile(step.tile[t].tile, d.seq_len)) continue;
#pragma unroll
            for (int i = l; i < BN; i += 32) {
                const bool valid = k0 + i < d.seq_len;
                cp_async4(smem.ring.lo[ks] + t * BN + i, lo + (valid ? k0 + i : 0), valid);
                cp_async4(smem.ring.hi[ks] + t * BN + i, hi + (valid ? k0 + i : 0), valid);
            }
        }
    }
    mbar_arrive_cp_async(&sync.full_k[ks]);
    if (step.done()) return false;
    if (jv >= LEAD + 1) mbar_wait(&sync.empty_v[vs], (jv / (LEAD + 1) + 1) & 1);
    if (l == 0) {
        mbar_arrive_expect_tx(&sync.full_v[vs], STEP_BYTES);
#pragma unroll
        for (int t = 0; t < C::STEP_TILES; t++) {
            const int k0 = step.tile[t].done() ? d.s_pad : step.tile[t].tile * BN;
#pragma unroll
            for (int c = 0; c < D / 64; c++)
                tma_load_3d(smem.ring.v[vs] + c * KEYS * 64 + t * BN * 64, &p.map_v, blk.kv_head * D + 64 * c, k0,
                            blk.batch, &sync.full_v[vs]);
        }
    }
    return true;
}

// Warp 0 of the last warpgroup produces, the other warpgroups consume. Per work item the
// producer walks the merged lists (every lane the same walk, in registers) and produces
// its steps; the walk's end is published as a done step. The block's first Q tiles go
// before K(0) (nothing waits for their buffer), a later item's after its first step's K
// and V (the buffer frees up last, when the consumers end the item before). That first
// step is peeled off the step loop, which so holds no Q code: the producer shares an SM
// sub-partition's issue slots with two consumer warps, so each instruction per step
// counts (at D = 64 most: its steps are half as long).
template <int D>
__device__ __forceinline__ void produce(FwdSmem<D> &smem, const FwdParams &p) {
    typedef FwdConfig<D> C;
    const AttnDims &d = p.dims;
    const int l = lane_id();
    int j = 0, n_q = 0;  // steps (each item's done step included) and Q loads, over the block's items
    #pragma unroll 1
    for (int k = 0; k < C::ITEMS && fwd_item<D>(d, k) >= 0; k++) {
        const FwdBlock blk = fwd_block<D>(p, fwd_item<D>(d, k));
        const int32_t *lo = p.mask.lo + (int64_t)blk.batch * d.seq_len;
        const int32_t *hi = p.mask.hi + (int64_t)blk.batch * d.seq_len;
        WarpWalk<C::Q_TILES> walk;
        walk.init(p.mask.by_query, blk.batch, blk.q_tile0);
        const bool q_early = k == 0;
        const FwdStep<D> step0 = next_step<D>(walk);
        if (q_early && !step0.done() && l == 0) load_q(smem, p, blk);
        // jv = j - k: each earlier item ended with one done step.
        bool keys = produce_step(smem, p, blk, lo, hi, step0, j, j - k);
        j++;
        if (!keys) continue;
        if (!q_early) {
            if (n_q >= 1) mbar_wait(&smem.sync.empty_q, (n_q - 1) & 1);
            if (l == 0) load_q(smem, p, blk);
        }
        n_q++;
        for (FwdStep<D> step = next_step<D>(walk);; step = next_step<D>(walk)) {
            keys = produce_step(smem, p, blk, lo, hi, step, j, j - k);
            j++;
            if (!keys) break;
        }
    }
}

// ---------------------------------------------------------------- consumer

// A consumer warpgroup walks the published steps of each of the block's work items. Q is
// the A operand of S = Q K^T from its shared-memory tile. Per step j, software-pipelined
// inside the warpgroup: issue S(j+1) = Q K(j+1)^T and O += P(j) V(j), then mask and
// softmax S(j+1) while P(j) V(j) still runs on the tensor cores, then rescale O once it
// has landed (only if a row maximum moved). Every slot phase (a done step's too) gets
// this thread's arrival on its empty barrier as soon as S (with the intervals), P V or
// the item's last S is done with it.
template <int D>
__device__ __forceinline__ void consume(FwdSmem<D> &smem, const FwdParams &p, int wg) {
    typedef FwdConfig<D> C;
    constexpr int LEAD = C::LEAD, KEYS = C::STEP_TILES * BN;
    FwdSync<D> &sync = smem.sync;
    const AttnDims &d = p.dims;
    int j = 0, jv = 0, n_q = 0;  // as the producer counts them
    #pragma unroll 1
    for (int k = 0; k < FwdConfig<D>::ITEMS && fwd_item<D>(d, k) >= 0; k++) {
        const int item = fwd_item<D>(d, k);
        const FwdBlock blk = fwd_block<D>(p, item);
        const int q_row = (blk.q_tile0 + wg) * BM + warp_row();
        float o[D / 8][4];              // [64 x D] unnormalised output over the warpgroup
        float s[KEYS / 8][4];           // [64 x KEYS] scores of the next step
        uint32_t p_frag[KEYS / 16][4];  // P of this step as A fragments (k = keys)
        uint32_t p_frag2[KEYS / 16][4];  // and of the next step (the two alternate)
        float rescale[2];
        OnlineSoftmax softmax;
        softmax.init();
        zero(o);

        int ks = j % LEAD;
        mbar_wait(&sync.full_k[ks], (j / LEAD) & 1);
        FwdStep<D> step = sync.step[ks];
        const bool any_key = !step.done();
        if (any_key) {  // step 0: scores and P before the pipelined loop
            mbar_wait(&sync.full_q, n_q & 1);
            wgmma::fence();
            issue_scores<D, KEYS>(s, smem.q[wg], smem.ring.k[ks]);
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::pin(s);
            mask_step<D>(s, step, wg, smem.ring, ks, d.seq_len, q_row);
        }
        mbar_arrive(&sync.empty_k[ks]);
        if (any_key) {
            softmax.update(s, d.scale_log2, rescale);
            acc_to_a<KEYS>(p_frag, s);  // O is still 0: no rescale
        }
        j++;
        // Step j's P is in p_cur. The wgmma sequences carry no branch between issue and
        // wait (ptxas serializes them otherwise), so the last step's P V is peeled off. P
        // is double-buffered: the next step's is packed into p_next while P V still reads
        // p_cur, so nothing but the slot release (and a rare rescale) waits for P V.
        // The barriers of a step's K(j + 1) (with the published step `next`) and V(j) are
        // waited for in the step before, while its P V runs. Returns whether the walk goes on.
        FwdStep<D> next;
        auto wait_ahead = [&]() {
            mbar_wait(&sync.full_k[j % LEAD], (j / LEAD) & 1);
            next = sync.step[j % LEAD];
            mbar_wait(&sync.full_v[jv % (LEAD + 1)], (jv / (LEAD + 1)) & 1);
        };
        auto pipelined_step = [&](uint32_t(&p_cur)[KEYS / 16][4], uint32_t(&p_next)[KEYS / 16][4]) -> bool {
            const int vs = jv % (LEAD + 1);
            ks = j % LEAD;
            const bf16 *t_v = smem.ring.v[vs];
            j++;
            jv++;
            if (next.done()) {
                mbar_arrive(&sync.empty_k[ks]);
                wgmma::fence();
                issue_pv<D, KEYS>(o, p_cur, t_v);
                wgmma::commit();
                wgmma::wait<0>();
                wgmma::pin(o);
                wgmma::pin(p_cur);
                mbar_arrive(&sync.empty_v[vs]);
                return false;
            }
            wgmma::fence();
            issue_scores<D, KEYS>(s, smem.q[wg], smem.ring.k[ks]);
            wgmma::commit();
            issue_pv<D, KEYS>(o, p_cur, t_v);
            wgmma::commit();
            wgmma::wait<1>();  // the scores; P V may still run
            wgmma::pin(s);
            mask_step<D>(s, next, wg, smem.ring, ks, d.seq_len, q_row);
            // Mostly against the maximum so far; where a row's maximum must grow, update's.
            const bool fixed = softmax.update_fixed(s, d.scale_log2, p_next);
            bool moved = false;
            if (!fixed) {
                moved = softmax.update(s, d.scale_log2, rescale);
                acc_to_a<KEYS>(p_next, s);
            }
            // After the exponentials (a row sum depends on all of a row's), so that the wait
            // for P V stays behind them (see mbar_arrive_after). The packing stays before
            // the waits too: update_fixed packs before the vote that decides the branch.
            mbar_arrive_after(&sync.empty_k[ks], softmax.row_sum[0] + softmax.row_sum[1]);
            wait_ahead();
            wgmma::wait<0>();
            wgmma::pin(o);
            wgmma::pin(p_cur);
            mbar_arrive(&sync.empty_v[vs]);
            if (!fixed && __any_sync(0xffffffff, moved)) OnlineSoftmax::rescale_o(o, rescale);
            return true;
        };
        if (any_key) {
            wait_ahead();
            while (pipelined_step(p_frag, p_frag2) && pipelined_step(p_frag2, p_frag)) {
            }
        }
        if (any_key) {  // the Q tiles are free for the next item
            mbar_arrive(&sync.empty_q);
            n_q++;
        }

        softmax.finalize();
        store_out_lse<D>(p, blk, q_row, o, softmax);
    }
}

// ---------------------------------------------------------------- kernel

// Thread 0 sets up the barriers; then the producer's warpgroup gives its registers to the
// consumers, and its warp 0 produces while the others leave. One block per SM.
template <int D>
__global__ void __launch_bounds__(fwd_threads<D>(), 1) attn_fwd_kernel(const __grid_constant__ FwdParams p) {
    static_assert(sizeof(FwdSmem<D>) <= MAX_SMEM_PER_BLOCK, "shared memory of one block");
    typedef FwdConfig<D> C;
    constexpr int CONSUMER_THREADS = C::Q_TILES * NUM_THREADS;
    extern __shared__ unsigned char smem_raw[];
    FwdSmem<D> &smem = *reinterpret_cast<FwdSmem<D> *>(smem_raw);
    const int wg = threadIdx.x / NUM_THREADS;
    if (threadIdx.x == 0) {
        FwdSync<D> &sync = smem.sync;
        for (int i = 0; i < C::LEAD; i++) {
            mbar_init(&sync.full_k[i], 1 + 32);  // the producer's lane 0 and its lanes' interval copies
            mbar_init(&sync.empty_k[i], CONSUMER_THREADS);
        }
        for (int i = 0; i <= C::LEAD; i++) {
            mbar_init(&sync.full_v[i], 1);
            mbar_init(&sync.empty_v[i], CONSUMER_THREADS);
        }
        mbar_init(&sync.full_q, 1);
        mbar_init(&sync.empty_q, CONSUMER_THREADS);
        mbar_fence_init();
    }
    __syncthreads();
    if (wg == C::Q_TILES) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x % NUM_THREADS < 32) produce(smem, p);
        return;
    }
    regs_inc<CONSUMER_REGS>();
    consume(smem, p, wg);
}

}  // namespace
