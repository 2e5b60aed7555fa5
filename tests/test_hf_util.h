// Shared by the tests of Hugging Face folders in and out.
#pragma once
#include "common/check.h"
#include "model/hf_model.h"

// A folder's config and weights (fp32) and its parameter table; exits on error (the
// fixtures and the folders the tests write are ours).
static inline float *load_hf_folder(const char *folder, HfModelConfig *hf, ParamTable *table) {
    char err[1024];
    if (hf_config_read(folder, hf, err, sizeof err) != 0) fatal("%s", err);
    param_table_build(&hf->cfg, table);
    float *params = (float *)xmalloc(table->total * sizeof(float));
    if (hf_weights_load(folder, table, params, err, sizeof err) != 0) fatal("%s", err);
    return params;
}
