// Hugging Face model folders in: config.json (model_type llama, qwen2, qwen3) to a
// ModelConfig, and the weights (model.safetensors, or shards listed by
// model.safetensors.index.json; F32, BF16 or F16) into the fp32 parameter buffer.
// Anything the model cannot run is refused by key or tensor name, never ignored.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "model/model.h"

enum { HF_MAX_EOS = 8 };

// What a config.json says beyond the ModelConfig, kept for the exported config.
typedef struct {
    ModelConfig cfg;
    int max_position_embeddings;   // 0 when absent
    int bos_token_id, pad_token_id;  // -1 when absent
    int eos_token_ids[HF_MAX_EOS];   // eos_token_id: an integer or a list
    int n_eos;
    char dtype[16];                // "dtype" or the older "torch_dtype"; "" when absent
} HfModelConfig;

// Parses dir/config.json. Returns 0, or -1 with "path: what" in err naming the key.
int hf_config_read(const char *dir, HfModelConfig *out, char *err, size_t err_len);
// The same from a JSON text (path only names it in messages).
int hf_config_parse(const char *text, const char *path, HfModelConfig *out, char *err,
                    size_t err_len);

// The weight files of the folder dir, by name: those model.safetensors.index.json's
// weight_map names (each once), else model.safetensors alone, also when the index cannot
// be read or names none; sharded says which.
typedef struct {
    char **names;  // [n], malloc'd
    int n;
    bool sharded;
} HfWeightFiles;
void hf_weight_files(const char *dir, HfWeightFiles *out);
void hf_weight_files_free(HfWeightFiles *f);

// Loads every tensor of the table from dir (model.safetensors, or the shards of
// model.safetensors.index.json) into params at the table's offsets, converting to fp32.
// A missing tensor, an extra tensor (besides a tied lm_head.weight equal to the
// embedding and rotary_emb.inv_freq buffers), a shape or dtype mismatch fails naming it.
int hf_weights_load(const char *dir, const ParamTable *table, float *params, char *err,
                    size_t err_len);

// model_type of an architecture ("llama", "qwen2", "qwen3") and its HF class name.
const char *hf_model_type(ModelArch arch);
const char *hf_architecture(ModelArch arch);
