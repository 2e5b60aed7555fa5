// The Llama-family model of DESIGN.md §5 on the GPU: the twin of model.h's CpuModel
// with bf16 weights and activations and fp32 gradients. Same ParamTable, same batch,
// same loss and loss_scale semantics, so the CPU model is its oracle.
//
// Memory: the caller owns the parameters (bf16, [ParamTable.total], the table's
// offsets) and the gradients (fp32, [ParamTable.total], the same offsets), each one
// device allocation. The model owns one activation arena sized at creation for
// max_rows x seq_len; a step allocates nothing on the device (the arena also holds the
// attention backward's workspace, see attention_cuda.h).
//
// Requires ops_cuda_init(max_tokens >= max_rows * seq_len, max_channels >= hidden_size,
// and >= head_dim with qk_norm) before cuda_model_create (the ops' scratch is
// process-wide, see ops_cuda.h).
// All work runs in order on the model's stream (cuda_model_stream); put optimizer
// kernels on that stream too. The two step functions return after the stream has
// finished the step (they read the losses back).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {  // model.h is a plain C header without guards of its own
#endif
#include "model/lora.h"
#include "model/model.h"

typedef struct CudaModel CudaModel;

// Whether the CUDA kernels run a model of these dimensions: the attention kernels are
// built for head dims 64 and 128.
bool model_dims_cuda_supported(const ModelDims *d);

// Validates the config (model_dims, then model_dims_cuda_supported: fatal, naming the
// fields) and allocates the activation arena once, keeping what `recompute` (model.h)
// says: MLP recomputes the gate|up product in the backward, NONE keeps it for every
// layer (faster; L x [T, 2F] bf16 more memory), LAYER keeps only each layer's input
// residual and runs the layer's forward again in its backward (model/model_arena.h).
// The gradients are bitwise the same in every mode.
CudaModel *cuda_model_create(const ModelConfig *cfg, int max_rows, int seq_len,
                             ModelRecompute recompute);
// The same, with offload_activations (train.offload_activations; recompute must be
// MODEL_RECOMPUTE_LAYER, fatal otherwise): the layer inputs residual[l], l < L, take a
// ring of min(CUDA_RESIDUAL_RING, L) slots in the arena (cuda_arena_layout_offload) and
// the L - ring that leave it wait in pinned host memory ([L - ring][max_rows * seq_len,
// hidden] bf16, cuda_activations_host_bytes) between cuda_model_forward_backward's forward
// and backward, copied on a stream of the model's own behind the compute. Forward-only
// calls copy nothing. The gradients are bitwise recompute layer's.
CudaModel *cuda_model_create_offload(const ModelConfig *cfg, int max_rows, int seq_len,
                                     ModelRecompute recompute, bool offload_activations);
void cuda_model_free(CudaModel *m);

// Forward only. params_bf16: device, [ParamTable.total] bf16. b: HOST arrays
// [n_rows, seq_len] and a host AttnMask with ATTN_TILE tiles (fatal otherwise); the model
// uploads them into its own device buffers. Writes per-position cross-entropy into
// losses_host [n_rows, seq_len] (host, 0 where target is -1) when not NULL. Returns the
// sum over targets.
double cuda_model_forward(CudaModel *m, const void *params_bf16, const ModelBatch *b,
                          float *losses_host);

// Forward only, the logits of every position: logits_host [n_rows, seq_len, V] (host,
// fp32 from the bf16 products), made a chunk of rows at a time in the arena (for tests:
// the training steps never materialise them).
void cuda_model_logits(CudaModel *m, const void *params_bf16, const ModelBatch *b,
                       float *logits_host);

// Forward and backward of sum(CE over targets) * loss_scale; gradients of it are ADDED
// into grads (device, [ParamTable.total] fp32), so micro-batches accumulate. Returns the
// unscaled sum of CE over this batch's targets (as cpu_model_forward_backward).
double cuda_model_forward_backward(CudaModel *m, const void *params_bf16, float *grads,
                                   const ModelBatch *b, float loss_scale);

