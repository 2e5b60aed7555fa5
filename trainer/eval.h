// Held-out evaluation during training: conversations in the inference view (npass),
// packed and cut into micro-batches once, then a forward pass on the backend at every
// eval step.
#pragma once
#include "data/batch.h"
#include "data/tokenizer.h"
#include "trainer/backend.h"
#include "trainer/loader.h"

typedef struct {
    PackedDataset data;
    MicroBatches micro;
    float *losses;  // [n_rows, seq_len] per-position CE of the last run
} EvalSet;

// The samples of `path` under opt, with opt.layout replaced by npass; micro-batches
// of up to micro_rows rows.
void eval_set_load(EvalSet *eval, const Tokenizer *tok, const char *path, DataOptions opt,
                   int micro_rows);
void eval_set_free(EvalSet *eval);

// eval_loss: mean CE over every target (think + answer); eval_answer_loss: over targets
// that are answer tokens, i.e. whose target slot (the next slot of the npass doc) is
// ROLE_ANSWER. NAN where there is no such target.
void evaluate(const TrainBackendOps *ops, void *backend, EvalSet *eval, double *eval_loss,
              double *eval_answer_loss);
