// Qwen3's q_norm / k_norm with the RoPE that follows them, one launch each way (the
// forward and the backward of rmsnorm_*_cuda over head rows, then rope): each head row
// of D values is read once, normalised, rotated and written, where the unfused ops made
// four passes over q and k and a dweight reduction sized for model-width rows.
#include <type_traits>

#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

namespace {

enum { QK_THREADS = 256, QK_ROWS_PER_THREAD_SLOT = 8 };

// One head row is served by D / 8 lanes of a warp; lane j of the row holds the values
// [4j, 4j + 4) and [D/2 + 4j, D/2 + 4j + 4): the RoPE pairs (i, i + D/2) stay in one lane.
template <int D>
struct HeadRowLanes {
    static constexpr int LANES = D / 8, HALF = D / 2, SLOTS = QK_THREADS / LANES;
    static_assert(LANES <= 32 && 32 % LANES == 0, "a row's lanes lie in one warp");
};

// Sum over the LANES lanes of a row (an aligned group of the warp). The mask names the
// group alone: the other rows of the warp may have left the loop.
template <int LANES>
__device__ inline float row_reduce_sum(float x) {
    const unsigned group = (LANES == 32 ? 0xffffffffu : (1u << LANES) - 1u)
                           << (threadIdx.x % 32 / LANES * LANES);
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset >>= 1)
        x += __shfl_xor_sync(group, x, offset);
    return x;
}

struct RowHalves {  // a lane's 8 values: lo[i] = x[4j + i], hi[i] = x[D/2 + 4j + i]
    float lo[4], hi[4];
};

__device__ inline RowHalves load_halves(const bf16 *row, int j, int half) {
    const Pack<bf16, 4> a = load_bf16s<4>(row + 4 * j), b = load_bf16s<4>(row + half + 4 * j);
    RowHalves r;
#pragma unroll
    for (int i = 0; i < 4; i++) r.lo[i] = __bfloat162float(a.x[i]), r.hi[i] = __bfloat162float(b.x[i]);
    return r;
}

__device__ inline void store_halves(bf16 *row, int j, int half, const RowHalves &v) {
    Pack<bf16, 4> a, b;
#pragma unroll
    for (int i = 0; i < 4; i++)
        a.x[i] = __float2bfloat16_rn(v.lo[i]), b.x[i] = __float2bfloat16_rn(v.hi[i]);
    store_bf16s<4>(row + 4 * j, a);
    store_bf16s<4>(row + half + 4 * j, b);
}

// RoPE of a lane's pairs with token n's angles (cos_sin [N, D/2]); direction -1 inverts.
__device__ inline RowHalves rotate_halves(const RowHalves &x, const float2 *cos_sin, int64_t n,
                                          int j, int half, float direction) {
    const float4 *cs = reinterpret_cast<const float4 *>(cos_sin + n * half + 4 * j);
    const float4 c01 = cs[0], c23 = cs[1];
    const float2 angle[4] = {{c01.x, c01.y}, {c01.z, c01.w}, {c23.x, c23.y}, {c23.z, c23.w}};
    RowHalves r;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float c = angle[i].x, s = direction * angle[i].y;
        r.lo[i] = x.lo[i] * c - x.hi[i] * s;
        r.hi[i] = x.hi[i] * c + x.lo[i] * s;
    }
    return r;
}

// The q heads and the k heads of one call: rows [0, N*H) are q's, then N*KV of k's.
struct QkRows {
    int N, H, KV;
    __device__ bool is_q(int64_t row) const { return row < (int64_t)N * H; }
    __device__ int64_t local(int64_t row) const { return is_q(row) ? row : row - (int64_t)N * H; }
    __device__ int64_t token(int64_t row) const { return local(row) / (is_q(row) ? H : KV); }
};

