// The memory plan of a CUDA run (trainer/memory_plan.h).
#include "trainer/memory_plan.h"

static const double GIB = 1024.0 * 1024.0 * 1024.0;

int memory_plan_rows(const CudaMemoryRequest *r, MemoryPlanRow rows[MEMORY_PLAN_MODES]) {
    static const struct {
        ModelRecompute recompute;
        bool optimizer, activations;
    } modes[MEMORY_PLAN_MODES] = {
        {MODEL_RECOMPUTE_NONE, false, false},  {MODEL_RECOMPUTE_MLP, false, false},
        {MODEL_RECOMPUTE_LAYER, false, false}, {MODEL_RECOMPUTE_LAYER, false, true},
        {MODEL_RECOMPUTE_MLP, true, false},    {MODEL_RECOMPUTE_LAYER, true, false},
        {MODEL_RECOMPUTE_LAYER, true, true},
    };
    int n = 0;
    for (int i = 0; i < MEMORY_PLAN_MODES; i++) {
        if (modes[i].optimizer && r->lora) continue;
        CudaMemoryRequest m = *r;
        m.recompute = modes[i].recompute;
        m.offload_optimizer = modes[i].optimizer;
        m.offload_activations = modes[i].activations;
        rows[n++] = (MemoryPlanRow){.recompute = m.recompute,
                                    .offload_optimizer = m.offload_optimizer,
                                    .offload_activations = m.offload_activations,
                                    .device = cuda_memory_request_estimate(&m),
                                    .host_pinned = cuda_host_pinned_bytes(&m),
                                    .host_total = cuda_run_host_bytes(&m)};
    }
    return n;
}

// "recompute=layer, offload_activations, offload_optimizer" and the like.
static void mode_name(const MemoryPlanRow *row, char *out, size_t len) {
    snprintf(out, len, "recompute=%s%s%s", model_recompute_name(row->recompute),
             row->offload_activations ? ", offload_activations" : "",
             row->offload_optimizer ? ", offload_optimizer" : "");
}

static bool is_requested(const MemoryPlanRow *row, const CudaMemoryRequest *r) {
    return row->recompute == r->recompute && row->offload_optimizer == r->offload_optimizer &&
           row->offload_activations == r->offload_activations;
}

void memory_plan_print(FILE *out, const CudaMemoryRequest *r, size_t gpu_bytes,
                       size_t host_bytes) {
    MemoryPlanRow rows[MEMORY_PLAN_MODES];
    const int n = memory_plan_rows(r, rows);
    fprintf(out, "| mode | GPU: state | activations | scratch | total | host: pinned | total | "
                 "fits %.1f GiB GPU | fits %.1f GiB host |\n", gpu_bytes / GIB, host_bytes / GIB);
    fprintf(out, "|---|---|---|---|---|---|---|---|---|\n");
    const MemoryPlanRow *best = NULL;
    for (int i = 0; i < n; i++) {
        const MemoryPlanRow *row = &rows[i];
        char name[96];
        mode_name(row, name, sizeof name);
        const bool gpu_fits = row->device.total <= gpu_bytes, host_fits = row->host_total <= host_bytes;
        fprintf(out, "| %s%s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s |\n", name,
                is_requested(row, r) ? " (the config's)" : "", row->device.state / GIB,
                row->device.arena / GIB, row->device.scratch / GIB, row->device.total / GIB,
                row->host_pinned / GIB, row->host_total / GIB, gpu_fits ? "yes" : "no",
                host_fits ? "yes" : "no");
        // The first that fits both: the rows go from the least recomputing and offloading on.
        if (gpu_fits && host_fits && !best) best = row;
    }
    if (best) {
        char name[96];
        mode_name(best, name, sizeof name);
        fprintf(out, "\nThe first mode that fits both: %s (%.2f GiB on the GPU, %.2f GiB of host "
                "memory).\n", name, best->device.total / GIB, best->host_total / GIB);
        return;
    }
    // Nothing fits: say which side decides at the mode that takes the least GPU memory.
    const MemoryPlanRow *least = &rows[0];
    for (int i = 1; i < n; i++)
        if (rows[i].device.total < least->device.total) least = &rows[i];
    char name[96];
    mode_name(least, name, sizeof name);
    fprintf(out, "\nNo mode fits: the least GPU memory, %.2f GiB (%s), needs %.2f GiB of host "
            "memory; lower train.micro_rows or data.seq_len, %s.\n", least->device.total / GIB,
            name, least->host_total / GIB,
            r->lora ? "the adapters' lora.r, or the model's size"
                    : "use LoRA (lora.r), or a smaller model");
}
