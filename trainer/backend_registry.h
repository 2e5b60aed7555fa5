// The backend registry: which training backend (trainer/backend.h) a run gets, and its
// operations. The one place that knows every backend (trainer/backend_cpu.h, and
// trainer/backend_cuda.h in a CUDA build).
#pragma once
#include <stddef.h>
#include "model/model.h"
#include "trainer/backend.h"
#include "trainer/device_memory.h"

// "cpu" | "cuda" | "auto". Writes the one-line reason for the choice into `why`
// (e.g. "backend: cpu (no CUDA device found)"). "auto" takes cuda when this binary has
// CUDA, a device is visible and the model's head_dim suits the CUDA kernels. Fatal for an
// unknown name, or for "cuda" in a binary built without CUDA or with no device.
Backend backend_choose(const char *name, const ModelConfig *mc, char *why, size_t why_len);

const TrainBackendOps *backend_ops(Backend backend);

// The CUDA attention backward's workspace size (cuda_model_attention_workspace_bytes) in a
// CUDA build, for device-memory estimates made before any backend exists; NULL without.
AttnWorkspaceBytes backend_attention_workspace(void);