template <int D>
__global__ void qk_norm_rope_forward_kernel(bf16 *q_out, bf16 *k_out, float *q_rstd,
                                            float *k_rstd, const bf16 *q, const bf16 *k,
                                            const bf16 *q_weight, const bf16 *k_weight,
                                            const float2 *cos_sin, QkRows rows, float eps) {
    using L = HeadRowLanes<D>;
    const int j = threadIdx.x % L::LANES;
    const int64_t n_rows = (int64_t)rows.N * (rows.H + rows.KV);
    const int64_t stride = (int64_t)gridDim.x * L::SLOTS;
    for (int64_t row = (int64_t)blockIdx.x * L::SLOTS + threadIdx.x / L::LANES; row < n_rows;
         row += stride) {
        const bool is_q = rows.is_q(row);
        const int64_t local = rows.local(row);
        const RowHalves x = load_halves((is_q ? q : k) + local * D, j, L::HALF);
        const RowHalves w = load_halves(is_q ? q_weight : k_weight, j, L::HALF);
        float sum_sq = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) sum_sq += x.lo[i] * x.lo[i] + x.hi[i] * x.hi[i];
        const float r = rsqrtf(row_reduce_sum<L::LANES>(sum_sq) / D + eps);
        RowHalves normed;
#pragma unroll
        for (int i = 0; i < 4; i++)
            normed.lo[i] = x.lo[i] * r * w.lo[i], normed.hi[i] = x.hi[i] * r * w.hi[i];
        store_halves((is_q ? q_out : k_out) + local * D, j, L::HALF,
                     rotate_halves(normed, cos_sin, rows.token(row), j, L::HALF, 1.0f));
        float *rstd = is_q ? q_rstd : k_rstd;
        if (j == 0 && rstd) rstd[local] = r;
    }
}

// The backward's work split: blocks [0, blocks_q) take contiguous ranges of q rows,
// then blocks_k of k rows, then blocks_v of v rows (copied). A function of N, H, KV and
// the scratch size only, so the dweight sums run in the same order on any device.
struct QkBackwardPlan {
    int blocks_q, blocks_k, blocks_v;
    int64_t rows_per_block_q, rows_per_block_k, rows_per_block_v;
};

static void plan_part(int64_t rows, int rows_per_slot_pass, int max_blocks, int *blocks,
                      int64_t *rows_per_block) {
    const int64_t target = (int64_t)rows_per_slot_pass * QK_ROWS_PER_THREAD_SLOT;
    int64_t b = (rows + target - 1) / target;
    if (b > max_blocks) b = max_blocks;
    if (b < 1) b = 1;
    *rows_per_block = (rows + b - 1) / b;
    *blocks = (int)((rows + *rows_per_block - 1) / *rows_per_block);
    if (rows == 0) *blocks = 0;
}

