// CUDA twins of the CPU model ops (model/ops.h): shared state, embedding,
// rmsnorm, rope, swiglu and the elementwise helpers. Matmul, cross-entropy and
// AdamW live in their own files. bf16 storage, fp32 arithmetic throughout.
#include <cub/device/device_radix_sort.cuh>
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

// cuBLASLt workspace: 32 MiB is NVIDIA's recommendation for Hopper.
static const size_t CUBLASLT_WORKSPACE_BYTES = (size_t)32 << 20;

static OpsCudaState g_state;
static bool g_state_ready;

const OpsCudaState *ops_cuda_state(const char *op) {
    if (!g_state_ready) fatal("%s: ops_cuda_init has not been called", op);
    return &g_state;
}

__global__ void iota_kernel(int32_t *out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = i;
}

// Scratch bytes CUB's radix sort needs for n (token, row) pairs; a pure host query.
static size_t sort_temp_bytes_for(int n) {
    size_t bytes = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const int32_t *)nullptr,
                                              (int32_t *)nullptr, (const int32_t *)nullptr,
                                              (int32_t *)nullptr, n));
    return bytes;
}

void ops_cuda_init(int max_tokens, int max_channels) {
    if (g_state_ready) fatal("ops_cuda_init: already initialised (call ops_cuda_destroy first)");
    if (max_tokens <= 0 || max_channels <= 0)
        fatal("ops_cuda_init: max_tokens %d and max_channels %d must be positive", max_tokens,
              max_channels);
    OpsCudaState *s = &g_state;
    s->max_tokens = max_tokens;
    s->max_channels = max_channels;
    cublasCheck(cublasLtCreate(&s->cublaslt));
    s->cublaslt_workspace_bytes = CUBLASLT_WORKSPACE_BYTES;
    cudaCheck(cudaMalloc(&s->cublaslt_workspace, s->cublaslt_workspace_bytes));

    const size_t token_bytes = (size_t)max_tokens * sizeof(int32_t);
    cudaCheck(cudaMalloc(&s->sort_keys_out, token_bytes));
    cudaCheck(cudaMalloc(&s->sort_values_in, token_bytes));
    cudaCheck(cudaMalloc(&s->sort_values_out, token_bytes));
    s->sort_temp_bytes = sort_temp_bytes_for(max_tokens);
    cudaCheck(cudaMalloc(&s->sort_temp, s->sort_temp_bytes ? s->sort_temp_bytes : 1));
    // Row indices 0..max_tokens-1: the sort's values, a prefix serves any N.
    iota_kernel<<<grid_for(max_tokens, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS>>>(
        s->sort_values_in, max_tokens);
    cudaCheckLaunch();

    const size_t rmsnorm_partials = (size_t)RMSNORM_MAX_GROUPS * (size_t)max_channels;
    const size_t norm_partials = GRAD_NORM_BLOCKS;
    s->partials_len = rmsnorm_partials > norm_partials ? rmsnorm_partials : norm_partials;
    cudaCheck(cudaMalloc(&s->partials, s->partials_len * sizeof(float)));
    cudaCheck(cudaDeviceSynchronize());
    g_state_ready = true;
}

void ops_cuda_destroy(void) {
    if (!g_state_ready) return;
    OpsCudaState *s = &g_state;
    cudaCheck(cudaDeviceSynchronize());
    matmul_plans_clear();
    cublasCheck(cublasLtDestroy(s->cublaslt));
    cudaCheck(cudaFree(s->cublaslt_workspace));
    cudaCheck(cudaFree(s->sort_keys_out));
    cudaCheck(cudaFree(s->sort_values_in));
    cudaCheck(cudaFree(s->sort_values_out));
    cudaCheck(cudaFree(s->sort_temp));
    cudaCheck(cudaFree(s->partials));
    *s = OpsCudaState{};
    g_state_ready = false;
}

// The state, after checking that an N x C call fits the scratch made at init.
static const OpsCudaState *state_for_tokens(const char *op, int N, int C) {
    const OpsCudaState *s = ops_cuda_state(op);
    if (N < 0 || C <= 0) fatal("%s: bad shape N=%d C=%d", op, N, C);
    if (N > s->max_tokens || C > s->max_channels)
        fatal("%s: N=%d C=%d exceed ops_cuda_init's max_tokens=%d max_channels=%d", op, N, C,
              s->max_tokens, s->max_channels);
    return s;
}

// ---------------------------------------------------------------- elementwise

__global__ void float_to_bf16_kernel(bf16 *out, const float *in, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void bf16_to_float_kernel(float *out, const bf16 *in, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

__global__ void residual_add_kernel(bf16 *out, const bf16 *a, const bf16 *b, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

void float_to_bf16_cuda(bf16 *out, const float *in, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    float_to_bf16_kernel<<<grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        out, in, n);
    cudaCheckLaunch();
}

void bf16_to_float_cuda(float *out, const bf16 *in, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    bf16_to_float_kernel<<<grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        out, in, n);
    cudaCheckLaunch();
}

void residual_add_cuda(bf16 *out, const bf16 *a, const bf16 *b, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    residual_add_kernel<<<grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        out, a, b, n);
    cudaCheckLaunch();
}

// ------------------------------------------------------------------ embedding

enum { EMBEDDING_THREADS = 256 };

// One block per token row.
__global__ void embedding_forward_kernel(bf16 *out, const int32_t *tokens, const bf16 *wte,
                                         int C) {
    const int64_t n = blockIdx.x;
    const bf16 *src = wte + (int64_t)tokens[n] * C;
    bf16 *dst = out + n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

// One block per position of the sorted token list; only the first position of
// each run of equal tokens works: it walks that token's rows (ascending, as the
// sort is stable) in chunks of blockDim rows staged in shared memory, and adds
// each chunk's sum to the token's dwte row. Each dwte row has exactly one writer
// and a fixed summation order; the staged row list keeps the dout loads of a long
// run (a frequent token) independent of each other instead of a dependent chain.
__global__ void embedding_backward_kernel(float *dwte, const bf16 *dout,
                                          const int32_t *sorted_tokens,
                                          const int32_t *sorted_rows, int N, int C) {
    __shared__ int32_t chunk_rows[EMBEDDING_THREADS];
    const int first = blockIdx.x;
    const int32_t token = sorted_tokens[first];
    if (first > 0 && sorted_tokens[first - 1] == token) return;
    float *dst = dwte + (int64_t)token * C;
    for (int chunk = first;; chunk += EMBEDDING_THREADS) {
        const int j = chunk + threadIdx.x;
        const bool in_run = j < N && sorted_tokens[j] == token;
        chunk_rows[threadIdx.x] = in_run ? sorted_rows[j] : 0;
        // Sorted keys: the run's entries are a prefix of the chunk.
        const int n_rows = __syncthreads_count(in_run);
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float sum = 0.0f;
#pragma unroll 8
            for (int k = 0; k < n_rows; k++)
                sum += __bfloat162float(dout[(int64_t)chunk_rows[k] * C + c]);
            if (n_rows > 0) dst[c] += sum;
        }
        if (n_rows < EMBEDDING_THREADS) break;
        __syncthreads();  // every thread is done with chunk_rows before it is refilled
    }
}

void embedding_forward_cuda(bf16 *out, const int32_t *tokens, const bf16 *wte, int N, int C,
                            cudaStream_t stream) {
    if (N < 0 || C <= 0) fatal("embedding_forward_cuda: bad shape N=%d C=%d", N, C);
    if (N == 0) return;
    embedding_forward_kernel<<<N, EMBEDDING_THREADS, 0, stream>>>(out, tokens, wte, C);
    cudaCheckLaunch();
}

void embedding_backward_cuda(float *dwte, const bf16 *dout, const int32_t *tokens, int N, int C,
                             cudaStream_t stream) {
    const OpsCudaState *s = state_for_tokens("embedding_backward_cuda", N, C);
    if (N == 0) return;
    size_t temp_bytes = sort_temp_bytes_for(N);
    if (temp_bytes > s->sort_temp_bytes)
        fatal("embedding_backward_cuda: sort needs %zu scratch bytes, init made %zu", temp_bytes,
              s->sort_temp_bytes);
    cudaCheck(cub::DeviceRadixSort::SortPairs(s->sort_temp, temp_bytes, tokens, s->sort_keys_out,
                                              s->sort_values_in, s->sort_values_out, N, 0,
                                              (int)(8 * sizeof(int32_t)), stream));
    // EMBEDDING_THREADS per block: the kernel stages that many rows per chunk.
    embedding_backward_kernel<<<N, EMBEDDING_THREADS, 0, stream>>>(
        dwte, dout, s->sort_keys_out, s->sort_values_out, N, C);
    cudaCheckLaunch();
}

// -------------------------------------------------------------------- rmsnorm

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
    if (N < 0 || C <= 0) fatal("%s: bad shape N=%d C=%d", op, N, C);
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
    if (!sum || !b) fatal("add_rmsnorm_forward_cuda: sum and b must not be NULL");
    add_rmsnorm_launch("add_rmsnorm_forward_cuda", sum, out, rstd, a, b, weight, N, C, eps,
                       stream);
}

