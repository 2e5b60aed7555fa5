// The CUDA backend's device memory, estimated before anything is allocated:
// a micro-batch or a model too large for the GPU is refused naming the keys that decide
// it and the settings of them that would fit, instead of a CUDA "out of memory" midway.
// Pure arithmetic (no CUDA), so the CPU tests check it. The activation arena is the
// layout cuda_model_create carves (model/model_arena.h) for each train.recompute mode;
// tests/test_device_memory_cuda.cu checks it against the arena the model really allocates.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "model/lora.h"
#include "model/model.h"

typedef struct {
    size_t state;      // bf16 weights + their low halves (the fp32 master), fp32 gradients,
                       // AdamW m, v
    size_t arena;      // the model's activation arena for micro_rows x seq_len, with the
                       // attention backward's workspace (cuda_arena_layout)
    size_t scratch;    // the ops' process-wide scratch (cuBLASLt workspace, embedding sort,
                       // norm partials) and a margin for the CUDA runtime's own allocations
    size_t total;
    long long tokens;  // micro_rows x seq_len
} CudaMemoryEstimate;

// attn_workspace_bytes: the attention backward's workspace for micro_rows x seq_len
// (cuda_model_attention_workspace_bytes, model/model_cuda.h, in a CUDA build);
// recompute as cuda_model_create's.
CudaMemoryEstimate cuda_memory_estimate(const ModelConfig *mc, int micro_rows, int seq_len,
                                        ModelRecompute recompute, size_t attn_workspace_bytes);

// The attention backward's workspace for micro_rows x seq_len tokens of mc
// (cuda_model_attention_workspace_bytes in a CUDA build).
typedef size_t (*AttnWorkspaceBytes)(const ModelConfig *mc, int micro_rows, int seq_len);

// A run's request: the model and the micro-batch with its train.recompute mode.
typedef struct {
    const ModelConfig *mc;
    int micro_rows, seq_len;    // train.micro_rows, data.seq_len
    ModelRecompute recompute;   // train.recompute
    AttnWorkspaceBytes workspace;  // NULL: none (0 bytes)
    const LoraConfig *lora;     // LoRA (lora.*); NULL: full fine-tuning
    bool offload_optimizer;     // train.offload_optimizer: fp32 master, m, v on the host
    bool offload_activations;   // train.offload_activations (with recompute layer): the
                                // layer inputs on the host, a ring of them on the device
} CudaMemoryRequest;

// The estimate of the request (cuda_memory_estimate with its workspace). Under LoRA the
// state is the frozen base in bf16 (2 bytes a parameter: no low halves, gradients or
// moments) and the adapters' full training state (16 bytes each, as a full fine-tune's),
// and the scratch holds the adapters' two [tokens, max_group r] bf16 buffers (a group of
// adapters on one input, model/lora.h, works in them at once). With offload_optimizer
// the state is the bf16 weights, the fp32 gradients and two norms. With
// offload_activations the arena is cuda_arena_layout_offload's.
CudaMemoryEstimate cuda_memory_request_estimate(const CudaMemoryRequest *r);

// Refuses a request whose estimate (written to *e when e is not NULL) is above free_bytes
// (what cudaMemGetInfo reports free), or a micro-batch of more tokens than the kernels
// index (2^31 - 1). The message names the estimate, what is free of total_bytes, its
// parts, and what would fit, each with its estimate, in this order of preference:
// train.recompute (mlp from none, then layer), train.offload_activations (with layer),
// train.offload_optimizer (alone, else with the offloaded activations), the largest
// train.micro_rows (with the request's mode, else with train.recompute=layer, else with
// the offloaded activations too), and with none of these the largest data.seq_len (a
// multiple of 64 where it can be, with train.micro_rows=1 and train.recompute=layer);
// when nothing of these fits, the weights and optimizer state decide and it says to
// lower the model's size (the model.* keys). Returns 0 or -1.
int cuda_memory_check(const CudaMemoryRequest *r, size_t free_bytes, size_t total_bytes,
                      CudaMemoryEstimate *e, char *err, size_t err_len);

// The offloaded optimizer's unit (trainer/backend_cuda.cu): gradients come down, AdamW
// runs and the weights go up this many elements at a time.
#define CUDA_OFFLOAD_CHUNK ((size_t)1 << 24)
// The chunks its rings hold (gradients down, weights up): chunk c uses slot c % slots.
#define CUDA_OFFLOAD_SLOTS 2
// The elements of one ring for n parameters: CUDA_OFFLOAD_SLOTS chunks, at most n.
size_t cuda_offload_ring_elements(size_t n);

// The training state's host copy: fp32 weights, AdamW m and v, 12 bytes per parameter
// (with the optimizer offloaded, its pinned master and moments).
size_t host_state_bytes(size_t params);

// Host memory of train.offload_optimizer (trainer/backend_cuda.cu): the pinned fp32
// master weights and AdamW m, v (12 bytes per parameter), a ring of two chunks the
// gradients come down into (fp32) and one the updated weights go up from (bf16), each at
// most all of them.
size_t cuda_offload_host_bytes(const ModelConfig *mc);

// The host memory available to a new allocation: /proc/meminfo's MemAvailable, else
// sysconf's available pages; 0 when neither tells.
size_t host_memory_available(void);

// Refuses (-1, the message naming train.offload_optimizer, the estimate and what is
// available) when cuda_offload_host_bytes(mc) exceeds available_bytes; 0 when it fits.
int cuda_offload_host_check(const ModelConfig *mc, size_t available_bytes, char *err,
                            size_t err_len);

// Pinned host memory of train.offload_activations (model/model_cuda.cu): the layer
// inputs that leave the device's ring, [offloaded][micro_rows x seq_len, hidden] bf16
// (cuda_arena_layout_offload's offloaded); 0 without the key or another mode than layer.
size_t cuda_activations_host_bytes(const CudaMemoryRequest *r);

// The request's pinned host memory: cuda_offload_host_bytes with offload_optimizer and
// cuda_activations_host_bytes.
size_t cuda_host_pinned_bytes(const CudaMemoryRequest *r);
// The host state of LoRA on either backend: the base's fp32 weights (4 bytes per
// parameter) and the adapters' full state (16 bytes each: weights, gradients, m, v).
size_t lora_host_state_bytes(const ModelConfig *mc, const LoraConfig *lora);
// The host memory a CUDA run of the request needs beside the device: under LoRA
// lora_host_state_bytes, for full fine-tuning without offload_optimizer the training
// state's host copy (fp32 weights, AdamW m and v, 12 bytes per parameter, which every
// checkpoint fills from the device; with it that copy is the offloaded master and moments
// themselves); and cuda_host_pinned_bytes.
size_t cuda_run_host_bytes(const CudaMemoryRequest *r);

// Refuses (-1, the message naming train.offload_activations, the estimate, what is
// available and, with train.offload_optimizer, its share) when the request's pinned host
// memory, cuda_activations_host_bytes and with offload_optimizer cuda_offload_host_bytes,
// exceeds available_bytes; 0 when it fits or the activations are not offloaded.
int cuda_activations_host_check(const CudaMemoryRequest *r, size_t available_bytes, char *err,
                                size_t err_len);
