// Hugging Face model folders out (model/hf_model.h reads them): what
// AutoModelForCausalLM.from_pretrained loads as it is. config.json (architectures,
// model_type, every architecture key, dtype, token ids, max_position_embeddings), the
// weights in F32, BF16 or F16 (model.safetensors, or model-0000i-of-0000n.safetensors
// with model.safetensors.index.json above a size limit), generation_config.json; the
// tokenizer files are copied by hf_copy_tokenizer and take added tokens from
// hf_add_tokens.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "model/hf_model.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/safetensors.h"

typedef enum { SAVE_F32, SAVE_BF16, SAVE_F16 } SaveDtype;

// "f32", "bf16", "f16" -> *out; returns 0, or -1 with a message naming the value.
int save_dtype_parse(const char *name, SaveDtype *out, char *err, size_t err_len);
const char *save_dtype_torch_name(SaveDtype d);  // "float32", "bfloat16", "float16"

typedef struct {
    HfModelConfig hf;            // cfg and the token ids / max_position_embeddings to write
    SaveDtype dtype;
    size_t shard_bytes;          // tensor bytes per shard before the next one (0: 5 GB)
    int generation_eos_token_id; // generation_config eos (the template's end of turn); -1: config's
    const SafeTensorMeta *meta;  // metadata of every weight file (e.g. the step), may be NULL
    int n_meta;
    // Non-NULL: the folder is a PEFT adapter folder of these adapters (model/peft.h), the
    // table and params the adapters', F32; no config.json or generation_config.json.
    const LoraLayout *lora;
    const char *base_model;      // its base_model_name_or_path (NULL: null)
} HfExport;

// Writes config.json, the weights and generation_config.json into dir (created), or with
// e->lora the adapter folder (adapter_config.json, adapter_model.safetensors). Files
// go through <name>.tmp + rename. Returns 0, or -1 with a message.
int hf_export_write(const char *dir, const ParamTable *table, const float *params,
                    const HfExport *e, char *err, size_t err_len);

// Copies the tokenizer files that exist in src_dir (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, added_tokens.json,
// chat_template.jinja) into dst_dir; then the run's data.tokenizer when not NULL: a
// folder is copied the same way, a tokenizer.json file becomes dst_dir/tokenizer.json,
// any other file (a SentencePiece model) dst_dir/tokenizer.model. Returns 0, or -1 with
// a message.
int hf_copy_tokenizer(const char *src_dir, const char *run_tokenizer, const char *dst_dir,
                      char *err, size_t err_len);

// Copies src_dir/generation_config.json into dst_dir when src_dir has one. Returns 0, or
// -1 with a message.
int hf_copy_generation_config(const char *src_dir, const char *dst_dir, char *err,
                              size_t err_len);

// Added tokens ids[n] with their pieces[n] into dir's copied tokenizer files:
// tokenizer.json's added_tokens (special, not normalized, matched as written) and, where
// tokenizer_config.json has one, its added_tokens_decoder. Returns 0, or -1 with a
// message.
int hf_add_tokens(const char *dir, const int32_t *ids, const char *const *pieces, int n,
                  char *err, size_t err_len);

// The chat template the run trained, as dir/chat_template.jinja (replacing a copied one),
// and no chat_template key in dir/tokenizer_config.json, so that transformers renders with
// it. Returns 0, or -1 with a message.
int hf_write_chat_template(const char *dir, const char *jinja, char *err, size_t err_len);

// mkdir -p. Returns 0, or -1 with a message.
int make_dirs(const char *path, char *err, size_t err_len);
