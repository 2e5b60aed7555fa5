#include "trainer/device_memory.h"

#include <limits.h>

#include "common/check.h"
#include "model/model_arena.h"

// Mirrors the ops' process-wide scratch (model/ops_cuda_state.cu): a 32 MiB cuBLASLt
// workspace.
#define CUBLASLT_WORKSPACE ((size_t)32 << 20)
// The CUDA runtime's lazily loaded kernels and cuBLAS handles.
#define RUNTIME_MARGIN ((size_t)256 << 20)

CudaMemoryEstimate cuda_memory_estimate(const ModelConfig *mc, int micro_rows, int seq_len,
                                        ModelRecompute recompute, size_t attn_workspace_bytes) {
    ParamTable table;  // the exact count (biases, q/k norms, tying), metadata only
    param_table_build(mc, &table);
    const size_t n = table.total;
    param_table_free(&table);
    const size_t T = (size_t)micro_rows * (size_t)seq_len, C = mc->hidden_size;
    CudaMemoryEstimate e = {.tokens = (long long)T};
    // bf16 weights (the master's high halves), its low halves, fp32 gradients, m | v | two
    // norms (trainer/backend_cuda.cu).
    e.state = 2 * n + 2 * n + 4 * n + 4 * (2 * n + 2);
    e.arena = cuda_arena_layout(mc, micro_rows, seq_len, recompute,
                                attn_workspace_bytes).bytes;
    // cuBLASLt workspace; the embedding sort's keys, values and temp (about as much
    // again); rmsnorm partials of 256 groups x C.
    e.scratch = CUBLASLT_WORKSPACE + 4 * T * 5 + 4 * 256 * C + RUNTIME_MARGIN;
    e.total = e.state + e.arena + e.scratch;
    return e;
}

int cuda_memory_check(const CudaMemoryEstimate *e, size_t free_bytes, size_t total_bytes,
                      int micro_rows, int seq_len, char *err, size_t err_len) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (e->tokens > INT_MAX)
        return fail(err, err_len, "config keys train.micro_rows x data.seq_len: %d x %d = %lld "
                    "tokens per micro-batch, more than the CUDA kernels index (%d); lower "
                    "train.micro_rows", micro_rows, seq_len, e->tokens, INT_MAX);
    if (e->total <= free_bytes) return 0;
    const bool arena_decides = e->arena >= e->state;
    return fail(err, err_len, "config keys train.micro_rows x data.seq_len and model.*: the CUDA "
                "backend needs about %.2f GiB of device memory, %.2f GiB are free (of %.2f): "
                "%.2f GiB of activations for %d x %d tokens per micro-batch (train.micro_rows x "
                "data.seq_len), %.2f GiB of weights, gradients and AdamW state (model.hidden_size, "
                "model.intermediate_size, model.num_hidden_layers, model.vocab_size), %.2f GiB "
                "of scratch; lower %s",
                e->total / gib, free_bytes / gib, total_bytes / gib, e->arena / gib, micro_rows,
                seq_len, e->state / gib, e->scratch / gib,
                arena_decides ? "train.micro_rows (or data.seq_len)" : "the model's size");
}
