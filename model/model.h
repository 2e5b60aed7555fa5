// The Llama-family model of DESIGN.md §5: configuration, the parameter table
// (one flat buffer, HF tensor names), and the CPU fp32 forward/backward.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "attention/attention.h"
#include "attention/mask.h"

// RoPE frequency scaling (HF rope_scaling / rope_parameters "rope_type").
typedef enum { ROPE_DEFAULT = 0, ROPE_LINEAR, ROPE_LLAMA3 } RopeType;
typedef struct {
    RopeType type;
    float factor;                              // linear and llama3
    float low_freq_factor, high_freq_factor;   // llama3
    int original_max_position_embeddings;      // llama3
} RopeScaling;

// The bounds of a model, named once: the ranges of the model.* keys
// (trainer/config_keys.h), of a model folder's config.json (model/hf_model.c) and of
// model_dims, which refuses a ModelConfig outside them from anywhere.
#define MODEL_MAX_VOCAB_SIZE (1 << 24)
#define MODEL_MAX_HIDDEN_SIZE (1 << 16)
#define MODEL_MAX_INTERMEDIATE_SIZE (1 << 18)
#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_HEADS 1024           // query heads, and key/value heads
#define MODEL_MAX_HEAD_DIM (1 << 16)
#define MODEL_MAX_RMS_NORM_EPS 1.0     // (0, this]
#define MODEL_MAX_ROPE_THETA 1e12      // (0, this]
#define MODEL_MAX_ROPE_FACTOR 1e6      // rope scaling factors: (0, this]

// The architecture family, as HF model_type: it decides which tensors a layer has.
typedef enum { ARCH_LLAMA = 0, ARCH_QWEN2, ARCH_QWEN3 } ModelArch;

typedef struct {
    int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int num_attention_heads, num_key_value_heads;
    float rms_norm_eps, rope_theta;
    bool tie_word_embeddings;
    int head_dim;          // 0: hidden_size / num_attention_heads (HF's default)
    bool attention_bias;   // q_proj, k_proj, v_proj biases (Qwen2)
    bool qk_norm;          // q_norm, k_norm: RMSNorm over head_dim before RoPE (Qwen3)
    RopeScaling rope_scaling;
    ModelArch arch;        // for the exported config.json
} ModelConfig;

// The widths every part of the model derives from a ModelConfig.
typedef struct {
    int head_dim;  // D: one attention head (cfg.head_dim, else hidden_size / heads)
    int q_dim;     // H * D: q_proj output, attention output, o_proj input
    int kv_dim;    // KV * D: k_proj and v_proj output each
    int qkv_dim;   // q_dim + 2 * kv_dim: the stacked [q; k; v] projection
} ModelDims;

// Validates the config (fatal, naming the model.* key, for anything the model cannot
// run: a size outside [1, its MODEL_MAX_*] (checked in 64-bit, so no product wraps), no head_dim given and heads that do not divide hidden_size,
// an odd head dim (RoPE rotates halves), query heads that are not a multiple of the
// key/value heads, a non-positive rms_norm_eps or rope_theta, a bad rope scaling) and
// returns its dimensions. The one place that derives them: the parameter table and
// both backends call it.
ModelDims model_dims(const ModelConfig *cfg);
// The attention shape of n_rows x seq_len tokens under this model: its query and
// key/value heads, the head dim and the softmax scale 1 / sqrt(head_dim).
AttnShape model_attention_shape(const ModelConfig *cfg, const ModelDims *d, int n_rows,
                                int seq_len);

// One tensor inside the flat parameter buffer (the same offsets index the
// gradient buffer and each optimizer-state buffer).
typedef struct {
    char name[96];       // HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
    int ndim;
    int64_t shape[2];    // HF shape: Linear weights are [out_features, in_features]
    size_t offset;       // in elements, into the flat buffer
    size_t numel;
    bool is_norm;        // RMSNorm weight (for weight-decay exclusion)
    bool is_embedding;   // embed_tokens or lm_head (for weight-decay exclusion)
    bool is_bias;        // a Linear bias: zero at init, decayed as norms are (decay_norms)
} ParamTensor;

