// The CUDA training backend (trainer/backend_cuda.cu), callable from C without CUDA
// headers. Only in binaries built with CUDA (ONEPASS_HAVE_CUDA).
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {  // backend.h is a plain C header without guards of its own
#endif
#include "trainer/backend.h"

// Visible CUDA devices (0 when the driver or the runtime finds none); the first one's
// name into name[name_len] when there is one.
int cuda_device_count(char *name, size_t name_len);

// The CUDA implementation of TrainBackendOps: bf16 weights and activations, fp32
// master weights (split: the bf16 weights and 16-bit low halves), gradients and AdamW
// moments on the device.
const TrainBackendOps *cuda_train_backend(void);

#ifdef __cplusplus
}
#endif
