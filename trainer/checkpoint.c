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
#include "model/hf_model.h"
#include "common/checksum.h"
#include "model/peft.h"
#include "model/safetensors.h"

#define CHECKPOINT_FORMAT "onepass-checkpoint-1"
#define MASTER_PREFIX "master."  // fp32 weights in optimizer.safetensors

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

// One metadata entry's share of a file's checksum (the key bound to its value; the
// "checksum" entry itself is not covered).
static uint64_t meta_checksum(const char *key, const char *value) {
    if (strcmp(key, "checksum") == 0) return 0;
    char name[128];
    snprintf(name, sizeof name, "__metadata__.%s", key);
    return tensor_checksum(name, value, strlen(value));
}

// Verifies the file's "checksum" metadata over its tensors and its other metadata as read.
static int verify_checksum(const SafeTensorsFile *f, char *err, size_t err_len) {
    const char *want = safetensors_meta(f, "checksum");
    if (!want) return fail_at(err, err_len, f->path, 0, "metadata 'checksum' missing");
    uint64_t sum = 0;
    for (int i = 0; i < f->n_meta; i++) sum += meta_checksum(f->meta[i].key, f->meta[i].value);
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
        const bool prefixed = strncmp(name, "exp_avg", 7) == 0 ||
                              strncmp(name, MASTER_PREFIX, strlen(MASTER_PREFIX)) == 0;
        const char *dot = prefixed ? strchr(name, '.') : NULL;
        const char *base = n_prefixes > 1 && dot ? dot + 1 : name;
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

// The sum of tensor_checksum over every tensor and metadata entry of the model weight
// files in dir, as stored.
static int model_files_checksum(const char *dir, uint64_t *sum, char *err, size_t err_len) {
    char path[4200];
    HfWeightFiles files;
    *sum = 0;
    if (hf_weight_files(dir, &files, err, err_len)) return -1;
    int rc = 0;
    for (int k = 0; k < files.n && rc == 0; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, files.names[k]);
        SafeTensorsFile f = {0};
        rc = safetensors_read(path, &f, err, err_len);
        for (int i = 0; rc == 0 && i < f.n_tensors; i++)
            *sum += tensor_checksum(f.tensors[i].name, f.data + f.tensors[i].begin,
                                    f.tensors[i].end - f.tensors[i].begin);
        for (int i = 0; rc == 0 && i < f.n_meta; i++)
            *sum += meta_checksum(f.meta[i].key, f.meta[i].value);
        safetensors_file_free(&f);
    }
    hf_weight_files_free(&files);
    return rc;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// The names of the files in dir, sorted, comma-separated (malloc'd).
static char *file_list(const char *dir) {
    DIR *d = opendir(dir);
    char **names = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            ARRAY_PUSH(names, n, cap, strdup(e->d_name));
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, compare_names);
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(names[i]) + 1;
    char *list = xcalloc(len, 1);
    for (int i = 0; i < n; i++) {
        if (i) strcat(list, ",");
        strcat(list, names[i]);
        free(names[i]);
    }
    free(names);
    return list;
}

