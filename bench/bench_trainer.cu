// Benchmark (not a test) of one full CUDA training step through the trainer's CUDA
// backend (trainer/backend_cuda.cu, the code `train` runs): forward + backward, global
// gradient norm, clipped AdamW on the fp32 master weights (split: the bf16 weights and their
// low halves, trainer/split_float.h). The workload is
// bench/anchors/trainer.py's, so the numbers compare directly with the
// PyTorch + FlexAttention anchor:
//   - one packed row of seq_len tokens per step, random tokens and targets at every
//     position, positions 0..S-1;
//   - the strip-thinking mask of 4 turns (user 1/8, think 5/8, answer 2/8 of each
//     turn; later turns do not see earlier thinking), translated to one visible
//     interval per key: lo[k] = k, hi[k] = end of k's turn for think keys, else S;
//   - the model of the config: model.* keys (configs/bench_small.json, untied head) or
//     model.init_from's config.json (configs/bench_qwen3_0.6b.json: head_dim 128 with
//     q_norm/k_norm, tied; configs/bench_qwen2.5_1.5b.json: q/k/v biases, tied), random
//     weights either way (params_init); AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.01 on every
//     tensor (torch.optim.AdamW defaults as the anchor uses them), plus clipping.
// Usage: bench_trainer --config configs/bench_small.json [--set key=value]... [steps]
// Accumulation: `--set train.tokens_per_step=N` above data.seq_len runs N / seq_len copies of
// the row (a multiple) as micro-batches before each optimizer step, as `train` does with
// several rows a step (the offloaded optimizer's host update is paid once per step).
// (bench/run_gpu.sh hf runs the Qwen presets beside the extended anchor)
// Host clock around each step (every phase ends synchronised); warm-up, then the median
// of >= 20 steps. MFU uses the
// anchor's FLOP formula 6 (params - vocab d) S + 3.5 * 4 S^2 hd H L density, with
// density = non-empty fraction of 128x128 tiles (FlexAttention's BlockMask blocks) and
// hd the head dim; a tied head's matrix is counted once in params and is a matmul, so
// nothing is subtracted then.
// Memory: device memory taken from the first allocation to the end (cudaMemGetInfo,
// with the stream-ordered pool told to keep its peak), excluding the CUDA context.
// LoRA: `--set lora.r=16` (and the other lora.* keys) trains adapters on the frozen base
// (BackendSetup.lora) instead: the same step, the base without weight gradients; its MFU
// counts 4 (params - vocab d) S for the matmuls (forward and input gradients; the
// adapters' own products left out).
#include "trainer/backend_cuda.h"
extern "C" {  // plain C headers without guards of their own
#include "trainer/config.h"
#include "trainer/device_memory.h"
#include "trainer/run.h"
#include "trainer/setup.h"
#include "trainer/step.h"
}
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "common/cuda_check.h"

enum { WARMUP_STEPS = 3, DEFAULT_STEPS = 20, N_TURNS = 4 };
static const double GIB = 1024.0 * 1024.0 * 1024.0;
// The anchor's MFU denominator in TFLOP/s (the bf16 matrix rate measured on the H200).
static const double ANCHOR_PEAK_TFLOPS = 790.0;

