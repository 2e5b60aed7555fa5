// The CUDA backend's device-memory estimate (trainer/device_memory.h) on the CPU:
//  - a tiny config's estimate and the arena layout it takes (model/model_arena.h, which
//    model/model_cuda.cu carves) equal a count by hand of every buffer the CUDA backend
//    allocates, with the attention backward's workspace (attention_bwd.cu) counted by hand;
//  - the activation arena grows linearly in train.micro_rows, the state not at all;
//  - every train.recompute mode's arena of several shapes equals a count from the shapes
//    (none: gate|up in each layer's block; layer: one block for all layers);
//  - train.offload_activations' arena of every shape equals the count from the shapes
//    with a ring of min(3, L) layer inputs and residual[L] instead of L + 1 residuals,
//    its slots taken in turn; its pinned host bytes are the L - ring others, refused
//    above the available memory (with the offloaded optimizer's share) naming the key;
//  - the check refuses an estimate above the free memory, naming the estimate, what is
//    free, the keys and the setting that fits (train.recompute=layer when it does, else
//    train.offload_activations, else with the offloaded optimizer too, the largest
//    train.micro_rows, the largest data.seq_len, each checked to fit with one more not
//    fitting; the model's size when the weights and optimizer state decide), and a
//    micro-batch of more than 2^31-1 tokens.
#include <stdlib.h>
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

// A stand-in for the attention backward's workspace (the check only passes it on):
// fp32 dq accumulators and three per-row values for every query head.
static size_t stand_in_workspace(const ModelConfig *mc, int micro_rows, int seq_len) {
    const size_t D = mc->head_dim ? mc->head_dim : mc->hidden_size / mc->num_attention_heads;
    return 4 * (size_t)micro_rows * seq_len * mc->num_attention_heads * (D + 3);
}

// The request's estimated total with other settings.
static size_t request_total(const CudaMemoryRequest *r, int micro_rows, int seq_len,
                            ModelRecompute mode) {
    CudaMemoryRequest other = *r;
    other.micro_rows = micro_rows, other.seq_len = seq_len, other.recompute = mode;
    return cuda_memory_request_estimate(&other).total;
}

// The integer after the first `key` in text, or -1.
static int int_after(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? atoi(p + strlen(key)) : -1;
}

