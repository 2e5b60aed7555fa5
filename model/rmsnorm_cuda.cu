// RMSNorm on the GPU (twin of rmsnorm_*_cpu), with the residual add fused into the
// forward; the backward reduces dweight in two fixed-order stages.
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

enum { RMSNORM_THREADS = 256, RMSNORM_ROWS_PER_BLOCK = RMSNORM_THREADS / 32 };

// 16-byte packs when every row starts 16-byte aligned, else single elements.
static bool rows_take_packs_of_8(int C, const void *const *pointers, int n_pointers) {
    if (C % 8 != 0) return false;
    for (int i = 0; i < n_pointers; i++)
        if (pointers[i] && !pack_aligned(pointers[i], 16)) return false;
    return true;
}

// One warp per row, lane handling packs of VEC channels. With b, the row is first
// summed: sum = bf16(a + b) is stored and normalised (the value the unfused pair
// residual_add + rmsnorm would normalise); without b, a is normalised. Each lane
// re-reads only what it wrote itself, so sum may alias a or b. The warp exits as a
// whole, so no block-wide barrier is needed.
template <int VEC>
__global__ void add_rmsnorm_forward_kernel(bf16 *sum, bf16 *out, float *rstd, const bf16 *a,
                                           const bf16 *b, const bf16 *weight, int N, int C,
                                           float eps) {
    const int64_t row = (int64_t)blockIdx.x * RMSNORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const bf16 *x = a + row * C;
    float sum_sq = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        Pack<bf16, VEC> v = load_bf16s<VEC>(x + c);
        if (b) {
            const Pack<bf16, VEC> w = load_bf16s<VEC>(b + row * C + c);
#pragma unroll
            for (int j = 0; j < VEC; j++)
                v.x[j] = __float2bfloat16_rn(__bfloat162float(v.x[j]) + __bfloat162float(w.x[j]));
            store_bf16s<VEC>(sum + row * C + c, v);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float f = __bfloat162float(v.x[j]);
            sum_sq += f * f;
        }
    }
    sum_sq = warp_reduce_sum(sum_sq);
    const float r = rsqrtf(sum_sq / C + eps);
    if (b) x = sum + row * C;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        const Pack<bf16, VEC> v = load_bf16s<VEC>(x + c), w = load_bf16s<VEC>(weight + c);
        Pack<bf16, VEC> y;
#pragma unroll
        for (int j = 0; j < VEC; j++)
            y.x[j] = __float2bfloat16_rn(__bfloat162float(v.x[j]) * r * __bfloat162float(w.x[j]));
        store_bf16s<VEC>(out + row * C + c, y);
    }
    if (lane == 0) rstd[row] = r;
}

// dx_j += r * (w_j dy_j - x_j * r^2 * mean_i(w_i dy_i x_i)); one warp per row.
template <int VEC>
__global__ void rmsnorm_backward_dinp_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp,
                                             const bf16 *weight, const float *rstd, int N,
                                             int C) {
    const int64_t row = (int64_t)blockIdx.x * RMSNORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const bf16 *x = inp + row * C, *dy = dout + row * C;
    bf16 *dx = dinp + row * C;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        const Pack<bf16, VEC> w = load_bf16s<VEC>(weight + c), g = load_bf16s<VEC>(dy + c),
                              v = load_bf16s<VEC>(x + c);
#pragma unroll
        for (int j = 0; j < VEC; j++)
            dot += __bfloat162float(w.x[j]) * __bfloat162float(g.x[j]) * __bfloat162float(v.x[j]);
    }
    dot = warp_reduce_sum(dot);
    const float correction = dot / C * r * r;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        const Pack<bf16, VEC> w = load_bf16s<VEC>(weight + c), g = load_bf16s<VEC>(dy + c),
                              v = load_bf16s<VEC>(x + c);
        Pack<bf16, VEC> d = load_bf16s<VEC>(dx + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float grad = r * (__bfloat162float(w.x[j]) * __bfloat162float(g.x[j]) -
                                    __bfloat162float(v.x[j]) * correction);
            d.x[j] = __float2bfloat16_rn(__bfloat162float(d.x[j]) + grad);
        }
        store_bf16s<VEC>(dx + c, d);
    }
}

// Stage 1 of dweight: partials[g, c] = sum over rows of group g of dy * x * r.
// Grid (channel blocks, groups); consecutive threads read consecutive channels.
__global__ void rmsnorm_dweight_partials_kernel(float *partials, const bf16 *dout,
                                                const bf16 *inp, const float *rstd, int N, int C,
                                                int rows_per_group) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int group = blockIdx.y;
    const int64_t row_begin = (int64_t)group * rows_per_group;
    const int64_t row_end = row_begin + rows_per_group < N ? row_begin + rows_per_group : N;
    float sum = 0.0f;
    for (int64_t n = row_begin; n < row_end; n++)
        sum += __bfloat162float(dout[n * C + c]) * __bfloat162float(inp[n * C + c]) * rstd[n];
    partials[(int64_t)group * C + c] = sum;
}

