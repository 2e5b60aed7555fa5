// PEFT adapter folders, out and in: adapter_config.json (peft_type LORA, task_type
// CAUSAL_LM, r, lora_alpha, target_modules, bias "none", use_rslora,
// base_model_name_or_path) and adapter_model.safetensors (the LoraLayout's table under
// PEFT's names, F32), what `PeftModel.from_pretrained` loads as it is.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "model/lora.h"
#include "model/safetensors.h"

// Whether dir holds an adapter_config.json (a PEFT adapter folder, not a model folder).
bool peft_is_adapter_folder(const char *dir);

// Writes dir/adapter_config.json and dir/adapter_model.safetensors (metadata meta[n_meta]
// besides format "pt"; may be NULL). base_model: base_model_name_or_path (NULL: null).
// dir must exist. Returns 0, or -1 with a message.
int peft_adapter_write(const char *dir, const LoraLayout *l, const float *adapter,
                       const char *base_model, const SafeTensorMeta *meta, int n_meta,
                       char *err, size_t err_len);

// Parses dir/adapter_config.json into *out and its base_model_name_or_path into
// base_model (empty when null or absent). Refused, naming the file and the key: a
// peft_type other than LORA, target_modules that is not a list of the seven projection
// names, a bias other than "none", DoRA, fan_in_fan_out, per-layer rank or alpha
// patterns, layers_to_transform, modules_to_save, an r or lora_alpha out of range.
int peft_config_read(const char *dir, LoraConfig *out, char *base_model, size_t base_len,
                     char *err, size_t err_len);

// Loads dir/adapter_model.safetensors into adapter [l->table.total]: every tensor of the
// table with its shape (F32, BF16 or F16), and none besides. Returns 0, or -1 with a
// message naming the file and the tensor.
int peft_adapter_load(const char *dir, const LoraLayout *l, float *adapter, char *err,
                      size_t err_len);
