// The training run (trainer/loop.h) on either backend (trainer/backend.h). Each step: the
// loader's conversations laid out, packed and tiled ahead on a data thread,
// forward+backward in micro-batches with the loss normalised by the step's trained
// tokens, a finite check, global-norm clipping, AdamW under the schedule; then metrics,
// periodic eval in the inference view, and checkpoints (downloaded from the backend).
// With several ranks (dist/ranks.h) every rank packs the same step and trains its rows,
// the gradients are summed over the ranks, and rank 0 alone writes out_dir (config,
// metrics, checkpoints), evaluates and logs the steps.
#include "trainer/loop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/output_file.h"
#include "data/template_jinja.h"
#include "dist/ranks.h"
#include "model/hf_export.h"
#include "trainer/backend.h"
#include "trainer/backend_registry.h"
#include "trainer/checkpoint.h"
#include "trainer/console_log.h"
#include "trainer/data_options.h"
#include "trainer/eval.h"
#include "trainer/lr_schedule.h"
#include "trainer/metrics.h"
#include "trainer/prefetch.h"
#include "trainer/run.h"
#include "trainer/run_dir.h"
#include "trainer/setup.h"
#include "trainer/step.h"

// Steps the data thread prepares ahead of the one training.
enum { PREFETCH_DEPTH = 3 };

// out_dir, refused (before anything is loaded) when it holds a run that this one is not
// a resume of, unless train.overwrite (trainer/run_dir.h).
static const char *checked_out_dir(const RunConfig *config) {
    const char *out_dir = config->out_dir;
    if (!out_dir) fatal("config key 'out_dir': a directory is required");
    char err[1024];
    if (run_dir_check(out_dir, config->train.resume,
                      config->train.overwrite, err, sizeof err) != 0)
        fatal("config key 'out_dir': %s", err);
    return out_dir;
}

// Creates out_dir and saves the resolved config in it as run_config.json (config.json
// means a model config to every tool of the ecosystem): once everything (model, data,
// resume) has been validated, so a refused run leaves the directory alone.
static void prepare_out_dir(const char *out_dir, const char *resolved) {
    char path[4096], err[1024];
    if (make_dirs(out_dir, err, sizeof err)) fatal("config key 'out_dir': %s", err);
    snprintf(path, sizeof path, "%s/run_config.json", out_dir);
    if (output_is_input(path, NULL)) {  // a resume run with --config out_dir/run_config.json
        printf("%s is this run's --config file: left as it is\n", path);
        return;
    }
    if (write_file_atomic(path, resolved, strlen(resolved), err, sizeof err)) fatal("%s", err);
}

static void print_mfu_basis(const RunSettings *s) {
    if (s->peak_flops > 0)
        printf("MFU against %.1f TFLOP/s%s\n", s->peak_flops / 1e12,
               s->peak_from_datasheet
                   ? " (H200 dense bf16 datasheet; set train.peak_tflops for another GPU)" : "");
}

static void load_train_data(const RunConfig *config, const Tokenizer *tok, DataOptions opt,
                            bool say, PackedDataset *train) {
    const char *path = config->data.train_path;
    if (!path) fatal("config key 'data.train_path': a JSONL file is required");
    packed_dataset_load(tok, path, opt, train);
    if (say) printf("train data: %s: %d samples, layout %s, seq_len %d\n", path, train->n_samples,
           layout_name(opt.layout), opt.seq_len);
}

// data.eval_path when eval is on (eval.every > 0). Returns whether it is.
static bool load_eval_data(const RunConfig *config, const Tokenizer *tok, DataOptions opt,
                           const RunSettings *s, EvalSet *eval) {
    const char *path = config->data.eval_path;
    if (!path || s->eval_every <= 0) return false;
    const char *synthetic_train = config_key_find("data.train_path")->def_str;
    if (strcmp(path, config_key_find("data.eval_path")->def_str) == 0 && config->data.train_path &&
        strcmp(config->data.train_path, synthetic_train) != 0)
        printf("note: the eval set is the synthetic %s while training on %s; name data.eval_path, "
               "or set it to null to hold data.eval_holdout of the training file out\n", path,
               config->data.train_path);
    opt.max_samples = (int)config->eval.max_conversations;
    eval_set_load(eval, tok, path, opt, s->micro_rows);
    printf("eval data: %s: %d samples in the inference view (npass), %d rows\n", path,
           eval->data.n_samples, eval->data.rows.n_rows);
    return true;
}

