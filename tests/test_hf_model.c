// Hugging Face model folders in: the committed fixtures of tests/data/hf/ (built by
// scripts/fixtures/make_hf_fixtures.py with transformers) load and the CPU forward matches
// the transformers fp32 logits (<= 1e-5 relative) and loss (<= 1e-6 relative); config.json
// in both spellings; every refusal (config key, missing/extra tensor, shape, dtype) with
// its message.
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "model/hf_model.h"
#include "model/safetensors.h"
#include "tests/test_child.h"
#include "tests/test_hf_util.h"
#include "tests/test_util.h"
#include "trainer/setup.h"

static char dir[] = "/tmp/test_hf_model_XXXXXX";

static const char *const FIXTURES[] = {"llama3_scaling", "llama_linear_f16", "qwen2_bias_bf16",
                                       "qwen3_qknorm_sharded"};


// The CPU forward's logits error (relative to the largest reference logit) and loss
// error (relative) against the fixture's transformers reference. plain_rope: run it
// without its RoPE scaling (the check must notice).
static void fixture_errors(const char *name, bool plain_rope, double *logit_err, double *loss_err) {
    char folder[512];
    snprintf(folder, sizeof folder, "tests/data/hf/%s", name);
    HfModelConfig hf;
    ParamTable table;
    float *params = load_hf_folder(folder, &hf, &table);
    if (plain_rope) hf.cfg.rope_scaling.type = ROPE_DEFAULT;
    const ModelConfig *cfg = &hf.cfg;
    const int V = cfg->vocab_size;
    HfReference ref;
    hf_reference_load(folder, V, &ref);
    const int S = ref.S;
    double *want_d = xmalloc((size_t)S * V * sizeof(double));
    for (size_t i = 0; i < (size_t)S * V; i++) want_d[i] = ref.logits[i];

    AttnMask mask;
    attn_mask_build(ref.lo, ref.hi, 1, S, 8, 8, &mask);
    const ModelBatch b = {1, S, ref.token, ref.target, ref.pos, &mask};
    CpuModel *m = cpu_model_create(cfg, 1, S, MODEL_RECOMPUTE_NONE);
    float *logits = xmalloc((size_t)S * V * sizeof(float));
    cpu_model_logits(m, params, &b, logits);
    *logit_err = test_relative_error(logits, want_d, (size_t)S * V);
    const double loss = cpu_model_forward(m, params, &b, NULL) / ref.n_targets;
    *loss_err = fabs(loss - ref.loss) / ref.loss;
    printf("%s%s: logits relative error %.3g, loss %.9g vs transformers %.9g\n", name,
           plain_rope ? " without its rope scaling" : "", *logit_err, loss, ref.loss);

    cpu_model_free(m);
    attn_mask_free(&mask);
    hf_reference_free(&ref);
    free(want_d), free(logits), free(params);
    param_table_free(&table);
}

static void test_fixture(const char *name) {
    double logit_err, loss_err;
    fixture_errors(name, false, &logit_err, &loss_err);
    EXPECT(logit_err <= 1e-5, "%s: logits relative error %.3g", name, logit_err);
    EXPECT(loss_err <= 1e-6, "%s: loss relative error %.3g", name, loss_err);
}

// The comparison is sharp enough to see a missing RoPE scaling.
static void test_fixture_sensitivity(void) {
    double logit_err, loss_err;
    fixture_errors("llama3_scaling", true, &logit_err, &loss_err);
    EXPECT(logit_err > 1e-3, "plain RoPE on the llama3 fixture: logits error only %.3g", logit_err);
    fixture_errors("llama_linear_f16", true, &logit_err, &loss_err);
    EXPECT(logit_err > 1e-3, "plain RoPE on the linear fixture: logits error only %.3g", logit_err);
}