void rmsnorm_backward_cuda(bf16 *dinp, float *dweight, const bf16 *dout, const bf16 *inp,
                           const bf16 *weight, const float *rstd, int N, int C,
                           cudaStream_t stream) {
    const OpsCudaState *s = state_for_tokens("rmsnorm_backward_cuda", N, C);
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

// ----------------------------------------------------------------------- rope

// Up to three groups of heads of one token row, each read from src + n * src_ld and
// written to dst + n * dst_ld (dst may equal src: in place). Rotated groups get RoPE,
// the others are copied (v beside q and k in a stacked q|k|v row).
enum { ROPE_MAX_GROUPS = 3 };
typedef struct {
    const bf16 *src[ROPE_MAX_GROUPS];
    bf16 *dst[ROPE_MAX_GROUPS];
    int64_t src_ld[ROPE_MAX_GROUPS], dst_ld[ROPE_MAX_GROUPS];
    int heads[ROPE_MAX_GROUPS];
    bool rotate[ROPE_MAX_GROUPS];
} RopeGroups;

// cos and sin of angle pos * theta^(-2i / head_dim), in double like the CPU op, then
// rounded to float (what the rotation multiplies by).
__device__ inline float2 rope_cos_sin(int32_t pos, int i, int head_dim, double theta) {
    const double angle = pos * pow(theta, -2.0 * i / head_dim);
    double sin_d, cos_d;
    sincos(angle, &sin_d, &cos_d);
    return make_float2((float)cos_d, (float)sin_d);
}

__global__ void rope_angles_kernel(float2 *cos_sin, const int32_t *pos, int N, int head_dim,
                                   double theta) {
    const int half = head_dim / 2;
    const int64_t total = (int64_t)N * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x)
        cos_sin[idx] = rope_cos_sin(pos[idx / half], (int)(idx % half), head_dim, theta);
}

