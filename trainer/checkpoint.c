#define _POSIX_C_SOURCE 200809L
#include "trainer/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "model/safetensors.h"

#define CHECKPOINT_FORMAT "onepass-checkpoint-1"

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

int model_config_write_hf(const char *path, const ModelConfig *cfg, char *err, size_t err_len) {
    json_t *j = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s, s:s}", "architectures",
        "LlamaForCausalLM", "model_type", "llama", "vocab_size", cfg->vocab_size, "hidden_size",
        cfg->hidden_size, "intermediate_size", cfg->intermediate_size, "num_hidden_layers",
        cfg->num_hidden_layers, "num_attention_heads", cfg->num_attention_heads,
        "num_key_value_heads", cfg->num_key_value_heads, "rms_norm_eps", (double)cfg->rms_norm_eps,
        "rope_theta", (double)cfg->rope_theta, "tie_word_embeddings", cfg->tie_word_embeddings,
        "hidden_act", "silu", "torch_dtype", "float32");
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    int rc = write_file_atomic(path, text, strlen(text), err, err_len);
    free(text);
    return rc;
}

int checkpoint_save(const char *dir, const ModelConfig *cfg, const ParamTable *table,
                    const float *params, const AdamWState *opt, const TrainProgress *progress,
                    char *err, size_t err_len) {
    if (make_dirs(dir, err, err_len)) return -1;
    char path[4096];
    char step[32], epoch[32], cursor[32], seed[32], tokens[32], trained[32], elapsed[40];
    snprintf(step, sizeof step, "%ld", progress->step);
    snprintf(epoch, sizeof epoch, "%lld", progress->data_epoch);
    snprintf(cursor, sizeof cursor, "%lld", progress->data_cursor);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)progress->seed);
    snprintf(tokens, sizeof tokens, "%lld", progress->tokens_seen);
    snprintf(trained, sizeof trained, "%lld", progress->trained_tokens_seen);
    snprintf(elapsed, sizeof elapsed, "%.17g", progress->elapsed_s);  // round-trips exactly

    // Model first, optimizer last: a crash between them leaves mismatched steps, which
    // checkpoint_load refuses.
    const SafeTensorMeta model_meta[] = {{"format", "pt"}, {"step", step}};
    SafeTensorOut *entries = xmalloc(2 * (size_t)table->n_tensors * sizeof *entries);
    safetensors_table_entries(table, "", params, entries);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = safetensors_write(path, entries, table->n_tensors, model_meta, 2, err, err_len);
    safetensors_entries_free(entries, table->n_tensors);
    if (rc) goto done;

    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = model_config_write_hf(path, cfg, err, err_len))) goto done;

    const SafeTensorMeta opt_meta[] = {
        {"format", CHECKPOINT_FORMAT}, {"step", step},       {"data_epoch", epoch},
        {"data_cursor", cursor},       {"seed", seed},       {"tokens_seen", tokens},
        {"trained_tokens_seen", trained}, {"elapsed_s", elapsed},
    };
    safetensors_table_entries(table, "exp_avg.", opt->m, entries);
    safetensors_table_entries(table, "exp_avg_sq.", opt->v, entries + table->n_tensors);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    rc = safetensors_write(path, entries, 2 * table->n_tensors, opt_meta,
                           (int)(sizeof opt_meta / sizeof opt_meta[0]), err, err_len);
    safetensors_entries_free(entries, 2 * table->n_tensors);
done:
    free(entries);
    return rc;
}

// Parses a decimal metadata value; fails naming the key when absent or malformed.
static int meta_ll(const SafeTensorsFile *f, const char *key, long long *out, char *err,
                   size_t err_len) {
    const char *v = safetensors_meta(f, key);
    char *end = NULL;
    if (v) *out = strtoll(v, &end, 10);
    if (!v || end == v || *end)
        return fail(err, err_len, "%s: metadata '%s' missing or not an integer", f->path, key);
    return 0;
}

int checkpoint_load(const char *dir, const ParamTable *table, float *params, AdamWState *opt,
                    TrainProgress *progress, char *err, size_t err_len) {
    char path[4096];
    SafeTensorsFile model = {0}, state = {0};
    long long model_step = 0, step = 0;
    int rc = -1;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (safetensors_read(path, &model, err, err_len)) goto done;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (safetensors_read(path, &state, err, err_len)) goto done;
    const char *format = safetensors_meta(&state, "format");
    if (!format || strcmp(format, CHECKPOINT_FORMAT) != 0) {
        fail(err, err_len, "%s: not an onepass optimizer state (format '%s')", path,
             format ? format : "absent");
        goto done;
    }
    if (meta_ll(&model, "step", &model_step, err, err_len) ||
        meta_ll(&state, "step", &step, err, err_len) ||
        meta_ll(&state, "data_epoch", &progress->data_epoch, err, err_len) ||
        meta_ll(&state, "data_cursor", &progress->data_cursor, err, err_len) ||
        meta_ll(&state, "tokens_seen", &progress->tokens_seen, err, err_len) ||
        meta_ll(&state, "trained_tokens_seen", &progress->trained_tokens_seen, err, err_len))
        goto done;
    if (model_step != step) {
        fail(err, err_len, "%s: model.safetensors is at step %lld but optimizer.safetensors at "
             "step %lld (incomplete checkpoint)", dir, model_step, step);
        goto done;
    }
    const char *seed_text = safetensors_meta(&state, "seed");
    const char *elapsed_text = safetensors_meta(&state, "elapsed_s");
    if (!seed_text || !elapsed_text) {
        fail(err, err_len, "%s: metadata 'seed' or 'elapsed_s' missing", path);
        goto done;
    }
    progress->seed = strtoull(seed_text, NULL, 10);
    progress->elapsed_s = strtod(elapsed_text, NULL);
    progress->step = (long)step;
    if (safetensors_load_table(&model, table, "", params, err, err_len) ||
        safetensors_load_table(&state, table, "exp_avg.", opt->m, err, err_len) ||
        safetensors_load_table(&state, table, "exp_avg_sq.", opt->v, err, err_len))
        goto done;
    opt->step = (long)step;
    rc = 0;
done:
    safetensors_file_free(&model);
    safetensors_file_free(&state);
    return rc;
}
