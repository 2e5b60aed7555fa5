// LoRA adapters on the model's linear layers, as PEFT defines them (dropout 0): a target
// projection y = x W^T becomes y = x W^T + s (x A^T) B^T with A [r, in], B [out, r] and
// s = alpha / r (alpha / sqrt(r) under rslora). The base weights are frozen; A and B are
// the trainable parameters, in their own table whose names are PEFT's
// (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`), so an adapter
// buffer is written and read as PEFT's adapter_model.safetensors as it is.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "model/model.h"

// The projections an adapter may sit on, in table order within a layer.
typedef enum {
    LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_TARGETS
} LoraTarget;

// The largest rank an adapter may have (the range of lora.r).
#define LORA_MAX_RANK 4096

typedef struct {
    int r;                       // rank; 0: no adapters
    double alpha;                // lora_alpha
    bool rslora;                 // scale alpha / sqrt(r) instead of alpha / r
    bool target[LORA_TARGETS];   // which projections carry an adapter
} LoraConfig;

// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj": PEFT's
// target_modules names.
const char *lora_target_name(LoraTarget t);
// The target named, or -1.
int lora_target_from_name(const char *name);
// The layer tensor (model.h LayerTensor) a target adapts.
LayerTensor lora_target_tensor(LoraTarget t);
// s: alpha / r, or alpha / sqrt(r) under rslora, in double as PEFT computes it.
double lora_scale(const LoraConfig *lc);

// The adapters of a model: the config, the table of every A and B (layer by layer, in
// target order, A before B; offsets into one flat adapter buffer) and where each sits.
typedef struct {
    LoraConfig cfg;
    ParamTable table;      // PEFT names; shapes [r, in] and [out, r]
    float scale;           // lora_scale, rounded to float once
    int in[LORA_TARGETS], out[LORA_TARGETS];  // each target's in and out features
    size_t *a, *b;         // [num_hidden_layers, LORA_TARGETS] offsets; PARAM_ABSENT untargeted
    int num_hidden_layers;
} LoraLayout;

// Fatal for an r outside [1, LORA_MAX_RANK], a non-finite or non-positive alpha, or no
// target.
void lora_layout_build(const ModelConfig *mc, const LoraConfig *lc, LoraLayout *out);
void lora_layout_free(LoraLayout *l);

// PEFT's init: every A uniform in [-1/sqrt(in), 1/sqrt(in)] (kaiming_uniform_ with
// a = sqrt(5)), one seeded stream per tensor; every B zero, so the adapted model starts
// as the base.
void lora_init(const LoraLayout *l, uint64_t seed, float *adapter);

// params [base->total] += the adapters merged: W += s B A for every target (the merged
// model computes what base + adapter does).
void lora_merge(const LoraLayout *l, const ParamTable *base, float *params,
                const float *adapter);

// One adapted projection on the CPU: out[T, OC] += s (x[T, IC] A^T) B^T, with u [T, r]
// scratch (it holds x A^T after the call). out's rows are ld_out apart (>= OC: a column
// slice of wider rows, as q, k, v of a stacked q|k|v product on the GPU). The CUDA twins
// are model/lora_cuda.h's.
void lora_forward_cpu(float *out, int ld_out, float *u, const float *x, const float *A,
                      const float *B, int T, int IC, int OC, int r, float scale);
// Its backward from dout [T, OC] (rows ld_dout apart): dA [r, IC] and dB [OC, r]
// accumulate, dx [T, IC] += the input gradient (skipped when NULL); u, du [T, r] scratch
// (u is x A^T recomputed).
void lora_backward_cpu(float *dx, float *dA, float *dB, float *u, float *du, const float *dout,
                       int ld_dout, const float *x, const float *A, const float *B, int T,
                       int IC, int OC, int r, float scale);

// Binds adapters to the CPU model (model/model_cpu.c): every later forward, logits and
// forward_backward runs base + adapter (the buffers must live that long), and
// forward_backward adds the adapters' gradients into adapter_grads (NULL: forward only).
// cpu_model_forward_backward's grads may then be NULL: the base is frozen, and none of
// its weight gradients is computed. lora NULL unbinds.
void cpu_model_set_lora(CpuModel *m, const LoraLayout *lora, const float *adapter,
                        float *adapter_grads);
