#define _POSIX_C_SOURCE 200809L
#include "trainer/setup.h"

#include <math.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/check.h"
#include "data/tokenize.h"
#include "model/hf_model.h"
#include "model/safetensors.h"
#include "trainer/checkpoint.h"
#include "trainer/data_options.h"
#include "trainer/run_dir.h"
#include "data/template.h"

bool model_source_from(const RunConfig *c, HfModelConfig *out) {
    const char *dir = c->model.init_from;
    if (!dir) return false;
    config_folder_check(c, &c->model.init_from);
    char err[1024];
    if (hf_config_read(dir, out, err, sizeof err) != 0) fatal("config key 'model.init_from': %s", err);
    return true;
}

// model.* keys the user gave must agree with the checkpoint's config.json.
static void check_against_checkpoint(const RunConfig *c, const ModelConfig *hf, const char *dir) {
    const struct { const long long *key; int value; } ints[] = {
        {&c->model.vocab_size, hf->vocab_size},
        {&c->model.hidden_size, hf->hidden_size},
        {&c->model.intermediate_size, hf->intermediate_size},
        {&c->model.num_hidden_layers, hf->num_hidden_layers},
        {&c->model.num_attention_heads, hf->num_attention_heads},
        {&c->model.num_key_value_heads, hf->num_key_value_heads},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (config_was_set(c, ints[i].key) && *ints[i].key != ints[i].value)
            fatal("config key '%s' is %lld but model.init_from %s/config.json says %d",
                  config_key_of(c, ints[i].key)->key, *ints[i].key, dir, ints[i].value);
    const struct { const double *key; float value; } nums[] = {
        {&c->model.rms_norm_eps, hf->rms_norm_eps},
        {&c->model.rope_theta, hf->rope_theta},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (config_was_set(c, nums[i].key) && (float)*nums[i].key != nums[i].value)
            fatal("config key '%s' is %g but model.init_from %s/config.json says %g",
                  config_key_of(c, nums[i].key)->key, *nums[i].key, dir, (double)nums[i].value);
    if (config_was_set(c, &c->model.tie_word_embeddings) &&
        c->model.tie_word_embeddings != hf->tie_word_embeddings)
        fatal("config key 'model.tie_word_embeddings' is %s but model.init_from %s/config.json "
              "says %s",
              hf->tie_word_embeddings ? "false" : "true", dir,
              hf->tie_word_embeddings ? "true" : "false");
}

// data.tokenizer with model.add_tokens added; say: a line for each listed token the
// tokenizer has as one id already (left as it is) and one for those added.
static Tokenizer *tokenizer_load_added(const RunConfig *c, bool say) {
    const char *path = c->data.tokenizer;
    if (!path)
        fatal("config key 'data.tokenizer': a SentencePiece .model, a tokenizer.json or a model "
              "folder is required");
    config_folder_check(c, &c->data.tokenizer);
    char err[1024];
    Tokenizer *tok = tokenizer_load(path, err, sizeof err);
    if (!tok) fatal("config key 'data.tokenizer': %s", err);
    const char *const *tokens = c->model.add_tokens.items;
    const int n = c->model.add_tokens.n;
    const char **missing = xcalloc((size_t)n + 1, sizeof(char *));
    int n_missing = 0;
    for (int i = 0; i < n; i++) {
        int32_t ids[2];
        if (tokenizer_encode_flags(tok, tokens[i], TOKENIZER_CONTINUE, ids, 2) != 1)
            missing[n_missing++] = tokens[i];
        else if (say)
            printf("model.add_tokens: '%s' is already one id (%d) of %s: left as it is\n",
                   tokens[i], ids[0], path);
    }
    if (tokenizer_add_tokens(tok, missing, n_missing, err, sizeof err) != 0)
        fatal("config key 'model.add_tokens': %s: %s", path, err);
    const int32_t *ids;
    for (int i = 0; say && i < tokenizer_added_ids(tok, &ids); i++)
        printf("%s'%s' %d%s", i ? ", " : "model.add_tokens: added (token id): ", missing[i], ids[i],
               i + 1 == n_missing ? "\n" : "");
    free(missing);
    return tok;
}

static bool adds_tokens(const RunConfig *c) { return c->model.add_tokens.n > 0; }

// The model's configuration for a tokenizer of `grown` pieces with model.add_tokens
// added (0 when that list is empty).
static ModelConfig model_config_grown(const RunConfig *c, int grown) {
    // model.add_tokens grows the vocabulary to the tokenizer's new size, never shrinks it.
    const bool vocab_set = config_was_set(c, &c->model.vocab_size);
    const long long vocab_key = c->model.vocab_size;
    HfModelConfig hf;
    if (model_source_from(c, &hf)) {
        if (grown > hf.cfg.vocab_size) {
            if (vocab_set && vocab_key != grown)
                fatal("config key 'model.vocab_size' is %lld but model.add_tokens grows "
                      "model.init_from's %d rows to the tokenizer's %d", vocab_key,
                      hf.cfg.vocab_size, grown);
            hf.cfg.vocab_size = grown;
        }
        check_against_checkpoint(c, &hf.cfg, c->model.init_from);
        model_dims(&hf.cfg);  // fatal, naming the key, for what the model cannot run
        return hf.cfg;
    }
    if (grown > vocab_key && vocab_set)
        fatal("config key 'model.vocab_size' is %lld but data.tokenizer with model.add_tokens has "
              "%d pieces", vocab_key, grown);
    // config_load has range-checked every model.* size (the ranges of trainer/config_keys.h).
    ModelConfig mc = {
        // Not set: the tokenizer's size (grown: it, model.add_tokens' included).
        .vocab_size = !vocab_set && grown > 0 ? grown : grown > vocab_key ? grown : (int)vocab_key,
        .hidden_size = (int)c->model.hidden_size,
        .intermediate_size = (int)c->model.intermediate_size,
        .num_hidden_layers = (int)c->model.num_hidden_layers,
        .num_attention_heads = (int)c->model.num_attention_heads,
        .num_key_value_heads = (int)c->model.num_key_value_heads,
        .rms_norm_eps = (float)c->model.rms_norm_eps,
        .rope_theta = (float)c->model.rope_theta,
        .tie_word_embeddings = c->model.tie_word_embeddings,
    };
    return mc;
}

// A token id of model.init_from's config.json or generation_config.json (`key`) that the
// tokenizer does not have: fatal, naming both files.
static void check_special_id(const RunConfig *c, const Tokenizer *tok, const char *file,
                             const char *key, long long id) {
    if (id < 0) return;
    if (id < tokenizer_vocab_size(tok) && tokenizer_id_to_piece(tok, (int)id)) return;
    fatal("config key 'data.tokenizer': %s has no token id %lld, which model.init_from's "
          "%s/%s names as %s: the tokenizer is not the model's", c->data.tokenizer, id,
          c->model.init_from, file, key);
}

// generation_config.json's token ids (bos, eos as an integer or a list, pad), when the
// folder has that file.
static void check_generation_ids(const RunConfig *c, const Tokenizer *tok) {
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", c->model.init_from);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return;  // absent (or unreadable: hf_config_read's files decide the model)
    static const char *const KEYS[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (int k = 0; k < 3; k++) {
        const json_t *v = json_object_get(root, KEYS[k]);
        size_t i;
        const json_t *id;
        if (json_is_integer(v)) check_special_id(c, tok, "generation_config.json", KEYS[k], json_integer_value(v));
        else if (json_is_array(v))
            json_array_foreach(v, i, id) if (json_is_integer(id))
                check_special_id(c, tok, "generation_config.json", KEYS[k], json_integer_value(id));
    }
    json_decref(root);
}

// With model.init_from: the tokenizer's ids must be rows of its embedding (model.add_tokens
// grows it only by the tokens it adds) and its special token ids ids of the tokenizer.
static void check_tokenizer_of_source(const RunConfig *c, const Tokenizer *tok) {
    HfModelConfig hf;
    if (!model_source_from(c, &hf)) return;
    if (tokenizer_loaded_size(tok) > hf.cfg.vocab_size)
        fatal("config key 'data.tokenizer': %s has %d token ids but model.init_from %s has %d "
              "embedding rows: the tokenizer is not the model's", c->data.tokenizer,
              tokenizer_loaded_size(tok), c->model.init_from, hf.cfg.vocab_size);
    check_special_id(c, tok, "config.json", "bos_token_id", hf.bos_token_id);
    check_special_id(c, tok, "config.json", "pad_token_id", hf.pad_token_id);
    for (int i = 0; i < hf.n_eos; i++)
        check_special_id(c, tok, "config.json", "eos_token_id", hf.eos_token_ids[i]);
    check_generation_ids(c, tok);
}

static void check_vocab_fits(const RunConfig *c, const ModelConfig *mc, const Tokenizer *tok) {
    if (tokenizer_vocab_size(tok) > mc->vocab_size)
        fatal("config key 'model.vocab_size': %d is smaller than the tokenizer's %d pieces (%s)",
              mc->vocab_size, tokenizer_vocab_size(tok), c->data.tokenizer);
}

// A random init's vocabulary comes from the tokenizer unless model.vocab_size is given.
static bool derives_vocab(const RunConfig *c) {
    return !c->model.init_from && !config_was_set(c, &c->model.vocab_size);
}

ModelConfig model_config_with(const RunConfig *c, const Tokenizer *tok) {
    const bool sized = adds_tokens(c) || derives_vocab(c);
    const ModelConfig mc = model_config_grown(c, sized ? tokenizer_vocab_size(tok) : 0);
    check_vocab_fits(c, &mc, tok);
    return mc;
}

ModelConfig model_config_from(const RunConfig *c) {
    if (!adds_tokens(c) && !derives_vocab(c)) return model_config_grown(c, 0);
    Tokenizer *tok = tokenizer_load_added(c, false);
    const ModelConfig mc = model_config_grown(c, tokenizer_vocab_size(tok));
    tokenizer_free(tok);
    return mc;
}

// The template's tokens the tokenizer lacks, as a JSON list for model.add_tokens.
static void missing_controls(const Tokenizer *tok, const ChatTemplate *t, char *out, size_t len) {
    size_t used = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < t->n_controls && used < len; i++) {
        int32_t ids[2];
        if (tokenizer_encode_flags(tok, t->controls[i], TOKENIZER_CONTINUE, ids, 2) == 1) continue;
        used += (size_t)snprintf(out + used, len - used, "%s\"%s\"", used > 1 ? "," : "",
                                 t->controls[i]);
    }
    if (used < len) snprintf(out + used, len - used, "]");
}

Tokenizer *tokenizer_with_added(const RunConfig *c) {
    Tokenizer *tok = tokenizer_load_added(c, true);
    check_tokenizer_of_source(c, tok);
    const ChatTemplate *t = template_from_config(c);
    char err[1024], missing[512];
    if (template_check_tokenizer(tok, t, err, sizeof err) != 0) {
        missing_controls(tok, t, missing, sizeof missing);
        // The onepass template by default: a model folder without a template onepass knows.
        if (!c->data.chat_template && c->model.init_from && t == &TEMPLATE_ONEPASS)
            fatal("config key 'data.chat_template': model.init_from %s has no chat template "
                  "(chat_template.jinja, or tokenizer_config.json's chat_template), so the onepass "
                  "template was chosen and %s; set data.chat_template to the model's family (%s)",
                  c->model.init_from, err, template_names());
        fatal("config key 'data.tokenizer': %s: %s; model.add_tokens adds what the tokenizer "
              "lacks (--set model.add_tokens='%s')", c->data.tokenizer, err, missing);
    }
    return tok;
}

// Rows [first, end) of the embedding and of an untied LM head := that matrix's mean row
// over rows [0, n_old).
static void mean_rows(const ModelConfig *mc, const ParamTable *table, float *params, int n_old,
                      int first, int end) {
    const char *names[] = {"model.embed_tokens.weight", mc->tie_word_embeddings ? NULL : "lm_head.weight"};
    const size_t C = (size_t)mc->hidden_size;
    double *sum = xcalloc(C, sizeof(double));  // [C]
    for (int k = 0; k < 2 && names[k]; k++) {
        const ParamTensor *p = param_table_find(table, names[k]);
        CHECK(p && p->shape[0] == mc->vocab_size && end <= mc->vocab_size, "%s rows", names[k]);
        float *w = params + p->offset;  // [vocab_size, C]
        memset(sum, 0, C * sizeof(double));
        for (size_t r = 0; r < (size_t)n_old; r++)
            for (size_t j = 0; j < C; j++) sum[j] += w[r * C + j];
        for (size_t r = (size_t)first; r < (size_t)end; r++)
            for (size_t j = 0; j < C; j++) w[r * C + j] = (float)(sum[j] / n_old);
    }
    free(sum);
}

// An HF folder's weights whose vocabulary is smaller than the model's (model.add_tokens):
// loaded at their size, the new rows the mean row.
static int load_grown(const ModelConfig *mc, const ParamTable *table, const char *dir, int n_old,
                      float *params, char *err, size_t err_len) {
    ModelConfig old = *mc;
    old.vocab_size = n_old;
    ParamTable small;
    param_table_build(&old, &small);
    float *loaded = xmalloc(small.total * sizeof(float));  // [small.total]
    const int rc = hf_weights_load(dir, &small, loaded, err, err_len);
    for (int i = 0; rc == 0 && i < small.n_tensors; i++) {
        const ParamTensor *from = &small.tensors[i], *to = param_table_find(table, from->name);
        CHECK(to && to->numel >= from->numel, "%s", from->name);
        memcpy(params + to->offset, loaded + from->offset, from->numel * sizeof(float));
    }
    if (rc == 0) mean_rows(mc, table, params, n_old, n_old, mc->vocab_size);
    free(loaded);
    param_table_free(&small);
    return rc;
}

void params_init_added_rows(const ModelConfig *mc, const ParamTable *table, const Tokenizer *tok,
                            const char *weights, float *params) {
    HfModelConfig source;
    char err[1024];
    if (hf_config_read(weights, &source, err, sizeof err) != 0) fatal("loading weights: %s", err);
    const int first = tokenizer_loaded_size(tok), end = tokenizer_vocab_size(tok);
    if (first >= end) return;
    mean_rows(mc, table, params, source.cfg.vocab_size, first, end);
    printf("model.add_tokens: rows %d..%d of the embedding%s are its mean row over %s's %d rows\n",
           first, end - 1, mc->tie_word_embeddings ? "" : " and of lm_head", weights,
           source.cfg.vocab_size);
}

// Loaded weights must be finite: the first NaN or infinity is fatal, naming the tensor.
static void check_finite(const ParamTable *table, const float *params, const char *weights) {
    for (int i = 0; i < table->n_tensors; i++) {
        const ParamTensor *t = &table->tensors[i];
        for (size_t j = 0; j < t->numel; j++)
            if (!isfinite(params[t->offset + j]))
                fatal("loading weights: %s: tensor '%s' holds %g at element %zu (a diverged or "
                      "corrupt model)", weights, t->name, (double)params[t->offset + j], j);
    }
}

static void params_load(const ModelConfig *mc, const ParamTable *table, const char *weights,
                        float *params);

void params_load_or_init(const ModelConfig *mc, const ParamTable *table, const char *weights,
                         uint64_t seed, float *params) {
    if (!weights) {
        params_init(mc, table, seed, params);
        return;
    }
    params_load(mc, table, weights, params);
    check_finite(table, params, weights);
}

static void params_load(const ModelConfig *mc, const ParamTable *table, const char *weights,
                        float *params) {
    char path[4096], err[1024];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", weights);
    if (stat(path, &st) == 0) {  // a Hugging Face model folder (or a checkpoint: one too)
        HfModelConfig source;
        const int rc = hf_config_read(weights, &source, err, sizeof err) != 0 ? -1
                       : source.cfg.vocab_size < mc->vocab_size
                           ? load_grown(mc, table, weights, source.cfg.vocab_size, params, err, sizeof err)
                           : hf_weights_load(weights, table, params, err, sizeof err);
        if (rc != 0) fatal("loading weights: %s", err);
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

// The value of the last "key=value" override of key, or NULL.
static const char *override_of(const char *key, int n, char *const *overrides) {
    const char *value = NULL;
    const size_t len = strlen(key);
    for (int i = 0; i < n; i++)
        if (strncmp(overrides[i], key, len) == 0 && overrides[i][len] == '=') value = overrides[i] + len + 1;
    return value;
}

// A training run's config. train.resume=latest names out_dir's newest checkpoint; a
// resume without --config takes the checkpoint's own config (its run record) with the
// --set keys over it, out_dir defaulting to the checkpoint's folder.
static RunConfig *config_for_run(const char *path, int n, char **overrides) {
    const char *resume = override_of("train.resume", n, overrides);
    char err[1024], dir[4200], where[4400];
    if (!resume || path) {
        RunConfig *c = config_load(path, n, overrides);
        if (c->train.resume && strcmp(c->train.resume, "latest") == 0) {
            if (run_dir_latest_checkpoint(c->out_dir, dir, sizeof dir, err, sizeof err) != 0)
                fatal("config key 'train.resume': latest: %s", err);
            config_set_string(c, &c->train.resume, dir);
            printf("train.resume latest: %s\n", dir);
        }
        return c;
    }
    const char *out_dir = override_of("out_dir", n, overrides);
    if (strcmp(resume, "latest") == 0) {
        if (!out_dir) out_dir = config_key_find("out_dir")->def_str;
        if (run_dir_latest_checkpoint(out_dir, dir, sizeof dir, err, sizeof err) != 0)
            fatal("config key 'train.resume': latest: %s", err);
        printf("train.resume latest: %s\n", dir);
    } else {
        snprintf(dir, sizeof dir, "%s", resume);
    }
    char *record = NULL;
    if (checkpoint_read_run_record(dir, &record, err, sizeof err) != 0)
        fatal("config key 'train.resume': %s", err);
    if (!record) fatal("config key 'train.resume': %s has no run record; resume it with its --config", dir);
    json_t *root = json_loads(record, 0, NULL);
    free(record);
    char *config_text = root ? json_dumps(json_object_get(root, "config"), JSON_COMPACT) : NULL;
    char *set_text = root && json_object_get(root, "set_keys")
                         ? json_dumps(json_object_get(root, "set_keys"), JSON_COMPACT) : NULL;
    json_decref(root);
    if (!config_text) fatal("config key 'train.resume': %s: the run record does not parse", dir);
    snprintf(where, sizeof where, "%s (its run record)", dir);
    RunConfig *c = config_load_saved(config_text, set_text, where, n, overrides);
    free(config_text);
    free(set_text);
    config_set_string(c, &c->train.resume, dir);
    if (!out_dir) {  // the checkpoint's folder
        char *copy = strdup(dir);
        config_set_string(c, &c->out_dir, dirname(copy));
        free(copy);
    }
    printf("config: %s's own, with the --set keys over it\n", dir);
    return c;
}

RunConfig *config_from_args(int argc, char **argv, const char *command, const char *extra,
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
    RunConfig *c = strcmp(command, "run") == 0 ? config_for_run(path, n_overrides, overrides)
                                                : config_load(path, n_overrides, overrides);
    free(overrides);
    return c;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hf_export_from(const RunConfig *c, const ModelConfig *mc, const Tokenizer *tok, HfExport *out) {
    HfModelConfig source;
    const bool from_hf = model_source_from(c, &source);
    *out = (HfExport){.dtype = from_hf ? SAVE_BF16 : SAVE_F32};
    const char *dtype = c->train.save_dtype;
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
        out->hf.max_position_embeddings = (int)c->data.seq_len;
    }
    out->hf.cfg = *mc;
}

int hf_write_added_tokens(const char *dir, const Tokenizer *tok, char *err, size_t err_len) {
    const int32_t *ids;
    const int n = tokenizer_added_ids(tok, &ids);
    const char **pieces = xcalloc((size_t)n + 1, sizeof *pieces);
    for (int i = 0; i < n; i++) pieces[i] = tokenizer_id_to_piece(tok, ids[i]);
    const int rc = hf_add_tokens(dir, ids, pieces, n, err, err_len);
    free(pieces);
    return rc;
}
