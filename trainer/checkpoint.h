// Checkpoints: a directory holding
//   model.safetensors      model weights under HF names (+ metadata: step), or shards
//                          with model.safetensors.index.json: a Hugging Face model folder
//   optimizer.safetensors  AdamW moments "exp_avg.<name>", "exp_avg_sq.<name>", the fp32
//                          "master.<name>" weights when the model file is bf16/f16 and, in
//                          the metadata, the step, the data position and the seed
//   config.json            the model's HF config (transformers loads the folder as is)
//   generation_config.json
// or, for a LoRA run (HfExport.lora), the PEFT adapter folder in place of the model:
//   adapter_config.json, adapter_model.safetensors (model/peft.h), and the optimizer
//   state of the adapters with the checksum of the frozen base weights
// The directory is written whole as <dir>.tmp/ (each file fsync'd, the tokenizer files
// too, the optimizer state last with the list of every file) and then renamed to <dir>
// (an older <dir> moved aside first and removed after), so the files of one checkpoint
// always come from one save. Both safetensors files carry the step, a per-save id and
// the run record's hash; the optimizer file a checksum of its tensors and one of the
// model files' tensors as stored. A load fails when the files disagree (a checkpoint
// cut in half or mixed from two saves), when a checksum does not match, or when a file
// holds a tensor that the model does not have.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "common/output_file.h"  // write_file_atomic
#include "model/hf_export.h"
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
    uint64_t base_checksum;     // LoRA: checksum_bytes of the frozen base weights; 0: none
    // The run's record (JSON text: its resolved config and input checksums) for the
    // resume checks of trainer/run.c. Saved when non-NULL; a successful load sets it to
    // a malloc'd copy (NULL when the checkpoint has none), which the caller frees.
    char *run_record;
} TrainProgress;

// Creates dir (and parents) when needed. Returns 0, or -1 with a message in err.
int checkpoint_save(const char *dir, const ModelConfig *cfg, const ParamTable *table,
                    const float *params, const AdamWState *opt, const TrainProgress *progress,
                    char *err, size_t err_len);

// Loads into already-allocated params [table->total] and opt (adamw_init'd to
// table->total). Shapes must match the table. Returns 0, or -1 with a message.
int checkpoint_load(const char *dir, const ParamTable *table, float *params, AdamWState *opt,
                    TrainProgress *progress, char *err, size_t err_len);

// More files of a checkpoint (the tokenizer files), written into dir (the .tmp folder)
// before the optimizer state. Returns 0, or -1 with a message.
typedef int (*CheckpointExtraFiles)(const char *dir, void *arg, char *err, size_t err_len);

// The same as a Hugging Face model folder of the export's dtype, ids and shard size
// (model/hf_export.h); below F32 the fp32 master weights go into
// optimizer.safetensors as "master.<name>" and checkpoint_load takes them from there.
// extra (may be NULL) writes more files into the folder before it is installed. The
// optimizer state, written last, lists every file of the folder ("files"), so a
// checkpoint missing one is refused by name. A failed save removes its .tmp folder and
// leaves an older dir as it was.
int checkpoint_save_hf(const char *dir, const ParamTable *table, const float *params,
                       const AdamWState *opt, const TrainProgress *progress, const HfExport *hf,
                       CheckpointExtraFiles extra, void *extra_arg, char *err, size_t err_len);

// A checkpoint (a folder with an onepass optimizer.safetensors) missing a file its
// optimizer state lists, or holding one that is not a regular file: "dir: incomplete
// checkpoint: NAME is missing". A folder without optimizer.safetensors (a Hugging Face
// export) passes. Returns 0, or -1 with the message.
int checkpoint_check_complete(const char *dir, char *err, size_t err_len);

// The model weights of a checkpoint or any Hugging Face folder: the fp32 master weights
// of optimizer.safetensors when it has them, else the model files (converted to fp32).
int checkpoint_load_weights(const char *dir, const ParamTable *table, float *params, char *err,
                            size_t err_len);

// The run record stored in dir's optimizer.safetensors (its header alone is read), for
// comparing a resume's configuration before loading tensors. *record: malloc'd, NULL
// when the checkpoint has none. Returns 0, or -1 with a message.
int checkpoint_read_run_record(const char *dir, char **record, char *err, size_t err_len);

// `train export`: the checkpoint (or any Hugging Face folder) `from` as a folder `out`
// without optimizer state: its config, its weights (the fp32 master weights when the
// checkpoint has them) in *dtype (NULL: the config's dtype), its generation_config.json
// and tokenizer files. Returns 0, or -1 with a message.
// A LoRA checkpoint (a PEFT adapter folder) exports as an adapter folder of its
// adapter_config.json, adapter_model.safetensors and tokenizer files (dtype must be NULL).
int hf_export_checkpoint(const char *from, const char *out, const SaveDtype *dtype, char *err,
                         size_t err_len);

// `train export --merge`: the PEFT adapter folder `from` (a LoRA checkpoint's or PEFT's)
// merged into its base model (base_model_name_or_path, or base when not NULL): W += s B A
// for every adapter, written as a Hugging Face model folder `out` in *dtype (NULL: the
// base's dtype) with the base's generation_config.json and from's tokenizer files.
// Returns 0, or -1 with a message.
int hf_export_merged(const char *from, const char *base, const char *out,
                     const SaveDtype *dtype, char *err, size_t err_len);