// One thread per (token, head of any group, pack of VEC frequencies i): it takes those
// angles (from the table cos_sin [N, half] when given, else computed) and rotates pairs
// (i, i + half) of its head, or copies them. direction = +1 forward, -1 inverse (the
// backward). A thread per head (not per token) keeps enough loads in flight.
template <int VEC>
__global__ void rope_kernel(RopeGroups g, const float2 *cos_sin, const int32_t *pos, int N,
                            int head_dim, double theta, float direction) {
    const int half = head_dim / 2, packs = half / VEC;
    const int heads = g.heads[0] + g.heads[1] + g.heads[2];
    const int64_t total = (int64_t)N * heads * packs;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = idx / ((int64_t)heads * packs);
        int h = (int)(idx / packs % heads);
        const int i0 = (int)(idx % packs) * VEC;
        int group = 0;
        while (h >= g.heads[group]) h -= g.heads[group++];
        const bf16 *src = g.src[group] + n * g.src_ld[group] + h * head_dim + i0;
        bf16 *dst = g.dst[group] + n * g.dst_ld[group] + h * head_dim + i0;
        Pack<bf16, VEC> x1 = load_bf16s<VEC>(src), x2 = load_bf16s<VEC>(src + half);
        if (g.rotate[group]) {
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                const float2 cs = cos_sin ? cos_sin[n * half + i0 + j]
                                          : rope_cos_sin(pos[n], i0 + j, head_dim, theta);
                const float cos_f = cs.x, sin_f = direction * cs.y;
                const float a = __bfloat162float(x1.x[j]), b = __bfloat162float(x2.x[j]);
                x1.x[j] = __float2bfloat16_rn(a * cos_f - b * sin_f);
                x2.x[j] = __float2bfloat16_rn(b * cos_f + a * sin_f);
            }
        }
        store_bf16s<VEC>(dst, x1);
        store_bf16s<VEC>(dst + half, x2);
    }
}

