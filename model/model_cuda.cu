// CUDA bf16 twin of model_cpu.c (same structure, same order of operations): forward
// saves what the backward needs, the loss head runs over chunks of target rows only,
// backward walks the layers in reverse ADDING fp32 parameter gradients.
// T = n_rows * seq_len tokens, C hidden, F intermediate, V vocab, H query heads,
// KV key/value heads, D head dim (C / H). Activations bf16, rstd/lse/losses fp32.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "attention/attention_cuda.h"
#include "common/cuda_check.h"
#include "model/model_cuda.h"
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

// The logits of at most this many elements exist at once (128 MiB of bf16).
enum { LOGIT_CHUNK_ELEMENTS = 1 << 26 };
// Every buffer of the arena starts on this boundary (what cuBLASLt prefers).
enum { ARENA_ALIGNMENT = 256 };

// Per-layer tensors, by the HF name suffix after "model.layers.{i}." (as model_cpu.c).
enum {
    W_INPUT_NORM, W_Q, W_K, W_V, W_O, W_POST_NORM, W_GATE, W_UP, W_DOWN, LAYER_TENSORS
};
static const char *const LAYER_TENSOR_NAMES[LAYER_TENSORS] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
};

// Activations of one layer saved by the forward for the backward.
typedef struct {
    bf16 *ln1;        // [T, C] input_layernorm output
    float *ln1_rstd;  // [T]
    bf16 *q;          // [T, H, D] after RoPE
    bf16 *k;          // [T, KV, D] after RoPE
    bf16 *v;          // [T, KV, D]
    bf16 *attn;       // [T, H, D] attention output (o_proj input)
    float *lse;       // [n_rows, H, seq_len] attention log-sum-exp
    bf16 *mid;        // [T, C] residual after attention
    bf16 *ln2;        // [T, C] post_attention_layernorm output
    float *ln2_rstd;  // [T]
    bf16 *gate;       // [T, F] gate_proj output; the backward overwrites it with d gate
    bf16 *up;         // [T, F] up_proj output; the backward overwrites it with d up
} LayerActivations;

struct CudaModel {
    ModelConfig cfg;
    ParamTable table;
    int max_rows, seq_len, head_dim, q_dim, kv_dim, chunk_rows;
    bool deterministic;
    size_t embed_offset, final_norm_offset, lm_head_offset;  // lm_head = embed when tied
    size_t *layer_offsets;  // [L, LAYER_TENSORS]
    cudaStream_t stream;
    void *arena;            // the one device allocation holding every buffer below
    size_t arena_bytes;

    // the batch, uploaded
    int32_t *token, *pos, *lo, *hi;  // [T]
    int32_t *target_slots;  // [T] slots (row * seq_len + position) with a target, ascending
    int32_t *slot_targets;  // [T] the target of each of those slots
    float *target_losses;   // [T] cross-entropy of each of those slots
    TileMask mask;          // device arrays for max_rows; sizes set per batch
    // forward
    bf16 **residual;           // [L + 1] each [T, C]: residual[l] enters layer l
    LayerActivations *layers;  // [L]
    bf16 *act;                 // [T, F] silu(gate) * up, the down_proj input (recomputed
                               // by the backward, so one buffer serves every layer)
    bf16 *proj_out;            // [T, C] o_proj / down_proj output before the residual add
    bf16 *final_norm;          // [T, C] model.norm output
    float *final_rstd;         // [T]
    // loss head, one chunk of target rows at a time
    bf16 *chunk_input;   // [chunk_rows, C] final_norm rows of the chunk
    bf16 *chunk_logits;  // [chunk_rows, V] logits, then dlogits in place
    bf16 *chunk_dinput;  // [chunk_rows, C]
    // backward
    bf16 *d_residual;  // [T, C] gradient of the residual stream at the current depth
    bf16 *d_normed;    // [T, C] gradient of a norm output (final, ln1, ln2)
    bf16 *d_attn;      // [T, H, D]
    bf16 *d_q;         // [T, H, D]
    bf16 *d_k, *d_v;   // [T, KV, D]
    bf16 *d_act;       // [T, F]

