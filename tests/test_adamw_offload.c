// The offloaded optimizer's host AdamW (adamw_master_range_cpu, trainer/adamw.h) against
// trainer/adamw_cpu.c's adamw_step_cpu, bit for bit, on random data: fp32 master weights
// updated in ranges that cut tensors anywhere equal adamw_step_cpu's params after
// grads *= clip_scale, the high halves each range hands out are those params' bf16
// rounding (trainer/split_float.h), m and v are the same bits; with and without weight decay of
// norms and embeddings, with clipping and without, over several steps. The clipping
// scale is checked against the CUDA kernel's formula written out here. The host-memory
// estimate and refusal of train.offload_optimizer (trainer/device_memory.h) too.
#include <math.h>
#include <string.h>

#include "common/check.h"
#include "test_util.h"
#include "trainer/adamw.h"
#include "trainer/device_memory.h"
#include "trainer/split_float.h"

// A hand-made table: an embedding, a norm, a bias and two matrices, sizes not multiples
// of anything.
static ParamTable make_table(void) {
    static ParamTensor tensors[5] = {
        {.name = "model.embed_tokens.weight", .ndim = 2, .shape = {301, 37}, .is_embedding = true},
        {.name = "model.layers.0.input_layernorm.weight", .ndim = 1, .shape = {37}, .is_norm = true},
        {.name = "model.layers.0.self_attn.q_proj.weight", .ndim = 2, .shape = {37, 37}},
        {.name = "model.layers.0.self_attn.q_proj.bias", .ndim = 1, .shape = {37}, .is_bias = true},
        {.name = "model.layers.0.mlp.up_proj.weight", .ndim = 2, .shape = {1001, 37}},
    };
    size_t offset = 0;
    for (int i = 0; i < 5; i++) {
        tensors[i].numel = (size_t)tensors[i].shape[0] * (tensors[i].ndim == 2 ? (size_t)tensors[i].shape[1] : 1);
        tensors[i].offset = offset;
        offset += tensors[i].numel;
    }
    return (ParamTable){.tensors = tensors, .n_tensors = 5, .total = offset};
}

static void test_clip_scale(void) {
    // The CUDA kernel: (float)((double)max / (norm + 1e-6)) when max > 0 and norm > max.
    EXPECT(adamw_clip_scale(2.0f, 1.0f) == (float)(1.0 / (2.0 + 1e-6)), "clip scale at norm 2");
    EXPECT(adamw_clip_scale(0.5f, 1.0f) == 1.0f && adamw_clip_scale(1.0f, 1.0f) == 1.0f,
           "no clipping at or under the maximum");
    EXPECT(adamw_clip_scale(5.0f, 0.0f) == 1.0f, "max 0: no clipping");
    EXPECT(adamw_clip_scale(NAN, 1.0f) == 1.0f, "NaN norm: no scale (the step refuses it)");
    EXPECT(adamw_clip_scale(1e30f, 0.3f) == (float)(0.3f / (1e30 + 1e-6)), "huge norm");
}

static void test_matches_adamw_step_cpu(TestRng *rng) {
    ParamTable table = make_table();
    const size_t n = table.total;
    float *p = xmalloc(n * sizeof(float)), *g = xmalloc(n * sizeof(float));
    float *scaled = xmalloc(n * sizeof(float)), *master = xmalloc(n * sizeof(float));
    uint16_t *hi = xmalloc(n * sizeof(uint16_t));
    for (int flags = 0; flags < 8; flags++) {
        AdamWHyper h = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                        .decay_norms = flags & 1, .decay_embeddings = flags & 2};
        const bool clipping = flags & 4;
        AdamWState ref, off;
        adamw_init(&ref, n);
        adamw_init(&off, n);
        for (size_t i = 0; i < n; i++) {  // magnitudes over many binades, some bf16 ties
            p[i] = test_rng_uniform(rng) * ldexpf(1.0f, test_rng_int(rng, -20, 4));
            if (test_rng_int(rng, 0, 50) == 0) {
                uint32_t b;
                memcpy(&b, &p[i], sizeof b);
                b = (b & 0xFFFF0000u) | 0x8000u;
                memcpy(&p[i], &b, sizeof b);
            }
        }
        memcpy(master, p, n * sizeof(float));
        int mismatched = 0;
        for (int t = 1; t <= 5; t++) {
            h.lr = 1e-3f * (float)test_rng_int(rng, 1, 30);
            for (size_t i = 0; i < n; i++) g[i] = test_rng_uniform(rng) * 0.1f;
            const float norm = (float)grad_global_norm_cpu(g, n);
            const float max_norm = clipping ? 0.5f * norm : 0.0f;
            const float scale = adamw_clip_scale(norm, max_norm);
            EXPECT(clipping ? scale < 1.0f : scale == 1.0f, "scale %g", scale);
            for (size_t i = 0; i < n; i++) scaled[i] = g[i] * scale;
            adamw_step_cpu(&ref, &table, &h, p, scaled);
            // Ranges cut at random places, in a random order of two halves.
            off.step++;
            const size_t cut1 = (size_t)test_rng_int(rng, 0, (int)n), cut2 = (size_t)test_rng_int(rng, 0, (int)n);
            const size_t a = cut1 < cut2 ? cut1 : cut2, b = cut1 < cut2 ? cut2 : cut1;
            memset(hi, 0xAB, n * sizeof(uint16_t));  // each range must write its own
            bool finite = adamw_master_range_cpu(&off, &table, &h, b, n, master, hi + b, g + b, scale);
            finite &= adamw_master_range_cpu(&off, &table, &h, 0, a, master, hi, g, scale);
            finite &= adamw_master_range_cpu(&off, &table, &h, a, b, master, hi + a, g + a, scale);
            EXPECT(finite, "finite weights reported finite");
            for (size_t i = 0; i < n; i++) {
                uint32_t bits;
                memcpy(&bits, &p[i], sizeof bits);
                if (memcmp(&master[i], &p[i], sizeof(float)) || hi[i] != split_float_hi(bits) ||
                    memcmp(&off.m[i], &ref.m[i], sizeof(float)) ||
                    memcmp(&off.v[i], &ref.v[i], sizeof(float))) {
                    if (mismatched++ < 3)
                        fprintf(stderr, "  step %d element %zu: %.9g vs %.9g\n", t, i, master[i], p[i]);
                }
            }
        }
        // A weight made infinite by the update is reported (and still equals the CPU's).
        const size_t at = (size_t)test_rng_int(rng, 0, (int)n - 1);
        for (size_t i = 0; i < n; i++) g[i] = 0.0f;
        g[at] = INFINITY;
        adamw_step_cpu(&ref, &table, &h, p, g);
        off.step++;
        const bool all_finite = adamw_master_range_cpu(&off, &table, &h, 0, n, master, hi, g, 1.0f);
        EXPECT(!all_finite && !isfinite(master[at]) && isfinite(master[(at + 1) % n]),
               "a non-finite update at %zu is reported", at);
        EXPECT(mismatched == 0 && off.step == ref.step,
               "flags %d: host AdamW equals adamw_step_cpu bit for bit (%d differ)", flags,
               mismatched);
        adamw_free(&ref);
        adamw_free(&off);
    }
    free(p); free(g); free(scaled); free(master); free(hi);
}

