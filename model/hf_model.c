// Hugging Face model folders in (model/hf_model.h). The defaults of absent keys are
// those of the transformers config classes (LlamaConfig, Qwen2Config, Qwen3Config).
#define _POSIX_C_SOURCE 200809L
#include "model/hf_model.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/output_file.h"
#include "model/safetensors.h"

static const struct {
    const char *model_type, *architecture;
} ARCHS[] = {
    [ARCH_LLAMA] = {"llama", "LlamaForCausalLM"},
    [ARCH_QWEN2] = {"qwen2", "Qwen2ForCausalLM"},
    [ARCH_QWEN3] = {"qwen3", "Qwen3ForCausalLM"},
};

const char *hf_model_type(ModelArch arch) { return ARCHS[arch].model_type; }
const char *hf_architecture(ModelArch arch) { return ARCHS[arch].architecture; }

// An integer key: absent or null gives `def` (required: an error); anything else
// but an integer in [min, max] is an error naming the key.
static int int_key(const json_t *obj, const char *key, int def, bool required, int min, int max,
                   int *out, const char *path, char *err, size_t err_len) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return fail_at(err, err_len, path, 0, "'%s' is missing", key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        char got[48] = "";
        if (json_is_integer(v))
            snprintf(got, sizeof got, ", got %lld", (long long)json_integer_value(v));
        return fail_at(err, err_len, path, 0, "'%s' must be an integer in [%d, %d]%s", key, min,
                       max, got);
    }
    *out = (int)json_integer_value(v);
    return 0;
}

// A number key in (0, max] (a float must hold it: the model keeps floats): absent or
// null gives `def` (required: an error).
static int num_key(const json_t *obj, const char *key, double def, bool required, double max,
                   double *out, const char *path, char *err, size_t err_len) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return fail_at(err, err_len, path, 0, "'%s' is missing", key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return fail_at(err, err_len, path, 0, "'%s' must be a number", key);
    *out = json_number_value(v);
    if (!(*out > 0.0 && *out <= max))
        return fail_at(err, err_len, path, 0, "'%s' must be a number in (0, %g], got %g", key, max,
                       *out);
    return 0;
}

