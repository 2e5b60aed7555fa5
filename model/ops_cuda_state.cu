// The process-wide state of the CUDA ops (ops_cuda_init / ops_cuda_destroy): the
// cuBLASLt handle and workspace and the scratch of the embedding and rmsnorm
// backwards and of the gradient norm.
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

// cuBLASLt workspace: 32 MiB is NVIDIA's recommendation for Hopper.
static const size_t CUBLASLT_WORKSPACE_BYTES = (size_t)32 << 20;

static OpsCudaState g_state;
static bool g_state_ready;

const OpsCudaState *ops_cuda_state(const char *op) {
    CHECK(g_state_ready, "%s: ops_cuda_init has not been called", op);
    return &g_state;
}

__global__ void iota_kernel(int32_t *out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = i;
}

bool ops_cuda_ready(void) { return g_state_ready; }

void ops_cuda_init(int max_tokens, int max_channels) {
    CHECK(!g_state_ready, "ops_cuda_init: already initialised (call ops_cuda_destroy first)");
    CHECK(max_tokens > 0 && max_channels > 0,
          "ops_cuda_init: max_tokens %d and max_channels %d must be positive", max_tokens,
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
    s->sort_temp_bytes = embedding_sort_temp_bytes(max_tokens);
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

const OpsCudaState *ops_cuda_state_for_tokens(const char *op, int N, int C) {
    const OpsCudaState *s = ops_cuda_state(op);
    CHECK(N >= 0 && C > 0, "%s: bad shape N=%d C=%d", op, N, C);
    CHECK(N <= s->max_tokens && C <= s->max_channels,
          "%s: N=%d C=%d exceed ops_cuda_init's max_tokens=%d max_channels=%d", op, N, C,
          s->max_tokens, s->max_channels);
    return s;
}
