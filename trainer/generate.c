// Batched generation (trainer/generate.h): a scheduler over KV-cache slots. Each call to
// the decoder feeds the whole prompt of every sequence that just got a slot (prefill)
// and the last sampled token of every sequence still running; the logits of each
// sequence's last fed token give its next token.
#include "trainer/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/template.h"
#include "model/decode.h"
#include "model/peft.h"
#include "trainer/backend_registry.h"
#include "trainer/run.h"
#include "trainer/setup.h"
#ifdef ONEPASS_HAVE_CUDA
#include "trainer/decode_ops_cuda.h"
#endif

// ---- The decoders behind DecodeOps.

typedef struct {
    CpuDecoder *decoder;
    const float *params;
} CpuDecodeState;

static void *cpu_create(const ModelConfig *cfg, const float *params, int max_seqs, int max_len) {
    CpuDecodeState *s = xmalloc(sizeof *s);
    s->decoder = cpu_decoder_create(cfg, max_seqs, max_len);
    s->params = params;
    return s;
}
static void cpu_destroy(void *state) {
    CpuDecodeState *s = state;
    cpu_decoder_free(s->decoder);
    free(s);
}
static void cpu_reset(void *state, int slot) { cpu_decoder_reset(((CpuDecodeState *)state)->decoder, slot); }
static void cpu_forward(void *state, int n, const int32_t *slot, const int32_t *token,
                        const int32_t *pos, float *logits) {
    CpuDecodeState *s = state;
    cpu_decoder_forward(s->decoder, s->params, n, slot, token, pos, logits);
}

static const DecodeOps CPU_DECODE = {"cpu", cpu_create, cpu_destroy, cpu_reset, cpu_forward};

const DecodeOps *decode_ops(Backend backend, char *why, size_t why_len) {
#ifdef ONEPASS_HAVE_CUDA
    if (backend == BACKEND_CUDA) {
        snprintf(why, why_len, "generation: cuda");
        return cuda_decode_ops();
    }
#endif
    CHECK(backend == BACKEND_CPU, "backend %d is not in this binary", (int)backend);
    snprintf(why, why_len, "generation: cpu");
    return &CPU_DECODE;
}

// ---- The template and the prompt: every question generation asks the template.

// text without whitespace at either end into out[cap].
static void trimmed_copy(char *out, size_t cap, const char *text) {
    while (*text == ' ' || *text == '\n') text++;
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\n')) n--;
    CHECK(n < cap, "a template tag of %zu bytes", n);
    memcpy(out, text, n);
    out[n] = '\0';
}

GenerateTemplate generate_template(const Tokenizer *tok, const ChatTemplate *t) {
    if (!t) t = &TEMPLATE_ONEPASS;
    GenerateTemplate g = {.end_of_turn = tokenizer_piece_to_id(tok, t->end_of_turn)};
    CHECK(g.end_of_turn >= 0, "the tokenizer has no id for the end of turn '%s' "
          "(template_check_tokenizer passed it)", t->end_of_turn);
    trimmed_copy(g.think_open, sizeof g.think_open, t->think_open);
    trimmed_copy(g.think_close, sizeof g.think_close, t->think_close);
    return g;
}

int generate_prompt(const Tokenizer *tok, const ChatTemplate *t, const Sample *s,
                    SpecialInText special_in_text, TokenSpan *out, char *err, size_t err_len) {
    return sample_tokenize_prompt(tok, t ? t : &TEMPLATE_ONEPASS, s, special_in_text, out, err,
                                  err_len);
}

TokenSpan *generate_prompts(const Tokenizer *tok, const ChatTemplate *t, const Dataset *data,
                            SpecialInText special_in_text, const char *path) {
    TokenSpan *prompts = xcalloc((size_t)data->n_samples + 1, sizeof *prompts);
    char err[1024];
    for (int i = 0; i < data->n_samples; i++)
        if (generate_prompt(tok, t, &data->samples[i], special_in_text, &prompts[i], err,
                            sizeof err) != 0)
            fatal("%s:%d: %s", path, data->samples[i].line, err);
    return prompts;
}

