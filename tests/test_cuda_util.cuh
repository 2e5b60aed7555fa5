// For the GPU tests: whether a CUDA device is visible (else the test prints a visible SKIP
// and exits with EXIT_SKIP, which CTest reports as skipped, never as passed), and host
// floats rounded to or uploaded as bf16 the way the GPU converts them.
#pragma once
#include <cstdio>
#include <cuda_runtime.h>
#include "common/cuda_check.h"
#include "model/ops_cuda.h"
#include "tests/test_util.h"

#define SKIP_WITHOUT_CUDA_DEVICE()                                                        \
    do {                                                                                  \
        int n_devices_ = 0;                                                               \
        if (cudaGetDeviceCount(&n_devices_) != cudaSuccess || n_devices_ == 0) {          \
            printf("SKIP: no CUDA device\n");                                             \
            return EXIT_SKIP;                                                             \
        }                                                                                 \
    } while (0)

// x [n] as bf16 in a new device allocation.
static inline __nv_bfloat16 *upload_bf16(const float *x, size_t n) {
    float *dev;
    __nv_bfloat16 *half;
    cudaCheck(cudaMalloc(&dev, n * sizeof(float)));
    cudaCheck(cudaMalloc(&half, n * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemcpy(dev, x, n * sizeof(float), cudaMemcpyHostToDevice));
    float_to_bf16_cuda(half, dev, (int64_t)n, 0);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaFree(dev));
    return half;
}

// x rounded to bf16 in place (round to nearest even, as the GPU converts).
static inline void round_bf16(float *x, size_t n) {
    __nv_bfloat16 *half = upload_bf16(x, n);
    float *dev;
    cudaCheck(cudaMalloc(&dev, n * sizeof(float)));
    bf16_to_float_cuda(dev, half, (int64_t)n, 0);
    cudaCheck(cudaMemcpy(x, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(dev));
    cudaCheck(cudaFree(half));
}
