// CUDA bf16 twin of model_cpu.c (same structure, same order of operations): forward
// saves what the backward needs, the loss head runs over chunks of target rows only,
// backward walks the layers in reverse ADDING fp32 parameter gradients.
// Memory: per layer the forward keeps only the residual stream (input and mid),
// rstd, q/k/v (with qk_norm: q and k before their norms), the attention output and lse.
// The backward recomputes the two norm outputs (bitwise the forward's: same kernel, same
// input), the normed and rotated q and k (qk_norm), and the stacked gate|up product: one
// more MLP matmul per layer buys a much smaller activation arena (the measured trade:
// docs/BENCHMARKS.md, "Training step"); this is MODEL_RECOMPUTE_MLP, the default. With
// MODEL_RECOMPUTE_NONE every layer keeps its gate|up product instead, and the backward
// skips that matmul. With MODEL_RECOMPUTE_LAYER only the residual stream is kept per
// layer: one block of the saved activations serves every layer, and each layer's
// backward first runs the layer's attention half again from its input residual (the
// forward's kernels on the same inputs, so bitwise the forward's values). With
// train.offload_activations on top (cuda_model_create_offload) those inputs residual[l],
// l < L, take a ring of CUDA_RESIDUAL_RING slots in turn: the forward copies each to
// pinned host memory on a copy stream and writes a slot again only once its copy is
// done; the backward copies each back into the slot the layer after it no longer needs,
// two layers ahead, and waits for it before reading it. The ring's last inputs stay in
// their slots; the kernels and their inputs are the same, so are the gradients.
// The MLP runs over tiles of tokens (CUDA_MLP_TILE_ELEMENTS, model.h), the same tiles in
// the forward and the backward and in every mode: its gate|up, activation and their
// gradient buffers hold one tile, and the weight gradients add tile by tile.
// T = n_rows * seq_len tokens, C hidden, F intermediate, V vocab, H query heads,
// KV key/value heads, D head dim (ModelDims). Activations bf16, rstd/lse/losses fp32.
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "attention/attention_cuda.h"
#include "common/cuda_check.h"
#include "model/arena_cuda.cuh"
#include "model/batch_cuda.cuh"
#include "model/lora_cuda.h"
#include "model/model_cuda.h"
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"
#include "model/stage_timer_cuda.cuh"


// Activations of one layer saved by the forward for the backward (with
// MODEL_RECOMPUTE_LAYER every layer's point at the same one block).
typedef struct {
    float *ln1_rstd;  // [T] input_layernorm
    bf16 *q;          // [T, H, D] after RoPE (split out of the stacked q|k|v product);
                      // with qk_norm the q_proj output before q_norm (and RoPE)
    bf16 *k;          // [T, KV, D] after RoPE; with qk_norm before k_norm
    bf16 *v;          // [T, KV, D]
    bf16 *attn;       // [T, H, D] attention output (o_proj input)
    float *lse;       // [n_rows, H, seq_len] attention log-sum-exp
    bf16 *mid;        // [T, C] residual after attention
    float *ln2_rstd;  // [T] post_attention_layernorm
    bf16 *gate_up;    // [T, 2F] with MODEL_RECOMPUTE_NONE (the backward overwrites it with
                      // [d gate | d up]), else NULL: CudaModel's one buffer serves
} LayerActivations;

struct CudaModel {
    ModelConfig cfg;
    ParamTable table;
    ModelDims dims;
    int max_rows, seq_len;
    int chunk_capacity, chunk_rows;  // logit rows allocated / used per chunk
    int mlp_tile_capacity, mlp_tile_rows;  // MLP tile tokens allocated / used
    ModelRecompute recompute;
    bool deterministic;
    ParamOffsets off;  // tensor offsets in the flat parameter/gradient buffers
    cudaStream_t stream;
    StageTimer *timer;      // NULL unless ONEPASS_STAGE_TIMES=1
    CudaGradsReady grads_ready;  // NULL: nobody waits for the gradients during the backward
    void *grads_ready_ctx;
    CudaWeightsReady weights_ready;  // NULL: the weights are in place before each call
    void *weights_ready_ctx;
    void *arena;            // the one device allocation holding every buffer below, where
                            // cuda_arena_layout (model/model_arena.h) places them
    size_t arena_bytes;

    DeviceBatch batch;      // the batch, uploaded
    float2 *rope_cos_sin;   // [T, D / 2] RoPE angles of the batch's positions
    float *target_losses;   // [T] cross-entropy of each of the batch's target slots
    // forward
    bf16 **residual;           // [L + 1] each [T, C]: residual[l] enters layer l
    LayerActivations *layers;  // [L]
    // One buffer of each serves every layer, in the forward and in the recomputation:
    bf16 *ln;                  // [T, C] input or post-attention norm output
    bf16 *gate_up;             // [mlp tile, 2F] rows [gate_proj | up_proj] (one product with the
                               // stacked weights); the backward overwrites it with
                               // [d gate | d up]. NULL with MODEL_RECOMPUTE_NONE (each
                               // layer has its own: mlp_gate_up)
    bf16 *qkv;                 // [T, (H + 2 KV) D] stacked q|k|v product before RoPE; in
                               // the backward, the stacked gradient [dq | dk | dv]
    bf16 *act;                 // [T, F] silu(gate) * up, the down_proj input (recomputed
                               // by the backward, so one buffer serves every layer)
    bf16 *proj_out;            // [T, C] o_proj / down_proj output before the residual add
    bf16 *final_norm;          // [T, C] model.norm output
    float *final_rstd;         // [T]
    // qk_norm only (empty otherwise), one of each for every layer: the attention inputs
    // q_norm(q) and k_norm(k) after RoPE, made by the forward and remade by the backward.
    bf16 *q_normed;            // [T, H, D]
    bf16 *k_normed;            // [T, KV, D]
    float *q_rstd;             // [T, H] q_norm's 1/rms of each head
    float *k_rstd;             // [T, KV]
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
    bf16 *d_act;       // [mlp tile, F]
    void *attn_workspace;  // attention backward scratch, sized for max_rows in either mode

