// The model configuration: its validation and the dimensions derived from it, in one
// place for the parameter table and both backends.
#define _DEFAULT_SOURCE  // M_PI
#include <math.h>
#include <string.h>
#include "common/check.h"
#include "model/model.h"

// The checks name the model.* keys, not a source line: these are the user's values.
ModelDims model_dims(const ModelConfig *cfg) {
    const struct { const char *name; int value, max; } sizes[] = {
        {"vocab_size", cfg->vocab_size, MODEL_MAX_VOCAB_SIZE},
        {"hidden_size", cfg->hidden_size, MODEL_MAX_HIDDEN_SIZE},
        {"intermediate_size", cfg->intermediate_size, MODEL_MAX_INTERMEDIATE_SIZE},
        {"num_hidden_layers", cfg->num_hidden_layers, MODEL_MAX_LAYERS},
        {"num_attention_heads", cfg->num_attention_heads, MODEL_MAX_HEADS},
        {"num_key_value_heads", cfg->num_key_value_heads, MODEL_MAX_HEADS},
        {"head_dim", cfg->head_dim, MODEL_MAX_HEAD_DIM},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if (sizes[i].value <= 0 && strcmp(sizes[i].name, "head_dim") != 0)
            fatal("model.%s must be positive, got %d", sizes[i].name, sizes[i].value);
        if (sizes[i].value > sizes[i].max)
            fatal("model.%s %d is over its limit %d", sizes[i].name, sizes[i].value, sizes[i].max);
    }
    ModelDims d;
    if (cfg->head_dim < 0) fatal("model.head_dim must be positive (or 0: derived), got %d",
                                 cfg->head_dim);
    if (cfg->head_dim > 0) {
        d.head_dim = cfg->head_dim;
        if (d.head_dim % 2 != 0) fatal("model.head_dim %d must be even for RoPE", d.head_dim);
    } else {
        if (cfg->hidden_size % cfg->num_attention_heads != 0)
            fatal("model.hidden_size %d is not a multiple of model.num_attention_heads %d",
                  cfg->hidden_size, cfg->num_attention_heads);
        d.head_dim = cfg->hidden_size / cfg->num_attention_heads;
        if (d.head_dim % 2 != 0)
            fatal("head dim (model.hidden_size / model.num_attention_heads = %d) must be even "
                  "for RoPE",
                  d.head_dim);
    }
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0)
        fatal("model.num_attention_heads %d is not a multiple of model.num_key_value_heads %d",
              cfg->num_attention_heads, cfg->num_key_value_heads);
    if (!(cfg->rms_norm_eps > 0.0f && cfg->rms_norm_eps <= MODEL_MAX_RMS_NORM_EPS))
        fatal("model.rms_norm_eps must be in (0, %g], got %g", MODEL_MAX_RMS_NORM_EPS,
              (double)cfg->rms_norm_eps);
    if (!(cfg->rope_theta > 0.0f && cfg->rope_theta <= MODEL_MAX_ROPE_THETA))
        fatal("model.rope_theta must be in (0, %g], got %g", MODEL_MAX_ROPE_THETA,
              (double)cfg->rope_theta);
    const RopeScaling *rs = &cfg->rope_scaling;
    if (rs->type != ROPE_DEFAULT && !(rs->factor > 0.0f && rs->factor <= MODEL_MAX_ROPE_FACTOR))
        fatal("model.rope_scaling.factor must be in (0, %g], got %g", MODEL_MAX_ROPE_FACTOR,
              (double)rs->factor);
    if (rs->type == ROPE_LLAMA3 &&
        (!(rs->high_freq_factor > rs->low_freq_factor) || !(rs->low_freq_factor > 0.0f) ||
         rs->original_max_position_embeddings <= 0))
        fatal("model.rope_scaling (llama3): needs 0 < low_freq_factor %g < high_freq_factor %g "
              "and original_max_position_embeddings %d > 0",
              (double)rs->low_freq_factor, (double)rs->high_freq_factor,
              rs->original_max_position_embeddings);
    // In 64-bit: within the limits above these fit an int (1024 heads x 2^16 = 2^26).
    const int64_t q_dim = (int64_t)cfg->num_attention_heads * d.head_dim;
    const int64_t kv_dim = (int64_t)cfg->num_key_value_heads * d.head_dim;
    CHECK(q_dim + 2 * kv_dim <= INT32_MAX, "model dims past int within the limits");
    d.q_dim = (int)q_dim;
    d.kv_dim = (int)kv_dim;
    d.qkv_dim = (int)(q_dim + 2 * kv_dim);
    return d;
}

AttnShape model_attention_shape(const ModelConfig *cfg, const ModelDims *d, int n_rows,
                                int seq_len) {
    return (AttnShape){n_rows, seq_len, cfg->num_attention_heads, cfg->num_key_value_heads,
                       d->head_dim, 1.0f / sqrtf((float)d->head_dim)};
}

// HF's _compute_default/linear/llama3_rope_parameters, in double.
void rope_inv_freq(double *inv_freq, int head_dim, float theta, const RopeScaling *scaling) {
    const int half = head_dim / 2;
    for (int i = 0; i < half; i++) inv_freq[i] = pow((double)theta, -2.0 * i / head_dim);
    if (!scaling || scaling->type == ROPE_DEFAULT) return;
    const double factor = scaling->factor;
    if (scaling->type == ROPE_LINEAR) {
        for (int i = 0; i < half; i++) inv_freq[i] /= factor;
        return;
    }
    const double old_len = scaling->original_max_position_embeddings;
    const double low = scaling->low_freq_factor, high = scaling->high_freq_factor;
    const double low_freq_wavelen = old_len / low, high_freq_wavelen = old_len / high;
    for (int i = 0; i < half; i++) {
        const double wavelen = 2.0 * M_PI / inv_freq[i];
        if (wavelen > low_freq_wavelen) {
            inv_freq[i] /= factor;  // low frequencies: scaled
        } else if (wavelen >= high_freq_wavelen) {  // the band between: interpolated
            const double smooth = (old_len / wavelen - low) / (high - low);
            inv_freq[i] = (1.0 - smooth) * inv_freq[i] / factor + smooth * inv_freq[i];
        }  // high frequencies: unchanged
    }
}

static const char *const RECOMPUTE_NAMES[] = {
    [MODEL_RECOMPUTE_MLP] = "mlp", [MODEL_RECOMPUTE_NONE] = "none", [MODEL_RECOMPUTE_LAYER] = "layer"};

const char *model_recompute_name(ModelRecompute r) {
    return (unsigned)r < sizeof RECOMPUTE_NAMES / sizeof RECOMPUTE_NAMES[0] ? RECOMPUTE_NAMES[r]
                                                                             : "?";
}

int model_recompute_from_name(const char *name) {
    for (int r = 0; name && r < (int)(sizeof RECOMPUTE_NAMES / sizeof RECOMPUTE_NAMES[0]); r++)
        if (strcmp(name, RECOMPUTE_NAMES[r]) == 0) return r;
    return -1;
}