// What each fixture's config.json becomes.
static void test_fixture_configs(void) {
    HfModelConfig hf;
    char err[1024];
    EXPECT(hf_config_read("tests/data/hf/llama3_scaling", &hf, err, sizeof err) == 0, "%s", err);
    EXPECT(hf.cfg.arch == ARCH_LLAMA && hf.cfg.rope_scaling.type == ROPE_LLAMA3 &&
               hf.cfg.rope_scaling.factor == 8.0f &&
               hf.cfg.rope_scaling.original_max_position_embeddings == 256 &&
               hf.cfg.rope_theta == 500000.0f && !hf.cfg.tie_word_embeddings &&
               !hf.cfg.attention_bias && !hf.cfg.qk_norm && hf.max_position_embeddings == 512 &&
               hf.bos_token_id == 1 && hf.n_eos == 1 && hf.eos_token_ids[0] == 2 &&
               strcmp(hf.dtype, "float32") == 0,
           "llama3 fixture config");
    EXPECT(hf_config_read("tests/data/hf/qwen2_bias_bf16", &hf, err, sizeof err) == 0, "%s", err);
    EXPECT(hf.cfg.arch == ARCH_QWEN2 && hf.cfg.attention_bias && hf.cfg.tie_word_embeddings &&
               strcmp(hf.dtype, "bfloat16") == 0,
           "qwen2 fixture config");
    EXPECT(hf_config_read("tests/data/hf/qwen3_qknorm_sharded", &hf, err, sizeof err) == 0, "%s", err);
    EXPECT(hf.cfg.arch == ARCH_QWEN3 && hf.cfg.qk_norm && hf.cfg.head_dim == 16 &&
               model_dims(&hf.cfg).q_dim == 64,
           "qwen3 fixture config");
}

static const char *BASE = "\"vocab_size\": 64, \"hidden_size\": 16, \"intermediate_size\": 32, "
                          "\"num_hidden_layers\": 1, \"num_attention_heads\": 2";

static int parse(const char *model_type, const char *extra, HfModelConfig *hf, char *err,
                 size_t err_len) {
    char text[2048];
    snprintf(text, sizeof text, "{\"model_type\": \"%s\", %s%s%s}", model_type, BASE,
             *extra ? ", " : "", extra);
    return hf_config_parse(text, "x/config.json", hf, err, err_len);
}

static void test_spellings(void) {
    HfModelConfig hf;
    char err[1024];
    // Older: rope_theta, rope_scaling {"type"}, torch_dtype; eos a list; kv heads absent.
    EXPECT(parse("llama",
                 "\"rope_theta\": 500000.0, \"torch_dtype\": \"bfloat16\", \"eos_token_id\": [5, 7], "
                 "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}",
                 &hf, err, sizeof err) == 0,
           "older spelling: %s", err);
    EXPECT(hf.cfg.rope_theta == 500000.0f && hf.cfg.rope_scaling.type == ROPE_LINEAR &&
               hf.cfg.rope_scaling.factor == 4.0f && strcmp(hf.dtype, "bfloat16") == 0 &&
               hf.n_eos == 2 && hf.eos_token_ids[1] == 7 && hf.cfg.num_key_value_heads == 2 &&
               hf.bos_token_id == -1 && hf.cfg.head_dim == 0,
           "older spelling values");
    // Newer: rope_parameters with rope_theta inside, dtype; rope_scaling null.
    EXPECT(parse("qwen3",
                 "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 1000.0, "
                 "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                 "\"original_max_position_embeddings\": 64}, \"dtype\": \"float16\", "
                 "\"rope_scaling\": null, \"head_dim\": 32",
                 &hf, err, sizeof err) == 0,
           "newer spelling: %s", err);
    EXPECT(hf.cfg.rope_theta == 1000.0f && hf.cfg.rope_scaling.type == ROPE_LLAMA3 &&
               hf.cfg.rope_scaling.high_freq_factor == 4.0f && strcmp(hf.dtype, "float16") == 0 &&
               hf.cfg.head_dim == 32 && hf.cfg.qk_norm,
           "newer spelling values");
    EXPECT(parse("qwen3", "", &hf, err, sizeof err) == 0 && hf.cfg.head_dim == 128 &&
               hf.cfg.rope_theta == 10000.0f && hf.cfg.rms_norm_eps == 1e-6f,
           "qwen3 defaults: head_dim 128 as Qwen3Config");
}

static void model_dims_of(void *arg) { model_dims((const ModelConfig *)arg); }

// model_dims keeps the same bounds for a ModelConfig from anywhere, in 64-bit: heads x
// head_dim past int is refused naming the keys, not wrapped.
static void test_model_dims_bounds(void) {
    ModelConfig cfg = {.vocab_size = 64, .hidden_size = 16, .intermediate_size = 32,
                       .num_hidden_layers = 1, .num_attention_heads = 65536,
                       .num_key_value_heads = 1, .head_dim = 65536, .rms_norm_eps = 1e-6f,
                       .rope_theta = 10000.0f};
    char out[1024];
    EXPECT(test_run_in_child(model_dims_of, &cfg, out, sizeof out) == 1 &&
               strstr(out, "model.num_attention_heads 65536 is over its limit 1024"),
           "heads x head_dim past int refused: %s", out);
    cfg.num_attention_heads = 2;
    cfg.num_hidden_layers = 1 << 30;
    EXPECT(test_run_in_child(model_dims_of, &cfg, out, sizeof out) == 1 &&
               strstr(out, "model.num_hidden_layers 1073741824 is over its limit 1024"),
           "layers past the limit refused: %s", out);
    cfg.num_hidden_layers = 1;
    cfg.head_dim = 64;
    cfg.rope_theta = INFINITY;
    EXPECT(test_run_in_child(model_dims_of, &cfg, out, sizeof out) == 1 &&
               strstr(out, "model.rope_theta"),
           "an infinite rope_theta refused: %s", out);
}