    // host side
    int32_t *host_slots, *host_targets;  // [T] staging of target_slots / slot_targets
    float *host_losses;                  // [T] pinned: target_losses read back
    TileMask rebuilt;     // the batch's mask rebuilt with the kernels' block sizes
    bool have_rebuilt;
};

static size_t offset_of(const ParamTable *t, const char *name) {
    const ParamTensor *p = param_table_find(t, name);
    if (!p) fatal("%s:%d: parameter %s missing from the table", __FILE__, __LINE__, name);
    return p->offset;
}

// Bump allocation inside the arena. With base == NULL it only counts bytes, so the
// same carve function sizes the arena and then hands out its pointers.
typedef struct {
    char *base;
    size_t used;
} Arena;

template <typename T>
static T *take(Arena *a, size_t count) {
    const size_t start = (a->used + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
    a->used = start + count * sizeof(T);
    return a->base ? reinterpret_cast<T *>(a->base + start) : nullptr;
}

// The eight arrays of a TileMask and their lengths for its n_rows.
typedef struct {
    int32_t **ptr[8];
    size_t count[8];
} MaskArrays;

static MaskArrays mask_arrays(TileMask *mk) {
    const size_t rows = (size_t)mk->n_rows, nq = (size_t)mk->n_q_tiles,
                 nk = (size_t)mk->n_k_tiles;
    return MaskArrays{{&mk->q_partial_count, &mk->q_full_count, &mk->q_partial_idx,
                       &mk->q_full_idx, &mk->k_partial_count, &mk->k_full_count,
                       &mk->k_partial_idx, &mk->k_full_idx},
                      {rows * nq, rows * nq, rows * nq * nk, rows * nq * nk, rows * nk,
                       rows * nk, rows * nk * nq, rows * nk * nq}};
}

// Points every device buffer into the arena (or only counts bytes when a->base is NULL).
static void carve(CudaModel *m, Arena *a) {
    const ModelConfig *cfg = &m->cfg;
    const size_t T = (size_t)m->max_rows * m->seq_len, C = cfg->hidden_size,
                 F = cfg->intermediate_size, V = cfg->vocab_size, H = cfg->num_attention_heads;
    const size_t QD = m->q_dim, KVD = m->kv_dim, chunk = m->chunk_rows;
    const int L = cfg->num_hidden_layers;

    m->token = take<int32_t>(a, T);
    m->pos = take<int32_t>(a, T);
    m->lo = take<int32_t>(a, T);
    m->hi = take<int32_t>(a, T);
    m->target_slots = take<int32_t>(a, T);
    m->slot_targets = take<int32_t>(a, T);
    m->target_losses = take<float>(a, T);
    MaskArrays mask = mask_arrays(&m->mask);  // m->mask sized for max_rows
    for (int i = 0; i < 8; i++) *mask.ptr[i] = take<int32_t>(a, mask.count[i]);

    for (int l = 0; l <= L; l++) m->residual[l] = take<bf16>(a, T * C);
    for (int l = 0; l < L; l++) {
        LayerActivations *la = &m->layers[l];
        la->ln1 = take<bf16>(a, T * C);
        la->ln1_rstd = take<float>(a, T);
        la->q = take<bf16>(a, T * QD);
        la->k = take<bf16>(a, T * KVD);
        la->v = take<bf16>(a, T * KVD);
        la->attn = take<bf16>(a, T * QD);
        la->lse = take<float>(a, T * H);
        la->mid = take<bf16>(a, T * C);
        la->ln2 = take<bf16>(a, T * C);
        la->ln2_rstd = take<float>(a, T);
        la->gate = take<bf16>(a, T * F);
        la->up = take<bf16>(a, T * F);
    }
    m->act = take<bf16>(a, T * F);
    m->proj_out = take<bf16>(a, T * C);
    m->final_norm = take<bf16>(a, T * C);
    m->final_rstd = take<float>(a, T);

    m->chunk_input = take<bf16>(a, chunk * C);
    m->chunk_logits = take<bf16>(a, chunk * V);
    m->chunk_dinput = take<bf16>(a, chunk * C);

    m->d_residual = take<bf16>(a, T * C);
    m->d_normed = take<bf16>(a, T * C);
    m->d_attn = take<bf16>(a, T * QD);
    m->d_q = take<bf16>(a, T * QD);
    m->d_k = take<bf16>(a, T * KVD);
    m->d_v = take<bf16>(a, T * KVD);
    m->d_act = take<bf16>(a, T * F);
}

CudaModel *cuda_model_create(const ModelConfig *cfg, int max_rows, int seq_len) {
    if (max_rows <= 0 || seq_len <= 0)
        fatal("%s:%d: cuda_model_create: max_rows %d and seq_len %d must be positive", __FILE__,
              __LINE__, max_rows, seq_len);
    if ((long long)max_rows * seq_len > INT_MAX)
        fatal("%s:%d: cuda_model_create: max_rows %d x seq_len %d exceeds %d tokens", __FILE__,
              __LINE__, max_rows, seq_len, INT_MAX);
    CudaModel *m = (CudaModel *)xcalloc(1, sizeof(CudaModel));
    m->cfg = *cfg;
    param_table_build(cfg, &m->table);  // validates cfg
    m->max_rows = max_rows;
    m->seq_len = seq_len;
    m->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    m->q_dim = cfg->num_attention_heads * m->head_dim;
    m->kv_dim = cfg->num_key_value_heads * m->head_dim;
    m->deterministic = true;
    if (m->head_dim != 64 && m->head_dim != 128)
        fatal("%s:%d: cuda backend: head dim (model.hidden_size %d / model.num_attention_heads "
              "%d = %d) must be 64 or 128 for the attention kernels",
              __FILE__, __LINE__, cfg->hidden_size, cfg->num_attention_heads, m->head_dim);
    const int T = max_rows * seq_len;
    const OpsCudaState *ops = ops_cuda_state("cuda_model_create");
    if (ops->max_tokens < T || ops->max_channels < cfg->hidden_size)
        fatal("%s:%d: cuda_model_create: ops_cuda_init(max_tokens %d, max_channels %d) is too "
              "small for %d tokens x %d channels",
              __FILE__, __LINE__, ops->max_tokens, ops->max_channels, T, cfg->hidden_size);

    const int L = cfg->num_hidden_layers;
    m->embed_offset = offset_of(&m->table, "model.embed_tokens.weight");
    m->final_norm_offset = offset_of(&m->table, "model.norm.weight");
    m->lm_head_offset = cfg->tie_word_embeddings ? m->embed_offset
                                                 : offset_of(&m->table, "lm_head.weight");
    m->layer_offsets = (size_t *)xmalloc((size_t)L * LAYER_TENSORS * sizeof(size_t));
    for (int l = 0; l < L; l++)
        for (int w = 0; w < LAYER_TENSORS; w++) {
            char name[96];
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, LAYER_TENSOR_NAMES[w]);
            m->layer_offsets[l * LAYER_TENSORS + w] = offset_of(&m->table, name);
        }

    // Chunks of whole 64-row tiles (better GEMM shapes) when the vocabulary allows.
    int chunk = LOGIT_CHUNK_ELEMENTS / cfg->vocab_size;
    if (chunk > 64) chunk -= chunk % 64;
    if (chunk < 1) chunk = 1;
    if (chunk > T) chunk = T;
    m->chunk_rows = chunk;

    m->mask.n_rows = max_rows;
    m->mask.seq_len = seq_len;
    m->mask.block_m = ATTN_CUDA_BLOCK_M;
    m->mask.block_n = ATTN_CUDA_BLOCK_N;
    m->mask.n_q_tiles = (seq_len + ATTN_CUDA_BLOCK_M - 1) / ATTN_CUDA_BLOCK_M;
    m->mask.n_k_tiles = (seq_len + ATTN_CUDA_BLOCK_N - 1) / ATTN_CUDA_BLOCK_N;
    m->residual = (bf16 **)xmalloc((size_t)(L + 1) * sizeof(bf16 *));
    m->layers = (LayerActivations *)xcalloc((size_t)L, sizeof(LayerActivations));
    Arena sizing = {nullptr, 0};
    carve(m, &sizing);
    m->arena_bytes = sizing.used;
    cudaCheck(cudaMalloc(&m->arena, m->arena_bytes));
    Arena arena = {(char *)m->arena, 0};
    carve(m, &arena);

    cudaCheck(cudaStreamCreate(&m->stream));  // blocking: ordered after default-stream work
    m->host_slots = (int32_t *)xmalloc((size_t)T * sizeof(int32_t));
    m->host_targets = (int32_t *)xmalloc((size_t)T * sizeof(int32_t));
    cudaCheck(cudaMallocHost(&m->host_losses, (size_t)T * sizeof(float)));
    return m;
}

