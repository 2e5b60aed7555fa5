#define _POSIX_C_SOURCE 200809L
#include "trainer/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/output_file.h"

// Keeps the lines of `path` whose "step" is <= max_step (a resumed run drops what the
// interrupted one logged past its checkpoint). Returns 0, or -1 with a message.
static int truncate_after_step(const char *path, long max_step, char *err, size_t err_len) {
    FILE *in = fopen(path, "r");
    if (!in) return 0;
    char *kept = NULL;
    size_t kept_len = 0, kept_cap = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, in)) > 0) {
        json_t *obj = json_loads(line, 0, NULL);
        long step = obj ? (long)json_integer_value(json_object_get(obj, "step")) : max_step + 1;
        json_decref(obj);
        if (step > max_step) continue;
        if (kept_len + (size_t)n > kept_cap) {
            kept_cap = 2 * (kept_len + (size_t)n);
            kept = xrealloc(kept, kept_cap);
        }
        memcpy(kept + kept_len, line, (size_t)n);
        kept_len += (size_t)n;
    }
    free(line);
    fclose(in);
    // Atomically: a failure leaves the interrupted run's file as it was.
    const int rc = write_file_atomic(path, kept, kept_len, err, err_len);
    free(kept);
    return rc;
}

int metrics_open(MetricsLog *log, const char *out_dir, long resume_step, char *err,
                 size_t err_len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    *log = (MetricsLog){0};
    if (resume_step > 0 ? truncate_after_step(path, resume_step, err, err_len) != 0
                        : write_file_atomic(path, "", 0, err, err_len) != 0)
        return -1;
    log->f = fopen(path, "a");
    if (!log->f) return fail(err, err_len, "%s: cannot open for writing", path);
    log->good_bytes = ftell(log->f);
    log->path = strdup(path);
    return 0;
}

// After a failed write: report it once and cut the file back to its complete lines.
static void metrics_write_failed(MetricsLog *log, int saved_errno) {
    clearerr(log->f);
    if (ftruncate(fileno(log->f), log->good_bytes) != 0) { /* reported below either way */ }
    fseek(log->f, 0, SEEK_END);
    log->failed = true;
    if (log->failures_reported == 0 && ++log->failures_reported)
        fprintf(stderr, "onepass: warning: %s: writing metrics failed (%s); training goes on, "
                "the file keeps its complete lines\n", log->path, strerror(saved_errno));
}

void metrics_write(MetricsLog *log, const StepMetrics *m) {
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(m->step));
    json_object_set_new(o, "loss", json_real(m->loss));
    json_object_set_new(o, "lr", json_real(m->lr));
    json_object_set_new(o, "grad_norm", json_real(m->grad_norm));
    json_object_set_new(o, "tokens", json_integer(m->tokens));
    json_object_set_new(o, "trained_tokens", json_integer(m->trained_tokens));
    json_object_set_new(o, "conversations", json_integer(m->conversations));
    json_object_set_new(o, "epoch", json_real(m->epoch));
    json_object_set_new(o, "tokens_per_s", json_real(m->tokens_per_s));
    json_object_set_new(o, "npass_equivalent_tokens_per_s",
                        json_real(m->npass_equivalent_tokens_per_s));
    json_object_set_new(o, "elapsed_s", json_real(m->elapsed_s));
    json_object_set_new(o, "mfu", m->mfu >= 0 ? json_real(m->mfu) : json_null());
    if (m->world_size > 1) json_object_set_new(o, "world_size", json_integer(m->world_size));
    if (m->device_memory_gib > 0)
        json_object_set_new(o, "gpu_memory_gib", json_real(m->device_memory_gib));
    if (m->has_eval) {
        json_object_set_new(o, "eval_loss", json_real(m->eval_loss));
        json_object_set_new(o, "eval_answer_loss", json_real(m->eval_answer_loss));
    }
    if (m->has_accuracy) {  // JSON has no NaN: null where there was no turn to score
        json_object_set_new(o, "eval_accuracy", isnan(m->eval_accuracy) ? json_null()
                                                    : json_real(m->eval_accuracy));
        json_object_set_new(o, "eval_later_turn_accuracy",
                            isnan(m->eval_later_turn_accuracy) ? json_null()
                                : json_real(m->eval_later_turn_accuracy));
    }
    // jansson prints reals with 17 significant digits: losses round-trip exactly.
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    errno = 0;
    const bool ok = fprintf(log->f, "%s\n", text) >= 0 && fflush(log->f) == 0;
    if (ok) log->good_bytes = ftell(log->f);
    else metrics_write_failed(log, errno ? errno : EIO);
    free(text);
    json_decref(o);
}

void metrics_close(MetricsLog *log) {
    if (log->f && fclose(log->f) != 0 && log->failures_reported == 0 && ++log->failures_reported)
        fprintf(stderr, "onepass: warning: %s: closing metrics failed: %s\n", log->path,
                strerror(errno));
    log->f = NULL;
    free(log->path);
    log->path = NULL;
}

static void format_duration(char *buf, size_t len, double s) {
    if (s < 0) s = 0;
    long total = (long)(s + 0.5);
    if (total >= 3600) snprintf(buf, len, "%ldh%02ldm", total / 3600, total / 60 % 60);
    else if (total >= 60) snprintf(buf, len, "%ldm%02lds", total / 60, total % 60);
    else snprintf(buf, len, "%lds", total);
}

void metrics_print_console(FILE *f, const StepMetrics *m, long total_steps, double eta_s) {
    char mfu[32], eta[32];
    if (m->mfu >= 0) snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * m->mfu);
    else snprintf(mfu, sizeof mfu, "n/a");
    format_duration(eta, sizeof eta, eta_s);
    fprintf(f, "step %ld/%ld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | %.0f npass-eq tok/s "
            "| MFU %s | ETA %s", m->step, total_steps, m->loss, m->lr, m->grad_norm,
            m->tokens_per_s, m->npass_equivalent_tokens_per_s, mfu, eta);
    if (m->world_size > 1) fprintf(f, " | %d ranks", m->world_size);
    if (m->device_memory_gib > 0) fprintf(f, " | GPU mem %.2f GiB", m->device_memory_gib);
    if (m->has_eval)
        fprintf(f, " | eval_loss %.4f | eval_answer_loss %.4f", m->eval_loss, m->eval_answer_loss);
    if (m->has_accuracy)
        fprintf(f, " | eval_accuracy %.4f | eval_later_turn_accuracy %.4f", m->eval_accuracy,
                m->eval_later_turn_accuracy);
    fprintf(f, " | epoch %.2f\n", m->epoch);
    fflush(f);
}

long long model_matmul_params(const ParamTable *table, const ModelConfig *mc) {
    long long n = mc->tie_word_embeddings ? (long long)mc->vocab_size * mc->hidden_size : 0;
    for (int t = 0; t < table->n_tensors; t++)
        if (table->tensors[t].ndim == 2 && strcmp(table->tensors[t].name, "model.embed_tokens.weight"))
            n += (long long)table->tensors[t].numel;
    return n;
}

double model_flops_per_token(long long n_matmul_params) { return 6.0 * (double)n_matmul_params; }
