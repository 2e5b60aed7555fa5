// PEFT adapter folders (model/peft.h).
#include "model/peft.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "common/check.h"
#include "common/output_file.h"
#include "model/hf_model.h"

bool peft_is_adapter_folder(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    struct stat st;
    return stat(path, &st) == 0;
}

int peft_adapter_write(const char *dir, const LoraLayout *l, const float *adapter,
                       const char *base_model, const SafeTensorMeta *meta, int n_meta,
                       char *err, size_t err_len) {
    char path[4200];
    const LoraConfig *c = &l->cfg;
    json_t *targets = json_array();
    for (int t = 0; t < LORA_TARGETS; t++)
        if (c->target[t]) json_array_append_new(targets, json_string(lora_target_name((LoraTarget)t)));
    json_t *alpha = c->alpha == floor(c->alpha) && fabs(c->alpha) < 1e15
                        ? json_integer((json_int_t)c->alpha) : json_real(c->alpha);
    json_t *root = json_pack("{s:s, s:s, s:o, s:i, s:o, s:o, s:f, s:s, s:b, s:b, s:b, s:b, s:b}",
                             "peft_type", "LORA", "task_type", "CAUSAL_LM",
                             "base_model_name_or_path",
                             base_model ? json_string(base_model) : json_null(), "r", c->r,
                             "lora_alpha", alpha, "target_modules", targets, "lora_dropout", 0.0,
                             "bias", "none", "use_rslora", c->rslora, "use_dora", 0,
                             "fan_in_fan_out", 0, "inference_mode", 1, "init_lora_weights", 1);
    CHECK(root, "adapter_config.json: json_pack failed");
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    const size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len] = '\n', text[len + 1] = '\0';
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int rc = write_file_atomic(path, text, len + 1, err, err_len);
    free(text);
    if (rc) return -1;

    const int n = l->table.n_tensors;
    SafeTensorOut *entries = xmalloc((size_t)n * sizeof *entries);
    safetensors_table_entries(&l->table, "", adapter, entries);
    SafeTensorMeta *all = xmalloc((size_t)(n_meta + 1) * sizeof *all);
    int n_all = 0;
    bool has_format = false;
    for (int i = 0; i < n_meta; i++) has_format |= strcmp(meta[i].key, "format") == 0;
    if (!has_format) all[n_all++] = (SafeTensorMeta){"format", "pt"};
    for (int i = 0; i < n_meta; i++) all[n_all++] = meta[i];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    rc = safetensors_write(path, entries, n, all, n_all, err, err_len);
    safetensors_entries_free(entries, n);
    free(entries);
    free(all);
    return rc;
}

// Refuses a key whose value is set to anything but what `allowed` accepts.
static bool json_is_falsy(const json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) ||
           (json_is_object(v) && json_object_size(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0);
}

int peft_config_read(const char *dir, LoraConfig *out, char *base_model, size_t base_len,
                     char *err, size_t err_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *root = hf_json_load(path, HF_JSON_MAX_BYTES, err, err_len);
    if (!root) return -1;
    memset(out, 0, sizeof *out);
    if (base_len) base_model[0] = '\0';
    int rc = -1;
    const char *peft_type = json_string_value(json_object_get(root, "peft_type"));
    const json_t *r = json_object_get(root, "r"), *alpha = json_object_get(root, "lora_alpha");
    const json_t *targets = json_object_get(root, "target_modules");
    const char *bias = json_string_value(json_object_get(root, "bias"));
    const json_t *base = json_object_get(root, "base_model_name_or_path");
    static const char *const UNSUPPORTED[] = {
        "use_dora",        "fan_in_fan_out",  "rank_pattern",     "alpha_pattern",
        "layers_to_transform", "modules_to_save", "use_qalora",   "lora_bias",
        "exclude_modules", "layer_replication", "target_parameters", "trainable_token_indices"};
    if (!json_is_object(root)) {
        fail_at(err, err_len, path, 0, "not a JSON object");
        goto done;
    }
    if (!peft_type || strcmp(peft_type, "LORA") != 0) {
        fail_at(err, err_len, path, 0, "peft_type '%s': only LORA adapters are read",
                peft_type ? peft_type : "absent");
        goto done;
    }
    if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > LORA_MAX_RANK) {
        fail_at(err, err_len, path, 0, "r: an integer in [1, %d] is required", LORA_MAX_RANK);
        goto done;
    }
    if (!json_is_number(alpha) || !(json_number_value(alpha) > 0)) {
        fail_at(err, err_len, path, 0, "lora_alpha: a positive number is required");
        goto done;
    }
    if (bias && strcmp(bias, "none") != 0) {
        fail_at(err, err_len, path, 0, "bias '%s': only \"none\" is supported", bias);
        goto done;
    }
    for (size_t i = 0; i < sizeof UNSUPPORTED / sizeof *UNSUPPORTED; i++)
        if (!json_is_falsy(json_object_get(root, UNSUPPORTED[i]))) {
            fail_at(err, err_len, path, 0, "%s is set: not supported here", UNSUPPORTED[i]);
            goto done;
        }
    if (!json_is_array(targets) || json_array_size(targets) == 0) {
        fail_at(err, err_len, path, 0, "target_modules: a list of projection names is required "
                "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
        goto done;
    }
    size_t i;
    json_t *item;
    json_array_foreach(targets, i, item) {
        const int t = lora_target_from_name(json_string_value(item));
        if (t < 0) {
            fail_at(err, err_len, path, 0, "target_modules[%zu] '%s' is not one of q_proj, "
                    "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj", i,
                    json_is_string(item) ? json_string_value(item) : "(not a string)");
            goto done;
        }
        out->target[t] = true;
    }
    out->r = (int)json_integer_value(r);
    out->alpha = json_number_value(alpha);
    out->rslora = json_is_true(json_object_get(root, "use_rslora"));
    if (json_is_string(base) && base_len) snprintf(base_model, base_len, "%s", json_string_value(base));
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int peft_adapter_load(const char *dir, const LoraLayout *l, float *adapter, char *err,
                      size_t err_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    SafeTensorsFile f = {0};
    int rc = safetensors_read(path, &f, err, err_len);
    if (rc == 0) rc = safetensors_load_table(&f, &l->table, "", adapter, err, err_len);
    for (int i = 0; rc == 0 && i < f.n_tensors; i++)
        if (!param_table_find(&l->table, f.tensors[i].name))
            rc = fail_at(err, err_len, path, 0, "tensor '%s' is not an adapter of lora.targets "
                         "on this model", f.tensors[i].name);
    safetensors_file_free(&f);
    return rc;
}
