// The device copy of a model batch (model/batch_cuda.cuh).
#include "model/batch_cuda.cuh"

#include <stdlib.h>
#include "common/cuda_check.h"

void device_batch_place(DeviceBatch *d, void *base, const CudaBatchLayout *l, int max_rows,
                        int seq_len) {
    d->max_rows = max_rows;
    d->seq_len = seq_len;
    d->token = arena_at<int32_t>(base, l->token);
    d->pos = arena_at<int32_t>(base, l->pos);
    d->lo = arena_at<int32_t>(base, l->lo);
    d->hi = arena_at<int32_t>(base, l->hi);
    d->target_slots = arena_at<int32_t>(base, l->target_slots);
    d->slot_targets = arena_at<int32_t>(base, l->slot_targets);
    d->mask_storage = arena_at<int32_t>(base, l->mask_storage);
}

void device_batch_host_alloc(DeviceBatch *d) {
    const size_t T = (size_t)d->max_rows * d->seq_len;
    d->host_slots = (int32_t *)xmalloc(T * sizeof(int32_t));
    d->host_targets = (int32_t *)xmalloc(T * sizeof(int32_t));
}

void device_batch_host_free(DeviceBatch *d) {
    free(d->host_slots);
    free(d->host_targets);
}

// Lists the batch's target slots into host_slots / host_targets; returns their number.
static int collect_targets(DeviceBatch *d, const ModelBatch *b) {
    const int T = b->n_rows * b->seq_len;
    int n_targets = 0;
    for (int n = 0; n < T; n++) {
        if (b->target[n] >= 0) {
            d->host_slots[n_targets] = n;
            d->host_targets[n_targets++] = b->target[n];
        }
    }
    return n_targets;
}

// Points the device mask at the uploaded intervals and copies the tile lists.
static void upload_mask(DeviceBatch *d, const ModelBatch *b, cudaStream_t stream) {
    const AttnMask *host = b->mask;
    CHECK(host->block_m == ATTN_TILE && host->block_n == ATTN_TILE,
          "cuda model: the batch's mask has %dx%d tiles, the kernels need %dx%d (ATTN_TILE)",
          host->block_m, host->block_n, ATTN_TILE, ATTN_TILE);
    d->mask = attn_mask_view(b->n_rows, b->seq_len, host->block_m, host->block_n, d->lo, d->hi,
                             d->mask_storage);
    cudaCheck(cudaMemcpyAsync(d->mask_storage, host->storage,
                              attn_mask_storage_count(b->n_rows, b->seq_len, host->block_m,
                                                      host->block_n) * sizeof(int32_t),
                              cudaMemcpyHostToDevice, stream));
}

int device_batch_upload(DeviceBatch *d, const ModelBatch *b, const ModelConfig *cfg,
                        cudaStream_t stream) {
    model_batch_check(b, cfg, d->max_rows, d->seq_len);
    d->n_targets = collect_targets(d, b);
    const size_t T = (size_t)b->n_rows * b->seq_len;
    const struct { int32_t *dst; const int32_t *src; size_t n; } copies[] = {
        {d->token, b->token, T}, {d->pos, b->pos, T}, {d->lo, b->mask->lo, T},
        {d->hi, b->mask->hi, T}, {d->target_slots, d->host_slots, (size_t)d->n_targets},
        {d->slot_targets, d->host_targets, (size_t)d->n_targets},
    };
    for (size_t i = 0; i < sizeof(copies) / sizeof(copies[0]); i++)
        if (copies[i].n)
            cudaCheck(cudaMemcpyAsync(copies[i].dst, copies[i].src, copies[i].n * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
    upload_mask(d, b, stream);
    return d->n_targets;
}