void cuda_model_free(CudaModel *m) {
    if (!m) return;
    cudaCheck(cudaStreamSynchronize(m->stream));
    cudaCheck(cudaStreamDestroy(m->stream));
    cudaCheck(cudaFree(m->arena));
    cudaCheck(cudaFreeHost(m->host_losses));
    if (m->have_rebuilt) tile_mask_free(&m->rebuilt);
    free(m->host_slots);
    free(m->host_targets);
    free(m->residual);
    free(m->layers);
    free(m->layer_offsets);
    param_table_free(&m->table);
    free(m);
}

cudaStream_t cuda_model_stream(const CudaModel *m) { return m->stream; }

void cuda_model_set_deterministic(CudaModel *m, bool deterministic) {
    m->deterministic = deterministic;
}

size_t cuda_model_arena_bytes(const CudaModel *m) { return m->arena_bytes; }

// ---------------------------------------------------------------- the batch

// Checks the batch and lists its target slots into host_slots / host_targets.
// Returns the number of targets.
static int collect_targets(CudaModel *m, const ModelBatch *b) {
    if (b->n_rows <= 0 || b->n_rows > m->max_rows)
        fatal("%s:%d: batch n_rows %d outside [1, %d] (the model's max_rows)", __FILE__, __LINE__,
              b->n_rows, m->max_rows);
    if (b->seq_len != m->seq_len)
        fatal("%s:%d: batch seq_len %d differs from the model's %d", __FILE__, __LINE__,
              b->seq_len, m->seq_len);
    if (!b->mask || b->mask->n_rows != b->n_rows || b->mask->seq_len != b->seq_len)
        fatal("%s:%d: batch tile mask missing or not built for %d rows x %d", __FILE__, __LINE__,
              b->n_rows, b->seq_len);
    const int T = b->n_rows * b->seq_len, V = m->cfg.vocab_size;
    int n_targets = 0;
    for (int n = 0; n < T; n++) {
        if (b->token[n] < 0 || b->token[n] >= V)
            fatal("%s:%d: batch token %d at slot %d outside [0, %d)", __FILE__, __LINE__,
                  b->token[n], n, V);
        if (b->target[n] < -1 || b->target[n] >= V)
            fatal("%s:%d: batch target %d at slot %d outside [-1, %d)", __FILE__, __LINE__,
                  b->target[n], n, V);
        if (b->pos[n] < 0)
            fatal("%s:%d: batch position %d at slot %d is negative", __FILE__, __LINE__, b->pos[n],
                  n);
        if (b->target[n] >= 0) {
            m->host_slots[n_targets] = n;
            m->host_targets[n_targets++] = b->target[n];
        }
    }
    return n_targets;
}

