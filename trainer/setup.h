// From a resolved Config to what `train run` and `train parity` both need: the model
// configuration, the tokenizer, and the initial weights.
#pragma once
#include "data/tokenizer.h"
#include "model/model.h"
#include "trainer/config.h"

// model.* keys; values the model cannot use are fatal and name the key.
ModelConfig model_config_from(const Config *c);

// data.tokenizer (a .model, a tokenizer.json or a model folder); fatal when it cannot be
// loaded, lacks a template token or has more pieces than model.vocab_size.
Tokenizer *tokenizer_from(const Config *c, const ModelConfig *mc);

// params [table->total]: from `weights` (a model.safetensors file or a checkpoint
// directory holding one) when not NULL, else the seeded init.
void params_load_or_init(const ModelConfig *mc, const ParamTable *table, const char *weights,
                         uint64_t seed, float *params);

// Parses argv for --config/--set, fails on anything else, loads the config.
// `extra` names one more accepted "--flag VALUE" (NULL for none); its value goes to *extra_value.
Config *config_from_args(int argc, char **argv, const char *command, const char *extra,
                         const char **extra_value);

double now_seconds(void);  // monotonic clock
