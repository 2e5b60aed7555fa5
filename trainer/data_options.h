// DataOptions (data/batch.h) from the data.* keys of a config.
#pragma once
#include "data/batch.h"
#include "trainer/config.h"

// data.layout, data.seq_len, data.unpacked, data.skip_bad, data.skip_too_long; a bad
// value is fatal and names the key.
DataOptions data_options_from_config(const Config *c);
