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

// One warp per row; the warp exits as a whole, so no block-wide barrier is needed.
__global__ void rmsnorm_forward_kernel(bf16 *out, float *rstd, const bf16 *inp,
                                       const bf16 *weight, int N, int C, float eps) {
    const int64_t row = (int64_t)blockIdx.x * RMSNORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const bf16 *x = inp + row * C;
    bf16 *y = out + row * C;
    float sum_sq = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float v = __bfloat162float(x[c]);
        sum_sq += v * v;
    }
    sum_sq = warp_reduce_sum(sum_sq);
    const float r = rsqrtf(sum_sq / C + eps);
    for (int c = lane; c < C; c += 32)
        y[c] = __float2bfloat16_rn(__bfloat162float(x[c]) * r * __bfloat162float(weight[c]));
    if (lane == 0) rstd[row] = r;
}

// dx_j += r * (w_j dy_j - x_j * r^2 * mean_i(w_i dy_i x_i)); one warp per row.
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
    for (int c = lane; c < C; c += 32)
        dot += __bfloat162float(weight[c]) * __bfloat162float(dy[c]) * __bfloat162float(x[c]);
    dot = warp_reduce_sum(dot);
    const float correction = dot / C * r * r;
    for (int c = lane; c < C; c += 32) {
        const float grad = r * (__bfloat162float(weight[c]) * __bfloat162float(dy[c]) -
                                __bfloat162float(x[c]) * correction);
        dx[c] = __float2bfloat16_rn(__bfloat162float(dx[c]) + grad);
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

void rmsnorm_forward_cuda(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int N,
                          int C, float eps, cudaStream_t stream) {
    if (N < 0 || C <= 0) fatal("rmsnorm_forward_cuda: bad shape N=%d C=%d", N, C);
    if (N == 0) return;
    const int blocks = (N + RMSNORM_ROWS_PER_BLOCK - 1) / RMSNORM_ROWS_PER_BLOCK;
    rmsnorm_forward_kernel<<<blocks, RMSNORM_THREADS, 0, stream>>>(out, rstd, inp, weight, N, C,
                                                                   eps);
    cudaCheckLaunch();
}

void rmsnorm_backward_cuda(bf16 *dinp, float *dweight, const bf16 *dout, const bf16 *inp,
                           const bf16 *weight, const float *rstd, int N, int C,
                           cudaStream_t stream) {
    const OpsCudaState *s = state_for_tokens("rmsnorm_backward_cuda", N, C);
    if (N == 0) return;
    const int row_blocks = (N + RMSNORM_ROWS_PER_BLOCK - 1) / RMSNORM_ROWS_PER_BLOCK;
    rmsnorm_backward_dinp_kernel<<<row_blocks, RMSNORM_THREADS, 0, stream>>>(dinp, dout, inp,
                                                                            weight, rstd, N, C);
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

// One thread per (token, frequency i); it rotates pair (i, i + half) of every
// head of that token. direction = +1 forward, -1 inverse (the backward).
__global__ void rope_kernel(bf16 *x, const int32_t *pos, int N, int n_heads, int head_dim,
                            double theta, float direction) {
    const int half = head_dim / 2;
    const int64_t total = (int64_t)N * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = idx / half;
        const int i = (int)(idx % half);
        const double angle = pos[n] * pow(theta, -2.0 * i / head_dim);
        double sin_d, cos_d;
        sincos(angle, &sin_d, &cos_d);
        const float cos_f = (float)cos_d, sin_f = direction * (float)sin_d;
        for (int h = 0; h < n_heads; h++) {
            bf16 *x1 = x + (n * n_heads + h) * head_dim + i, *x2 = x1 + half;
            const float a = __bfloat162float(*x1), b = __bfloat162float(*x2);
            *x1 = __float2bfloat16_rn(a * cos_f - b * sin_f);
            *x2 = __float2bfloat16_rn(b * cos_f + a * sin_f);
        }
    }
}

static void rope_launch(const char *op, bf16 *x, const int32_t *pos, int N, int n_heads,
                        int head_dim, float theta, float direction, cudaStream_t stream) {
    if (N < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0)
        fatal("%s: bad shape N=%d n_heads=%d head_dim=%d (head_dim must be even)", op, N, n_heads,
              head_dim);
    if (N == 0) return;
    const int64_t total = (int64_t)N * (head_dim / 2);
    rope_kernel<<<grid_for(total, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        x, pos, N, n_heads, head_dim, (double)theta, direction);
    cudaCheckLaunch();
}

void rope_forward_cuda(bf16 *x, const int32_t *pos, int N, int n_heads, int head_dim,
                       float theta, cudaStream_t stream) {
    rope_launch("rope_forward_cuda", x, pos, N, n_heads, head_dim, theta, 1.0f, stream);
}

void rope_backward_cuda(bf16 *dx, const int32_t *pos, int N, int n_heads, int head_dim,
                        float theta, cudaStream_t stream) {
    rope_launch("rope_backward_cuda", dx, pos, N, n_heads, head_dim, theta, -1.0f, stream);
}

// --------------------------------------------------------------------- swiglu

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void swiglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = __bfloat162float(gate[i]);
        out[i] = __float2bfloat16_rn(g * sigmoid(g) * __bfloat162float(up[i]));
    }
}

// d silu(g)/dg = s * (1 + g * (1 - s)), s = sigmoid(g). Reads all inputs of
// element i before writing it, which makes the documented aliasing safe.
__global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout,
                                       const bf16 *gate, const bf16 *up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
        const float d = __bfloat162float(dout[i]), s = sigmoid(g);
        dgate[i] = __float2bfloat16_rn(d * u * s * (1.0f + g * (1.0f - s)));
        dup[i] = __float2bfloat16_rn(d * g * s);
    }
}

void swiglu_forward_cuda(bf16 *out, const bf16 *gate, const bf16 *up, int64_t n,
                         cudaStream_t stream) {
    if (n <= 0) return;
    swiglu_forward_kernel<<<grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        out, gate, up, n);
    cudaCheckLaunch();
}

void swiglu_backward_cuda(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                          const bf16 *up, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    swiglu_backward_kernel<<<grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        dgate, dup, dout, gate, up, n);
    cudaCheckLaunch();
}
