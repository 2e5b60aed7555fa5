#define _POSIX_C_SOURCE 200809L
#include "trainer/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/checksum.h"
#include "model/safetensors.h"

#define CHECKPOINT_FORMAT "onepass-checkpoint-1"

// A file's checksum: over its tensors, each bound to its name; independent of order.
static uint64_t tensor_checksum(const char *name, const void *data, size_t bytes) {
    uint64_t h = checksum_bytes(name, strlen(name)) ^ checksum_bytes(data, bytes);
    return splitmix64(&h);
}

static uint64_t entries_checksum(const SafeTensorOut *entries, int n) {
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < entries[i].ndim; d++) numel *= (size_t)entries[i].shape[d];
        sum += tensor_checksum(entries[i].name, entries[i].data, numel * sizeof(float));
    }
    return sum;
}

// Verifies the file's "checksum" metadata over its tensors as read.
static int verify_checksum(const SafeTensorsFile *f, char *err, size_t err_len) {
    const char *want = safetensors_meta(f, "checksum");
    if (!want) return fail_at(err, err_len, f->path, 0, "metadata 'checksum' missing");
    uint64_t sum = 0;
    for (int i = 0; i < f->n_tensors; i++)
        sum += tensor_checksum(f->tensors[i].name, f->data + f->tensors[i].begin,
                               f->tensors[i].end - f->tensors[i].begin);
    char got[24];
    snprintf(got, sizeof got, "%016llx", (unsigned long long)sum);
    if (strcmp(got, want) != 0)
        return fail_at(err, err_len, f->path, 0, "checksum mismatch (stored %s, computed %s): "
                       "the file is corrupt", want, got);
    return 0;
}

// A tensor of the file that the table (under prefix) does not have: an error naming it.
static int refuse_extra_tensors(const SafeTensorsFile *f, const ParamTable *table,
                                int n_prefixes, char *err, size_t err_len) {
    if (f->n_tensors == n_prefixes * table->n_tensors) return 0;  // all found, none more
    for (int i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name;
        const char *dot = strncmp(name, "exp_avg", 7) == 0 ? strchr(name, '.') : NULL;
        const char *base = n_prefixes == 2 && dot ? dot + 1 : name;
        bool known = false;
        for (int t = 0; t < table->n_tensors && !known; t++)
            known = strcmp(table->tensors[t].name, base) == 0;
        if (!known)
            return fail_at(err, err_len, f->path, 0, "tensor '%s' is not in the model (a "
                           "checkpoint of another model shape)", name);
    }
    return fail_at(err, err_len, f->path, 0, "%d tensors where the model has %d", f->n_tensors,
                   n_prefixes * table->n_tensors);
}

// An id per save, so files of two saves at the same step are told apart.
static void new_save_id(char *id, size_t len) {
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t state = ((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) ^
                     ((uint64_t)getpid() << 40) ^ ++counter;
    snprintf(id, len, "%016llx", (unsigned long long)splitmix64(&state));
}

// Removes a checkpoint directory's files, then the directory (absent: fine).
static int remove_checkpoint_dir(const char *dir, char *err, size_t err_len) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : fail(err, err_len, "%s: %s", dir, strerror(errno));
    char path[4096];
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) {
            closedir(d);
            return fail(err, err_len, "%s: cannot remove: %s", path, strerror(errno));
        }
    }
    closedir(d);
    if (rmdir(dir) != 0) return fail(err, err_len, "%s: cannot remove: %s", dir, strerror(errno));
    return 0;
}

