// AttnMask on the GPU (mask_cuda.cu), the device side of mask.h: a device copy of a host
// mask's lists, or the same lists built on the device, with the device intervals they
// reference. The attention kernels (attention_cuda.h) take such a mask.
#pragma once
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {  // the C header below carries no guards of its own
#endif
#include "attention/mask.h"

// Device copy of a host mask's lists (synchronous) over device intervals lo_dev/hi_dev
// ([n_rows, seq_len], the same values as host->lo/hi). Free with attn_mask_free_device.
AttnMask attn_mask_upload(const AttnMask *host, const int32_t *lo_dev, const int32_t *hi_dev);
// Builds the same mask as attn_mask_build, on the GPU, from device lo/hi ([n_rows,
// seq_len], referenced by the result); its storage is device memory.
void attn_mask_build_cuda(const int32_t *lo, const int32_t *hi, int n_rows, int seq_len,
                          int block_m, int block_n, AttnMask *out, cudaStream_t stream);
void attn_mask_free_device(AttnMask *m);

#ifdef __cplusplus
}
#endif
