// The parameter table: every tensor of the model at a fixed offset in one flat
// buffer, named and shaped as in HF checkpoints, and its deterministic init.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "common/check.h"
#include "model/model.h"

static void add_tensor(ParamTable *t, int *cap, int ndim, int64_t rows, int64_t cols,
                       bool is_norm, bool is_embedding, const char *fmt, int layer) {
    if (t->n_tensors == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        t->tensors = xrealloc(t->tensors, (size_t)*cap * sizeof(ParamTensor));
    }
    ParamTensor *p = &t->tensors[t->n_tensors++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), fmt, layer);
    p->ndim = ndim;
    p->shape[0] = rows;
    p->shape[1] = ndim == 2 ? cols : 0;
    p->numel = (size_t)rows * (size_t)(ndim == 2 ? cols : 1);
    p->offset = t->total;
    p->is_norm = is_norm;
    p->is_embedding = is_embedding;
    t->total += p->numel;
}

void param_table_build(const ModelConfig *cfg, ParamTable *out) {
    const ModelDims dims = model_dims(cfg);
    const int64_t V = cfg->vocab_size, C = cfg->hidden_size, F = cfg->intermediate_size;
    const int64_t q_dim = dims.q_dim, kv_dim = dims.kv_dim;
    memset(out, 0, sizeof(*out));
    int cap = 0;
    add_tensor(out, &cap, 2, V, C, false, true, "model.embed_tokens.weight", 0);
    for (int i = 0; i < cfg->num_hidden_layers; i++) {
        add_tensor(out, &cap, 1, C, 0, true, false, "model.layers.%d.input_layernorm.weight", i);
        add_tensor(out, &cap, 2, q_dim, C, false, false, "model.layers.%d.self_attn.q_proj.weight", i);
        add_tensor(out, &cap, 2, kv_dim, C, false, false, "model.layers.%d.self_attn.k_proj.weight", i);
        add_tensor(out, &cap, 2, kv_dim, C, false, false, "model.layers.%d.self_attn.v_proj.weight", i);
        add_tensor(out, &cap, 2, C, q_dim, false, false, "model.layers.%d.self_attn.o_proj.weight", i);
        add_tensor(out, &cap, 1, C, 0, true, false,
                   "model.layers.%d.post_attention_layernorm.weight", i);
        add_tensor(out, &cap, 2, F, C, false, false, "model.layers.%d.mlp.gate_proj.weight", i);
        add_tensor(out, &cap, 2, F, C, false, false, "model.layers.%d.mlp.up_proj.weight", i);
        add_tensor(out, &cap, 2, C, F, false, false, "model.layers.%d.mlp.down_proj.weight", i);
        if (cfg->attention_bias) {
            add_tensor(out, &cap, 1, q_dim, 0, false, false, "model.layers.%d.self_attn.q_proj.bias", i);
            add_tensor(out, &cap, 1, kv_dim, 0, false, false, "model.layers.%d.self_attn.k_proj.bias", i);
            add_tensor(out, &cap, 1, kv_dim, 0, false, false, "model.layers.%d.self_attn.v_proj.bias", i);
            for (int b = 1; b <= 3; b++) out->tensors[out->n_tensors - b].is_bias = true;
        }
        if (cfg->qk_norm) {
            add_tensor(out, &cap, 1, dims.head_dim, 0, true, false, "model.layers.%d.self_attn.q_norm.weight", i);
            add_tensor(out, &cap, 1, dims.head_dim, 0, true, false, "model.layers.%d.self_attn.k_norm.weight", i);
        }
    }
    add_tensor(out, &cap, 1, C, 0, true, false, "model.norm.weight", 0);
    if (!cfg->tie_word_embeddings) add_tensor(out, &cap, 2, V, C, false, true, "lm_head.weight", 0);
}

void param_table_free(ParamTable *t) {
    free(t->tensors);
    memset(t, 0, sizeof(*t));
}

const ParamTensor *param_table_find(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->n_tensors; i++)
        if (strcmp(t->tensors[i].name, name) == 0) return &t->tensors[i];
    return NULL;
}

