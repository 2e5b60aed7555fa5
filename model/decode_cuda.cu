// CUDA KV-cache decoder (decode_cuda.h): model_cuda.cu's forward over the fed tokens as
// rows, with each layer's new keys and values scattered into the cache and attention
// over the cache instead of over a packed row. A call runs in chunks of at most
// chunk_tokens tokens; each chunk appends to the caches before its attention, so a
// prefill cut across chunks sees the same keys.
// T = chunk tokens, C hidden, F intermediate, V vocab, H query heads, KV key/value heads,
// D head dim (ModelDims). Activations and cache bf16, rstd and logits fp32.
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "attention/attention_decode_cuda.h"
#include "common/cuda_check.h"
#include "model/arena_cuda.cuh"
#include "model/decode_cuda.h"
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

enum { DECODE_CHUNK_TOKENS = 1024, DECODE_MAX_HEAD_DIM = 256, DECODE_MAX_GROUP = 32 };

// The per-token int32 columns of a chunk, uploaded in one copy: [DECODE_COLUMNS, chunk].
enum { COL_TOKEN, COL_POS, COL_SLOT, COL_CACHE_ROW, COL_N_KEYS, DECODE_COLUMNS };

struct CudaDecoder {
    ModelConfig cfg;
    ParamTable table;
    ModelDims dims;
    ParamOffsets off;  // tensor offsets in the flat parameter buffer
    int max_seqs, max_len;
    int chunk_capacity, chunk_tokens;  // tokens allocated / used per chunk
    int *length;   // [max_seqs] host: tokens in each sequence's cache
    cudaStream_t stream;

    bf16 *cache;          // [L, 2, max_seqs, max_len, KV, D]: each layer's K cache, then V
    size_t layer_cache;   // elements of one layer's K (or V) cache
    void *arena;          // the one device allocation holding every buffer below
    size_t arena_bytes;
    int32_t *cols;        // [DECODE_COLUMNS, chunk_capacity] device
    int32_t *host_cols;   // [DECODE_COLUMNS, chunk_capacity] pinned
    float2 *rope_cos_sin; // [T, D / 2] RoPE angles of the chunk's positions
    bf16 *x;              // [T, C] residual stream
    bf16 *ln;             // [T, C] norm output (input, post-attention, final)
    float *rstd;          // [T] rstd of the hidden-size norms (not needed: no backward)
    bf16 *qkv;            // [T, (H + 2 KV) D] stacked q|k|v product (+ biases)
    bf16 *q_raw, *k_raw;  // [T, H, D], [T, KV, D] before q_norm/k_norm (qk_norm only)
    bf16 *q, *k, *v;      // [T, H, D], [T, KV, D], [T, KV, D] (q and k after RoPE)
    bf16 *attn;           // [T, H, D] attention output (o_proj input)
    bf16 *proj;           // [T, C] o_proj / down_proj output before the residual add
    bf16 *gate_up;        // [T, 2F] rows [gate_proj | up_proj]
    bf16 *act;            // [T, F] silu(gate) * up
    bf16 *logits;         // [T, V]
    float *logits_f32;    // [T, V]
    void *attn_workspace; // attention_decode_workspace_bytes of a full chunk
};

static DecodeShape decode_shape(const CudaDecoder *d, int n_tokens, int max_keys) {
    const AttnShape a = model_attention_shape(&d->cfg, &d->dims, 1, 1);
    return DecodeShape{n_tokens, a.n_heads, a.n_kv_heads, a.head_dim, d->max_seqs, d->max_len,
                       max_keys, a.scale};
}

