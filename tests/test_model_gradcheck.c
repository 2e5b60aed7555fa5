// The CPU fp32 model against an independent oracle: a plain double-precision
// Llama forward written here from the definition (dense attention straight from
// lo/hi, no tiles), finite-differenced centrally for every coordinate of every
// tensor. Float analytic gradients agree with it to ~1e-6 of each tensor's
// scale; the tolerance (1e-4) catches any wrong term, sign, scale or missed
// accumulation, and the test proves it by flagging a 0.1% error in one coordinate.
// Batch: two rows of 24 slots. Row 0 packs two causal documents with restarting
// positions and fully masked padding; row 1 is the DESIGN.md §3 duplicate-layout
// example (non-causal hi, positions jumping back) plus padding.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/lora.h"
#include "model/model.h"
#include "common/checksum.h"
#include "tests/test_util.h"

enum { ROWS = 2, SEQ = 24, T = ROWS * SEQ };
// Allowed gradient error relative to the tensor's largest gradient (seen: ~1e-6).
static const double GRAD_TOL = 1e-4;

static TestRng rng;

typedef struct {
    int32_t token[T], target[T], pos[T], lo[T], hi[T];
} Batch;

// ---- the double-precision reference model ----

typedef struct {
    const ModelConfig *cfg;
    const ParamTable *table;
    const Batch *batch;
} Reference;

static const double *tensor(const Reference *r, const double *params, const char *fmt, int layer) {
    char name[96];
    snprintf(name, sizeof(name), fmt, layer);
    const ParamTensor *p = param_table_find(r->table, name);
    if (!p) {
        fprintf(stderr, "missing tensor %s\n", name);
        exit(1);
    }
    return params + p->offset;
}

// out[n, o] = sum_i x[n, i] * w[o, i]
static void linear(double *out, const double *x, const double *w, int n, int in, int outc) {
    for (int t = 0; t < n; t++)
        for (int o = 0; o < outc; o++) {
            double s = 0.0;
            for (int i = 0; i < in; i++) s += x[t * in + i] * w[o * in + i];
            out[t * outc + o] = s;
        }
}

static void rmsnorm(double *out, const double *x, const double *w, int n, int c, double eps) {
    for (int t = 0; t < n; t++) {
        double ms = 0.0;
        for (int i = 0; i < c; i++) ms += x[t * c + i] * x[t * c + i];
        const double r = 1.0 / sqrt(ms / c + eps);
        for (int i = 0; i < c; i++) out[t * c + i] = x[t * c + i] * r * w[i];
    }
}

// HF rotate-half on x[n, heads, d]: x * cos + [-x2, x1] * sin.
static void rope(double *x, const int32_t *pos, int n, int heads, int d, double theta) {
    const int half = d / 2;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            double *v = x + (t * heads + h) * d;
            for (int i = 0; i < half; i++) {
                const double angle = pos[t] * pow(theta, -2.0 * i / d);
                const double a = v[i], b = v[i + half];
                v[i] = a * cos(angle) - b * sin(angle);
                v[i + half] = b * cos(angle) + a * sin(angle);
            }
        }
}

// HF's inverse frequencies, transcribed from _compute_{default,linear,llama3}_rope_parameters
// (the where-masks of the llama3 branch as written there).
static void reference_inv_freq(double *inv, int d, double theta, const RopeScaling *s) {
    for (int i = 0; i < d / 2; i++) {
        const double base = 1.0 / pow(theta, (2.0 * i) / d);
        if (s->type == ROPE_DEFAULT) { inv[i] = base; continue; }
        if (s->type == ROPE_LINEAR) { inv[i] = base / s->factor; continue; }
        const double old = s->original_max_position_embeddings;
        const double low_wavelen = old / s->low_freq_factor, high_wavelen = old / s->high_freq_factor;
        const double wavelen = 2.0 * 3.14159265358979323846 / base;
        const double llama = wavelen > low_wavelen ? base / s->factor : base;
        const double smooth = (old / wavelen - s->low_freq_factor) /
                              (s->high_freq_factor - s->low_freq_factor);
        const double smoothed = (1.0 - smooth) * llama / s->factor + smooth * llama;
        const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv[i] = medium ? smoothed : llama;
    }
}

// HF rotate-half with explicit inverse frequencies.
static void rope_scaled(double *x, const int32_t *pos, int n, int heads, int d, const double *inv) {
    const int half = d / 2;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            double *v = x + (t * heads + h) * d;
            for (int i = 0; i < half; i++) {
                const double angle = pos[t] * inv[i];
                const double a = v[i], b = v[i + half];
                v[i] = a * cos(angle) - b * sin(angle);
                v[i + half] = b * cos(angle) + a * sin(angle);
            }
        }
}

static void add_bias(double *x, const double *bias, int n, int c) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < c; i++) x[t * c + i] += bias[i];
}

