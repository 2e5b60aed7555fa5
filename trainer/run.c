#define _DEFAULT_SOURCE  // realpath
#include "trainer/run.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/checksum.h"
#include "model/peft.h"
#include "trainer/device_memory.h"
#include "trainer/setup.h"

#define H200_DENSE_BF16_TFLOPS 989.5

ModelRecompute run_recompute_from(const RunConfig *c) {
    const int r = model_recompute_from_name(c->train.recompute);
    if (r < 0)
        fatal("config key 'train.recompute': unknown value '%s' (none, mlp, layer)",
              c->train.recompute ? c->train.recompute : "null");
    return (ModelRecompute)r;
}

RunSettings run_settings_from(const RunConfig *c, Backend backend) {
    // config_load has range-checked every numeric key (the ranges of trainer/config_keys.h).
    const ModelRecompute recompute = run_recompute_from(c);
    if (c->train.offload_activations && recompute != MODEL_RECOMPUTE_LAYER)
        fatal("config keys 'train.offload_activations' and 'train.recompute': the offloaded "
              "activations are the layer inputs that train.recompute=layer keeps; it is '%s': "
              "set train.recompute=layer or train.offload_activations=false",
              model_recompute_name(recompute));
    const double tflops = c->train.peak_tflops;
    const bool peak_from_datasheet = tflops == 0 && backend == BACKEND_CUDA;
    return (RunSettings){
        .total_steps = (long)c->train.steps,
        .micro_rows = (int)c->train.micro_rows,
        .warmup_steps = (long)c->train.warmup_steps,
        .eval_every = (long)c->eval.every,
        .checkpoint_every = (long)c->train.checkpoint_every,
        .save_total_limit = (int)c->train.save_total_limit,
        .tokens_per_step = c->train.tokens_per_step,
        .shuffle = c->train.shuffle,
        .deterministic = c->train.deterministic,
        .recompute = recompute,
        .offload_optimizer = c->train.offload_optimizer,
        .offload_activations = c->train.offload_activations,
        .lr = c->train.lr,
        .min_lr_ratio = c->train.min_lr_ratio,
        .max_grad_norm = c->train.grad_clip,
        .peak_flops = (peak_from_datasheet ? H200_DENSE_BF16_TFLOPS : tflops) * 1e12,
        .peak_from_datasheet = peak_from_datasheet,
        .seed = (uint64_t)c->seed,
        .adamw = {
            .beta1 = (float)c->train.beta1,
            .beta2 = (float)c->train.beta2,
            .eps = (float)c->train.eps,
            .weight_decay = (float)c->train.weight_decay,
            .decay_norms = c->train.decay_norms,
            .decay_embeddings = c->train.decay_embeddings,
        },
    };
}

// "fnv:<checksum>" of a file's bytes; "absent" when it cannot be read.
static json_t *file_checksum(const char *path) {
    if (!path) return json_null();
    FILE *f = fopen(path, "rb");
    if (!f) return json_string("absent");
    uint64_t sum = 0x6F6E6570617373ULL;
    char *buf = xmalloc(1 << 20);
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) {
        uint64_t chunk = checksum_bytes(buf, n) ^ sum;
        sum = splitmix64(&chunk);
    }
    free(buf);
    fclose(f);
    char text[24];
    snprintf(text, sizeof text, "%016llx", (unsigned long long)sum);
    return json_string(text);
}