// dx = r * (w * dy - x * r^2 * mean(w * dy * x)) of rmsnorm_backward, dy the un-rotated
// gradient (kept in fp32); dweight partial sums of dy * x * r per block.
template <int D>
__global__ void qk_norm_rope_backward_kernel(bf16 *dqkv, float *partials, const bf16 *dq,
                                             const bf16 *dk, const bf16 *dv, const bf16 *q,
                                             const bf16 *k, const bf16 *q_weight,
                                             const bf16 *k_weight, const float *q_rstd,
                                             const float *k_rstd, const float2 *cos_sin,
                                             QkRows rows, QkBackwardPlan plan) {
    using L = HeadRowLanes<D>;
    __shared__ float slot_sums[L::SLOTS][D];  // dweight partials of each row slot
    const int j = threadIdx.x % L::LANES, slot = threadIdx.x / L::LANES;
    const int H = rows.H, KV = rows.KV;
    const int64_t qkv_ld = (int64_t)(H + 2 * KV) * D;
    int part_block = blockIdx.x;
    int part = 0;  // 0 q, 1 k, 2 v
    if (part_block >= plan.blocks_q) {
        part_block -= plan.blocks_q, part = 1;
        if (part_block >= plan.blocks_k) part_block -= plan.blocks_k, part = 2;
    }
    const int64_t part_rows = (int64_t)rows.N * (part == 0 ? H : KV);
    const int64_t per_block = part == 0   ? plan.rows_per_block_q
                              : part == 1 ? plan.rows_per_block_k
                                          : plan.rows_per_block_v;
    const int64_t begin = part_block * per_block;
    const int64_t end = begin + per_block < part_rows ? begin + per_block : part_rows;
    const int heads = part == 0 ? H : KV;
    const int col0 = part == 0 ? 0 : part == 1 ? H * D : (H + KV) * D;  // slot in dqkv
    if (part == 2) {
        for (int64_t row = begin + slot; row < end; row += L::SLOTS) {
            const RowHalves g = load_halves(dv + row * D, j, L::HALF);
            store_halves(dqkv + row / heads * qkv_ld + col0 + row % heads * D, j, L::HALF, g);
        }
        return;
    }
    const bf16 *grad = part == 0 ? dq : dk, *inp = part == 0 ? q : k;
    const RowHalves w = load_halves(part == 0 ? q_weight : k_weight, j, L::HALF);
    const float *rstd = part == 0 ? q_rstd : k_rstd;
    RowHalves dweight = {};
    for (int64_t row = begin + slot; row < end; row += L::SLOTS) {
        const int64_t n = row / heads;
        const RowHalves rotated = load_halves(grad + row * D, j, L::HALF);
        const RowHalves dy = rotate_halves(rotated, cos_sin, n, j, L::HALF, -1.0f);
        const RowHalves x = load_halves(inp + row * D, j, L::HALF);
        const float r = rstd[row];
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) dot += w.lo[i] * dy.lo[i] * x.lo[i] + w.hi[i] * dy.hi[i] * x.hi[i];
        const float correction = row_reduce_sum<L::LANES>(dot) / D * r * r;
        RowHalves dx;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            dx.lo[i] = r * (w.lo[i] * dy.lo[i] - x.lo[i] * correction);
            dx.hi[i] = r * (w.hi[i] * dy.hi[i] - x.hi[i] * correction);
            dweight.lo[i] += dy.lo[i] * x.lo[i] * r;
            dweight.hi[i] += dy.hi[i] * x.hi[i] * r;
        }
        store_halves(dqkv + n * qkv_ld + col0 + row % heads * D, j, L::HALF, dx);
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
        slot_sums[slot][4 * j + i] = dweight.lo[i], slot_sums[slot][L::HALF + 4 * j + i] = dweight.hi[i];
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < L::SLOTS; s++) sum += slot_sums[s][c];
        partials[((part == 0 ? 0 : plan.blocks_q) + part_block) * (int64_t)D + c] = sum;
    }
}

// dweight[c] += the blocks' partials in block order; block 0 of the grid q's, 1 k's.
__global__ void qk_dweight_finish_kernel(float *dq_weight, float *dk_weight, const float *partials,
                                         int blocks_q, int blocks_k, int D) {
    const bool is_q = blockIdx.x == 0;
    const float *p = partials + (is_q ? 0 : (int64_t)blocks_q * D);
    const int n_blocks = is_q ? blocks_q : blocks_k;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float sum = 0.0f;
        for (int b = 0; b < n_blocks; b++) sum += p[(int64_t)b * D + c];
        (is_q ? dq_weight : dk_weight)[c] += sum;
    }
}

void check_shape(const char *op, int N, int H, int KV, int D, const void *const *pointers,
                 int n_pointers) {
    CHECK(N >= 0 && H > 0 && KV > 0 && qk_norm_rope_supports_head_dim(D),
          "%s: N=%d H=%d KV=%d head_dim=%d (head_dim 32, 64, 128 or 256)", op, N, H, KV, D);
    CHECK((int64_t)N * (H + 2 * KV) <= INT32_MAX, "%s: %d tokens x %d heads exceed 2^31 rows",
          op, N, H + 2 * KV);
    for (int i = 0; i < n_pointers; i++)
        CHECK(!pointers[i] || pack_aligned(pointers[i], 16), "%s: argument %d not 16-byte aligned",
              op, i);
}

