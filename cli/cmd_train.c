// `train run`: the training loop on either backend (trainer/backend.h). Each step: the
// loader's conversations laid out, packed and tiled ahead on a data thread,
// forward+backward in micro-batches with the loss normalised by the step's trained
// tokens, a finite check, global-norm clipping, AdamW under the schedule; then metrics,
// periodic eval in the inference view, and checkpoints (downloaded from the backend).
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "trainer/data_options.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/loader.h"
#include "trainer/metrics.h"
#include "trainer/adamw.h"
#include "trainer/lr_schedule.h"
#include "trainer/setup.h"
#include "trainer/step.h"

// Steps the data thread prepares ahead of the one training.
enum { PREFETCH_DEPTH = 3 };
#define H200_DENSE_BF16_TFLOPS 989.5

static volatile sig_atomic_t stop_requested;

// First SIGINT/SIGTERM: finish the step, checkpoint, exit 0. SA_RESETHAND makes a
// second one kill the process at once.
static void on_stop_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

// Held-out conversations in the inference view (npass), packed and cut into
// micro-batches once.
typedef struct {
    PackedDataset data;
    MicroBatches micro;
    float *losses;  // [n_rows, seq_len] per-position CE of the last run
} EvalSet;

// eval_loss: mean CE over every target (think + answer); eval_answer_loss: over targets
// that are answer tokens, i.e. whose target slot (the next slot of the npass doc) is
// ROLE_ANSWER.
static void evaluate(const TrainBackendOps *ops, void *trainer, EvalSet *eval, double *eval_loss,
                     double *eval_answer_loss) {
    const PackedRows *rows = &eval->data.rows;
    train_step_forward(ops, trainer, &eval->micro, eval->losses);
    double all = 0, answer = 0;
    long long n_all = 0, n_answer = 0;
    for (int r = 0; r < rows->n_rows; r++) {
        for (int i = 0; i + 1 < rows->seq_len; i++) {
            size_t slot = (size_t)r * (size_t)rows->seq_len + (size_t)i;
            if (rows->target[slot] == -1) continue;
            all += eval->losses[slot];
            n_all++;
            if (rows->role[slot + 1] == ROLE_ANSWER) {
                answer += eval->losses[slot];
                n_answer++;
            }
        }
    }
    *eval_loss = n_all ? all / (double)n_all : NAN;
    *eval_answer_loss = n_answer ? answer / (double)n_answer : NAN;
}

// Weights that run through a matmul per token: all 2-D tensors but the embedding
// lookup, plus the LM head when it is tied to the embedding.
static long long matmul_params(const ParamTable *table, const ModelConfig *mc) {
    long long n = mc->tie_word_embeddings ? (long long)mc->vocab_size * mc->hidden_size : 0;
    for (int t = 0; t < table->n_tensors; t++)
        if (table->tensors[t].ndim == 2 && strcmp(table->tensors[t].name, "model.embed_tokens.weight"))
            n += (long long)table->tensors[t].numel;
    return n;
}

static int positive_key(const Config *c, const char *key) {
    long long v = config_int(c, key);
    if (v <= 0 || v > (1 << 30)) fatal("config key '%s': must be positive, got %lld", key, v);
    return (int)v;
}

static void save_checkpoint(const char *out_dir, const ModelConfig *mc, const ParamTable *table,
                            const float *params, const AdamWState *opt,
                            const TrainProgress *progress, char *dir, size_t dir_len) {
    char err[1024];
    snprintf(dir, dir_len, "%s/checkpoint-%06ld", out_dir, progress->step);
    if (checkpoint_save(dir, mc, table, params, opt, progress, err, sizeof err) != 0)
        fatal("writing checkpoint: %s", err);
}

// The MFU denominator: train.peak_tflops, or for the GPU backend when it is 0 the H200's
// dense bf16 datasheet peak (989.5 TFLOP/s; set the key for another GPU). 0: no MFU.
static double peak_flops_of(const Config *c, Backend backend) {
    const double tflops = config_num(c, "train.peak_tflops");
    if (tflops < 0) fatal("config key 'train.peak_tflops': must be >= 0, got %g", tflops);
    if (tflops == 0 && backend == BACKEND_CUDA) return H200_DENSE_BF16_TFLOPS * 1e12;
    return tflops * 1e12;
}