    // host side
    float *host_losses;                  // [T] pinned: target_losses read back

    // train.offload_activations: residual[0, offloaded) wait in host_residual between the
    // forward and the backward (0: every residual stays in the arena); ring slots hold
    // residual[l], l < L, at l % ring. The copies run on copy_stream, ordered by events:
    // written[l] (residual[l] made, model stream), copied[l] (on the host, copy stream),
    // freed[l] (its slot's later input no longer needed, model stream), back[l] (in its
    // slot again, copy stream).
    int offloaded, ring;
    bf16 *host_residual;          // [offloaded][max_rows * seq_len, C] pinned
    cudaStream_t copy_stream;
    cudaEvent_t *written, *copied, *freed, *back;  // [offloaded] each, one allocation
    bool to_host;  // the running forward's inputs go to the host (a backward follows)

    // LoRA (cuda_model_set_lora): the adapters of the next calls, NULL without
    const LoraLayout *lora;
    const bf16 *adapter;      // [lora->table.total]
    float *adapter_grads;     // [lora->table.total]
    bf16 *lora_u, *lora_du;   // [T, lora_width] scratch (own allocations, not the arena's)
    int lora_width;           // the columns the scratch holds: a group's members x rank
};

// Points every device buffer into the arena where the layout places it.
static void carve(CudaModel *m, const CudaArenaLayout *a) {
    void *base = m->arena;
    device_batch_place(&m->batch, base, &a->batch, m->max_rows, m->seq_len);
    m->rope_cos_sin = arena_at<float2>(base, a->rope_cos_sin);
    m->target_losses = arena_at<float>(base, a->target_losses);

    const int L = m->cfg.num_hidden_layers;
    for (int l = 0; l <= L; l++)
        m->residual[l] = arena_at<bf16>(
            base, a->residual + cuda_arena_residual_slot(a, L, l) * a->residual_stride);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        LayerActivations *la = &m->layers[l];
        void *block =
            arena_at<char>(base, a->layers + (size_t)l % a->layer_blocks * a->layer_stride);
        la->ln1_rstd = arena_at<float>(block, a->layer.ln1_rstd);
        la->q = arena_at<bf16>(block, a->layer.q);
        la->k = arena_at<bf16>(block, a->layer.k);
        la->v = arena_at<bf16>(block, a->layer.v);
        la->attn = arena_at<bf16>(block, a->layer.attn);
        la->lse = arena_at<float>(block, a->layer.lse);
        la->mid = arena_at<bf16>(block, a->layer.mid);
        la->ln2_rstd = arena_at<float>(block, a->layer.ln2_rstd);
        la->gate_up = a->recompute == MODEL_RECOMPUTE_NONE
                          ? arena_at<bf16>(block, a->layer.gate_up) : nullptr;
    }
    m->ln = arena_at<bf16>(base, a->ln);
    m->gate_up =
        a->recompute == MODEL_RECOMPUTE_NONE ? nullptr : arena_at<bf16>(base, a->gate_up);
    m->qkv = arena_at<bf16>(base, a->qkv);
    m->act = arena_at<bf16>(base, a->act);
    m->proj_out = arena_at<bf16>(base, a->proj_out);
    m->final_norm = arena_at<bf16>(base, a->final_norm);
    m->final_rstd = arena_at<float>(base, a->final_rstd);
    m->q_normed = arena_at<bf16>(base, a->q_normed);
    m->k_normed = arena_at<bf16>(base, a->k_normed);
    m->q_rstd = arena_at<float>(base, a->q_rstd);
    m->k_rstd = arena_at<float>(base, a->k_rstd);

    m->chunk_input = arena_at<bf16>(base, a->chunk_input);
    m->chunk_logits = arena_at<bf16>(base, a->chunk_logits);
    m->chunk_dinput = arena_at<bf16>(base, a->chunk_dinput);

    m->d_residual = arena_at<bf16>(base, a->d_residual);
    m->d_normed = arena_at<bf16>(base, a->d_normed);
    m->d_attn = arena_at<bf16>(base, a->d_attn);
    m->d_q = arena_at<bf16>(base, a->d_q);
    m->d_k = arena_at<bf16>(base, a->d_k);
    m->d_v = arena_at<bf16>(base, a->d_v);
    m->d_act = arena_at<bf16>(base, a->d_act);
    m->attn_workspace = arena_at<char>(base, a->attn_workspace);
}

size_t cuda_model_attention_workspace_bytes(const ModelConfig *cfg, int max_rows, int seq_len) {
    const ModelDims dims = model_dims(cfg);
    const AttnShape shape = model_attention_shape(cfg, &dims, max_rows, seq_len);
    const size_t fast = attention_backward_workspace_bytes(&shape, false),
                 det = attention_backward_workspace_bytes(&shape, true);
    return fast > det ? fast : det;
}

CudaModel *cuda_model_create(const ModelConfig *cfg, int max_rows, int seq_len,
                             ModelRecompute recompute) {
    return cuda_model_create_offload(cfg, max_rows, seq_len, recompute, false);
}