static int bool_key(const json_t *obj, const char *key, bool def, bool *out, const char *path,
                    char *err, size_t err_len) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return fail_at(err, err_len, path, 0, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

// rope_parameters (newer) or rope_theta + rope_scaling (older): theta and the scaling.
static int parse_rope(const json_t *root, ModelConfig *cfg, const char *path, char *err,
                      size_t err_len) {
    const json_t *params = json_object_get(root, "rope_parameters");
    const json_t *scaling = json_object_get(root, "rope_scaling");
    const char *where = "rope_parameters";
    double theta = 10000.0;
    if (params && !json_is_null(params)) {
        if (!json_is_object(params))
            return fail_at(err, err_len, path, 0, "'rope_parameters' must be an object");
        if (!json_object_get(params, "rope_type") && !json_object_get(params, "rope_theta"))
            return fail_at(err, err_len, path, 0,
                           "'rope_parameters' per layer type is not supported");
        if (num_key(params, "rope_theta", 10000.0, false, MODEL_MAX_ROPE_THETA, &theta, path, err, err_len)) return -1;
        scaling = params;
    } else {
        where = "rope_scaling";
        if (num_key(root, "rope_theta", 10000.0, false, MODEL_MAX_ROPE_THETA, &theta, path, err, err_len)) return -1;
    }
    cfg->rope_theta = (float)theta;
    cfg->rope_scaling = (RopeScaling){.type = ROPE_DEFAULT};
    if (!scaling || json_is_null(scaling)) return 0;
    if (!json_is_object(scaling)) return fail_at(err, err_len, path, 0, "'%s' must be an object", where);
    const json_t *type = json_object_get(scaling, "rope_type");
    if (!type) type = json_object_get(scaling, "type");
    const char *name = json_is_string(type) ? json_string_value(type) : "default";
    if (type && !json_is_string(type))
        return fail_at(err, err_len, path, 0, "'%s.rope_type' must be a string", where);
    RopeScaling *s = &cfg->rope_scaling;
    double factor = 1.0, low = 1.0, high = 4.0;
    if (strcmp(name, "default") == 0) return 0;
    if (strcmp(name, "linear") == 0) {
        s->type = ROPE_LINEAR;
        if (num_key(scaling, "factor", 1.0, true, MODEL_MAX_ROPE_FACTOR, &factor, path, err, err_len)) return -1;
    } else if (strcmp(name, "llama3") == 0) {
        s->type = ROPE_LLAMA3;
        if (num_key(scaling, "factor", 1.0, true, MODEL_MAX_ROPE_FACTOR, &factor, path, err, err_len) ||
            num_key(scaling, "low_freq_factor", 1.0, true, MODEL_MAX_ROPE_FACTOR, &low, path, err, err_len) ||
            num_key(scaling, "high_freq_factor", 4.0, true, MODEL_MAX_ROPE_FACTOR, &high, path, err, err_len) ||
            int_key(scaling, "original_max_position_embeddings", 0, true, 1, 1 << 30,
                    &s->original_max_position_embeddings, path, err, err_len))
            return -1;
    } else {
        return fail_at(err, err_len, path, 0,
                       "%s rope_type '%s' is not supported (default, linear, llama3)", where, name);
    }
    s->factor = (float)factor;
    s->low_freq_factor = (float)low;
    s->high_freq_factor = (float)high;
    return 0;
}

// Keys of architectures onepass does not run: sliding windows in use, experts, biases
// other than Qwen2's, non-SiLU activations, dropout.
static int refuse_unsupported(const json_t *root, ModelArch arch, const char *path, char *err,
                              size_t err_len) {
    const json_t *v;
    if ((v = json_object_get(root, "use_sliding_window")) && json_is_true(v))
        return fail_at(err, err_len, path, 0,
                       "'use_sliding_window' true: sliding-window attention is not supported");
    const json_t *layer_types = json_object_get(root, "layer_types");
    size_t i;
    json_t *entry;
    json_array_foreach(layer_types, i, entry) {
        if (!json_is_string(entry) || strcmp(json_string_value(entry), "full_attention") != 0)
            return fail_at(err, err_len, path, 0,
                           "'layer_types'[%zu] is '%s': only full_attention is supported", i,
                           json_is_string(entry) ? json_string_value(entry) : "not a string");
    }
    static const char *const moe_keys[] = {"num_experts", "num_local_experts",
                                           "moe_intermediate_size", "num_experts_per_tok"};
    for (size_t k = 0; k < sizeof moe_keys / sizeof moe_keys[0]; k++)
        if ((v = json_object_get(root, moe_keys[k])) && !json_is_null(v) &&
            !(json_is_integer(v) && json_integer_value(v) == 0))
            return fail_at(err, err_len, path, 0,
                           "'%s': mixture-of-experts models are not supported", moe_keys[k]);
    if ((v = json_object_get(root, "mlp_bias")) && json_is_true(v))
        return fail_at(err, err_len, path, 0, "'mlp_bias' true: MLP biases are not supported");
    if (arch != ARCH_QWEN2 && (v = json_object_get(root, "attention_bias")) && json_is_true(v))
        return fail_at(err, err_len, path, 0,
                       "'attention_bias' true for model_type %s (it adds an o_proj bias) is not "
                       "supported",
                       hf_model_type(arch));
    if ((v = json_object_get(root, "hidden_act")) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "silu") != 0))
        return fail_at(err, err_len, path, 0, "'hidden_act' '%s' is not supported (silu)",
                       json_is_string(v) ? json_string_value(v) : "not a string");
    if ((v = json_object_get(root, "attention_dropout")) && json_is_number(v) &&
        json_number_value(v) != 0.0)
        return fail_at(err, err_len, path, 0,
                       "'attention_dropout' %g is not supported (onepass trains without dropout)",
                       json_number_value(v));
    return 0;
}

