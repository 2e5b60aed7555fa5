// The device-memory estimate (trainer/device_memory.h) against what the CUDA model
// really allocates: for several shapes (MHA and GQA, head dims 64 and 128, tied and
// untied, q/k norms, a loss chunk smaller and larger than the micro-batch, more layers
// than train.offload_activations' ring) and every train.recompute mode (mlp, none, layer,
// and layer with train.offload_activations), the estimated arena, with the attention
// workspace the backend passes it, is cuda_model_arena_bytes to the byte:
// cuda_model_create(_offload) allocates the layout the estimate sizes
// (model/model_arena.h), with the same attention workspace.
#include "common/check.h"
#include "model/model_cuda.h"
#include "model/ops_cuda.h"
#include "trainer/backend_cuda.h"
extern "C" {  // a plain C header
#include "trainer/device_memory.h"
}
#include "tests/test_util.h"

int main(void) {
    char device[256];
    if (cuda_device_count(device, sizeof device) == 0) {
        printf("SKIP: no CUDA device\n");
        return EXIT_SKIP;
    }
    struct {
        int hidden, heads, kv, inter, layers, vocab, rows, seq;
        bool tied, qk_norm;
    } shapes[] = {
        {64, 1, 1, 128, 1, 256, 1, 128, true, false},
        {128, 2, 1, 384, 2, 1000, 2, 1024, true, false},
        {256, 2, 2, 512, 3, 151936, 4, 1000, false, false},  // chunk (1728 rows) < 4000 tokens
        {512, 4, 1, 1408, 2, 151936, 1, 4096, false, false},  // head_dim 128, GQA 4
        {256, 4, 2, 768, 2, 5000, 2, 512, true, true},        // Qwen3's q_norm / k_norm
        {128, 2, 1, 384, 6, 1000, 2, 1024, true, false},      // 3 layer inputs offloaded
        {256, 4, 2, 768, 5, 5000, 1, 2048, true, true},       // Qwen3's norms, 2 offloaded
    };
    for (const auto &s : shapes) {
        ModelConfig mc = {};
        mc.hidden_size = s.hidden;
        mc.intermediate_size = s.inter;
        mc.num_hidden_layers = s.layers;
        mc.num_attention_heads = s.heads;
        mc.num_key_value_heads = s.kv;
        mc.vocab_size = s.vocab;
        mc.rms_norm_eps = 1e-5f;
        mc.rope_theta = 10000.0f;
        mc.tie_word_embeddings = s.tied;
        mc.qk_norm = s.qk_norm;
        ops_cuda_init(s.rows * s.seq, s.hidden);
        for (int i = 0; i < 4; i++) {
            const ModelRecompute mode = i == 0   ? MODEL_RECOMPUTE_MLP
                                        : i == 1 ? MODEL_RECOMPUTE_NONE
                                                 : MODEL_RECOMPUTE_LAYER;
            const bool offload = i == 3;
            CudaModel *m = cuda_model_create_offload(&mc, s.rows, s.seq, mode, offload);
            const size_t real = cuda_model_arena_bytes(m);
            // The backend's request (trainer/backend_cuda.cu), with its workspace.
            const CudaMemoryRequest r = {&mc,    s.rows, s.seq, mode, cuda_model_attention_workspace_bytes,
                                         nullptr, false, offload};
            const CudaMemoryEstimate e = cuda_memory_request_estimate(&r);
            EXPECT(e.arena == real,
                   "hidden %d, %d layers, %d x %d tokens, recompute %s%s: estimated arena %zu "
                   "bytes, allocated %zu",
                   s.hidden, s.layers, s.rows, s.seq, model_recompute_name(mode),
                   offload ? " offloaded" : "", e.arena, real);
            cuda_model_free(m);
        }
        ops_cuda_destroy();
    }
    return test_finish();
}