// Copies the batch's tile lists into the model's device mask; a mask built with other
// block sizes is first rebuilt on the host from lo/hi with the kernels' sizes.
static void upload_mask(CudaModel *m, const ModelBatch *b) {
    const TileMask *host = b->mask;
    if (host->block_m != ATTN_CUDA_BLOCK_M || host->block_n != ATTN_CUDA_BLOCK_N) {
        if (m->have_rebuilt) tile_mask_free(&m->rebuilt);
        tile_mask_build(b->lo, b->hi, b->n_rows, b->seq_len, ATTN_CUDA_BLOCK_M, ATTN_CUDA_BLOCK_N,
                        &m->rebuilt);
        m->have_rebuilt = true;
        host = &m->rebuilt;
    }
    m->mask.n_rows = b->n_rows;
    MaskArrays src = mask_arrays(const_cast<TileMask *>(host)), dst = mask_arrays(&m->mask);
    for (int i = 0; i < 8; i++)
        cudaCheck(cudaMemcpyAsync(*dst.ptr[i], *src.ptr[i], src.count[i] * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, m->stream));
}

// Validates and uploads the batch; returns its number of targets.
static int upload_batch(CudaModel *m, const ModelBatch *b) {
    const int n_targets = collect_targets(m, b);
    const size_t T = (size_t)b->n_rows * b->seq_len;
    const struct { int32_t *dst; const int32_t *src; size_t n; } copies[] = {
        {m->token, b->token, T}, {m->pos, b->pos, T}, {m->lo, b->lo, T}, {m->hi, b->hi, T},
        {m->target_slots, m->host_slots, (size_t)n_targets},
        {m->slot_targets, m->host_targets, (size_t)n_targets},
    };
    for (size_t i = 0; i < sizeof(copies) / sizeof(copies[0]); i++)
        if (copies[i].n)
            cudaCheck(cudaMemcpyAsync(copies[i].dst, copies[i].src, copies[i].n * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, m->stream));
    upload_mask(m, b);
    return n_targets;
}