// bos/pad: an integer or absent; eos: an integer, a list of them, or absent.
static int parse_token_ids(const json_t *root, HfModelConfig *out, const char *path, char *err,
                           size_t err_len) {
    if (int_key(root, "bos_token_id", -1, false, 0, 1 << 30, &out->bos_token_id, path, err,
                err_len) ||
        int_key(root, "pad_token_id", -1, false, 0, 1 << 30, &out->pad_token_id, path, err,
                err_len))
        return -1;
    const json_t *eos = json_object_get(root, "eos_token_id");
    out->n_eos = 0;
    if (!eos || json_is_null(eos)) return 0;
    if (json_is_integer(eos)) return int_key(root, "eos_token_id", -1, false, 0, 1 << 30,
                                             &out->eos_token_ids[out->n_eos++], path, err, err_len);
    if (!json_is_array(eos) || json_array_size(eos) > HF_MAX_EOS)
        return fail_at(err, err_len, path, 0,
                       "'eos_token_id' must be an integer or a list of at most %d", HF_MAX_EOS);
    size_t i;
    json_t *id;
    json_array_foreach(eos, i, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > (1 << 30))
            return fail_at(err, err_len, path, 0, "'eos_token_id'[%zu] must be an integer >= 0", i);
        out->eos_token_ids[out->n_eos++] = (int)json_integer_value(id);
    }
    return 0;
}

static int parse_root(const json_t *root, HfModelConfig *out, const char *path, char *err,
                      size_t err_len) {
    if (!json_is_object(root)) return fail_at(err, err_len, path, 0, "not a JSON object");
    const json_t *type = json_object_get(root, "model_type");
    if (!json_is_string(type)) return fail_at(err, err_len, path, 0, "'model_type' is missing");
    const char *name = json_string_value(type);
    int arch = -1;
    for (int a = 0; a < (int)(sizeof ARCHS / sizeof ARCHS[0]); a++)
        if (strcmp(name, ARCHS[a].model_type) == 0) arch = a;
    if (arch < 0)
        return fail_at(err, err_len, path, 0,
                       "model_type '%s' is not supported (llama, qwen2, qwen3)", name);
    ModelConfig *c = &out->cfg;
    c->arch = (ModelArch)arch;
    if (refuse_unsupported(root, c->arch, path, err, err_len)) return -1;
    double eps;
    if (int_key(root, "vocab_size", 0, true, 1, MODEL_MAX_VOCAB_SIZE, &c->vocab_size, path, err,
                err_len) ||
        int_key(root, "hidden_size", 0, true, 1, MODEL_MAX_HIDDEN_SIZE, &c->hidden_size, path,
                err, err_len) ||
        int_key(root, "intermediate_size", 0, true, 1, MODEL_MAX_INTERMEDIATE_SIZE,
                &c->intermediate_size, path, err, err_len) ||
        int_key(root, "num_hidden_layers", 0, true, 1, MODEL_MAX_LAYERS, &c->num_hidden_layers,
                path, err, err_len) ||
        int_key(root, "num_attention_heads", 0, true, 1, MODEL_MAX_HEADS,
                &c->num_attention_heads, path, err, err_len) ||
        int_key(root, "num_key_value_heads", c->num_attention_heads, false, 1, MODEL_MAX_HEADS,
                &c->num_key_value_heads, path, err, err_len) ||
        int_key(root, "head_dim", c->arch == ARCH_QWEN3 ? 128 : 0, false, 1, MODEL_MAX_HEAD_DIM,
                &c->head_dim, path, err, err_len) ||
        num_key(root, "rms_norm_eps", 1e-6, false, MODEL_MAX_RMS_NORM_EPS, &eps, path, err,
                err_len) ||
        bool_key(root, "tie_word_embeddings", false, &c->tie_word_embeddings, path, err,
                 err_len) ||
        int_key(root, "max_position_embeddings", 0, false, 1, 1 << 30,
                &out->max_position_embeddings, path, err, err_len) ||
        parse_rope(root, c, path, err, err_len) || parse_token_ids(root, out, path, err, err_len))
        return -1;
    c->rms_norm_eps = (float)eps;
    c->attention_bias = c->arch == ARCH_QWEN2;  // Qwen2's q/k/v always carry biases
    c->qk_norm = c->arch == ARCH_QWEN3;
    const json_t *dtype = json_object_get(root, "dtype");
    if (!json_is_string(dtype)) dtype = json_object_get(root, "torch_dtype");
    snprintf(out->dtype, sizeof out->dtype, "%s", json_is_string(dtype) ? json_string_value(dtype) : "");
    return 0;
}