// Sum of cross-entropy over targets; per-slot losses into `losses` when not NULL.
static double reference_loss(const Reference *r, const double *params, double *losses) {
    const ModelConfig *cfg = r->cfg;
    const int C = cfg->hidden_size, F = cfg->intermediate_size, V = cfg->vocab_size;
    const int H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int D = model_dims(cfg).head_dim;
    const Batch *b = r->batch;
    double *x = malloc(sizeof(double) * T * C), *h = malloc(sizeof(double) * T * C);
    double *q = malloc(sizeof(double) * T * H * D), *k = malloc(sizeof(double) * T * KV * D);
    double *v = malloc(sizeof(double) * T * KV * D), *attn = malloc(sizeof(double) * T * H * D);
    double *proj = malloc(sizeof(double) * T * C), *gate = malloc(sizeof(double) * T * F);
    double *up = malloc(sizeof(double) * T * F), *logits = malloc(sizeof(double) * V);
    double *scores = malloc(sizeof(double) * SEQ);

    const double *embed = tensor(r, params, "model.embed_tokens.weight", 0);
    for (int t = 0; t < T; t++) memcpy(x + t * C, embed + b->token[t] * C, sizeof(double) * C);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        rmsnorm(h, x, tensor(r, params, "model.layers.%d.input_layernorm.weight", l), T, C,
                cfg->rms_norm_eps);
        linear(q, h, tensor(r, params, "model.layers.%d.self_attn.q_proj.weight", l), T, C, H * D);
        linear(k, h, tensor(r, params, "model.layers.%d.self_attn.k_proj.weight", l), T, C, KV * D);
        linear(v, h, tensor(r, params, "model.layers.%d.self_attn.v_proj.weight", l), T, C, KV * D);
        if (cfg->attention_bias) {
            add_bias(q, tensor(r, params, "model.layers.%d.self_attn.q_proj.bias", l), T, H * D);
            add_bias(k, tensor(r, params, "model.layers.%d.self_attn.k_proj.bias", l), T, KV * D);
            add_bias(v, tensor(r, params, "model.layers.%d.self_attn.v_proj.bias", l), T, KV * D);
        }
        if (cfg->qk_norm) {  // over each head's D values, in place (rows are heads)
            rmsnorm(q, q, tensor(r, params, "model.layers.%d.self_attn.q_norm.weight", l), T * H,
                    D, cfg->rms_norm_eps);
            rmsnorm(k, k, tensor(r, params, "model.layers.%d.self_attn.k_norm.weight", l), T * KV,
                    D, cfg->rms_norm_eps);
        }
        if (cfg->rope_scaling.type == ROPE_DEFAULT) {
            rope(q, b->pos, T, H, D, cfg->rope_theta);
            rope(k, b->pos, T, KV, D, cfg->rope_theta);
        } else {
            double inv[64];
            reference_inv_freq(inv, D, cfg->rope_theta, &cfg->rope_scaling);
            rope_scaled(q, b->pos, T, H, D, inv);
            rope_scaled(k, b->pos, T, KV, D, inv);
        }
        for (int row = 0; row < ROWS; row++)
            for (int head = 0; head < H; head++)
                for (int qs = 0; qs < SEQ; qs++) {
                    const int kv_head = head / (H / KV);
                    const double *qv = q + ((row * SEQ + qs) * H + head) * D;
                    double *out = attn + ((row * SEQ + qs) * H + head) * D;
                    double max = -INFINITY, sum = 0.0;
                    for (int ks = 0; ks < SEQ; ks++) {
                        const int key = row * SEQ + ks;
                        scores[ks] = -INFINITY;
                        if (!(b->lo[key] <= qs && qs < b->hi[key])) continue;
                        double s = 0.0;
                        for (int i = 0; i < D; i++) s += qv[i] * k[(key * KV + kv_head) * D + i];
                        scores[ks] = s / sqrt((double)D);
                        max = fmax(max, scores[ks]);
                    }
                    for (int i = 0; i < D; i++) out[i] = 0.0;
                    if (max == -INFINITY) continue;  // sees no key: output 0
                    for (int ks = 0; ks < SEQ; ks++) sum += exp(scores[ks] - max);
                    for (int ks = 0; ks < SEQ; ks++) {
                        const double p = exp(scores[ks] - max) / sum;
                        const double *vv = v + ((row * SEQ + ks) * KV + kv_head) * D;
                        for (int i = 0; i < D; i++) out[i] += p * vv[i];
                    }
                }
        linear(proj, attn, tensor(r, params, "model.layers.%d.self_attn.o_proj.weight", l), T,
               H * D, C);
        for (int i = 0; i < T * C; i++) x[i] += proj[i];
        rmsnorm(h, x, tensor(r, params, "model.layers.%d.post_attention_layernorm.weight", l), T,
                C, cfg->rms_norm_eps);
        linear(gate, h, tensor(r, params, "model.layers.%d.mlp.gate_proj.weight", l), T, C, F);
        linear(up, h, tensor(r, params, "model.layers.%d.mlp.up_proj.weight", l), T, C, F);
        for (int i = 0; i < T * F; i++) gate[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
        linear(proj, gate, tensor(r, params, "model.layers.%d.mlp.down_proj.weight", l), T, F, C);
        for (int i = 0; i < T * C; i++) x[i] += proj[i];
    }
    rmsnorm(h, x, tensor(r, params, "model.norm.weight", 0), T, C, cfg->rms_norm_eps);
    const double *head = cfg->tie_word_embeddings ? embed : tensor(r, params, "lm_head.weight", 0);
    double total = 0.0;
    for (int t = 0; t < T; t++) {
        if (losses) losses[t] = 0.0;
        if (b->target[t] < 0) continue;
        linear(logits, h + t * C, head, 1, C, V);
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp(logits[i]);
        const double loss = log(sum) - logits[b->target[t]];
        if (losses) losses[t] = loss;
        total += loss;
    }
    free(x), free(h), free(q), free(k), free(v), free(attn), free(proj), free(gate), free(up);
    free(logits), free(scores);
    return total;
}

// ---- batch and parameters ----

