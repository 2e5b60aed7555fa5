// The CPU KV-cache decoder (model/decode.h) against the full forward: a few sequences
// of different lengths fed in random chunks (prefill and single tokens of several slots
// mixed in one call, like a batched generation) give, token by token, the logits that
// cpu_model_logits gives over each whole sequence (<= 1e-5 relative), for llama (GQA,
// tied, llama3 RoPE scaling), qwen2 (q/k/v biases, untied) and qwen3 (q/k norm, head_dim
// other than hidden / heads); positions start anywhere. A reset slot starts afresh.
// A call with a bad slot, id or position, or one that would overfill a sequence, is
// refused naming the token (model_decode_check, which the CUDA twin shares).
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "model/decode.h"
#include "model/model.h"
#include "tests/test_child.h"
#include "tests/test_util.h"

enum { N_SEQS = 3, MAX_LEN = 24 };

static TestRng rng;

// Seeded init, then random norm weights and biases (init makes them 1 and 0, which
// would hide a missing bias or a swapped norm).
static float *random_params(const ModelConfig *cfg, ParamTable *table) {
    param_table_build(cfg, table);
    float *p = xmalloc(table->total * sizeof(float));
    params_init(cfg, table, test_rng_next(&rng), p);
    for (int t = 0; t < table->n_tensors; t++) {
        const ParamTensor *pt = &table->tensors[t];
        if (!pt->is_norm && !pt->is_bias) continue;
        for (size_t i = 0; i < pt->numel; i++)
            p[pt->offset + i] = (pt->is_norm ? 1.0f : 0.0f) + 0.3f * test_rng_uniform(&rng);
    }
    return p;
}

// The logits [len, V] of one whole sequence (causal) by the full forward.
static void reference_logits(const ModelConfig *cfg, const float *params, const int32_t *token,
                             const int32_t *pos, int len, float *logits) {
    int32_t target[MAX_LEN], lo[MAX_LEN], hi[MAX_LEN];
    for (int i = 0; i < len; i++) target[i] = -1, lo[i] = i, hi[i] = len;
    AttnMask mask;
    attn_mask_build(lo, hi, 1, len, 8, 8, &mask);
    const ModelBatch b = {1, len, token, target, pos, &mask};
    CpuModel *m = cpu_model_create(cfg, 1, len, MODEL_RECOMPUTE_NONE);
    cpu_model_logits(m, params, &b, logits);
    cpu_model_free(m);
    attn_mask_free(&mask);
}

typedef struct {
    int len, fed;
    int32_t token[MAX_LEN], pos[MAX_LEN];
    float *want;  // [len, V]
    double err;   // worst relative error so far
} Sequence;

static void sequence_new(Sequence *s, const ModelConfig *cfg, const float *params) {
    s->len = test_rng_int(&rng, 1, MAX_LEN);
    s->fed = 0;
    s->err = 0;
    const int start = test_rng_int(&rng, 0, 5);
    for (int i = 0; i < s->len; i++) {
        s->token[i] = test_rng_int(&rng, 0, cfg->vocab_size - 1);
        s->pos[i] = start + i;
    }
    s->want = xmalloc((size_t)s->len * cfg->vocab_size * sizeof(float));
    reference_logits(cfg, params, s->token, s->pos, s->len, s->want);
}

