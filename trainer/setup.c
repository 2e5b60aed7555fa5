#define _POSIX_C_SOURCE 200809L
#include "trainer/setup.h"

#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/check.h"
#include "data/tokenize.h"
#include "model/safetensors.h"

static int int_key(const Config *c, const char *key) {
    long long v = config_int(c, key);
    if (v <= 0 || v > (1 << 30)) fatal("config key '%s': must be a positive integer, got %lld", key, v);
    return (int)v;
}

ModelConfig model_config_from(const Config *c) {
    ModelConfig mc = {
        .vocab_size = int_key(c, "model.vocab_size"),
        .hidden_size = int_key(c, "model.hidden_size"),
        .intermediate_size = int_key(c, "model.intermediate_size"),
        .num_hidden_layers = int_key(c, "model.num_hidden_layers"),
        .num_attention_heads = int_key(c, "model.num_attention_heads"),
        .num_key_value_heads = int_key(c, "model.num_key_value_heads"),
        .rms_norm_eps = (float)config_num(c, "model.rms_norm_eps"),
        .rope_theta = (float)config_num(c, "model.rope_theta"),
        .tie_word_embeddings = config_bool(c, "model.tie_word_embeddings"),
    };
    return mc;
}

Tokenizer *tokenizer_from(const Config *c, const ModelConfig *mc) {
    const char *path = config_str(c, "data.tokenizer");
    if (!path)
        fatal("config key 'data.tokenizer': a SentencePiece .model, a tokenizer.json or a model "
              "folder is required");
    char err[1024];
    Tokenizer *tok = tokenizer_load(path, err, sizeof err);
    if (!tok) fatal("config key 'data.tokenizer': %s", err);
    if (template_check_tokenizer(tok, err, sizeof err) != 0)
        fatal("config key 'data.tokenizer': %s: %s", path, err);
    if (tokenizer_vocab_size(tok) > mc->vocab_size)
        fatal("config key 'model.vocab_size': %d is smaller than the tokenizer's %d pieces (%s)",
              mc->vocab_size, tokenizer_vocab_size(tok), path);
    return tok;
}

void params_load_or_init(const ModelConfig *mc, const ParamTable *table, const char *weights,
                         uint64_t seed, float *params) {
    if (!weights) {
        params_init(mc, table, seed, params);
        return;
    }
    char path[4096], err[1024];
    struct stat st;
    if (stat(weights, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(path, sizeof path, "%s/model.safetensors", weights);
    else
        snprintf(path, sizeof path, "%s", weights);
    SafeTensorsFile f;
    if (safetensors_read(path, &f, err, sizeof err) != 0 ||
        safetensors_load_table(&f, table, "", params, err, sizeof err) != 0)
        fatal("loading weights: %s", err);
    safetensors_file_free(&f);
}

Config *config_from_args(int argc, char **argv, const char *command, const char *extra,
                         const char **extra_value) {
    const char *path = NULL;
    char **overrides = NULL;
    int n_overrides = 0;
    int rest = config_take_args(argc, argv, &path, &overrides, &n_overrides);
    for (int i = 0; i < rest; i++) {
        if (extra && strcmp(argv[i], extra) == 0 && i + 1 < rest) {
            *extra_value = argv[++i];
            continue;
        }
        fatal("train %s: unexpected argument '%s' (usage: train %s --config FILE [--set key=value]...%s%s)",
              command, argv[i], command, extra ? " " : "", extra ? extra : "");
    }
    Config *c = config_load(path, n_overrides, overrides);
    free(overrides);
    return c;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
