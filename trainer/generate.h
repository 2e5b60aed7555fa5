// Batched autoregressive generation over a decoder backend: many prompts of
// different lengths share one KV cache of `batch` slots (a finished sequence's slot takes
// the next prompt at once), greedy or temperature / top-p sampling with a seed, each
// sequence stopping at the template's end of turn or a length limit. Positions follow
// the inference view: a prompt's tokens sit at 0..n-1 and its continuation after them.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "trainer/backend.h"
#include "trainer/config.h"
#include "trainer/decode_ops.h"

// The decoder of a backend (the CPU's, or the CUDA decoder in a CUDA build); *why says
// which one runs.
const DecodeOps *decode_ops(Backend backend, char *why, size_t why_len);

// What the chat template says generation needs: the id that ends a turn and the think
// tags that split a generated text into thinking and answer (the one place generation
// asks the template; t NULL: onepass's).
typedef struct {
    int32_t end_of_turn;
    char think_open[64], think_close[64];  // the template's tags, whitespace at the ends trimmed
} GenerateTemplate;
GenerateTemplate generate_template(const Tokenizer *tok, const ChatTemplate *t);
// The prompt of a conversation ending in a user message (sample_tokenize_prompt).
int generate_prompt(const Tokenizer *tok, const ChatTemplate *t, const Sample *s,
                    SpecialInText special_in_text, TokenSpan *out, char *err, size_t err_len);
// The prompts of every sample of data, read from `path` (prompts_load), in order:
// [data->n_samples + 1], each malloc'd. Fatal, naming path:line, for one that does not
// tokenize.
TokenSpan *generate_prompts(const Tokenizer *tok, const ChatTemplate *t, const Dataset *data,
                            SpecialInText special_in_text, const char *path);

typedef struct {
    int max_new_tokens;  // generated tokens per prompt at most (the end of turn included)
    double temperature;  // 0: greedy (argmax, lowest id on ties)
    double top_p;        // sample from the smallest set of tokens holding this probability
    uint64_t seed;       // prompt i's draws come from (seed, i): independent of batching
    int batch;           // sequences decoded at once (KV cache slots)
    int vocab_limit;     // draw only ids below it (the tokenizer's pieces: a model's padded
                         // vocabulary has ids nothing decodes); 0: every id
} GenerateOptions;
// generate.max_new_tokens, temperature, top_p, seed, batch (range-checked by config_load),
// drawing from the tokenizer's pieces.
GenerateOptions generate_options_from(const RunConfig *c, const Tokenizer *tok);

typedef struct {
    int32_t *tokens;  // generated ids, the end of turn included when it came
    int n;
    bool ended;       // stopped at the end of turn (else at max_new_tokens)
} Generation;

// Counts of a generate() run.
typedef struct {
    long long prompt_tokens, generated_tokens;
    int forward_calls;
    double seconds;
} GenerateStats;

// Generates a continuation of every prompt into out[n_prompts] (free each with
// generation_free). The model runs on `ops` with the fp32 host weights params.
void generate(const DecodeOps *ops, const ModelConfig *cfg, const float *params,
              const GenerateOptions *opt, int32_t end_of_turn, const TokenSpan *prompts,
              int n_prompts, Generation *out, GenerateStats *stats);
void generation_free(Generation *g);
// The text of a generation (malloc'd), its end of turn left out.
char *generation_text(const Tokenizer *tok, const Generation *g);

// The next token from logits [V]: argmax at temperature 0, else a top-p draw with u, a
// uniform number in [0, 1). scratch: [V] floats and [V] ints.
int32_t sample_token(const float *logits, int V, double temperature, double top_p, double u,
                     float *prob, int32_t *order);

// What `train generate` and `train eval` run: model.init_from's weights (required; a
// run's checkpoint folder or any model folder the trainer loads) with lora.init_from's
// adapters (a LoRA run's checkpoint or any PEFT adapter folder, under the lora.* keys)
// merged in, its config, the tokenizer, and the backend choice (fatal with the key on any
// error).
typedef struct {
    ModelConfig mc;
    ParamTable table;
    float *params;  // [table.total] fp32
    Tokenizer *tok;
    Backend backend;
    char backend_why[512];
} InferenceModel;
void inference_model_load(const RunConfig *c, const char *command, InferenceModel *m);
void inference_model_free(InferenceModel *m);