// Feeds every sequence to the decoder in random chunks; records each one's error.
static void feed_all(CpuDecoder *d, const ModelConfig *cfg, const float *params, Sequence *seqs) {
    const int V = cfg->vocab_size;
    int32_t slot[N_SEQS * MAX_LEN], token[N_SEQS * MAX_LEN], pos[N_SEQS * MAX_LEN];
    int index[N_SEQS * MAX_LEN];
    float *logits = xmalloc((size_t)N_SEQS * MAX_LEN * V * sizeof(float));
    for (;;) {
        int n = 0;
        // Up to 4 next tokens of each slot, slots interleaved in a random order.
        int take[N_SEQS];
        for (int s = 0; s < N_SEQS; s++) {
            const int left = seqs[s].len - seqs[s].fed;
            take[s] = left == 0 ? 0 : test_rng_int(&rng, 0, left < 4 ? left : 4);
        }
        for (int round = 0; round < 4; round++)
            for (int s0 = test_rng_int(&rng, 0, N_SEQS - 1), k = 0; k < N_SEQS; k++) {
                const int s = (s0 + k) % N_SEQS;
                if (round >= take[s]) continue;
                Sequence *q = &seqs[s];
                slot[n] = s, token[n] = q->token[q->fed], pos[n] = q->pos[q->fed];
                index[n++] = q->fed++;
            }
        int left = 0;
        for (int s = 0; s < N_SEQS; s++) left += seqs[s].len - seqs[s].fed;
        if (n == 0 && left == 0) break;
        cpu_decoder_forward(d, params, n, slot, token, pos, logits);
        for (int i = 0; i < n; i++) {
            Sequence *q = &seqs[slot[i]];
            double *want = xmalloc((size_t)V * sizeof(double));
            for (int v = 0; v < V; v++) want[v] = q->want[(size_t)index[i] * V + v];
            const double e = test_relative_error(logits + (size_t)i * V, want, (size_t)V);
            q->err = e > q->err ? e : q->err;
            free(want);
        }
    }
    free(logits);
}

static void test_arch(const char *name, const ModelConfig *cfg) {
    ParamTable table;
    float *params = random_params(cfg, &table);
    CpuDecoder *d = cpu_decoder_create(cfg, N_SEQS, MAX_LEN);
    Sequence seqs[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) sequence_new(&seqs[s], cfg, params);
    feed_all(d, cfg, params, seqs);
    for (int s = 0; s < N_SEQS; s++) {
        printf("%s: sequence %d (%d tokens): logits relative error %.3g\n", name, s, seqs[s].len,
               seqs[s].err);
        EXPECT(seqs[s].err <= 1e-5, "%s: sequence %d: relative error %.3g", name, s, seqs[s].err);
        EXPECT(cpu_decoder_length(d, s) == seqs[s].len, "%s: slot %d holds %d tokens", name, s,
               cpu_decoder_length(d, s));
    }
    // Slot 1 again from empty: a new sequence, the others already complete.
    cpu_decoder_reset(d, 1);
    free(seqs[1].want);
    sequence_new(&seqs[1], cfg, params);
    seqs[0].fed = seqs[0].len, seqs[2].fed = seqs[2].len;
    seqs[0].err = seqs[2].err = 0;
    feed_all(d, cfg, params, seqs);
    EXPECT(seqs[1].err <= 1e-5, "%s: after reset: relative error %.3g", name, seqs[1].err);
    for (int s = 0; s < N_SEQS; s++) free(seqs[s].want);
    cpu_decoder_free(d);
    free(params);
    param_table_free(&table);
}

// The comparison is sharp: the last token seven positions further (RoPE is relative, so
// shifting them all would change nothing) gives other logits.
static void test_sensitivity(const ModelConfig *cfg) {
    ParamTable table;
    float *params = random_params(cfg, &table);
    Sequence s;
    sequence_new(&s, cfg, params);
    while (s.len < 4) free(s.want), sequence_new(&s, cfg, params);
    CpuDecoder *d = cpu_decoder_create(cfg, 1, MAX_LEN);
    const int V = cfg->vocab_size;
    float *logits = xmalloc((size_t)s.len * V * sizeof(float));
    int32_t slot[MAX_LEN] = {0}, pos[MAX_LEN];
    for (int i = 0; i < s.len; i++) pos[i] = s.pos[i] + 7 * (i == s.len - 1);
    cpu_decoder_forward(d, params, s.len, slot, s.token, pos, logits);
    double *want = xmalloc((size_t)s.len * V * sizeof(double));
    for (size_t i = 0; i < (size_t)s.len * V; i++) want[i] = s.want[i];
    const double e = test_relative_error(logits, want, (size_t)s.len * V);
    EXPECT(e > 1e-4, "last position off by 7: relative error only %.3g", e);
    free(want), free(logits), free(s.want), free(params);
    cpu_decoder_free(d);
    param_table_free(&table);
}