char *run_record_from(const RunConfig *c) {
    char *dump = config_dump(c);
    json_t *config = json_loads(dump, 0, NULL);
    free(dump);
    CHECK(config, "the resolved config does not parse back");
    json_t *files = json_object();
    json_object_set_new(files, "data.train_path", file_checksum(c->data.train_path));
    json_object_set_new(files, "data.tokenizer", file_checksum(c->data.tokenizer));
    // The training set lacks the held-out conversations (trainer/loop.c hold_out_eval).
    if (!c->data.eval_path && c->data.eval_holdout > 0 && c->eval.every > 0)
        json_object_set_new(files, "held out of data.train_path", json_real(c->data.eval_holdout));
    char *set_text = config_set_keys_json(c);
    json_t *set_keys = json_loads(set_text, 0, NULL);
    free(set_text);
    json_t *record = json_pack("{s:o, s:o, s:o}", "config", config, "files", files, "set_keys", set_keys);
    char *text = json_dumps(record, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(record);
    return text;
}

// Appends "key: old -> new" (", " between) to buf.
static void append_change(char *buf, size_t len, const char *key, const json_t *old,
                          const json_t *now) {
    char *a = old ? json_dumps(old, JSON_ENCODE_ANY | JSON_REAL_PRECISION(15)) : strdup("absent");
    char *b = now ? json_dumps(now, JSON_ENCODE_ANY | JSON_REAL_PRECISION(15)) : strdup("absent");
    const size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%s: %s -> %s", used ? ", " : "", key, a, b);
    free(a);
    free(b);
}

// Compares the saved config (object `saved`, dotted prefix) with the current one: fixed
// keys that differ go to refused, others to changed.
static void diff_configs(const json_t *saved, const json_t *now, const char *prefix,
                         char *refused, char *changed, size_t len) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)saved, key, value) {
        char dotted[256];
        snprintf(dotted, sizeof dotted, "%s%s%s", prefix, *prefix ? "." : "", key);
        const json_t *other = json_object_get(now, key);
        if (json_is_object(value) && json_is_object(other)) {
            diff_configs(value, other, dotted, refused, changed, len);
            continue;
        }
        if (other && json_equal(value, (json_t *)other)) continue;
        // Keys the table flags: fixed ones decide the model, the data's tokens and the order
        // the saved data cursor points into; local ones say where this run goes.
        const ConfigKey *k = config_key_find(dotted);
        if (k && (k->flags & CFG_LOCAL)) continue;
        const bool fixed = k && (k->flags & CFG_FIXED);
        append_change(fixed ? refused : changed, len, dotted, value, other);
    }
}

// Refuses a resume whose record differs in a fixed key (or in the data files' bytes);
// prints the other changes.
static int compare_run_records(const char *saved_text, const char *now_text, char *err,
                               size_t err_len) {
    if (!saved_text)
        return fail(err, err_len, "the checkpoint has no run record (written by an older onepass), "
                    "so its model and data settings cannot be checked");
    json_t *saved = json_loads(saved_text, 0, NULL), *now = json_loads(now_text, 0, NULL);
    CHECK(now, "the run record does not parse");
    if (!json_is_object(saved)) {
        json_decref(saved);
        json_decref(now);
        return fail(err, err_len, "the checkpoint's run record is not valid JSON");
    }
    enum { LEN = 4096 };
    char *refused = xcalloc(1, LEN), *changed = xcalloc(1, LEN);
    diff_configs(json_object_get(saved, "config"), json_object_get(now, "config"), "", refused,
                 changed, LEN);
    const char *key;
    json_t *value;
    json_object_foreach(json_object_get(saved, "files"), key, value) {
        if (json_equal(value, json_object_get(json_object_get(now, "files"), key))) continue;
        const size_t used = strlen(refused);
        snprintf(refused + used, LEN - used, "%s%s: %s", used ? ", " : "", key,
                 strncmp(key, "data.", 5) == 0 ? "the file's contents changed" : "changed");
    }
    json_object_foreach(json_object_get(now, "files"), key, value) {  // new since the checkpoint
        if (json_object_get(json_object_get(saved, "files"), key)) continue;
        const size_t used = strlen(refused);
        snprintf(refused + used, LEN - used, "%s%s: changed", used ? ", " : "", key);
    }
    int rc = 0;
    if (*refused)
        rc = fail(err, err_len, "the checkpoint was trained with other settings: %s (these must "
                  "not change on resume: the model, the data and its order)", refused);
    else if (*changed)
        printf("resume: changed since the checkpoint: %s\n", changed);
    free(refused);
    free(changed);
    json_decref(saved);
    json_decref(now);
    return rc;
}