// Stage 2: dweight[c] += sum over groups, in group order.
__global__ void rmsnorm_dweight_finish_kernel(float *dweight, const float *partials, int n_groups,
                                              int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (int g = 0; g < n_groups; g++) sum += partials[(int64_t)g * C + c];
    dweight[c] += sum;
}

static void add_rmsnorm_launch(const char *op, bf16 *sum, bf16 *out, float *rstd, const bf16 *a,
                               const bf16 *b, const bf16 *weight, int N, int C, float eps,
                               cudaStream_t stream) {
    CHECK(N >= 0 && C > 0, "%s: bad shape N=%d C=%d", op, N, C);
    if (N == 0) return;
    const int blocks = (N + RMSNORM_ROWS_PER_BLOCK - 1) / RMSNORM_ROWS_PER_BLOCK;
    const void *rows[] = {sum, out, a, b, weight};
    if (rows_take_packs_of_8(C, rows, 5))
        add_rmsnorm_forward_kernel<8><<<blocks, RMSNORM_THREADS, 0, stream>>>(
            sum, out, rstd, a, b, weight, N, C, eps);
    else
        add_rmsnorm_forward_kernel<1><<<blocks, RMSNORM_THREADS, 0, stream>>>(
            sum, out, rstd, a, b, weight, N, C, eps);
    cudaCheckLaunch();
}

void rmsnorm_forward_cuda(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int N,
                          int C, float eps, cudaStream_t stream) {
    add_rmsnorm_launch("rmsnorm_forward_cuda", nullptr, out, rstd, inp, nullptr, weight, N, C,
                       eps, stream);
}

void add_rmsnorm_forward_cuda(bf16 *sum, bf16 *out, float *rstd, const bf16 *a, const bf16 *b,
                              const bf16 *weight, int N, int C, float eps, cudaStream_t stream) {
    CHECK(sum && b, "add_rmsnorm_forward_cuda: sum and b must not be NULL");
    add_rmsnorm_launch("add_rmsnorm_forward_cuda", sum, out, rstd, a, b, weight, N, C, eps,
                       stream);
}

void rmsnorm_backward_cuda(bf16 *dinp, float *dweight, const bf16 *dout, const bf16 *inp,
                           const bf16 *weight, const float *rstd, int N, int C,
                           cudaStream_t stream) {
    // The scratch holds RMSNORM_MAX_GROUPS partial rows of C: any N fits.
    const OpsCudaState *s = ops_cuda_state("rmsnorm_backward_cuda");
    CHECK(N >= 0 && C > 0 && C <= s->max_channels,
          "rmsnorm_backward_cuda: N=%d C=%d (C at most ops_cuda_init's max_channels=%d)", N, C,
          s->max_channels);
    if (N == 0) return;
    const int row_blocks = (N + RMSNORM_ROWS_PER_BLOCK - 1) / RMSNORM_ROWS_PER_BLOCK;
    const void *rows[] = {dinp, dout, inp, weight};
    if (rows_take_packs_of_8(C, rows, 4))
        rmsnorm_backward_dinp_kernel<8><<<row_blocks, RMSNORM_THREADS, 0, stream>>>(
            dinp, dout, inp, weight, rstd, N, C);
    else
        rmsnorm_backward_dinp_kernel<1><<<row_blocks, RMSNORM_THREADS, 0, stream>>>(
            dinp, dout, inp, weight, rstd, N, C);
    cudaCheckLaunch();
    if (!dweight) return;  // a frozen weight (LoRA)

    // Groups depend only on N (not on the device), so the order of sums is fixed.
    const int groups_wanted = N < RMSNORM_MAX_GROUPS ? N : RMSNORM_MAX_GROUPS;
    const int rows_per_group = (N + groups_wanted - 1) / groups_wanted;
    const int n_groups = (N + rows_per_group - 1) / rows_per_group;
    const int channel_blocks = (C + RMSNORM_THREADS - 1) / RMSNORM_THREADS;
    rmsnorm_dweight_partials_kernel<<<dim3(channel_blocks, n_groups), RMSNORM_THREADS, 0,
                                      stream>>>(s->partials, dout, inp, rstd, N, C,
                                                rows_per_group);
    cudaCheckLaunch();
    rmsnorm_dweight_finish_kernel<<<channel_blocks, RMSNORM_THREADS, 0, stream>>>(
        dweight, s->partials, n_groups, C);
    cudaCheckLaunch();
}
