// CPU fp32 reference of the Llama-family model (DESIGN.md §5): the oracle for the
// CUDA backend. Forward keeps the activations the backward needs (all of them with
// MODEL_RECOMPUTE_NONE; the backward recomputes the rest from what is kept, with the
// forward's own functions, so every mode gives the same bits); backward walks the
// layers in reverse, ADDING parameter gradients into the caller's buffer.
// T = n_rows * seq_len tokens, C hidden, F intermediate, V vocab, H query heads,
// KV key/value heads, D head dim (ModelDims).
#include <string.h>
#include "attention/attention.h"
#include "common/check.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/ops.h"


// Activations of one layer saved by the forward for the backward. MODEL_RECOMPUTE_MLP:
// gate, up, act are one set of buffers every layer shares; MODEL_RECOMPUTE_LAYER: every
// layer's struct points at the same one block, which the backward refills per layer.
typedef struct {
    float *ln1;       // [T, C] input_layernorm output
    float *ln1_rstd;  // [T]
    float *q;         // [T, H, D] after RoPE
    float *k;         // [T, KV, D] after RoPE
    float *q_raw;     // [T, H, D] q_proj output (+ bias) before q_norm (qk_norm only)
    float *k_raw;     // [T, KV, D] the same for k
    float *q_rstd;    // [T, H] q_norm's saved 1/rms (qk_norm only)
    float *k_rstd;    // [T, KV]
    float *v;         // [T, KV, D]
    float *attn;      // [T, H, D] attention output (o_proj input)
    float *lse;       // [n_rows, H, seq_len] attention log-sum-exp
    float *mid;       // [T, C] residual after attention
    float *ln2;       // [T, C] post_attention_layernorm output
    float *ln2_rstd;  // [T]
    float *gate;      // [T, F] gate_proj output
    float *up;        // [T, F] up_proj output
    float *act;       // [T, F] silu(gate) * up (down_proj input)
} LayerActivations;

struct CpuModel {
    ModelConfig cfg;
    ParamTable table;
    ModelDims dims;
    int max_rows, seq_len;
    ModelRecompute recompute;
    int chunk_capacity, chunk_rows;  // logit rows allocated / used per chunk
    ParamOffsets off;  // tensor offsets in the flat parameter/gradient buffers
    float **allocations;    // every buffer below, for cpu_model_free
    int n_allocations, allocations_cap;

    // forward
    float **residual;          // [L + 1] each [T, C]: residual[l] enters layer l
    LayerActivations *layers;  // [L]
    float *final_norm;         // [T, C] model.norm output
    float *final_rstd;         // [T]
    float *proj_out;           // [T, C] o_proj / down_proj output before the residual add
    // loss head, one chunk of target rows at a time
    int32_t *target_slots;  // [T] slots (row * seq_len + position) that have a target
    float *chunk_input;     // [chunk_rows, C] final_norm rows of the chunk
    float *chunk_logits;    // [chunk_rows, V] logits, then dlogits in place
    float *chunk_dinput;    // [chunk_rows, C]
    float *chunk_losses;    // [chunk_rows]
    int32_t *chunk_targets; // [chunk_rows]
    // backward
    float *d_residual;  // [T, C] gradient of the residual stream at the current depth
    float *d_normed;    // [T, C] gradient of a norm output (final, ln1, ln2)
    float *d_attn;      // [T, H, D]
    float *d_q;         // [T, H, D]
    float *d_k, *d_v;   // [T, KV, D]
    float *d_q_raw;     // [T, H, D] gradient before q_norm (qk_norm only)
    float *d_k_raw;     // [T, KV, D]
    float *d_act;       // [T, F]
    float *d_gate;      // [T, F]
    float *d_up;        // [T, F]
    // LoRA (model/lora.h): the adapters of the next calls, NULL without
    const LoraLayout *lora;
    const float *adapter;   // [lora->table.total]
    float *adapter_grads;   // [lora->table.total]; gradients accumulate here
    float *lora_u, *lora_du;  // [T, lora_rank] scratch
    int lora_rank;            // the rank the scratch holds
};

static float *alloc_floats(CpuModel *m, size_t n) {
    float *p = xmalloc(n * sizeof(float));
    ARRAY_PUSH(m->allocations, m->n_allocations, m->allocations_cap, p);
    return p;
}

