// CPU fp32 KV-cache decoder (model/decode.h). The layer math is model_cpu.c's through
// the same ops (model/ops.h); only attention differs: each new token's query reads its
// slot's cached keys and values instead of a packed row under a mask.
// n = tokens of one call, C hidden, F intermediate, V vocab, H query heads, KV key/value
// heads, D head dim, S = max_seqs, M = max_len.
#include "model/decode.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "model/ops.h"

struct CpuDecoder {
    ModelConfig cfg;
    ModelDims dims;
    ParamTable table;
    ParamOffsets off;
    int max_seqs, max_len;
    int *length;       // [S] tokens cached per slot
    float **k_cache;   // [L] each [S, M, KV, D], after RoPE
    float **v_cache;   // [L] each [S, M, KV, D]
    // Scratch for one call, grown to the largest n seen.
    int capacity;
    int32_t *cache_idx;  // [n] where token i sits in its slot's cache
    float *x;            // [n, C] residual stream
    float *normed;       // [n, C] a norm's output
    float *rstd;         // [n * H] rmsnorm's 1/rms (unused here, the ops write it)
    float *q, *k, *v;    // [n, H*D], [n, KV*D], [n, KV*D]
    float *q_raw, *k_raw;  // [n, H*D], [n, KV*D] before q_norm / k_norm (qk_norm only)
    float *attn;         // [n, H*D]
    float *proj;         // [n, C]
    float *gate, *up;    // [n, F]
};

CpuDecoder *cpu_decoder_create(const ModelConfig *cfg, int max_seqs, int max_len) {
    CHECK(max_seqs > 0 && max_len > 0, "cpu_decoder_create: max_seqs %d and max_len %d must be "
          "positive", max_seqs, max_len);
    CpuDecoder *d = xcalloc(1, sizeof *d);
    d->cfg = *cfg;
    d->dims = model_dims(cfg);
    param_table_build(cfg, &d->table);
    param_offsets_resolve(cfg, &d->table, &d->off);
    d->max_seqs = max_seqs;
    d->max_len = max_len;
    d->length = xcalloc((size_t)max_seqs, sizeof(int));
    const int L = cfg->num_hidden_layers;
    const size_t cache = (size_t)max_seqs * max_len * d->dims.kv_dim;
    d->k_cache = xmalloc((size_t)L * sizeof(float *));
    d->v_cache = xmalloc((size_t)L * sizeof(float *));
    for (int l = 0; l < L; l++) {
        d->k_cache[l] = xmalloc(cache * sizeof(float));
        d->v_cache[l] = xmalloc(cache * sizeof(float));
    }
    return d;
}

static void free_scratch(CpuDecoder *d) {
    free(d->cache_idx), free(d->x), free(d->normed), free(d->rstd), free(d->q), free(d->k);
    free(d->v), free(d->q_raw), free(d->k_raw), free(d->attn), free(d->proj), free(d->gate);
    free(d->up);
}

void cpu_decoder_free(CpuDecoder *d) {
    if (!d) return;
    for (int l = 0; l < d->cfg.num_hidden_layers; l++) free(d->k_cache[l]), free(d->v_cache[l]);
    free(d->k_cache), free(d->v_cache), free(d->length);
    free_scratch(d);
    param_offsets_free(&d->off);
    param_table_free(&d->table);
    free(d);
}

void cpu_decoder_reset(CpuDecoder *d, int slot) {
    CHECK(slot >= 0 && slot < d->max_seqs, "cpu_decoder_reset: slot %d outside [0, %d)", slot,
          d->max_seqs);
    d->length[slot] = 0;
}

int cpu_decoder_length(const CpuDecoder *d, int slot) {
    CHECK(slot >= 0 && slot < d->max_seqs, "cpu_decoder_length: slot %d outside [0, %d)", slot,
          d->max_seqs);
    return d->length[slot];
}

