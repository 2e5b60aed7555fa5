// Benchmark (not a test) of batched greedy-like KV-cache decoding on the GPU
// (model/decode_cuda.h): B sequences get a prompt of P random tokens (one prefill call),
// then G steps of one token each, the next token being the argmax of the previous
// step's logits on the host (what a greedy generation loop does through this interface,
// logits copied back included). Weights are random bf16 (throughput does not depend on
// their values). Prints one JSON line per run: prefill and decode tokens/s.
// Usage: bench_decode                       a sweep of both shapes
//        bench_decode 10m|tinyllama B P G   one run
// Shapes: "10m" (9.8M parameters: V 512 as the synthetic tokenizer, hidden 384, 6 layers,
// 6 heads of 64, 2 KV heads, intermediate 1024) and "tinyllama" (configs/bench_tinyllama.json:
// 1.1B, 32 heads of 64, 4 KV heads).
#include "model/decode_cuda.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <vector>
#include "common/cuda_check.h"
#include "model/ops_cuda.h"

static ModelConfig shape_config(const char *name) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    if (strcmp(name, "10m") == 0) {
        c.vocab_size = 512, c.hidden_size = 384, c.intermediate_size = 1024;
        c.num_hidden_layers = 6, c.num_attention_heads = 6, c.num_key_value_heads = 2;
    } else if (strcmp(name, "tinyllama") == 0) {
        c.vocab_size = 32000, c.hidden_size = 2048, c.intermediate_size = 5632;
        c.num_hidden_layers = 22, c.num_attention_heads = 32, c.num_key_value_heads = 4;
    } else {
        fatal("bench_decode: unknown shape \"%s\" (10m or tinyllama)", name);
    }
    return c;
}

// Uniform values in [-0.05, 0.05) from a hash of the index (no host copy of the weights).
__global__ void fill_random_kernel(__nv_bfloat16 *p, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ULL;
        x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ULL, x ^= x >> 29;
        p[i] = __float2bfloat16_rn(((float)(x >> 40) / (float)(1 << 24) - 0.5f) * 0.1f);
    }
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int32_t argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// Prefill B prompts of P tokens (calls of whole prompts, about PREFILL_CALL_TOKENS tokens
// each: the logits of every prompt token come back), then G single-token steps.
enum { PREFILL_CALL_TOKENS = 2048 };
static void run(CudaDecoder *dec, const void *params, const ModelConfig *cfg, int B, int P,
                int G, double *prefill_s, double *decode_s) {
    const int V = cfg->vocab_size;
    for (int b = 0; b < B; b++) cuda_decoder_reset(dec, b);
    std::vector<int32_t> slot((size_t)B * P), token((size_t)B * P), pos((size_t)B * P);
    uint64_t state = 0x2545F4914F6CDD1DULL;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < P; i++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            const size_t at = (size_t)b * P + i;
            slot[at] = b, token[at] = (int32_t)(state % (uint64_t)V), pos[at] = i;
        }
    const int prompts_per_call = P < PREFILL_CALL_TOKENS ? PREFILL_CALL_TOKENS / P : 1;
    const int rows = prompts_per_call * P > B ? prompts_per_call * P : B;
    std::vector<float> logits((size_t)rows * V);
    std::vector<int32_t> step_slot(B), step_token(B), step_pos(B);
    double t0 = now_s();
    for (int b0 = 0; b0 < B; b0 += prompts_per_call) {
        const int n_prompts = B - b0 < prompts_per_call ? B - b0 : prompts_per_call;
        const size_t at = (size_t)b0 * P;
        cuda_decoder_forward(dec, params, n_prompts * P, slot.data() + at, token.data() + at,
                             pos.data() + at, logits.data());
        for (int b = 0; b < n_prompts; b++)
            step_token[b0 + b] = argmax(logits.data() + ((size_t)b * P + P - 1) * V, V);
    }
    *prefill_s = now_s() - t0;
    for (int b = 0; b < B; b++) step_slot[b] = b;
    t0 = now_s();
    for (int g = 0; g < G; g++) {
        for (int b = 0; b < B; b++) step_pos[b] = P + g;
        cuda_decoder_forward(dec, params, B, step_slot.data(), step_token.data(), step_pos.data(),
                             logits.data());
        for (int b = 0; b < B; b++) step_token[b] = argmax(logits.data() + (size_t)b * V, V);
    }
    *decode_s = now_s() - t0;
}

static void bench(const char *name, int B, int P, int G) {
    const ModelConfig cfg = shape_config(name);
    ParamTable table;
    param_table_build(&cfg, &table);
    __nv_bfloat16 *params;
    cudaCheck(cudaMalloc(&params, table.total * sizeof(__nv_bfloat16)));
    fill_random_kernel<<<1024, 256>>>(params, table.total);
    cudaCheckLaunch();
    cudaCheck(cudaDeviceSynchronize());
    CudaDecoder *dec = cuda_decoder_create(&cfg, B, P + G);
    double prefill_s, decode_s;
    run(dec, params, &cfg, B, P, G < 4 ? G : 4, &prefill_s, &decode_s);  // warm-up: plans
    run(dec, params, &cfg, B, P, G, &prefill_s, &decode_s);
    printf("{\"shape\": \"%s\", \"params\": %zu, \"batch\": %d, \"prompt\": %d, \"new_tokens\": %d, "
           "\"prefill_s\": %.4f, \"prefill_tokens_per_s\": %.0f, \"decode_s\": %.4f, "
           "\"decode_ms_per_step\": %.3f, \"decode_tokens_per_s\": %.0f, \"cache_mib\": %.1f}\n",
           name, table.total, B, P, G, prefill_s, B * (double)P / prefill_s, decode_s,
           1e3 * decode_s / G, B * (double)G / decode_s, cuda_decoder_cache_bytes(dec) / 1048576.0);
    fflush(stdout);
    cuda_decoder_free(dec);
    cudaCheck(cudaFree(params));
    param_table_free(&table);
}

int main(int argc, char **argv) {
    int n_devices = 0;
    if (cudaGetDeviceCount(&n_devices) != cudaSuccess || n_devices == 0) {
        printf("SKIP: no CUDA device\n");
        return EXIT_SKIP;
    }
    ops_cuda_init(1024, 8192);
    if (argc == 5) {
        bench(argv[1], atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    } else if (argc == 1) {
        const int small_batches[] = {1, 32, 200};
        for (int B : small_batches) bench("10m", B, 256, 256);
        const int big_batches[] = {1, 16, 64};
        for (int B : big_batches) bench("tinyllama", B, 512, 128);
    } else {
        fatal("usage: bench_decode [10m|tinyllama BATCH PROMPT NEW_TOKENS]");
    }
    ops_cuda_destroy();
    return 0;
}
