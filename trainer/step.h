// A step's micro-batches through a backend (trainer/backend.h): the one loop over
// micro-batches that training, eval, the parity report and the tests share.
#pragma once
#include "trainer/backend.h"
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
