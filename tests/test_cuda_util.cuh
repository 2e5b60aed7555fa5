// For the GPU tests: whether a CUDA device is visible (else the test prints a visible SKIP
// and exits with EXIT_SKIP, which CTest reports as skipped, never as passed).
#pragma once
#include <cstdio>
#include <cuda_runtime.h>
#include "tests/test_util.h"

#define SKIP_WITHOUT_CUDA_DEVICE()                                                        \
    do {                                                                                  \
        int n_devices_ = 0;                                                               \
        if (cudaGetDeviceCount(&n_devices_) != cudaSuccess || n_devices_ == 0) {          \
            printf("SKIP: no CUDA device\n");                                             \
            return EXIT_SKIP;                                                             \
        }                                                                                 \
    } while (0)
