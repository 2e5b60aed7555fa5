#include "trainer/run.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/check.h"

#define H200_DENSE_BF16_TFLOPS 989.5

static int positive_key(const Config *c, const char *key) {
    long long v = config_int(c, key);
    if (v <= 0 || v > (1 << 30)) fatal("config key '%s': must be positive, got %lld", key, v);
    return (int)v;
}

RunSettings run_settings_from(const Config *c, Backend backend) {
    // Statements, not initializers, for the checks: their order decides which error a
    // config with several bad values reports.
    const long total_steps = positive_key(c, "train.steps");
    const int micro_rows = positive_key(c, "train.micro_rows");
    const double tflops = config_num(c, "train.peak_tflops");
    if (tflops < 0) fatal("config key 'train.peak_tflops': must be >= 0, got %g", tflops);
    const bool peak_from_datasheet = tflops == 0 && backend == BACKEND_CUDA;
    return (RunSettings){
        .total_steps = total_steps,
        .micro_rows = micro_rows,
        .warmup_steps = (long)config_int(c, "train.warmup_steps"),
        .eval_every = (long)config_int(c, "train.eval_every"),
        .checkpoint_every = (long)config_int(c, "train.checkpoint_every"),
        .tokens_per_step = config_int(c, "train.tokens_per_step"),
        .shuffle = config_bool(c, "train.shuffle"),
        .deterministic = config_bool(c, "train.deterministic"),
        .lr = config_num(c, "train.lr"),
        .min_lr_ratio = config_num(c, "train.min_lr_ratio"),
        .max_grad_norm = config_num(c, "train.grad_clip"),
        .peak_flops = (peak_from_datasheet ? H200_DENSE_BF16_TFLOPS : tflops) * 1e12,
        .peak_from_datasheet = peak_from_datasheet,
        .seed = (uint64_t)config_int(c, "seed"),
        .adamw = {
            .beta1 = (float)config_num(c, "train.beta1"),
            .beta2 = (float)config_num(c, "train.beta2"),
            .eps = (float)config_num(c, "train.eps"),
            .weight_decay = (float)config_num(c, "train.weight_decay"),
            .decay_norms = config_bool(c, "train.decay_norms"),
            .decay_embeddings = config_bool(c, "train.decay_embeddings"),
        },
    };
}

void train_state_init(TrainState *s, const ModelConfig *mc, uint64_t seed) {
    param_table_build(mc, &s->table);
    s->params = xmalloc(s->table.total * sizeof(float));
    params_init(mc, &s->table, seed, s->params);
    adamw_init(&s->opt, s->table.total);
    s->progress = (TrainProgress){.seed = seed};
    s->export = (HfExport){.dtype = SAVE_F32, .generation_eos_token_id = -1};
    s->export.hf.cfg = *mc;
    s->export.hf.bos_token_id = s->export.hf.pad_token_id = -1;
    s->tokenizer_dir = s->tokenizer_model = NULL;
}

int train_state_resume(TrainState *s, const char *dir, char *err, size_t err_len) {
    const uint64_t seed = s->progress.seed;
    if (checkpoint_load(dir, &s->table, s->params, &s->opt, &s->progress, err, err_len) != 0)
        return -1;
    if (s->progress.seed != seed)
        return fail(err, err_len, "the checkpoint's seed %llu differs from seed %llu",
                    (unsigned long long)s->progress.seed, (unsigned long long)seed);
    return 0;
}

int train_state_save(TrainState *s, const TrainBackendOps *ops, void *backend,
                     const ModelConfig *mc, const char *out_dir, char *dir, size_t dir_len,
                     char *err, size_t err_len) {
    ops->get_state(backend, s->params, &s->opt);
    snprintf(dir, dir_len, "%s/checkpoint-%06ld", out_dir, s->progress.step);
    (void)mc;  // the export carries the model config
    if (checkpoint_save_hf(dir, &s->table, s->params, &s->opt, &s->progress, &s->export, err,
                           err_len))
        return -1;
    return hf_copy_tokenizer(s->tokenizer_dir, s->tokenizer_model, dir, err, err_len);
}

void train_state_free(TrainState *s) {
    adamw_free(&s->opt);
    free(s->params);
    param_table_free(&s->table);
}