// data.eval_path null: data.eval_holdout of the training conversations (at least 1, at most
// EVAL_HOLDOUT_MAX), evenly spaced in file order, taken out of train (every rank: the
// training set is the same on all of them); rank 0 evaluates on the first
// eval.max_conversations of them. Returns whether there is an eval set.
enum { EVAL_HOLDOUT_MAX = 200 };
static bool hold_out_eval(const RunConfig *config, DataOptions opt, const RunSettings *s,
                          bool rank0, PackedDataset *train, EvalSet *eval) {
    const double share = config->data.eval_holdout;
    const int n = train->n_samples;
    if (config->data.eval_path || share <= 0 || s->eval_every <= 0) return false;
    int k = (int)ceil(share * n);
    if (k < 1) k = 1;
    if (k > EVAL_HOLDOUT_MAX) k = EVAL_HOLDOUT_MAX;
    if (k >= n)
        fatal("config key 'data.eval_holdout': %s has %d conversations, too few to hold %d out "
              "(name data.eval_path, or set data.eval_holdout=0)", config->data.train_path, n, k);
    TokenizedSample *held = xcalloc((size_t)k, sizeof *held);
    int kept = 0, next = 0;
    for (int i = 0; i < n; i++) {
        // The j-th held-out conversation is the one at (j + 1/2) n / k.
        if (next < k && i == (int)(((2 * (long long)next + 1) * n) / (2 * (long long)k)))
            held[next++] = train->samples[i];
        else
            train->samples[kept++] = train->samples[i];
    }
    CHECK(next == k && kept == n - k, "held out %d of %d", next, k);
    train->n_samples = kept;
    doc_list_free(&train->docs);  // laid out before the split: not used again
    packed_rows_free(&train->rows);
    memset(&train->docs, 0, sizeof train->docs);
    memset(&train->rows, 0, sizeof train->rows);
    const int used = config->eval.max_conversations > 0 && config->eval.max_conversations < k
                         ? (int)config->eval.max_conversations : k;
    for (int i = used; i < k; i++) tokenized_sample_free(&held[i]);
    if (!rank0) {
        for (int i = 0; i < used; i++) tokenized_sample_free(&held[i]);
        free(held);
        return false;
    }
    opt.layout = LAYOUT_NPASS;
    eval_set_from_samples(eval, held, used, config->data.train_path, opt, s->micro_rows);
    printf("eval data: %d of the %d conversations of %s held out of training (data.eval_holdout "
           "%g), %d of them in the inference view (npass), %d rows\n", k, n,
           config->data.train_path, share, used, eval->data.rows.n_rows);
    return true;
}

// train.resume: the checkpoint's weights, moments, progress and data position.
static void resume_if_asked(const RunConfig *config, TrainState *state, StepLoader *loader) {
    const char *resume = config->train.resume;
    if (!resume) return;
    char err[1024];
    if (train_state_resume(state, resume, err, sizeof err) != 0)
        fatal("config key 'train.resume': %s", err);
    step_loader_seek(loader, state->progress.data_epoch, state->progress.data_cursor);
    printf("resumed from %s at step %ld\n", resume, state->progress.step);
}

// The backend for micro-batches of up to train.micro_rows x seq_len, holding the state.
static void *create_backend(const TrainBackendOps *ops, const ModelConfig *mc,
                            const RunSettings *s, int seq_len, const TrainState *state) {
    const BackendSetup setup = {.mc = mc, .table = &state->table, .micro_rows = s->micro_rows,
                                .seq_len = seq_len, .deterministic = s->deterministic,
                                .recompute = s->recompute, .lora = state->lora,
                                .base_table = &state->base_table,
                                .base_params = state->base_params,
                                .offload_optimizer = s->offload_optimizer,
                                .offload_activations = s->offload_activations,
                                .host_params = state->alloc.alloc ? state->params : NULL,
                                .host_m = state->alloc.alloc ? state->opt.m : NULL,
                                .host_v = state->alloc.alloc ? state->opt.v : NULL};
    void *backend = ops->create(&setup);
    ops->set_state(backend, state->params, &state->opt);
    return backend;
}

