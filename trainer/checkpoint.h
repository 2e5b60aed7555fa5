// Checkpoints: a directory holding
//   model.safetensors      model weights under HF names (+ metadata: step), or shards
//                          with model.safetensors.index.json: a Hugging Face model folder
//   optimizer.safetensors  AdamW moments "exp_avg.<name>", "exp_avg_sq.<name>", the fp32
//                          "master.<name>" weights when the model file is bf16/f16 and, in
//                          the metadata, the step, the data position and the seed
//   config.json            the model's HF config (transformers loads the folder as is)
//   generation_config.json
// Each file is written to a temp file, fsync'd and renamed. Both safetensors files
// carry the step; a load fails when they disagree (a checkpoint cut in half).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "model/model.h"
#include "trainer/adamw.h"
#include "trainer/hf_export.h"

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

// The same as a Hugging Face model folder of the export's dtype, ids and shard size
// (trainer/hf_export.h); below F32 the fp32 master weights go into
// optimizer.safetensors as "master.<name>" and checkpoint_load takes them from there.
int checkpoint_save_hf(const char *dir, const ParamTable *table, const float *params,
                       const AdamWState *opt, const TrainProgress *progress, const HfExport *hf,
                       char *err, size_t err_len);

// The model weights of a checkpoint or any Hugging Face folder: the fp32 master weights
// of optimizer.safetensors when it has them, else the model files (converted to fp32).
int checkpoint_load_weights(const char *dir, const ParamTable *table, float *params, char *err,
                            size_t err_len);

// Writes len bytes to path via <path>.tmp + fsync + rename. Returns 0, or -1 with a message.
int write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t err_len);

// mkdir -p. Returns 0, or -1 with a message.
int make_dirs(const char *path, char *err, size_t err_len);
