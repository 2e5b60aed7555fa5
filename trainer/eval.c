#define _POSIX_C_SOURCE 200809L  // strndup
#include "trainer/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/synthetic.h"

#include "common/check.h"
#include "trainer/backend_registry.h"
#include "trainer/step.h"

void eval_set_load(EvalSet *eval, const Tokenizer *tok, const char *path, DataOptions opt,
                   int micro_rows) {
    opt.layout = LAYOUT_NPASS;
    packed_dataset_load(tok, path, opt, &eval->data);
    micro_batches_build(&eval->data.rows, micro_rows, &eval->micro);
    eval->losses = xcalloc((size_t)eval->data.rows.n_rows * (size_t)opt.seq_len, sizeof(float));
}

void eval_set_from_samples(EvalSet *eval, TokenizedSample *samples, int n, const char *name,
                           DataOptions opt, int micro_rows) {
    memset(eval, 0, sizeof *eval);
    PackedDataset *d = &eval->data;
    d->samples = samples;
    d->n_samples = n;
    char why[1024];
    for (int i = 0; i < n; i++)
        if (layout_sample(LAYOUT_NPASS, &opt.loss, &samples[i], i, &d->docs, why, sizeof why) != 0)
            fatal("%s: held-out conversation %d: %s", name, i, why);
    if (pack_docs(&d->docs, opt.seq_len, opt.pack, &d->rows, &d->n_skipped_too_long, why, sizeof why) != 0)
        fatal("%s: held-out conversations: %s", name, why);
    micro_batches_build(&d->rows, micro_rows, &eval->micro);
    eval->losses = xcalloc((size_t)d->rows.n_rows * (size_t)opt.seq_len, sizeof(float));
}

void eval_set_free(EvalSet *eval) {
    micro_batches_free(&eval->micro);
    packed_dataset_free(&eval->data);
    free(eval->losses);
}

void evaluate(const TrainBackendOps *ops, void *backend, EvalSet *eval, double *eval_loss,
              double *eval_answer_loss) {
    const PackedRows *rows = &eval->data.rows;
    train_step_forward(ops, backend, &eval->micro, eval->losses);
    double all = 0, answer = 0, by_turn[2] = {0, 0};
    long long n_all = 0, n_answer = 0, n_by_turn[2] = {0, 0};
    for (int r = 0; r < rows->n_rows; r++) {
        for (int i = 0; i + 1 < rows->seq_len; i++) {
            size_t slot = (size_t)r * (size_t)rows->seq_len + (size_t)i;
            if (rows->target[slot] == -1) continue;
            all += eval->losses[slot];
            n_all++;
            if (rows->role[slot + 1] == ROLE_ANSWER) {
                answer += eval->losses[slot];
                n_answer++;
                const int later = rows->turn[slot + 1] > 0;
                by_turn[later] += eval->losses[slot];
                n_by_turn[later]++;
            }
        }
    }
    *eval_loss = n_all ? all / (double)n_all : NAN;
    *eval_answer_loss = n_answer ? answer / (double)n_answer : NAN;
    eval->first_turn_answer_loss = n_by_turn[0] ? by_turn[0] / (double)n_by_turn[0] : NAN;
    eval->later_turn_answer_loss = n_by_turn[1] ? by_turn[1] / (double)n_by_turn[1] : NAN;
}

void evaluate_model(const InferenceModel *m, const char *path, DataOptions opt, int micro_rows,
                    double *eval_loss, double *eval_answer_loss, double *later_turn_answer_loss) {
    const TrainBackendOps *ops = backend_ops(m->backend);
    EvalSet eval;
    eval_set_load(&eval, m->tok, path, opt, micro_rows);
    // Forward only: one layer block serves every layer (the forward's work and bits are
    // the same in every recompute mode; its memory the least).
    const BackendSetup setup = {.mc = &m->mc, .table = &m->table, .micro_rows = micro_rows,
                                .seq_len = opt.seq_len, .deterministic = true,
                                .recompute = MODEL_RECOMPUTE_LAYER};
    void *backend = ops->create(&setup);
    AdamWState moments;
    adamw_init(&moments, m->table.total);
    ops->set_state(backend, m->params, &moments);
    evaluate(ops, backend, &eval, eval_loss, eval_answer_loss);
    if (later_turn_answer_loss) *later_turn_answer_loss = eval.later_turn_answer_loss;
    ops->destroy(backend);
    adamw_free(&moments);
    eval_set_free(&eval);
}

