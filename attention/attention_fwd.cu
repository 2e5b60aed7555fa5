// Block-sparse flash-attention forward over the query-major tile lists, on Hopper wgmma
// (sm_90a). Parts, in order: params (FwdParams, built by fwd_params), shared memory
// (FwdSmem), scheduler (FwdBlock, the tile walk in shared memory), main-loop pieces
// (loads and products), online softmax (OnlineSoftmax), epilogue (store_out_lse), the
// kernel, and the host entry. Shared pieces: attention_kernels.cuh.
#include "attention/attention_kernels.cuh"

namespace {

// The forward block takes three adjacent query tiles, one per warpgroup, which share
// every K/V tile loaded into shared memory (a K/V tile serves 192 queries). 384 threads
// leave 168 registers each: Q stays in registers at D = 64 (150 used); at D = 128 it
// would not fit (198 with two warpgroups), so there each warpgroup's Q tile sits in
// shared memory. The first two warpgroups issue the copies (the loaders want 8-row passes).
constexpr int FWD_Q_TILES = 3;
constexpr int FWD_THREADS = FWD_Q_TILES * NUM_THREADS;
constexpr int FWD_LOAD_THREADS = 2 * NUM_THREADS;
constexpr bool fwd_q_in_smem(int D) { return D == 128; }

// K/V ring depth: tile j + 1 must be resident while tile j's P V runs, and tile
// j + FWD_STAGES - 1 is loaded meanwhile (two tiles of lead for the copies).
constexpr int FWD_STAGES = 4;

// ---------------------------------------------------------------- params

struct FwdParams : AttnInputs {
    bf16 *out;
    float *lse;  // [batch, n_heads, seq_len]
};

FwdParams fwd_params(const AttnShape *shape, const AttnMask *mask, const bf16 *q, const bf16 *k,
                     const bf16 *v, bf16 *out, float *lse) {
    FwdParams p;
    static_cast<AttnInputs &>(p) = attn_inputs(shape, mask, q, k, v);
    p.out = out;
    p.lse = lse;
    return p;
}

// ---------------------------------------------------------------- shared memory

// The block's key tiles are the union of the lists of its three query tiles: `walk` is
// advanced by thread 0 only (per-thread merge state would hold 16 registers across the
// main loop), which publishes step j + i in step[(j + i) % FWD_STAGES].
typedef TileStep<FWD_Q_TILES> FwdStep;

// The block's Q tiles, swizzled (K-major A operands), where Q lives in shared memory.
template <int D, bool IN_SMEM = fwd_q_in_smem(D)>
struct FwdQTiles {
    alignas(1024) bf16 q[FWD_Q_TILES][BM * D];
};
template <int D>
struct FwdQTiles<D, false> {};

template <int D>
struct FwdSmem {
    KeyRing<D, FWD_STAGES> keys;
    FwdQTiles<D> q;
    MergedLines<FWD_Q_TILES> walk;
    FwdStep step[FWD_STAGES];
};

// ---------------------------------------------------------------- scheduler

// Grid (n_heads, ceil(n_q_tiles / 3), batch); query tiles in reverse so the longest
// (causal) start first. Warpgroup w owns query tile q_tile0 + w.
struct FwdBlock {
    int head, kv_head, batch, q_tile0;
};

__device__ __forceinline__ FwdBlock fwd_block(const AttnDims &d) {
    const int head = blockIdx.x;
    return {head, head / d.group, (int)blockIdx.z, (int)(gridDim.y - 1 - blockIdx.y) * FWD_Q_TILES};
}

dim3 fwd_grid(const AttnDims &d) { return dim3(d.n_heads, n_tiles(d.n_q_tiles, FWD_Q_TILES), d.batch); }

// Thread 0: the walk over the merged lists of the block's query tiles, and its first
// FWD_STAGES steps.
template <int D>
__device__ __forceinline__ void start_walk(FwdSmem<D> &smem, const TileListsView &by_query, const FwdBlock &blk) {
    smem.walk.init(by_query, blk.batch, blk.q_tile0);
#pragma unroll
    for (int i = 0; i < FWD_STAGES; i++) smem.step[i] = smem.walk.next();
}

// ---------------------------------------------------------------- main-loop pieces

// One cp.async group per step: its key tile into ring stage `stage`, none past the end.
template <int D>
__device__ __forceinline__ void load_step(FwdSmem<D> &smem, const KeySource &src, const FwdStep &step, int stage) {
    if (!step.done() && threadIdx.x < FWD_LOAD_THREADS)
        load_key_tile<FWD_LOAD_THREADS>(smem.keys, stage, src, step.tile);
    cp_async_commit();
}

// This warp's 16 query rows (q_row and q_row + 8 of this thread) as A fragments (the
// mma.sync layout wgmma takes from registers), straight from global memory; zeros past
// seq_len, and everywhere when the block has no key tile.
template <int D>
__device__ __forceinline__ void load_q_frags(uint32_t (&q_frag)[D / 16][4], const bf16 *q_head, int row_stride,
                                             int q_row, int seq_len, bool any_tile) {
    const int l = lane_id();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = q_row + 8 * r;
        const uint32_t *src = reinterpret_cast<const uint32_t *>(q_head + (int64_t)qi * row_stride + 2 * (l % 4));
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            q_frag[kk][r] = qi < seq_len && any_tile ? src[8 * kk] : 0u;
            q_frag[kk][2 + r] = qi < seq_len && any_tile ? src[8 * kk + 4] : 0u;
        }
    }
}

