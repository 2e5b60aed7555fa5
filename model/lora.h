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

// Adapters that read one input: q|k|v (ln1), o (the attention output), gate|up (ln2), down
// (the SwiGLU output). A group's targeted members have their A's stacked [n r, in] in
// the adapter buffer, so one product computes x A^T for all of them; each member adds
// into its own column range of the group's output rows (the stacked q|k|v or gate|up).
typedef enum {
    LORA_GROUP_QKV, LORA_GROUP_O, LORA_GROUP_GATE_UP, LORA_GROUP_DOWN, LORA_GROUPS
} LoraGroupId;
#define LORA_GROUP_MAX 3

typedef struct {
    int n;                        // targeted members; 0: the group has no adapter
    int in, r;                    // the shared input's features, the rank
    float scale;                  // lora_scale
    size_t a;                     // offset of the stacked A [n r, in]
    size_t b[LORA_GROUP_MAX];     // offset of member j's B [out[j], r]
    int out[LORA_GROUP_MAX];      // member j's out features
    int col[LORA_GROUP_MAX];      // where member j's columns start in the output rows
} LoraGroup;

// The adapters of a model: the config, the table of every A and B (layer by layer, the
// layer's A's in target order, then its B's; offsets into one flat adapter buffer) and
// where each sits.
typedef struct {
    LoraConfig cfg;
    ParamTable table;      // PEFT names; shapes [r, in] and [out, r]
    float scale;           // lora_scale, rounded to float once
    int in[LORA_TARGETS], out[LORA_TARGETS];  // each target's in and out features
    size_t *a, *b;         // [num_hidden_layers, LORA_TARGETS] offsets; PARAM_ABSENT untargeted
    LoraGroup *groups;     // [num_hidden_layers, LORA_GROUPS]
    int max_group;         // the most members of any group (the scratch holds [T, max_group r])
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

// Layer l's group g.
const LoraGroup *lora_group(const LoraLayout *l, int layer, LoraGroupId g);
// Layer l's adapter on target t alone, as a group of one member (column 0); n = 0 when the
// target has none.
LoraGroup lora_target_group(const LoraLayout *l, int layer, LoraTarget t);

// A group's adapters on the CPU: out[T, :] += s (x[T, in] A_j^T) B_j^T into member j's
// columns col[j] .. col[j] + out[j] of out's rows (ld_out apart), with A_j, B_j read from
// adapter at the group's offsets and u [T, n r] scratch (it holds x A^T after the call).
// The CUDA twins are model/lora_cuda.h's.
void lora_forward_cpu(float *out, int ld_out, float *u, const float *x, const float *adapter,
                      const LoraGroup *g, int T);
// Its backward from dout (rows ld_dout apart, member j's at its columns): the A's and B's
// gradients accumulate into adapter_grads at the group's offsets, dx [T, in] += the input
// gradient (skipped when NULL); u, du [T, n r] scratch (u is x A^T recomputed).
void lora_backward_cpu(float *dx, float *adapter_grads, float *u, float *du, const float *dout,
                       int ld_dout, const float *x, const float *adapter, const LoraGroup *g,
                       int T);

// Binds adapters to the CPU model (model/model_cpu.c): every later forward, logits and
// forward_backward runs base + adapter (the buffers must live that long), and
// forward_backward adds the adapters' gradients into adapter_grads (NULL: forward only).
// cpu_model_forward_backward's grads may then be NULL: the base is frozen, and none of
// its weight gradients is computed. lora NULL unbinds.
void cpu_model_set_lora(CpuModel *m, const LoraLayout *lora, const float *adapter,
                        float *adapter_grads);