static size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The CUDA model's arena counted from the shapes, buffer by buffer (model_cuda.cu says
// what each holds), every buffer on a 256-byte boundary, the attention workspace last.
// Per mode: none keeps a [T, 2F] gate|up in each layer's block instead of one shared;
// layer keeps one block for all layers, and with offload (train.offload_activations)
// min(3, L) + 1 residuals instead of L + 1.
static size_t arena_by_hand(const ModelConfig *mc, int rows, int seq, ModelRecompute mode,
                            bool offload, size_t workspace) {
    const size_t T = (size_t)rows * seq, C = mc->hidden_size, F = mc->intermediate_size,
                 V = mc->vocab_size, H = mc->num_attention_heads, KV = mc->num_key_value_heads,
                 L = mc->num_hidden_layers;
    const size_t D = mc->head_dim ? (size_t)mc->head_dim : C / H, QD = H * D, KVD = KV * D;
    const size_t bf16 = 2, f32 = 4, i32 = 4;
    size_t chunk = CUDA_LOGIT_CHUNK_ELEMENTS / V;
    if (chunk > 64) chunk -= chunk % 64;
    if (chunk < 1) chunk = 1;
    if (chunk > T) chunk = T;
    // The MLP's tile: 2^27 gate|up elements in whole 64-row tiles, at most T.
    size_t tile = ((size_t)1 << 27) / (2 * F);
    if (tile > 64) tile -= tile % 64;
    if (tile < 1) tile = 1;
    if (tile > T) tile = T;
    const size_t block = round256(f32 * T) + 2 * round256(bf16 * T * QD) +
                         2 * round256(bf16 * T * KVD) + round256(f32 * T * H) +
                         round256(bf16 * T * C) + round256(f32 * T) +
                         (mode == MODEL_RECOMPUTE_NONE ? round256(bf16 * T * 2 * F) : 0);
    const size_t blocks = mode == MODEL_RECOMPUTE_LAYER ? 1 : L;
    const size_t residuals = offload ? (L < 3 ? L : 3) + 1 : L + 1;
    const size_t qk = mc->qk_norm ? T : 0;
    return 6 * round256(i32 * T) +
           round256(i32 * attn_mask_storage_count(rows, seq, ATTN_TILE, ATTN_TILE)) +
           round256(f32 * T * D) + round256(f32 * T)           // RoPE cos|sin, losses
           + residuals * round256(bf16 * T * C) + blocks * block  // residuals, blocks
           + 3 * round256(bf16 * T * C)                         // ln, proj_out, final norm
           + (mode == MODEL_RECOMPUTE_NONE ? 0 : round256(bf16 * tile * 2 * F))  // gate|up
           + round256(bf16 * T * (QD + 2 * KVD)) + round256(bf16 * tile * F)     // qkv, act
           + round256(f32 * T)                                                // final rstd
           + round256(bf16 * qk * QD) + round256(bf16 * qk * KVD) + round256(f32 * qk * H) +
           round256(f32 * qk * KV)                                   // q/k norms
           + 2 * round256(bf16 * chunk * C) + round256(bf16 * chunk * V)  // loss chunk
           + 2 * round256(bf16 * T * C) + 2 * round256(bf16 * T * QD) +
           2 * round256(bf16 * T * KVD) + round256(bf16 * tile * F)  // the backward's
           + workspace;
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
    // layer: one block for every layer: with three layers two blocks (of 83456 bytes, by
    // hand above) fewer than mlp.
    const size_t three_layer = cuda_memory_estimate(&three, 1, 128, MODEL_RECOMPUTE_LAYER,
                                                    workspace).arena;
    EXPECT(three_layer == three_recomputed - 2 * 83456, "three layers: layer %zu, mlp %zu",
           three_layer, three_recomputed);
    EXPECT(cuda_memory_estimate(&tiny, 1, 128, MODEL_RECOMPUTE_LAYER, workspace).arena == arena,
           "one layer: layer mode's arena is mlp's");

    const ModelConfig mid = config(512, 8, 2, 1408, 4, 151936);  // vocab: a fixed chunk
    // Every mode of several shapes (GQA, q/k norms with head_dim apart from hidden /
    // heads, a loss chunk smaller than the micro-batch, several rows) against the count
    // from the shapes.
    // MLP tiles of 1024 tokens (2^27 / 2F) over 2000: the MLP buffers a tile's.
    const ModelConfig wide = config(256, 4, 2, 65536, 2, 5000);
    EXPECT(cuda_arena_layout(&wide, 2, 1000, MODEL_RECOMPUTE_MLP, 0).mlp_tile_rows == 1024 &&
               cuda_arena_layout(&tiny, 1, 128, MODEL_RECOMPUTE_MLP, 0).mlp_tile_rows == 128,
           "MLP tiles: 1024 tokens of F 65536, the whole micro-batch of F 128");
    ModelConfig qwen = config(256, 4, 2, 768, 3, 5000);
    qwen.qk_norm = true, qwen.head_dim = 128;
    const struct {
        const ModelConfig *mc;
        int rows, seq;
    } shapes[] = {{&tiny, 1, 128}, {&three, 2, 1000}, {&qwen, 3, 512}, {&mid, 4, 4096},
                  {&wide, 2, 1000}};
    // The fourth mode: layer with train.offload_activations.
    const ModelRecompute modes[] = {MODEL_RECOMPUTE_MLP, MODEL_RECOMPUTE_NONE,
                                    MODEL_RECOMPUTE_LAYER, MODEL_RECOMPUTE_LAYER};
    ModelConfig six = qwen;  // more layers than the ring
    six.num_hidden_layers = 6;
    const struct {
        const ModelConfig *mc;
        int rows, seq;
    } more[] = {{&six, 2, 640}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] + 1; i++)
        for (int m = 0; m < 4; m++) {
            const ModelConfig *mc = i < 5 ? shapes[i].mc : more[0].mc;
            const int rows = i < 5 ? shapes[i].rows : more[0].rows,
                      seq = i < 5 ? shapes[i].seq : more[0].seq;
            // The offloaded mode through the request (its workspace the stand-in's).
            const size_t ws = m == 3 ? stand_in_workspace(mc, rows, seq)
                                     : 4 * (size_t)rows * seq + 12345;
            const CudaMemoryRequest req = {mc,   rows, seq,  modes[m], stand_in_workspace,
                                           NULL, false, true};
            const size_t est = m == 3 ? cuda_memory_request_estimate(&req).arena
                                      : cuda_memory_estimate(mc, rows, seq, modes[m], ws).arena;
            const size_t hand = arena_by_hand(mc, rows, seq, modes[m], m == 3, ws);
            EXPECT(est == hand, "shape %zu, recompute %s%s: estimated arena %zu, by hand %zu", i,
                   model_recompute_name(modes[m]), m == 3 ? " offloaded" : "", est, hand);
        }
    // Offloaded layer inputs, six layers: a ring of three slots, residual[6] after it;
    // residual[0..3) wait on the host; without the key every residual its own slot.
    const CudaArenaLayout ring = cuda_arena_layout_offload(&six, 2, 640, MODEL_RECOMPUTE_LAYER,
                                                           true, 0);
    const CudaArenaLayout all = cuda_arena_layout(&six, 2, 640, MODEL_RECOMPUTE_LAYER, 0);
    const size_t want_ring[7] = {0, 1, 2, 0, 1, 2, 3};
    int wrong_slots = 0;
    for (int l = 0; l <= 6; l++)
        wrong_slots += cuda_arena_residual_slot(&ring, 6, l) != want_ring[l] ||
                       cuda_arena_residual_slot(&all, 6, l) != (size_t)l;
    EXPECT(wrong_slots == 0 && ring.residual_slots == 4 && ring.offloaded == 3 &&
               all.residual_slots == 7 && all.offloaded == 0 &&
               all.bytes - ring.bytes == 3 * all.residual_stride &&
               all.residual_stride == round256(2 * 1280 * 256),
           "offloaded: %zu slots, %zu offloaded, %zu bytes (all %zu slots, %zu bytes, stride %zu)",
           ring.residual_slots, ring.offloaded, ring.bytes, all.residual_slots, all.bytes,
           all.residual_stride);
    // Only with layer (another mode keeps every residual), and no fewer slots than layers
    // up to the ring: a one-layer model keeps its two.
    EXPECT(cuda_arena_layout_offload(&six, 2, 640, MODEL_RECOMPUTE_MLP, true, 0).bytes ==
                   cuda_arena_layout(&six, 2, 640, MODEL_RECOMPUTE_MLP, 0).bytes &&
               cuda_arena_layout_offload(&tiny, 1, 128, MODEL_RECOMPUTE_LAYER, true, 0).bytes ==
                   cuda_arena_layout(&tiny, 1, 128, MODEL_RECOMPUTE_LAYER, 0).bytes &&
               cuda_arena_layout_offload(&tiny, 1, 128, MODEL_RECOMPUTE_LAYER, true, 0)
                       .offloaded == 0,
           "offload_activations changes nothing with mlp or with one layer");
    // Its pinned host memory: three [1280, 256] bf16 layer inputs; none without the key.
    const CudaMemoryRequest six_off = {&six, 2, 640, MODEL_RECOMPUTE_LAYER, NULL, NULL, false,
                                       true};
    const CudaMemoryRequest six_on_device = {&six, 2, 640, MODEL_RECOMPUTE_LAYER, NULL, NULL,
                                             false, false};
    const size_t host_inputs = 3 * 1280 * 256 * 2;
    EXPECT(cuda_activations_host_bytes(&six_off) == host_inputs &&
               cuda_activations_host_bytes(&six_on_device) == 0,
           "host bytes of the layer inputs %zu (want %zu), without the key %zu",
           cuda_activations_host_bytes(&six_off), host_inputs,
           cuda_activations_host_bytes(&six_on_device));
    {
        char host_err[1024];
        EXPECT(cuda_activations_host_check(&six_off, host_inputs, host_err, sizeof host_err) == 0 &&
                   cuda_activations_host_check(&six_on_device, 0, host_err, sizeof host_err) == 0,
               "the layer inputs fit exactly; nothing to check without the key");
        EXPECT(cuda_activations_host_check(&six_off, host_inputs - 1, host_err,
                                           sizeof host_err) == -1 &&
                   strstr(host_err, "config key train.offload_activations") &&
                   strstr(host_err, "2 x 640 tokens"),
               "a byte short: refused naming the key (%s)", host_err);
        // With the offloaded optimizer both are pinned: their sum must fit.
        CudaMemoryRequest both = six_off;
        both.offload_optimizer = true;
        const size_t sum = host_inputs + cuda_offload_host_bytes(&six);
        EXPECT(cuda_activations_host_check(&both, sum, host_err, sizeof host_err) == 0 &&
                   cuda_activations_host_check(&both, sum - 1, host_err, sizeof host_err) == -1 &&
                   strstr(host_err, "train.offload_optimizer's"),
               "with the offloaded optimizer the sum %zu decides (%s)", sum, host_err);
        // `train` adds its state's host copy, 12 bytes per parameter, unless the optimizer
        // is offloaded: then the pinned master and moments are that copy.
        // By hand: the tied embedding, per layer q, k, v, o (head_dim 128, 4 and 2 heads),
        // gate, up, down, two norms and the q/k norms, the final norm.
        const size_t n_six = 5000 * 256 + 256 +
                             6 * (256 * 512 + 2 * 256 * 256 + 512 * 256 + 3 * 256 * 768 +
                                  2 * 256 + 2 * 128);
        EXPECT(cuda_host_pinned_bytes(&both) == sum && cuda_run_host_bytes(&both) == sum &&
                   cuda_run_host_bytes(&six_off) == 12 * n_six + host_inputs &&
                   cuda_run_host_bytes(&six_on_device) == 12 * n_six,
               "train's host bytes: %zu with both offloads, %zu with the inputs', %zu with none "
               "(%zu parameters)", cuda_run_host_bytes(&both), cuda_run_host_bytes(&six_off),
               cuda_run_host_bytes(&six_on_device), n_six);
    }
    // The order at a long row: none > mlp > layer, layer's saved activations being the
    // residuals (the rest of its arena one layer's working set).
    const size_t none4k = cuda_memory_estimate(&mid, 1, 65536, MODEL_RECOMPUTE_NONE, 0).arena,
                 mlp4k = cuda_memory_estimate(&mid, 1, 65536, MODEL_RECOMPUTE_MLP, 0).arena,
                 layer4k = cuda_memory_estimate(&mid, 1, 65536, MODEL_RECOMPUTE_LAYER, 0).arena;
    EXPECT(none4k > mlp4k && mlp4k > layer4k, "none %zu > mlp %zu > layer %zu", none4k, mlp4k,
           layer4k);

    EXPECT(e.total == e.state + e.arena + e.scratch && e.scratch >= ((size_t)32 << 20),
           "total = state + arena + scratch (>= the 32 MiB cuBLASLt workspace)");

    // Linear in micro_rows (rows of 1024 tokens, a vocabulary whose loss chunk is fixed),
    // the attention workspace aside (0 here).
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

    char err[2048];
    const size_t gib = (size_t)1 << 30;
    const CudaMemoryRequest tiny_request = {&tiny, 1, 128, MODEL_RECOMPUTE_MLP, NULL, NULL, false, false};
    CudaMemoryEstimate got;
    EXPECT(cuda_memory_check(&tiny_request, e.total - workspace, 140 * gib, &got, err,
                             sizeof err) == 0 &&
               got.total == e.total - workspace,
           "fits exactly: accepted, the estimate returned");
    EXPECT(cuda_memory_check(&tiny_request, e.total - workspace - 1, 140 * gib, NULL, err,
                             sizeof err) == -1,
           "a byte short: refused");

    // Too many rows: refused naming the keys and the largest train.micro_rows that fits
    // (it fits, one more does not).
    const CudaMemoryRequest huge = {&mid, 60000, 1024, MODEL_RECOMPUTE_MLP, stand_in_workspace,
                                    NULL, false, false};
    EXPECT(cuda_memory_check(&huge, 100 * gib, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, "train.micro_rows") && strstr(err, "data.seq_len") &&
               strstr(err, "100.00 GiB are free (of 140.00)") && strstr(err, "60000 x 1024") &&
               strstr(err, "with train.recompute=mlp"),
           "too many tokens per micro-batch: refused naming the keys (%s)", err);
    const int rows = int_after(err, "train.micro_rows=");
    EXPECT(rows > 0 && request_total(&huge, rows, 1024, MODEL_RECOMPUTE_MLP) <= 100 * gib &&
               request_total(&huge, rows + 1, 1024, MODEL_RECOMPUTE_MLP) > 100 * gib,
           "train.micro_rows=%d is the largest that fits (%s)", rows, err);

    // Qwen3-0.6B's shape at S = 131072: with mlp over the free memory, with layer under
    // it: refused naming train.recompute=layer first, and the estimate that has.
    ModelConfig qwen06 = config(1024, 16, 8, 3072, 28, 151936);
    qwen06.head_dim = 128, qwen06.qk_norm = true;
    const CudaMemoryRequest longrow = {&qwen06, 1, 131072, MODEL_RECOMPUTE_MLP, stand_in_workspace,
                                       NULL, false, false};
    const size_t mlp_total = request_total(&longrow, 1, 131072, MODEL_RECOMPUTE_MLP);
    const size_t layer_total = request_total(&longrow, 1, 131072, MODEL_RECOMPUTE_LAYER);
    const size_t between = (mlp_total + layer_total) / 2;
    char layer_text[64];
    snprintf(layer_text, sizeof layer_text, "it fits with train.recompute=layer (about %.2f GiB)",
             layer_total / (double)gib);
    EXPECT(layer_total < mlp_total &&
               cuda_memory_check(&longrow, between, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, layer_text) && strstr(err, "1 x 131072"),
           "0.6B at 131072: mlp %.2f GiB, layer %.2f GiB, %.2f free: refused naming layer (%s)",
           mlp_total / (double)gib, layer_total / (double)gib, between / (double)gib, err);
    // From none, mlp is named first when it fits.
    const CudaMemoryRequest kept_all = {&qwen06, 1, 131072, MODEL_RECOMPUTE_NONE,
                                        stand_in_workspace, NULL, false, false};
    EXPECT(cuda_memory_check(&kept_all, mlp_total, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, "it fits with train.recompute=mlp"),
           "from none, mlp named first (%s)", err);
    // The layer inputs on the host: from layer, below its estimate and above the
    // offloaded one, train.offload_activations is named with its estimate; from mlp, with
    // train.recompute=layer. The offloaded request's own refusal names both keys.
    CudaMemoryRequest layer_row = longrow;
    layer_row.recompute = MODEL_RECOMPUTE_LAYER;
    CudaMemoryRequest offloaded_row = layer_row;
    offloaded_row.offload_activations = true;
    const size_t offload_total = cuda_memory_request_estimate(&offloaded_row).total;
    const size_t offload_between = (layer_total + offload_total) / 2;
    // The estimates' difference: 25 of the 28 layer inputs, [131072, 1024] bf16 each.
    EXPECT(layer_total - offload_total == 25 * ((size_t)131072 * 1024 * 2),
           "0.6B at 131072: layer %.2f GiB, offloaded %.2f GiB: 25 layer inputs apart",
           layer_total / (double)gib, offload_total / (double)gib);
    char offload_text[96];
    snprintf(offload_text, sizeof offload_text,
             "it fits with train.offload_activations=true (about %.2f GiB)",
             offload_total / (double)gib);
    EXPECT(cuda_memory_check(&layer_row, offload_between, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, offload_text),
           "from layer, train.offload_activations named (%s)", err);
    snprintf(offload_text, sizeof offload_text,
             "it fits with train.recompute=layer and train.offload_activations=true (about %.2f "
             "GiB)", offload_total / (double)gib);
    EXPECT(cuda_memory_check(&longrow, offload_between, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, offload_text),
           "from mlp, layer with train.offload_activations named (%s)", err);
    EXPECT(cuda_memory_check(&offloaded_row, offload_total - 1, 140 * gib, NULL, err,
                             sizeof err) == -1 &&
               strstr(err, "with train.recompute=layer and train.offload_activations=true, ") &&
               cuda_memory_check(&offloaded_row, offload_total, 140 * gib, NULL, err,
                                 sizeof err) == 0,
           "the offloaded request: fits its estimate, refused a byte short naming its keys (%s)",
           err);
    // Four rows of 131072 with mlp: no mode or offload fits four, one row fits only with
    // the layer inputs on the host.
    CudaMemoryRequest four = longrow;
    four.micro_rows = 4;
    EXPECT(cuda_memory_check(&four, offload_between, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, "it fits with train.micro_rows=1 with train.recompute=layer and "
                           "train.offload_activations=true"),
           "four rows: one row with the offloaded layer inputs named (%s)", err);

    // Nothing fits one row of 131072 with any mode or offload: the largest data.seq_len
    // that does, with one row and layer (a multiple of 64: it fits, 64 more do not).
    CudaMemoryRequest everything = offloaded_row;
    everything.offload_optimizer = true;
    const size_t little = cuda_memory_request_estimate(&everything).total - ((size_t)1 << 30);
    EXPECT(cuda_memory_check(&longrow, little, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, "with train.micro_rows=1 and train.recompute=layer"),
           "nothing fits at 131072: refused naming data.seq_len (%s)", err);
    const int seq = int_after(err, "data.seq_len=");
    EXPECT(seq > 0 && seq % 64 == 0 &&
               request_total(&longrow, 1, seq, MODEL_RECOMPUTE_LAYER) <= little &&
               request_total(&longrow, 1, seq + 64, MODEL_RECOMPUTE_LAYER) > little,
           "data.seq_len=%d is the largest multiple of 64 that fits (%s)", seq, err);

    // Qwen3-8B at 131072 on an 80 GiB card: only with both the optimizer and the layer
    // inputs on the host.
    {
        ModelConfig q8 = config(4096, 32, 8, 12288, 36, 151936);
        q8.head_dim = 128, q8.qk_norm = true, q8.tie_word_embeddings = false;
        const CudaMemoryRequest r8 = {&q8, 1, 131072, MODEL_RECOMPUTE_LAYER, stand_in_workspace,
                                      NULL, false, false};
        CudaMemoryRequest both8 = r8;
        both8.offload_optimizer = both8.offload_activations = true;
        const CudaMemoryEstimate e8 = cuda_memory_request_estimate(&both8);
        EXPECT(cuda_memory_check(&r8, 79 * gib, 80 * gib, NULL, err, sizeof err) == -1 &&
                   strstr(err, "it fits with train.offload_optimizer=true with "
                               "train.offload_activations=true") &&
                   e8.total <= 79 * gib,
               "Qwen3-8B at 131072, 79 GiB free: both offloads named, %.2f GiB (%s)",
               e8.total / (double)gib, err);
        printf("Qwen3-8B, 1 x 131072, recompute layer, both offloads: %.2f GiB on the device "
               "(arena %.2f), %.2f GiB of pinned host memory\n", e8.total / (double)gib,
               e8.arena / (double)gib,
               (cuda_activations_host_bytes(&both8) + cuda_offload_host_bytes(&q8)) / (double)gib);
        // With the optimizer alone offloaded, `train` needs the pinned 12 bytes a parameter
        // and the rings, its state's copy being those: less than a 128 GiB host.
        CudaMemoryRequest opt8 = r8;
        opt8.offload_optimizer = true;
        size_t n8 = 0;  // by hand: embeddings and head, 36 layers of projections and norms
        n8 = 2 * (size_t)151936 * 4096 + 4096 +
             36 * ((size_t)4096 * (4096 + 2 * 1024) + (size_t)4096 * 4096 + 3 * (size_t)4096 * 12288 +
                   2 * 4096 + 2 * 128);
        const size_t train8 = cuda_run_host_bytes(&opt8);
        EXPECT(train8 == 12 * n8 + (4 + 2) * 2 * CUDA_OFFLOAD_CHUNK && train8 < 100 * gib,
               "Qwen3-8B, the optimizer offloaded: train needs %.1f GiB of host memory (%zu "
               "parameters)", train8 / (double)gib, n8);
    }

    const ModelConfig big = config(8192, 64, 8, 28672, 80, 128256);  // a 70B shape
    const CudaMemoryRequest model = {&big, 1, 1024, MODEL_RECOMPUTE_MLP, NULL, NULL, false, false};
    EXPECT(cuda_memory_check(&model, 139 * gib, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, "model.hidden_size") && strstr(err, "lower the model's size"),
           "a 70B model: refused naming the model keys (%s)", err);
    const CudaMemoryRequest over = {&tiny, 65536, 1 << 20, MODEL_RECOMPUTE_MLP, NULL, NULL, false, false};
    EXPECT(cuda_memory_check(&over, 140 * gib, 140 * gib, NULL, err, sizeof err) == -1 &&
               strstr(err, "65536 x 1048576") && strstr(err, "train.micro_rows"),
           "2^36 tokens per micro-batch: refused (%s)", err);

    // LoRA: the frozen base in bf16 (2 bytes a parameter), the adapters' full state (16
    // bytes each, counted here from the shapes: r x (in + out) per target per layer), and
    // two [tokens, 3 r] bf16 scratch buffers (q|k|v's three adapters work in them at once);
    // the arena unchanged.
    const LoraConfig lora = {.r = 8, .alpha = 16, .target = {1, 1, 1, 1, 1, 1, 1}};
    const CudaMemoryRequest full_tiny = {&tiny, 1, 128, MODEL_RECOMPUTE_MLP, NULL, NULL, false, false};
    const CudaMemoryRequest lora_tiny = {&tiny, 1, 128, MODEL_RECOMPUTE_MLP, NULL, &lora, false, false};
    const CudaMemoryEstimate ef = cuda_memory_request_estimate(&full_tiny),
                             el = cuda_memory_request_estimate(&lora_tiny);
    // hidden 64, F 128, one head of 64: q k v o 8 x (64 + 64) each, gate up 8 x (64 + 128),
    // down 8 x (128 + 64).
    const size_t adapters = 4 * 8 * 128 + 3 * 8 * 192;
    EXPECT(el.state == 2 * n + 16 * adapters + 8 && el.arena == ef.arena &&
               el.scratch == ef.scratch + 2 * 2 * 128 * (3 * 8) &&
               el.total == el.state + el.arena + el.scratch,
           "lora state %zu (by hand %zu), scratch %zu", el.state, 2 * n + 16 * adapters + 8,
           el.scratch);
    // The scratch's width is the largest group's: o and down alone, 1 x r; gate and up, 2 x r.
    const LoraConfig o_down = {.r = 8, .alpha = 16, .target = {0, 0, 0, 1, 0, 0, 1}},
                     gate_up = {.r = 8, .alpha = 16, .target = {0, 0, 0, 0, 1, 1, 0}};
    CudaMemoryRequest narrow = lora_tiny;
    narrow.lora = &o_down;
    const size_t scratch_o_down = cuda_memory_request_estimate(&narrow).scratch;
    narrow.lora = &gate_up;
    const size_t scratch_gate_up = cuda_memory_request_estimate(&narrow).scratch;
    EXPECT(scratch_o_down == ef.scratch + 2 * 2 * 128 * 8 &&
               scratch_gate_up == ef.scratch + 2 * 2 * 128 * (2 * 8),
           "LoRA scratch: o and down %zu, gate and up %zu (full %zu)", scratch_o_down,
           scratch_gate_up, ef.scratch);
    // Its host memory: the base's fp32 weights and the adapters' full state; with the
    // layer inputs offloaded their pinned copies too; without LoRA the state's 12-byte copy.
    CudaMemoryRequest lora_inputs = lora_tiny;
    lora_inputs.recompute = MODEL_RECOMPUTE_LAYER;
    lora_inputs.offload_activations = true;
    EXPECT(cuda_run_host_bytes(&lora_tiny) == 4 * n + 16 * adapters &&
               lora_host_state_bytes(&tiny, &lora) == 4 * n + 16 * adapters &&
               cuda_run_host_bytes(&lora_inputs) ==
                   4 * n + 16 * adapters + cuda_activations_host_bytes(&lora_inputs) &&
               cuda_run_host_bytes(&full_tiny) == 12 * n,
           "run host bytes: LoRA %zu (by hand %zu), with offloaded inputs %zu, full %zu",
           cuda_run_host_bytes(&lora_tiny), 4 * n + 16 * adapters,
           cuda_run_host_bytes(&lora_inputs), cuda_run_host_bytes(&full_tiny));
    // Qwen3-8B, r 16 on every projection, one row of 32768 with recompute layer: the state
    // is about 2 bytes a parameter, under a quarter of a full fine-tune's.
    ModelConfig qwen8 = config(4096, 32, 8, 12288, 36, 151936);
    qwen8.head_dim = 128, qwen8.qk_norm = true, qwen8.tie_word_embeddings = false;
    const LoraConfig r16 = {.r = 16, .alpha = 32, .target = {1, 1, 1, 1, 1, 1, 1}};
    const CudaMemoryRequest q8_full = {&qwen8, 1, 32768, MODEL_RECOMPUTE_LAYER, NULL, NULL, false, false};
    const CudaMemoryRequest q8_lora = {&qwen8, 1, 32768, MODEL_RECOMPUTE_LAYER, NULL, &r16, false, false};
    const CudaMemoryEstimate f8 = cuda_memory_request_estimate(&q8_full),
                             l8 = cuda_memory_request_estimate(&q8_lora);
    EXPECT(l8.state * 4 < f8.state && l8.total < 139 * gib,
           "Qwen3-8B LoRA r 16 at 32768: state %.2f GiB (full %.2f), total %.2f GiB",
           l8.state / (double)gib, f8.state / (double)gib, l8.total / (double)gib);
    printf("Qwen3-8B LoRA r 16, 1 x 32768, recompute layer: %.2f GiB (state %.2f, arena %.2f); "
           "full fine-tuning %.2f GiB\n", l8.total / (double)gib, l8.state / (double)gib,
           l8.arena / (double)gib, f8.total / (double)gib);
    return test_finish();
}