// The ranks of this run (dist/ranks.h), connected before the backend (NCCL picks this
// rank's GPU). For the tests: ONEPASS_DIST_SETUP_ONLY=1 makes every rank stop once
// connected; ONEPASS_DIST_FAIL_RANK=r makes rank r fail before connecting, so the others
// wait; ONEPASS_DIST_COMM_AT_ONE=1 takes one rank through the communicator too (NCCL's
// path on one GPU: tests/cli_nccl_cuda.sh).
static void ranks_connect(const RunConfig *config, const ModelConfig *mc, Backend backend,
                          DistRanks *out) {
    *out = (DistRanks){.env = dist_env_from_environment(), .comm = dist_comm_single()};
    const DistEnv *env = &out->env;
    if (env->world_size == 1 && !getenv("ONEPASS_DIST_COMM_AT_ONE")) return;
    const char *fail_rank = getenv("ONEPASS_DIST_FAIL_RANK");
    if (fail_rank && atoi(fail_rank) == env->rank) {
        fprintf(stderr, "rank %d: failing on purpose (ONEPASS_DIST_FAIL_RANK)\n", env->rank);
        exit(3);
    }
    const char *file = config->dist.rendezvous_file;
    const double timeout_s = config->dist.timeout_s;
    // The buckets of the trainable table: the model's, or under LoRA the adapters'.
    LoraConfig lora;
    if (lora_config_from(config, &lora)) {
        LoraLayout layout;
        lora_layout_build(mc, &lora, &layout);
        bucket_plan_build(&layout.table, (size_t)config->dist.bucket_mb << 20, &out->plan);
        lora_layout_free(&layout);
    } else {
        ParamTable table;
        param_table_build(mc, &table);
        bucket_plan_build(&table, (size_t)config->dist.bucket_mb << 20, &out->plan);
        param_table_free(&table);
    }
    char err[1024];
    if (dist_ranks_connect(out, backend != BACKEND_CPU, file, timeout_s, err, sizeof err) != 0)
        fatal("rank %d of %d (%s): %s", env->rank, env->world_size, launcher_name(env->launcher),
              err);
    printf("rank %d of %d (%s, local rank %d): rendezvous done (%s), %d gradient buckets of "
           "dist.bucket_mb %lld\n", env->rank, env->world_size, launcher_name(env->launcher),
           env->local_rank, out->nccl ? "NCCL" : "TCP communicator", out->plan.n_buckets,
           config->dist.bucket_mb);
    if (getenv("ONEPASS_DIST_SETUP_ONLY")) exit(0);
}

// What the step loop works with, set up by train_run_start.
typedef struct {
    const RunSettings *settings;
    const ModelConfig *mc;
    int seq_len;  // data.seq_len
    const char *out_dir;
    const TrainBackendOps *ops;
    void *backend;
    Prefetcher *prefetcher;
    EvalSet *eval;  // NULL: no eval
    AccuracySet *accuracy;  // NULL: no accuracy eval (eval.generate_conversations 0)
    const Tokenizer *tok;
    GenerateOptions generate;
    MetricsLog *metrics;
    double flops_per_token;
    int n_train_samples;  // conversations of an epoch
    DistComm comm;  // the ranks: the step's loss and gradients are summed over them
    bool writes;    // rank 0: out_dir, the step log and eval are this rank's
    const volatile sig_atomic_t *stop;  // the caller's stop request (a signal)
} StepLoop;