// Row 0: document A (slots 0-10, trained from slot 3), document B (slots 11-18,
// all trained), padding 19-23. Row 1: DESIGN.md §3 duplicate example, padding 19-23.
static void build_batch(Batch *b, int V) {
    for (int t = 0; t < T; t++) {
        b->token[t] = test_rng_int(&rng, 0, V - 1);
        b->target[t] = -1;
        b->pos[t] = 0;
        b->lo[t] = b->hi[t] = t % SEQ;  // padding: visible to nobody
    }
    const int docs[2][2] = {{0, 11}, {11, 19}};
    for (int d = 0; d < 2; d++)
        for (int s = docs[d][0]; s < docs[d][1]; s++) {
            b->pos[s] = s - docs[d][0];
            b->lo[s] = s;
            b->hi[s] = docs[d][1];
            if (s + 1 < docs[d][1] && (d == 1 || s >= 3)) b->target[s] = b->token[s + 1];
        }
    static const int32_t dup_pos[19] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    static const int32_t dup_hi[19] = {19, 19, 19, 9, 9, 9, 9, 9, 9, 19,
                                       19, 19, 19, 19, 19, 19, 19, 19, 19};
    int32_t *token = b->token + SEQ;
    token[9] = token[7], token[10] = token[8];  // the history copy aB repeats aA
    for (int s = 0; s < 19; s++) {
        b->pos[SEQ + s] = dup_pos[s];
        b->lo[SEQ + s] = s;
        b->hi[SEQ + s] = dup_hi[s];
    }
    static const int trained[][2] = {{2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 8},
                                     {13, 14}, {14, 15}, {15, 16}, {16, 17}, {17, 18}};
    for (size_t i = 0; i < sizeof(trained) / sizeof(trained[0]); i++)
        b->target[SEQ + trained[i][0]] = token[trained[i][1]];
}