// Points every device buffer into the arena (or only counts bytes when a->base is NULL).
static void carve(CudaDecoder *d, Arena *a) {
    const ModelConfig *cfg = &d->cfg;
    const size_t T = d->chunk_capacity, C = cfg->hidden_size, F = cfg->intermediate_size,
                 V = cfg->vocab_size;
    const size_t QD = d->dims.q_dim, KVD = d->dims.kv_dim;
    d->cols = arena_take<int32_t>(a, DECODE_COLUMNS * T);
    d->rope_cos_sin = arena_take<float2>(a, T * (d->dims.head_dim / 2));
    d->x = arena_take<bf16>(a, T * C);
    d->ln = arena_take<bf16>(a, T * C);
    d->rstd = arena_take<float>(a, T);
    d->qkv = arena_take<bf16>(a, T * d->dims.qkv_dim);
    if (cfg->qk_norm) {
        d->q_raw = arena_take<bf16>(a, T * QD);
        d->k_raw = arena_take<bf16>(a, T * KVD);
    }
    d->q = arena_take<bf16>(a, T * QD);
    d->k = arena_take<bf16>(a, T * KVD);
    d->v = arena_take<bf16>(a, T * KVD);
    d->attn = arena_take<bf16>(a, T * QD);
    d->proj = arena_take<bf16>(a, T * C);
    d->gate_up = arena_take<bf16>(a, T * 2 * F);
    d->act = arena_take<bf16>(a, T * F);
    d->logits = arena_take<bf16>(a, T * V);
    d->logits_f32 = arena_take<float>(a, T * V);
    const DecodeShape shape = decode_shape(d, d->chunk_capacity, d->max_len);
    d->attn_workspace = arena_take<char>(a, attention_decode_workspace_bytes(&shape));
}

CudaDecoder *cuda_decoder_create(const ModelConfig *cfg, int max_seqs, int max_len) {
    CHECK(max_seqs > 0 && max_len > 0,
          "cuda_decoder_create: max_seqs %d and max_len %d must be positive", max_seqs, max_len);
    CHECK((long long)max_seqs * max_len <= INT_MAX,
          "cuda_decoder_create: max_seqs %d x max_len %d exceeds %d cache rows", max_seqs,
          max_len, INT_MAX);
    CudaDecoder *d = (CudaDecoder *)xcalloc(1, sizeof(CudaDecoder));
    d->cfg = *cfg;
    d->dims = model_dims(cfg);
    const int group = cfg->num_attention_heads / cfg->num_key_value_heads;
    if (d->dims.head_dim > DECODE_MAX_HEAD_DIM)
        fatal("cuda decoder: head dim %d (model.head_dim, else model.hidden_size / "
              "model.num_attention_heads) exceeds %d",
              d->dims.head_dim, DECODE_MAX_HEAD_DIM);
    if (cfg->qk_norm && !qk_norm_rope_supports_head_dim(d->dims.head_dim))
        fatal("cuda decoder: q_norm/k_norm run with head dims 32, 64, 128 or 256 here, not %d "
              "(model.head_dim)", d->dims.head_dim);
    if (group > DECODE_MAX_GROUP)
        fatal("cuda decoder: model.num_attention_heads %d / model.num_key_value_heads %d = %d "
              "query heads per key/value head exceed %d",
              cfg->num_attention_heads, cfg->num_key_value_heads, group, DECODE_MAX_GROUP);
    (void)ops_cuda_state("cuda_decoder_create");  // fatal before any allocation if missing
    param_table_build(cfg, &d->table);
    param_offsets_resolve(cfg, &d->table, &d->off);
    // q|k|v and gate|up run as one product each over the stacked weights, which the
    // ParamTable lays out back to back (model/params.c), as the CUDA model does.
    const size_t C = cfg->hidden_size, F = cfg->intermediate_size;
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        const size_t *w = d->off.layer + (size_t)l * LAYER_TENSORS;
        CHECK(w[W_K] == w[W_Q] + d->dims.q_dim * C && w[W_V] == w[W_K] + d->dims.kv_dim * C &&
                  w[W_UP] == w[W_GATE] + F * C,
              "layer %d: q/k/v or gate/up weights are not consecutive in the parameter table", l);
        CHECK(!cfg->attention_bias || (w[W_K_BIAS] == w[W_Q_BIAS] + d->dims.q_dim &&
                                       w[W_V_BIAS] == w[W_K_BIAS] + d->dims.kv_dim),
              "layer %d: q/k/v biases are not consecutive in the parameter table", l);
    }
    d->max_seqs = max_seqs;
    d->max_len = max_len;
    const long long all = (long long)max_seqs * max_len;
    d->chunk_capacity = d->chunk_tokens = all < DECODE_CHUNK_TOKENS ? (int)all : DECODE_CHUNK_TOKENS;
    d->length = (int *)xcalloc((size_t)max_seqs, sizeof(int));

    d->layer_cache = (size_t)max_seqs * max_len * d->dims.kv_dim;
    cudaCheck(cudaMalloc(&d->cache, cuda_decoder_cache_bytes(d)));
    Arena sizing = {nullptr, 0};
    carve(d, &sizing);
    d->arena_bytes = sizing.used;
    cudaCheck(cudaMalloc(&d->arena, d->arena_bytes));
    Arena arena = {(char *)d->arena, 0};
    carve(d, &arena);
    cudaCheck(cudaMallocHost(&d->host_cols,
                             (size_t)DECODE_COLUMNS * d->chunk_capacity * sizeof(int32_t)));
    cudaCheck(cudaStreamCreate(&d->stream));  // blocking: ordered after default-stream work
    return d;
}