CudaModel *cuda_model_create_offload(const ModelConfig *cfg, int max_rows, int seq_len,
                                     ModelRecompute recompute, bool offload_activations) {
    CHECK(!offload_activations || recompute == MODEL_RECOMPUTE_LAYER,
          "cuda_model_create_offload: the layer inputs are offloaded with recompute layer only");
    CHECK(max_rows > 0 && seq_len > 0,
          "cuda_model_create: max_rows %d and seq_len %d must be positive", max_rows, seq_len);
    CHECK((long long)max_rows * seq_len <= INT_MAX,
          "cuda_model_create: max_rows %d x seq_len %d exceeds %d tokens", max_rows, seq_len,
          INT_MAX);
    CudaModel *m = (CudaModel *)xcalloc(1, sizeof(CudaModel));
    m->cfg = *cfg;
    m->dims = model_dims(cfg);
    if (!model_dims_cuda_supported(&m->dims))
        fatal("cuda backend: head dim (model.hidden_size %d / model.num_attention_heads %d = %d) "
              "must be 64 or 128 for the attention kernels",
              cfg->hidden_size, cfg->num_attention_heads, m->dims.head_dim);
    param_table_build(cfg, &m->table);
    m->max_rows = max_rows;
    m->seq_len = seq_len;
    m->deterministic = true;
    CHECK(model_recompute_name(recompute)[0] != '?', "cuda_model_create: recompute mode %d",
          (int)recompute);
    m->recompute = recompute;
    const int T = max_rows * seq_len;
    const OpsCudaState *ops = ops_cuda_state("cuda_model_create");
    // The norms' widths: hidden, and head_dim for q_norm/k_norm.
    const int channels = cfg->qk_norm && m->dims.head_dim > cfg->hidden_size ? m->dims.head_dim
                                                                              : cfg->hidden_size;
    CHECK(ops->max_tokens >= T && ops->max_channels >= channels,
          "cuda_model_create: ops_cuda_init(max_tokens %d, max_channels %d) is too small for "
          "%d tokens x %d channels",
          ops->max_tokens, ops->max_channels, T, channels);

    const int L = cfg->num_hidden_layers;
    param_offsets_resolve(cfg, &m->table, &m->off);
    // q|k|v and gate|up run as one product each over the stacked weights, which the
    // ParamTable lays out back to back (model/params.c).
    const size_t C = cfg->hidden_size, F = cfg->intermediate_size;
    for (int l = 0; l < L; l++) {
        const size_t *w = m->off.layer + (size_t)l * LAYER_TENSORS;
        CHECK(w[W_K] == w[W_Q] + m->dims.q_dim * C && w[W_V] == w[W_K] + m->dims.kv_dim * C &&
                  w[W_UP] == w[W_GATE] + F * C,
              "layer %d: q/k/v or gate/up weights are not consecutive in the parameter table", l);
    }

    const CudaArenaLayout layout = cuda_arena_layout_offload(
        cfg, max_rows, seq_len, recompute, offload_activations,
        cuda_model_attention_workspace_bytes(cfg, max_rows, seq_len));
    m->chunk_capacity = m->chunk_rows = (int)layout.chunk_rows;
    m->mlp_tile_capacity = m->mlp_tile_rows = (int)layout.mlp_tile_rows;
    // The fused q/k norm + RoPE indexes tokens x (q, k and v heads) rows in 32 bits
    // (qk_norm_rope_*_cuda's own bound, refused here before anything runs).
    const int qk_rows_per_token = cfg->num_attention_heads + 2 * cfg->num_key_value_heads;
    CHECK(!cfg->qk_norm || (long long)T * qk_rows_per_token <= INT_MAX,
          "cuda_model_create: %d tokens x %d q/k/v heads exceed %d head rows", T,
          qk_rows_per_token, INT_MAX);

    m->residual = (bf16 **)xmalloc((size_t)(L + 1) * sizeof(bf16 *));
    m->layers = (LayerActivations *)xcalloc((size_t)L, sizeof(LayerActivations));
    m->arena_bytes = layout.bytes;
    cudaCheck(cudaMalloc(&m->arena, m->arena_bytes));
    carve(m, &layout);

    cudaCheck(cudaStreamCreate(&m->stream));  // blocking: ordered after default-stream work
    m->timer = stage_timer_from_env(m->stream);
    device_batch_host_alloc(&m->batch);
    cudaCheck(cudaMallocHost(&m->host_losses, (size_t)T * sizeof(float)));
    m->offloaded = (int)layout.offloaded;
    m->ring = (int)layout.residual_slots - 1;
    if (m->offloaded > 0) {
        cudaCheck(cudaMallocHost(&m->host_residual,
                                 (size_t)m->offloaded * T * cfg->hidden_size * sizeof(bf16)));
        cudaCheck(cudaStreamCreateWithFlags(&m->copy_stream, cudaStreamNonBlocking));
        m->written = (cudaEvent_t *)xmalloc(4 * (size_t)m->offloaded * sizeof(cudaEvent_t));
        m->copied = m->written + m->offloaded;
        m->freed = m->copied + m->offloaded;
        m->back = m->freed + m->offloaded;
        for (int i = 0; i < 4 * m->offloaded; i++)
            cudaCheck(cudaEventCreateWithFlags(&m->written[i], cudaEventDisableTiming));
    }
    return m;
}

void cuda_model_free(CudaModel *m) {
    if (!m) return;
    cudaCheck(cudaStreamSynchronize(m->stream));
    stage_timer_print_and_free(m->timer);
    cudaCheck(cudaStreamDestroy(m->stream));
    if (m->offloaded > 0) {
        cudaCheck(cudaStreamSynchronize(m->copy_stream));
        for (int i = 0; i < 4 * m->offloaded; i++) cudaCheck(cudaEventDestroy(m->written[i]));
        free(m->written);
        cudaCheck(cudaStreamDestroy(m->copy_stream));
        cudaCheck(cudaFreeHost(m->host_residual));
    }
    cudaCheck(cudaFree(m->arena));
    cudaCheck(cudaFreeHost(m->host_losses));
    if (m->lora_u) cudaCheck(cudaFree(m->lora_u));
    if (m->lora_du) cudaCheck(cudaFree(m->lora_du));
    device_batch_host_free(&m->batch);
    free(m->residual);
    free(m->layers);
    param_offsets_free(&m->off);
    param_table_free(&m->table);
    free(m);
}