// Issues S = Q K^T for one key tile (K-major, from the ring); the caller commits.
template <int D>
__device__ __forceinline__ void issue_scores(float (&s)[BN / 8][4], const uint32_t (&q_frag)[D / 16][4],
                                             const bf16 *t_k) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma::mma_rs_n64<0>(s, q_frag[kk], wgmma::desc_k_major(t_k, BN, 16 * kk), kk > 0);
}

// The same with Q from the warpgroup's shared-memory tile (both operands K-major).
template <int D>
__device__ __forceinline__ void issue_scores(float (&s)[BN / 8][4], const bf16 *t_q, const bf16 *t_k) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma::mma_ss_n64<0, 0>(s, wgmma::desc_k_major(t_q, BM, 16 * kk), wgmma::desc_k_major(t_k, BN, 16 * kk),
                                kk > 0);
}

// Issues O += P V for one key tile (V MN-major, from the ring); the caller commits.
template <int D>
__device__ __forceinline__ void issue_pv(float (&o)[D / 8][4], const uint32_t (&p_frag)[BN / 16][4],
                                         const bf16 *t_v) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
        wgmma::mma_rs<D, 1>(o, p_frag[kk], wgmma::desc_mn_major(t_v, BN, 16 * kk, 0), true);
}

// ---------------------------------------------------------------- online softmax

// Running softmax state of this thread's two rows (accumulator rows lane/4 and lane/4 + 8)
// in scaled base-2 units: the row maximum and this thread's part of the row sum.
struct OnlineSoftmax {
    float row_max[2], row_sum[2];

    __device__ void init() {
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.0f;
    }

    // The masked scores of one key tile become P = 2^(s * scale_log2 - new maximum);
    // rescale[r] is what O's row r must be multiplied by.
    __device__ void update(float (&s)[BN / 8][4], float scale_log2, float (&rescale)[2]) {
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

// ---------------------------------------------------------------- epilogue

// O = o / row sum as bf16, and the LSE, for this thread's rows below seq_len.
template <int D>
__device__ __forceinline__ void store_out_lse(const FwdParams &p, const FwdBlock &blk, int q_row,
                                              const float (&o)[D / 8][4], const OnlineSoftmax &softmax) {
    const AttnDims &d = p.dims;
    const int l = lane_id();
    bf16 *out_head = p.out + blk.batch * d.q_batch_stride + blk.head * D;
    float *lse_row = p.lse + ((int64_t)blk.batch * d.n_heads + blk.head) * d.seq_len;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = q_row + 8 * r;
        if (qi >= d.seq_len) continue;
        const float inv = softmax.inv_sum(r);
        bf16 *dst = out_head + (int64_t)qi * d.q_row_stride + 2 * (l % 4);
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * n) =
                __floats2bfloat162_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (l % 4 == 0) lse_row[qi] = softmax.lse(r);
    }
}

// ---------------------------------------------------------------- kernel

