// The CUDA model's activation arena (model/model_cuda.cu), laid out without a base
// pointer: the byte offset of every buffer inside the one device allocation and the
// allocation's size, from the config and the micro-batch shape. Plain C, so the
// device-memory estimate (trainer/device_memory.c) sizes the very arena that
// cuda_model_create carves with it, in CPU builds too.
// T = max_rows * seq_len tokens, C hidden, F intermediate, V vocab, H query heads, KV
// key/value heads, D head dim (ModelDims); bf16 activations, fp32 rstd/lse/losses.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {  // model.h is a plain C header without guards of its own
#endif
#include "model/model.h"

// Every buffer starts on this boundary (what cuBLASLt prefers).
enum { ARENA_ALIGNMENT = 256 };

// train.offload_activations: the device slots the layer inputs residual[l] (l < L) take
// in turn; the forward copies each to pinned host memory and the backward copies it back,
// one slot ahead of the two layers that run meanwhile (model/model_cuda.cu).
enum { CUDA_RESIDUAL_RING = 3 };

// bytes rounded up to a whole number of ARENA_ALIGNMENT.
static inline size_t arena_round(size_t bytes) {
    return (bytes + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
}

// Reserves `bytes` at the first ARENA_ALIGNMENT boundary at or after *used: returns
// their offset and moves *used to their end.
static inline size_t arena_reserve(size_t *used, size_t bytes) {
    const size_t start = arena_round(*used);
    *used = start + bytes;
    return start;
}

// The uploaded batch (model/batch_cuda.cuh), int32 each.
typedef struct {
    size_t token, pos, lo, hi;          // [T]
    size_t target_slots, slot_targets;  // [T]
    size_t mask_storage;  // [attn_mask_storage_count(max_rows, seq_len, ATTN_TILE, ATTN_TILE)]
} CudaBatchLayout;

// One layer's saved activations, offsets from the start of its block.
typedef struct {
    size_t ln1_rstd;  // [T] fp32
    size_t q;         // [T, H, D]
    size_t k, v;      // [T, KV, D]
    size_t attn;      // [T, H, D]
    size_t lse;       // [T, H] fp32
    size_t mid;       // [T, C]
    size_t ln2_rstd;  // [T] fp32
    size_t gate_up;   // [T, 2F] with MODEL_RECOMPUTE_NONE, else 0 bytes (not kept)
} CudaLayerLayout;

// Byte offsets of CudaModel's buffers (model_cuda.cu says what each holds).
typedef struct {
    CudaBatchLayout batch;
    size_t rope_cos_sin;               // [T, D / 2] float2
    size_t target_losses;              // [T] fp32
    size_t residual, residual_stride;  // residual[l], l in [0, L], at
                                       // residual + cuda_arena_residual_slot(l) * stride: [T, C]
    size_t layers, layer_stride;       // layer l's block at
                                       // layers + (l % layer_blocks) * layer_stride
    size_t layer_blocks;               // L, or 1 with MODEL_RECOMPUTE_LAYER
    CudaLayerLayout layer;
    size_t ln, proj_out, final_norm;   // [T, C]
    size_t gate_up;                    // [mlp_tile_rows, 2F], 0 bytes with MODEL_RECOMPUTE_NONE
    size_t qkv;                        // [T, (H + 2 KV) D]
    size_t act;                        // [mlp_tile_rows, F]
    size_t final_rstd;                 // [T] fp32
    size_t q_normed, k_normed;         // [T, H, D], [T, KV, D]; empty without qk_norm
    size_t q_rstd, k_rstd;             // [T, H], [T, KV] fp32; empty without qk_norm
    size_t chunk_input, chunk_dinput;  // [chunk_rows, C]
    size_t chunk_logits;               // [chunk_rows, V]
    size_t d_residual, d_normed;       // [T, C]
    size_t d_attn, d_q;                // [T, H, D]
    size_t d_k, d_v;                   // [T, KV, D]
    size_t d_act;                      // [mlp_tile_rows, F]
    size_t attn_workspace;             // attn_workspace_bytes
    size_t chunk_rows;  // rows of logits the loss head holds at once: whole 64-row tiles
                        // of at most CUDA_LOGIT_CHUNK_ELEMENTS, at least 1, at most T
    size_t mlp_tile_rows;  // tokens of one MLP tile: whole 64-row tiles of at most
                           // CUDA_MLP_TILE_ELEMENTS gate|up elements, at least 1, at most T
    size_t bytes;       // the arena's size
    ModelRecompute recompute;  // NONE: each layer keeps its gate|up product (layer.gate_up)
    size_t residual_slots;  // [T, C] buffers of the residual stream: L + 1, or with
                            // offload_activations a ring of min(CUDA_RESIDUAL_RING, L) for
                            // residual[0, L) and one for residual[L]
    size_t offloaded;       // offload_activations: the layer inputs residual[0, offloaded)
                            // that wait on the host between the forward and the backward
                            // (L - the ring; the ring's last ones stay in it); else 0
} CudaArenaLayout;

// The slot of residual[l], l in [0, L]: l, or with offload_activations l modulo the
// ring for l < L and the slot after the ring for residual[L].
static inline size_t cuda_arena_residual_slot(const CudaArenaLayout *a, int L, int l) {
    return l == L ? a->residual_slots - 1 : (size_t)l % (a->residual_slots - 1);
}

// attn_workspace_bytes: the attention backward's workspace for max_rows x seq_len in
// either mode (cuda_model_attention_workspace_bytes, model_cuda.h: CUDA builds only).
// recompute (model.h): MODEL_RECOMPUTE_MLP: one shared [T, 2F] gate|up buffer;
// MODEL_RECOMPUTE_NONE: every layer keeps its own instead (L x [T, 2F], the shared one
// gone); MODEL_RECOMPUTE_LAYER: as MLP, and one layer block serves every layer (the
// backward remakes it from the layer's input residual), so the saved activations are
// the L + 1 residuals and one block.
// No limit on T here (cuda_model_create and the estimate's check refuse what the kernels
// cannot index).
CudaArenaLayout cuda_arena_layout(const ModelConfig *cfg, int max_rows, int seq_len,
                                  ModelRecompute recompute, size_t attn_workspace_bytes);
// The same with train.offload_activations (with MODEL_RECOMPUTE_LAYER; another mode keeps
// every residual): the L + 1 residuals become the ring and residual[L].
CudaArenaLayout cuda_arena_layout_offload(const ModelConfig *cfg, int max_rows, int seq_len,
                                          ModelRecompute recompute, bool offload_activations,
                                          size_t attn_workspace_bytes);

#ifdef __cplusplus
}
#endif