CpuModel *cpu_model_create(const ModelConfig *cfg, int max_rows, int seq_len,
                           ModelRecompute recompute) {
    CHECK(max_rows > 0 && seq_len > 0,
          "cpu_model_create: max_rows %d and seq_len %d must be positive", max_rows, seq_len);
    CpuModel *m = xcalloc(1, sizeof(CpuModel));
    m->cfg = *cfg;
    m->dims = model_dims(cfg);
    param_table_build(cfg, &m->table);
    m->max_rows = max_rows;
    m->seq_len = seq_len;
    CHECK(model_recompute_name(recompute)[0] != '?', "cpu_model_create: recompute mode %d",
          (int)recompute);
    m->recompute = recompute;

    const int L = cfg->num_hidden_layers;
    param_offsets_resolve(cfg, &m->table, &m->off);

    const size_t T = (size_t)max_rows * seq_len, C = cfg->hidden_size,
                 F = cfg->intermediate_size, V = cfg->vocab_size;
    const size_t QD = m->dims.q_dim, KVD = m->dims.kv_dim, H = cfg->num_attention_heads;
    m->residual = xmalloc((size_t)(L + 1) * sizeof(float *));
    for (int l = 0; l <= L; l++) m->residual[l] = alloc_floats(m, T * C);
    m->layers = xcalloc((size_t)L, sizeof(LayerActivations));
    const int blocks = recompute == MODEL_RECOMPUTE_LAYER ? 1 : L;
    float *shared_gate = NULL, *shared_up = NULL, *shared_act = NULL;
    if (recompute == MODEL_RECOMPUTE_MLP) {
        shared_gate = alloc_floats(m, T * F);
        shared_up = alloc_floats(m, T * F);
        shared_act = alloc_floats(m, T * F);
    }
    for (int l = 0; l < blocks; l++) {
        LayerActivations *a = &m->layers[l];
        a->ln1 = alloc_floats(m, T * C);
        a->ln1_rstd = alloc_floats(m, T);
        a->q = alloc_floats(m, T * QD);
        a->k = alloc_floats(m, T * KVD);
        a->v = alloc_floats(m, T * KVD);
        if (cfg->qk_norm) {
            a->q_raw = alloc_floats(m, T * QD);
            a->k_raw = alloc_floats(m, T * KVD);
            a->q_rstd = alloc_floats(m, T * H);
            a->k_rstd = alloc_floats(m, T * cfg->num_key_value_heads);
        }
        a->attn = alloc_floats(m, T * QD);
        a->lse = alloc_floats(m, T * H);
        a->mid = alloc_floats(m, T * C);
        a->ln2 = alloc_floats(m, T * C);
        a->ln2_rstd = alloc_floats(m, T);
        a->gate = shared_gate ? shared_gate : alloc_floats(m, T * F);
        a->up = shared_up ? shared_up : alloc_floats(m, T * F);
        a->act = shared_act ? shared_act : alloc_floats(m, T * F);
    }
    for (int l = blocks; l < L; l++) m->layers[l] = m->layers[0];
    m->final_norm = alloc_floats(m, T * C);
    m->final_rstd = alloc_floats(m, T);
    m->proj_out = alloc_floats(m, T * C);

    size_t chunk = CPU_LOGIT_CHUNK_ELEMENTS / V;
    if (chunk < 1) chunk = 1;
    if (chunk > T) chunk = T;
    m->chunk_capacity = m->chunk_rows = (int)chunk;
    m->target_slots = xmalloc(T * sizeof(int32_t));
    m->chunk_input = alloc_floats(m, chunk * C);
    m->chunk_logits = alloc_floats(m, chunk * V);
    m->chunk_dinput = alloc_floats(m, chunk * C);
    m->chunk_losses = alloc_floats(m, chunk);
    m->chunk_targets = xmalloc(chunk * sizeof(int32_t));

    m->d_residual = alloc_floats(m, T * C);
    m->d_normed = alloc_floats(m, T * C);
    m->d_attn = alloc_floats(m, T * QD);
    m->d_q = alloc_floats(m, T * QD);
    m->d_k = alloc_floats(m, T * KVD);
    m->d_v = alloc_floats(m, T * KVD);
    if (cfg->qk_norm) {
        m->d_q_raw = alloc_floats(m, T * QD);
        m->d_k_raw = alloc_floats(m, T * KVD);
    }
    m->d_act = alloc_floats(m, T * F);
    m->d_gate = alloc_floats(m, T * F);
    m->d_up = alloc_floats(m, T * F);
    return m;
}