// The trained step's metrics (step: 1-based) before eval and the device's memory:
// tokens/s summed over the ranks (each rank's rows over its step time), the MFU per rank.
// Also sums the ranks' stop requests: *stop when any rank has one, so all stop together.
static StepMetrics step_metrics(const StepLoop *loop, const PreparedStep *batch, long step,
                                const StepOutcome *outcome, double lr, double step_time,
                                bool *stop) {
    const double peak_flops = loop->settings->peak_flops;
    double reduced[2] = {(double)batch->rank_tokens / step_time, *loop->stop ? 1.0 : 0.0};
    loop->comm.sum(&loop->comm, reduced, 2);
    *stop = reduced[1] > 0;
    const double tokens_per_s = reduced[0], world = loop->comm.world_size;
    return (StepMetrics){
        .step = step, .loss = outcome->loss, .lr = lr, .grad_norm = outcome->grad_norm,
        .tokens = batch->tokens, .trained_tokens = batch->trained_tokens,
        .conversations = batch->n_samples, .tokens_per_s = tokens_per_s,
        // npass's tokens for the step's conversations over the same wall time
        .npass_equivalent_tokens_per_s =
            batch->tokens > 0 ? tokens_per_s * (double)batch->npass_tokens / (double)batch->tokens
                              : 0.0,
        .mfu = peak_flops > 0 ? loop->flops_per_token * tokens_per_s / (peak_flops * world) : -1.0,
        .world_size = loop->comm.world_size,
        .epoch = (double)batch->epoch + (double)batch->cursor / loop->n_train_samples,
    };
}

// The device memory in use, and on eval steps (every eval.every and the last) the
// eval losses and the multi-turn accuracy (generated on the CPU from the state's host
// weights, downloaded from the backend).
static void add_memory_and_eval(const StepLoop *loop, TrainState *state, StepMetrics *m) {
    const RunSettings *s = loop->settings;
    size_t used, total;
    if (loop->ops->device_memory && loop->ops->device_memory(&used, &total))
        m->device_memory_gib = (double)used / (1024.0 * 1024.0 * 1024.0);
    if (loop->eval && (m->step % s->eval_every == 0 || m->step == s->total_steps)) {
        evaluate(loop->ops, loop->backend, loop->eval, &m->eval_loss, &m->eval_answer_loss);
        m->has_eval = true;
        if (loop->accuracy) {
            loop->ops->get_state(loop->backend, state->params, &state->opt);
            char why[256];
            AccuracyReport r;
            // Under LoRA the base with the adapters merged: what base + adapter computes.
            float *merged = state->lora ? xmalloc(state->base_table.total * sizeof(float)) : NULL;
            accuracy_evaluate(loop->accuracy, decode_ops(BACKEND_CPU, why, sizeof why), loop->mc,
                              train_state_model_weights(state, merged), &loop->generate, loop->tok,
                              &r);
            free(merged);
            m->has_accuracy = true;
            m->eval_accuracy = accuracy_ratio(r.n_correct, r.n_turns);
            m->eval_later_turn_accuracy = accuracy_ratio(r.later_correct, r.later_n);
            accuracy_report_free(&r);
        }
    }
}

// Checkpoints (rank 0) at the last step, every train.checkpoint_every steps and after a
// stop signal to any rank (stop). Returns true when the run stops here for the signal.
static bool checkpoint_or_stop(const StepLoop *loop, TrainState *state, bool stop,
                               char *checkpoint_dir, size_t dir_len) {
    const long step = state->progress.step, every = loop->settings->checkpoint_every;
    const bool last = step == loop->settings->total_steps;
    if (!loop->writes) return stop && !last;
    if (last || stop || (every > 0 && step % every == 0)) {
        char err[1024];
        if (train_state_save(state, loop->ops, loop->backend, loop->mc, loop->out_dir,
                             checkpoint_dir, dir_len, err, sizeof err) != 0)
            fatal("writing checkpoint: %s", err);
        printf("checkpoint: %s\n", checkpoint_dir);
        const int keep = loop->settings->save_total_limit;
        if (keep > 0 && run_dir_rotate(loop->out_dir, step, keep, err, sizeof err) != 0)
            fprintf(stderr, "train.save_total_limit: %s\n", err);  // the run goes on
    }
    if (!stop || last) return false;
    printf("stopped by signal after step %ld; resume with --set train.resume=%s\n", step,
           checkpoint_dir);
    return true;
}

