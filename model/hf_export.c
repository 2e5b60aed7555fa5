// Hugging Face model folders out (model/hf_export.h).
#define _POSIX_C_SOURCE 200809L
#include "model/hf_export.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/output_file.h"
#include "model/peft.h"

#define DEFAULT_SHARD_BYTES ((size_t)5 << 30)  // save_pretrained's "5GB"

static const struct {
    const char *name, *torch, *safetensors;
} DTYPES[] = {
    [SAVE_F32] = {"f32", "float32", "F32"},
    [SAVE_BF16] = {"bf16", "bfloat16", "BF16"},
    [SAVE_F16] = {"f16", "float16", "F16"},
};

int save_dtype_parse(const char *name, SaveDtype *out, char *err, size_t err_len) {
    for (int d = 0; d < (int)(sizeof DTYPES / sizeof DTYPES[0]); d++)
        if (name && strcmp(name, DTYPES[d].name) == 0) {
            *out = (SaveDtype)d;
            return 0;
        }
    return fail(err, err_len, "dtype '%s' is not one of bf16, f16, f32", name ? name : "null");
}

const char *save_dtype_torch_name(SaveDtype d) { return DTYPES[d].torch; }

// The shortest decimal that reads back as this float, as a JSON real (so 1e-5f is
// written 1e-05, not 9.9999997473787516e-06).
static json_t *json_float(float v) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    return json_real(strtod(buf, NULL));
}

static int write_json(const char *path, json_t *j, char *err, size_t err_len) {
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(j);
    const size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len] = '\n', text[len + 1] = '\0';
    const int rc = write_file_atomic(path, text, len + 1, err, err_len);
    free(text);
    return rc;
}

static json_t *token_ids(const int *ids, int n) {
    if (n == 0) return json_null();
    if (n == 1) return json_integer(ids[0]);
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *config_json(const HfExport *e) {
    const ModelConfig *c = &e->hf.cfg;
    const ModelDims d = model_dims(c);
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", hf_architecture(c->arch)));
    json_object_set_new(j, "model_type", json_string(hf_model_type(c->arch)));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(j, "head_dim", json_integer(d.head_dim));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "max_position_embeddings",
                        json_integer(e->hf.max_position_embeddings > 0 ? e->hf.max_position_embeddings
                                                                       : 4096));
    json_object_set_new(j, "rms_norm_eps", json_float(c->rms_norm_eps));
    // The older spelling (rope_theta, rope_scaling): what every transformers release reads.
    json_object_set_new(j, "rope_theta", json_float(c->rope_theta));
    const RopeScaling *r = &c->rope_scaling;
    if (r->type == ROPE_LINEAR)
        json_object_set_new(j, "rope_scaling", json_pack("{s:s, s:o}", "rope_type", "linear",
                                                         "factor", json_float(r->factor)));
    else if (r->type == ROPE_LLAMA3)
        json_object_set_new(
            j, "rope_scaling",
            json_pack("{s:s, s:o, s:o, s:o, s:i}", "rope_type", "llama3", "factor",
                      json_float(r->factor), "low_freq_factor", json_float(r->low_freq_factor),
                      "high_freq_factor", json_float(r->high_freq_factor),
                      "original_max_position_embeddings", r->original_max_position_embeddings));
    else
        json_object_set_new(j, "rope_scaling", json_null());
    if (c->arch != ARCH_QWEN2) json_object_set_new(j, "attention_bias", json_false());
    if (c->arch == ARCH_LLAMA) json_object_set_new(j, "mlp_bias", json_false());
    if (c->arch != ARCH_LLAMA) {
        json_object_set_new(j, "use_sliding_window", json_false());
        json_object_set_new(j, "sliding_window", json_null());
        json_object_set_new(j, "max_window_layers", json_integer(c->num_hidden_layers));
    }
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    json_object_set_new(j, "initializer_range", json_real(0.02));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(j, "bos_token_id",
                        e->hf.bos_token_id >= 0 ? json_integer(e->hf.bos_token_id) : json_null());
    json_object_set_new(j, "eos_token_id", token_ids(e->hf.eos_token_ids, e->hf.n_eos));
    json_object_set_new(j, "pad_token_id",
                        e->hf.pad_token_id >= 0 ? json_integer(e->hf.pad_token_id) : json_null());
    json_object_set_new(j, "dtype", json_string(DTYPES[e->dtype].torch));
    json_object_set_new(j, "torch_dtype", json_string(DTYPES[e->dtype].torch));
    json_object_set_new(j, "use_cache", json_true());
    return j;
}