cudaStream_t cuda_model_stream(const CudaModel *m) { return m->stream; }

cudaStream_t cuda_model_copy_stream(const CudaModel *m) {
    return m->offloaded > 0 ? m->copy_stream : nullptr;
}

void cuda_model_set_deterministic(CudaModel *m, bool deterministic) {
    m->deterministic = deterministic;
}

void cuda_model_set_grads_ready(CudaModel *m, CudaGradsReady fn, void *ctx) {
    m->grads_ready = fn;
    m->grads_ready_ctx = ctx;
}

// grads[from, table total) are complete once the work queued so far has run.
static void grads_ready(CudaModel *m, size_t from) {
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, from, m->stream);
}

void cuda_model_set_weights_ready(CudaModel *m, CudaWeightsReady fn, void *ctx) {
    m->weights_ready = fn;
    m->weights_ready_ctx = ctx;
}

// The forward is about to read weights [from, to).
static void weights_ready(CudaModel *m, size_t from, size_t to) {
    if (m->weights_ready) m->weights_ready(m->weights_ready_ctx, from, to, m->stream);
}

size_t cuda_model_arena_bytes(const CudaModel *m) { return m->arena_bytes; }

void cuda_model_set_logit_chunk_rows(CudaModel *m, int rows) {
    m->chunk_rows = rows < 1 ? 1 : rows < m->chunk_capacity ? rows : m->chunk_capacity;
}

void cuda_model_set_mlp_tile_rows(CudaModel *m, int rows) {
    m->mlp_tile_rows = rows < 1 ? 1 : rows < m->mlp_tile_capacity ? rows : m->mlp_tile_capacity;
}

bool model_dims_cuda_supported(const ModelDims *d) {
    return d->head_dim == 64 || d->head_dim == 128;
}

// ---------------------------------------------------------------- the model

static void zero_async(CudaModel *m, void *p, size_t bytes) {
    cudaCheck(cudaMemsetAsync(p, 0, bytes, m->stream));
}

void cuda_model_set_lora(CudaModel *m, const LoraLayout *lora, const void *adapter_bf16,
                         float *adapter_grads) {
    CHECK(!lora || (lora->num_hidden_layers == m->cfg.num_hidden_layers && adapter_bf16),
          "cuda_model_set_lora: adapters of %d layers for a model of %d, or no adapter buffer",
          lora ? lora->num_hidden_layers : 0, m->cfg.num_hidden_layers);
    m->lora = lora;
    m->adapter = (const bf16 *)adapter_bf16;
    m->adapter_grads = adapter_grads;
    if (lora && lora->max_group * lora->cfg.r > m->lora_width) {
        cudaCheck(cudaStreamSynchronize(m->stream));  // the old scratch may be in use
        if (m->lora_u) cudaCheck(cudaFree(m->lora_u));
        if (m->lora_du) cudaCheck(cudaFree(m->lora_du));
        const size_t n = (size_t)m->max_rows * m->seq_len * lora->max_group * lora->cfg.r;
        cudaCheck(cudaMalloc(&m->lora_u, n * sizeof(bf16)));
        cudaCheck(cudaMalloc(&m->lora_du, n * sizeof(bf16)));
        m->lora_width = lora->max_group * lora->cfg.r;
    }
}

// A base tensor's gradient, or NULL when the base is frozen (grads NULL).
static float *grad_at(float *grads, size_t offset) { return grads ? grads + offset : nullptr; }

// Layer l's group g of adapters, or NULL when it has none.
static const LoraGroup *adapters_at(const CudaModel *m, int l, LoraGroupId g) {
    if (!m->lora) return nullptr;
    const LoraGroup *group = lora_group(m->lora, l, g);
    return group->n ? group : nullptr;
}

// out[T, :] (rows ld_out apart: the group's stacked output) += layer l's group-g adapters
// of x [T, in], if any.
static void lora_add(CudaModel *m, int l, LoraGroupId g, bf16 *out, int ld_out, const bf16 *x,
                     int T) {
    const LoraGroup *group = adapters_at(m, l, g);
    if (group) lora_forward_cuda(out, ld_out, m->lora_u, x, m->adapter, group, T, m->stream);
}

// Its backward from dout (rows ld_dout apart): the adapters' gradients, dx += their input
// gradient.
static void lora_grad(CudaModel *m, int l, LoraGroupId g, bf16 *dx, const bf16 *dout, int ld_dout,
                      const bf16 *x, int T) {
    const LoraGroup *group = adapters_at(m, l, g);
    if (!group) return;
    CHECK(m->adapter_grads, "LoRA backward without an adapter gradient buffer");
    lora_backward_cuda(dx, m->adapter_grads, m->lora_u, m->lora_du, dout, ld_dout, x, m->adapter,
                       group, T, m->stream);
}

// qk_norm: q_normed, k_normed = RoPE(q_norm(q)), RoPE(k_norm(k)) over each head's D
// values, from the layer's saved pre-norm q and k (q_rstd, k_rstd saved).
static void qk_norm_rope(CudaModel *m, const bf16 *params, const size_t *w,
                         const LayerActivations *a, int T) {
    const ModelConfig *cfg = &m->cfg;
    qk_norm_rope_forward_cuda(m->q_normed, m->k_normed, m->q_rstd, m->k_rstd, a->q, a->k,
                              params + w[W_Q_NORM], params + w[W_K_NORM], m->rope_cos_sin, T,
                              cfg->num_attention_heads, cfg->num_key_value_heads,
                              m->dims.head_dim, cfg->rms_norm_eps, m->stream);
}