void run_memory_check(const ModelConfig *mc, const LoraConfig *lora, const RunSettings *s,
                      int seq_len, Backend backend, int ranks_on_host) {
    const double V = mc->vocab_size, C = mc->hidden_size, F = mc->intermediate_size,
                 L = mc->num_hidden_layers;
    const ModelDims dims = model_dims(mc);
    const double q = dims.q_dim, kv = dims.kv_dim;
    ParamTable table;  // the exact count (biases, q/k norms, tying), metadata only
    param_table_build(mc, &table);
    const double params = (double)table.total;
    param_table_free(&table);
    // Per token (model/model_cpu.c): the L + 1 residuals; the saved blocks of norms, q, k,
    // v, attention output and mid (one block serves every layer with recompute layer);
    // gate, up and act (one set with recompute mlp or layer); the backward's buffers. The
    // logits exist one chunk at a time.
    const double tokens = (double)s->micro_rows * seq_len;
    const double logit_rows = fmin(tokens, fmax(1.0, floor(CPU_LOGIT_CHUNK_ELEMENTS / V)));
    const double blocks = s->recompute == MODEL_RECOMPUTE_LAYER ? 1 : L;
    const double mlp_sets = s->recompute == MODEL_RECOMPUTE_NONE ? L : 1;
    const double floats_per_token = (L + 1) * C + blocks * (3 * C + (mc->qk_norm ? 3 : 2) * (q + kv)) +
                                    mlp_sets * 3 * F + 2 * C + (2 * C + 2 * q + 2 * kv + 3 * F);
    const double activation_bytes = tokens * 4.0 * floats_per_token + 4.0 * logit_rows * V;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const double memory = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (memory <= 0) return;
    // Every rank on this machine holds its own copy of all of it.
    if (ranks_on_host < 1) ranks_on_host = 1;
    const double machine = memory / ranks_on_host;
    char than[160];
    if (ranks_on_host == 1)
        snprintf(than, sizeof than, "more than this machine's %.1f GiB", memory / gib);
    else
        snprintf(than, sizeof than, "more than %.1f GiB, this machine's %.1f GiB shared by its %d "
                 "ranks", machine / gib, memory / gib, ranks_on_host);
    if (backend == BACKEND_CUDA) {
        // The host holds the training state's copy (fp32 weights, AdamW m and v, which
        // every checkpoint fills from the device; under LoRA the frozen base's fp32
        // weights and the adapters' state) beside the offloads' pinned memory; with the
        // optimizer offloaded its pinned master and moments are that copy.
        const CudaMemoryRequest request = {.mc = mc, .micro_rows = s->micro_rows,
                                           .seq_len = seq_len, .recompute = s->recompute,
                                           .lora = lora,
                                           .offload_optimizer = s->offload_optimizer,
                                           .offload_activations = s->offload_activations};
        const double need = (double)cuda_run_host_bytes(&request);
        const double pinned = (double)cuda_host_pinned_bytes(&request), copy = need - pinned;
        if (need > machine) {
            char copy_text[200] = "";
            if (copy > 0)
                snprintf(copy_text, sizeof copy_text,
                         lora ? "%.1f GiB for the frozen base's fp32 weights and the adapters' "
                                "weights, gradients and AdamW m, v, and "
                              : "%.1f GiB for the training state's copy (fp32 weights and AdamW "
                                "m, v: 12 bytes per parameter, filled at every checkpoint) and ",
                         copy / gib);
            fatal("config keys model.hidden_size, model.intermediate_size, model.num_hidden_layers, "
                  "model.vocab_size%s: %.3g parameters need about %.1f GiB of host memory, "
                  "%s%.1f GiB pinned for the offloads, %s",
                  pinned > 0 ? ", train.offload_optimizer, train.offload_activations" : "",
                  params, need / gib, copy_text, pinned / gib, than);
        }
        return;
    }
    // fp32 weights, gradients, two moments; under LoRA the frozen base's fp32 weights and
    // the adapters' full state
    const double state_bytes = lora ? (double)lora_host_state_bytes(mc, lora) : 16.0 * params;
    if (state_bytes > machine)
        fatal("config keys model.hidden_size, model.intermediate_size, model.num_hidden_layers, "
              "model.vocab_size: %.3g parameters need %.1f GiB for weights, gradients and AdamW "
              "moments, %s", params, state_bytes / gib, than);
    if (backend == BACKEND_CPU && activation_bytes > machine)
        fatal("config keys train.micro_rows x data.seq_len: %d x %d tokens per micro-batch need "
              "about %.1f GiB of activations with train.recompute %s, %s (lower "
              "train.micro_rows%s)", s->micro_rows, seq_len, activation_bytes / gib,
              model_recompute_name(s->recompute), than,
              s->recompute == MODEL_RECOMPUTE_LAYER ? "" : ", or set train.recompute=layer");
}

bool run_state_handed_over(Backend backend, const RunSettings *s, bool lora) {
    return backend == BACKEND_CUDA && s->offload_optimizer && !lora;
}

