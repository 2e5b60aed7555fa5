// Optional per-stage timing of the CUDA model's steps, for profiling (environment
// ONEPASS_STAGE_TIMES=1). A stage is a scope: StageRange records a CUDA event on the
// timer's stream where the scope opens and another where it closes. After each step's
// synchronisation stage_timer_collect adds every range's time to its stage name's total
// (a name may recur: once per layer, once per chunk), and stage_timer_print_and_free
// prints the per-step means as one JSON line on stdout. Events do not block the stream,
// so the step runs as without them. The first steps (plan creation, module loading) are
// left out.
#pragma once
#include <cuda_runtime.h>

typedef struct StageTimer StageTimer;

// A timer on `stream` when ONEPASS_STAGE_TIMES=1, else NULL. Every function below takes
// NULL and then does nothing, so untimed runs pay no more than the check.
StageTimer *stage_timer_from_env(cudaStream_t stream);
// After the stream has finished a step: adds the step's ranges to the per-name totals.
void stage_timer_collect(StageTimer *t);
// Prints {"stage_ms_per_step": {"<name>": ms, ...}, "sum_ms": ms, "steps": n} (names in
// the order they first closed) and frees the timer. Call after the stream is idle.
void stage_timer_print_and_free(StageTimer *t);

// The two ends of a range; stages do not nest. `name` must outlive the timer (a string
// literal). StageRange below pairs them by scope.
void stage_timer_open(StageTimer *t, const char *name);
void stage_timer_close(StageTimer *t);

// Times its scope as stage `name`: { StageRange stage(m->timer, "fwd rope"); ... }
class StageRange {
  public:
    StageRange(StageTimer *timer, const char *name) : timer_(timer) {
        stage_timer_open(timer, name);
    }
    ~StageRange() { stage_timer_close(timer_); }
    StageRange(const StageRange &) = delete;
    StageRange &operator=(const StageRange &) = delete;

  private:
    StageTimer *timer_;
};