void cpu_model_free(CpuModel *m) {
    if (!m) return;
    for (int i = 0; i < m->n_allocations; i++) free(m->allocations[i]);
    free(m->allocations);
    free(m->residual);
    free(m->layers);
    param_offsets_free(&m->off);
    free(m->target_slots);
    free(m->chunk_targets);
    param_table_free(&m->table);
    free(m);
}

void cpu_model_set_logit_chunk_rows(CpuModel *m, int rows) {
    m->chunk_rows = rows < 1 ? 1 : rows < m->chunk_capacity ? rows : m->chunk_capacity;
}

static void add_arrays(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void zero_floats(float *x, size_t n) { memset(x, 0, n * sizeof(float)); }

// A base tensor's gradient, or NULL when the base is frozen (grads NULL).
static float *grad_at(float *grads, size_t offset) { return grads ? grads + offset : NULL; }

void cpu_model_set_lora(CpuModel *m, const LoraLayout *lora, const float *adapter,
                        float *adapter_grads) {
    CHECK(!lora || (lora->num_hidden_layers == m->cfg.num_hidden_layers && adapter),
          "cpu_model_set_lora: adapters of %d layers for a model of %d, or no adapter buffer",
          lora ? lora->num_hidden_layers : 0, m->cfg.num_hidden_layers);
    m->lora = lora;
    m->adapter = adapter;
    m->adapter_grads = adapter_grads;
    if (lora && lora->cfg.r > m->lora_rank) {
        const size_t T = (size_t)m->max_rows * m->seq_len;
        m->lora_u = alloc_floats(m, T * lora->cfg.r);
        m->lora_du = alloc_floats(m, T * lora->cfg.r);
        m->lora_rank = lora->cfg.r;
    }
}

// The adapter of layer l's tensor w (a LayerTensor), alone (the CPU model's projections
// write separate outputs); n = 0 when none.
static LoraGroup adapter_of(const CpuModel *m, int l, int w) {
    if (m->lora)
        for (int t = 0; t < LORA_TARGETS; t++)
            if ((int)lora_target_tensor((LoraTarget)t) == w)
                return lora_target_group(m->lora, l, (LoraTarget)t);
    return (LoraGroup){0};
}

// out[T, OC] = x W^T for layer l's projection w, plus its adapter's s (x A^T) B^T.
static void linear_forward(CpuModel *m, const float *params, int l, int w, float *out,
                           const float *x, int T, int IC, int OC) {
    const size_t *off = m->off.layer + (size_t)l * LAYER_TENSORS;
    matmul_forward_cpu(out, x, params + off[w], T, IC, OC);
    const LoraGroup g = adapter_of(m, l, w);
    if (g.n) lora_forward_cpu(out, OC, m->lora_u, x, m->adapter, &g, T);
}

// linear_forward's backward from dout: dx += (skipped when NULL), the base weight's
// gradient (none when grads is NULL: frozen) and the adapter's.
static void linear_backward(CpuModel *m, const float *params, float *grads, int l, int w,
                            float *dx, const float *dout, const float *x, int T, int IC, int OC) {
    const size_t *off = m->off.layer + (size_t)l * LAYER_TENSORS;
    matmul_backward_cpu(dx, grad_at(grads, off[w]), dout, x, params + off[w], T, IC, OC);
    const LoraGroup g = adapter_of(m, l, w);
    if (!g.n) return;
    CHECK(m->adapter_grads, "LoRA backward without an adapter gradient buffer");
    lora_backward_cpu(dx, m->adapter_grads, m->lora_u, m->lora_du, dout, OC, x, m->adapter, &g,
                      T);
}

// q, k, v of one layer from its ln1 output: the projections, their biases
// (attention_bias), q_norm/k_norm over each head (qk_norm), RoPE on q and k.
static void attention_inputs(CpuModel *m, const float *params, const size_t *w, int l,
                             LayerActivations *a, const ModelBatch *b) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size;
    const int H = cfg->num_attention_heads, KV = cfg->num_key_value_heads, D = m->dims.head_dim;
    float *q = cfg->qk_norm ? a->q_raw : a->q, *k = cfg->qk_norm ? a->k_raw : a->k;
    linear_forward(m, params, l, W_Q, q, a->ln1, T, C, m->dims.q_dim);
    linear_forward(m, params, l, W_K, k, a->ln1, T, C, m->dims.kv_dim);
    linear_forward(m, params, l, W_V, a->v, a->ln1, T, C, m->dims.kv_dim);
    if (cfg->attention_bias) {
        bias_forward_cpu(q, params + w[W_Q_BIAS], T, m->dims.q_dim);
        bias_forward_cpu(k, params + w[W_K_BIAS], T, m->dims.kv_dim);
        bias_forward_cpu(a->v, params + w[W_V_BIAS], T, m->dims.kv_dim);
    }
    if (cfg->qk_norm) {
        rmsnorm_forward_cpu(a->q, a->q_rstd, q, params + w[W_Q_NORM], T * H, D, cfg->rms_norm_eps);
        rmsnorm_forward_cpu(a->k, a->k_rstd, k, params + w[W_K_NORM], T * KV, D,
                            cfg->rms_norm_eps);
    }
    rope_forward_cpu(a->q, b->pos, T, H, D, cfg->rope_theta, &cfg->rope_scaling);
    rope_forward_cpu(a->k, b->pos, T, KV, D, cfg->rope_theta, &cfg->rope_scaling);
}