typedef struct {
    ParamTensor *tensors;
    int n_tensors;
    size_t total;        // elements in the flat buffer
} ParamTable;

// Validates cfg (model_dims). Tensor order: model.embed_tokens.weight; per layer i: input_layernorm, q_proj,
// k_proj, v_proj, o_proj, post_attention_layernorm, gate_proj, up_proj, down_proj, then
// q_proj.bias, k_proj.bias, v_proj.bias (attention_bias) and self_attn.q_norm, k_norm
// (qk_norm); model.norm.weight; lm_head.weight (absent when tied).
void param_table_build(const ModelConfig *cfg, ParamTable *out);
void param_table_free(ParamTable *t);
const ParamTensor *param_table_find(const ParamTable *t, const char *name);  // NULL if absent
// Per-layer tensors, in ParamTable order, by HF name suffix after "model.layers.{i}.".
// The optional ones (biases, q/k norms) resolve to PARAM_ABSENT when the config has none.
typedef enum {
    W_INPUT_NORM, W_Q, W_K, W_V, W_O, W_POST_NORM, W_GATE, W_UP, W_DOWN,
    W_Q_BIAS, W_K_BIAS, W_V_BIAS, W_Q_NORM, W_K_NORM, LAYER_TENSORS
} LayerTensor;
#define PARAM_ABSENT ((size_t)-1)

// Where each tensor sits in the flat buffer (element offsets), resolved once by name
// for both model backends.
typedef struct {
    size_t embed, final_norm, lm_head;  // lm_head == embed when tied
    size_t *layer;                      // [num_hidden_layers, LAYER_TENSORS]
} ParamOffsets;
void param_offsets_resolve(const ModelConfig *cfg, const ParamTable *t, ParamOffsets *out);
void param_offsets_free(ParamOffsets *o);

// RoPE inverse frequencies inv_freq[head_dim / 2] of theta under the scaling (NULL or
// ROPE_DEFAULT: theta^(-2i/head_dim); linear: divided by factor; llama3: HF's
// wavelength-banded smoothing), in double.
void rope_inv_freq(double *inv_freq, int head_dim, float theta, const RopeScaling *scaling);

// Deterministic init from a seed: N(0, 0.02) for matrices, 1 for norm weights, 0 for biases.
void params_init(const ModelConfig *cfg, const ParamTable *t, uint64_t seed, float *params);

// One micro-batch of packed rows (all [n_rows, seq_len]) with its attention mask
// (intervals and tile lists, for n_rows x seq_len).
typedef struct {
    int n_rows, seq_len;
    const int32_t *token, *target, *pos;
    const AttnMask *mask;
} ModelBatch;

// Validates a batch for a model of max_rows x seq_len (row count, sequence length,
// mask shape, token/target/position and lo/hi ranges); fatal with the slot on error.
// Both backends call it before touching the batch.
void model_batch_check(const ModelBatch *b, const ModelConfig *cfg, int max_rows, int seq_len);

// Validates one call of a KV-cache decoder (model/decode.h and its CUDA twin) before
// anything is appended: n tokens, token i at position pos[i] for sequence slot[i];
// length [max_seqs] holds the tokens each sequence has. Fatal, prefixed with `who` and
// naming the token, for a negative n, a slot outside [0, max_seqs), an id outside
// [0, vocab_size), a negative position, or a sequence that would pass max_len tokens.
// Both decoders call it.
void model_decode_check(const char *who, int n, const int32_t *slot, const int32_t *token,
                        const int32_t *pos, const ModelConfig *cfg, const int *length,
                        int max_seqs, int max_len);