GenerateOptions generate_options_from(const RunConfig *c, const Tokenizer *tok) {
    return (GenerateOptions){
        .max_new_tokens = (int)c->generate.max_new_tokens,
        .temperature = c->generate.temperature,
        .top_p = c->generate.top_p,
        .seed = (uint64_t)c->generate.seed,
        .batch = (int)c->generate.batch,
        .vocab_limit = tokenizer_vocab_size(tok),
    };
}

// ---- Sampling.

static const float *sort_prob;  // qsort's context: the probabilities being ordered
static int by_prob_desc(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (sort_prob[i] != sort_prob[j]) return sort_prob[i] > sort_prob[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

int32_t sample_token(const float *logits, int V, double temperature, double top_p, double u,
                     float *prob, int32_t *order) {
    int32_t best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return best;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += prob[v] = (float)exp((logits[v] - logits[best]) / temperature);
    for (int v = 0; v < V; v++) prob[v] = (float)(prob[v] / sum), order[v] = v;
    sort_prob = prob;
    qsort(order, (size_t)V, sizeof *order, by_prob_desc);
    int kept = 0;
    double mass = 0;
    while (kept < V && (kept == 0 || mass < top_p)) mass += prob[order[kept++]];
    double target = u * mass, acc = 0;
    for (int r = 0; r < kept; r++) {
        acc += prob[order[r]];
        if (target < acc) return order[r];
    }
    return order[kept - 1];
}

// ---- The scheduler.

// Logits the decoder may write in one call (floats): prompts beyond it wait a call.
enum { CALL_LOGITS = 1 << 26 };

typedef struct {
    int prompt;     // the prompt in this slot, -1: free
    int last_row;   // row of the call's logits holding its next token
    int32_t next;   // the token to feed at the next call (after the prompt)
    uint64_t rng;
} Slot;

static double uniform01(uint64_t *state) { return (double)(splitmix64(state) >> 11) * 0x1.0p-53; }

// Appends one token of slot s to the call being built.
static void call_push(int *n, int32_t *slot, int32_t *token, int32_t *pos, int s, int32_t t,
                      int32_t p) {
    slot[*n] = s, token[*n] = t, pos[*n] = p;
    (*n)++;
}

void generate(const DecodeOps *ops, const ModelConfig *cfg, const float *params,
              const GenerateOptions *opt, int32_t end_of_turn, const TokenSpan *prompts,
              int n_prompts, Generation *out, GenerateStats *stats) {
    const double start = now_seconds();
    *stats = (GenerateStats){0};
    memset(out, 0, (size_t)n_prompts * sizeof *out);
    if (n_prompts == 0) return;
    int max_prompt = 0;
    for (int i = 0; i < n_prompts; i++) {
        CHECK(prompts[i].n > 0, "generate: prompt %d is empty", i);
        max_prompt = prompts[i].n > max_prompt ? prompts[i].n : max_prompt;
        stats->prompt_tokens += prompts[i].n;
    }
    const int V = cfg->vocab_size, batch = opt->batch < n_prompts ? opt->batch : n_prompts;
    const int max_len = max_prompt + opt->max_new_tokens;
    const long long call_cap = CALL_LOGITS / V > 1 ? CALL_LOGITS / V : 1;
    // Rows of one call: the running sequences' tokens plus prompts up to the logits cap
    // (a prompt longer than that goes alone).
    long long prefill = call_cap < (long long)batch * max_prompt ? call_cap : (long long)batch * max_prompt;
    if (prefill < max_prompt) prefill = max_prompt;
    const int row_cap = (int)prefill + batch;
    void *dec = ops->create(cfg, params, batch, max_len);
    const int drawn = opt->vocab_limit > 0 && opt->vocab_limit < V ? opt->vocab_limit : V;
    Slot *slots = xmalloc((size_t)batch * sizeof *slots);
    for (int s = 0; s < batch; s++) slots[s].prompt = -1;
    int32_t *slot = xmalloc((size_t)row_cap * sizeof(int32_t));   // [row_cap] per call
    int32_t *token = xmalloc((size_t)row_cap * sizeof(int32_t));  // [row_cap]
    int32_t *pos = xmalloc((size_t)row_cap * sizeof(int32_t));    // [row_cap]
    float *logits = xmalloc((size_t)row_cap * V * sizeof(float)); // [row_cap, V]
    float *prob = xmalloc((size_t)V * sizeof(float));             // [V]
    int32_t *order = xmalloc((size_t)V * sizeof(int32_t));        // [V]
    int next_prompt = 0;
    for (;;) {
        int n = 0;
        for (int s = 0; s < batch; s++) {  // running sequences: their last token
            Slot *sl = &slots[s];
            if (sl->prompt < 0) continue;
            const Generation *g = &out[sl->prompt];
            call_push(&n, slot, token, pos, s, sl->next, prompts[sl->prompt].n + g->n - 1);
            sl->last_row = n - 1;
        }
        for (int s = 0; s < batch && next_prompt < n_prompts; s++) {  // free slots: a prompt
            const TokenSpan *p = &prompts[next_prompt];
            if (slots[s].prompt >= 0 || (n > 0 && n + p->n > row_cap)) continue;
            ops->reset(dec, s);
            uint64_t mix = opt->seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(next_prompt + 1));
            slots[s] = (Slot){.prompt = next_prompt, .rng = splitmix64(&mix)};
            out[next_prompt++].tokens = xmalloc((size_t)opt->max_new_tokens * sizeof(int32_t));
            for (int i = 0; i < p->n; i++) call_push(&n, slot, token, pos, s, p->ids[i], i);
            slots[s].last_row = n - 1;
        }
        if (n == 0) break;
        ops->forward(dec, n, slot, token, pos, logits);
        stats->forward_calls++;
        for (int s = 0; s < batch; s++) {
            Slot *sl = &slots[s];
            if (sl->prompt < 0) continue;
            Generation *g = &out[sl->prompt];
            const int32_t t = sample_token(logits + (size_t)sl->last_row * V, drawn, opt->temperature,
                                           opt->top_p, uniform01(&sl->rng), prob, order);
            g->tokens[g->n++] = t;
            stats->generated_tokens++;
            g->ended = t == end_of_turn;
            if (g->ended || g->n >= opt->max_new_tokens) sl->prompt = -1;
            else sl->next = t;
        }
    }
    ops->destroy(dec);
    free(slots), free(slot), free(token), free(pos), free(logits), free(prob), free(order);
    stats->seconds = now_seconds() - start;
}

void generation_free(Generation *g) {
    free(g->tokens);
    g->tokens = NULL;
    g->n = 0;
}

char *generation_text(const Tokenizer *tok, const Generation *g) {
    const int n = g->ended ? g->n - 1 : g->n;
    char *text = tokenizer_decode(tok, g->tokens, n);
    CHECK(text, "generated ids outside the tokenizer's %d pieces (vocab_limit draws below)",
          tokenizer_vocab_size(tok));
    return text;
}

void inference_model_load(const RunConfig *c, const char *command, InferenceModel *m) {
    const char *dir = c->model.init_from;
    if (!dir)
        fatal("train %s: config key 'model.init_from': the model to run is required (a run's "
              "checkpoint folder or a model folder)", command);
    m->tok = tokenizer_with_added(c);
    m->mc = model_config_with(c, m->tok);
    m->backend = backend_choose(c->backend, &m->mc, m->backend_why,
                                sizeof m->backend_why);
    param_table_build(&m->mc, &m->table);
    m->params = xmalloc(m->table.total * sizeof(float));
    params_load_or_init(&m->mc, &m->table, dir, 0, m->params);
    LoraConfig lc;
    if (lora_config_from(c, &lc) && c->lora.init_from) {  // base + adapter, merged
        LoraLayout l;
        lora_layout_build(&m->mc, &lc, &l);
        float *adapter = xmalloc(l.table.total * sizeof(float));
        char err[1024];
        if (peft_adapter_load(c->lora.init_from, &l, adapter, err, sizeof err))
            fatal("train %s: config key 'lora.init_from': %s", command, err);
        lora_merge(&l, &m->table, m->params, adapter);
        free(adapter);
        lora_layout_free(&l);
    }
}

void inference_model_free(InferenceModel *m) {
    free(m->params);
    param_table_free(&m->table);
    tokenizer_free(m->tok);
}
