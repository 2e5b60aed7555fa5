// The CUDA backend's device-memory estimate (trainer/device_memory.h) on the CPU:
//  - a tiny config's estimate and the arena layout it takes (model/model_arena.h, which
//    model/model_cuda.cu carves) equal a count by hand of every buffer the CUDA backend
//    allocates, with the attention backward's workspace (attention_bwd.cu) counted by hand;
//  - the activation arena grows linearly in train.micro_rows, the state not at all;
//  - the check refuses an estimate above the free memory, naming the estimate, what is
//    free, and the keys (train.micro_rows, data.seq_len; the model's size when the
//    weights and optimizer state decide), and a micro-batch of more than 2^31-1 tokens.
#include <string.h>

#include "model/model_arena.h"
#include "test_util.h"
#include "trainer/device_memory.h"

static ModelConfig config(int hidden, int heads, int kv_heads, int inter, int layers, int vocab) {
    ModelConfig mc = {.hidden_size = hidden, .intermediate_size = inter, .num_hidden_layers = layers,
                      .num_attention_heads = heads, .num_key_value_heads = kv_heads,
                      .vocab_size = vocab, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
                      .tie_word_embeddings = true};
    return mc;
}

int main(void) {
    // Hidden 64, one head of 64, F 128, one layer, vocab 256, tied; 1 row of 128 tokens.
    const ModelConfig tiny = config(64, 1, 1, 128, 1, 256);
    // The attention backward's workspace: dsum, lse2 (1 x 1 x 128 fp32 each), fp32 dq
    // accumulators (128 x 64) for the fast mode.
    const size_t workspace = 2 * 512 + 4 * 128 * 64;
    const CudaMemoryEstimate e = cuda_memory_estimate(&tiny, 1, 128, MODEL_RECOMPUTE_MLP, workspace);
    // Parameters: embed 256x64 = 16384; layer: 2 norms of 64, q k v o 64x64 = 4 x 4096,
    // gate up down 128x64 = 3 x 8192; final norm 64.
    const size_t n = 16384 + (2 * 64 + 4 * 4096 + 3 * 8192) + 64;
    EXPECT(n == 57536, "hand count of the parameters");
    // bf16 weights (the master's high halves) 2n, its low halves 2n, fp32 gradients 4n,
    // m | v | two norms 4 (2n + 2): 16 bytes per parameter.
    EXPECT(e.state == 16 * 57536 + 8 && e.state == 2 * n + 2 * n + 4 * n + 4 * (2 * n + 2),
           "state %zu bytes", e.state);
    // T = 128; every buffer rounded up to 256 bytes.
    const size_t arena =
        6 * 512 + 256           // token, pos, lo, hi, target slots, targets (4T); mask 24 int32
        + 4 * 128 * 64 + 512    // RoPE cos|sin (T x 32 float2), per-slot losses
        + 2 * (2 * 128 * 64)    // residual stream, L + 1 = 2 buffers of T x C bf16
        + 2 * 512 + 4 * 16384 + 512 + 16384  // layer: 2 rstd, q k v attn, lse (T x H fp32), mid
        + 3 * 16384 + 2 * 128 * 256 + 2 * 128 * 192 + 2 * 128 * 128 + 512  // ln, proj,
                                // final norm; gate|up; q|k|v; act; final rstd
        + 2 * (2 * 128 * 64) + 2 * 128 * 256  // loss chunk of 128 rows: input, dinput, logits
        + 6 * 16384 + 2 * 128 * 128           // d residual, normed, attn, q, k, v; d act
        + workspace;
    EXPECT(arena == 613120, "hand count of the arena");
    EXPECT(e.arena == arena, "arena %zu bytes, by hand %zu", e.arena, arena);
    // Where the layout puts the buffers, by hand: the batch's six [T] int32 (512 bytes
    // each) and the mask (24 int32, one 256-byte slot), RoPE (32768), the losses (512),
    // then the residual stream, the layer's block, the shared buffers, the loss chunk,
    // the backward's, the attention workspace last.
    const CudaArenaLayout l = cuda_arena_layout(&tiny, 1, 128, MODEL_RECOMPUTE_MLP, workspace);
    EXPECT(l.bytes == arena && l.batch.pos == 512 && l.batch.mask_storage == 3072 &&
               l.rope_cos_sin == 3328 && l.target_losses == 36096 && l.residual == 36608 &&
               l.residual_stride == 16384 && l.layers == 69376 && l.layer.q == 512 &&
               l.layer.lse == 512 + 4 * 16384 && l.layer.ln2_rstd == 512 + 5 * 16384 + 512 &&
               l.layer_stride == 1024 + 5 * 16384 + 512 && l.ln == 69376 + 83456 &&
               l.chunk_rows == 128 && l.attn_workspace == arena - workspace,
           "layout: pos %zu, mask %zu, rope %zu, losses %zu, residual %zu + l x %zu, layers "
           "%zu + l x %zu (q %zu, lse %zu, ln2_rstd %zu), ln %zu, chunk %zu rows, workspace "
           "%zu",
           l.batch.pos, l.batch.mask_storage, l.rope_cos_sin, l.target_losses, l.residual,
           l.residual_stride, l.layers, l.layer_stride, l.layer.q, l.layer.lse, l.layer.ln2_rstd,
           l.ln, l.chunk_rows, l.attn_workspace);
    ModelConfig qk = tiny;  // q_norm / k_norm: outputs T x 64 bf16 twice, rstd T x 1 twice
    qk.qk_norm = true;
    const CudaMemoryEstimate eq = cuda_memory_estimate(&qk, 1, 128, MODEL_RECOMPUTE_MLP, workspace);
    EXPECT(eq.arena == arena + 2 * 16384 + 2 * 512 && eq.state == e.state + 16 * 128,
           "q/k norms: arena %zu, state %zu (two norm weights of 64 more)", eq.arena, eq.state);
    // recompute none: the layer's block holds its gate|up (T x 2F bf16 = 65536 bytes)
    // and the shared one goes; with one layer the same bytes, with three two more.
    const CudaArenaLayout kept = cuda_arena_layout(&tiny, 1, 128, MODEL_RECOMPUTE_NONE, workspace);
    EXPECT(kept.bytes == arena && kept.layer_stride == l.layer_stride + 65536 &&
               kept.layer.gate_up == l.layer_stride && kept.ln == l.ln + 65536 &&
               kept.qkv == l.qkv,
           "kept gate|up, one layer: %zu bytes (recomputed %zu), layer stride %zu, its gate|up "
           "at %zu, ln %zu, qkv %zu",
           kept.bytes, arena, kept.layer_stride, kept.layer.gate_up, kept.ln, kept.qkv);
    ModelConfig three = tiny;
    three.num_hidden_layers = 3;
    const size_t three_recomputed = cuda_memory_estimate(&three, 1, 128, MODEL_RECOMPUTE_MLP, workspace).arena;
    const size_t three_kept = cuda_memory_estimate(&three, 1, 128, MODEL_RECOMPUTE_NONE, workspace).arena;
    EXPECT(three_kept == three_recomputed + 2 * 65536, "three layers: kept %zu, recomputed %zu",
           three_kept, three_recomputed);
    EXPECT(e.total == e.state + e.arena + e.scratch && e.scratch >= ((size_t)32 << 20),
           "total = state + arena + scratch (>= the 32 MiB cuBLASLt workspace)");

    // Linear in micro_rows (rows of 1024 tokens, a vocabulary whose loss chunk is fixed),
    // the attention workspace aside (0 here).
    const ModelConfig mid = config(512, 8, 2, 1408, 4, 151936);
    CudaMemoryEstimate r[4];
    for (int i = 0; i < 4; i++) r[i] = cuda_memory_estimate(&mid, 2 << i, 1024, MODEL_RECOMPUTE_MLP, 0);  // 2, 4, 8, 16
    int bad = 0;
    for (int i = 1; i < 3; i++) {
        const double d1 = (double)r[i].arena - (double)r[i - 1].arena;
        const double d2 = (double)r[i + 1].arena - (double)r[i].arena;
        bad += !(d1 > 0) || fabs(d2 - 2 * d1) > 4096 || r[i].state != r[0].state;
    }
    EXPECT(bad == 0, "the arena grows linearly in micro_rows (%zu %zu %zu %zu), the state not",
           r[0].arena, r[1].arena, r[2].arena, r[3].arena);

    char err[1024];
    const size_t gib = (size_t)1 << 30;
    EXPECT(cuda_memory_check(&e, e.total, 140 * gib, 1, 128, err, sizeof err) == 0,
           "fits exactly: accepted");
    const CudaMemoryEstimate huge = cuda_memory_estimate(&mid, 60000, 1024, MODEL_RECOMPUTE_MLP, 0);
    EXPECT(cuda_memory_check(&huge, 100 * gib, 140 * gib, 60000, 1024, err, sizeof err) == -1 &&
               strstr(err, "train.micro_rows") && strstr(err, "data.seq_len") &&
               strstr(err, "100.00 GiB are free (of 140.00)") && strstr(err, "60000 x 1024") &&
               strstr(err, "lower train.micro_rows"),
           "too many tokens per micro-batch: refused naming the keys (%s)", err);
    const ModelConfig big = config(8192, 64, 8, 28672, 80, 128256);  // a 70B shape
    const CudaMemoryEstimate model = cuda_memory_estimate(&big, 1, 1024, MODEL_RECOMPUTE_MLP, 0);
    EXPECT(cuda_memory_check(&model, 139 * gib, 140 * gib, 1, 1024, err, sizeof err) == -1 &&
               strstr(err, "model.hidden_size") && strstr(err, "lower the model's size"),
           "a 70B model: refused naming the model keys (%s)", err);
    const CudaMemoryEstimate over = cuda_memory_estimate(&tiny, 65536, 1 << 20, MODEL_RECOMPUTE_MLP, 0);
    EXPECT(cuda_memory_check(&over, 140 * gib, 140 * gib, 65536, 1 << 20, err, sizeof err) == -1 &&
               strstr(err, "65536 x 1048576") && strstr(err, "train.micro_rows"),
           "2^36 tokens per micro-batch: refused (%s)", err);
    return test_finish();
}
