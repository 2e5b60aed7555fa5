// Model configurations for tests: the sizes given, the rest Llama's defaults (eps 1e-5,
// theta 1e4, untied, no biases or q/k norms), for a test to adjust.
#pragma once
#include <string.h>
#ifdef __cplusplus
extern "C" {  // model.h is a plain C header without guards of its own
#endif
#include "model/model.h"
#ifdef __cplusplus
}
#endif

static inline ModelConfig test_model_config(int vocab, int hidden, int intermediate, int layers,
                                            int heads, int kv_heads) {
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = vocab;
    c.hidden_size = hidden;
    c.intermediate_size = intermediate;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv_heads;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    return c;
}