// The files of a checkpoint into dir (an empty, new directory): the Hugging Face model
// folder of the export's dtype, ids and shard size (model/hf_export.h), then extra's
// files, then the optimizer state (listing every file before it); below F32 the fp32 master weights go into optimizer.safetensors as
// "master.<name>" and checkpoint_load takes them from there.
static int checkpoint_write_files(const char *dir, const ParamTable *table, const float *params,
                                  const AdamWState *opt, const TrainProgress *progress,
                                  const HfExport *hf, CheckpointExtraFiles extra,
                                  void *extra_arg, char *err, size_t err_len) {
    char path[4200];
    char step[32], epoch[32], cursor[32], seed[32], tokens[32], trained[32], elapsed[40];
    snprintf(step, sizeof step, "%ld", progress->step);
    snprintf(epoch, sizeof epoch, "%lld", progress->data_epoch);
    snprintf(cursor, sizeof cursor, "%lld", progress->data_cursor);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)progress->seed);
    snprintf(tokens, sizeof tokens, "%lld", progress->tokens_seen);
    snprintf(trained, sizeof trained, "%lld", progress->trained_tokens_seen);
    snprintf(elapsed, sizeof elapsed, "%.17g", progress->elapsed_s);  // round-trips exactly
    char base_sum[24];
    snprintf(base_sum, sizeof base_sum, "%016llx", (unsigned long long)progress->base_checksum);

    // Model first, optimizer last: a crash between them leaves mismatched steps, which
    // checkpoint_load refuses. The optimizer file carries the checksum of the model
    // files as written (whatever their dtype and shards) beside its own.
    char save_id[24], record_hash[24], checksum[24], model_checksum[24];
    new_save_id(save_id, sizeof save_id);
    const char *record = progress->run_record ? progress->run_record : "";
    snprintf(record_hash, sizeof record_hash, "%016llx",
             (unsigned long long)checksum_bytes(record, strlen(record)));
    const SafeTensorMeta model_meta[] = {{"format", "pt"}, {"step", step}, {"save_id", save_id},
                                         {"run_record_hash", record_hash}};
    HfExport model = *hf;
    model.meta = model_meta;
    model.n_meta = (int)(sizeof model_meta / sizeof model_meta[0]);
    uint64_t model_sum;
    if (hf_export_write(dir, table, params, &model, err, err_len) ||
        model_files_checksum(dir, &model_sum, err, err_len) ||
        (extra && extra(dir, extra_arg, err, err_len)))
        return -1;
    snprintf(model_checksum, sizeof model_checksum, "%016llx", (unsigned long long)model_sum);

    // The fp32 master weights ride along when the model file holds fewer bits, so a
    // resume is bit-identical.
    const int n = table->n_tensors, n_sets = hf->dtype == SAVE_F32 ? 2 : 3;
    SafeTensorOut *entries = xmalloc((size_t)n_sets * n * sizeof *entries);

    safetensors_table_entries(table, "exp_avg.", opt->m, entries);
    safetensors_table_entries(table, "exp_avg_sq.", opt->v, entries + n);
    if (n_sets == 3) safetensors_table_entries(table, MASTER_PREFIX, params, entries + 2 * n);
    const SafeTensorMeta opt_meta[] = {
        {"format", CHECKPOINT_FORMAT}, {"step", step},       {"data_epoch", epoch},
        {"data_cursor", cursor},       {"seed", seed},       {"tokens_seen", tokens},
        {"trained_tokens_seen", trained}, {"elapsed_s", elapsed}, {"save_id", save_id},
        {"run_record_hash", record_hash}, {"run_record", record}, {"checksum", checksum},
        {"model_checksum", model_checksum}, {"base_checksum", base_sum}, {"files", NULL},
    };
    char *files = file_list(dir);  // everything but the optimizer state itself
    enum { N_META = sizeof opt_meta / sizeof opt_meta[0] };
    SafeTensorMeta meta[N_META];
    memcpy(meta, opt_meta, sizeof meta);
    meta[N_META - 1].value = files;
    uint64_t sum = entries_checksum(entries, n_sets * n);  // tensors and metadata
    for (int i = 0; i < N_META; i++) sum += meta_checksum(meta[i].key, meta[i].value);
    snprintf(checksum, sizeof checksum, "%016llx", (unsigned long long)sum);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    const int rc = safetensors_write(path, entries, n_sets * n, meta,
                                     (int)(sizeof meta / sizeof meta[0]), err, err_len);
    free(files);
    safetensors_entries_free(entries, n_sets * n);
    free(entries);
    return rc;
}