// One optimizer step on the prepared batch of 0-based step `step`, at the schedule's
// rate (returned). Fatal, naming the 1-based step, for a batch without trained tokens
// or a non-finite result.
static double train_prepared_step(const StepLoop *loop, long step, const PreparedStep *batch,
                                  StepOutcome *outcome) {
    const RunSettings *s = loop->settings;
    if (batch->trained_tokens == 0)
        fatal("step %ld: no trained token left after packing (every document longer than "
              "data.seq_len %d was skipped)", step + 1, loop->seq_len);
    AdamWHyper hyper = s->adamw;
    const double lr = lr_schedule(step, s->total_steps, s->warmup_steps, s->lr, s->min_lr_ratio);
    hyper.lr = (float)lr;
    char err[1024];
    if (train_step(loop->ops, loop->backend, &batch->micro, batch->rank_trained_tokens, &loop->comm,
                   &hyper, s->max_grad_norm, outcome, err, sizeof err) != 0)
        fatal("step %ld: %s", step + 1, err);
    return lr;
}

static void advance_progress(TrainProgress *progress, long step, const PreparedStep *batch) {
    progress->step = step + 1;
    progress->data_epoch = batch->epoch;
    progress->data_cursor = batch->cursor;
    progress->tokens_seen += batch->tokens;
    progress->trained_tokens_seen += batch->trained_tokens;
}

// This run's clock: elapsed_s counts across resumes, the ETA from this run's pace.
typedef struct {
    double start, elapsed_before;
    long first_step;
} RunClock;

// The step's metrics line and console line.
static void log_step(const StepLoop *loop, const RunClock *clock, TrainProgress *progress,
                     StepMetrics *m) {
    const long total_steps = loop->settings->total_steps;
    progress->elapsed_s = clock->elapsed_before + (now_seconds() - clock->start);
    m->elapsed_s = progress->elapsed_s;
    metrics_write(loop->metrics, m);
    const double per_step =
        (now_seconds() - clock->start) / (double)(progress->step - clock->first_step);
    metrics_print_console(stdout, m, total_steps,
                          per_step * (double)(total_steps - progress->step));
}

// Trains from the state's step to train.steps or a stop signal; the last checkpoint's
// directory goes to checkpoint_dir.
static void run_steps(const StepLoop *loop, TrainState *state, char *checkpoint_dir,
                      size_t dir_len) {
    TrainProgress *progress = &state->progress;
    const RunClock clock = {.start = now_seconds(), .elapsed_before = progress->elapsed_s,
                            .first_step = progress->step};
    for (long step = clock.first_step; step < loop->settings->total_steps; step++) {
        const double step_start = now_seconds();
        const PreparedStep *batch = prefetcher_next(loop->prefetcher);
        StepOutcome outcome;
        const double lr = train_prepared_step(loop, step, batch, &outcome);
        const double step_time = now_seconds() - step_start;
        advance_progress(progress, step, batch);
        bool stop;
        StepMetrics m = step_metrics(loop, batch, progress->step, &outcome, lr, step_time, &stop);
        prefetcher_release(loop->prefetcher, batch);
        if (loop->writes) {
            add_memory_and_eval(loop, state, &m);
            log_step(loop, &clock, progress, &m);
        }
        if (checkpoint_or_stop(loop, state, stop, checkpoint_dir, dir_len)) break;
    }
}

struct TrainRun {
    Tokenizer *tok;
    ModelConfig mc;
    RunSettings settings;
    DistRanks ranks;
    const TrainBackendOps *ops;
    void *backend;
    PackedDataset train;
    EvalSet eval;
    bool do_eval;
    AccuracySet accuracy;
    bool do_accuracy;
    TrainState state;
    StepLoader loader;
    MetricsLog metrics;
    Prefetcher *prefetcher;
    StepLoop loop;
};