// The kernels' instantiations, one per supported head dim.
template <typename Launch>
void for_head_dim(int D, Launch launch) {
    switch (D) {
    case 32: launch(std::integral_constant<int, 32>()); break;
    case 64: launch(std::integral_constant<int, 64>()); break;
    case 128: launch(std::integral_constant<int, 128>()); break;
    default: launch(std::integral_constant<int, 256>()); break;
    }
}

}  // namespace

bool qk_norm_rope_supports_head_dim(int D) { return D == 32 || D == 64 || D == 128 || D == 256; }

void qk_norm_rope_forward_cuda(bf16 *q_out, bf16 *k_out, float *q_rstd, float *k_rstd,
                               const bf16 *q, const bf16 *k, const bf16 *q_weight,
                               const bf16 *k_weight, const float2 *cos_sin, int N, int H, int KV,
                               int D, float eps, cudaStream_t stream) {
    const void *pointers[] = {q_out, k_out, q, k, q_weight, k_weight, cos_sin};
    check_shape("qk_norm_rope_forward_cuda", N, H, KV, D, pointers, 7);
    if (N == 0) return;
    const QkRows rows = {N, H, KV};
    const int64_t n_rows = (int64_t)N * (H + KV);
    const int slots = QK_THREADS / (D / 8);
    const unsigned blocks = grid_for((n_rows + slots - 1) / slots, 1);
    for_head_dim(D, [&](auto dim) {
        qk_norm_rope_forward_kernel<dim.value><<<blocks, QK_THREADS, 0, stream>>>(
            q_out, k_out, q_rstd, k_rstd, q, k, q_weight, k_weight, cos_sin, rows, eps);
    });
    cudaCheckLaunch();
}

void qk_norm_rope_merge_qkv_backward_cuda(bf16 *dqkv, float *dq_weight, float *dk_weight,
                                          const bf16 *dq, const bf16 *dk, const bf16 *dv,
                                          const bf16 *q, const bf16 *k, const bf16 *q_weight,
                                          const bf16 *k_weight, const float *q_rstd,
                                          const float *k_rstd, const float2 *cos_sin, int N,
                                          int H, int KV, int D, cudaStream_t stream) {
    const char *op = "qk_norm_rope_merge_qkv_backward_cuda";
    const void *pointers[] = {dqkv, dq, dk, dv, q, k, q_weight, k_weight, cos_sin};
    check_shape(op, N, H, KV, D, pointers, 9);
    if (N == 0) return;
    const OpsCudaState *s = ops_cuda_state(op);
    const int slots = QK_THREADS / (D / 8);
    // q's and k's partial rows share the scratch half and half.
    const int max_blocks = (int)(s->partials_len / (size_t)D / 2);
    QkBackwardPlan plan;
    plan_part((int64_t)N * H, slots, max_blocks, &plan.blocks_q, &plan.rows_per_block_q);
    plan_part((int64_t)N * KV, slots, max_blocks, &plan.blocks_k, &plan.rows_per_block_k);
    plan_part((int64_t)N * KV, slots, INT32_MAX / 4, &plan.blocks_v, &plan.rows_per_block_v);
    const QkRows rows = {N, H, KV};
    const unsigned blocks = (unsigned)(plan.blocks_q + plan.blocks_k + plan.blocks_v);
    for_head_dim(D, [&](auto dim) {
        qk_norm_rope_backward_kernel<dim.value><<<blocks, QK_THREADS, 0, stream>>>(
            dqkv, s->partials, dq, dk, dv, q, k, q_weight, k_weight, q_rstd, k_rstd, cos_sin,
            rows, plan);
    });
    cudaCheckLaunch();
    if (!dq_weight) return;  // frozen norms (LoRA)
    qk_dweight_finish_kernel<<<2, D, 0, stream>>>(dq_weight, dk_weight, s->partials, plan.blocks_q,
                                                  plan.blocks_k, D);
    cudaCheckLaunch();
}
