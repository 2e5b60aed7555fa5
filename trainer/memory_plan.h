// `train memory`: what a CUDA run of a config needs on the GPU and on the host in each
// memory mode (train.recompute, train.offload_activations, train.offload_optimizer), from
// the estimates the CUDA backend refuses by (trainer/device_memory.h), on any machine:
// a run is planned before a GPU is rented.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include "trainer/device_memory.h"

enum { MEMORY_PLAN_MODES = 7 };

typedef struct {
    ModelRecompute recompute;
    bool offload_optimizer, offload_activations;
    CudaMemoryEstimate device;
    size_t host_pinned;  // cuda_host_pinned_bytes
    size_t host_total;   // cuda_run_host_bytes
} MemoryPlanRow;

// The request r in every mode, its own settings replaced: recompute none, mlp, layer;
// layer with the offloaded activations; then for full fine-tuning (r->lora NULL: LoRA
// and the offloaded optimizer are not combined) the offloaded optimizer with mlp, with
// layer, and with layer and the offloaded activations. Returns the count.
int memory_plan_rows(const CudaMemoryRequest *r, MemoryPlanRow rows[MEMORY_PLAN_MODES]);

// The rows as a table: the GPU's share (state, activations, scratch, total) and the
// host's (pinned, total) in GiB, whether each fits gpu_bytes and host_bytes, the
// request's own mode marked; then the smallest-memory mode that fits both, or what
// decides that none does.
void memory_plan_print(FILE *out, const CudaMemoryRequest *r, size_t gpu_bytes,
                       size_t host_bytes);