TrainRun *train_run_start(const RunConfig *config) {
    TrainRun *run = xcalloc(1, sizeof *run);
    const char *out_dir = checked_out_dir(config);
    char *resolved = config_dump(config);
    const bool rank0 = dist_env_from_environment().rank == 0;
    if (rank0)
        printf("config: %s/run_config.json | tokenizer %s | chat template %s | eval %s\n", out_dir,
               config->data.tokenizer, template_from_config(config)->name,
               config->eval.every <= 0 ? "off"
               : config->data.eval_path ? config->data.eval_path
               : config->data.eval_holdout > 0 ? "held out of data.train_path" : "off");
    Tokenizer *tok = run->tok = tokenizer_with_added(config);
    const ModelConfig *mc = &run->mc;
    run->mc = model_config_with(config, tok);
    char why[512];
    const Backend backend = backend_choose(config->backend, mc, why, sizeof why);
    if (rank0) printf("%s\n", why);  // the run's lines once, from rank 0
    if (rank0 && backend == BACKEND_CPU && config->train.offload_optimizer)
        printf("train.offload_optimizer: the cpu backend's optimizer state is in host memory "
               "already\n");
    if (rank0 && backend == BACKEND_CPU && config->train.offload_activations)
        printf("train.offload_activations: the cpu backend's activations are in host memory "
               "already\n");
    const RunSettings *settings = &run->settings;
    run->settings = run_settings_from(config, backend);
    LoraConfig lora_keys;
    const bool lora_on = lora_config_from(config, &lora_keys);
    // Before connecting: every rank refuses alike, none waits for the others.
    run_memory_check(mc, lora_on ? &lora_keys : NULL, settings, (int)config->data.seq_len,
                     backend, dist_env_from_environment().local_world_size);
    // Before the backend: NCCL picks this rank's GPU.
    ranks_connect(config, mc, backend, &run->ranks);
    const TrainBackendOps *ops = run->ops = backend_ops(backend);
    if (rank0) print_mfu_basis(settings);

    const DataOptions data_opt = data_options_from_config(config);
    load_train_data(config, tok, data_opt, rank0, &run->train);
    run->do_eval = hold_out_eval(config, data_opt, settings, rank0, &run->train, &run->eval) ||
                   (rank0 && load_eval_data(config, tok, data_opt, settings, &run->eval));
    const int accuracy_conversations = (int)config->eval.generate_conversations;
    run->do_accuracy = run->do_eval && accuracy_conversations > 0 && config->data.eval_path;
    if (run->do_eval && accuracy_conversations > 0 && !config->data.eval_path)
        printf("note: eval.generate_conversations scores data.eval_path's conversations: off "
               "with a held-out eval set\n");
    if (run->do_accuracy) {
        accuracy_set_load(&run->accuracy, tok, &data_opt, config->data.eval_path,
                          accuracy_conversations);
        printf("eval accuracy: %d turns of %d conversations generated at each eval\n",
               run->accuracy.n_items, run->accuracy.n_conversations);
        if (run->accuracy.n_too_long)
            printf("eval accuracy: %d turns left out: their prompt is longer than data.seq_len %d\n",
                   run->accuracy.n_too_long, data_opt.seq_len);
    }

    TrainState *state = &run->state;
    // Where the backend updates the state's own arrays the host holds the state once.
    train_state_init(state, mc, settings->seed,
                     run_state_handed_over(backend, settings, lora_on) ? ops->host_allocator
                                                                       : (HostAllocator){NULL, NULL});
    const char *init_from = config->model.init_from;
    if (init_from && !hf_folder_has_weights(init_from)) {
        // config.json alone (a model's shape without its weights): train_state_init's
        // random initialisation stays.
        if (rank0)
            printf("weights: none in %s (config.json only): random initialisation, seed %llu\n",
                   init_from, (unsigned long long)settings->seed);
    } else if (init_from) {
        params_load_or_init(mc, &state->table, init_from, settings->seed, state->params);
        if (rank0) printf("weights: %s\n", init_from);
        params_init_added_rows(mc, &state->table, tok, init_from, state->params);
    }
    hf_export_from(config, mc, tok, &state->save_as);
    if (lora_on) {
        train_state_to_lora(state, mc, &lora_keys, init_from, config->lora.init_from);
        if (rank0)
            printf("lora: r %d, alpha %g%s, %zu adapter parameters on the frozen base%s%s\n",
                   lora_keys.r, lora_keys.alpha, lora_keys.rslora ? " (rslora)" : "", state->table.total,
                   config->lora.init_from ? ", from " : "",
                   config->lora.init_from ? config->lora.init_from : "");
    }
    // Only the run's tokenizer: data.tokenizer is model.init_from's own unless overridden.
    state->tokenizer_model = config->data.tokenizer;
    state->chat_template_jinja = template_official_jinja(data_opt.chat_template->name);
    state->tokenizer = tok;
    state->progress.run_record = run_record_from(config);
    if (rank0) printf("model: %zu parameters (%d layers, hidden %d, vocab %d)\n",
                      state->lora ? state->base_table.total : state->table.total,
           mc->num_hidden_layers, mc->hidden_size, mc->vocab_size);
    StepLoader *loader = &run->loader;
    step_loader_init(loader, run->train.samples, run->train.n_samples, data_opt.layout,
                     data_opt.seq_len, data_opt.pack, settings->tokens_per_step,
                     settings->shuffle, settings->seed);
    loader->loss = data_opt.loss;
    if (config->train.epochs > 0) {
        run->settings.total_steps = step_loader_steps_for_epochs(loader, config->train.epochs);
        if (rank0)
            printf("train.epochs %g: %ld steps of %lld trained tokens over %d conversations "
                   "(train.steps is not used)\n", config->train.epochs, run->settings.total_steps,
                   settings->tokens_per_step, run->train.n_samples);
    }
    resume_if_asked(config, state, loader);
    // The backend first: it refuses what does not fit the device before out_dir exists.
    run->backend = create_backend(ops, mc, settings, data_opt.seq_len, state);
    if (rank0) {
        prepare_out_dir(out_dir, resolved);
        char err[1024];
        if (console_log_attach(out_dir, config->train.resume != NULL, err, sizeof err) != 0)
            fprintf(stderr, "%s\n", err);  // the run goes on without its log
        if (config->train.resume &&
            run_dir_set_aside_later(out_dir, state->progress.step, err, sizeof err) != 0)
            fatal("config key 'train.resume': %s", err);
        if (metrics_open(&run->metrics, out_dir, state->progress.step, err, sizeof err) != 0)
            fatal("%s", err);
    }
    free(resolved);
    run->prefetcher = prefetcher_start(loader, settings->micro_rows, PREFETCH_DEPTH,
                                       ops->host_allocator, run->ranks.comm.rank,
                                       run->ranks.comm.world_size);
    run->loop = (StepLoop){
        .settings = settings, .mc = mc, .seq_len = data_opt.seq_len, .out_dir = out_dir,
        .ops = ops, .backend = run->backend, .prefetcher = run->prefetcher,
        .eval = run->do_eval ? &run->eval : NULL,
        .accuracy = run->do_accuracy ? &run->accuracy : NULL, .tok = tok,
        .generate = generate_options_from(config, tok),
        .metrics = &run->metrics,
        .flops_per_token = model_flops_per_token(
            model_matmul_params(state->lora ? &state->base_table : &state->table, mc)),
        .comm = run->ranks.comm,
        .n_train_samples = run->train.n_samples,
        .writes = rank0,
    };
    return run;
}

void train_run_steps(TrainRun *run, const volatile sig_atomic_t *stop, TrainRunResult *out) {
    *out = (TrainRunResult){.writes = run->loop.writes, .first_step = run->state.progress.step,
                            .total_steps = run->settings.total_steps};
    run->loop.stop = stop;
    run_steps(&run->loop, &run->state, out->checkpoint_dir, sizeof out->checkpoint_dir);
    out->steps_done = run->state.progress.step;
    out->elapsed_s = run->state.progress.elapsed_s;
}

void train_run_free(TrainRun *run) {
    prefetcher_stop(run->prefetcher);
    if (run->loop.writes) metrics_close(&run->metrics);
    dist_ranks_free(&run->ranks);
    run->ops->destroy(run->backend);
    step_loader_free(&run->loader);
    train_state_free(&run->state);
    if (run->do_eval) eval_set_free(&run->eval);
    if (run->do_accuracy) accuracy_set_free(&run->accuracy);
    packed_dataset_free(&run->train);
    tokenizer_free(run->tok);
    free(run);
}