// ------------------------------------------------------------------ kernels

enum { ROW_COPY_THREADS = 256 };

// dst[r, :] = src[slots[r], :] for r < rows (one block per row).
__global__ void gather_rows_kernel(bf16 *dst, const bf16 *src, const int32_t *slots, int C) {
    const int64_t r = blockIdx.x;
    const bf16 *from = src + (int64_t)slots[r] * C;
    bf16 *to = dst + r * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) to[c] = from[c];
}

// dst[slots[r], :] = src[r, :] for r < rows (slots distinct, so no two blocks collide).
__global__ void scatter_rows_kernel(bf16 *dst, const bf16 *src, const int32_t *slots, int C) {
    const int64_t r = blockIdx.x;
    const bf16 *from = src + r * C;
    bf16 *to = dst + (int64_t)slots[r] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) to[c] = from[c];
}

// ---------------------------------------------------------------- the model

static void zero_async(CudaModel *m, void *p, size_t bytes) {
    cudaCheck(cudaMemsetAsync(p, 0, bytes, m->stream));
}

static AttnShape attention_shape(const CudaModel *m, const ModelBatch *b) {
    return AttnShape{b->n_rows, b->seq_len, m->cfg.num_attention_heads,
                     m->cfg.num_key_value_heads, m->head_dim, 1.0f / sqrtf((float)m->head_dim)};
}

// Embedding and all layers up to the final norm; fills every saved activation.
static void forward_body(CudaModel *m, const bf16 *params, const ModelBatch *b) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size, F = cfg->intermediate_size;
    const int H = cfg->num_attention_heads, KV = cfg->num_key_value_heads, D = m->head_dim;
    const AttnShape shape = attention_shape(m, b);
    const cudaStream_t s = m->stream;

    embedding_forward_cuda(m->residual[0], m->token, params + m->embed_offset, T, C, s);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        const size_t *w = m->layer_offsets + (size_t)l * LAYER_TENSORS;
        LayerActivations *a = &m->layers[l];
        const bf16 *x = m->residual[l];
        rmsnorm_forward_cuda(a->ln1, a->ln1_rstd, x, params + w[W_INPUT_NORM], T, C,
                             cfg->rms_norm_eps, s);
        matmul_forward_cuda(a->q, a->ln1, params + w[W_Q], T, C, m->q_dim, s);
        matmul_forward_cuda(a->k, a->ln1, params + w[W_K], T, C, m->kv_dim, s);
        matmul_forward_cuda(a->v, a->ln1, params + w[W_V], T, C, m->kv_dim, s);
        rope_forward_cuda(a->q, m->pos, T, H, D, cfg->rope_theta, s);
        rope_forward_cuda(a->k, m->pos, T, KV, D, cfg->rope_theta, s);
        attention_forward_cuda(&shape, &m->mask, m->lo, m->hi, a->q, a->k, a->v, a->attn, a->lse,
                               s);
        matmul_forward_cuda(m->proj_out, a->attn, params + w[W_O], T, m->q_dim, C, s);
        residual_add_cuda(a->mid, x, m->proj_out, (int64_t)T * C, s);

        rmsnorm_forward_cuda(a->ln2, a->ln2_rstd, a->mid, params + w[W_POST_NORM], T, C,
                             cfg->rms_norm_eps, s);
        matmul_forward_cuda(a->gate, a->ln2, params + w[W_GATE], T, C, F, s);
        matmul_forward_cuda(a->up, a->ln2, params + w[W_UP], T, C, F, s);
        swiglu_forward_cuda(m->act, a->gate, a->up, (int64_t)T * F, s);
        matmul_forward_cuda(m->proj_out, m->act, params + w[W_DOWN], T, F, C, s);
        residual_add_cuda(m->residual[l + 1], a->mid, m->proj_out, (int64_t)T * C, s);
    }
    rmsnorm_forward_cuda(m->final_norm, m->final_rstd, m->residual[cfg->num_hidden_layers],
                         params + m->final_norm_offset, T, C, cfg->rms_norm_eps, s);
}