// Backward of attention_inputs from m->d_q, d_k, d_v (attention's input gradients; RoPE
// is undone in place): adds the norm and bias gradients and points *d_q, *d_k at the
// gradients of the q_proj and k_proj outputs (d_v's is m->d_v).
static void attention_inputs_backward(CpuModel *m, const float *params, float *grads,
                                      const size_t *w, const LayerActivations *a,
                                      const ModelBatch *b, const float **d_q, const float **d_k) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len;
    const int H = cfg->num_attention_heads, KV = cfg->num_key_value_heads, D = m->dims.head_dim;
    rope_backward_cpu(m->d_q, b->pos, T, H, D, cfg->rope_theta, &cfg->rope_scaling);
    rope_backward_cpu(m->d_k, b->pos, T, KV, D, cfg->rope_theta, &cfg->rope_scaling);
    *d_q = m->d_q;
    *d_k = m->d_k;
    if (cfg->qk_norm) {
        zero_floats(m->d_q_raw, (size_t)T * m->dims.q_dim);
        zero_floats(m->d_k_raw, (size_t)T * m->dims.kv_dim);
        rmsnorm_backward_cpu(m->d_q_raw, grad_at(grads, w[W_Q_NORM]), m->d_q, a->q_raw,
                             params + w[W_Q_NORM], a->q_rstd, T * H, D);
        rmsnorm_backward_cpu(m->d_k_raw, grad_at(grads, w[W_K_NORM]), m->d_k, a->k_raw,
                             params + w[W_K_NORM], a->k_rstd, T * KV, D);
        *d_q = m->d_q_raw;
        *d_k = m->d_k_raw;
    }
    if (cfg->attention_bias && grads) {
        bias_backward_cpu(grads + w[W_Q_BIAS], *d_q, T, m->dims.q_dim);
        bias_backward_cpu(grads + w[W_K_BIAS], *d_k, T, m->dims.kv_dim);
        bias_backward_cpu(grads + w[W_V_BIAS], m->d_v, T, m->dims.kv_dim);
    }
}

void cpu_mlp_forward(const float *params, const size_t *w, const float *x, float *gate, float *up,
                     float *act, float *out, int T, int C, int F) {
    matmul_forward_cpu(gate, x, params + w[W_GATE], T, C, F);
    matmul_forward_cpu(up, x, params + w[W_UP], T, C, F);
    swiglu_forward_cpu(act, gate, up, (int64_t)T * F);
    matmul_forward_cpu(out, act, params + w[W_DOWN], T, F, C);
}

// Layer l's attention block and post-attention norm from its input residual[l]: ln1,
// q, k, v, the attention output and lse, mid and ln2 (the forward, and the LAYER
// backward's recomputation).
static void layer_attention_forward(CpuModel *m, const float *params, const ModelBatch *b,
                                    int l) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size;
    const AttnShape shape = model_attention_shape(cfg, &m->dims, b->n_rows, b->seq_len);
    const size_t *w = m->off.layer + (size_t)l * LAYER_TENSORS;
    LayerActivations *a = &m->layers[l];
    const float *x = m->residual[l];
    rmsnorm_forward_cpu(a->ln1, a->ln1_rstd, x, params + w[W_INPUT_NORM], T, C,
                        cfg->rms_norm_eps);
    attention_inputs(m, params, w, l, a, b);
    attention_forward_cpu(&shape, b->mask, a->q, a->k, a->v, a->attn, a->lse);
    linear_forward(m, params, l, W_O, m->proj_out, a->attn, T, m->dims.q_dim, C);
    add_arrays(a->mid, x, m->proj_out, (size_t)T * C);
    rmsnorm_forward_cpu(a->ln2, a->ln2_rstd, a->mid, params + w[W_POST_NORM], T, C,
                        cfg->rms_norm_eps);
}