// The model weight file holding the step metadata: model.safetensors, or the first
// shard of model.safetensors.index.json; *sharded says which. Returns 0, or -1 with a
// message.
static int model_weights_path(const char *dir, char *path, size_t len, bool *sharded, char *err,
                              size_t err_len) {
    HfWeightFiles files;
    if (hf_weight_files(dir, &files, err, err_len)) return -1;
    const char *first = files.names[0];
    for (int k = 1; k < files.n; k++)
        if (strcmp(files.names[k], first) < 0) first = files.names[k];
    snprintf(path, len, "%s/%s", dir, first);
    *sharded = files.sharded;
    hf_weight_files_free(&files);
    return 0;
}

int checkpoint_save_hf(const char *dir, const ParamTable *table, const float *params,
                       const AdamWState *opt, const TrainProgress *progress, const HfExport *hf,
                       CheckpointExtraFiles extra, void *extra_arg, char *err, size_t err_len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    if (remove_checkpoint_dir(tmp, err, err_len)) return -1;  // a killed save's leftovers
    if (make_dirs(tmp, err, err_len)) return -1;
    if (checkpoint_write_files(tmp, table, params, opt, progress, hf, extra, extra_arg, err,
                               err_len) == 0 &&
        install_checkpoint_dir(tmp, dir, err, err_len) == 0)
        return 0;
    char ignored[256];
    remove_checkpoint_dir(tmp, ignored, sizeof ignored);  // a failed save leaves nothing
    return -1;
}

int checkpoint_check_complete(const char *dir, char *err, size_t err_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    struct stat st;
    if (stat(path, &st) != 0) return 0;  // a Hugging Face folder, not a checkpoint
    SafeTensorsFile f;
    if (safetensors_read(path, &f, err, err_len)) {
        safetensors_file_free(&f);
        return -1;
    }
    const char *format = safetensors_meta(&f, "format");
    const char *files = safetensors_meta(&f, "files");
    int rc = 0;
    if (format && strcmp(format, CHECKPOINT_FORMAT) == 0 && !files)
        rc = fail_at(err, err_len, path, 0, "metadata 'files' missing");
    for (const char *p = files; rc == 0 && p && *p;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        snprintf(path, sizeof path, "%s/%.*s", dir, (int)len, p);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            rc = fail(err, err_len, "%s: incomplete checkpoint: %.*s is %s", dir, (int)len, p,
                      stat(path, &st) != 0 ? "missing" : "not a regular file");
        p = comma ? comma + 1 : p + len;
    }
    safetensors_file_free(&f);
    return rc;
}