static void ensure_capacity(CpuDecoder *d, int n) {
    if (n <= d->capacity) return;
    free_scratch(d);
    const size_t N = (size_t)n, C = d->cfg.hidden_size, F = d->cfg.intermediate_size;
    const size_t QD = d->dims.q_dim, KVD = d->dims.kv_dim;
    d->cache_idx = xmalloc(N * sizeof(int32_t));
    d->x = xmalloc(N * C * sizeof(float));
    d->normed = xmalloc(N * C * sizeof(float));
    d->rstd = xmalloc(N * (size_t)d->cfg.num_attention_heads * sizeof(float));
    d->q = xmalloc(N * QD * sizeof(float));
    d->k = xmalloc(N * KVD * sizeof(float));
    d->v = xmalloc(N * KVD * sizeof(float));
    d->q_raw = d->cfg.qk_norm ? xmalloc(N * QD * sizeof(float)) : NULL;
    d->k_raw = d->cfg.qk_norm ? xmalloc(N * KVD * sizeof(float)) : NULL;
    d->attn = xmalloc(N * QD * sizeof(float));
    d->proj = xmalloc(N * C * sizeof(float));
    d->gate = xmalloc(N * F * sizeof(float));
    d->up = xmalloc(N * F * sizeof(float));
    d->capacity = n;
}

// q, k, v of n tokens from the ln1 output in d->normed, as model_cpu.c's
// attention_inputs: projections, biases (attention_bias), q/k norm (qk_norm), RoPE.
static void project_qkv(CpuDecoder *d, const float *params, const size_t *w, int n,
                        const int32_t *pos) {
    const ModelConfig *cfg = &d->cfg;
    const int C = cfg->hidden_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int D = d->dims.head_dim, QD = d->dims.q_dim, KVD = d->dims.kv_dim;
    float *q = cfg->qk_norm ? d->q_raw : d->q, *k = cfg->qk_norm ? d->k_raw : d->k;
    matmul_forward_cpu(q, d->normed, params + w[W_Q], n, C, QD);
    matmul_forward_cpu(k, d->normed, params + w[W_K], n, C, KVD);
    matmul_forward_cpu(d->v, d->normed, params + w[W_V], n, C, KVD);
    if (cfg->attention_bias) {
        bias_forward_cpu(q, params + w[W_Q_BIAS], n, QD);
        bias_forward_cpu(k, params + w[W_K_BIAS], n, KVD);
        bias_forward_cpu(d->v, params + w[W_V_BIAS], n, KVD);
    }
    if (cfg->qk_norm) {
        rmsnorm_forward_cpu(d->q, d->rstd, q, params + w[W_Q_NORM], n * H, D, cfg->rms_norm_eps);
        rmsnorm_forward_cpu(d->k, d->rstd, k, params + w[W_K_NORM], n * KV, D, cfg->rms_norm_eps);
    }
    rope_forward_cpu(d->q, pos, n, H, D, cfg->rope_theta, &cfg->rope_scaling);
    rope_forward_cpu(d->k, pos, n, KV, D, cfg->rope_theta, &cfg->rope_scaling);
}

// attn[i, h] = softmax(q_i,h . K_slot / sqrt(D)) V_slot over the slot's cache entries
// 0..cache_idx[i] (the tokens before i, and i itself), max-subtracted.
static void cached_attention(CpuDecoder *d, int layer, int n, const int32_t *slot) {
    const int H = d->cfg.num_attention_heads, KV = d->cfg.num_key_value_heads;
    const int D = d->dims.head_dim, group = H / KV;
    const float scale = 1.0f / sqrtf((float)D);
    const float *kc = d->k_cache[layer], *vc = d->v_cache[layer];
    long long work = 0;  // multiply-adds: threads only where they pay for their start
    for (int i = 0; i < n; i++) work += (long long)(d->cache_idx[i] + 1) * H * D;
#pragma omp parallel if (work > (1 << 18))
    {
        float *score = xmalloc((size_t)d->max_len * sizeof(float));  // [M]
#pragma omp for schedule(dynamic)
        for (int ih = 0; ih < n * H; ih++) {
            const int i = ih / H, h = ih % H, kv_head = h / group, len = d->cache_idx[i] + 1;
            const float *qv = d->q + (size_t)ih * D;
            const size_t base = (size_t)slot[i] * d->max_len;
            float max = -INFINITY;
            for (int j = 0; j < len; j++) {
                const float *kv = kc + ((base + j) * KV + kv_head) * D;
                float dot = 0.0f;
                for (int c = 0; c < D; c++) dot += qv[c] * kv[c];
                score[j] = dot * scale;
                max = score[j] > max ? score[j] : max;
            }
            float sum = 0.0f;
            for (int j = 0; j < len; j++) sum += score[j] = expf(score[j] - max);
            float *out = d->attn + (size_t)ih * D;
            memset(out, 0, (size_t)D * sizeof(float));
            for (int j = 0; j < len; j++) {
                const float p = score[j] / sum, *vv = vc + ((base + j) * KV + kv_head) * D;
                for (int c = 0; c < D; c++) out[c] += p * vv[c];
            }
        }
        free(score);
    }
}