// The warpgroups walk the merged key tiles and share each K/V tile of the ring. Q is the
// A operand of S = Q K^T: registers at D = 64, the warpgroup's shared-memory tile at
// D = 128. Per key tile j, software-pipelined
// inside the warpgroup: issue S(j+1) = Q K(j+1)^T and O += P(j) V(j), then mask and
// softmax S(j+1) while P(j) V(j) still runs on the tensor cores, then rescale O once it
// has landed. Registers at D = 128: O 64 + S 32 + P 16 per thread (166 used), at D = 64
// Q 16 + O 32 + S 32 + P 16 (150 used): one block of 384 threads per SM.
template <int D>
__global__ void __launch_bounds__(FWD_THREADS, 1) attn_fwd_kernel(const __grid_constant__ FwdParams p) {
    static_assert(sizeof(FwdSmem<D>) <= MAX_SMEM_PER_BLOCK, "shared memory of one block");
    extern __shared__ unsigned char smem_raw[];
    FwdSmem<D> &smem = *reinterpret_cast<FwdSmem<D> *>(smem_raw);
    const AttnDims &d = p.dims;
    const FwdBlock blk = fwd_block(d);
    const int wg = threadIdx.x / NUM_THREADS;
    const int q_row = (blk.q_tile0 + wg) * BM + warp_row();
    const int64_t kv_off = blk.batch * d.kv_batch_stride + blk.kv_head * D;
    const KeySource keys = {p.k + kv_off, p.v + kv_off, p.mask.lo + (int64_t)blk.batch * d.seq_len,
                            p.mask.hi + (int64_t)blk.batch * d.seq_len, d.kv_row_stride, d.seq_len};

    if (threadIdx.x == 0) start_walk(smem, p.mask.by_query, blk);
    __syncthreads();  // smem.step
    FwdStep step = smem.step[0];
    const bf16 *q_head = p.q + blk.batch * d.q_batch_stride + blk.head * D;
    uint32_t q_frag[D / 16][4];  // Q in registers (unused where it is in shared memory)
    if constexpr (fwd_q_in_smem(D)) {  // the Q tiles join step 0's copy group
        if (!step.done() && threadIdx.x < FWD_LOAD_THREADS)
#pragma unroll
            for (int t = 0; t < FWD_Q_TILES; t++)
                load_tile_swizzled<BM, D, FWD_LOAD_THREADS>(smem.q.q[t], q_head, d.q_row_stride,
                                                            (blk.q_tile0 + t) * BM, d.seq_len);
    } else {
        load_q_frags<D>(q_frag, q_head, d.q_row_stride, q_row, d.seq_len, !step.done());
    }
#pragma unroll
    for (int i = 0; i < FWD_STAGES - 1; i++) load_step(smem, keys, smem.step[i], i);

    float o[D / 8][4];            // [64 x D] unnormalised output over the warpgroup
    float s[BN / 8][4];           // [64 x BN] scores of the next key tile
    uint32_t p_frag[BN / 16][4];  // P of this key tile as A fragments (k = keys)
    float rescale[2];
    OnlineSoftmax softmax;
    softmax.init();
    zero(o);
    auto scores = [&](int stage) {  // issues S = Q K^T of the key tile in `stage`
        if constexpr (fwd_q_in_smem(D)) issue_scores<D>(s, smem.q.q[wg], smem.keys.k[stage]);
        else issue_scores<D>(s, q_frag, smem.keys.k[stage]);
    };

    if (!step.done()) {  // step 0: scores and P before the pipelined loop
        cp_async_wait<FWD_STAGES - 2>();
        wgmma::fence_async_shared();
        __syncthreads();  // step 0 landed
        wgmma::fence();
        scores(0);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(s);
        mask_tile(s, step.of(wg), ragged_tile(step.tile, d.seq_len), smem.keys.lo[0], smem.keys.hi[0], q_row);
        softmax.update(s, d.scale_log2, rescale);
        acc_to_a<BN>(p_frag, s);  // O is still 0: no rescale
    }
    // Step j's P is in p_frag. The wgmma sequences carry no branch between issue and
    // wait (ptxas serializes them otherwise), so the last step's P V is peeled off.
    for (int j = 0; !step.done(); j++) {
        const int stage = j % FWD_STAGES, next_stage = (j + 1) % FWD_STAGES;
        const FwdStep next = smem.step[next_stage];
        const bf16 *t_v = smem.keys.v[stage];
        if (next.done()) {
            wgmma::fence();
            issue_pv<D>(o, p_frag, t_v);
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::pin(o);
            wgmma::pin(p_frag);
            break;
        }
        cp_async_wait<FWD_STAGES - 3>();
        wgmma::fence_async_shared();
        // Step j + 1 landed; every warpgroup has finished step j - 1, so its stage
        // (the slot of step j + FWD_STAGES - 1) is free, and the published step j + 1
        // is read by everyone before thread 0 reuses the slot of step j.
        __syncthreads();
        const int refill = (j + FWD_STAGES - 1) % FWD_STAGES;
        load_step(smem, keys, smem.step[refill], refill);
        if (threadIdx.x == 0) smem.step[stage] = smem.walk.next();  // step j + FWD_STAGES

        wgmma::fence();
        scores(next_stage);
        wgmma::commit();
        issue_pv<D>(o, p_frag, t_v);
        wgmma::commit();
        wgmma::wait<1>();  // the scores; P V may still run
        wgmma::pin(s);
        mask_tile(s, next.of(wg), ragged_tile(next.tile, d.seq_len), smem.keys.lo[next_stage],
                  smem.keys.hi[next_stage], q_row);
        softmax.update(s, d.scale_log2, rescale);
        wgmma::wait<0>();
        wgmma::pin(o);
        wgmma::pin(p_frag);
        OnlineSoftmax::rescale_o(o, rescale);
        acc_to_a<BN>(p_frag, s);
        step = next;
    }

    softmax.finalize();
    store_out_lse<D>(p, blk, q_row, o, softmax);
}

// ---------------------------------------------------------------- host

template <int D>
void forward(const FwdParams &p, cudaStream_t stream) {
    launch(attn_fwd_kernel<D>, fwd_grid(p.dims), FWD_THREADS, sizeof(FwdSmem<D>), stream, p);
}

}  // namespace

extern "C" void attention_forward_cuda(const AttnShape *shape, const AttnMask *mask, const attn_bf16 *q,
                                       const attn_bf16 *k, const attn_bf16 *v, attn_bf16 *out,
                                       float *lse, cudaStream_t stream) {
    const FwdParams p = fwd_params(shape, mask, q, k, v, out, lse);
    if (p.dims.head_dim == 64) forward<64>(p, stream);
    else forward<128>(p, stream);
}