int cmd_train(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // progress lines interleave with errors in order
    Config *config = config_from_args(argc, argv, "run", NULL, NULL);
    char *resolved = config_dump(config);
    printf("resolved config:\n%s\n", resolved);
    ModelConfig mc = model_config_from(config);
    char why[512];
    const Backend backend = backend_choose(config_str(config, "backend"), &mc, why, sizeof why);
    printf("%s\n", why);
    const TrainBackendOps *ops = backend_ops(backend);

    const char *out_dir = config_str(config, "out_dir");
    if (!out_dir) fatal("config key 'out_dir': a directory is required");
    char path[4096], err[1024];
    if (make_dirs(out_dir, err, sizeof err)) fatal("config key 'out_dir': %s", err);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if (write_file_atomic(path, resolved, strlen(resolved), err, sizeof err)) fatal("%s", err);
    free(resolved);

    const long total_steps = positive_key(config, "train.steps");
    const int micro_rows = positive_key(config, "train.micro_rows");
    const long warmup = (long)config_int(config, "train.warmup_steps");
    const long eval_every = (long)config_int(config, "train.eval_every");
    const long checkpoint_every = (long)config_int(config, "train.checkpoint_every");
    const double base_lr = config_num(config, "train.lr");
    const double min_lr_ratio = config_num(config, "train.min_lr_ratio");
    const double max_grad_norm = config_num(config, "train.grad_clip");
    const double peak_flops = peak_flops_of(config, backend);
    const uint64_t seed = (uint64_t)config_int(config, "seed");
    AdamWHyper hyper = {
        .beta1 = (float)config_num(config, "train.beta1"),
        .beta2 = (float)config_num(config, "train.beta2"),
        .eps = (float)config_num(config, "train.eps"),
        .weight_decay = (float)config_num(config, "train.weight_decay"),
        .decay_norms = config_bool(config, "train.decay_norms"),
        .decay_embeddings = config_bool(config, "train.decay_embeddings"),
    };
    if (peak_flops > 0)
        printf("MFU against %.1f TFLOP/s%s\n", peak_flops / 1e12,
               config_num(config, "train.peak_tflops") == 0
                   ? " (H200 dense bf16 datasheet; set train.peak_tflops for another GPU)" : "");

    Tokenizer *tok = tokenizer_from(config, &mc);
    DataOptions data_opt = data_options_from_config(config);
    const char *train_path = config_str(config, "data.train_path");
    if (!train_path) fatal("config key 'data.train_path': a JSONL file is required");
    PackedDataset train;
    packed_dataset_load(tok, train_path, data_opt, &train);
    printf("train data: %s: %d samples, layout %s, seq_len %d\n", train_path, train.n_samples,
           layout_name(data_opt.layout), data_opt.seq_len);

    EvalSet eval = {0};
    const char *eval_path = config_str(config, "data.eval_path");
    const bool do_eval = eval_path && eval_every > 0;
    if (do_eval) {
        DataOptions eval_opt = data_opt;
        eval_opt.layout = LAYOUT_NPASS;
        eval_opt.max_samples = (int)config_int(config, "train.eval_max_conversations");
        packed_dataset_load(tok, eval_path, eval_opt, &eval.data);
        micro_batches_build(&eval.data.rows, micro_rows, &eval.micro);
        eval.losses = xcalloc((size_t)eval.data.rows.n_rows * (size_t)data_opt.seq_len, sizeof(float));
        printf("eval data: %s: %d samples in the inference view (npass), %d rows\n", eval_path,
               eval.data.n_samples, eval.data.rows.n_rows);
    }

    // Host copies of the state: the checkpoints' format, exchanged with the backend.
    ParamTable table;
    param_table_build(&mc, &table);
    float *params = xmalloc(table.total * sizeof(float));  // [table.total]
    params_init(&mc, &table, seed, params);
    AdamWState opt;
    adamw_init(&opt, table.total);
    printf("model: %zu parameters (%d layers, hidden %d, vocab %d)\n", table.total,
           mc.num_hidden_layers, mc.hidden_size, mc.vocab_size);

    StepLoader loader;
    step_loader_init(&loader, train.samples, train.n_samples, data_opt.layout, data_opt.seq_len,
                     data_opt.pack, config_int(config, "train.tokens_per_step"),
                     config_bool(config, "train.shuffle"), seed);
    TrainProgress progress = {.seed = seed};
    const char *resume = config_str(config, "train.resume");
    if (resume) {
        if (checkpoint_load(resume, &table, params, &opt, &progress, err, sizeof err) != 0)
            fatal("config key 'train.resume': %s", err);
        if (progress.seed != seed)
            fatal("config key 'train.resume': the checkpoint's seed %llu differs from seed %llu",
                  (unsigned long long)progress.seed, (unsigned long long)seed);
        step_loader_seek(&loader, progress.data_epoch, progress.data_cursor);
        printf("resumed from %s at step %ld\n", resume, progress.step);
    }

    const BackendSetup setup = {.mc = &mc, .table = &table, .micro_rows = micro_rows,
                                .seq_len = data_opt.seq_len,
                                .deterministic = config_bool(config, "train.deterministic")};
    void *trainer = ops->create(&setup);
    ops->set_state(trainer, params, &opt);
    Prefetcher *prefetcher = prefetcher_start(&loader, micro_rows, PREFETCH_DEPTH, ops->host_allocator);
    MetricsLog metrics;
    metrics_open(&metrics, out_dir, progress.step);
    install_stop_handlers();
    const double flops_per_token = model_flops_per_token(matmul_params(&table, &mc));
    const long first_step = progress.step;
    const double run_start = now_seconds(), elapsed_before = progress.elapsed_s;
    char checkpoint_dir[4096] = "";

    for (long step = first_step; step < total_steps; step++) {
        const double step_start = now_seconds();
        const PreparedStep *batch = prefetcher_next(prefetcher);
        if (batch->trained_tokens == 0)
            fatal("step %ld: no trained token left after packing (every document longer than "
                  "data.seq_len %d was skipped)", step + 1, data_opt.seq_len);
        const double ce_sum = train_step_forward_backward(
            ops, trainer, &batch->micro, (float)(1.0 / (double)batch->trained_tokens));
        const double loss = ce_sum / (double)batch->trained_tokens;
        if (!isfinite(loss))
            fatal("step %ld: the loss is %g; stopping without saving this state (the last "
                  "checkpoint, if any, is intact)", step + 1, loss);
        const double grad_norm = ops->grad_norm(trainer);
        if (!isfinite(grad_norm)) {
            const char *bad = ops->first_nonfinite(trainer, true);
            fatal("step %ld: non-finite gradient in tensor %s; stopping without saving this state "
                  "(the last checkpoint, if any, is intact)", step + 1,
                  bad ? bad : "(none: the norm overflowed)");
        }
        const double lr = lr_schedule(step, total_steps, warmup, base_lr, min_lr_ratio);
        hyper.lr = (float)lr;
        ops->optimizer_step(trainer, &hyper, grad_norm, max_grad_norm);
        const char *bad_weight = ops->first_nonfinite(trainer, false);
        if (bad_weight)
            fatal("step %ld: the update made weights of tensor %s non-finite; stopping without "
                  "saving this state (the last checkpoint, if any, is intact)", step + 1, bad_weight);
        const double step_time = now_seconds() - step_start;

        progress.step = step + 1;
        progress.data_epoch = batch->epoch;
        progress.data_cursor = batch->cursor;
        progress.tokens_seen += batch->tokens;
        progress.trained_tokens_seen += batch->trained_tokens;
        const double tokens_per_s = (double)batch->tokens / step_time;
        StepMetrics m = {
            .step = progress.step, .loss = loss, .lr = lr, .grad_norm = grad_norm,
            .tokens = batch->tokens, .trained_tokens = batch->trained_tokens,
            .conversations = batch->n_samples, .tokens_per_s = tokens_per_s,
            .mfu = peak_flops > 0 ? flops_per_token * tokens_per_s / peak_flops : -1.0,
        };
        prefetcher_release(prefetcher, batch);
        size_t used, total;
        if (ops->device_memory && ops->device_memory(&used, &total))
            m.device_memory_gib = (double)used / (1024.0 * 1024.0 * 1024.0);
        const bool last = progress.step == total_steps;
        if (do_eval && (progress.step % eval_every == 0 || last)) {
            evaluate(ops, trainer, &eval, &m.eval_loss, &m.eval_answer_loss);
            m.has_eval = true;
        }
        progress.elapsed_s = elapsed_before + (now_seconds() - run_start);
        m.elapsed_s = progress.elapsed_s;
        metrics_write(&metrics, &m);
        const double per_step = (now_seconds() - run_start) / (double)(progress.step - first_step);
        metrics_print_console(stdout, &m, total_steps, per_step * (double)(total_steps - progress.step));

        if (last || stop_requested || (checkpoint_every > 0 && progress.step % checkpoint_every == 0)) {
            ops->get_state(trainer, params, &opt);
            save_checkpoint(out_dir, &mc, &table, params, &opt, &progress, checkpoint_dir,
                            sizeof checkpoint_dir);
            printf("checkpoint: %s\n", checkpoint_dir);
        }
        if (stop_requested && !last) {
            printf("stopped by signal after step %ld; resume with --set train.resume=%s\n",
                   progress.step, checkpoint_dir);
            break;
        }
    }
    if (first_step >= total_steps)
        printf("nothing to do: the checkpoint is at step %ld of train.steps %ld\n", first_step,
               total_steps);
    else if (progress.step == total_steps)
        printf("done: %ld steps in %.1f s; final weights in %s/model.safetensors\n", progress.step,
               progress.elapsed_s, checkpoint_dir);

    prefetcher_stop(prefetcher);
    metrics_close(&metrics);
    ops->destroy(trainer);
    step_loader_free(&loader);
    adamw_free(&opt);
    free(params);
    param_table_free(&table);
    if (do_eval) {
        micro_batches_free(&eval.micro);
        packed_dataset_free(&eval.data);
        free(eval.losses);
    }
    packed_dataset_free(&train);
    tokenizer_free(tok);
    config_free(config);
    return 0;
}
