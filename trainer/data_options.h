// The data.* keys of a resolved Config as the data stage's DataOptions.
#pragma once
#include "data/batch.h"
#include "trainer/config.h"

// data.layout, data.seq_len, data.unpacked, data.skip_bad, data.skip_too_long,
// data.special_in_text; a bad
// value is fatal and names the key.
DataOptions data_options_from_config(const Config *c);