void cuda_decoder_free(CudaDecoder *d) {
    if (!d) return;
    cudaCheck(cudaStreamSynchronize(d->stream));
    cudaCheck(cudaStreamDestroy(d->stream));
    cudaCheck(cudaFree(d->cache));
    cudaCheck(cudaFree(d->arena));
    cudaCheck(cudaFreeHost(d->host_cols));
    free(d->length);
    param_offsets_free(&d->off);
    param_table_free(&d->table);
    free(d);
}

void cuda_decoder_reset(CudaDecoder *d, int slot) {
    CHECK(slot >= 0 && slot < d->max_seqs, "cuda_decoder_reset: slot %d outside [0, %d)", slot,
          d->max_seqs);
    d->length[slot] = 0;  // old entries are never read again: attention stops at the length
}

int cuda_decoder_length(const CudaDecoder *d, int slot) {
    CHECK(slot >= 0 && slot < d->max_seqs, "cuda_decoder_length: slot %d outside [0, %d)", slot,
          d->max_seqs);
    return d->length[slot];
}

void cuda_decoder_set_chunk_tokens(CudaDecoder *d, int tokens) {
    d->chunk_tokens = tokens < 1 ? 1 : tokens < d->chunk_capacity ? tokens : d->chunk_capacity;
}

size_t cuda_decoder_cache_bytes(const CudaDecoder *d) {
    return (size_t)d->cfg.num_hidden_layers * 2 * d->layer_cache * sizeof(bf16);
}

size_t cuda_decoder_arena_bytes(const CudaDecoder *d) { return d->arena_bytes; }

// q, k, v of one layer from its input norm output d->ln (rows [n, C]): the stacked
// projection and its biases, q_norm/k_norm over each head (qk_norm), RoPE on q and k with
// the chunk's angles (the order and ops of model_cuda.cu's forward).
static void attention_inputs(CudaDecoder *d, const bf16 *params, const size_t *w, int n) {
    const ModelConfig *cfg = &d->cfg;
    const int C = cfg->hidden_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int D = d->dims.head_dim, QKV = d->dims.qkv_dim;
    const cudaStream_t s = d->stream;
    matmul_forward_cuda(d->qkv, d->ln, params + w[W_Q], n, C, QKV, s);
    if (cfg->attention_bias) bias_forward_cuda(d->qkv, params + w[W_Q_BIAS], n, QKV, s);
    if (!cfg->qk_norm) {
        rope_split_qkv_cuda(d->q, d->k, d->v, d->qkv, d->rope_cos_sin, n, H, KV, D, s);
        return;
    }
    rope_split_qkv_cuda(d->q_raw, d->k_raw, d->v, d->qkv, nullptr, n, H, KV, D, s);  // unrotated
    qk_norm_rope_forward_cuda(d->q, d->k, nullptr, nullptr, d->q_raw, d->k_raw,
                              params + w[W_Q_NORM], params + w[W_K_NORM], d->rope_cos_sin, n, H,
                              KV, D, cfg->rms_norm_eps, s);
}

