// The step loader: which conversations each optimizer step trains on, laid out and
// packed, and the step's micro-batches with their attention masks. trainer/prefetch.h
// runs it ahead on a CPU thread.
//
// The step budget counts TRAINED tokens (targets != -1), which are the same under
// every layout, so npass, mask_only and duplicate runs with one seed see the same
// conversations in the same order at every step: a step takes whole samples in the
// epoch's order until the budget is reached, lays them out, packs them into rows of
// seq_len, and the loss is normalised by the step's trained positions.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "attention/mask.h"
#include "data/layout.h"
#include "data/pack.h"
#include "model/model.h"

typedef struct {
    const TokenizedSample *samples;  // not owned
    int n_samples;
    LayoutKind layout;
    LossOptions loss;  // the defaults (zero) unless set after step_loader_init
    int seq_len;
    PackOptions pack;
    long long budget;   // trained tokens per step
    bool shuffle;       // each epoch in a seeded order; else file order
    uint64_t seed;
    long long epoch, cursor;  // position: next sample is order[cursor] of this epoch
    int *order;               // [n_samples] this epoch's order
    long long *npass_tokens;  // [n_samples] tokens of each sample under npass; -1: not yet
                              // counted (each is laid out once, when first taken)
} StepLoader;

typedef struct {
    DocList docs;
    PackedRows rows;
    int n_samples;              // samples taken
    long long tokens;           // non-padding slots of rows
    long long trained_tokens;   // targets != -1 in rows
    long long npass_tokens;     // the tokens npass lays out for the step's samples
    int n_skipped_too_long;     // documents dropped by pack.skip_too_long
} StepBatch;

void step_loader_init(StepLoader *l, const TokenizedSample *samples, int n_samples,
                      LayoutKind layout, int seq_len, PackOptions pack, long long budget,
                      bool shuffle, uint64_t seed);
// The optimizer steps from the start that take `epochs` passes over the samples (the
// steps until epochs x n_samples samples are taken, whole samples per step as
// step_loader_next takes them), counted without packing. Fatal when no sample has a
// trained token.
long step_loader_steps_for_epochs(const StepLoader *l, double epochs);
// Moves to a saved position (a resumed run).
void step_loader_seek(StepLoader *l, long long epoch, long long cursor);
// The next step's batch. Returns 0, or -1 (out then holds nothing) with a message naming
// the sample's line in err when a sample cannot be laid out or packed (the loader is then
// unusable).
int step_loader_try_next(StepLoader *l, StepBatch *out, char *err, size_t err_len);
// step_loader_try_next, fatal on error.
void step_loader_next(StepLoader *l, StepBatch *out);
void step_batch_free(StepBatch *b);
void step_loader_free(StepLoader *l);

// Counts over rows: non-padding slots and targets != -1.
void packed_rows_count(const PackedRows *rows, long long *tokens, long long *trained);

// Rows cut into micro-batches of up to micro_rows rows, each with its attention mask
// (ATTN_TILE tiles, the one size both backends run).
// The row arrays are referenced, not owned; the masks are owned.
typedef struct {
    PackedRows rows;
    int micro_rows, n_micro;
    AttnMask *masks;  // [n_micro]: mask i covers rows [i * micro_rows, + micro_batch_rows(i))
} MicroBatches;

void micro_batches_build(const PackedRows *rows, int micro_rows, MicroBatches *out);
void micro_batches_free(MicroBatches *mb);
// Micro-batch i as the model's input.
ModelBatch micro_batch(const MicroBatches *mb, int i);
