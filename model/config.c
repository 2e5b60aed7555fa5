// The model configuration: its validation and the dimensions derived from it, in one
// place for the parameter table and both backends.
#include <math.h>
#include "common/check.h"
#include "model/model.h"

// The checks name the model.* keys, not a source line: these are the user's values.
ModelDims model_dims(const ModelConfig *cfg) {
    const struct { const char *name; int value; } positive[] = {
        {"vocab_size", cfg->vocab_size},
        {"hidden_size", cfg->hidden_size},
        {"intermediate_size", cfg->intermediate_size},
        {"num_hidden_layers", cfg->num_hidden_layers},
        {"num_attention_heads", cfg->num_attention_heads},
        {"num_key_value_heads", cfg->num_key_value_heads},
    };
    for (size_t i = 0; i < sizeof(positive) / sizeof(positive[0]); i++)
        if (positive[i].value <= 0)
            fatal("model.%s must be positive, got %d", positive[i].name, positive[i].value);
    if (cfg->hidden_size % cfg->num_attention_heads != 0)
        fatal("model.hidden_size %d is not a multiple of model.num_attention_heads %d",
              cfg->hidden_size, cfg->num_attention_heads);
    ModelDims d;
    d.head_dim = cfg->hidden_size / cfg->num_attention_heads;
    if (d.head_dim % 2 != 0)
        fatal("head dim (model.hidden_size / model.num_attention_heads = %d) must be even for "
              "RoPE",
              d.head_dim);
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0)
        fatal("model.num_attention_heads %d is not a multiple of model.num_key_value_heads %d",
              cfg->num_attention_heads, cfg->num_key_value_heads);
    if (!(cfg->rms_norm_eps > 0.0f)) fatal("model.rms_norm_eps must be positive");
    if (!(cfg->rope_theta > 0.0f)) fatal("model.rope_theta must be positive");
    d.q_dim = cfg->num_attention_heads * d.head_dim;
    d.kv_dim = cfg->num_key_value_heads * d.head_dim;
    d.qkv_dim = d.q_dim + 2 * d.kv_dim;
    return d;
}

AttnShape model_attention_shape(const ModelConfig *cfg, const ModelDims *d, int n_rows,
                                int seq_len) {
    return (AttnShape){n_rows, seq_len, cfg->num_attention_heads, cfg->num_key_value_heads,
                       d->head_dim, 1.0f / sqrtf((float)d->head_dim)};
}