// LM head and cross-entropy over the n_targets uploaded target slots, a chunk of rows
// at a time (slots without a target need no logits). Per-target losses go to
// target_losses. With grads, also writes d_normed (the gradient at the final norm
// output) and adds into the LM head's gradient.
static void loss_head(CudaModel *m, const bf16 *params, float *grads, const ModelBatch *b,
                      int n_targets, float loss_scale) {
    const int T = b->n_rows * b->seq_len, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const bf16 *lm_head = params + m->lm_head_offset;
    const cudaStream_t s = m->stream;
    if (grads) zero_async(m, m->d_normed, (size_t)T * C * sizeof(bf16));
    for (int start = 0; start < n_targets; start += m->chunk_rows) {
        const int rows = n_targets - start < m->chunk_rows ? n_targets - start : m->chunk_rows;
        const int32_t *slots = m->target_slots + start;
        gather_rows_kernel<<<rows, ROW_COPY_THREADS, 0, s>>>(m->chunk_input, m->final_norm, slots,
                                                             C);
        cudaCheckLaunch();
        matmul_forward_cuda(m->chunk_logits, m->chunk_input, lm_head, rows, C, V, s);
        cross_entropy_forward_backward_cuda(m->target_losses + start,
                                            grads ? m->chunk_logits : nullptr, m->chunk_logits,
                                            m->slot_targets + start, rows, V, loss_scale, s);
        if (grads) {
            zero_async(m, m->chunk_dinput, (size_t)rows * C * sizeof(bf16));
            matmul_backward_cuda(m->chunk_dinput, grads + m->lm_head_offset, m->chunk_logits,
                                 m->chunk_input, lm_head, rows, C, V, s);
            scatter_rows_kernel<<<rows, ROW_COPY_THREADS, 0, s>>>(m->d_normed, m->chunk_dinput,
                                                                  slots, C);
            cudaCheckLaunch();
        }
    }
}