int hf_config_parse(const char *text, const char *path, HfModelConfig *out, char *err,
                    size_t err_len) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root) return fail_at(err, err_len, path, jerr.line, "invalid JSON: %s", jerr.text);
    const int rc = parse_root(root, out, path, err, err_len);
    json_decref(root);
    return rc;
}

// ---------------------------------------------------------------- folder files

const HfFolderFile HF_FOLDER_FILES[] = {
    {"config.json", HF_JSON_MAX_BYTES},
    {"generation_config.json", HF_JSON_MAX_BYTES},
    {"model.safetensors.index.json", HF_JSON_MAX_BYTES},
    {"tokenizer_config.json", HF_JSON_MAX_BYTES},
    {"special_tokens_map.json", HF_JSON_MAX_BYTES},
    {"added_tokens.json", HF_JSON_MAX_BYTES},
    {"tokenizer.json", HF_TOKENIZER_MAX_BYTES},
    {"tokenizer.model", HF_TOKENIZER_MAX_BYTES},
    {"vocab.json", HF_TOKENIZER_MAX_BYTES},
    {"merges.txt", HF_TOKENIZER_MAX_BYTES},
    {"chat_template.jinja", HF_TOKENIZER_MAX_BYTES},
    {"adapter_config.json", HF_JSON_MAX_BYTES},
};
const int HF_N_FOLDER_FILES = (int)(sizeof HF_FOLDER_FILES / sizeof HF_FOLDER_FILES[0]);

size_t hf_file_max_bytes(const char *name) {
    for (int i = 0; i < HF_N_FOLDER_FILES; i++)
        if (strcmp(HF_FOLDER_FILES[i].name, name) == 0) return HF_FOLDER_FILES[i].max_bytes;
    return HF_JSON_MAX_BYTES;
}

int hf_folder_check(const char *dir, char *err, size_t err_len) {
    char path[4200];
    for (int i = 0; i < HF_N_FOLDER_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, HF_FOLDER_FILES[i].name);
        struct stat st;
        if (stat(path, &st) != 0) continue;  // absent (or a dangling link): nothing to read
        if (!S_ISREG(st.st_mode)) return fail_at(err, err_len, path, 0, "not a regular file");
        if ((uint64_t)st.st_size > (uint64_t)HF_FOLDER_FILES[i].max_bytes)
            return fail_at(err, err_len, path, 0, "%lld bytes, over the limit of %zu",
                           (long long)st.st_size, HF_FOLDER_FILES[i].max_bytes);
    }
    return 0;
}

json_t *hf_json_load(const char *path, size_t max_bytes, char *err, size_t err_len) {
    size_t len;
    char *text = input_file_read(path, max_bytes, &len, err, err_len);
    if (!text) return NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root) fail_at(err, err_len, path, jerr.line, "invalid JSON: %s", jerr.text);
    return root;
}