// What the backward recomputes instead of the forward keeping it for every layer
// (train.recompute); the gradients are bitwise the same in every mode (the recomputation
// runs the forward's own functions on the same inputs).
//   MLP (0, the default): the MLP's gate|up products and their activation: one
//     intermediate-sized buffer of each serves every layer.
//   NONE: nothing; every layer keeps all it saves (the most memory, the fastest).
//   LAYER: each layer keeps only its input residual; its backward first runs the
//     layer's forward again (norms, q/k/v, attention, MLP) into one set of buffers that
//     serves every layer.
typedef enum { MODEL_RECOMPUTE_MLP = 0, MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_LAYER } ModelRecompute;
// "mlp", "none", "layer".
const char *model_recompute_name(ModelRecompute r);
// The mode named (as model_recompute_name spells it), or -1.
int model_recompute_from_name(const char *name);

typedef struct CpuModel CpuModel;

// Each model holds the logits of at most this many elements at once (at least one row),
// whatever the batch: the CPU model's are fp32 (64 MiB), the CUDA model's bf16 (512 MiB:
// each chunk's LM-head gradient product reads and writes the whole fp32 weight gradient,
// so fewer, larger chunks are faster at large vocabularies; docs/BENCHMARKS.md).
enum { CPU_LOGIT_CHUNK_ELEMENTS = 1 << 24, CUDA_LOGIT_CHUNK_ELEMENTS = 1 << 28 };
// The CUDA model runs each layer's MLP over tiles of tokens whose gate|up product holds
// at most this many elements (256 MiB bf16; whole 64-row tiles, at least one row), so its
// intermediate-sized buffers stop growing with the micro-batch there. A micro-batch of at
// most 2^27 / (2 intermediate_size) tokens is one tile (21824 tokens at Qwen3-0.6B's 3072).
enum { CUDA_MLP_TILE_ELEMENTS = 1 << 27 };

// Allocates activations once for up to max_rows x seq_len, keeping what `recompute`
// says: per token each layer keeps its input residual (C floats) and, unless LAYER,
// about 3C + 2 q_dim + 2 kv_dim more, and 3F more unless MLP.
CpuModel *cpu_model_create(const ModelConfig *cfg, int max_rows, int seq_len,
                           ModelRecompute recompute);
void cpu_model_free(CpuModel *m);
// Caps how many target rows get their logits at once (default: 64 MiB of logits;
// clamped to [1, the default]); tests use it to exercise several chunks.
void cpu_model_set_logit_chunk_rows(CpuModel *m, int rows);

// Forward only. Writes per-position cross-entropy into losses [n_rows, seq_len]
// (0 where target is -1) when losses is not NULL. Returns the sum over targets.
double cpu_model_forward(CpuModel *m, const float *params, const ModelBatch *b, float *losses);

// Forward only: the logits [n_rows * seq_len, vocab_size] of every slot, at once (for
// tests and tools on small batches: no chunking).
void cpu_model_logits(CpuModel *m, const float *params, const ModelBatch *b, float *logits);

// One layer's SwiGLU MLP on the CPU, shared by the model and the decoder (model/decode.h):
// out[T,C] = down_proj(silu(gate_proj(x)) * up_proj(x)) with the layer's tensor offsets
// w [LAYER_TENSORS]; gate, up, act [T,F] hold the intermediates (act may alias gate).
void cpu_mlp_forward(const float *params, const size_t *w, const float *x, float *gate, float *up,
                     float *act, float *out, int T, int C, int F);

// Forward and backward. The loss is sum(CE over targets) * loss_scale, where
// loss_scale = 1 / (trained positions of the whole optimizer step); gradients of
// that loss are ADDED into grads (so micro-batches accumulate; NULL: the base weights are
// frozen and get none, for LoRA, model/lora.h). Returns the unscaled sum of CE over this
// batch's targets.
double cpu_model_forward_backward(CpuModel *m, const float *params, float *grads,
                                  const ModelBatch *b, float loss_scale);
