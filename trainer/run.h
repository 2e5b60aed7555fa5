// What a training run (trainer/loop.h) works from: the run's settings, and the host
// copy of the training state that checkpoints hold and the backend exchanges.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "model/model.h"
#include "trainer/adamw.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"

// The train.* keys (and seed) of a run, read and validated once.
typedef struct {
    long total_steps, warmup_steps, eval_every, checkpoint_every;
    int save_total_limit;       // checkpoints kept in out_dir; 0: all
    int micro_rows;
    long long tokens_per_step;  // trained tokens per step (the loader's budget)
    bool shuffle, deterministic;
    ModelRecompute recompute;   // train.recompute
    bool offload_optimizer;     // train.offload_optimizer
    bool offload_activations;   // train.offload_activations (with train.recompute layer)
    double lr, min_lr_ratio;    // the schedule's peak and its floor as a ratio
    double max_grad_norm;       // train.grad_clip; 0: no clipping
    double peak_flops;          // the MFU denominator in FLOP/s; 0: no MFU
    bool peak_from_datasheet;   // peak_flops is the H200's, train.peak_tflops being 0
    uint64_t seed;
    AdamWHyper adamw;           // lr is set per step from the schedule
} RunSettings;

// Fatal, naming the key, for a value out of range, and naming both keys for
// train.offload_activations without train.recompute=layer. The MFU peak is train.peak_tflops,
// or for the CUDA backend when that is 0 the H200's dense bf16 datasheet peak.
RunSettings run_settings_from(const RunConfig *c, Backend backend);
// train.recompute's mode; fatal, naming the key and the values, for another value.
ModelRecompute run_recompute_from(const RunConfig *c);

// Fatal, naming the keys, when the run's host memory estimate (weights, gradients and
// AdamW moments for the model.* sizes, under LoRA (lora not NULL) the base's fp32 weights
// and the adapters' full state; on the CPU backend activations for train.micro_rows x
// data.seq_len; on the CUDA backend cuda_run_host_bytes: the state's host copy (12 bytes
// per parameter unless the optimizer is offloaded; under LoRA the base's fp32 weights and
// the adapters' state) and the offloads' pinned memory) exceeds this machine's memory
// shared by ranks_on_host ranks (each holds all of it; below 1: one), rather than an "out
// of memory" midway. The CUDA backend checks its device memory when it is created
// (trainer/device_memory.h).
void run_memory_check(const ModelConfig *mc, const LoraConfig *lora, const RunSettings *s,
                      int seq_len, Backend backend, int ranks_on_host);

// The host copy of the training state: the checkpoints' format, exchanged with the
// backend through set_state / get_state.
typedef struct {
    ParamTable table;
    float *params;  // [table.total]
    AdamWState opt;
    // Where params, opt.m and opt.v come from (train_state_init): the heap, or the CUDA
    // backend's pinned memory when its offloaded optimizer updates them in place
    // (BackendSetup.host_params: one copy of the state on the host, not two).
    HostAllocator alloc;
    TrainProgress progress;
    HfExport save_as;             // how checkpoints are written (dtype, ids); f32 by default
    const char *tokenizer_dir;    // tokenizer files copied into each checkpoint, or NULL
    const char *tokenizer_model;  // the run's data.tokenizer (file or folder), copied too
    const Tokenizer *tokenizer;   // its model.add_tokens go into the copied files; may be NULL
    const char *chat_template_jinja;  // written as chat_template.jinja (the trained template); may be NULL
    // LoRA (train_state_to_lora): table, params and opt are the adapters'; the frozen base
    // weights are base_params [base_table.total]. lora NULL: full fine-tuning.
    LoraLayout *lora;
    ParamTable base_table;
    float *base_params;
    char *base_model;  // model.init_from's absolute path, the adapters' base_model_name_or_path
} TrainState;

// The run record saved with each checkpoint (TrainProgress.run_record): the resolved
// config and checksums of the train data and tokenizer files. malloc'd JSON text.
char *run_record_from(const RunConfig *c);

// Whether a run's state arrays come from the backend's host_allocator and are handed to
// the backend (BackendSetup.host_params), which updates them in place: the CUDA backend's
// offloaded optimizer of full fine-tuning.
bool run_state_handed_over(Backend backend, const RunSettings *s, bool lora);

// The seeded init at step 0; params, opt.m and opt.v from alloc (alloc.alloc NULL: the
// heap). Not for LoRA (train_state_to_lora replaces the arrays from the heap).
void train_state_init(TrainState *s, const ModelConfig *mc, uint64_t seed, HostAllocator alloc);

// The lora.* keys: false when lora.r is 0 (full fine-tuning). Fatal, naming the key, for
// a lora.targets name that is not a projection, LoRA without model.init_from, with
// model.add_tokens, or an adapter folder lora.init_from whose settings differ from the
// keys (naming each).
bool lora_config_from(const RunConfig *c, LoraConfig *out);
// Turns the state's (loaded) model weights into the frozen base of adapters lc: the
// adapters' PEFT init from the seed, or lora.init_from's adapter folder (adapter_from,
// may be NULL); fresh AdamW moments; checkpoints become PEFT adapter folders naming
// base_model (model.init_from). Fatal when the adapter folder cannot be read.
void train_state_to_lora(TrainState *s, const ModelConfig *mc, const LoraConfig *lc,
                         const char *base_model, const char *adapter_from);
// The model weights generation runs on: the state's params, or under LoRA the base with
// the adapters merged into merged [base_table.total] (returned).
const float *train_state_model_weights(const TrainState *s, float *merged);
// Replaces the state with the checkpoint in dir, which must come from a run with the
// state's seed and the same model, data and data order (the run records compared: a
// change of model.*, the data files' contents, data.layout, data.seq_len, ...,
// train.tokens_per_step or train.shuffle is refused, naming each key; other changes,
// such as train.lr or train.steps, are printed). Returns 0, or -1 with a message.
int train_state_resume(TrainState *s, const char *dir, char *err, size_t err_len);
// Downloads the backend's state into s and saves it as <out_dir>/checkpoint-<step>,
// whose path goes to dir. Returns 0, or -1 with a message.
int train_state_save(TrainState *s, const TrainBackendOps *ops, void *backend,
                     const ModelConfig *mc, const char *out_dir, char *dir, size_t dir_len,
                     char *err, size_t err_len);
void train_state_free(TrainState *s);
