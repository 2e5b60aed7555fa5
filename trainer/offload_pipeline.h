// The offloaded optimizer's schedule (train.offload_optimizer; docs/DESIGN.md, the
// offloaded optimizer): one worker thread runs an update over n chunks, in order, so
// that the caller's thread goes on (the next forward) while it runs. Per chunk c: its
// gradients come down into ring slot c % slots, the update runs on them, the chunk
// after next comes down into the slot it freed, and the chunk's weights go up. What
// moves the data is the caller's (OffloadStages): the CUDA backend's copies, or a
// test's fake ones.
//
// Invariants (the stages may rely on them):
//  - one update at a time: offload_pipeline_start is refused while one runs;
//  - within an update, every stage runs on the worker thread, chunks in increasing
//    order: download(c) is called before wait_download(c), which is called before
//    update(c), which is called before upload(c);
//  - download(c + slots) into slot c % slots is called only after update(c) returned
//    (the slot's last reader);
//  - offload_pipeline_wait_uploaded(p, k) returns only after upload(c) returned for
//    every c < k of the running update;
//  - what the caller wrote before offload_pipeline_start is visible to the stages, and
//    what the stages wrote is visible to the caller once offload_pipeline_wait_uploaded
//    or offload_pipeline_finish returned (a mutex orders them);
//  - once offload_pipeline_finish returned, no stage runs until the next start.
#pragma once
#include <stdbool.h>

typedef struct {
    void *ctx;
    // Queues chunk c's gradients down into ring slot `slot`; may return before they land.
    void (*download)(void *ctx, int chunk, int slot);
    // Blocks until what download(chunk) queued has landed.
    void (*wait_download)(void *ctx, int chunk);
    // The update of chunk c from ring slot `slot`; returns whether every weight it
    // wrote is finite.
    bool (*update)(void *ctx, int chunk, int slot);
    // Queues chunk c's weights up; may return before they land (the caller orders its
    // readers after them: the CUDA backend records an event).
    void (*upload)(void *ctx, int chunk);
    // Called on the worker thread before its first stage (NULL: none); the CUDA backend
    // selects its device there.
    void (*thread_init)(void *ctx);
} OffloadStages;

typedef struct OffloadPipeline OffloadPipeline;

// A pipeline of n_chunks >= 1 chunks over a ring of slots >= 1, and its worker thread.
// The update's OpenMP team is the process's (omp_get_max_threads at create) less one
// thread when it has more than two: the caller's thread, which queues the GPU's work
// and waits for it, keeps a core.
OffloadPipeline *offload_pipeline_create(int n_chunks, int slots, const OffloadStages *stages);
// Starts an update on the worker thread and returns at once; fatal while one runs.
void offload_pipeline_start(OffloadPipeline *p);
// Blocks until chunks [0, k) of the running update are uploaded (returns at once
// without a running update). Returns whether every chunk updated so far is finite.
bool offload_pipeline_wait_uploaded(OffloadPipeline *p, int k);
// Whether an update was started and offload_pipeline_finish has not yet returned for it.
bool offload_pipeline_running(OffloadPipeline *p);
// Blocks until the running update has finished (every chunk uploaded) and returns
// whether all its weights are finite; true without a running update.
bool offload_pipeline_finish(OffloadPipeline *p);
// Finishes a running update, stops the worker thread and frees the pipeline.
void offload_pipeline_destroy(OffloadPipeline *p);
