// The CPU training backend (trainer/backend_cpu.c): fp32, OpenBLAS + OpenMP, the
// reference the CUDA backend is checked against.
#pragma once
#include "trainer/backend.h"

// The CPU implementation of TrainBackendOps: fp32 weights, gradients and AdamW moments
// in host memory.
const TrainBackendOps *cpu_train_backend(void);
