// CUDA error checking: every runtime and cuBLAS call goes through these.
#pragma once
#include <cuda_runtime.h>
#include "check.h"

#define cudaCheck(call)                                                              \
    do {                                                                             \
        cudaError_t err_ = (call);                                                   \
        if (err_ != cudaSuccess)                                                     \
            fatal("CUDA error %s at %s:%d: %s", cudaGetErrorName(err_), __FILE__,    \
                  __LINE__, cudaGetErrorString(err_));                               \
    } while (0)

// After a kernel launch: catches launch-configuration errors immediately.
#define cudaCheckLaunch() cudaCheck(cudaGetLastError())
