#include "trainer/device_memory.h"

#include <limits.h>

#include "attention/mask.h"
#include "common/check.h"

// Mirrors model/model_cuda.cu: buffers start on 256-byte boundaries (arena_cuda.cuh),
// the loss head's logits exist for at most 2^26 elements at once, the cuBLASLt
// workspace is 32 MiB (ops_cuda_state.cu).
enum { ALIGN = 256, LOGIT_CHUNK_ELEMENTS = 1 << 26 };
#define CUBLASLT_WORKSPACE ((size_t)32 << 20)
// The CUDA runtime's lazily loaded kernels and cuBLAS handles.
#define RUNTIME_MARGIN ((size_t)256 << 20)

// Bytes of n buffers of `bytes` each, aligned as the arena aligns them.
static size_t aligned(size_t bytes, size_t n) { return n * ((bytes + ALIGN - 1) / ALIGN * ALIGN); }

static size_t loss_chunk_rows(const ModelConfig *mc, size_t tokens) {
    size_t chunk = LOGIT_CHUNK_ELEMENTS / (size_t)mc->vocab_size;
    if (chunk > 64) chunk -= chunk % 64;
    if (chunk < 1) chunk = 1;
    return chunk < tokens ? chunk : tokens;
}

// The attention backward's workspace (attention/attention_bwd.cu), the larger of its
// two modes: dsum and lse2 per padded query and head, fp32 dQ accumulators in the fast
// mode, the per-group dK/dV partials under GQA.
static size_t attention_workspace(const ModelDims *d, size_t rows, size_t seq_len, size_t heads,
                                  size_t kv_heads) {
    const size_t s_pad = (seq_len + ATTN_TILE - 1) / ATTN_TILE * ATTN_TILE;
    const size_t n_pad = rows * heads * s_pad, group = heads / kv_heads;
    const size_t n_kv = rows * seq_len * kv_heads * (size_t)d->head_dim;
    return aligned(4 * n_pad, 2) + aligned(4 * n_pad * (size_t)d->head_dim, 1) +
           (group > 1 ? aligned(4 * 2 * group * n_kv, 1) : 0);
}

CudaMemoryEstimate cuda_memory_estimate(const ModelConfig *mc, int micro_rows, int seq_len) {
    const ModelDims d = model_dims(mc);
    ParamTable table;  // the exact count (biases, q/k norms, tying), metadata only
    param_table_build(mc, &table);
    const size_t n = table.total;
    param_table_free(&table);
    const size_t T = (size_t)micro_rows * (size_t)seq_len, C = mc->hidden_size,
                 F = mc->intermediate_size, V = mc->vocab_size, H = mc->num_attention_heads,
                 L = mc->num_hidden_layers, QD = d.q_dim, KVD = d.kv_dim;
    const size_t chunk = loss_chunk_rows(mc, T);
    CudaMemoryEstimate e = {.tokens = (long long)T};
    e.state = 2 * n + 4 * n + 4 * (3 * n + 2);
    // The batch: token, pos, lo, hi, target slots and targets, and the mask's tile lists.
    e.arena = aligned(4 * T, 6) +
              aligned(4 * attn_mask_storage_count(micro_rows, seq_len, ATTN_TILE, ATTN_TILE), 1);
    e.arena += aligned(4 * T * (size_t)d.head_dim, 1) + aligned(4 * T, 1);  // RoPE angles, losses
    e.arena += aligned(2 * T * C, L + 1);                                   // residual stream
    e.arena += L * (aligned(4 * T, 2) + aligned(2 * T * QD, 2) + aligned(2 * T * KVD, 2) +
                    aligned(4 * T * H, 1) + aligned(2 * T * C, 1));  // saved per layer
    // Shared by the layers: norm output, gate|up, q|k|v, act, projection, final norm.
    e.arena += aligned(2 * T * C, 3) + aligned(2 * T * 2 * F, 1) +
               aligned(2 * T * (QD + 2 * KVD), 1) + aligned(2 * T * F, 1) + aligned(4 * T, 1);
    if (mc->qk_norm)  // q_norm / k_norm outputs and their rstd
        e.arena += aligned(2 * T * QD, 1) + aligned(2 * T * KVD, 1) + aligned(4 * T * H, 1) +
                   aligned(4 * T * (size_t)mc->num_key_value_heads, 1);
    e.arena += aligned(2 * chunk * C, 2) + aligned(2 * chunk * V, 1);  // the loss head's chunk
    e.arena += aligned(2 * T * C, 2) + aligned(2 * T * QD, 2) + aligned(2 * T * KVD, 2) +
               aligned(2 * T * F, 1);  // backward
    e.arena += attention_workspace(&d, (size_t)micro_rows, (size_t)seq_len, H,
                                   (size_t)mc->num_key_value_heads);
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