void train_state_init(TrainState *s, const ModelConfig *mc, uint64_t seed, HostAllocator alloc) {
    param_table_build(mc, &s->table);
    const size_t n = s->table.total;
    s->alloc = alloc;
    if (alloc.alloc) {
        s->params = alloc.alloc(n * sizeof(float));
        adamw_init_from(&s->opt, n, alloc.alloc);
    } else {
        s->params = xmalloc(n * sizeof(float));
        adamw_init(&s->opt, n);
    }
    params_init(mc, &s->table, seed, s->params);
    s->progress = (TrainProgress){.seed = seed};
    s->save_as = (HfExport){.dtype = SAVE_F32, .generation_eos_token_id = -1};
    s->save_as.hf.cfg = *mc;
    s->save_as.hf.bos_token_id = s->save_as.hf.pad_token_id = -1;
    s->tokenizer_dir = s->tokenizer_model = NULL;
    s->tokenizer = NULL;
    s->chat_template_jinja = NULL;
    s->lora = NULL;
    s->base_table = (ParamTable){0};
    s->base_params = NULL;
    s->base_model = NULL;
}

bool lora_config_from(const RunConfig *c, LoraConfig *out) {
    memset(out, 0, sizeof *out);
    if (c->lora.r == 0) {
        if (c->lora.init_from)
            fatal("config key 'lora.init_from' is set but lora.r is 0 (full fine-tuning)");
        return false;
    }
    if (!c->model.init_from)
        fatal("config key 'lora.r' %lld: LoRA trains adapters on a frozen model: set "
              "model.init_from to the base model's folder", c->lora.r);
    if (c->model.add_tokens.n > 0)
        fatal("config keys 'lora.r' and 'model.add_tokens': new token rows would change the "
              "frozen base, which an adapter folder cannot carry");
    if (c->train.offload_optimizer)
        fatal("config keys 'lora.r' and 'train.offload_optimizer': the adapters' optimizer "
              "state is small and stays on the device; offloading is for full fine-tuning");
    out->r = (int)c->lora.r;
    out->alpha = c->lora.alpha;
    out->rslora = c->lora.rslora;
    for (int t = 0; t < LORA_TARGETS; t++) out->target[t] = c->lora.targets.n == 0;
    for (int i = 0; i < c->lora.targets.n; i++) {
        const int t = lora_target_from_name(c->lora.targets.items[i]);
        if (t < 0)
            fatal("config key 'lora.targets': '%s' is not one of q_proj, k_proj, v_proj, o_proj, "
                  "gate_proj, up_proj, down_proj", c->lora.targets.items[i]);
        out->target[t] = true;
    }
    if (c->lora.init_from) {
        LoraConfig saved;
        char base[16], err[1024];
        if (peft_config_read(c->lora.init_from, &saved, base, 0, err, sizeof err))
            fatal("config key 'lora.init_from': %s", err);
        char diff[1024] = "";
        if (saved.r != out->r)
            snprintf(diff + strlen(diff), sizeof diff - strlen(diff), " r %d vs lora.r %d",
                     saved.r, out->r);
        if (saved.alpha != out->alpha)
            snprintf(diff + strlen(diff), sizeof diff - strlen(diff),
                     " lora_alpha %g vs lora.alpha %g", saved.alpha, out->alpha);
        if (saved.rslora != out->rslora)
            snprintf(diff + strlen(diff), sizeof diff - strlen(diff),
                     " use_rslora %s vs lora.rslora %s", saved.rslora ? "true" : "false",
                     out->rslora ? "true" : "false");
        if (memcmp(saved.target, out->target, sizeof saved.target) != 0)
            snprintf(diff + strlen(diff), sizeof diff - strlen(diff),
                     " target_modules differ from lora.targets");
        if (*diff)
            fatal("config key 'lora.init_from': %s/adapter_config.json differs from the lora.* "
                  "keys:%s", c->lora.init_from, diff);
    }
    return true;
}

static void param_table_copy(const ParamTable *from, ParamTable *to) {
    *to = *from;
    to->tensors = xmalloc((size_t)from->n_tensors * sizeof *to->tensors);
    memcpy(to->tensors, from->tensors, (size_t)from->n_tensors * sizeof *to->tensors);
}