// ---- Multi-turn accuracy.

// The turns scored from message `from` on: assistant messages right after a user message.
static int turns_from(const Sample *s, int from) {
    int n = 0;
    for (int m = from > 0 ? from : 1; m < s->n_messages; m++)
        n += s->messages[m].role == MSG_ASSISTANT && s->messages[m - 1].role == MSG_USER;
    return n;
}

void accuracy_set_load(AccuracySet *a, const Tokenizer *tok, const DataOptions *opt,
                       const char *path, int max_conversations) {
    memset(a, 0, sizeof *a);
    const int max_prompt_tokens = opt->seq_len;  // 0: no limit
    const ChatTemplate *t = a->chat_template = opt->chat_template;
    const SpecialInText special_in_text = opt->special_in_text;
    const LoadOptions load = data_load_options(opt);
    dataset_load(path, &load, &a->data);
    int cap = 0;
    char err[1024];
    for (int c = 0; c < a->data.n_samples; c++) {
        if (max_conversations > 0 && a->n_conversations == max_conversations) break;
        Sample *s = &a->data.samples[c];
        if (s->kind != SAMPLE_CONVERSATION) {
            a->n_shared_prefix++;
            continue;
        }
        long long *results = xmalloc((size_t)(s->n_messages + 1) * sizeof(long long));
        const bool numeric =
            synthetic_expected_results(s->messages, s->n_messages, results, s->n_messages) > 0;
        int turn = 0, asked = 0;
        for (int m = 0; m < s->n_messages; m++) {
            asked += s->messages[m].role == MSG_USER;
            if (s->messages[m].role != MSG_ASSISTANT) continue;
            // A reply after tool results continues its user turn: its prompt would end with
            // the results, and a generation prompt ends with a user message. Only each user
            // turn's first reply is scored.
            if (s->messages[m - 1].role != MSG_USER) continue;
            // The conversation up to this reply is the prompt of a conversation.
            Sample upto = *s;
            upto.n_messages = m;
            AccuracyItem item = {.turn = turn++, .gold = s->messages[m].content ? s->messages[m].content : "",
                                 .numeric = numeric && asked > 0,
                                 .expected = asked > 0 ? results[asked - 1] : 0};
            if (generate_prompt(tok, t, &upto, special_in_text, &item.prompt, err, sizeof err) != 0)
                fatal("%s:%d: messages[%d]: %s", path, s->line, m, err);
            if (max_prompt_tokens > 0 && item.prompt.n > max_prompt_tokens) {
                free(item.prompt.ids);
                turn--;
                a->n_too_long += turns_from(s, m);
                break;
            }
            ARRAY_PUSH(a->items, a->n_items, cap, item);
        }
        free(results);
        a->n_conversations += turn > 0;
    }
}

