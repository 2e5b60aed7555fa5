// A model batch on the device: the host ModelBatch (model.h) uploaded into buffers carved
// from the CUDA model's arena, with its target slots listed for the loss head. Internal
// to model/model_cuda.cu.
#pragma once
#include <cuda_runtime_api.h>
#include "model/arena_cuda.cuh"
extern "C" {  // model.h is a plain C header without guards of its own
#include "model/model.h"
}

// T = max_rows * seq_len token slots.
typedef struct {
    int max_rows, seq_len;
    int32_t *token, *pos, *lo, *hi;  // [T] device
    int32_t *target_slots;  // [T] device: slots (row * seq_len + position) with a target, ascending
    int32_t *slot_targets;  // [T] device: the target of each of those slots
    int32_t *mask_storage;  // [attn_mask_storage_count for max_rows] device tile lists
    AttnMask mask;          // the uploaded batch's mask: lo, hi and mask_storage above
    int32_t *host_slots, *host_targets;  // [T] host staging of target_slots / slot_targets
    int n_targets;          // of the uploaded batch
} DeviceBatch;

// Points the device buffers into the arena at base, where the layout places them.
void device_batch_place(DeviceBatch *d, void *base, const CudaBatchLayout *l, int max_rows,
                        int seq_len);
void device_batch_host_alloc(DeviceBatch *d);
void device_batch_host_free(DeviceBatch *d);
// Checks the batch against the model (model_batch_check) and uploads it on `stream`; the
// mask must have ATTN_TILE tiles. Returns the batch's number of targets.
int device_batch_upload(DeviceBatch *d, const ModelBatch *b, const ModelConfig *cfg,
                        cudaStream_t stream);