int checkpoint_save(const char *dir, const ModelConfig *cfg, const ParamTable *table,
                    const float *params, const AdamWState *opt, const TrainProgress *progress,
                    char *err, size_t err_len) {
    HfExport hf = {.dtype = SAVE_F32, .generation_eos_token_id = -1};
    hf.hf.cfg = *cfg;
    hf.hf.bos_token_id = hf.hf.pad_token_id = -1;
    return checkpoint_save_hf(dir, table, params, opt, progress, &hf, NULL, NULL, err, err_len);
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
    // A sharded model's extra tensors are refused by hf_weights_load, which reads them all.
    bool sharded;
    if (model_weights_path(dir, path, sizeof path, &sharded, err, err_len) ||
        checkpoint_check_complete(dir, err, err_len) ||
        safetensors_read(path, &model, err, err_len))
        goto done;
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
    if (verify_checksum(&state, err, err_len)) goto done;
    const char *want_model = safetensors_meta(&state, "model_checksum");
    uint64_t model_sum;
    char got_model[24];
    if (!want_model) {
        fail_at(err, err_len, state.path, 0, "metadata 'model_checksum' missing");
        goto done;
    }
    if (model_files_checksum(dir, &model_sum, err, err_len)) goto done;
    snprintf(got_model, sizeof got_model, "%016llx", (unsigned long long)model_sum);
    if (strcmp(got_model, want_model) != 0) {
        snprintf(path, sizeof path, "%s", model.path);  // the file, or the first shard
        fail_at(err, err_len, path, 0, "checksum mismatch of the model weights (stored %s, "
                "computed %s): the file is corrupt", want_model, got_model);
        goto done;
    }
    const char *seed_text = safetensors_meta(&state, "seed");
    const char *elapsed_text = safetensors_meta(&state, "elapsed_s");
    if (!seed_text || !elapsed_text) {
        fail(err, err_len, "%s: metadata 'seed' or 'elapsed_s' missing", path);
        goto done;
    }
    progress->seed = strtoull(seed_text, NULL, 10);
    const char *base_text = safetensors_meta(&state, "base_checksum");  // absent: older saves
    progress->base_checksum = base_text ? strtoull(base_text, NULL, 16) : 0;
    progress->elapsed_s = strtod(elapsed_text, NULL);
    progress->step = (long)step;
    char master[128];
    snprintf(master, sizeof master, "%s%s", MASTER_PREFIX, table->tensors[0].name);
    if ((safetensors_find(&state, master)
             ? safetensors_load_table(&state, table, MASTER_PREFIX, params, err, err_len)
             : hf_weights_load(dir, table, params, err, err_len)) ||
        safetensors_load_table(&state, table, "exp_avg.", opt->m, err, err_len) ||
        safetensors_load_table(&state, table, "exp_avg_sq.", opt->v, err, err_len) ||
        (!sharded && refuse_extra_tensors(&model, table, 1, err, err_len)) ||
        refuse_extra_tensors(&state, table, safetensors_find(&state, master) ? 3 : 2, err,
                             err_len))
        goto done;
    opt->step = (long)step;
    const char *record = safetensors_meta(&state, "run_record");
    const char *record_hash = safetensors_meta(&state, "run_record_hash");
    const char *model_record_hash = safetensors_meta(&model, "run_record_hash");
    char got_hash[24];
    snprintf(got_hash, sizeof got_hash, "%016llx",
             (unsigned long long)checksum_bytes(record ? record : "", record ? strlen(record) : 0));
    if (!record_hash || strcmp(record_hash, got_hash) != 0 || !model_record_hash ||
        strcmp(model_record_hash, got_hash) != 0) {
        fail(err, err_len, "%s: the run record does not match its hash (stored %s and %s, "
             "computed %s): the checkpoint is corrupt", dir, record_hash ? record_hash : "absent",
             model_record_hash ? model_record_hash : "absent", got_hash);
        goto done;
    }
    progress->run_record = record && *record ? strdup(record) : NULL;
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

int checkpoint_read_run_record(const char *dir, char **record, char *err, size_t err_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    *record = NULL;
    SafeTensorsFile f;  // mapped: only the header is read
    if (safetensors_read(path, &f, err, err_len)) {
        safetensors_file_free(&f);
        return -1;
    }
    const char *value = safetensors_meta(&f, "run_record");
    if (value && *value) *record = strdup(value);
    safetensors_file_free(&f);
    return 0;
}

// A complete model folder's config.json, and the dtype to write: dtype when given, else the
// folder's own (bfloat16 or float16), else F32.
static int export_header_read(const char *folder, const SaveDtype *dtype, HfExport *e, char *err,
                              size_t err_len) {
    *e = (HfExport){.generation_eos_token_id = -1};
    if (hf_folder_check(folder, err, err_len) || checkpoint_check_complete(folder, err, err_len) ||
        hf_config_read(folder, &e->hf, err, err_len))
        return -1;
    e->dtype = SAVE_F32;
    if (dtype) e->dtype = *dtype;
    else if (strcmp(e->hf.dtype, "bfloat16") == 0) e->dtype = SAVE_BF16;
    else if (strcmp(e->hf.dtype, "float16") == 0) e->dtype = SAVE_F16;
    return 0;
}

// A PEFT adapter folder (a LoRA checkpoint's or PEFT's own) as a folder of its adapter
// files and tokenizer files, without optimizer state. The adapters' shapes come from
// the base model's config.json (base_model_name_or_path, or base).
static int export_adapter(const char *from, const char *base, const char *out, char *err,
                          size_t err_len) {
    LoraConfig lc;
    char saved_base[4096];
    if (peft_config_read(from, &lc, saved_base, sizeof saved_base, err, err_len)) return -1;
    if (!base) base = saved_base;
    HfModelConfig hf;
    if (!*base)
        return fail(err, err_len, "%s/adapter_config.json: base_model_name_or_path is null: "
                    "name the base model folder with --base", from);
    if (hf_folder_check(base, err, err_len) || hf_config_read(base, &hf, err, err_len)) return -1;
    LoraLayout l;
    lora_layout_build(&hf.cfg, &lc, &l);
    float *adapter = xmalloc(l.table.total * sizeof(float));
    int rc = peft_adapter_load(from, &l, adapter, err, err_len);
    if (rc == 0) rc = make_dirs(out, err, err_len);
    if (rc == 0) rc = peft_adapter_write(out, &l, adapter, base, NULL, 0, err, err_len);
    if (rc == 0) rc = hf_copy_tokenizer(from, NULL, out, err, err_len);
    free(adapter);
    lora_layout_free(&l);
    return rc;
}

int hf_export_merged(const char *from, const char *base_override, const char *out,
                     const SaveDtype *dtype, char *err, size_t err_len) {
    LoraConfig lc;
    char saved_base[4096];
    if (hf_folder_check(from, err, err_len) || checkpoint_check_complete(from, err, err_len))
        return -1;
    if (!peft_is_adapter_folder(from))
        return fail(err, err_len, "%s: --merge takes a PEFT adapter folder (adapter_config.json, "
                    "adapter_model.safetensors), a LoRA run's checkpoint", from);
    if (peft_config_read(from, &lc, saved_base, sizeof saved_base, err, err_len)) return -1;
    const char *base = base_override ? base_override : saved_base;
    if (!*base)
        return fail(err, err_len, "%s/adapter_config.json: base_model_name_or_path is null: "
                    "name the base model folder with --base", from);
    HfExport e;
    if (export_header_read(base, dtype, &e, err, err_len)) return -1;
    ParamTable table;
    param_table_build(&e.hf.cfg, &table);
    LoraLayout l;
    lora_layout_build(&e.hf.cfg, &lc, &l);
    float *params = xmalloc(table.total * sizeof(float));
    float *adapter = xmalloc(l.table.total * sizeof(float));
    int rc = checkpoint_load_weights(base, &table, params, err, err_len);
    if (rc == 0) rc = peft_adapter_load(from, &l, adapter, err, err_len);
    if (rc == 0) {
        lora_merge(&l, &table, params, adapter);
        rc = hf_export_write(out, &table, params, &e, err, err_len);
    }
    if (rc == 0) rc = hf_copy_generation_config(base, out, err, err_len);
    if (rc == 0) rc = hf_copy_tokenizer(from, NULL, out, err, err_len);
    free(params);
    free(adapter);
    lora_layout_free(&l);
    param_table_free(&table);
    return rc;
}

int hf_export_checkpoint(const char *from, const char *out, const SaveDtype *dtype, char *err,
                         size_t err_len) {
    if (peft_is_adapter_folder(from)) {
        if (hf_folder_check(from, err, err_len) || checkpoint_check_complete(from, err, err_len))
            return -1;
        if (dtype)
            return fail(err, err_len, "%s is an adapter folder: its adapters are exported in F32 "
                        "(--dtype applies to --merge)", from);
        return export_adapter(from, NULL, out, err, err_len);
    }
    HfExport e;
    if (export_header_read(from, dtype, &e, err, err_len)) return -1;
    ParamTable table;
    param_table_build(&e.hf.cfg, &table);
    float *params = xmalloc(table.total * sizeof(float));
    int rc = checkpoint_load_weights(from, &table, params, err, err_len);
    if (rc == 0) rc = hf_export_write(out, &table, params, &e, err, err_len);
    if (rc == 0) rc = hf_copy_generation_config(from, out, err, err_len);
    if (rc == 0) rc = hf_copy_tokenizer(from, NULL, out, err, err_len);
    free(params);
    param_table_free(&table);
    return rc;
}