static void add_into(float *x, const float *y, size_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

// A call with less work than this (tokens x parameters: 256 tokens of the default 0.85M
// model; a decode step of 32 tokens of a 10M one is above it) runs on one thread: it is
// too small to share, and every op's OpenMP barrier would cost more than it saves (on a
// busy machine, where a waiting thread gets descheduled, 20 times more:
// docs/BENCHMARKS.md).
#define PARALLEL_MIN_WORK 2e8

static void forward_tokens(CpuDecoder *d, const float *params, int n, const int32_t *slot,
                           const int32_t *token, const int32_t *pos, float *logits) {
    const ModelConfig *cfg = &d->cfg;
    ensure_capacity(d, n);
    for (int i = 0; i < n; i++) d->cache_idx[i] = d->length[slot[i]]++;
    const int C = cfg->hidden_size, F = cfg->intermediate_size;
    const int KVD = d->dims.kv_dim, QD = d->dims.q_dim;
    embedding_forward_cpu(d->x, token, params + d->off.embed, n, C);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        const size_t *w = d->off.layer + (size_t)l * LAYER_TENSORS;
        rmsnorm_forward_cpu(d->normed, d->rstd, d->x, params + w[W_INPUT_NORM], n, C,
                            cfg->rms_norm_eps);
        project_qkv(d, params, w, n, pos);
        for (int i = 0; i < n; i++) {  // every key of the call is in place before attention
            const size_t at = ((size_t)slot[i] * d->max_len + d->cache_idx[i]) * KVD;
            memcpy(d->k_cache[l] + at, d->k + (size_t)i * KVD, (size_t)KVD * sizeof(float));
            memcpy(d->v_cache[l] + at, d->v + (size_t)i * KVD, (size_t)KVD * sizeof(float));
        }
        cached_attention(d, l, n, slot);
        matmul_forward_cpu(d->proj, d->attn, params + w[W_O], n, QD, C);
        add_into(d->x, d->proj, (size_t)n * C);
        rmsnorm_forward_cpu(d->normed, d->rstd, d->x, params + w[W_POST_NORM], n, C,
                            cfg->rms_norm_eps);
        cpu_mlp_forward(params, w, d->normed, d->gate, d->up, d->gate, d->proj, n, C, F);
        add_into(d->x, d->proj, (size_t)n * C);
    }
    rmsnorm_forward_cpu(d->normed, d->rstd, d->x, params + d->off.final_norm, n, C,
                        cfg->rms_norm_eps);
    matmul_forward_cpu(logits, d->normed, params + d->off.lm_head, n, C, cfg->vocab_size);
}

void cpu_decoder_forward(CpuDecoder *d, const float *params, int n, const int32_t *slot,
                         const int32_t *token, const int32_t *pos, float *logits) {
    model_decode_check("cpu_decoder_forward", n, slot, token, pos, &d->cfg, d->length,
                       d->max_seqs, d->max_len);
    if (n == 0) return;
    const int threads = omp_get_max_threads();
    if ((double)n * (double)d->table.total < PARALLEL_MIN_WORK) omp_set_num_threads(1);
    forward_tokens(d, params, n, slot, token, pos, logits);
    omp_set_num_threads(threads);
}
