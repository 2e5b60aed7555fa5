// Prefetching: the data path of upcoming steps (trainer/loader.h) on a CPU thread, so
// laying out, packing and building masks never holds the training loop.
#pragma once
#include <stddef.h>
#include "trainer/loader.h"

// How the prefetcher allocates its host buffers (pinned memory for the GPU backend).
typedef struct {
    void *(*alloc)(size_t bytes);
    void (*free)(void *ptr);
} HostAllocator;

// One prepared step: the whole step's counts, this rank's rows (dist_rank_rows) as
// micro-batches. The rows' model inputs (token, target, pos, lo, hi) and the masks live
// in the prefetcher's host buffers; the rows' doc/turn/role arrays are NULL.
typedef struct {
    MicroBatches micro;  // this rank's rows
    int n_samples;
    long long tokens, trained_tokens;            // the step's, over all ranks
    long long npass_tokens;                      // the step's samples under npass
    long long rank_tokens, rank_trained_tokens;  // in this rank's rows (micro)
    long long epoch, cursor;  // the loader's position after this step (for checkpoints)
} PreparedStep;

// This rank's rows of a step's packed rows (dist_shard_rows' blocks): a view into step
// (nothing owned; a rank may get no row when the step has fewer rows than ranks).
PackedRows dist_rank_rows(const PackedRows *step, int rank, int world_size);

typedef struct Prefetcher Prefetcher;

// Starts a thread that runs `loader` (now owned by the thread until prefetcher_stop)
// ahead by up to `depth` >= 2 steps. The steps are exactly step_loader_next's, in order,
// and each holds rank `rank`'s rows of world_size ranks (1: all rows).
Prefetcher *prefetcher_start(StepLoader *loader, int micro_rows, int depth, HostAllocator alloc,
                             int rank, int world_size);
// The next step, in order; blocks until it is ready. Fatal with the loader's message
// when the data of this step could not be prepared. Valid until prefetcher_release.
const PreparedStep *prefetcher_next(Prefetcher *p);
// Hands the step's buffers back for reuse.
void prefetcher_release(Prefetcher *p, const PreparedStep *step);
// Stops the thread (discarding prepared steps) and frees everything.
void prefetcher_stop(Prefetcher *p);