// Layer l's MLP up to the down_proj input: gate, up and act from ln2 (cpu_mlp_forward's
// first steps; the forward, and the recomputation of MLP and LAYER).
static void layer_mlp_up_forward(CpuModel *m, const float *params, int T, int l) {
    const int C = m->cfg.hidden_size, F = m->cfg.intermediate_size;
    LayerActivations *a = &m->layers[l];
    linear_forward(m, params, l, W_GATE, a->gate, a->ln2, T, C, F);
    linear_forward(m, params, l, W_UP, a->up, a->ln2, T, C, F);
    swiglu_forward_cpu(a->act, a->gate, a->up, (int64_t)T * F);
}

// Embedding and all layers up to the final norm; fills every saved activation.
static void forward_body(CpuModel *m, const float *params, const ModelBatch *b) {
    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size, F = cfg->intermediate_size;

    embedding_forward_cpu(m->residual[0], b->token, params + m->off.embed, T, C);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        const LayerActivations *a = &m->layers[l];
        layer_attention_forward(m, params, b, l);
        layer_mlp_up_forward(m, params, T, l);
        linear_forward(m, params, l, W_DOWN, m->proj_out, a->act, T, F, C);
        add_arrays(m->residual[l + 1], a->mid, m->proj_out, (size_t)T * C);
    }
    rmsnorm_forward_cpu(m->final_norm, m->final_rstd, m->residual[cfg->num_hidden_layers],
                        params + m->off.final_norm, T, C, cfg->rms_norm_eps);
}

// LM head and cross-entropy over the slots that have a target, a chunk of rows
// at a time (slots without a target need no logits). With backward, also writes
// d_normed (the gradient at the final norm output) and adds into the LM head's
// gradient (in grads; none when NULL: frozen). losses (optional): [T], 0 where there is
// no target.
static double loss_head(CpuModel *m, const float *params, bool backward, float *grads,
                        const ModelBatch *b, float loss_scale, float *losses) {
    const int T = b->n_rows * b->seq_len, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const float *lm_head = params + m->off.lm_head;
    int n_targets = 0;
    for (int n = 0; n < T; n++)
        if (b->target[n] >= 0) m->target_slots[n_targets++] = n;
    if (losses) zero_floats(losses, (size_t)T);
    if (backward) zero_floats(m->d_normed, (size_t)T * C);

    double total = 0.0;
    for (int start = 0; start < n_targets; start += m->chunk_rows) {
        const int rows = n_targets - start < m->chunk_rows ? n_targets - start : m->chunk_rows;
        const int32_t *slots = m->target_slots + start;
        for (int r = 0; r < rows; r++) {
            memcpy(m->chunk_input + (size_t)r * C, m->final_norm + (size_t)slots[r] * C,
                   (size_t)C * sizeof(float));
            m->chunk_targets[r] = b->target[slots[r]];
        }
        matmul_forward_cpu(m->chunk_logits, m->chunk_input, lm_head, rows, C, V);
        total += cross_entropy_forward_backward_cpu(m->chunk_losses, backward ? m->chunk_logits : NULL,
                                                    m->chunk_logits, m->chunk_targets, rows, V,
                                                    loss_scale);
        if (losses)
            for (int r = 0; r < rows; r++) losses[slots[r]] = m->chunk_losses[r];
        if (backward) {
            zero_floats(m->chunk_dinput, (size_t)rows * C);
            matmul_backward_cpu(m->chunk_dinput, grad_at(grads, m->off.lm_head), m->chunk_logits,
                                m->chunk_input, lm_head, rows, C, V);
            for (int r = 0; r < rows; r++)
                memcpy(m->d_normed + (size_t)slots[r] * C, m->chunk_dinput + (size_t)r * C,
                       (size_t)C * sizeof(float));
        }
    }
    return total;
}

double cpu_model_forward(CpuModel *m, const float *params, const ModelBatch *b, float *losses) {
    model_batch_check(b, &m->cfg, m->max_rows, m->seq_len);
    forward_body(m, params, b);
    return loss_head(m, params, false, NULL, b, 1.0f, losses);
}

