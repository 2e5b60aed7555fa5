// Shared by the tests of Hugging Face folders in and out.
#pragma once
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include "common/check.h"
#include "model/hf_model.h"
#include "model/safetensors.h"

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

// A fixture's transformers reference (scripts/fixtures/make_hf_fixtures.py): one causal row
// of S tokens with its position ids and targets (-1 on the last), the mean cross-entropy
// over the targets, and the fp32 logits.
typedef struct {
    int S, n_targets;
    int32_t *token, *pos, *target;  // [S]
    int32_t *lo, *hi;               // [S] key i visible to queries [i, S): causal
    double loss;
    float *logits;                  // [S, vocab]
} HfReference;

static inline void hf_reference_load(const char *folder, int vocab, HfReference *r) {
    char path[600], err[1024];
    snprintf(path, sizeof path, "%s/reference.json", folder);
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    CHECK(ref, "%s: %s", path, jerr.text);
    const json_t *tokens = json_object_get(ref, "tokens"), *positions = json_object_get(ref, "positions");
    const json_t *targets = json_object_get(ref, "targets");
    const int S = r->S = (int)json_array_size(tokens);
    r->token = (int32_t *)xmalloc(S * sizeof(int32_t)), r->pos = (int32_t *)xmalloc(S * sizeof(int32_t));
    r->target = (int32_t *)xmalloc(S * sizeof(int32_t)), r->lo = (int32_t *)xmalloc(S * sizeof(int32_t));
    r->hi = (int32_t *)xmalloc(S * sizeof(int32_t));
    r->n_targets = 0;
    for (int i = 0; i < S; i++) {
        r->token[i] = (int32_t)json_integer_value(json_array_get(tokens, i));
        r->pos[i] = (int32_t)json_integer_value(json_array_get(positions, i));
        r->target[i] = (int32_t)json_integer_value(json_array_get(targets, i));
        r->lo[i] = i, r->hi[i] = S;  // causal
        r->n_targets += r->target[i] >= 0;
    }
    r->loss = json_number_value(json_object_get(ref, "loss"));
    json_decref(ref);

    SafeTensorsFile rf;
    snprintf(path, sizeof path, "%s/reference.safetensors", folder);
    CHECK(safetensors_read(path, &rf, err, sizeof err) == 0, "%s", err);
    r->logits = (float *)xmalloc((size_t)S * vocab * sizeof(float));
    const int64_t shape[2] = {S, vocab};
    CHECK(safetensors_copy_f32(&rf, "logits", 2, shape, r->logits, err, sizeof err) == 0, "%s",
          err);
    safetensors_file_free(&rf);
}

static inline void hf_reference_free(HfReference *r) {
    free(r->token), free(r->pos), free(r->target), free(r->lo), free(r->hi), free(r->logits);
}
