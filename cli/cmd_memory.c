// `train memory --config FILE [--set k=v]... [--gpu-gib N] [--host-gib N]`: the GPU and
// host memory of a CUDA run of the config in each memory mode (trainer/memory_plan.h).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "trainer/backend_registry.h"
#include "trainer/memory_plan.h"
#include "trainer/run.h"
#include "trainer/setup.h"

static const double GIB = 1024.0 * 1024.0 * 1024.0;

// A positive size in GiB for flag, or fatal naming it.
static size_t gib_value(const char *flag, const char *text) {
    char *end;
    const double v = strtod(text, &end);
    if (*end || end == text || !(v > 0.0) || v > 1e6)
        fatal("memory: %s wants a size in GiB greater than 0 (e.g. 79), got '%s'", flag, text);
    return (size_t)(v * GIB);
}

int cmd_memory(int argc, char **argv) {
    // Configuration first, so its errors come before anything else.
    RunConfig *config = config_load_args(&argc, argv);
    size_t gpu_bytes = 0, host_bytes = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--gpu-gib") == 0 && i + 1 < argc)
            gpu_bytes = gib_value("--gpu-gib", argv[++i]);
        else if (strcmp(argv[i], "--host-gib") == 0 && i + 1 < argc)
            host_bytes = gib_value("--host-gib", argv[++i]);
        else
            fatal("memory: unexpected argument '%s' (usage: train memory --config FILE "
                  "[--set key=value]... [--gpu-gib N] [--host-gib N])", argv[i]);
    }

    const ModelConfig mc = model_config_from(config);
    const RunSettings settings = run_settings_from(config, BACKEND_CUDA);
    LoraConfig lora;
    const bool lora_on = lora_config_from(config, &lora);
    const CudaMemoryRequest request = {
        .mc = &mc, .micro_rows = settings.micro_rows, .seq_len = (int)config->data.seq_len,
        .recompute = settings.recompute, .workspace = backend_attention_workspace(),
        .lora = lora_on ? &lora : NULL, .offload_optimizer = settings.offload_optimizer,
        .offload_activations = settings.offload_activations};
    char gpu_from[320];
    if (gpu_bytes) {
        snprintf(gpu_from, sizeof gpu_from, "--gpu-gib");
    } else {
        char why[512];
        size_t used, total;
        const TrainBackendOps *ops = backend_ops(backend_choose("auto", &mc, why, sizeof why));
        if (!ops->device_memory || !ops->device_memory(&used, &total))
            fatal("memory: no GPU is visible here (%s): name the GPU's memory with --gpu-gib N "
                  "(an 80 GB H100 has about 79 GiB)", why);
        gpu_bytes = total - used;
        snprintf(gpu_from, sizeof gpu_from, "free on the GPU here, of %.1f GiB", total / GIB);
    }
    const char *host_from = "--host-gib";
    if (!host_bytes) {
        host_bytes = host_memory_available();
        host_from = "available on this machine";
    }

    ParamTable table;
    param_table_build(&mc, &table);
    printf("model: %zu parameters (%d layers, hidden %d, vocab %d)%s\n", table.total,
           mc.num_hidden_layers, mc.hidden_size, mc.vocab_size, lora_on ? ", LoRA" : "");
    param_table_free(&table);
    if (lora_on) printf("lora: r %d on the frozen base (no offloaded optimizer)\n", lora.r);
    printf("micro-batch: %d x %d tokens (train.micro_rows x data.seq_len)\n", request.micro_rows,
           request.seq_len);
    printf("GPU: %.1f GiB (%s); host: %.1f GiB (%s)\n", gpu_bytes / GIB, gpu_from,
           host_bytes / GIB, host_from);
    if (!request.workspace)
        printf("note: this binary is built without CUDA: the attention backward's workspace is "
               "not counted\n");
    printf("\n");
    memory_plan_print(stdout, &request, gpu_bytes, host_bytes);
    config_free(config);
    return 0;
}