// bench/anchors/trainer.py's row: tags -> one visible interval per key.
static void strip_thinking_row(int S, int vocab, std::vector<int32_t> &token,
                               std::vector<int32_t> &target, std::vector<int32_t> &pos,
                               std::vector<int32_t> &lo, std::vector<int32_t> &hi) {
    const int turn_len = S / N_TURNS;
    if (turn_len < 8) fatal("bench_trainer: data.seq_len %d is too short for %d turns", S, N_TURNS);
    uint64_t state = 0x2545F4914F6CDD1DULL;
    auto next = [&state]() {  // xorshift64
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        return state;
    };
    for (int k = 0; k < S; k++) {
        const int turn = k / turn_len, within = k % turn_len;
        const bool think = within >= turn_len / 8 && within < 6 * turn_len / 8;
        token[k] = (int32_t)(next() % (uint64_t)vocab);
        target[k] = (int32_t)(next() % (uint64_t)vocab);
        pos[k] = k;
        lo[k] = k;
        hi[k] = think ? std::min((turn + 1) * turn_len, S) : S;
    }
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    const char *config_path = nullptr;
    char **overrides = nullptr;
    int n_overrides = 0;
    const int rest = config_take_args(argc - 1, argv + 1, &config_path, &overrides, &n_overrides);
    if (rest > 1 || !config_path)
        fatal("usage: bench_trainer --config FILE [--set key=value]... [steps]");
    const int steps = rest == 1 ? atoi(argv[1]) : DEFAULT_STEPS;
    if (steps < 1) fatal("bench_trainer: steps must be positive, got '%s'", argv[1]);
    RunConfig *config = config_load(config_path, n_overrides, overrides);
    free(overrides);

    int n_devices = 0;
    if (cudaGetDeviceCount(&n_devices) != cudaSuccess || n_devices == 0) {
        printf("SKIP: no CUDA device\n");
        return EXIT_SKIP;
    }
    const ModelConfig cfg = model_config_from(config);
    const long long seq_len_key = config->data.seq_len;
    if (seq_len_key <= 0 || seq_len_key > (1 << 24))
        fatal("config key 'data.seq_len': %lld is out of range", seq_len_key);
    const int S = (int)seq_len_key;
    // The run's own settings, as `train run` reads them for the CUDA backend.
    const RunSettings settings = run_settings_from(config, BACKEND_CUDA);
    const bool deterministic = settings.deterministic;
    const ModelRecompute recompute = settings.recompute;
    // The anchor's MFU denominator (its mfu_vs_790) unless train.peak_tflops sets one.
    const double peak_tflops =
        settings.peak_from_datasheet ? ANCHOR_PEAK_TFLOPS : settings.peak_flops / 1e12;

    // Everything from here on counts as the step's memory (the context is not ours).
    cudaCheck(cudaFree(nullptr));
    size_t free_start, free_end, total_memory;
    cudaCheck(cudaMemGetInfo(&free_start, &total_memory));

    ParamTable table;
    param_table_build(&cfg, &table);
    const size_t P = table.total;
    LoraConfig lora;
    const bool lora_on = lora_config_from(config, &lora);
    const TrainBackendOps *gpu = cuda_train_backend();
    // As `train` does: where the backend updates the host state in place it is pinned
    // and handed over (no second copy on the host).
    const bool state_pinned = run_state_handed_over(BACKEND_CUDA, &settings, lora_on);
    float *host_params = state_pinned ? (float *)gpu->host_allocator.alloc(P * sizeof(float))
                                      : (float *)xmalloc(P * sizeof(float));
    params_init(&cfg, &table, 1, host_params);
    LoraLayout layout;
    std::vector<float> adapters;
    if (lora_on) {
        lora_layout_build(&cfg, &lora, &layout);
        adapters.resize(layout.table.total);
        lora_init(&layout, 1, adapters.data());
    }
    AdamWState opt;
    if (state_pinned)
        adamw_init_from(&opt, P, gpu->host_allocator.alloc);
    else
        adamw_init(&opt, lora_on ? layout.table.total : P);
    const BackendSetup setup = {&cfg, lora_on ? &layout.table : &table, 1, S, deterministic,
                                recompute, lora_on ? &layout : nullptr, &table,
                                host_params, settings.offload_optimizer,
                                settings.offload_activations,
                                state_pinned ? host_params : nullptr,
                                state_pinned ? opt.m : nullptr, state_pinned ? opt.v : nullptr};
    void *trainer = gpu->create(&setup);
    gpu->set_state(trainer, lora_on ? adapters.data() : host_params, &opt);
    // train.lr held constant; torch.optim.AdamW as the anchor uses it: weight decay on
    // every tensor.
    AdamWHyper hyper = settings.adamw;
    hyper.lr = (float)settings.lr;
    hyper.decay_norms = hyper.decay_embeddings = true;

    std::vector<int32_t> token(S), target(S), pos(S), lo(S), hi(S);
    strip_thinking_row(S, cfg.vocab_size, token, target, pos, lo, hi);
    const long long tokens_per_step = config->train.tokens_per_step;
    if (tokens_per_step > S && tokens_per_step % S != 0)
        fatal("config key 'train.tokens_per_step': %lld is not a multiple of data.seq_len %d",
              tokens_per_step, S);
    const int rows_per_step = tokens_per_step > S ? (int)(tokens_per_step / S) : 1;
    for (int r = 1; r < rows_per_step; r++)
        for (std::vector<int32_t> *v : {&token, &target, &pos, &lo, &hi})
            v->insert(v->end(), v->begin(), v->begin() + S);
    PackedRows rows = {rows_per_step, S, token.data(), target.data(), pos.data(), lo.data(),
                       hi.data(), nullptr, nullptr, nullptr};
    MicroBatches micro;
    micro_batches_build(&rows, 1, &micro);
    AttnMask mask_128;
    attn_mask_build(lo.data(), hi.data(), 1, S, 128, 128, &mask_128);
    const double density = 1.0 - attn_mask_sparsity(&mask_128);
    const double density_kernel = 1.0 - attn_mask_sparsity(&micro.masks[0]);

    // With train.offload_optimizer the host update runs behind the next step's forward:
    // step_ms is the steady step, fwd_bwd_ms includes the wait for the previous update,
    // optimizer_ms only its start.
    std::vector<double> step_ms, model_ms, optimizer_ms;
    double first_loss = 0.0, last_loss = 0.0;
    const double step_tokens = (double)rows_per_step * S;
    for (int step = 0; step < WARMUP_STEPS + steps; step++) {
        const double start = now_seconds();
        const double loss =
            train_step_forward_backward(gpu, trainer, &micro, (float)(1.0 / step_tokens)) /
            step_tokens;
        const double model_done = now_seconds();
        gpu->optimizer_step(trainer, &hyper, gpu->grad_norm(trainer), settings.max_grad_norm);
        cudaCheck(cudaDeviceSynchronize());
        const double end = now_seconds();
        if (!isfinite(loss)) fatal("bench_trainer: loss is %g at step %d", loss, step);
        if (step == 0) first_loss = loss;
        last_loss = loss;
        if (step < WARMUP_STEPS) continue;
        step_ms.push_back(1e3 * (end - start));
        model_ms.push_back(1e3 * (model_done - start));
        optimizer_ms.push_back(1e3 * (end - model_done));
    }
    cudaCheck(cudaMemGetInfo(&free_end, &total_memory));
    cudaMemPool_t pool;
    cudaCheck(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t pool_peak = 0;
    cudaCheck(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &pool_peak));

    const double dt = median(step_ms) / 1e3;
    const int L = cfg.num_hidden_layers, H = cfg.num_attention_heads;
    const double head_dim = model_dims(&cfg).head_dim;
    const double lookup_params =
        cfg.tie_word_embeddings ? 0.0 : (double)cfg.vocab_size * cfg.hidden_size;
    const double flops = rows_per_step * ((lora_on ? 4.0 : 6.0) * ((double)P - lookup_params) * S +
                                          3.5 * 4.0 * (double)S * S * head_dim * H * L * density);
    // Weights, gradients and AdamW state as the backend lays them out (its estimate's; the
    // attention workspace argument only sizes the arena).
    const CudaMemoryRequest request = {&cfg, 1, S, recompute, nullptr, lora_on ? &lora : nullptr,
                                       settings.offload_optimizer, settings.offload_activations};
    const double state_bytes = (double)cuda_memory_request_estimate(&request).state;
    printf("{\"config\": \"%s\", \"params_M\": %.1f, \"S\": %d, \"deterministic\": %s, "
           "\"recompute\": \"%s\", \"offload_optimizer\": %s, \"step_ms\": %.2f, \"fwd_bwd_ms\": %.2f, \"optimizer_ms\": %.2f, "
           "\"tokens_per_s\": %.0f, \"mem_GiB\": %.2f, \"mfu_vs_%.0f\": %.3f, "
           "\"density_128\": %.4f, \"density_%dx%d\": %.4f, \"weights_grads_adam_GiB\": %.2f, "
           "\"activations_and_ops_GiB\": %.2f, \"attention_pool_peak_GiB\": %.2f, "
           "\"loss_first\": %.4f, \"loss_last\": %.4f, \"steps\": %d, \"lora_r\": %d, \"rows_per_step\": %d}\n",
           config_path, P / 1e6, S, deterministic ? "true" : "false", model_recompute_name(recompute),
           settings.offload_optimizer ? "true" : "false", dt * 1e3,
           median(model_ms), median(optimizer_ms), step_tokens / dt,
           (double)(free_start - free_end) / GIB, peak_tflops, flops / dt / (peak_tflops * 1e12),
           density, ATTN_TILE, ATTN_TILE, density_kernel, state_bytes / GIB,
           ((double)(free_start - free_end) - state_bytes - (double)pool_peak) / GIB,
           pool_peak / GIB, first_loss, last_loss, steps, lora_on ? lora.r : 0, rows_per_step);

    gpu->destroy(trainer);
    micro_batches_free(&micro);
    attn_mask_free(&mask_128);
    if (state_pinned) {
        adamw_free_from(&opt, gpu->host_allocator.free);
        gpu->host_allocator.free(host_params);
    } else {
        adamw_free(&opt);
        free(host_params);
    }
    if (lora_on) lora_layout_free(&layout);
    param_table_free(&table);
    config_free(config);
    return 0;
}