static json_t *generation_config_json(const HfExport *e) {
    json_t *j = json_object();
    if (e->hf.bos_token_id >= 0) json_object_set_new(j, "bos_token_id", json_integer(e->hf.bos_token_id));
    if (e->generation_eos_token_id >= 0)
        json_object_set_new(j, "eos_token_id", json_integer(e->generation_eos_token_id));
    else if (e->hf.n_eos > 0)
        json_object_set_new(j, "eos_token_id", token_ids(e->hf.eos_token_ids, e->hf.n_eos));
    if (e->hf.pad_token_id >= 0) json_object_set_new(j, "pad_token_id", json_integer(e->hf.pad_token_id));
    return j;
}

// The table's tensors in the export dtype: 16-bit copies (malloc'd into *halves) or the
// fp32 buffer itself.
static SafeTensorOut *export_entries(const ParamTable *table, const float *params, SaveDtype dtype,
                                     uint16_t **halves) {
    SafeTensorOut *entries = xcalloc((size_t)table->n_tensors, sizeof *entries);
    safetensors_table_entries(table, "", params, entries);
    *halves = NULL;
    if (dtype == SAVE_F32) return entries;
    *halves = xmalloc(table->total * sizeof(uint16_t));
    for (size_t i = 0; i < table->total; i++)
        (*halves)[i] = dtype == SAVE_BF16 ? float_to_bf16(params[i]) : float_to_f16(params[i]);
    for (int i = 0; i < table->n_tensors; i++) {
        entries[i].dtype = DTYPES[dtype].safetensors;
        entries[i].data16 = *halves + table->tensors[i].offset;
    }
    return entries;
}

// Weights of an earlier save into the same folder (another shard count) must not stay.
static void remove_stale_weights(const char *dir) {
    char path[4096];
    DIR *d = opendir(dir);
    for (struct dirent *ent = d ? readdir(d) : NULL; ent; ent = readdir(d)) {
        int a, b;
        char tail[32];
        if (sscanf(ent->d_name, "model-%5d-of-%5d.safetens%31s", &a, &b, tail) == 3 &&
            strcmp(tail, "ors") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
            unlink(path);
        }
    }
    if (d) closedir(d);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    unlink(path);
}

// Tensors in table order, a new shard when the next tensor would pass shard_bytes.
static int write_weights(const char *dir, const ParamTable *table, const SafeTensorOut *entries,
                         const HfExport *e, char *err, size_t err_len) {
    const size_t elem = e->dtype == SAVE_F32 ? 4 : 2;
    const size_t limit = e->shard_bytes ? e->shard_bytes : DEFAULT_SHARD_BYTES;
    int *shard_of = xmalloc((size_t)table->n_tensors * sizeof(int));
    int n_shards = 0;
    size_t in_shard = 0, total = 0;
    for (int i = 0; i < table->n_tensors; i++) {
        const size_t bytes = table->tensors[i].numel * elem;
        if (n_shards == 0 || (in_shard > 0 && in_shard + bytes > limit)) n_shards++, in_shard = 0;
        shard_of[i] = n_shards - 1;
        in_shard += bytes;
        total += bytes;
    }
    remove_stale_weights(dir);
    char path[4096];
    int rc = 0;
    if (n_shards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = safetensors_write(path, entries, table->n_tensors, e->meta, e->n_meta, err, err_len);
        free(shard_of);
        return rc;
    }
    json_t *map = json_object();
    for (int s = 0, first = 0; s < n_shards && rc == 0; s++) {
        int last = first;
        while (last < table->n_tensors && shard_of[last] == s) last++;
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        for (int i = first; i < last; i++) json_object_set_new(map, entries[i].name, json_string(name));
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = safetensors_write(path, entries + first, last - first, e->meta, e->n_meta, err, err_len);
        first = last;
    }
    free(shard_of);
    if (rc) {
        json_decref(map);
        return rc;
    }
    json_t *index = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                              "weight_map", map);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return write_json(path, index, err, err_len);
}

