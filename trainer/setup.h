// From a resolved Config to what `train run` and `train parity` both need: the model
// configuration, the tokenizer, and the initial weights.
#pragma once
#include <stddef.h>
#include "data/tokenizer.h"
#include "model/hf_export.h"
#include "model/hf_model.h"
#include "model/model.h"
#include "trainer/config.h"

// model.* keys, or with model.init_from the folder's config.json (a model.* key the
// user set that contradicts it is fatal, naming both values), the vocabulary grown to
// the size of tok (tokenizer_with_added(c): the run's one load of the tokenizer) when
// model.add_tokens is set, and a random init's vocabulary tok's size unless
// model.vocab_size is set; values the model cannot use, and a tokenizer of more pieces
// than the vocabulary, are fatal and name the key.
ModelConfig model_config_with(const RunConfig *c, const Tokenizer *tok);
// model_config_with for a caller without a tokenizer of its own (bench_trainer): where
// the tokenizer sizes the vocabulary it loads data.tokenizer only for that.
ModelConfig model_config_from(const RunConfig *c);
// model.init_from's config.json into *out; false when model.init_from is not set.
bool model_source_from(const RunConfig *c, HfModelConfig *out);

// data.tokenizer (a .model, a tokenizer.json or a model folder) with model.add_tokens
// added (each listed token the tokenizer lacks as one id, as an added token after its
// vocabulary; those it has are left alone, saying so); fatal when it cannot be loaded,
// cannot take them (SentencePiece) or lacks a template token (naming them all and the
// model.add_tokens value that adds them).
Tokenizer *tokenizer_with_added(const RunConfig *c);

// params [table->total]: from `weights` when not NULL (a Hugging Face model folder,
// i.e. one with config.json, single or sharded, any of F32/BF16/F16; else a
// model.safetensors file or a directory holding one), else the seeded init. A folder
// with fewer vocabulary rows than mc (model.add_tokens) gets the embedding's (and an
// untied LM head's) mean row in the rows it lacks. Loaded weights must be finite: a NaN
// or an infinity is fatal, naming the tensor.
void params_load_or_init(const ModelConfig *mc, const ParamTable *table, const char *weights,
                         uint64_t seed, float *params);
// A fresh run from the Hugging Face folder `weights`: the rows of the new ids that
// model.add_tokens gave (tokenizer_loaded_size(tok) up) become the mean row of the
// folder's rows, also where they fall inside its padding rows (a token that was a
// vocabulary piece keeps its id and its row). Says so on stdout.
void params_init_added_rows(const ModelConfig *mc, const ParamTable *table, const Tokenizer *tok,
                            const char *weights, float *params);

// How the run's checkpoints are written: train.save_dtype (default bf16 with
// model.init_from, else f32), the source's token ids and max_position_embeddings (else
// the template's end of turn as eos and data.seq_len), the end of turn as the
// generation eos. Fatal for a bad train.save_dtype.
void hf_export_from(const RunConfig *c, const ModelConfig *mc, const Tokenizer *tok, HfExport *out);

// The tokens tok added (model.add_tokens, tokenizer_added_ids) into dir's copied
// tokenizer files (model/hf_export.h's hf_add_tokens). Returns 0, or -1 with a message.
int hf_write_added_tokens(const char *dir, const Tokenizer *tok, char *err, size_t err_len);

// Parses argv for --config/--set, fails on anything else, loads the config.
// `extra` names one more accepted "--flag VALUE" (NULL for none); its value goes to *extra_value.
RunConfig *config_from_args(int argc, char **argv, const char *command, const char *extra,
                         const char **extra_value);

double now_seconds(void);  // monotonic clock
