// The data.* keys of a resolved Config as the data stage's DataOptions.
#pragma once
#include "data/batch.h"
#include "trainer/config.h"

// data.layout, data.seq_len, data.unpacked, data.skip_bad, data.skip_too_long,
// data.special_in_text, data.chat_template, data.ignore_unknown_keys, data.max_line_bytes,
// data.train_on, data.skip_empty_think_turns, data.history_thinking; a bad value is fatal and
// names the key.
DataOptions data_options_from_config(const RunConfig *c);

// data.chat_template, or when null the template of the model folder that data.tokenizer (else
// model.init_from) names, else onepass; under data.history_thinking "keep" its keep variant.
// Fatal for an unknown name, a folder whose chat_template is not recognised (the message
// says to set data.chat_template), or keep with a template that always strips.
const ChatTemplate *template_from_config(const RunConfig *c);

// When the key's value (data.tokenizer, model.init_from) names a folder, checks every file
// of it that onepass reads or copies (model/hf_model.h hf_folder_check) before any is read:
// fatal naming the key and the file.
void config_folder_check(const RunConfig *c, const char *const *field);