int make_dirs(const char *path, char *err, size_t err_len) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        bool end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return fail(err, err_len, "%s: cannot create directory: %s", buf, strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    return 0;
}

int hf_export_write(const char *dir, const ParamTable *table, const float *params,
                    const HfExport *e, char *err, size_t err_len) {
    if (make_dirs(dir, err, err_len)) return -1;
    if (e->lora)  // a PEFT adapter folder: the table is the adapters'
        return peft_adapter_write(dir, e->lora, params, e->base_model, e->meta, e->n_meta, err,
                                  err_len);
    uint16_t *halves;
    SafeTensorOut *entries = export_entries(table, params, e->dtype, &halves);
    int rc = write_weights(dir, table, entries, e, err, err_len);
    safetensors_entries_free(entries, table->n_tensors);
    free(entries);
    free(halves);
    char path[4096];
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        rc = write_json(path, config_json(e), err, err_len);
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        rc = write_json(path, generation_config_json(e), err, err_len);
    }
    return rc;
}

// Copies the regular file src (of at most max_bytes, else refused by its size) to dst
// through output_open, in chunks: memory stays bounded whatever the file.
static int copy_file(const char *src, const char *dst, size_t max_bytes, char *err,
                     size_t err_len) {
    FILE *f = input_file_open(src, err, err_len);
    if (!f) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || (uint64_t)st.st_size > (uint64_t)max_bytes) {
        fclose(f);
        return fail_at(err, err_len, src, 0, "%lld bytes, over the limit of %zu",
                       (long long)st.st_size, max_bytes);
    }
    OutputFile out;
    if (output_open(&out, dst, err, err_len) != 0) {
        fclose(f);
        return -1;
    }
    char buf[1 << 16];
    size_t n, total = 0;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) {
        total += n;
        ok = total <= max_bytes && fwrite(buf, 1, n, out.f) == n;
    }
    const bool read_failed = ferror(f);
    fclose(f);
    if (!ok || read_failed) {
        const int saved_errno = errno;
        output_discard(&out);
        if (read_failed) return fail_at(err, err_len, src, 0, "read failed");
        if (total > max_bytes)
            return fail_at(err, err_len, src, 0, "more than %zu bytes (it grew while copied)",
                           max_bytes);
        return fail_at(err, err_len, dst, 0, "write failed: %s", strerror(saved_errno));
    }
    return output_commit(&out, err, err_len);
}

// Copies the tokenizer files of a folder that exist there.
static int copy_tokenizer_folder(const char *src_dir, const char *dst_dir, char *err,
                                 size_t err_len) {
    static const char *const FILES[] = {"tokenizer.json",   "tokenizer_config.json",
                                        "special_tokens_map.json", "tokenizer.model",
                                        "vocab.json",       "merges.txt",
                                        "added_tokens.json", "chat_template.jinja"};
    char src[4096], dst[4096];
    for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", src_dir, FILES[i]);
        snprintf(dst, sizeof dst, "%s/%s", dst_dir, FILES[i]);
        struct stat st;
        if (stat(src, &st) == 0 && strcmp(src, dst) != 0 &&
            copy_file(src, dst, hf_file_max_bytes(FILES[i]), err, err_len))
            return -1;
    }
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int hf_copy_tokenizer(const char *src_dir, const char *run_tokenizer, const char *dst_dir,
                      char *err, size_t err_len) {
    if (src_dir && copy_tokenizer_folder(src_dir, dst_dir, err, err_len)) return -1;
    if (!run_tokenizer) return 0;
    struct stat st;
    if (stat(run_tokenizer, &st) == 0 && S_ISDIR(st.st_mode))
        return copy_tokenizer_folder(run_tokenizer, dst_dir, err, err_len);
    char dst[4096];
    snprintf(dst, sizeof dst, "%s/%s", dst_dir,
             ends_with(run_tokenizer, ".json") ? "tokenizer.json" : "tokenizer.model");
    return copy_file(run_tokenizer, dst, HF_TOKENIZER_MAX_BYTES, err, err_len);
}