static void test_config_refusals(void) {
    const struct { const char *model_type, *extra, *message; } cases[] = {
        {"mistral", "", "model_type 'mistral' is not supported (llama, qwen2, qwen3)"},
        {"qwen2", "\"use_sliding_window\": true", "'use_sliding_window' true"},
        {"qwen3", "\"layer_types\": [\"sliding_attention\"]",
         "'layer_types'[0] is 'sliding_attention'"},
        {"qwen3", "\"num_experts\": 8", "'num_experts': mixture-of-experts"},
        {"llama", "\"mlp_bias\": true", "'mlp_bias' true"},
        {"llama", "\"attention_bias\": true", "'attention_bias' true for model_type llama"},
        {"llama", "\"hidden_act\": \"gelu\"", "'hidden_act' 'gelu' is not supported"},
        {"llama", "\"attention_dropout\": 0.1", "'attention_dropout' 0.1"},
        {"llama", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}",
         "rope_scaling rope_type 'yarn' is not supported (default, linear, llama3)"},
        {"llama", "\"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}",
         "rope_parameters rope_type 'dynamic' is not supported"},
        {"llama", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}",
         "'low_freq_factor' is missing"},
        {"llama", "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"}}",
         "'rope_parameters' per layer type is not supported"},
        {"llama", "\"num_key_value_heads\": 0",
         "'num_key_value_heads' must be an integer in [1, 1024], got 0"},
        // The ranges of the model.* keys hold for config.json too: a size past its key's
        // maximum, a heads x head_dim that int cannot hold, a RoPE base or factor that a
        // float cannot hold, a zero epsilon.
        {"llama", "\"num_hidden_layers\": 1073741824",
         "'num_hidden_layers' must be an integer in [1, 1024], got 1073741824"},
        {"llama", "\"vocab_size\": 16777217", "'vocab_size' must be an integer in [1, 16777216]"},
        {"llama", "\"hidden_size\": 65537", "'hidden_size' must be an integer in [1, 65536]"},
        {"llama", "\"intermediate_size\": 262145",
         "'intermediate_size' must be an integer in [1, 262144]"},
        {"llama", "\"num_attention_heads\": 1024, \"head_dim\": 4194304",
         "'head_dim' must be an integer in [1, 65536], got 4194304"},
        {"llama", "\"rope_theta\": 1e39", "'rope_theta' must be a number in (0, 1e+12], got 1e+39"},
        {"llama", "\"rope_theta\": 0", "'rope_theta' must be a number in (0, 1e+12], got 0"},
        {"llama", "\"rms_norm_eps\": 0", "'rms_norm_eps' must be a number in (0, 1], got 0"},
        {"llama", "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 1e39}",
         "'factor' must be a number in (0, 1e+06], got 1e+39"},
        {"llama", "\"eos_token_id\": \"x\"", "'eos_token_id' must be an integer or a list"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        HfModelConfig hf;
        char err[1024] = "";
        EXPECT(parse(cases[i].model_type, cases[i].extra, &hf, err, sizeof err) != 0 &&
                   strstr(err, cases[i].message) && strncmp(err, "x/config.json: ", 15) == 0,
               "refusal '%s': got '%s'", cases[i].message, err);
    }
    HfModelConfig hf;
    char err[1024];
    EXPECT(hf_config_parse("{\"model_type\": \"llama\"}", "x/config.json", &hf, err, sizeof err) != 0 &&
               strstr(err, "'vocab_size' is missing"),
           "missing key: %s", err);
    EXPECT(hf_config_read("tests/data", &hf, err, sizeof err) != 0 &&
               strstr(err, "tests/data/config.json: cannot open (not a Hugging Face model folder)"),
           "no config.json: %s", err);
}

// Writes the folder dir/name with config_from's config.json and a model.safetensors of
// the given entries, then loads it into params [table->total]: hf_weights_load's 0 or
// -1 with err.
static int write_and_load(const char *name, const char *config_from, const SafeTensorOut *entries,
                          int n, const ParamTable *table, float *params, char *err, size_t err_len) {
    char folder[600], cmd[2048], path[700];
    snprintf(folder, sizeof folder, "%s/%s", dir, name);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/", folder, config_from, folder);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(path, sizeof path, "%s/model.safetensors", folder);
    CHECK(safetensors_write(path, entries, n, NULL, 0, err, err_len) == 0, "%s", err);
    return hf_weights_load(folder, table, params, err, err_len);
}