// The attention inputs of a layer (after RoPE): its saved q, k, or with qk_norm the
// normed ones qk_norm_rope made.
static const bf16 *attention_q(const CudaModel *m, const LayerActivations *a) {
    return m->cfg.qk_norm ? m->q_normed : a->q;
}
static const bf16 *attention_k(const CudaModel *m, const LayerActivations *a) {
    return m->cfg.qk_norm ? m->k_normed : a->k;
}

// Layer a's gate|up product of the MLP tile from token t0: its own rows when kept, else
// the one tile buffer every layer shares.
static bf16 *mlp_gate_up(const CudaModel *m, const LayerActivations *a, int t0) {
    return a->gate_up ? a->gate_up + (size_t)t0 * 2 * m->cfg.intermediate_size : m->gate_up;
}

// Layer l's attention half from its input norm's output in m->ln (and input residual):
// q, k, v (with qk_norm the normed q and k), the attention output and lse, mid, and in
// m->ln the post-attention norm's output with ln2_rstd. again: the LAYER backward's
// recomputation (timed as one stage of its own).
static void layer_attention_forward(CudaModel *m, const bf16 *params, const ModelBatch *b, int l,
                                    bool again) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size;
    const int H = cfg->num_attention_heads, KV = cfg->num_key_value_heads, D = m->dims.head_dim;
    const int QKV = m->dims.qkv_dim;
    const AttnShape shape = model_attention_shape(cfg, &m->dims, b->n_rows, b->seq_len);
    const cudaStream_t s = m->stream;
    const size_t *w = m->off.layer + (size_t)l * LAYER_TENSORS;
    LayerActivations *a = &m->layers[l];
    const char *recomputing = "bwd layer recompute";
    {
        StageRange stage(m->timer, again ? recomputing : "fwd qkv matmul");
        matmul_forward_cuda(m->qkv, m->ln, params + w[W_Q], T, C, QKV, s);
        lora_add(m, l, LORA_GROUP_QKV, m->qkv, QKV, m->ln, T);
        // The q, k, v biases are consecutive in the table, as the weights are.
        if (cfg->attention_bias) bias_forward_cuda(m->qkv, params + w[W_Q_BIAS], T, QKV, s);
    }
    {
        StageRange stage(m->timer, again ? recomputing : "fwd rope");
        // With qk_norm the split only copies: RoPE follows the norms.
        rope_split_qkv_cuda(a->q, a->k, a->v, m->qkv, cfg->qk_norm ? nullptr : m->rope_cos_sin,
                            T, H, KV, D, s);
        if (cfg->qk_norm) qk_norm_rope(m, params, w, a, T);
    }
    {
        StageRange stage(m->timer, again ? recomputing : "fwd attention");
        attention_forward_cuda(&shape, &m->batch.mask, attention_q(m, a), attention_k(m, a),
                               a->v, a->attn, a->lse, s);
    }
    {
        StageRange stage(m->timer, again ? recomputing : "fwd o matmul");
        matmul_forward_cuda(m->proj_out, a->attn, params + w[W_O], T, m->dims.q_dim, C, s);
        lora_add(m, l, LORA_GROUP_O, m->proj_out, C, a->attn, T);
    }
    {
        StageRange stage(m->timer, again ? recomputing : "fwd add+norm");
        add_rmsnorm_forward_cuda(a->mid, m->ln, a->ln2_rstd, m->residual[l], m->proj_out,
                                 params + w[W_POST_NORM], T, C, cfg->rms_norm_eps, s);
    }
}

// ---- train.offload_activations: the layer inputs' copies (nothing when none is offloaded)

// residual[l]'s place on the host.
static bf16 *host_residual(const CudaModel *m, int l) {
    return m->host_residual + (size_t)l * m->max_rows * m->seq_len * m->cfg.hidden_size;
}

// Forward, before residual[l] is written: the slot's earlier input residual[l - ring]
// must have reached the host.
static void residual_slot_wait(CudaModel *m, int l) {
    const int earlier = l - m->ring;
    if (!m->to_host || earlier < 0 || earlier >= m->offloaded) return;
    StageRange stage(m->timer, "fwd offload wait");
    cudaCheck(cudaStreamWaitEvent(m->stream, m->copied[earlier], 0));
}

// Forward, once residual[l] (T tokens) is written: its copy to the host on copy_stream.
static void residual_to_host(CudaModel *m, int l, int T) {
    if (!m->to_host || l >= m->offloaded) return;
    cudaCheck(cudaEventRecord(m->written[l], m->stream));
    cudaCheck(cudaStreamWaitEvent(m->copy_stream, m->written[l], 0));
    cudaCheck(cudaMemcpyAsync(host_residual(m, l), m->residual[l],
                              (size_t)T * m->cfg.hidden_size * sizeof(bf16),
                              cudaMemcpyDeviceToHost, m->copy_stream));
    cudaCheck(cudaEventRecord(m->copied[l], m->copy_stream));
}

// Backward, as layer l's starts (layer l + 1's is queued, the last to read residual[l + 1]):
// residual[l + 1 - ring] back from the host into that slot on copy_stream, while layers
// l and l - 1 run.
static void residual_from_host(CudaModel *m, int l, int T) {
    const int j = l + 1 - m->ring;
    if (j < 0 || j >= m->offloaded) return;
    cudaCheck(cudaEventRecord(m->freed[j], m->stream));
    cudaCheck(cudaStreamWaitEvent(m->copy_stream, m->freed[j], 0));
    cudaCheck(cudaMemcpyAsync(m->residual[j], host_residual(m, j),
                              (size_t)T * m->cfg.hidden_size * sizeof(bf16),
                              cudaMemcpyHostToDevice, m->copy_stream));
    cudaCheck(cudaEventRecord(m->back[j], m->copy_stream));
}

