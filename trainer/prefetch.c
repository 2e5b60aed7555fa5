// The prefetcher (trainer/prefetch.h): a CPU thread that runs the step loader ahead and
// copies each step's model inputs and masks into reusable host buffers.
#define _POSIX_C_SOURCE 200809L
#include "trainer/prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/worker_thread.h"
#include "dist/distributed.h"

PackedRows dist_rank_rows(const PackedRows *step, int rank, int world_size) {
    int first, count;
    dist_shard_rows(step->n_rows, rank, world_size, &first, &count);
    const size_t off = (size_t)first * (size_t)step->seq_len;
    PackedRows view = {.n_rows = count, .seq_len = step->seq_len};
#define VIEW_COLUMN(name, ...) view.name = step->name ? step->name + off : NULL;
    TOKEN_COLUMNS(VIEW_COLUMN)
#undef VIEW_COLUMN
    return view;
}

static size_t mask_storage_count(const AttnMask *m) {
    return attn_mask_storage_count(m->n_rows, m->seq_len, m->block_m, m->block_n);
}

// One prepared step and the host buffer that holds its arrays.
typedef struct {
    PreparedStep step;   // step.micro.masks: [masks_cap] structs, arrays in `arena`
    int masks_cap;
    int32_t *arena;      // [arena_cap] from the HostAllocator
    size_t arena_cap;
    bool failed;         // the loader failed on this step; `error` says why
    char error[1200];
} Slot;

struct Prefetcher {
    StepLoader *loader;
    int micro_rows, depth;
    int rank, world_size;  // the rows this process trains
    HostAllocator alloc;
    Slot *slots;                  // [depth]; step k lives in slots[k % depth]
    long long produced, consumed;  // steps made ready / handed back
    bool stop;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    pthread_t thread;
};

// Copies this rank's rows (mine, of the step's batch) and their masks into the slot's
// host buffer (grown as needed).
static void fill_slot(Prefetcher *p, Slot *slot, const StepBatch *batch, const PackedRows *mine,
                      const MicroBatches *mb) {
    const size_t slots = (size_t)mine->n_rows * (size_t)mine->seq_len;
    size_t need = N_MODEL_INPUT_COLUMNS * slots;
    for (int i = 0; i < mb->n_micro; i++) need += mask_storage_count(&mb->masks[i]);
    if (need > slot->arena_cap || !slot->arena) {  // a buffer even for a rank without rows
        if (slot->arena) p->alloc.free(slot->arena);
        slot->arena_cap = need + need / 2;
        slot->arena = p->alloc.alloc(slot->arena_cap * sizeof(int32_t));
    }
    if (mb->n_micro > slot->masks_cap) {
        slot->masks_cap = mb->n_micro;
        slot->step.micro.masks = xrealloc(slot->step.micro.masks, (size_t)mb->n_micro * sizeof(AttnMask));
    }
    PackedRows *rows = &slot->step.micro.rows;
    int32_t *at = packed_rows_copy_inputs(mine, rows, slot->arena);
    for (int i = 0; i < mb->n_micro; i++) {  // each mask over the slot's copy of lo/hi
        const AttnMask *from = &mb->masks[i];
        const size_t off = (size_t)i * (size_t)mb->micro_rows * (size_t)rows->seq_len;
        AttnMask *to = &slot->step.micro.masks[i];
        *to = attn_mask_view(from->n_rows, from->seq_len, from->block_m, from->block_n,
                             rows->lo + off, rows->hi + off, at);
        attn_mask_copy_lists(to, from);
        at += mask_storage_count(from);
    }
    slot->step.micro.micro_rows = mb->micro_rows;
    slot->step.micro.n_micro = mb->n_micro;
    slot->step.n_samples = batch->n_samples;
    slot->step.tokens = batch->tokens;
    slot->step.trained_tokens = batch->trained_tokens;
    slot->step.npass_tokens = batch->npass_tokens;
    packed_rows_count(mine, &slot->step.rank_tokens, &slot->step.rank_trained_tokens);
    slot->step.epoch = p->loader->epoch;
    slot->step.cursor = p->loader->cursor;
}

static void *prefetch_loop(void *arg) {
    Prefetcher *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (!p->stop && p->produced - p->consumed == p->depth)
            pthread_cond_wait(&p->changed, &p->lock);
        const bool stop = p->stop;
        Slot *slot = &p->slots[p->produced % p->depth];
        pthread_mutex_unlock(&p->lock);
        if (stop) break;

        // The slot is this thread's until `produced` moves past it.
        StepBatch batch;
        slot->failed = step_loader_try_next(p->loader, &batch, slot->error, sizeof slot->error) != 0;
        if (!slot->failed) {
            const PackedRows mine = dist_rank_rows(&batch.rows, p->rank, p->world_size);
            MicroBatches mb;
            micro_batches_build(&mine, p->micro_rows, &mb);
            fill_slot(p, slot, &batch, &mine, &mb);
            micro_batches_free(&mb);
        }
        step_batch_free(&batch);

        pthread_mutex_lock(&p->lock);
        p->produced++;
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
        if (slot->failed) break;  // the consumer reports it when it reaches this step
    }
    return NULL;
}

Prefetcher *prefetcher_start(StepLoader *loader, int micro_rows, int depth, HostAllocator alloc,
                             int rank, int world_size) {
    if (depth < 2) fatal("internal: prefetch depth %d must be at least 2", depth);
    Prefetcher *p = xcalloc(1, sizeof *p);
    *p = (Prefetcher){.loader = loader, .micro_rows = micro_rows, .depth = depth, .alloc = alloc,
                      .rank = rank, .world_size = world_size};
    p->slots = xcalloc((size_t)depth, sizeof(Slot));
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->changed, NULL);
    worker_thread_start(&p->thread, prefetch_loop, p, "the data prefetcher");
    return p;
}

const PreparedStep *prefetcher_next(Prefetcher *p) {
    pthread_mutex_lock(&p->lock);
    while (p->produced == p->consumed) pthread_cond_wait(&p->changed, &p->lock);
    Slot *slot = &p->slots[p->consumed % p->depth];
    pthread_mutex_unlock(&p->lock);
    if (slot->failed) fatal("%s", slot->error);
    return &slot->step;
}

void prefetcher_release(Prefetcher *p, const PreparedStep *step) {
    pthread_mutex_lock(&p->lock);
    if (step != &p->slots[p->consumed % p->depth].step)
        fatal("internal: prefetcher_release of a step other than the current one");
    p->consumed++;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
}

void prefetcher_stop(Prefetcher *p) {
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    for (int i = 0; i < p->depth; i++) {
        if (p->slots[i].arena) p->alloc.free(p->slots[i].arena);
        free(p->slots[i].step.micro.masks);
    }
    free(p->slots);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->changed);
    free(p);
}