// Unused groups have zero heads (their pointers are never dereferenced).
static void rope_launch(const char *op, RopeGroups g, const float2 *cos_sin, const int32_t *pos,
                        int N, int head_dim, float theta, float direction, cudaStream_t stream) {
    if (N < 0 || head_dim <= 0 || head_dim % 2 != 0)
        fatal("%s: bad shape N=%d head_dim=%d (head_dim must be even)", op, N, head_dim);
    for (int i = 0; i < ROPE_MAX_GROUPS; i++)
        if (g.heads[i] < 0) fatal("%s: negative head count %d", op, g.heads[i]);
    if (N == 0) return;
    bool packed = (head_dim / 2) % 8 == 0;
    for (int i = 0; i < ROPE_MAX_GROUPS; i++)
        if (g.heads[i] > 0)
            packed = packed && pack_aligned(g.src[i], 16) && pack_aligned(g.dst[i], 16) &&
                     g.src_ld[i] % 8 == 0 && g.dst_ld[i] % 8 == 0;
    const int vec = packed ? 8 : 1;
    const int64_t total = (int64_t)N * (g.heads[0] + g.heads[1] + g.heads[2]) * (head_dim / 2 / vec);
    const unsigned blocks = grid_for(total, ELEMENTWISE_THREADS);
    if (packed)
        rope_kernel<8><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(g, cos_sin, pos, N, head_dim,
                                                                   (double)theta, direction);
    else
        rope_kernel<1><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(g, cos_sin, pos, N, head_dim,
                                                                   (double)theta, direction);
    cudaCheckLaunch();
}

// One group x [N, n_heads, head_dim], in place.
static RopeGroups rope_in_place(bf16 *x, int n_heads, int head_dim) {
    const int64_t ld = (int64_t)n_heads * head_dim;
    return RopeGroups{{x, x, x}, {x, x, x}, {ld, ld, ld}, {ld, ld, ld}, {n_heads, 0, 0},
                      {true, false, false}};
}

void rope_forward_cuda(bf16 *x, const int32_t *pos, int N, int n_heads, int head_dim,
                       float theta, cudaStream_t stream) {
    rope_launch("rope_forward_cuda", rope_in_place(x, n_heads, head_dim), nullptr, pos, N, head_dim,
                theta, 1.0f, stream);
}

void rope_backward_cuda(bf16 *dx, const int32_t *pos, int N, int n_heads, int head_dim,
                        float theta, cudaStream_t stream) {
    rope_launch("rope_backward_cuda", rope_in_place(dx, n_heads, head_dim), nullptr, pos, N,
                head_dim, theta, -1.0f, stream);
}