int hf_config_read(const char *dir, HfModelConfig *out, char *err, size_t err_len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) != 0)
        return fail_at(err, err_len, path, 0, "cannot open (not a Hugging Face model folder)");
    json_t *root = hf_json_load(path, HF_JSON_MAX_BYTES, err, err_len);
    if (!root) return -1;
    const int rc = parse_root(root, out, path, err, err_len);
    json_decref(root);
    return rc;
}

// ---------------------------------------------------------------- weights

// A weight_map value: a plain file name of the folder.
static bool plain_file_name(const char *name) {
    return name && *name && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

// dir's model.safetensors.index.json, validated: a weight_map object of plain file names.
// Returns the index (absent: NULL with *absent), or NULL with a message.
static json_t *index_load(const char *dir, bool *absent, char *err, size_t err_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    struct stat st;
    *absent = lstat(path, &st) != 0;
    if (*absent) return NULL;
    json_t *index = hf_json_load(path, HF_JSON_MAX_BYTES, err, err_len);
    if (!index) return NULL;
    const json_t *map = json_object_get(index, "weight_map");
    const char *key;
    json_t *file;
    const char *why = !json_is_object(map) ? "has no 'weight_map' object"
                      : json_object_size(map) == 0 ? "names no weight file in 'weight_map'"
                                                   : NULL;
    json_object_foreach((json_t *)map, key, file) {
        if (why) break;
        if (!plain_file_name(json_string_value(file))) {
            char what[600];
            if (json_is_string(file))
                snprintf(what, sizeof what, "'%s' is not a file name of the folder",
                         json_string_value(file));
            else
                snprintf(what, sizeof what, "is not a string");
            fail_at(err, err_len, path, 0, "weight_map['%s']: %s", key, what);
            json_decref(index);
            return NULL;
        }
    }
    if (why) {
        fail_at(err, err_len, path, 0, "%s", why);
        json_decref(index);
        return NULL;
    }
    return index;
}

int hf_weight_files(const char *dir, HfWeightFiles *out, char *err, size_t err_len) {
    *out = (HfWeightFiles){0};
    bool absent;
    json_t *index = index_load(dir, &absent, err, err_len);
    if (!index && !absent) return -1;
    const char *key;
    json_t *file;
    int cap = 0;
    json_object_foreach(json_object_get(index, "weight_map"), key, file) {
        const char *name = json_string_value(file);
        bool listed = false;
        for (int i = 0; i < out->n && !listed; i++) listed = strcmp(out->names[i], name) == 0;
        if (!listed) ARRAY_PUSH(out->names, out->n, cap, strdup(name));
    }
    json_decref(index);
    out->sharded = out->n > 0;
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const bool has_model = stat(path, &st) == 0;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    out->adapter = !out->sharded && !has_model && stat(path, &st) == 0;
    if (!out->sharded)
        ARRAY_PUSH(out->names, out->n, cap,
                   strdup(out->adapter ? "adapter_model.safetensors" : "model.safetensors"));
    return 0;
}

void hf_weight_files_free(HfWeightFiles *f) {
    for (int i = 0; i < f->n; i++) free(f->names[i]);
    free(f->names);
    *f = (HfWeightFiles){0};
}

typedef struct {
    SafeTensorsFile *files;
    int n_files;
} Shards;

static void shards_free(Shards *s) {
    for (int i = 0; i < s->n_files; i++) safetensors_file_free(&s->files[i]);
    free(s->files);
}

// Opens the weight files of dir (hf_weight_files); with an index, each tensor it names
// must be in its file.
static int shards_open(const char *dir, Shards *s, char *err, size_t err_len) {
    memset(s, 0, sizeof *s);
    HfWeightFiles files;
    if (hf_weight_files(dir, &files, err, err_len)) return -1;
    s->files = xcalloc((size_t)files.n, sizeof *s->files);
    char path[4200];
    int rc = 0;
    for (int k = 0; k < files.n && rc == 0; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, files.names[k]);
        rc = safetensors_read(path, &s->files[s->n_files++], err, err_len);
    }
    bool absent;
    json_t *index = rc == 0 && files.sharded ? index_load(dir, &absent, err, err_len) : NULL;
    if (rc == 0 && files.sharded && !index) rc = -1;
    const char *name;
    json_t *file;
    json_object_foreach(json_object_get(index, "weight_map"), name, file) {
        if (rc) break;
        const char *fname = json_string_value(file);
        for (int k = 0; k < files.n; k++)
            if (strcmp(files.names[k], fname) == 0 && !safetensors_find(&s->files[k], name)) {
                snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
                rc = fail_at(err, err_len, path, 0, "tensor '%s' is not in %s as weight_map says",
                             name, fname);
                break;
            }
    }
    json_decref(index);
    hf_weight_files_free(&files);
    return rc;
}