static void test_weight_refusals(void) {
    const char *src = "tests/data/hf/llama3_scaling";
    HfModelConfig hf;
    ParamTable table;
    float *params = load_hf_folder(src, &hf, &table);
    const int n = table.n_tensors;
    SafeTensorOut *entries = xcalloc((size_t)n + 1, sizeof *entries);
    safetensors_table_entries(&table, "", params, entries);
    float *back = xmalloc(table.total * sizeof(float));
    char folder[600], err[1024];

    // F32 round trip: the same bytes.
    EXPECT(write_and_load("same", src, entries, n, &table, back, err, sizeof err) == 0 &&
               memcmp(back, params, table.total * sizeof(float)) == 0,
           "rewritten folder loads the same: %s", err);

    // Missing: the last tensor (lm_head.weight) left out.
    EXPECT(write_and_load("missing", src, entries, n - 1, &table, back, err, sizeof err) != 0 &&
               strstr(err, "tensor 'lm_head.weight' is missing"),
           "missing tensor: %s", err);

    // Extra: one more tensor.
    SafeTensorOut extra = entries[1];
    extra.name = "model.layers.0.self_attn.o_proj.bias";
    entries[n] = extra;
    EXPECT(write_and_load("extra", src, entries, n + 1, &table, back, err, sizeof err) != 0 &&
               strstr(err, "unexpected tensor 'model.layers.0.self_attn.o_proj.bias'"),
           "extra tensor: %s", err);

    // Shape: k_proj [16, 32] stored transposed.
    SafeTensorOut *q = NULL;
    for (int i = 0; i < n; i++)
        if (strcmp(entries[i].name, "model.layers.1.self_attn.k_proj.weight") == 0) q = &entries[i];
    const int64_t rows = q->shape[0];
    q->shape[0] = q->shape[1], q->shape[1] = rows;
    EXPECT(write_and_load("shape", src, entries, n, &table, back, err, sizeof err) != 0 &&
               strstr(err, "tensor 'model.layers.1.self_attn.k_proj.weight' has shape [32,16], "
                           "expected [16,32]"),
           "shape mismatch: %s", err);
    q->shape[1] = q->shape[0], q->shape[0] = rows;

    // A tied model whose file also holds lm_head.weight: accepted when it equals the
    // embedding, refused otherwise.
    HfModelConfig tied_hf;
    ParamTable tied;
    const char *tied_src = "tests/data/hf/qwen2_bias_bf16";
    float *tied_params = load_hf_folder(tied_src, &tied_hf, &tied);
    SafeTensorOut *tied_entries = xcalloc((size_t)tied.n_tensors + 1, sizeof *tied_entries);
    safetensors_table_entries(&tied, "", tied_params, tied_entries);
    tied_entries[tied.n_tensors] = tied_entries[0];
    tied_entries[tied.n_tensors].name = "lm_head.weight";
    float *tied_back = xmalloc(tied.total * sizeof(float));
    const int n_tied = tied.n_tensors + 1;
    EXPECT(write_and_load("tied_same", tied_src, tied_entries, n_tied, &tied, tied_back, err,
                          sizeof err) == 0,
           "tied lm_head equal to the embedding: %s", err);
    tied_entries[tied.n_tensors].data = tied_params + 5;  // shifted: other values
    EXPECT(write_and_load("tied_other", tied_src, tied_entries, n_tied, &tied, tied_back, err,
                          sizeof err) != 0 &&
               strstr(err, "'lm_head.weight' differs from model.embed_tokens.weight"),
           "tied lm_head different: %s", err);

    // Sharded index naming a tensor its shard lacks.
    snprintf(folder, sizeof folder, "%s/index", dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && cp tests/data/hf/qwen3_qknorm_sharded/* %s/ && sed -i "
             "'s/\"lm_head.weight\": \"model-00002/\"lm_head.weight\": \"model-00001/' "
             "%s/model.safetensors.index.json",
             folder, folder, folder);
    CHECK(system(cmd) == 0, "%s", cmd);
    HfModelConfig q3;
    ParamTable q3_table;
    float *q3_params = load_hf_folder("tests/data/hf/qwen3_qknorm_sharded", &q3, &q3_table);
    EXPECT(hf_weights_load(folder, &q3_table, q3_params, err, sizeof err) != 0 &&
               strstr(err, "tensor 'lm_head.weight' is not in model-00001-of-00002.safetensors"),
           "index pointing at the wrong shard: %s", err);

    // An index that is not JSON: its parse error (line and text) is the message.
    snprintf(cmd, sizeof cmd, "printf '{\"weight_map\": {\n  \"a\": 1,,\n}}' > %s/model.safetensors.index.json",
             folder);
    CHECK(system(cmd) == 0, "%s", cmd);
    EXPECT(hf_weights_load(folder, &q3_table, q3_params, err, sizeof err) != 0 &&
               strstr(err, "model.safetensors.index.json:2: invalid JSON: "),
           "an unparsable index keeps its JSON error: %s", err);
    // A weight_map file outside the folder ("../") is refused, whoever loads it.
    snprintf(cmd, sizeof cmd,
             "cp tests/data/hf/qwen3_qknorm_sharded/model.safetensors.index.json %s/ && sed -i "
             "'s|\"model-00001|\"../index/model-00001|' %s/model.safetensors.index.json",
             folder, folder);
    CHECK(system(cmd) == 0, "%s", cmd);
    EXPECT(hf_weights_load(folder, &q3_table, q3_params, err, sizeof err) != 0 &&
               strstr(err, "'../index/model-00001-of-00002.safetensors' is not a file name"),
           "a shard outside the folder refused: %s", err);
    HfWeightFiles files;
    EXPECT(hf_weight_files(folder, &files, err, sizeof err) != 0 &&
               strstr(err, "'../index/model-00001-of-00002.safetensors' is not a file name"),
           "hf_weight_files refuses it too: %s", err);

    for (int i = 0; i < tied.n_tensors; i++) free((char *)tied_entries[i].name);
    safetensors_entries_free(entries, n);
    free(entries), free(back), free(params), free(tied_entries), free(tied_params), free(tied_back);
    free(q3_params);
    param_table_free(&table);
    param_table_free(&tied);
    param_table_free(&q3_table);
}

typedef struct {
    const HfModelConfig *hf;
    const ParamTable *table;
    const char *folder;
    float *params;
} LoadArgs;

static void load_in_child(void *arg) {
    const LoadArgs *a = arg;
    params_load_or_init(&a->hf->cfg, a->table, a->folder, 1, a->params);
}

// model.init_from's weights are checked finite at load: a NaN or an infinity is refused
// naming the tensor, before a step trains on it.
static void test_nonfinite_weights(void) {
    HfModelConfig hf;
    ParamTable table;
    const char *src = "tests/data/hf/llama3_scaling";
    float *params = load_hf_folder(src, &hf, &table);
    SafeTensorOut *entries = xcalloc((size_t)table.n_tensors, sizeof *entries);
    safetensors_table_entries(&table, "", params, entries);
    const ParamTensor *norm = param_table_find(&table, "model.layers.1.post_attention_layernorm.weight");
    const float bad[2] = {NAN, INFINITY};
    for (int k = 0; k < 2; k++) {
        char folder[600], cmd[2048], path[700], err[1024], out[2048];
        snprintf(folder, sizeof folder, "%s/nonfinite%d", dir, k);
        snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/", folder, src, folder);
        CHECK(system(cmd) == 0, "%s", cmd);
        const float keep = params[norm->offset + 3];
        params[norm->offset + 3] = bad[k];
        snprintf(path, sizeof path, "%s/model.safetensors", folder);
        CHECK(safetensors_write(path, entries, table.n_tensors, NULL, 0, err, sizeof err) == 0, "%s", err);
        params[norm->offset + 3] = keep;
        float *loaded = xmalloc(table.total * sizeof(float));
        LoadArgs args = {&hf, &table, folder, loaded};
        EXPECT(test_run_in_child(load_in_child, &args, out, sizeof out) == 1 &&
                   strstr(out, "tensor 'model.layers.1.post_attention_layernorm.weight' holds") &&
                   strstr(out, k == 0 ? "nan" : "inf"),
               "non-finite weight %d refused: %s", k, out);
        free(loaded);
    }
    safetensors_entries_free(entries, table.n_tensors);
    free(entries);
    free(params);
    param_table_free(&table);
}

int main(void) {
    test_rng_from_env();
    if (!mkdtemp(dir)) fatal("mkdtemp failed");
    for (size_t i = 0; i < sizeof FIXTURES / sizeof FIXTURES[0]; i++) test_fixture(FIXTURES[i]);
    test_fixture_sensitivity();
    test_fixture_configs();
    test_spellings();
    test_config_refusals();
    test_model_dims_bounds();
    test_nonfinite_weights();
    test_weight_refusals();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_finish();
}
