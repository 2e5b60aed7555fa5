// The step loader: which conversations each optimizer step trains on, laid out and
// packed; and running packed rows through the CPU model in micro-batches.
//
// The step budget counts TRAINED tokens (targets != -1), which are the same under
// every layout, so npass, mask_only and duplicate runs with one seed see the same
// conversations in the same order at every step: a step takes whole samples in the
// epoch's order until the budget is reached, lays them out, packs them into rows of
// seq_len, and the loss is normalised by the step's trained positions.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "data/layout.h"
#include "data/pack.h"
#include "model/model.h"

typedef struct {
    const TokenizedSample *samples;  // not owned
    int n_samples;
    LayoutKind layout;
    int seq_len;
    PackOptions pack;
    long long budget;   // trained tokens per step
    bool shuffle;       // each epoch in a seeded order; else file order
    uint64_t seed;
    long long epoch, cursor;  // position: next sample is order[cursor] of this epoch
    int *order;               // [n_samples] this epoch's order
} StepLoader;

typedef struct {
    DocList docs;
    PackedRows rows;
    int n_samples;              // samples taken
    long long tokens;           // non-padding slots of rows
    long long trained_tokens;   // targets != -1 in rows
    int n_skipped_too_long;     // documents dropped by pack.skip_too_long
} StepBatch;

void step_loader_init(StepLoader *l, const TokenizedSample *samples, int n_samples,
                      LayoutKind layout, int seq_len, PackOptions pack, long long budget,
                      bool shuffle, uint64_t seed);
// Moves to a saved position (a resumed run).
void step_loader_seek(StepLoader *l, long long epoch, long long cursor);
// The next step's batch. Fatal (naming the sample's line) if a sample cannot be laid
// out or packed.
void step_loader_next(StepLoader *l, StepBatch *out);
void step_batch_free(StepBatch *b);
void step_loader_free(StepLoader *l);

// Counts over rows: non-padding slots and targets != -1.
void packed_rows_count(const PackedRows *rows, long long *tokens, long long *trained);

// The CPU attention's tile size (DESIGN.md §4: the consumer of the mask picks it).
enum { CPU_ATTENTION_TILE = 64 };

// Runs rows [0, rows->n_rows) through forward+backward, micro_rows rows at a time, each
// with its CPU_ATTENTION_TILE tile mask. Gradients accumulate into grads with
// loss_scale. Returns the unscaled CE sum over all targets.
double rows_forward_backward(CpuModel *model, const float *params, float *grads,
                             const PackedRows *rows, int micro_rows, float loss_scale);
// Forward only: per-position CE into losses [n_rows, seq_len] (0 where no target).
double rows_forward(CpuModel *model, const float *params, const PackedRows *rows, int micro_rows,
                    float *losses);