// The stacked row [q (H heads) | k (KV heads) | v (KV heads)] against the three
// separate tensors [N, H, D], [N, KV, D], [N, KV, D].
static RopeGroups rope_qkv_groups(const bf16 *src_q, const bf16 *src_k, const bf16 *src_v,
                                  bool src_stacked, bf16 *dst_q, bf16 *dst_k, bf16 *dst_v,
                                  int n_heads, int n_kv_heads, int head_dim) {
    const int64_t stacked = (int64_t)(n_heads + 2 * n_kv_heads) * head_dim;
    const int64_t q_ld = (int64_t)n_heads * head_dim, kv_ld = (int64_t)n_kv_heads * head_dim;
    const int64_t src_q_ld = src_stacked ? stacked : q_ld, src_kv_ld = src_stacked ? stacked : kv_ld;
    const int64_t dst_q_ld = src_stacked ? q_ld : stacked, dst_kv_ld = src_stacked ? kv_ld : stacked;
    return RopeGroups{{src_q, src_k, src_v},
                      {dst_q, dst_k, dst_v},
                      {src_q_ld, src_kv_ld, src_kv_ld},
                      {dst_q_ld, dst_kv_ld, dst_kv_ld},
                      {n_heads, n_kv_heads, n_kv_heads},
                      {true, true, false}};
}

void rope_angles_cuda(float2 *cos_sin, const int32_t *pos, int N, int head_dim, float theta,
                      cudaStream_t stream) {
    if (N < 0 || head_dim <= 0 || head_dim % 2 != 0)
        fatal("rope_angles_cuda: bad shape N=%d head_dim=%d (head_dim must be even)", N, head_dim);
    if (N == 0) return;
    const int64_t total = (int64_t)N * (head_dim / 2);
    rope_angles_kernel<<<grid_for(total, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        cos_sin, pos, N, head_dim, (double)theta);
    cudaCheckLaunch();
}

void rope_split_qkv_cuda(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float2 *cos_sin, int N,
                         int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    const int64_t q_dim = (int64_t)n_heads * head_dim, kv_dim = (int64_t)n_kv_heads * head_dim;
    rope_launch("rope_split_qkv_cuda",
                rope_qkv_groups(qkv, qkv + q_dim, qkv + q_dim + kv_dim, true, q, k, v, n_heads,
                                n_kv_heads, head_dim),
                cos_sin, nullptr, N, head_dim, 0.0f, 1.0f, stream);
}

void rope_merge_qkv_backward_cuda(bf16 *dqkv, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                                  const float2 *cos_sin, int N, int n_heads, int n_kv_heads,
                                  int head_dim, cudaStream_t stream) {
    const int64_t q_dim = (int64_t)n_heads * head_dim, kv_dim = (int64_t)n_kv_heads * head_dim;
    rope_launch("rope_merge_qkv_backward_cuda",
                rope_qkv_groups(dq, dk, dv, false, dqkv, dqkv + q_dim, dqkv + q_dim + kv_dim,
                                n_heads, n_kv_heads, head_dim),
                cos_sin, nullptr, N, head_dim, 0.0f, -1.0f, stream);
}

// --------------------------------------------------------------------- swiglu

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// rows x width elements; gate and up rows are ld apart (ld = width for separate
// tensors, 2 * width for a stacked gate|up row with up = gate + width); out and the
// gradients of the backward use the same ld as their inputs, out is tight.
// One thread per pack of VEC elements of one row.
template <int VEC>
__global__ void swiglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up, int64_t rows,
                                      int64_t width, int64_t ld) {
    const int64_t packs = width / VEC, total = rows * packs;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = idx / packs, col = (idx % packs) * VEC;
        const Pack<bf16, VEC> g = load_bf16s<VEC>(gate + row * ld + col),
                              u = load_bf16s<VEC>(up + row * ld + col);
        Pack<bf16, VEC> y;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float gf = __bfloat162float(g.x[j]);
            y.x[j] = __float2bfloat16_rn(gf * sigmoid(gf) * __bfloat162float(u.x[j]));
        }
        store_bf16s<VEC>(out + row * width + col, y);
    }
}