// LoRA (model/lora.h; cpu_model_set_lora's twin): binds adapters whose bf16 weights are
// adapter_bf16 (device, [lora->table.total], the adapter table's offsets) and whose fp32
// gradients accumulate into adapter_grads (device, the same; NULL: forward only). Every
// later call runs base + adapter; cuda_model_forward_backward's grads may then be NULL:
// the base is frozen and no weight-gradient product of it runs. The first binding of a
// rank allocates the adapters' scratch ([max_rows * seq_len, r] bf16, twice). lora NULL
// unbinds.
void cuda_model_set_lora(CudaModel *m, const LoraLayout *lora, const void *adapter_bf16,
                         float *adapter_grads);

// Profiling: with the environment variable ONEPASS_STAGE_TIMES=1 at creation, the model
// times each stage of every step with CUDA events and cuda_model_free prints the
// per-step means (first two steps left out) as one JSON line on stdout
// (model/stage_timer_cuda.cuh).

// The stream every kernel of the model runs on.
cudaStream_t cuda_model_stream(const CudaModel *m);
// The stream the offloaded layer inputs are copied on (cuda_model_create_offload), or
// NULL when none is offloaded (tests hold it to check that every copy is waited for).
cudaStream_t cuda_model_copy_stream(const CudaModel *m);

// Attention backward mode: true (the default) makes every gradient bitwise
// reproducible run to run; false accumulates dQ with atomics (faster).
void cuda_model_set_deterministic(CudaModel *m, bool deterministic);

// Data parallel: called during cuda_model_forward_backward's backward (on the host, as its
// work is queued) each time this backward's contributions to grads[from, table total)
// are complete on the model's stream: after the final norm (and an untied LM head), after
// each layer, and last after the embedding with from 0, so that their all-reduce can run
// behind the rest of the backward. Not called for a micro-batch without targets (its
// gradients are all zero). NULL: none (the default).
typedef void (*CudaGradsReady)(void *ctx, size_t from, cudaStream_t stream);
void cuda_model_set_grads_ready(CudaModel *m, CudaGradsReady fn, void *ctx);

// Called (when set) on the host before the forward reads a range [from, to) of the
// weights (offsets in the parameter table): before the embedding (the embedding and
// layer 0's input norm), at the start of each layer (its tensors and the next layer's
// input norm, or the final norm after the last layer) and before the LM head (its
// tensor), in that order, so their union is the table; stream is the model's. The
// callback orders the stream's next work after whatever still writes that range (the
// offloaded optimizer's upload of the updated weights), so a forward waits per layer.
// The backward reads only what its forward waited for. NULL: none (the default).
typedef void (*CudaWeightsReady)(void *ctx, size_t from, size_t to, cudaStream_t stream);
void cuda_model_set_weights_ready(CudaModel *m, CudaWeightsReady fn, void *ctx);

// Logit rows per chunk of the loss head (tests: chunking must not change the result);
// clamped to [1, the chunk the arena was sized for: at most CUDA_LOGIT_CHUNK_ELEMENTS logits, bf16].
void cuda_model_set_logit_chunk_rows(CudaModel *m, int rows);

// Tokens per MLP tile (tests: the tiles must not change the result beyond the order of
// the weight gradients' sums); clamped to [1, the tile the arena was sized for: at most
// CUDA_MLP_TILE_ELEMENTS gate|up elements, at most the micro-batch].
void cuda_model_set_mlp_tile_rows(CudaModel *m, int rows);

// Bytes of the activation arena (for memory reports): cuda_arena_layout's
// (model/model_arena.h) for this config and max_rows x seq_len.
size_t cuda_model_arena_bytes(const CudaModel *m);

// The attention backward's workspace that the arena holds for max_rows x seq_len: the
// larger of its two modes (attention_cuda.h), so either runs. Arithmetic only (the
// device-memory estimate calls it before anything is allocated).
size_t cuda_model_attention_workspace_bytes(const ModelConfig *cfg, int max_rows, int seq_len);

#ifdef __cplusplus
}
#endif