static const SafeTensorsFile *shard_of(const Shards *s, const char *name) {
    for (int i = 0; i < s->n_files; i++)
        if (safetensors_find(&s->files[i], name)) return &s->files[i];
    return NULL;
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// A file tensor that is not in the table: a tied lm_head.weight equal to the embedding
// and rotary_emb.inv_freq buffers (recomputed from the config) are accepted.
static int check_extra(const SafeTensorsFile *f, const SafeTensorInfo *t, const ParamTable *table,
                       const float *params, char *err, size_t err_len) {
    if (ends_with(t->name, ".rotary_emb.inv_freq")) return 0;
    const ParamTensor *embed = param_table_find(table, "model.embed_tokens.weight");
    if (strcmp(t->name, "lm_head.weight") == 0 && embed) {
        float *copy = xmalloc(embed->numel * sizeof(float));
        const int rc = safetensors_copy_f32(f, t->name, embed->ndim, embed->shape, copy, err,
                                            err_len);
        const bool same = rc == 0 &&
                          memcmp(copy, params + embed->offset, embed->numel * sizeof(float)) == 0;
        free(copy);
        if (rc) return -1;
        if (same) return 0;
        return fail_at(err, err_len, f->path, 0,
                       "tensor 'lm_head.weight' differs from model.embed_tokens.weight but "
                       "tie_word_embeddings is true");
    }
    return fail_at(err, err_len, f->path, 0,
                   "unexpected tensor '%s': not in the model (not a parameter of this model's config)", t->name);
}

int hf_weights_load(const char *dir, const ParamTable *table, float *params, char *err,
                    size_t err_len) {
    Shards s;
    int rc = shards_open(dir, &s, err, err_len);
    for (int i = 0; rc == 0 && i < table->n_tensors; i++) {
        const ParamTensor *p = &table->tensors[i];
        const SafeTensorsFile *f = shard_of(&s, p->name);
        if (!f) {
            rc = fail_at(err, err_len, dir, 0, "tensor '%s' is missing", p->name);
            break;
        }
        rc = safetensors_copy_f32(f, p->name, p->ndim, p->shape, params + p->offset, err, err_len);
    }
    for (int i = 0; rc == 0 && i < s.n_files; i++)
        for (int j = 0; rc == 0 && j < s.files[i].n_tensors; j++)
            if (!param_table_find(table, s.files[i].tensors[j].name))
                rc = check_extra(&s.files[i], &s.files[i].tensors[j], table, params, err, err_len);
    shards_free(&s);
    return rc;
}

bool hf_folder_has_weights(const char *dir) {
    static const char *const kinds[] = {".safetensors", ".bin", ".pt", ".pth", ".ckpt",
                                        ".gguf", ".h5", ".msgpack", "model.safetensors.index.json"};
    DIR *d = opendir(dir);
    if (!d) return true;  // unreadable: let the loader say why
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));)
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0] && !found; k++)
            found = ends_with(e->d_name, kinds[k]);
    closedir(d);
    return found;
}