// One chunk of n tokens whose columns are in d->cols; logits to logits_host [n, V].
static void forward_chunk(CudaDecoder *d, const bf16 *params, int n, int max_keys,
                          float *logits_host) {
    const ModelConfig *cfg = &d->cfg;
    const int C = cfg->hidden_size, F = cfg->intermediate_size, V = cfg->vocab_size;
    const int L = cfg->num_hidden_layers, KVD = d->dims.kv_dim;
    const int cap = d->chunk_capacity;
    const int32_t *token = d->cols + COL_TOKEN * cap, *pos = d->cols + COL_POS * cap,
                  *slot = d->cols + COL_SLOT * cap, *cache_row = d->cols + COL_CACHE_ROW * cap,
                  *n_keys = d->cols + COL_N_KEYS * cap;
    const DecodeShape shape = decode_shape(d, n, max_keys);
    const cudaStream_t s = d->stream;

    rope_angles_cuda(d->rope_cos_sin, pos, n, d->dims.head_dim, cfg->rope_theta,
                     &cfg->rope_scaling, s);
    embedding_forward_cuda(d->x, token, params + d->off.embed, n, C, s);
    rmsnorm_forward_cuda(d->ln, d->rstd, d->x, params + d->off.layer[W_INPUT_NORM], n, C,
                         cfg->rms_norm_eps, s);
    for (int l = 0; l < L; l++) {
        const size_t *w = d->off.layer + (size_t)l * LAYER_TENSORS;
        attention_inputs(d, params, w, n);
        bf16 *k_cache = d->cache + (size_t)l * 2 * d->layer_cache, *v_cache = k_cache + d->layer_cache;
        scatter_rows_cuda(k_cache, d->k, cache_row, n, KVD, s);
        scatter_rows_cuda(v_cache, d->v, cache_row, n, KVD, s);
        attention_decode_cuda(&shape, d->q, k_cache, v_cache, slot, n_keys, d->attn,
                              d->attn_workspace, s);
        matmul_forward_cuda(d->proj, d->attn, params + w[W_O], n, d->dims.q_dim, C, s);
        add_rmsnorm_forward_cuda(d->x, d->ln, d->rstd, d->x, d->proj, params + w[W_POST_NORM], n,
                                 C, cfg->rms_norm_eps, s);
        matmul_forward_cuda(d->gate_up, d->ln, params + w[W_GATE], n, C, 2 * F, s);
        swiglu_stacked_forward_cuda(d->act, d->gate_up, n, F, s);
        matmul_forward_cuda(d->proj, d->act, params + w[W_DOWN], n, F, C, s);
        const size_t next_norm = l + 1 == L ? d->off.final_norm : w[LAYER_TENSORS + W_INPUT_NORM];
        add_rmsnorm_forward_cuda(d->x, d->ln, d->rstd, d->x, d->proj, params + next_norm, n, C,
                                 cfg->rms_norm_eps, s);
    }
    matmul_forward_cuda(d->logits, d->ln, params + d->off.lm_head, n, C, V, s);
    bf16_to_float_cuda(d->logits_f32, d->logits, (int64_t)n * V, s);
    cudaCheck(cudaMemcpyAsync(logits_host, d->logits_f32, (size_t)n * V * sizeof(float),
                              cudaMemcpyDeviceToHost, s));
    // Also what lets the next chunk refill host_cols.
    cudaCheck(cudaStreamSynchronize(s));
}

void cuda_decoder_forward(CudaDecoder *d, const void *params_bf16, int n, const int32_t *slot,
                          const int32_t *token, const int32_t *pos, float *logits) {
    model_decode_check("cuda_decoder_forward", n, slot, token, pos, &d->cfg, d->length,
                       d->max_seqs, d->max_len);
    const bf16 *params = (const bf16 *)params_bf16;
    const int cap = d->chunk_capacity;
    for (int start = 0; start < n; start += d->chunk_tokens) {
        const int rows = n - start < d->chunk_tokens ? n - start : d->chunk_tokens;
        int max_keys = 0;
        for (int r = 0; r < rows; r++) {
            const int i = start + r, sl = slot[i];
            d->host_cols[COL_TOKEN * cap + r] = token[i];
            d->host_cols[COL_POS * cap + r] = pos[i];
            d->host_cols[COL_SLOT * cap + r] = sl;
            d->host_cols[COL_CACHE_ROW * cap + r] = sl * d->max_len + d->length[sl];
            d->host_cols[COL_N_KEYS * cap + r] = ++d->length[sl];  // itself and everything before
            if (d->length[sl] > max_keys) max_keys = d->length[sl];
        }
        cudaCheck(cudaMemcpyAsync(d->cols, d->host_cols,
                                  (size_t)DECODE_COLUMNS * cap * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, d->stream));
        forward_chunk(d, params, rows, max_keys, logits + (size_t)start * d->cfg.vocab_size);
    }
}