void train_state_to_lora(TrainState *s, const ModelConfig *mc, const LoraConfig *lc,
                         const char *base_model, const char *adapter_from) {
    CHECK(!s->alloc.alloc, "LoRA's state comes from the heap, not the backend's allocator");
    s->lora = xcalloc(1, sizeof *s->lora);
    lora_layout_build(mc, lc, s->lora);
    s->base_table = s->table;
    s->base_params = s->params;
    param_table_copy(&s->lora->table, &s->table);
    s->params = xmalloc(s->table.total * sizeof(float));
    if (adapter_from) {
        char err[1024];
        if (peft_adapter_load(adapter_from, s->lora, s->params, err, sizeof err))
            fatal("config key 'lora.init_from': %s", err);
    } else {
        lora_init(s->lora, s->progress.seed, s->params);
    }
    adamw_free(&s->opt);
    adamw_init(&s->opt, s->table.total);
    s->progress.base_checksum =
        checksum_bytes(s->base_params, s->base_table.total * sizeof(float));
    s->save_as.lora = s->lora;
    // An absolute base_model_name_or_path, so the folder loads from anywhere.
    s->base_model = realpath(base_model, NULL);
    s->save_as.base_model = s->base_model ? s->base_model : base_model;
    s->save_as.dtype = SAVE_F32;
}

const float *train_state_model_weights(const TrainState *s, float *merged) {
    if (!s->lora) return s->params;
    memcpy(merged, s->base_params, s->base_table.total * sizeof(float));
    lora_merge(s->lora, &s->base_table, merged, s->params);
    return merged;
}

int train_state_resume(TrainState *s, const char *dir, char *err, size_t err_len) {
    const uint64_t seed = s->progress.seed;
    char *mine = s->progress.run_record, *saved = NULL;
    if (mine) {  // the settings first: they name what changed, a shape error would not
        if (checkpoint_read_run_record(dir, &saved, err, err_len) != 0) return -1;
        const int rc = compare_run_records(saved, mine, err, err_len);
        free(saved);
        if (rc != 0) return -1;
    }
    const int rc = checkpoint_load(dir, &s->table, s->params, &s->opt, &s->progress, err, err_len);
    if (rc == 0) free(s->progress.run_record);  // the saved copy; this run's record goes on
    s->progress.run_record = mine;
    if (rc != 0) return -1;
    if (s->progress.seed != seed)
        return fail(err, err_len, "the checkpoint's seed %llu differs from seed %llu",
                    (unsigned long long)s->progress.seed, (unsigned long long)seed);
    if (s->lora) {  // the frozen base must be the one the adapters were trained on
        const uint64_t base = checksum_bytes(s->base_params, s->base_table.total * sizeof(float));
        if (s->progress.base_checksum != base)
            return fail(err, err_len, "%s: the adapters were trained on base weights of checksum "
                        "%016llx, model.init_from's are %016llx", dir,
                        (unsigned long long)s->progress.base_checksum, (unsigned long long)base);
    }
    return 0;
}

// The tokenizer files of a checkpoint, the trained template's Jinja and the added tokens,
// into its .tmp folder.
static int tokenizer_files(const char *dir, void *arg, char *err, size_t err_len) {
    const TrainState *s = arg;
    if (hf_copy_tokenizer(s->tokenizer_dir, s->tokenizer_model, dir, err, err_len)) return -1;
    if (s->chat_template_jinja && hf_write_chat_template(dir, s->chat_template_jinja, err, err_len))
        return -1;
    return s->tokenizer ? hf_write_added_tokens(dir, s->tokenizer, err, err_len) : 0;
}

int train_state_save(TrainState *s, const TrainBackendOps *ops, void *backend,
                     const ModelConfig *mc, const char *out_dir, char *dir, size_t dir_len,
                     char *err, size_t err_len) {
    ops->get_state(backend, s->params, &s->opt);
    snprintf(dir, dir_len, "%s/checkpoint-%06ld", out_dir, s->progress.step);
    (void)mc;  // the export carries the model config
    return checkpoint_save_hf(dir, &s->table, s->params, &s->opt, &s->progress, &s->save_as,
                              tokenizer_files, s, err, err_len);
}

void train_state_free(TrainState *s) {
    free(s->progress.run_record);
    s->progress.run_record = NULL;
    if (s->lora) {
        lora_layout_free(s->lora);
        free(s->lora);
        s->lora = NULL;
        free(s->base_params);
        param_table_free(&s->base_table);
    }
    free(s->base_model);
    s->base_model = NULL;
    if (s->alloc.free) {
        adamw_free_from(&s->opt, s->alloc.free);
        s->alloc.free(s->params);
    } else {
        adamw_free(&s->opt);
        free(s->params);
    }
    param_table_free(&s->table);
}
