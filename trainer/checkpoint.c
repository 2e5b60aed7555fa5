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
#include "model/hf_model.h"
#include "model/safetensors.h"

#define CHECKPOINT_FORMAT "onepass-checkpoint-1"
#define MASTER_PREFIX "master."  // fp32 weights in optimizer.safetensors

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

int write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t err_len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) return fail(err, err_len, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        p += n;
        left -= (size_t)n;
    }
    bool ok = left == 0 && fsync(fd) == 0;
    int saved_errno = errno;
    if (close(fd) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        if (ok) saved_errno = errno;
        unlink(tmp);
        return fail(err, err_len, "%s: write failed: %s", path, strerror(saved_errno));
    }
    return 0;
}

int checkpoint_save(const char *dir, const ModelConfig *cfg, const ParamTable *table,
                    const float *params, const AdamWState *opt, const TrainProgress *progress,
                    char *err, size_t err_len) {
    HfExport hf = {.dtype = SAVE_F32, .generation_eos_token_id = -1};
    hf.hf.cfg = *cfg;
    hf.hf.bos_token_id = hf.hf.pad_token_id = -1;
    return checkpoint_save_hf(dir, table, params, opt, progress, &hf, err, err_len);
}

int checkpoint_save_hf(const char *dir, const ParamTable *table, const float *params,
                       const AdamWState *opt, const TrainProgress *progress, const HfExport *hf,
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

    // Model first (a Hugging Face folder: config.json, weights in the save dtype,
    // generation_config.json), optimizer last: a crash between them leaves mismatched
    // steps, which checkpoint_load refuses.
    const SafeTensorMeta model_meta[] = {{"format", "pt"}, {"step", step}};
    HfExport model = *hf;
    model.meta = model_meta;
    model.n_meta = 2;
    if (hf_export_write(dir, table, params, &model, err, err_len)) return -1;

    const SafeTensorMeta opt_meta[] = {
        {"format", CHECKPOINT_FORMAT}, {"step", step},       {"data_epoch", epoch},
        {"data_cursor", cursor},       {"seed", seed},       {"tokens_seen", tokens},
        {"trained_tokens_seen", trained}, {"elapsed_s", elapsed},
    };
    // The fp32 master weights ride along when the model file holds fewer bits, so a
    // resume is bit-identical.
    const int n = table->n_tensors, n_sets = hf->dtype == SAVE_F32 ? 2 : 3;
    SafeTensorOut *entries = xmalloc((size_t)n_sets * n * sizeof *entries);
    safetensors_table_entries(table, "exp_avg.", opt->m, entries);
    safetensors_table_entries(table, "exp_avg_sq.", opt->v, entries + n);
    if (n_sets == 3) safetensors_table_entries(table, MASTER_PREFIX, params, entries + 2 * n);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    const int rc = safetensors_write(path, entries, n_sets * n, opt_meta,
                                     (int)(sizeof opt_meta / sizeof opt_meta[0]), err, err_len);
    safetensors_entries_free(entries, n_sets * n);
    free(entries);
    return rc;
}

// The model weight file holding the step metadata: model.safetensors, or the first
// shard of model.safetensors.index.json.
static void model_weights_path(const char *dir, char *path, size_t len) {
    snprintf(path, len, "%s/model.safetensors.index.json", dir);
    json_t *index = json_load_file(path, 0, NULL);
    const char *key;
    json_t *file;
    const char *first = NULL;
    json_object_foreach(json_object_get(index, "weight_map"), key, file) {
        if (json_is_string(file) && (!first || strcmp(json_string_value(file), first) < 0))
            first = json_string_value(file);
    }
    if (first) snprintf(path, len, "%s/%s", dir, first);
    else snprintf(path, len, "%s/model.safetensors", dir);
    json_decref(index);
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
    model_weights_path(dir, path, sizeof path);
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
    char master[128];
    snprintf(master, sizeof master, "%s%s", MASTER_PREFIX, table->tensors[0].name);
    if ((safetensors_find(&state, master)
             ? safetensors_load_table(&state, table, MASTER_PREFIX, params, err, err_len)
             : hf_weights_load(dir, table, params, err, err_len)) ||
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

int checkpoint_load_weights(const char *dir, const ParamTable *table, float *params, char *err,
                            size_t err_len) {
    char path[4096], master[128];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    snprintf(master, sizeof master, "%s%s", MASTER_PREFIX, table->tensors[0].name);
    SafeTensorsFile state = {0};
    if (access(path, R_OK) == 0) {
        if (safetensors_read(path, &state, err, err_len)) return -1;
        if (safetensors_find(&state, master)) {
            const int rc = safetensors_load_table(&state, table, MASTER_PREFIX, params, err, err_len);
            safetensors_file_free(&state);
            return rc;
        }
        safetensors_file_free(&state);
    }
    return hf_weights_load(dir, table, params, err, err_len);
}
