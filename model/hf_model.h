// Hugging Face model folders in: config.json (model_type llama, qwen2, qwen3) to a
// ModelConfig, and the weights (model.safetensors, or shards listed by
// model.safetensors.index.json; F32, BF16 or F16) into the fp32 parameter buffer.
// Anything the model cannot run is refused by key or tensor name, never ignored.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <jansson.h>
#include "model/model.h"

enum { HF_MAX_EOS = 8 };

// The largest file of a model folder onepass reads or copies: a JSON file of metadata
// (config.json, generation_config.json, model.safetensors.index.json,
// tokenizer_config.json, special_tokens_map.json, added_tokens.json) and a tokenizer
// file (tokenizer.json, tokenizer.model, vocab.json, merges.txt, chat_template.jinja).
#define HF_JSON_MAX_BYTES ((size_t)64 << 20)
#define HF_TOKENIZER_MAX_BYTES ((size_t)1 << 30)

// The files of a model folder that onepass reads or copies, each with its limit.
typedef struct {
    const char *name;
    size_t max_bytes;
} HfFolderFile;
extern const HfFolderFile HF_FOLDER_FILES[];
extern const int HF_N_FOLDER_FILES;
// The limit of a folder file by name: HF_FOLDER_FILES's, else HF_JSON_MAX_BYTES.
size_t hf_file_max_bytes(const char *name);

// Checks the folder whole before anything of it is read: each file of HF_FOLDER_FILES
// that is present (a dangling link counts as absent) must be a regular file of at most
// its limit, so a FIFO, a device or a directory under such a name is refused by name
// before anything waits on it, trains or copies it. Returns 0, or -1 with "path: what".
int hf_folder_check(const char *dir, char *err, size_t err_len);

// The JSON of a folder's file (a regular file of at most max_bytes). Returns it, or NULL
// with "path:line: invalid JSON: ..." or the file's refusal in err.
json_t *hf_json_load(const char *path, size_t max_bytes, char *err, size_t err_len);

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

// The weight files of the folder dir, by name, the one resolver for model folders and
// checkpoints: those model.safetensors.index.json's weight_map names (each once; each a
// plain file name of the folder: no '/', no "." or ".."), else model.safetensors alone;
// sharded says which. An index that cannot be read, is not JSON (its parse error is
// the message), has no weight_map object or names none is refused. Returns 0, or -1
// with "path: what".
// A PEFT adapter folder (adapter_config.json, no model.safetensors) resolves to its
// adapter_model.safetensors (adapter says so), so checkpoints of LoRA runs are read the
// same way.
typedef struct {
    char **names;  // [n], malloc'd
    int n;
    bool sharded;
    bool adapter;  // adapter_model.safetensors of a PEFT adapter folder
} HfWeightFiles;
int hf_weight_files(const char *dir, HfWeightFiles *out, char *err, size_t err_len);
void hf_weight_files_free(HfWeightFiles *f);

// Whether dir holds weights of any kind: model.safetensors.index.json or a file named
// *.safetensors, *.bin, *.pt, *.pth, *.ckpt, *.gguf, *.h5 or *.msgpack (a dangling link
// under such a name counts). A folder without any (config.json alone) trains from a
// random initialisation; one with weights that fail to load is refused, never replaced.
bool hf_folder_has_weights(const char *dir);

// Loads every tensor of the table from dir (model.safetensors, or the shards of
// model.safetensors.index.json) into params at the table's offsets, converting to fp32.
// A missing tensor, an extra tensor (besides a tied lm_head.weight equal to the
// embedding and rotary_emb.inv_freq buffers), a shape or dtype mismatch fails naming it.
int hf_weights_load(const char *dir, const ParamTable *table, float *params, char *err,
                    size_t err_len);

// model_type of an architecture ("llama", "qwen2", "qwen3") and its HF class name.
const char *hf_model_type(ModelArch arch);
const char *hf_architecture(ModelArch arch);