static void test_host_memory(void) {
    ModelConfig mc = {.hidden_size = 64, .intermediate_size = 128, .num_hidden_layers = 2,
                      .num_attention_heads = 2, .num_key_value_heads = 1, .vocab_size = 300,
                      .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .tie_word_embeddings = true};
    // The count written out: embedding, per layer q, k, v, o, gate, up, down and two
    // norms, the final norm (head_dim 32, one kv head).
    const size_t C = 64, I = 128, kv = 32;
    const size_t per_layer = C * C + 2 * C * kv + C * C + 3 * C * I + 2 * C;
    const size_t n = 300 * C + 2 * per_layer + C;
    // 12 bytes a parameter and the rings of gradients (fp32) and weights going up (bf16):
    // all of them for a model this small.
    const size_t host = 12 * n + 4 * n + 2 * n;
    EXPECT(cuda_offload_host_bytes(&mc) == host, "host bytes %zu, want %zu",
           cuda_offload_host_bytes(&mc), host);
    ModelConfig big = mc;  // a ring of two chunks
    big.vocab_size = 600000;
    const size_t n_big = 600000 * C + 2 * per_layer + C;
    EXPECT(cuda_offload_host_bytes(&big) == 12 * n_big + (4 + 2) * 2 * CUDA_OFFLOAD_CHUNK,
           "host bytes %zu for %zu parameters", cuda_offload_host_bytes(&big), n_big);
    char err[1024];
    EXPECT(cuda_offload_host_check(&mc, host, err, sizeof err) == 0, "fits exactly");
    EXPECT(cuda_offload_host_check(&mc, host - 1, err, sizeof err) == -1 &&
               strstr(err, "train.offload_optimizer"),
           "one byte short refused naming the key: %s", err);
    EXPECT(host_memory_available() > 0, "this machine's available memory is known");
    // The device estimate: the offloaded state is the bf16 weights, gradients, two norms.
    const CudaMemoryRequest dev = {&mc, 1, 128, MODEL_RECOMPUTE_MLP, NULL, NULL, false, false};
    const CudaMemoryRequest off = {&mc, 1, 128, MODEL_RECOMPUTE_MLP, NULL, NULL, true, false};
    const CudaMemoryEstimate ed = cuda_memory_request_estimate(&dev);
    const CudaMemoryEstimate eo = cuda_memory_request_estimate(&off);
    EXPECT(ed.state == 16 * n + 8 && eo.state == 6 * n + 8 && eo.arena == ed.arena &&
               eo.total == ed.total - 10 * n,
           "offloaded state %zu (want %zu), device %zu (want %zu)", eo.state, 6 * n + 8, ed.state,
           16 * n + 8);
    // A device that holds the offloaded run but not the other: the refusal says so.
    EXPECT(cuda_memory_check(&dev, eo.total, eo.total, NULL, err, sizeof err) == -1 &&
               strstr(err, "train.offload_optimizer=true"),
           "the refusal offers train.offload_optimizer=true: %s", err);
    EXPECT(cuda_memory_check(&off, eo.total, eo.total, NULL, err, sizeof err) == 0,
           "the offloaded request fits its own estimate");
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_clip_scale();
    test_matches_adamw_step_cpu(&rng);
    test_host_memory();
    return test_finish();
}