// Backward, before layer l reads its input: the model's stream waits until it is back.
static void residual_back_wait(CudaModel *m, int l) {
    if (l >= m->offloaded) return;
    StageRange stage(m->timer, "bwd offload wait");
    cudaCheck(cudaStreamWaitEvent(m->stream, m->back[l], 0));
}

// Embedding and all layers up to the final norm; fills every saved activation. Each
// residual add is fused into the norm that follows it (the next layer's input norm,
// or the final norm after the last layer).
static void forward_body(CudaModel *m, const bf16 *params, const ModelBatch *b) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size, F = cfg->intermediate_size;
    const int D = m->dims.head_dim;
    const int L = cfg->num_hidden_layers;
    const cudaStream_t s = m->stream;

    weights_ready(m, m->off.embed, m->off.layer[W_INPUT_NORM] + C);  // the table's start
    {
        StageRange stage(m->timer, "fwd embedding+norm");
        rope_angles_cuda(m->rope_cos_sin, m->batch.pos, T, D, cfg->rope_theta, &cfg->rope_scaling,
                         s);
        embedding_forward_cuda(m->residual[0], m->batch.token, params + m->off.embed, T, C, s);
        rmsnorm_forward_cuda(m->ln, m->layers[0].ln1_rstd, m->residual[0],
                             params + m->off.layer[W_INPUT_NORM], T, C, cfg->rms_norm_eps, s);
    }
    residual_to_host(m, 0, T);
    for (int l = 0; l < L; l++) {
        const size_t *w = m->off.layer + (size_t)l * LAYER_TENSORS;
        LayerActivations *a = &m->layers[l];
        // The layer's tensors, and the next input norm (the final norm follows the last).
        weights_ready(m, w[W_INPUT_NORM],
                      (l + 1 == L ? m->off.final_norm : w[LAYER_TENSORS + W_INPUT_NORM]) + C);
        layer_attention_forward(m, params, b, l, false);
        // The MLP a tile of tokens at a time (one tile up to CUDA_MLP_TILE_ELEMENTS).
        for (int t0 = 0; t0 < T; t0 += m->mlp_tile_rows) {
            const int rows = T - t0 < m->mlp_tile_rows ? T - t0 : m->mlp_tile_rows;
            bf16 *gate_up = mlp_gate_up(m, a, t0);
            {
                StageRange stage(m->timer, "fwd gate_up matmul");
                matmul_forward_cuda(gate_up, m->ln + (size_t)t0 * C, params + w[W_GATE], rows, C,
                                    2 * F, s);
                lora_add(m, l, LORA_GROUP_GATE_UP, gate_up, 2 * F, m->ln + (size_t)t0 * C, rows);
            }
            {
                StageRange stage(m->timer, "fwd swiglu");
                swiglu_stacked_forward_cuda(m->act, gate_up, rows, F, s);
            }
            {
                StageRange stage(m->timer, "fwd down matmul");
                matmul_forward_cuda(m->proj_out + (size_t)t0 * C, m->act, params + w[W_DOWN], rows,
                                    F, C, s);
                lora_add(m, l, LORA_GROUP_DOWN, m->proj_out + (size_t)t0 * C, C, m->act, rows);
            }
        }
        const bool last = l + 1 == L;
        bf16 *next_norm = last ? m->final_norm : m->ln;
        float *next_rstd = last ? m->final_rstd : m->layers[l + 1].ln1_rstd;
        const bf16 *next_weight =
            params + (last ? m->off.final_norm : w[LAYER_TENSORS + W_INPUT_NORM]);
        residual_slot_wait(m, l + 1);
        {
            StageRange stage(m->timer, "fwd add+norm");
            add_rmsnorm_forward_cuda(m->residual[l + 1], next_norm, next_rstd, a->mid,
                                     m->proj_out, next_weight, T, C, cfg->rms_norm_eps, s);
        }
        residual_to_host(m, l + 1, T);
    }
}