// An added token's entry (AddedToken's fields; with its id in tokenizer.json's list).
static json_t *added_token_json(int id, const char *content) {
    static const char *const OFF[] = {"single_word", "lstrip", "rstrip", "normalized"};
    json_t *j = json_object();
    if (id >= 0) json_object_set_new(j, "id", json_integer(id));
    json_object_set_new(j, "content", json_string(content));
    for (int k = 0; k < 4; k++) json_object_set_new(j, OFF[k], json_false());
    json_object_set_new(j, "special", json_true());
    return j;
}

int hf_copy_generation_config(const char *src_dir, const char *dst_dir, char *err,
                              size_t err_len) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/generation_config.json", src_dir);
    snprintf(dst, sizeof dst, "%s/generation_config.json", dst_dir);
    struct stat st;
    return stat(src, &st) == 0 ? copy_file(src, dst, HF_JSON_MAX_BYTES, err, err_len) : 0;
}

int hf_add_tokens(const char *dir, const int32_t *ids, const char *const *pieces, int n,
                  char *err, size_t err_len) {
    if (n == 0) return 0;
    static const char *const FILES[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int f = 0; f < 2; f++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, FILES[f]);
        struct stat st;
        if (f == 1 && stat(path, &st) != 0) continue;  // tokenizer_config.json is optional
        size_t len;
        char *copied = own_file_read(path, hf_file_max_bytes(FILES[f]), &len, err, err_len);
        if (!copied) return -1;
        json_error_t jerr;
        json_t *root = json_loadb(copied, len, 0, &jerr);
        // transformers writes model_max_length 1e30 as an integer beyond int64: a real.
        if (!root && f == 1) root = json_loadb(copied, len, JSON_DECODE_INT_AS_REAL, &jerr);
        free(copied);
        if (!root) return fail_at(err, err_len, path, jerr.line, "invalid JSON: %s", jerr.text);
        json_t *list = json_object_get(root, f == 0 ? "added_tokens" : "added_tokens_decoder");
        if (f == 0 && !json_is_array(list)) json_object_set_new(root, "added_tokens", list = json_array());
        if (!json_is_object(list) && !json_is_array(list)) {  // no added_tokens_decoder: as copied
            json_decref(root);
            continue;
        }
        for (int i = 0; i < n; i++) {
            json_t *entry = added_token_json(f == 0 ? ids[i] : -1, pieces[i]);
            char key[16];
            snprintf(key, sizeof key, "%d", ids[i]);
            if (f == 0) json_array_append_new(list, entry);
            else json_object_set_new(list, key, entry);
        }
        // Not write_json: a tokenizer.json's reals keep their full precision.
        char *text = json_dumps(root, JSON_INDENT(2));
        json_decref(root);
        const int rc = write_file_atomic(path, text, strlen(text), err, err_len);
        free(text);
        if (rc) return -1;
    }
    return 0;
}

int hf_write_chat_template(const char *dir, const char *jinja, char *err, size_t err_len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (write_file_atomic(path, jinja, strlen(jinja), err, err_len)) return -1;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (access(path, R_OK) != 0) return 0;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_PRESERVE_ORDER, &jerr);
    if (!root) root = json_load_file(path, JSON_PRESERVE_ORDER | JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) return fail_at(err, err_len, path, jerr.line, "%s", jerr.text);
    int rc = 0;
    if (json_object_get(root, "chat_template")) {
        json_object_del(root, "chat_template");
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        rc = write_file_atomic(path, text, strlen(text), err, err_len);
        free(text);
    }
    json_decref(root);
    return rc;
}