// One call of n tokens into a fresh decoder of 2 sequences of 4 tokens, in a child.
typedef struct {
    const ModelConfig *cfg;
    const float *params;
    int n;
    int32_t slot[5], token[5], pos[5];
} DecodeCall;

static void feed_call(void *arg) {
    const DecodeCall *c = arg;
    CpuDecoder *d = cpu_decoder_create(c->cfg, 2, 4);
    float *logits = xmalloc(5 * (size_t)c->cfg->vocab_size * sizeof(float));
    cpu_decoder_forward(d, c->params, c->n, c->slot, c->token, c->pos, logits);
    free(logits);
    cpu_decoder_free(d);
}

static void test_refusals(const ModelConfig *cfg) {
    ParamTable table;
    float *params = random_params(cfg, &table);
    const DecodeCall cases[] = {
        {cfg, params, 3, {0, 1, 1}, {3, 4, 5}, {0, 7, 8}},  // accepted
        {cfg, params, 3, {0, 1, 1}, {3, 4, 5}, {0, 7, -1}},
        {cfg, params, 3, {0, 1, 2}, {3, 4, 5}, {0, 7, 8}},
        {cfg, params, 3, {0, 1, 1}, {3, 4, 41}, {0, 7, 8}},
        {cfg, params, 5, {1, 1, 1, 1, 1}, {3, 4, 5, 6, 7}, {0, 1, 2, 3, 4}},
        {cfg, params, -1, {0}, {0}, {0}},
    };
    const char *const messages[] = {
        NULL,
        "cpu_decoder_forward: token 2: position -1 is negative",
        "cpu_decoder_forward: token 2: slot 2 outside [0, 2)",
        "cpu_decoder_forward: token 2: id 41 outside [0, 41)",
        "cpu_decoder_forward: sequence 1 would hold 0 + 5 tokens, max_len is 4",
        "cpu_decoder_forward: n -1 is negative",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[2048];
        const int status = test_run_in_child(feed_call, (void *)&cases[i], err, sizeof err);
        if (!messages[i])
            EXPECT(status == 0 && !err[0], "a good call: status %d, '%s'", status, err);
        else
            EXPECT(status == 1 && strstr(err, messages[i]), "'%s' refused: status %d, '%s'",
                   messages[i], status, err);
    }
    free(params);
    param_table_free(&table);
}

int main(void) {
    rng = test_rng_from_env();
    const ModelConfig llama = {
        .vocab_size = 41, .hidden_size = 32, .intermediate_size = 48, .num_hidden_layers = 2,
        .num_attention_heads = 4, .num_key_value_heads = 2, .rms_norm_eps = 1e-5f,
        .rope_theta = 10000.0f, .tie_word_embeddings = true, .arch = ARCH_LLAMA,
        .rope_scaling = {ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 16}};
    ModelConfig qwen2 = llama;
    qwen2.arch = ARCH_QWEN2, qwen2.attention_bias = true, qwen2.tie_word_embeddings = false;
    qwen2.num_key_value_heads = 1, qwen2.rope_scaling = (RopeScaling){0};
    ModelConfig qwen3 = llama;
    qwen3.arch = ARCH_QWEN3, qwen3.qk_norm = true, qwen3.head_dim = 12;
    qwen3.tie_word_embeddings = false, qwen3.num_hidden_layers = 3;
    qwen3.rope_scaling = (RopeScaling){ROPE_LINEAR, 2.0f, 0, 0, 0};
    test_arch("llama (GQA 4/2, tied, llama3 rope)", &llama);
    test_arch("qwen2 (biases, untied, 4/1)", &qwen2);
    test_arch("qwen3 (q/k norm, head_dim 12)", &qwen3);
    test_sensitivity(&llama);
    test_refusals(&llama);
    return test_finish();
}