// Reads the per-target losses back (waiting for the stream), scatters them into
// losses [T] when not NULL, and returns their sum (in slot order, in double).
static double read_losses(CudaModel *m, const ModelBatch *b, int n_targets, float *losses) {
    if (n_targets > 0)
        cudaCheck(cudaMemcpyAsync(m->host_losses, m->target_losses,
                                  (size_t)n_targets * sizeof(float), cudaMemcpyDeviceToHost,
                                  m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    if (losses) memset(losses, 0, (size_t)b->n_rows * b->seq_len * sizeof(float));
    double total = 0.0;
    for (int i = 0; i < n_targets; i++) {
        total += m->host_losses[i];
        if (losses) losses[m->host_slots[i]] = m->host_losses[i];
    }
    return total;
}

double cuda_model_forward(CudaModel *m, const void *params_bf16, const ModelBatch *b,
                          float *losses_host) {
    const bf16 *params = (const bf16 *)params_bf16;
    const int n_targets = upload_batch(m, b);
    forward_body(m, params, b);
    loss_head(m, params, nullptr, b, n_targets, 1.0f);
    return read_losses(m, b, n_targets, losses_host);
}

// Walks the layers in reverse from d_normed (set by loss_head), adding into grads.
static void backward(CudaModel *m, const bf16 *params, float *grads, const ModelBatch *b) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size, F = cfg->intermediate_size;
    const int H = cfg->num_attention_heads, KV = cfg->num_key_value_heads, D = m->head_dim;
    const int L = cfg->num_hidden_layers;
    const AttnShape shape = attention_shape(m, b);
    const cudaStream_t s = m->stream;
    const size_t hidden_bytes = (size_t)T * C * sizeof(bf16);

    zero_async(m, m->d_residual, hidden_bytes);
    rmsnorm_backward_cuda(m->d_residual, grads + m->final_norm_offset, m->d_normed,
                          m->residual[L], params + m->final_norm_offset, m->final_rstd, T, C, s);
    for (int l = L - 1; l >= 0; l--) {
        const size_t *w = m->layer_offsets + (size_t)l * LAYER_TENSORS;
        LayerActivations *a = &m->layers[l];
        // MLP block: residual[l+1] = mid + down(swiglu(gate(ln2), up(ln2))).
        // d_residual holds d residual[l+1], which is also the residual path's d mid.
        swiglu_forward_cuda(m->act, a->gate, a->up, (int64_t)T * F, s);  // recompute
        zero_async(m, m->d_act, (size_t)T * F * sizeof(bf16));
        matmul_backward_cuda(m->d_act, grads + w[W_DOWN], m->d_residual, m->act,
                             params + w[W_DOWN], T, F, C, s);
        bf16 *d_gate = a->gate, *d_up = a->up;  // in place: gate and up are not needed again
        swiglu_backward_cuda(d_gate, d_up, m->d_act, a->gate, a->up, (int64_t)T * F, s);
        zero_async(m, m->d_normed, hidden_bytes);
        matmul_backward_cuda(m->d_normed, grads + w[W_GATE], d_gate, a->ln2, params + w[W_GATE],
                             T, C, F, s);
        matmul_backward_cuda(m->d_normed, grads + w[W_UP], d_up, a->ln2, params + w[W_UP], T, C,
                             F, s);
        rmsnorm_backward_cuda(m->d_residual, grads + w[W_POST_NORM], m->d_normed, a->mid,
                              params + w[W_POST_NORM], a->ln2_rstd, T, C, s);

        // Attention block: mid = residual[l] + o_proj(attention(rope(q), rope(k), v)).
        zero_async(m, m->d_attn, (size_t)T * m->q_dim * sizeof(bf16));
        matmul_backward_cuda(m->d_attn, grads + w[W_O], m->d_residual, a->attn, params + w[W_O],
                             T, m->q_dim, C, s);
        attention_backward_cuda(&shape, &m->mask, m->lo, m->hi, a->q, a->k, a->v, a->attn,
                                a->lse, m->d_attn, m->d_q, m->d_k, m->d_v, s, m->deterministic);
        rope_backward_cuda(m->d_q, m->pos, T, H, D, cfg->rope_theta, s);
        rope_backward_cuda(m->d_k, m->pos, T, KV, D, cfg->rope_theta, s);
        zero_async(m, m->d_normed, hidden_bytes);
        matmul_backward_cuda(m->d_normed, grads + w[W_Q], m->d_q, a->ln1, params + w[W_Q], T, C,
                             m->q_dim, s);
        matmul_backward_cuda(m->d_normed, grads + w[W_K], m->d_k, a->ln1, params + w[W_K], T, C,
                             m->kv_dim, s);
        matmul_backward_cuda(m->d_normed, grads + w[W_V], m->d_v, a->ln1, params + w[W_V], T, C,
                             m->kv_dim, s);
        rmsnorm_backward_cuda(m->d_residual, grads + w[W_INPUT_NORM], m->d_normed,
                              m->residual[l], params + w[W_INPUT_NORM], a->ln1_rstd, T, C, s);
    }
    embedding_backward_cuda(grads + m->embed_offset, m->d_residual, m->token, T, C, s);
}

double cuda_model_forward_backward(CudaModel *m, const void *params_bf16, float *grads,
                                   const ModelBatch *b, float loss_scale) {
    const bf16 *params = (const bf16 *)params_bf16;
    const int n_targets = upload_batch(m, b);
    forward_body(m, params, b);
    loss_head(m, params, grads, b, n_targets, loss_scale);
    // Without targets the loss is 0 and every gradient exactly 0: nothing to add.
    if (n_targets > 0) backward(m, params, grads, b);
    return read_losses(m, b, n_targets, nullptr);
}
