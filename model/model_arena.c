#include "model/model_arena.h"

enum { BF16 = 2, FP32 = 4, INT32 = 4 };

CudaArenaLayout cuda_arena_layout(const ModelConfig *cfg, int max_rows, int seq_len,
                                  ModelRecompute recompute, size_t attn_workspace_bytes) {
    return cuda_arena_layout_offload(cfg, max_rows, seq_len, recompute, false,
                                     attn_workspace_bytes);
}

CudaArenaLayout cuda_arena_layout_offload(const ModelConfig *cfg, int max_rows, int seq_len,
                                          ModelRecompute recompute, bool offload_activations,
                                          size_t attn_workspace_bytes) {
    const ModelDims d = model_dims(cfg);
    const size_t T = (size_t)max_rows * (size_t)seq_len, C = cfg->hidden_size,
                 F = cfg->intermediate_size, V = cfg->vocab_size, H = cfg->num_attention_heads,
                 KV = cfg->num_key_value_heads, L = cfg->num_hidden_layers;
    const size_t QD = d.q_dim, KVD = d.kv_dim;
    CudaArenaLayout a = {.recompute = recompute};
    const bool keep_gate_up = recompute == MODEL_RECOMPUTE_NONE;
    size_t used = 0;
    size_t tile = CUDA_MLP_TILE_ELEMENTS / (2 * F);  // whole 64-row tiles, as the loss chunk
    if (tile > 64) tile -= tile % 64;
    if (tile < 1) tile = 1;
    a.mlp_tile_rows = tile < T ? tile : T;
    const size_t M = a.mlp_tile_rows;

    CudaBatchLayout *b = &a.batch;
    b->token = arena_reserve(&used, INT32 * T);
    b->pos = arena_reserve(&used, INT32 * T);
    b->lo = arena_reserve(&used, INT32 * T);
    b->hi = arena_reserve(&used, INT32 * T);
    b->target_slots = arena_reserve(&used, INT32 * T);
    b->slot_targets = arena_reserve(&used, INT32 * T);
    b->mask_storage = arena_reserve(
        &used, INT32 * attn_mask_storage_count(max_rows, seq_len, ATTN_TILE, ATTN_TILE));
    a.rope_cos_sin = arena_reserve(&used, 2 * FP32 * T * (size_t)(d.head_dim / 2));
    a.target_losses = arena_reserve(&used, FP32 * T);

    // residual[l] and each layer's block of saved activations follow each other at a
    // fixed stride (every buffer starts on a boundary); with MODEL_RECOMPUTE_LAYER one
    // block serves every layer, and with offload_activations a ring of slots the layer
    // inputs.
    const size_t ring = L < CUDA_RESIDUAL_RING ? L : CUDA_RESIDUAL_RING;
    const bool offload = offload_activations && recompute == MODEL_RECOMPUTE_LAYER;
    a.residual_slots = offload ? ring + 1 : L + 1;
    a.offloaded = offload ? L - ring : 0;
    a.residual = arena_reserve(&used, 0);
    a.residual_stride = arena_round(BF16 * T * C);
    used = a.residual + a.residual_slots * a.residual_stride;
    a.layers = arena_reserve(&used, 0);
    CudaLayerLayout *la = &a.layer;
    size_t block = 0;
    la->ln1_rstd = arena_reserve(&block, FP32 * T);
    la->q = arena_reserve(&block, BF16 * T * QD);
    la->k = arena_reserve(&block, BF16 * T * KVD);
    la->v = arena_reserve(&block, BF16 * T * KVD);
    la->attn = arena_reserve(&block, BF16 * T * QD);
    la->lse = arena_reserve(&block, FP32 * T * H);
    la->mid = arena_reserve(&block, BF16 * T * C);
    la->ln2_rstd = arena_reserve(&block, FP32 * T);
    la->gate_up = arena_reserve(&block, keep_gate_up ? BF16 * T * 2 * F : 0);
    a.layer_stride = arena_round(block);
    a.layer_blocks = recompute == MODEL_RECOMPUTE_LAYER ? 1 : L;
    used = a.layers + a.layer_blocks * a.layer_stride;

    a.ln = arena_reserve(&used, BF16 * T * C);
    a.gate_up = arena_reserve(&used, keep_gate_up ? 0 : BF16 * M * 2 * F);
    a.qkv = arena_reserve(&used, BF16 * T * (size_t)d.qkv_dim);
    a.act = arena_reserve(&used, BF16 * M * F);
    a.proj_out = arena_reserve(&used, BF16 * T * C);
    a.final_norm = arena_reserve(&used, BF16 * T * C);
    a.final_rstd = arena_reserve(&used, FP32 * T);
    const size_t qk = cfg->qk_norm ? T : 0;
    a.q_normed = arena_reserve(&used, BF16 * qk * QD);
    a.k_normed = arena_reserve(&used, BF16 * qk * KVD);
    a.q_rstd = arena_reserve(&used, FP32 * qk * H);
    a.k_rstd = arena_reserve(&used, FP32 * qk * KV);

    size_t chunk = CUDA_LOGIT_CHUNK_ELEMENTS / V;  // whole 64-row tiles: better GEMM shapes
    if (chunk > 64) chunk -= chunk % 64;
    if (chunk < 1) chunk = 1;
    a.chunk_rows = chunk < T ? chunk : T;
    a.chunk_input = arena_reserve(&used, BF16 * a.chunk_rows * C);
    a.chunk_logits = arena_reserve(&used, BF16 * a.chunk_rows * V);
    a.chunk_dinput = arena_reserve(&used, BF16 * a.chunk_rows * C);

    a.d_residual = arena_reserve(&used, BF16 * T * C);
    a.d_normed = arena_reserve(&used, BF16 * T * C);
    a.d_attn = arena_reserve(&used, BF16 * T * QD);
    a.d_q = arena_reserve(&used, BF16 * T * QD);
    a.d_k = arena_reserve(&used, BF16 * T * KVD);
    a.d_v = arena_reserve(&used, BF16 * T * KVD);
    a.d_act = arena_reserve(&used, BF16 * M * F);
    a.attn_workspace = arena_reserve(&used, attn_workspace_bytes);
    a.bytes = used;
    return a;
}