void accuracy_set_free(AccuracySet *a) {
    for (int i = 0; i < a->n_items; i++) free(a->items[i].prompt.ids);
    free(a->items);
    dataset_free(&a->data);
    memset(a, 0, sizeof *a);
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// text[0..len) without whitespace at either end: the start, *len updated.
static const char *trim(const char *text, size_t *len) {
    while (*len > 0 && is_space(*text)) text++, (*len)--;
    while (*len > 0 && is_space(text[*len - 1])) (*len)--;
    return text;
}

const char *answer_part(const char *text, const char *think_open, const char *think_close,
                        size_t *len) {
    const char *close = strstr(text, think_close);
    const char *start = close ? close + strlen(think_close) : text;
    *len = strlen(start);
    start = trim(start, len);
    if (!close && strncmp(start, think_open, strlen(think_open)) == 0) return NULL;
    return start;
}

bool answer_correct(const char *text, const GenerateTemplate *tmpl, const char *gold,
                    bool numeric, long long expected) {
    size_t len;
    const char *answer = answer_part(text, tmpl->think_open, tmpl->think_close, &len);
    if (!answer) return false;
    char *copy = strndup(answer, len);
    size_t gold_len = strlen(gold);
    const char *g = trim(gold, &gold_len);
    const bool ok = numeric ? synthetic_check_answer(copy, expected)
                            : len == gold_len && memcmp(copy, g, len) == 0;
    free(copy);
    return ok;
}

double accuracy_ratio(int correct, int n) { return n ? (double)correct / n : NAN; }

void accuracy_evaluate(const AccuracySet *a, const DecodeOps *ops, const ModelConfig *cfg,
                       const float *params, const GenerateOptions *opt, const Tokenizer *tok,
                       AccuracyReport *r) {
    memset(r, 0, sizeof *r);
    r->n_conversations = a->n_conversations;
    const GenerateTemplate tmpl = generate_template(tok, a->chat_template);
    TokenSpan *prompts = xmalloc(((size_t)a->n_items + 1) * sizeof *prompts);
    for (int i = 0; i < a->n_items; i++) {
        prompts[i] = a->items[i].prompt;
        r->n_indices = a->items[i].turn + 1 > r->n_indices ? a->items[i].turn + 1 : r->n_indices;
    }
    Generation *gens = xcalloc((size_t)a->n_items + 1, sizeof *gens);
    generate(ops, cfg, params, opt, tmpl.end_of_turn, prompts, a->n_items, gens, &r->gen);
    r->per_turn_n = xcalloc((size_t)r->n_indices + 1, sizeof(int));
    r->per_turn_correct = xcalloc((size_t)r->n_indices + 1, sizeof(int));
    for (int i = 0; i < a->n_items; i++) {
        const AccuracyItem *it = &a->items[i];
        char *text = generation_text(tok, &gens[i]);
        const bool ok = answer_correct(text, &tmpl, it->gold, it->numeric, it->expected);
        free(text);
        generation_free(&gens[i]);
        r->n_turns++, r->n_correct += ok;
        r->per_turn_n[it->turn]++, r->per_turn_correct[it->turn] += ok;
        if (it->turn == 0) r->first_n++, r->first_correct += ok;
        else r->later_n++, r->later_correct += ok;
    }
    free(gens);
    free(prompts);
}

void accuracy_report_free(AccuracyReport *r) {
    free(r->per_turn_n);
    free(r->per_turn_correct);
    memset(r, 0, sizeof *r);
}

// A ratio as JSON: null for none (JSON has no NaN).
static json_t *json_ratio(int correct, int n) {
    return n ? json_real(accuracy_ratio(correct, n)) : json_null();
}

json_t *accuracy_report_json(const AccuracyReport *r) {
    json_t *per_turn = json_array();
    for (int t = 0; t < r->n_indices; t++)
        json_array_append_new(per_turn, json_pack("{s:i, s:i, s:i, s:o}", "turn", t + 1, "n",
                                                  r->per_turn_n[t], "correct",
                                                  r->per_turn_correct[t], "accuracy",
                                                  json_ratio(r->per_turn_correct[t], r->per_turn_n[t])));
    const double tps = r->gen.seconds > 0 ? (double)r->gen.generated_tokens / r->gen.seconds : 0;
    return json_pack("{s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:I, s:I, s:f, s:f}", "conversations",
                     r->n_conversations, "turns", r->n_turns, "correct", r->n_correct,
                     "accuracy", json_ratio(r->n_correct, r->n_turns), "first_turn_accuracy",
                     json_ratio(r->first_correct, r->first_n), "later_turn_accuracy",
                     json_ratio(r->later_correct, r->later_n), "per_turn", per_turn,
                     "prompt_tokens", (json_int_t)r->gen.prompt_tokens, "generated_tokens",
                     (json_int_t)r->gen.generated_tokens, "generate_seconds", r->gen.seconds,
                     "generated_tokens_per_s", tps);
}