// Puts the finished <dir>.tmp in place of dir: an existing dir is moved to <dir>.old
// first and removed once the new one is in place.
static int install_checkpoint_dir(const char *tmp, const char *dir, char *err, size_t err_len) {
    char old[4096];
    snprintf(old, sizeof old, "%s.old", dir);
    if (remove_checkpoint_dir(old, err, err_len)) return -1;
    struct stat st;
    const bool had = stat(dir, &st) == 0;
    if (had && rename(dir, old) != 0)
        return fail(err, err_len, "%s: cannot move aside: %s", dir, strerror(errno));
    if (rename(tmp, dir) != 0)
        return fail(err, err_len, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    fsync_parent_dir(dir);
    return had ? remove_checkpoint_dir(old, err, err_len) : 0;
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

// The files of a checkpoint into dir (an empty, new directory).
static int checkpoint_write_files(const char *dir, const ModelConfig *cfg, const ParamTable *table,
                                  const float *params, const AdamWState *opt,
                                  const TrainProgress *progress, char *err, size_t err_len) {
    char path[4200];
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
    char save_id[24], record_hash[24], checksum[24];
    new_save_id(save_id, sizeof save_id);
    const char *record = progress->run_record ? progress->run_record : "";
    snprintf(record_hash, sizeof record_hash, "%016llx",
             (unsigned long long)checksum_bytes(record, strlen(record)));
    SafeTensorOut *entries = xmalloc(2 * (size_t)table->n_tensors * sizeof *entries);
    safetensors_table_entries(table, "", params, entries);
    snprintf(checksum, sizeof checksum, "%016llx",
             (unsigned long long)entries_checksum(entries, table->n_tensors));
    const SafeTensorMeta model_meta[] = {{"format", "pt"}, {"step", step}, {"save_id", save_id},
                                         {"run_record_hash", record_hash}, {"checksum", checksum}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = safetensors_write(path, entries, table->n_tensors, model_meta,
                               (int)(sizeof model_meta / sizeof model_meta[0]), err, err_len);
    safetensors_entries_free(entries, table->n_tensors);
    if (rc) goto done;

    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = model_config_write_hf(path, cfg, err, err_len))) goto done;

    safetensors_table_entries(table, "exp_avg.", opt->m, entries);
    safetensors_table_entries(table, "exp_avg_sq.", opt->v, entries + table->n_tensors);
    snprintf(checksum, sizeof checksum, "%016llx",
             (unsigned long long)entries_checksum(entries, 2 * table->n_tensors));
    const SafeTensorMeta opt_meta[] = {
        {"format", CHECKPOINT_FORMAT}, {"step", step},       {"data_epoch", epoch},
        {"data_cursor", cursor},       {"seed", seed},       {"tokens_seen", tokens},
        {"trained_tokens_seen", trained}, {"elapsed_s", elapsed}, {"save_id", save_id},
        {"run_record_hash", record_hash}, {"run_record", record}, {"checksum", checksum},
    };
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    rc = safetensors_write(path, entries, 2 * table->n_tensors, opt_meta,
                           (int)(sizeof opt_meta / sizeof opt_meta[0]), err, err_len);
    safetensors_entries_free(entries, 2 * table->n_tensors);
done:
    free(entries);
    return rc;
}

int checkpoint_save(const char *dir, const ModelConfig *cfg, const ParamTable *table,
                    const float *params, const AdamWState *opt, const TrainProgress *progress,
                    char *err, size_t err_len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    if (remove_checkpoint_dir(tmp, err, err_len)) return -1;  // a killed save's leftovers
    if (make_dirs(tmp, err, err_len) ||
        checkpoint_write_files(tmp, cfg, table, params, opt, progress, err, err_len))
        return -1;
    return install_checkpoint_dir(tmp, dir, err, err_len);
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
    const char *model_id = safetensors_meta(&model, "save_id");
    const char *state_id = safetensors_meta(&state, "save_id");
    if (!model_id || !state_id || strcmp(model_id, state_id) != 0) {
        fail(err, err_len, "%s: model.safetensors and optimizer.safetensors come from different "
             "saves (save ids %s and %s): a mixed checkpoint", dir, model_id ? model_id : "absent",
             state_id ? state_id : "absent");
        goto done;
    }
    if (verify_checksum(&model, err, err_len) || verify_checksum(&state, err, err_len)) goto done;
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
        safetensors_load_table(&state, table, "exp_avg_sq.", opt->v, err, err_len) ||
        refuse_extra_tensors(&model, table, 1, err, err_len) ||
        refuse_extra_tensors(&state, table, 2, err, err_len))
        goto done;
    opt->step = (long)step;
    const char *record = safetensors_meta(&state, "run_record");
    progress->run_record = record && *record ? strdup(record) : NULL;
    rc = 0;
done:
    safetensors_file_free(&model);
    safetensors_file_free(&state);
    return rc;
}

int checkpoint_read_run_record(const char *dir, char **record, char *err, size_t err_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    *record = NULL;
    if (input_file_check(path, err, err_len) != 0) return -1;
    FILE *f = fopen(path, "rb");
    if (!f) return fail_at(err, err_len, path, 0, "cannot open: %s", strerror(errno));
    uint64_t header_len = 0;
    fseek(f, 0, SEEK_END);
    const long file_len = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (file_len < 8 || fread(&header_len, 8, 1, f) != 1 || header_len > (uint64_t)file_len - 8) {
        fclose(f);
        return fail_at(err, err_len, path, 0, "not a safetensors file (bad header length)");
    }
    char *text = xmalloc(header_len + 1);
    const bool ok = fread(text, 1, header_len, f) == header_len;
    fclose(f);
    text[header_len] = '\0';
    json_t *header = ok ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (!header) return fail_at(err, err_len, path, 0, "unreadable header");
    const char *value = json_string_value(json_object_get(json_object_get(header, "__metadata__"), "run_record"));
    if (value && *value) *record = strdup(value);
    json_decref(header);
    return 0;
}