void cpu_model_logits(CpuModel *m, const float *params, const ModelBatch *b, float *logits) {
    model_batch_check(b, &m->cfg, m->max_rows, m->seq_len);
    forward_body(m, params, b);
    matmul_forward_cpu(logits, m->final_norm, params + m->off.lm_head, b->n_rows * b->seq_len,
                       m->cfg.hidden_size, m->cfg.vocab_size);
}

double cpu_model_forward_backward(CpuModel *m, const float *params, float *grads,
                                  const ModelBatch *b, float loss_scale) {
    model_batch_check(b, &m->cfg, m->max_rows, m->seq_len);
    forward_body(m, params, b);
    const double total = loss_head(m, params, true, grads, b, loss_scale, NULL);

    const ModelConfig *cfg = &m->cfg;
    const int T = b->n_rows * b->seq_len, C = cfg->hidden_size, F = cfg->intermediate_size;
    const int L = cfg->num_hidden_layers;
    const AttnShape shape = model_attention_shape(cfg, &m->dims, b->n_rows, b->seq_len);

    zero_floats(m->d_residual, (size_t)T * C);
    rmsnorm_backward_cpu(m->d_residual, grad_at(grads, m->off.final_norm), m->d_normed,
                         m->residual[L],
                         params + m->off.final_norm, m->final_rstd, T, C);
    for (int l = L - 1; l >= 0; l--) {
        const size_t *w = m->off.layer + (size_t)l * LAYER_TENSORS;
        const LayerActivations *a = &m->layers[l];
        // What the forward did not keep, from what it kept: the same calls on the same
        // inputs, so the same bits. The shared buffers still hold the last layer's.
        if (m->recompute == MODEL_RECOMPUTE_LAYER && l + 1 < L)
            layer_attention_forward(m, params, b, l);
        if (m->recompute != MODEL_RECOMPUTE_NONE && l + 1 < L) layer_mlp_up_forward(m, params, T, l);
        // MLP block: residual[l+1] = mid + down(swiglu(gate(ln2), up(ln2))).
        // d_residual holds d residual[l+1], which is also the residual path's d mid.
        zero_floats(m->d_act, (size_t)T * F);
        linear_backward(m, params, grads, l, W_DOWN, m->d_act, m->d_residual, a->act, T, F, C);
        swiglu_backward_cpu(m->d_gate, m->d_up, m->d_act, a->gate, a->up, (int64_t)T * F);
        zero_floats(m->d_normed, (size_t)T * C);
        linear_backward(m, params, grads, l, W_GATE, m->d_normed, m->d_gate, a->ln2, T, C, F);
        linear_backward(m, params, grads, l, W_UP, m->d_normed, m->d_up, a->ln2, T, C, F);
        rmsnorm_backward_cpu(m->d_residual, grad_at(grads, w[W_POST_NORM]), m->d_normed, a->mid,
                             params + w[W_POST_NORM], a->ln2_rstd, T, C);

        // Attention block: mid = residual[l] + o_proj(attention(rope(q), rope(k), v)).
        zero_floats(m->d_attn, (size_t)T * m->dims.q_dim);
        linear_backward(m, params, grads, l, W_O, m->d_attn, m->d_residual, a->attn, T,
                        m->dims.q_dim, C);
        attention_backward_cpu(&shape, b->mask, a->q, a->k, a->v, a->attn, a->lse,
                               m->d_attn, m->d_q, m->d_k, m->d_v);
        const float *d_q, *d_k;
        attention_inputs_backward(m, params, grads, w, a, b, &d_q, &d_k);
        zero_floats(m->d_normed, (size_t)T * C);
        linear_backward(m, params, grads, l, W_Q, m->d_normed, d_q, a->ln1, T, C, m->dims.q_dim);
        linear_backward(m, params, grads, l, W_K, m->d_normed, d_k, a->ln1, T, C, m->dims.kv_dim);
        linear_backward(m, params, grads, l, W_V, m->d_normed, m->d_v, a->ln1, T, C,
                        m->dims.kv_dim);
        rmsnorm_backward_cpu(m->d_residual, grad_at(grads, w[W_INPUT_NORM]), m->d_normed,
                             m->residual[l],
                             params + w[W_INPUT_NORM], a->ln1_rstd, T, C);
    }
    if (grads) embedding_backward_cpu(grads + m->off.embed, m->d_residual, b->token, T, C);
    return total;
}
