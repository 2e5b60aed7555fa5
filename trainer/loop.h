// `train run` below the command line: the whole training run of a resolved Config, in
// three calls. train_run_start checks out_dir, loads the tokenizer, model, data and
// weights (a resume's checkpoint too), connects the ranks (dist/ranks.h), creates the
// backend and, on rank 0, out_dir with run_config.json and metrics.jsonl, saying each
// on stdout; anything wrong is fatal and names its config key. train_run_steps trains
// from the state's step to train.steps, logging each step and checkpointing (rank 0),
// and stops early after the step in which *stop became nonzero on any rank (the
// caller's signal handler sets it), with a checkpoint. train_run_free frees it all.
#pragma once
#include <signal.h>
#include <stdbool.h>
#include "trainer/config.h"

typedef struct TrainRun TrainRun;

// What a run's steps come to, for the caller's summary.
typedef struct {
    bool writes;       // rank 0: out_dir and the step log are this process's
    long first_step;   // the step the run started from (a resume's checkpoint step)
    long steps_done;   // optimizer steps completed when train_run_steps returned
    long total_steps;  // train.steps
    double elapsed_s;  // training time across resumes
    char checkpoint_dir[4096];  // the last checkpoint written; "" when none was
} TrainRunResult;

// config outlives the run.
TrainRun *train_run_start(const RunConfig *config);
void train_run_steps(TrainRun *run, const volatile sig_atomic_t *stop, TrainRunResult *out);
void train_run_free(TrainRun *run);