// d silu(g)/dg = s * (1 + g * (1 - s)), s = sigmoid(g). Reads all inputs of a pack
// before writing it, which makes the documented aliasing safe. dout is tight.
template <int VEC>
__global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout,
                                       const bf16 *gate, const bf16 *up, int64_t rows,
                                       int64_t width, int64_t ld) {
    const int64_t packs = width / VEC, total = rows * packs;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = idx / packs, col = (idx % packs) * VEC, at = row * ld + col;
        const Pack<bf16, VEC> g = load_bf16s<VEC>(gate + at), u = load_bf16s<VEC>(up + at),
                              d = load_bf16s<VEC>(dout + row * width + col);
        Pack<bf16, VEC> dg, du;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float gf = __bfloat162float(g.x[j]), uf = __bfloat162float(u.x[j]);
            const float df = __bfloat162float(d.x[j]), s = sigmoid(gf);
            dg.x[j] = __float2bfloat16_rn(df * uf * s * (1.0f + gf * (1.0f - s)));
            du.x[j] = __float2bfloat16_rn(df * gf * s);
        }
        store_bf16s<VEC>(dgate + at, dg);
        store_bf16s<VEC>(dup + at, du);
    }
}

// Packs of 8 when widths, strides and addresses allow it.
static bool swiglu_packed(int64_t width, int64_t ld, const void *const *pointers, int n) {
    if (width % 8 != 0 || ld % 8 != 0) return false;
    for (int i = 0; i < n; i++)
        if (!pack_aligned(pointers[i], 16)) return false;
    return true;
}

static void swiglu_forward_launch(bf16 *out, const bf16 *gate, const bf16 *up, int64_t rows,
                                  int64_t width, int64_t ld, cudaStream_t stream) {
    if (rows <= 0 || width <= 0) return;
    const void *pointers[] = {out, gate, up};
    if (swiglu_packed(width, ld, pointers, 3))
        swiglu_forward_kernel<8><<<grid_for(rows * width / 8, ELEMENTWISE_THREADS),
                                   ELEMENTWISE_THREADS, 0, stream>>>(out, gate, up, rows, width,
                                                                     ld);
    else
        swiglu_forward_kernel<1><<<grid_for(rows * width, ELEMENTWISE_THREADS),
                                   ELEMENTWISE_THREADS, 0, stream>>>(out, gate, up, rows, width,
                                                                     ld);
    cudaCheckLaunch();
}

static void swiglu_backward_launch(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                                   const bf16 *up, int64_t rows, int64_t width, int64_t ld,
                                   cudaStream_t stream) {
    if (rows <= 0 || width <= 0) return;
    const void *pointers[] = {dgate, dup, dout, gate, up};
    if (swiglu_packed(width, ld, pointers, 5))
        swiglu_backward_kernel<8><<<grid_for(rows * width / 8, ELEMENTWISE_THREADS),
                                    ELEMENTWISE_THREADS, 0, stream>>>(dgate, dup, dout, gate, up,
                                                                      rows, width, ld);
    else
        swiglu_backward_kernel<1><<<grid_for(rows * width, ELEMENTWISE_THREADS),
                                    ELEMENTWISE_THREADS, 0, stream>>>(dgate, dup, dout, gate, up,
                                                                      rows, width, ld);
    cudaCheckLaunch();
}

void swiglu_forward_cuda(bf16 *out, const bf16 *gate, const bf16 *up, int64_t n,
                         cudaStream_t stream) {
    swiglu_forward_launch(out, gate, up, 1, n, n, stream);
}

void swiglu_backward_cuda(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                          const bf16 *up, int64_t n, cudaStream_t stream) {
    swiglu_backward_launch(dgate, dup, dout, gate, up, 1, n, n, stream);
}

void swiglu_stacked_forward_cuda(bf16 *out, const bf16 *gate_up, int N, int F,
                                 cudaStream_t stream) {
    if (N < 0 || F <= 0) fatal("swiglu_stacked_forward_cuda: bad shape N=%d F=%d", N, F);
    swiglu_forward_launch(out, gate_up, gate_up + F, N, F, 2 * (int64_t)F, stream);
}

void swiglu_stacked_backward_cuda(bf16 *d_gate_up, const bf16 *dout, const bf16 *gate_up, int N,
                                  int F, cudaStream_t stream) {
    if (N < 0 || F <= 0) fatal("swiglu_stacked_backward_cuda: bad shape N=%d F=%d", N, F);
    swiglu_backward_launch(d_gate_up, d_gate_up + F, dout, gate_up, gate_up + F, N, F,
                           2 * (int64_t)F, stream);
}
