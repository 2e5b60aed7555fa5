// A step's micro-batches through a backend (trainer/backend.h): the one loop over
// micro-batches that training, eval, the parity report and the tests share, and one
// optimizer step with its finite checks.
#pragma once
#include <stddef.h>
#include "trainer/backend.h"
#include "dist/distributed.h"
#include "model/model.h"
#include "trainer/loader.h"

// Zeroes the gradients, then forward+backward of every micro-batch of mb, accumulating
// the gradients of sum(CE) * loss_scale (DESIGN.md §5: loss_scale = 1 / the step's
// trained tokens). Returns the unscaled CE sum over all targets.
double train_step_forward_backward(const TrainBackendOps *ops, void *backend,
                                   const MicroBatches *mb, float loss_scale);

// Forward only of every micro-batch: per-position CE into losses [mb->rows.n_rows,
// seq_len] (host; NULL: not wanted). Returns the CE sum over all targets.
double train_step_forward(const TrainBackendOps *ops, void *backend, const MicroBatches *mb,
                          float *losses);

// What one optimizer step reports.
typedef struct {
    double loss;       // mean CE over the step's trained tokens
    double grad_norm;  // before clipping
} StepOutcome;

// One optimizer step on this rank's micro-batches of a step, trained_tokens of its
// targets on this rank: forward+backward with the loss normalised by the step's trained
// tokens over comm's ranks (> 0; DESIGN §5), the gradients summed over the ranks
// (started during the last micro-batch's backward where the backend and comm can, then
// ops->all_reduce_grads: every rank then holds the same gradients and takes the same
// update), the gradient norm, then AdamW with h (h->lr this step's rate) on the
// gradients clipped to max_grad_norm.
// Returns 0, or -1 with a message when the loss, a gradient or (after the update) a
// weight is not finite: the backend's state is then not worth saving.
int train_step(const TrainBackendOps *ops, void *backend, const MicroBatches *mb,
               long long trained_tokens, const DistComm *comm, const AdamWHyper *h,
               double max_grad_norm, StepOutcome *out, char *err, size_t err_len);

// The gradient all-reduce buckets of a model's parameters (dist/distributed.h's
// bucket_plan_from_sizes over the table's tensors). Fatal (CHECK) when the table's
// tensors do not tile [0, table->total) in order.
void bucket_plan_build(const ParamTable *table, size_t bucket_bytes, BucketPlan *out);