// Random weights of a scale that makes attention peaked and logits O(1).
static void random_params(const ParamTable *table, float *params) {
    for (int i = 0; i < table->n_tensors; i++) {
        const ParamTensor *p = &table->tensors[i];
        const float scale = p->is_norm ? 0.3f : p->is_bias ? 0.5f : p->is_embedding ? 1.0f
                                                                : 2.0f / sqrtf((float)p->shape[1]);
        for (size_t j = 0; j < p->numel; j++)
            params[p->offset + j] = (p->is_norm ? 1.0f : 0.0f) + scale * test_rng_uniform(&rng);
    }
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

// ---- the checks ----

static void check_param_table(const ModelConfig *cfg, const ParamTable *table) {
    const int C = cfg->hidden_size, D = model_dims(cfg).head_dim;
    const int KVD = cfg->num_key_value_heads * D, QD = cfg->num_attention_heads * D;
    const int per_layer = 9 + 3 * cfg->attention_bias + 2 * cfg->qk_norm;
    const int expected = 1 + per_layer * cfg->num_hidden_layers + 1 + !cfg->tie_word_embeddings;
    EXPECT(table->n_tensors == expected, "%d tensors, expected %d", table->n_tensors, expected);
    size_t total = 0;
    for (int i = 0; i < table->n_tensors; i++) {
        EXPECT(table->tensors[i].offset == total, "tensor %d offset", i);
        total += table->tensors[i].numel;
    }
    EXPECT(table->total == total, "table total %zu vs %zu", table->total, total);
    const struct { const char *name; int64_t rows, cols; } expect[] = {
        {"model.embed_tokens.weight", cfg->vocab_size, C},
        {"model.layers.1.input_layernorm.weight", C, 0},
        {"model.layers.1.self_attn.q_proj.weight", QD, C},
        {"model.layers.1.self_attn.k_proj.weight", KVD, C},
        {"model.layers.0.self_attn.v_proj.weight", KVD, C},
        {"model.layers.0.self_attn.o_proj.weight", C, QD},
        {"model.layers.0.post_attention_layernorm.weight", C, 0},
        {"model.layers.1.mlp.gate_proj.weight", cfg->intermediate_size, C},
        {"model.layers.0.mlp.up_proj.weight", cfg->intermediate_size, C},
        {"model.layers.1.mlp.down_proj.weight", C, cfg->intermediate_size},
        {"model.norm.weight", C, 0},
    };
    for (size_t i = 0; i < sizeof(expect) / sizeof(expect[0]); i++) {
        const ParamTensor *p = param_table_find(table, expect[i].name);
        EXPECT(p && p->shape[0] == expect[i].rows && p->shape[1] == expect[i].cols &&
                  p->ndim == (expect[i].cols ? 2 : 1) && p->is_norm == !expect[i].cols,
              "tensor %s shape", expect[i].name);
    }
    const ParamTensor *lm_head = param_table_find(table, "lm_head.weight");
    EXPECT(cfg->tie_word_embeddings ? lm_head == NULL
                                   : lm_head && lm_head->is_embedding &&
                                         lm_head->shape[0] == cfg->vocab_size,
          "lm_head present iff untied");
    EXPECT(table->tensors[0].is_embedding && !table->tensors[1].is_embedding,
          "embedding flags");
    EXPECT(param_table_find(table, "model.layers.2.mlp.up_proj.weight") == NULL,
          "no tensor past the last layer");
    const ParamTensor *bias = param_table_find(table, "model.layers.1.self_attn.k_proj.bias");
    EXPECT(cfg->attention_bias ? bias && bias->is_bias && bias->ndim == 1 && bias->shape[0] == KVD
                               : bias == NULL,
          "k_proj.bias [%d] iff attention_bias", KVD);
    const ParamTensor *qn = param_table_find(table, "model.layers.0.self_attn.q_norm.weight");
    EXPECT(cfg->qk_norm ? qn && qn->is_norm && qn->shape[0] == D : qn == NULL,
          "q_norm.weight [%d] iff qk_norm", D);
}

static void check_params_init(const ModelConfig *cfg, const ParamTable *table) {
    float *a = malloc(table->total * sizeof(float)), *b = malloc(table->total * sizeof(float));
    params_init(cfg, table, 42, a);
    params_init(cfg, table, 42, b);
    EXPECT(memcmp(a, b, table->total * sizeof(float)) == 0, "same seed, same bytes");
    params_init(cfg, table, 43, b);
    EXPECT(memcmp(a, b, table->total * sizeof(float)) != 0, "another seed, other bytes");
    double sum = 0.0, sum_sq = 0.0;
    size_t n = 0;
    int norms_are_one = 1;
    for (int i = 0; i < table->n_tensors; i++) {
        const ParamTensor *p = &table->tensors[i];
        for (size_t j = 0; j < p->numel; j++) {
            const float w = a[p->offset + j];
            if (p->is_norm) {
                norms_are_one &= w == 1.0f;
            } else {
                sum += w, sum_sq += (double)w * w, n++;
            }
        }
    }
    const double mean = sum / n, stddev = sqrt(sum_sq / n - mean * mean);
    EXPECT(norms_are_one, "norm weights start at 1");
    EXPECT(fabs(mean) < 0.002 && fabs(stddev - 0.02) < 0.001, "init mean %g stddev %g over %zu",
          mean, stddev, n);
    free(a);
    free(b);
}

static void run_config(const char *label, ModelConfig cfg) {
    printf("config: %s\n", label);
    ParamTable table;
    param_table_build(&cfg, &table);
    check_param_table(&cfg, &table);
    check_params_init(&cfg, &table);

    Batch batch;
    build_batch(&batch, cfg.vocab_size);
    AttnMask mask;
    attn_mask_build(batch.lo, batch.hi, ROWS, SEQ, 8, 4, &mask);
    const ModelBatch mb = {ROWS, SEQ, batch.token, batch.target, batch.pos, &mask};
    int n_targets = 0;
    for (int t = 0; t < T; t++) n_targets += batch.target[t] >= 0;
    const float loss_scale = 1.0f / n_targets;

    float *params = malloc(table.total * sizeof(float));
    random_params(&table, params);
    double *params_d = malloc(table.total * sizeof(double));
    for (size_t i = 0; i < table.total; i++) params_d[i] = params[i];
    const Reference ref = {&cfg, &table, &batch};

    // Forward: per-slot losses and their sum against the double reference.
    // more rows than used; every activation kept
    CpuModel *model = cpu_model_create(&cfg, ROWS + 1, SEQ, MODEL_RECOMPUTE_NONE);
    float losses[T];
    double ref_losses[T];
    const double loss = cpu_model_forward(model, params, &mb, losses);
    const double ref_loss = reference_loss(&ref, params_d, ref_losses);
    EXPECT(fabs(loss - ref_loss) < 1e-5 * ref_loss, "loss %.8g vs reference %.8g", loss, ref_loss);
    double worst = 0.0, losses_sum = 0.0;
    for (int t = 0; t < T; t++) {
        worst = fmax(worst, fabs(losses[t] - ref_losses[t]));
        losses_sum += losses[t];
        if (batch.target[t] < 0) EXPECT(losses[t] == 0.0f, "slot %d without target has loss", t);
    }
    EXPECT(worst < 1e-4, "per-slot losses differ by %g", worst);
    EXPECT(fabs(losses_sum - loss) < 1e-4 * loss, "per-slot losses sum to the returned loss");

    // Backward against central differences of the reference, every coordinate.
    float *grads = calloc(table.total, sizeof(float));
    const double loss_fb = cpu_model_forward_backward(model, params, grads, &mb, loss_scale);
    EXPECT(loss_fb == loss, "forward_backward returns the unscaled forward loss");
    EXPECT(isfinite(test_max_abs(grads, table.total)), "finite gradients");
    const double h = 1e-5;
    for (int i = 0; i < table.n_tensors; i++) {
        const ParamTensor *p = &table.tensors[i];
        double *numeric = malloc(p->numel * sizeof(double));
        for (size_t j = 0; j < p->numel; j++) {
            double *w = params_d + p->offset + j;
            const double saved = *w;
            *w = saved + h;
            const double plus = reference_loss(&ref, params_d, NULL);
            *w = saved - h;
            const double minus = reference_loss(&ref, params_d, NULL);
            *w = saved;
            numeric[j] = (plus - minus) / (2 * h) * loss_scale;
        }
        const float *analytic = grads + p->offset;
        const double err = test_relative_error(analytic, numeric, p->numel);
        EXPECT(err < GRAD_TOL, "%s: gradient relative error %.3g", p->name, err);
        if (i == 1) {  // the check is sharp: a 0.1% error in one coordinate fails it
            float *wrong = malloc(p->numel * sizeof(float));
            memcpy(wrong, analytic, p->numel * sizeof(float));
            wrong[p->numel / 2] += 0.001f * (float)test_max_abs(wrong, p->numel);
            EXPECT(test_relative_error(wrong, numeric, p->numel) > GRAD_TOL,
                  "checker misses a 0.1%% error");
            free(wrong);
        }
        free(numeric);
    }

    // The backward recomputing the MLP, or each whole layer from its input residual: the
    // same losses and bitwise the same gradients as keeping everything.
    const ModelRecompute modes[] = {MODEL_RECOMPUTE_MLP, MODEL_RECOMPUTE_LAYER};
    for (int i = 0; i < 2; i++) {
        CpuModel *r = cpu_model_create(&cfg, ROWS + 1, SEQ, modes[i]);
        float r_losses[T];
        const double r_loss = cpu_model_forward(r, params, &mb, r_losses);
        float *r_grads = calloc(table.total, sizeof(float));
        const double r_loss_fb = cpu_model_forward_backward(r, params, r_grads, &mb, loss_scale);
        EXPECT(r_loss == loss && r_loss_fb == loss && memcmp(r_losses, losses, sizeof losses) == 0,
               "recompute %s: loss %.9g (forward_backward %.9g) vs %.9g",
               model_recompute_name(modes[i]), r_loss, r_loss_fb, loss);
        size_t first = table.total;
        for (size_t j = 0; j < table.total && first == table.total; j++)
            if (memcmp(&r_grads[j], &grads[j], sizeof(float)) != 0) first = j;
        EXPECT(first == table.total, "recompute %s: gradient %zu is %.9g, kept everything %.9g",
               model_recompute_name(modes[i]), first, first < table.total ? r_grads[first] : 0.0f,
               first < table.total ? grads[first] : 0.0f);
        free(r_grads);
        cpu_model_free(r);
    }

    // Gradients accumulate: a second call adds the same gradient again.
    float *twice = malloc(table.total * sizeof(float));
    memcpy(twice, grads, table.total * sizeof(float));
    cpu_model_forward_backward(model, params, twice, &mb, loss_scale);
    double acc_err = 0.0;
    for (size_t i = 0; i < table.total; i++) acc_err = fmax(acc_err, fabs(twice[i] - 2 * grads[i]));
    EXPECT(acc_err <= 1e-6 * test_max_abs(grads, table.total), "second call doubles: off by %g",
          acc_err);

    // loss_scale scales gradients linearly.
    float *scaled = calloc(table.total, sizeof(float));
    cpu_model_forward_backward(model, params, scaled, &mb, 0.3f * loss_scale);
    double scale_err = 0.0;
    for (size_t i = 0; i < table.total; i++)
        scale_err = fmax(scale_err, fabs(scaled[i] - 0.3 * grads[i]));
    EXPECT(scale_err <= 1e-5 * test_max_abs(grads, table.total), "loss_scale 0.3: off by %g", scale_err);

    // Padding slots (fully masked queries and keys, no target) change nothing.
    Batch repadded = batch;
    for (int t = 0; t < T; t++)
        if (repadded.lo[t] == repadded.hi[t]) {
            repadded.token[t] = (repadded.token[t] + 1 + t) % cfg.vocab_size;
            repadded.pos[t] = 3 * t + 1;
        }
    AttnMask repadded_mask;
    attn_mask_build(repadded.lo, repadded.hi, ROWS, SEQ, 8, 4, &repadded_mask);
    const ModelBatch mb_repadded = {ROWS, SEQ, repadded.token, repadded.target, repadded.pos,
                                    &repadded_mask};
    float *repadded_grads = calloc(table.total, sizeof(float));
    const double repadded_loss =
        cpu_model_forward_backward(model, params, repadded_grads, &mb_repadded, loss_scale);
    EXPECT(repadded_loss == loss, "padding changed the loss: %.9g vs %.9g", repadded_loss, loss);
    const double pad_diff = max_abs_diff(repadded_grads, grads, table.total);
    EXPECT(pad_diff <= 1e-6 * test_max_abs(grads, table.total), "padding changed gradients by %g",
          pad_diff);

    // Logits in chunks of 5 target rows (the last one partial) match one chunk.
    cpu_model_set_logit_chunk_rows(model, 5);
    float chunked_losses[T];
    const double chunked_loss = cpu_model_forward(model, params, &mb, chunked_losses);
    float *chunked_grads = calloc(table.total, sizeof(float));
    cpu_model_forward_backward(model, params, chunked_grads, &mb, loss_scale);
    EXPECT(fabs(chunked_loss - loss) < 1e-6 * loss && max_abs_diff(chunked_losses, losses, T) < 1e-5,
          "chunked loss %.9g vs %.9g", chunked_loss, loss);
    const double chunk_diff = max_abs_diff(chunked_grads, grads, table.total);
    EXPECT(chunk_diff <= 1e-6 * test_max_abs(grads, table.total), "chunked gradients differ by %g",
          chunk_diff);
    cpu_model_set_logit_chunk_rows(model, T);

    // Fewer rows than allocated: row 1 alone gives row 1's losses.
    AttnMask mask1;
    attn_mask_build(batch.lo + SEQ, batch.hi + SEQ, 1, SEQ, 8, 4, &mask1);
    const ModelBatch second = {1, SEQ, batch.token + SEQ, batch.target + SEQ, batch.pos + SEQ,
                               &mask1};
    float losses1[SEQ];
    cpu_model_forward(model, params, &second, losses1);
    const double row_diff = max_abs_diff(losses1, losses + SEQ, SEQ);
    EXPECT(row_diff < 1e-5, "row 1 alone: losses differ by %g", row_diff);

    attn_mask_free(&mask1);
    attn_mask_free(&repadded_mask);
    attn_mask_free(&mask);
    cpu_model_free(model);
    free(params), free(params_d), free(grads), free(twice), free(scaled), free(repadded_grads);
    free(chunked_grads);
    param_table_free(&table);
}


// ---- LoRA (model/lora.h) ----

// The B beside adapter tensor A (by name: lora_A -> lora_B), or NULL when A is a B.
static const ParamTensor *lora_b_of(const LoraLayout *l, const ParamTensor *A) {
    if (!strstr(A->name, ".lora_A.weight")) return NULL;
    char name[96];
    snprintf(name, sizeof name, "%s", A->name);
    memcpy(strstr(name, ".lora_A."), ".lora_B.", strlen(".lora_B."));
    const ParamTensor *B = param_table_find(&l->table, name);
    EXPECT(B != NULL, "%s has no %s", A->name, name);
    return B;
}

// merged[base->total] = base + s B A for every adapter, in double (LoRA's definition:
// x W^T + s (x A^T) B^T = x (W + s B A)^T).
static void merge_double(const LoraLayout *l, const ParamTable *base, const double *params,
                         const double *adapter, double s, double *merged) {
    memcpy(merged, params, base->total * sizeof(double));
    for (int i = 0; i < l->table.n_tensors; i++) {
        const ParamTensor *A = &l->table.tensors[i], *B = lora_b_of(l, A);
        if (!B) continue;
        char name[96];  // base_model.model.<the base tensor>, lora_A -> weight
        snprintf(name, sizeof name, "%s", A->name + strlen("base_model.model."));
        strcpy(strstr(name, ".lora_A.weight"), ".weight");
        const ParamTensor *w = param_table_find(base, name);
        EXPECT(w && w->shape[0] == B->shape[0] && w->shape[1] == A->shape[1],
               "%s adapts %s of the same shape", A->name, name);
        if (!w) continue;
        const int r = (int)A->shape[0], out = (int)B->shape[0], in = (int)A->shape[1];
        for (int o = 0; o < out; o++)
            for (int c = 0; c < in; c++) {
                double sum = 0.0;
                for (int k = 0; k < r; k++)
                    sum += adapter[B->offset + (size_t)o * r + k] * adapter[A->offset + (size_t)k * in + c];
                merged[w->offset + (size_t)o * in + c] += s * sum;
            }
    }
}

// A layer's groups: which targets each holds, their columns in the stacked output, the A's
// stacked at the group's offset; and the group ops against their members' alone (the sum
// of one-member calls, each writing its columns): out, dx, every A and B gradient.
static double gap_to_largest(const float *got, const float *want, size_t n) {
    double top = 1e-30;
    for (size_t i = 0; i < n; i++) top = fmax(top, fabs((double)want[i]));
    return max_abs_diff(got, want, n) / top;
}

static void check_lora_groups(const char *label, ModelConfig cfg, LoraConfig lc) {
    printf("lora groups: %s\n", label);
    LoraLayout l;
    lora_layout_build(&cfg, &lc, &l);
    const ModelDims d = model_dims(&cfg);
    const int C = cfg.hidden_size, F = cfg.intermediate_size, T = 11, r = lc.r;
    static const int group_of[LORA_TARGETS] = {LORA_GROUP_QKV, LORA_GROUP_QKV, LORA_GROUP_QKV,
                                               LORA_GROUP_O, LORA_GROUP_GATE_UP,
                                               LORA_GROUP_GATE_UP, LORA_GROUP_DOWN};
    const int col[LORA_TARGETS] = {0, d.q_dim, d.q_dim + d.kv_dim, 0, 0, F, 0};
    const int width[LORA_GROUPS] = {d.q_dim + 2 * d.kv_dim, C, 2 * F, C};
    int most = 0;
    for (int gi = 0; gi < LORA_GROUPS; gi++) {
        const LoraGroup *g = lora_group(&l, 1, (LoraGroupId)gi);
        int j = 0;
        for (int t = 0; t < LORA_TARGETS; t++) {
            if (group_of[t] != gi || !lc.target[t]) continue;
            const LoraGroup one = lora_target_group(&l, 1, (LoraTarget)t);
            EXPECT(j < g->n && g->col[j] == col[t] && g->out[j] == l.out[t] &&
                       g->b[j] == one.b[0] && one.a == g->a + (size_t)j * r * l.in[t] &&
                       g->in == l.in[t],
                   "group %d member %d (%s): column %d out %d, A at %zu", gi, j,
                   lora_target_name((LoraTarget)t), j < g->n ? g->col[j] : -1,
                   j < g->n ? g->out[j] : -1, one.a);
            j++;
        }
        EXPECT(g->n == j, "group %d holds %d members, %d targeted", gi, g->n, j);
        if (g->n > most) most = g->n;
        if (!g->n) continue;

        const int ld = width[gi], in = g->in;
        const size_t na = l.table.total;
        float *x = malloc((size_t)T * in * sizeof(float)), *adapter = malloc(na * sizeof(float));
        float *dout = malloc((size_t)T * ld * sizeof(float));
        float *out[2], *dx[2], *grads[2];
        for (size_t i = 0; i < (size_t)T * in; i++) x[i] = test_rng_uniform(&rng);
        for (size_t i = 0; i < na; i++) adapter[i] = test_rng_uniform(&rng);
        for (size_t i = 0; i < (size_t)T * ld; i++) dout[i] = test_rng_uniform(&rng);
        float *u = malloc((size_t)T * LORA_GROUP_MAX * r * sizeof(float));
        float *du = malloc((size_t)T * LORA_GROUP_MAX * r * sizeof(float));
        for (int k = 0; k < 2; k++) {
            out[k] = calloc((size_t)T * ld, sizeof(float));
            dx[k] = calloc((size_t)T * in, sizeof(float));
            grads[k] = calloc(na, sizeof(float));
        }
        lora_forward_cpu(out[0], ld, u, x, adapter, g, T);
        lora_backward_cpu(dx[0], grads[0], u, du, dout, ld, x, adapter, g, T);
        for (int t = 0; t < LORA_TARGETS; t++) {
            if (group_of[t] != gi || !lc.target[t]) continue;
            const LoraGroup one = lora_target_group(&l, 1, (LoraTarget)t);
            lora_forward_cpu(out[1] + col[t], ld, u, x, adapter, &one, T);
            lora_backward_cpu(dx[1], grads[1], u, du, dout + col[t], ld, x, adapter, &one, T);
        }
        const double e_out = gap_to_largest(out[0], out[1], (size_t)T * ld);
        const double e_dx = gap_to_largest(dx[0], dx[1], (size_t)T * in);
        const double e_grads = gap_to_largest(grads[0], grads[1], na);
        EXPECT(e_out < 1e-5 && e_dx < 1e-5 && e_grads < 1e-5,
               "group %d against its members alone: out %.3g dx %.3g gradients %.3g", gi, e_out,
               e_dx, e_grads);
        for (int k = 0; k < 2; k++) free(out[k]), free(dx[k]), free(grads[k]);
        free(x), free(adapter), free(dout), free(u), free(du);
    }
    EXPECT(l.max_group == most, "max_group %d, the largest group %d", l.max_group, most);
    lora_layout_free(&l);
}

// The adapted CPU model against the double reference on the merged weights: the loss,
// every adapter coordinate's gradient against central differences through the merge,
// and against the chain rule through the merged matmul (dA = s B^T dW, dB = s dW A^T
// from the full model's gradient dW at the merged weights); the base gets no gradient
// and is not written; B = 0 gives the base's loss bit for bit; every recompute mode
// gives the same adapter gradients bit for bit.
static void run_lora(const char *label, ModelConfig cfg, LoraConfig lc) {
    printf("lora: %s\n", label);
    ParamTable table;
    param_table_build(&cfg, &table);
    LoraLayout lora;
    lora_layout_build(&cfg, &lc, &lora);
    const double s = lc.rslora ? lc.alpha / sqrt((double)lc.r) : lc.alpha / lc.r;
    EXPECT(lora_scale(&lc) == s && lora.scale == (float)s, "scale %g vs %g", lora_scale(&lc), s);

    // The table: PEFT's names and shapes, A [r, in] then B [out, r], targets only.
    const ModelDims d = model_dims(&cfg);
    int expected = 0;
    for (int t = 0; t < LORA_TARGETS; t++) expected += 2 * lc.target[t];
    EXPECT(lora.table.n_tensors == expected * cfg.num_hidden_layers, "%d adapter tensors",
           lora.table.n_tensors);
    const ParamTensor *qa = param_table_find(&lora.table,
                                             "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
    const ParamTensor *ob = param_table_find(&lora.table,
                                             "base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight");
    const ParamTensor *da = param_table_find(&lora.table,
                                             "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight");
    EXPECT(!lc.target[LORA_Q] || (qa && qa->shape[0] == lc.r && qa->shape[1] == cfg.hidden_size),
           "q_proj.lora_A [r, hidden]");
    EXPECT(!lc.target[LORA_O] || (ob && ob->shape[0] == cfg.hidden_size && ob->shape[1] == lc.r),
           "o_proj.lora_B [hidden, r] (in %d)", d.q_dim);
    EXPECT(lc.target[LORA_DOWN] ? da && da->shape[1] == cfg.intermediate_size : da == NULL,
           "down_proj.lora_A [r, intermediate] iff targeted");

    Batch batch;
    build_batch(&batch, cfg.vocab_size);
    AttnMask mask;
    attn_mask_build(batch.lo, batch.hi, ROWS, SEQ, 8, 4, &mask);
    const ModelBatch mb = {ROWS, SEQ, batch.token, batch.target, batch.pos, &mask};
    int n_targets = 0;
    for (int t = 0; t < T; t++) n_targets += batch.target[t] >= 0;
    const float loss_scale = 1.0f / n_targets;

    float *params = malloc(table.total * sizeof(float));
    random_params(&table, params);
    const size_t na = lora.table.total;
    float *adapter = malloc(na * sizeof(float));
    lora_init(&lora, 7, adapter);
    CpuModel *model = cpu_model_create(&cfg, ROWS, SEQ, MODEL_RECOMPUTE_NONE);

    // B = 0 at init: the base's loss, bit for bit.
    const double base_loss = cpu_model_forward(model, params, &mb, NULL);
    cpu_model_set_lora(model, &lora, adapter, NULL);
    EXPECT(cpu_model_forward(model, params, &mb, NULL) == base_loss, "B = 0 changes the loss");
    bool a_in_bound = true, b_zero = true;
    for (int i = 0; i < lora.table.n_tensors; i++) {
        const ParamTensor *p = &lora.table.tensors[i];
        for (size_t j = 0; j < p->numel; j++) {
            if (strstr(p->name, ".lora_B.")) b_zero &= adapter[p->offset + j] == 0.0f;
            else a_in_bound &= fabs(adapter[p->offset + j]) <= 1.0 / sqrt((double)p->shape[1]);
        }
    }
    EXPECT(b_zero && a_in_bound, "init: B zero, A within 1/sqrt(in)");

    // Random nonzero adapters of a scale that matters.
    for (size_t j = 0; j < na; j++) adapter[j] = 0.3f * test_rng_uniform(&rng);
    double *params_d = malloc(table.total * sizeof(double)), *adapter_d = malloc(na * sizeof(double));
    double *merged_d = malloc(table.total * sizeof(double));
    for (size_t i = 0; i < table.total; i++) params_d[i] = params[i];
    for (size_t i = 0; i < na; i++) adapter_d[i] = adapter[i];
    merge_double(&lora, &table, params_d, adapter_d, s, merged_d);
    const Reference ref = {&cfg, &table, &batch};
    const double ref_loss = reference_loss(&ref, merged_d, NULL);
    const double loss = cpu_model_forward(model, params, &mb, NULL);
    EXPECT(fabs(loss - ref_loss) < 1e-5 * ref_loss, "adapted loss %.8g vs reference %.8g", loss,
           ref_loss);

    // Backward with the base frozen: adapter gradients only; the base is not written.
    const uint64_t base_sum = checksum_bytes(params, table.total * sizeof(float));
    float *agrads = calloc(na, sizeof(float));
    cpu_model_set_lora(model, &lora, adapter, agrads);
    const double loss_fb = cpu_model_forward_backward(model, params, NULL, &mb, loss_scale);
    EXPECT(loss_fb == loss, "forward_backward returns the forward loss");
    EXPECT(checksum_bytes(params, table.total * sizeof(float)) == base_sum, "the base changed");

    // Central differences of the double reference through the merge, every coordinate.
    const double h = 1e-5;
    for (int i = 0; i < lora.table.n_tensors; i++) {
        const ParamTensor *p = &lora.table.tensors[i];
        double *numeric = malloc(p->numel * sizeof(double));
        for (size_t j = 0; j < p->numel; j++) {
            double *w = adapter_d + p->offset + j;
            const double saved = *w;
            *w = saved + h;
            merge_double(&lora, &table, params_d, adapter_d, s, merged_d);
            const double plus = reference_loss(&ref, merged_d, NULL);
            *w = saved - h;
            merge_double(&lora, &table, params_d, adapter_d, s, merged_d);
            const double minus = reference_loss(&ref, merged_d, NULL);
            *w = saved;
            numeric[j] = (plus - minus) / (2 * h) * loss_scale;
        }
        const double err = test_relative_error(agrads + p->offset, numeric, p->numel);
        EXPECT(err < GRAD_TOL, "%s: gradient relative error %.3g", p->name, err);
        free(numeric);
    }

    // The chain rule through the merged matmul: the full model at W + s B A.
    float *merged = malloc(table.total * sizeof(float));
    memcpy(merged, params, table.total * sizeof(float));
    lora_merge(&lora, &table, merged, adapter);
    merge_double(&lora, &table, params_d, adapter_d, s, merged_d);
    EXPECT(test_relative_error(merged, merged_d, table.total) < 1e-6, "lora_merge: error %.3g",
           test_relative_error(merged, merged_d, table.total));
    CpuModel *full = cpu_model_create(&cfg, ROWS, SEQ, MODEL_RECOMPUTE_NONE);
    float *fgrads = calloc(table.total, sizeof(float));
    cpu_model_forward_backward(full, merged, fgrads, &mb, loss_scale);
    for (int i = 0; i < lora.table.n_tensors; i++) {
        const ParamTensor *A = &lora.table.tensors[i], *B = lora_b_of(&lora, A);
        if (!B) continue;
        char name[96];
        snprintf(name, sizeof name, "%s", A->name + strlen("base_model.model."));
        strcpy(strstr(name, ".lora_A.weight"), ".weight");
        const ParamTensor *w = param_table_find(&table, name);
        const int r = (int)A->shape[0], out = (int)B->shape[0], in = (int)A->shape[1];
        double *want_a = calloc(A->numel, sizeof(double)), *want_b = calloc(B->numel, sizeof(double));
        const float *dw = fgrads + w->offset;
        for (int o = 0; o < out; o++)
            for (int c = 0; c < in; c++)
                for (int k = 0; k < r; k++) {
                    want_a[(size_t)k * in + c] += s * adapter[B->offset + (size_t)o * r + k] * dw[(size_t)o * in + c];
                    want_b[(size_t)o * r + k] += s * dw[(size_t)o * in + c] * adapter[A->offset + (size_t)k * in + c];
                }
        const double ea = test_relative_error(agrads + A->offset, want_a, A->numel);
        const double eb = test_relative_error(agrads + B->offset, want_b, B->numel);
        EXPECT(ea < GRAD_TOL && eb < GRAD_TOL, "%s: chain rule through the merge: A %.3g, B %.3g",
               name, ea, eb);
        free(want_a), free(want_b);
    }

    // Every recompute mode: the same adapter gradients, bit for bit.
    const ModelRecompute modes[] = {MODEL_RECOMPUTE_MLP, MODEL_RECOMPUTE_LAYER};
    for (int i = 0; i < 2; i++) {
        CpuModel *r = cpu_model_create(&cfg, ROWS, SEQ, modes[i]);
        float *rg = calloc(na, sizeof(float));
        cpu_model_set_lora(r, &lora, adapter, rg);
        cpu_model_forward_backward(r, params, NULL, &mb, loss_scale);
        EXPECT(memcmp(rg, agrads, na * sizeof(float)) == 0, "recompute %s: adapter gradients differ",
               model_recompute_name(modes[i]));
        free(rg);
        cpu_model_free(r);
    }

    attn_mask_free(&mask);
    cpu_model_free(model);
    cpu_model_free(full);
    free(params), free(adapter), free(params_d), free(adapter_d), free(merged_d), free(agrads);
    free(merged), free(fgrads);
    lora_layout_free(&lora);
    param_table_free(&table);
}

int main(void) {
    rng = test_rng_from_env();
    const ModelConfig llama = {.vocab_size = 37, .hidden_size = 16, .intermediate_size = 24,
                               .num_hidden_layers = 2, .num_attention_heads = 4,
                               .num_key_value_heads = 2, .rms_norm_eps = 1e-5f,
                               .rope_theta = 500.0f, .tie_word_embeddings = false};
    run_config("llama, untied embeddings", llama);
    ModelConfig c = llama;
    c.tie_word_embeddings = true;
    run_config("llama, tied embeddings", c);
    c = llama;  // head_dim 8, theta 5000: wavelengths 6.3, 53, 444, 3737 against bands at
                // 32 and 128: one high (kept), one medium (smoothed), two low (scaled)
    c.rope_scaling = (RopeScaling){ROPE_LLAMA3, 4.0f, 1.0f, 4.0f, 128};
    c.rope_theta = 5000.0f, c.head_dim = 8;
    run_config("llama3 rope scaling", c);
    c.rope_scaling = (RopeScaling){.type = ROPE_LINEAR, .factor = 2.5f};
    run_config("linear rope scaling", c);
    c = llama;
    c.attention_bias = true, c.arch = ARCH_QWEN2;
    run_config("qwen2: q/k/v bias", c);
    c = llama;  // head_dim 6 with hidden 16 and 4 heads: q_dim 24 != hidden
    c.qk_norm = true, c.head_dim = 6, c.tie_word_embeddings = true, c.arch = ARCH_QWEN3;
    run_config("qwen3: q/k norm, head_dim 6 != hidden / heads", c);
    const LoraConfig all = {.r = 3, .alpha = 8, .target = {1, 1, 1, 1, 1, 1, 1}};
    run_lora("every projection, qwen3 shapes", c, all);
    check_lora_groups("every projection, qwen3 shapes", c, all);
    LoraConfig some = {.r = 2, .alpha = 5, .rslora = true, .target = {[LORA_Q] = 1, [LORA_V] = 1,
                                                                       [LORA_UP] = 1}};
    c = llama;
    c.attention_bias = true, c.arch = ARCH_QWEN2;
    run_lora("q, v, up under rslora, qwen2 biases", c, some);
    check_lora_groups("q, v, up", c, some);
    some.target[LORA_GATE] = some.target[LORA_DOWN] = true, some.target[LORA_V] = false;
    check_lora_groups("q, gate, up, down", c, some);
    return test_finish();
}