// Uniform in (0, 1]: 53 random bits, never 0 (Box-Muller takes its log).
static double uniform_open0(uint64_t *state) {
    return ((double)(splitmix64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

void params_init(const ModelConfig *cfg, const ParamTable *t, uint64_t seed, float *params) {
    (void)cfg;  // shapes come from the table; kept for the shared signature
    const double stddev = 0.02;
    // Tensors in parallel: each has its own stream, so the values do not depend on the
    // threads (an 8B model's init takes seconds instead of minutes).
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < t->n_tensors; i++) {
        const ParamTensor *p = &t->tensors[i];
        float *w = params + p->offset;
        if (p->is_norm || p->is_bias) {
            for (size_t j = 0; j < p->numel; j++) w[j] = p->is_norm ? 1.0f : 0.0f;
            continue;
        }
        // One stream per tensor (seed and tensor index), so adding a tensor
        // elsewhere does not change the others.
        uint64_t state = seed ^ (0xD1B54A32D192ED03ULL * (uint64_t)(i + 1));
        for (size_t j = 0; j < p->numel; j += 2) {
            const double radius = sqrt(-2.0 * log(uniform_open0(&state)));
            const double angle = 6.283185307179586 * uniform_open0(&state);
            w[j] = (float)(stddev * radius * cos(angle));
            if (j + 1 < p->numel) w[j + 1] = (float)(stddev * radius * sin(angle));
        }
    }
}

void model_batch_check(const ModelBatch *b, const ModelConfig *cfg, int max_rows, int seq_len) {
    CHECK(b->n_rows > 0 && b->n_rows <= max_rows,
          "batch n_rows %d outside [1, %d] (the model's max_rows)", b->n_rows, max_rows);
    CHECK(b->seq_len == seq_len, "batch seq_len %d differs from the model's %d", b->seq_len,
          seq_len);
    CHECK(b->mask && b->mask->n_rows == b->n_rows && b->mask->seq_len == b->seq_len,
          "batch mask missing or not built for %d rows x %d", b->n_rows, b->seq_len);
    const int T = b->n_rows * b->seq_len, V = cfg->vocab_size;
    for (int n = 0; n < T; n++) {
        // Intervals are row slots; the tile builders and kernels index with them.
        CHECK(0 <= b->mask->lo[n] && b->mask->lo[n] <= b->mask->hi[n] &&
                  b->mask->hi[n] <= b->seq_len,
              "batch interval [%d, %d) at slot %d outside 0 <= lo <= hi <= %d", b->mask->lo[n],
              b->mask->hi[n], n, b->seq_len);
        CHECK(b->token[n] >= 0 && b->token[n] < V, "batch token %d at slot %d outside [0, %d)",
              b->token[n], n, V);
        CHECK(b->target[n] >= -1 && b->target[n] < V,
              "batch target %d at slot %d outside [-1, %d)", b->target[n], n, V);
        CHECK(b->pos[n] >= 0, "batch position %d at slot %d is negative", b->pos[n], n);
    }
}

void model_decode_check(const char *who, int n, const int32_t *slot, const int32_t *token,
                        const int32_t *pos, const ModelConfig *cfg, const int *length,
                        int max_seqs, int max_len) {
    CHECK(n >= 0, "%s: n %d is negative", who, n);
    int *adding = xcalloc((size_t)max_seqs, sizeof(int));  // [max_seqs] tokens this call appends
    for (int i = 0; i < n; i++) {
        CHECK(slot[i] >= 0 && slot[i] < max_seqs, "%s: token %d: slot %d outside [0, %d)", who, i,
              slot[i], max_seqs);
        CHECK(token[i] >= 0 && token[i] < cfg->vocab_size, "%s: token %d: id %d outside [0, %d)",
              who, i, token[i], cfg->vocab_size);
        CHECK(pos[i] >= 0, "%s: token %d: position %d is negative", who, i, pos[i]);
        adding[slot[i]]++;
    }
    for (int s = 0; s < max_seqs; s++)
        CHECK(length[s] + adding[s] <= max_len,
              "%s: sequence %d would hold %d + %d tokens, max_len is %d", who, s, length[s],
              adding[s], max_len);
    free(adding);
}

static const char *const LAYER_TENSOR_NAMES[LAYER_TENSORS] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
};

static size_t offset_of(const ParamTable *t, const char *name) {
    const ParamTensor *p = param_table_find(t, name);
    CHECK(p, "parameter %s missing from the table", name);
    return p->offset;
}

void param_offsets_resolve(const ModelConfig *cfg, const ParamTable *t, ParamOffsets *out) {
    const int L = cfg->num_hidden_layers;
    out->embed = offset_of(t, "model.embed_tokens.weight");
    out->final_norm = offset_of(t, "model.norm.weight");
    out->lm_head = cfg->tie_word_embeddings ? out->embed : offset_of(t, "lm_head.weight");
    out->layer = xmalloc((size_t)L * LAYER_TENSORS * sizeof(size_t));
    for (int l = 0; l < L; l++)
        for (int w = 0; w < LAYER_TENSORS; w++) {
            char name[96];
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, LAYER_TENSOR_NAMES[w]);
            const bool present = w < W_Q_BIAS || (w <= W_V_BIAS ? cfg->attention_bias : cfg->qk_norm);
            out->layer[l * LAYER_TENSORS + w] = present ? offset_of(t, name) : PARAM_ABSENT;
        }
}

void param_offsets_free(ParamOffsets *o) {
    free(o->layer);
    o->layer = NULL;
}