// LM head and cross-entropy over the n_targets uploaded target slots, a chunk of rows
// at a time (slots without a target need no logits). Per-target losses go to
// target_losses. With backward, also writes d_normed (the gradient at the final norm
// output) and adds into the LM head's gradient (in grads; none when NULL: frozen).
static void loss_head(CudaModel *m, const bf16 *params, bool backward, float *grads,
                      const ModelBatch *b, int n_targets, float loss_scale) {
    const int T = b->n_rows * b->seq_len, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const bf16 *lm_head = params + m->off.lm_head;
    const cudaStream_t s = m->stream;
    weights_ready(m, m->off.lm_head, m->off.lm_head + (size_t)V * C);
    for (int start = 0; start < n_targets; start += m->chunk_rows) {
        const int rows = n_targets - start < m->chunk_rows ? n_targets - start : m->chunk_rows;
        const int32_t *slots = m->batch.target_slots + start;
        {
            StageRange stage(m->timer, "head matmul fwd");
            gather_rows_cuda(m->chunk_input, m->final_norm, slots, rows, C, s);
            matmul_forward_cuda(m->chunk_logits, m->chunk_input, lm_head, rows, C, V, s);
        }
        {
            StageRange stage(m->timer, "head cross-entropy");
            cross_entropy_forward_backward_cuda(
                m->target_losses + start, backward ? m->chunk_logits : nullptr, m->chunk_logits,
                m->batch.slot_targets + start, rows, V, loss_scale, s);
        }
        if (backward) {
            StageRange stage(m->timer, "head matmul bwd");
            // Before the first scatter: the rows without a target stay zero.
            if (start == 0) zero_async(m, m->d_normed, (size_t)T * C * sizeof(bf16));
            matmul_backward_overwrite_cuda(m->chunk_dinput, grad_at(grads, m->off.lm_head),
                                           m->chunk_logits, m->chunk_input, lm_head, rows, C, V,
                                           s);
            scatter_rows_cuda(m->d_normed, m->chunk_dinput, slots, rows, C, s);
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
    stage_timer_collect(m->timer);
    if (losses) memset(losses, 0, (size_t)b->n_rows * b->seq_len * sizeof(float));
    double total = 0.0;
    for (int i = 0; i < n_targets; i++) {
        total += m->host_losses[i];
        if (losses) losses[m->batch.host_slots[i]] = m->host_losses[i];
    }
    return total;
}

double cuda_model_forward(CudaModel *m, const void *params_bf16, const ModelBatch *b,
                          float *losses_host) {
    const bf16 *params = (const bf16 *)params_bf16;
    const int n_targets = device_batch_upload(&m->batch, b, &m->cfg, m->stream);
    forward_body(m, params, b);
    loss_head(m, params, false, nullptr, b, n_targets, 1.0f);
    return read_losses(m, b, n_targets, losses_host);
}

void cuda_model_logits(CudaModel *m, const void *params_bf16, const ModelBatch *b,
                       float *logits_host) {
    const bf16 *params = (const bf16 *)params_bf16;
    device_batch_upload(&m->batch, b, &m->cfg, m->stream);
    forward_body(m, params, b);
    const int T = b->n_rows * b->seq_len, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    bf16 *chunk = (bf16 *)xmalloc((size_t)m->chunk_rows * V * sizeof(bf16));  // [chunk_rows, V]
    weights_ready(m, m->off.lm_head, m->off.lm_head + (size_t)V * C);
    for (int start = 0; start < T; start += m->chunk_rows) {
        const int rows = T - start < m->chunk_rows ? T - start : m->chunk_rows;
        matmul_forward_cuda(m->chunk_logits, m->final_norm + (size_t)start * C,
                            params + m->off.lm_head, rows, C, V, m->stream);
        cudaCheck(cudaMemcpyAsync(chunk, m->chunk_logits, (size_t)rows * V * sizeof(bf16),
                                  cudaMemcpyDeviceToHost, m->stream));
        cudaCheck(cudaStreamSynchronize(m->stream));
        for (size_t i = 0; i < (size_t)rows * V; i++)
            logits_host[(size_t)start * V + i] = __bfloat162float(chunk[i]);
    }
    stage_timer_collect(m->timer);
    free(chunk);
}

// Walks the layers in reverse from d_normed (set by loss_head), adding into grads.
// Every d-input of a matmul is overwritten (beta 0), so only d_residual, which the
// norms' backwards accumulate into, needs zeroing.
static void backward(CudaModel *m, const bf16 *params, float *grads, const ModelBatch *b) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size, F = cfg->intermediate_size;
    const int H = cfg->num_attention_heads, KV = cfg->num_key_value_heads, D = m->dims.head_dim;
    const int L = cfg->num_hidden_layers, QKV = m->dims.qkv_dim;
    const AttnShape shape = model_attention_shape(cfg, &m->dims, b->n_rows, b->seq_len);
    const cudaStream_t s = m->stream;

    {
        StageRange stage(m->timer, "bwd norm");
        zero_async(m, m->d_residual, (size_t)T * C * sizeof(bf16));
        rmsnorm_backward_cuda(m->d_residual, grad_at(grads, m->off.final_norm), m->d_normed,
                              m->residual[L], params + m->off.final_norm, m->final_rstd, T, C, s);
    }
    // The table ends with the final norm and an untied LM head (model/params.c).
    grads_ready(m, m->off.final_norm);
    for (int l = L - 1; l >= 0; l--) {
        const size_t *w = m->off.layer + (size_t)l * LAYER_TENSORS;
        LayerActivations *a = &m->layers[l];
        residual_from_host(m, l, T);  // offloaded inputs: two layers ahead
        residual_back_wait(m, l);
        // LAYER: the layer's attention half again from its input residual, as the forward
        // ran it (ln1 as the forward's fused add+norm made it: the same kernel on the same
        // bf16 sum); this also leaves ln2 in m->ln and, with qk_norm, the normed q and k.
        // The last layer's block still holds what the forward left there.
        const bool layer_again = m->recompute == MODEL_RECOMPUTE_LAYER && l + 1 < L;
        if (layer_again) {
            {
                StageRange stage(m->timer, "bwd layer recompute");
                rmsnorm_forward_cuda(m->ln, a->ln1_rstd, m->residual[l],
                                     params + w[W_INPUT_NORM], T, C, cfg->rms_norm_eps, s);
            }
            layer_attention_forward(m, params, b, l, true);
        }
        // MLP block: residual[l+1] = mid + down(swiglu(gate(ln2), up(ln2))).
        // d_residual holds d residual[l+1], which is also the residual path's d mid.
        // Recompute ln2, then per MLP tile (the forward's tiles) gate|up (unless the layer
        // kept it) and the down_proj input; the weight gradients add tile by tile.
        if (!layer_again) {
            StageRange stage(m->timer, "bwd norm recompute");
            rmsnorm_forward_cuda(m->ln, a->ln2_rstd, a->mid, params + w[W_POST_NORM], T, C,
                                 cfg->rms_norm_eps, s);
        }
        for (int t0 = 0; t0 < T; t0 += m->mlp_tile_rows) {
            const int rows = T - t0 < m->mlp_tile_rows ? T - t0 : m->mlp_tile_rows;
            bf16 *gate_up = mlp_gate_up(m, a, t0);
            const bf16 *ln = m->ln + (size_t)t0 * C;
            if (!a->gate_up) {
                StageRange stage(m->timer, "bwd gate_up recompute");
                matmul_forward_cuda(gate_up, ln, params + w[W_GATE], rows, C, 2 * F, s);
                lora_add(m, l, LORA_GROUP_GATE_UP, gate_up, 2 * F, ln, rows);
            }
            {
                StageRange stage(m->timer, "bwd swiglu recompute");
                swiglu_stacked_forward_cuda(m->act, gate_up, rows, F, s);
            }
            {
                StageRange stage(m->timer, "bwd down matmul");
                matmul_backward_overwrite_cuda(m->d_act, grad_at(grads, w[W_DOWN]),
                                               m->d_residual + (size_t)t0 * C, m->act,
                                               params + w[W_DOWN], rows, F, C, s);
                lora_grad(m, l, LORA_GROUP_DOWN, m->d_act, m->d_residual + (size_t)t0 * C, C,
                          m->act, rows);
            }
            {
                StageRange stage(m->timer, "bwd swiglu");
                // In place: gate and up are not needed again.
                swiglu_stacked_backward_cuda(gate_up, m->d_act, gate_up, rows, F, s);
            }
            {
                StageRange stage(m->timer, "bwd gate_up matmul");
                matmul_backward_overwrite_cuda(m->d_normed + (size_t)t0 * C,
                                               grad_at(grads, w[W_GATE]), gate_up, ln,
                                               params + w[W_GATE], rows, C, 2 * F, s);
                lora_grad(m, l, LORA_GROUP_GATE_UP, m->d_normed + (size_t)t0 * C, gate_up, 2 * F,
                          ln, rows);
            }
        }
        {
            StageRange stage(m->timer, "bwd norm");
            rmsnorm_backward_cuda(m->d_residual, grad_at(grads, w[W_POST_NORM]), m->d_normed, a->mid,
                                  params + w[W_POST_NORM], a->ln2_rstd, T, C, s);
        }

        // Attention block: mid = residual[l] + o_proj(attention(rope(q), rope(k), v)).
        {
            StageRange stage(m->timer, "bwd o matmul");
            matmul_backward_overwrite_cuda(m->d_attn, grad_at(grads, w[W_O]), m->d_residual,
                                           a->attn, params + w[W_O], T, m->dims.q_dim, C, s);
            lora_grad(m, l, LORA_GROUP_O, m->d_attn, m->d_residual, C, a->attn, T);
        }
        if (cfg->qk_norm && !layer_again) {
            StageRange stage(m->timer, "bwd qk_norm recompute");
            qk_norm_rope(m, params, w, a, T);
        }
        {
            StageRange stage(m->timer, "bwd attention");
            attention_backward_cuda(&shape, &m->batch.mask, attention_q(m, a), attention_k(m, a),
                                    a->v, a->attn, a->lse, m->d_attn, m->d_q, m->d_k, m->d_v,
                                    m->deterministic, m->attn_workspace, s);
        }
        {
            StageRange stage(m->timer, "bwd rope");
            if (cfg->qk_norm) {
                qk_norm_rope_merge_qkv_backward_cuda(
                    m->qkv, grad_at(grads, w[W_Q_NORM]), grad_at(grads, w[W_K_NORM]), m->d_q,
                    m->d_k, m->d_v, a->q,
                    a->k, params + w[W_Q_NORM], params + w[W_K_NORM], m->q_rstd, m->k_rstd,
                    m->rope_cos_sin, T, H, KV, D, s);
            } else {
                rope_merge_qkv_backward_cuda(m->qkv, m->d_q, m->d_k, m->d_v, m->rope_cos_sin, T,
                                             H, KV, D, s);
            }
            if (cfg->attention_bias && grads)
                bias_backward_cuda(grads + w[W_Q_BIAS], m->qkv, T, QKV, s);
        }
        {
            StageRange stage(m->timer, "bwd norm recompute");  // ln1
            rmsnorm_forward_cuda(m->ln, a->ln1_rstd, m->residual[l], params + w[W_INPUT_NORM],
                                 T, C, cfg->rms_norm_eps, s);
        }
        {
            StageRange stage(m->timer, "bwd qkv matmul");
            matmul_backward_overwrite_cuda(m->d_normed, grad_at(grads, w[W_Q]), m->qkv, m->ln,
                                           params + w[W_Q], T, C, QKV, s);
            lora_grad(m, l, LORA_GROUP_QKV, m->d_normed, m->qkv, QKV, m->ln, T);
        }
        {
            StageRange stage(m->timer, "bwd norm");
            rmsnorm_backward_cuda(m->d_residual, grad_at(grads, w[W_INPUT_NORM]), m->d_normed,
                                  m->residual[l], params + w[W_INPUT_NORM], a->ln1_rstd, T, C,
                                  s);
        }
        grads_ready(m, w[W_INPUT_NORM]);  // a layer's first tensor in the table
    }
    {
        StageRange stage(m->timer, "bwd embedding");
        if (grads)
            embedding_backward_cuda(grads + m->off.embed, m->d_residual, m->batch.token, T, C, s);
    }
    grads_ready(m, 0);
}

double cuda_model_forward_backward(CudaModel *m, const void *params_bf16, float *grads,
                                   const ModelBatch *b, float loss_scale) {
    const bf16 *params = (const bf16 *)params_bf16;
    const int n_targets = device_batch_upload(&m->batch, b, &m->cfg, m->stream);
    m->to_host = m->offloaded > 0 && n_targets > 0;  // only a backward reads them again
    forward_body(m, params, b);
    m->to_host = false;
    loss_head(m, params, true, grads, b, n_targets, loss_scale);
    // Without targets the loss is 0 and every gradient exactly 0: nothing to add.
    if (n_targets > 0) backward(m, params, grads, b);
    return read_losses(m, b, n_targets, nullptr);
}
