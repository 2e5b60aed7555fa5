// Checkpoints: a directory holding
//   model.safetensors      model weights under HF names (+ metadata: step)
//   optimizer.safetensors  AdamW moments "exp_avg.<name>", "exp_avg_sq.<name>" and, in
//                          the metadata, the step, the data position and the seed
//   config.json            the model's HF config (hidden_size, ... as in HF)
// Each file is written to a temp file, fsync'd and renamed. Both safetensors files
// carry the step; a load fails when they disagree (a checkpoint cut in half).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "common/output_file.h"  // write_file_atomic
#include "model/model.h"
#include "trainer/adamw.h"

// Everything besides tensors that a resumed run needs to continue bit-identically.
typedef struct {
    long step;                  // optimizer steps completed
    long long data_epoch;       // loader position: epoch and index within its order
    long long data_cursor;
    uint64_t seed;              // the run's seed (the epoch orders derive from it)
    long long tokens_seen;      // totals so far, for metrics
    long long trained_tokens_seen;
    double elapsed_s;           // training time so far, for metrics and ETA
} TrainProgress;

// Creates dir (and parents) when needed. Returns 0, or -1 with a message in err.
int checkpoint_save(const char *dir, const ModelConfig *cfg, const ParamTable *table,
                    const float *params, const AdamWState *opt, const TrainProgress *progress,
                    char *err, size_t err_len);

// Loads into already-allocated params [table->total] and opt (adamw_init'd to
// table->total). Shapes must match the table. Returns 0, or -1 with a message.
int checkpoint_load(const char *dir, const ParamTable *table, float *params, AdamWState *opt,
                    TrainProgress *progress, char *err, size_t err_len);

// Writes the HF config.json of a model (atomically). Returns 0 or -1 with a message.
int model_config_write_hf(const char *path, const ModelConfig *cfg, char *err, size_t err_len);

// mkdir -p. Returns 0, or -1 with a message.
int make_dirs(const char *path, char *err, size_t err_len);
