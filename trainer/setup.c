#define _POSIX_C_SOURCE 200809L
#include "trainer/setup.h"

#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/check.h"
#include "data/tokenize.h"
#include "model/hf_model.h"
#include "model/safetensors.h"
#include "trainer/data_options.h"
#include "data/template.h"

bool model_source_from(const Config *c, HfModelConfig *out) {
    const char *dir = config_str(c, "model.init_from");
    if (!dir) return false;
    char err[1024];
    if (hf_config_read(dir, out, err, sizeof err) != 0) fatal("config key 'model.init_from': %s", err);
    return true;
}

// model.* keys the user gave must agree with the checkpoint's config.json.
static void check_against_checkpoint(const Config *c, const ModelConfig *hf, const char *dir) {
    const struct { const char *key; int value; } ints[] = {
        {"model.vocab_size", hf->vocab_size},
        {"model.hidden_size", hf->hidden_size},
        {"model.intermediate_size", hf->intermediate_size},
        {"model.num_hidden_layers", hf->num_hidden_layers},
        {"model.num_attention_heads", hf->num_attention_heads},
        {"model.num_key_value_heads", hf->num_key_value_heads},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (config_was_set(c, ints[i].key) && config_int(c, ints[i].key) != ints[i].value)
            fatal("config key '%s' is %lld but model.init_from %s/config.json says %d", ints[i].key,
                  config_int(c, ints[i].key), dir, ints[i].value);
    const struct { const char *key; float value; } nums[] = {
        {"model.rms_norm_eps", hf->rms_norm_eps},
        {"model.rope_theta", hf->rope_theta},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (config_was_set(c, nums[i].key) && (float)config_num(c, nums[i].key) != nums[i].value)
            fatal("config key '%s' is %g but model.init_from %s/config.json says %g", nums[i].key,
                  config_num(c, nums[i].key), dir, (double)nums[i].value);
    if (config_was_set(c, "model.tie_word_embeddings") &&
        config_bool(c, "model.tie_word_embeddings") != hf->tie_word_embeddings)
        fatal("config key 'model.tie_word_embeddings' is %s but model.init_from %s/config.json "
              "says %s",
              hf->tie_word_embeddings ? "false" : "true", dir,
              hf->tie_word_embeddings ? "true" : "false");
}

ModelConfig model_config_from(const Config *c) {
    HfModelConfig hf;
    if (model_source_from(c, &hf)) {
        check_against_checkpoint(c, &hf.cfg, config_str(c, "model.init_from"));
        model_dims(&hf.cfg);  // fatal, naming the key, for what the model cannot run
        return hf.cfg;
    }
    // config_load has range-checked every model.* size (trainer/config.c RANGES).
    ModelConfig mc = {
        .vocab_size = (int)config_int(c, "model.vocab_size"),
        .hidden_size = (int)config_int(c, "model.hidden_size"),
        .intermediate_size = (int)config_int(c, "model.intermediate_size"),
        .num_hidden_layers = (int)config_int(c, "model.num_hidden_layers"),
        .num_attention_heads = (int)config_int(c, "model.num_attention_heads"),
        .num_key_value_heads = (int)config_int(c, "model.num_key_value_heads"),
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
    if (template_check_tokenizer(tok, template_from_config(c), err, sizeof err) != 0)
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
    snprintf(path, sizeof path, "%s/config.json", weights);
    if (stat(path, &st) == 0) {  // a Hugging Face model folder (or a checkpoint: one too)
        if (hf_weights_load(weights, table, params, err, sizeof err) != 0)
            fatal("loading weights: %s", err);
        return;
    }
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

void hf_export_from(const Config *c, const ModelConfig *mc, const Tokenizer *tok, HfExport *out) {
    HfModelConfig source;
    const bool from_hf = model_source_from(c, &source);
    *out = (HfExport){.dtype = from_hf ? SAVE_BF16 : SAVE_F32};
    const char *dtype = config_str(c, "train.save_dtype");
    char err[256];
    if (dtype && save_dtype_parse(dtype, &out->dtype, err, sizeof err))
        fatal("config key 'train.save_dtype': %s", err);
    const int end_of_turn = tokenizer_piece_to_id(tok, template_from_config(c)->end_of_turn);
    out->generation_eos_token_id = end_of_turn;
    if (from_hf) {
        out->hf = source;
    } else {
        out->hf.bos_token_id = out->hf.pad_token_id = -1;
        if (end_of_turn >= 0) out->hf.eos_token_ids[out->hf.n_eos++] = end_of_turn;
        out->hf.max_position_embeddings = (int)config_int(c, "data.seq_len");
    }
    out->hf.cfg = *mc;
}
