// Held-out evaluation: the eval loss (conversations in the inference view (npass),
// packed and cut into micro-batches once, then a forward pass on the backend at every
// eval step) and the multi-turn accuracy of generated turns (`train eval`, and during
// training on eval.generate_conversations).
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include "data/batch.h"
#include "data/tokenizer.h"
#include "trainer/backend.h"
#include "trainer/generate.h"
#include "trainer/loader.h"

typedef struct {
    PackedDataset data;
    MicroBatches micro;
    float *losses;  // [n_rows, seq_len] per-position CE of the last run
    // The last run's answer loss split by the target's turn: the first turn, and later
    // turns (where option (a)'s history mismatch shows). NAN where there is none.
    double first_turn_answer_loss, later_turn_answer_loss;
} EvalSet;

// The samples of `path` under opt, with opt.layout replaced by npass; micro-batches
// of up to micro_rows rows.
void eval_set_load(EvalSet *eval, const Tokenizer *tok, const char *path, DataOptions opt,
                   int micro_rows);
// The eval set of n tokenized samples (owned from now on: samples[] malloc'd, freed with
// the set), laid out as npass under opt; micro-batches of up to micro_rows rows. name (the
// file they come from) prefixes errors.
void eval_set_from_samples(EvalSet *eval, TokenizedSample *samples, int n, const char *name,
                           DataOptions opt, int micro_rows);
void eval_set_free(EvalSet *eval);

// eval_loss: mean CE over every target (think + answer); eval_answer_loss: over targets
// that are answer tokens, i.e. whose target slot (the next slot of the npass doc) is
// ROLE_ANSWER. NAN where there is no such target.
void evaluate(const TrainBackendOps *ops, void *backend, EvalSet *eval, double *eval_loss,
              double *eval_answer_loss);
// evaluate on the samples of `path` under opt (eval_set_load) for the weights of m, on a
// backend of m's kind made for them (deterministic, micro-batches of micro_rows rows, the
// AdamW moments zero) and destroyed after.
// later_turn_answer_loss: EvalSet's, of turns after the first (may be NULL).
void evaluate_model(const InferenceModel *m, const char *path, DataOptions opt, int micro_rows,
                    double *eval_loss, double *eval_answer_loss, double *later_turn_answer_loss);

// ---- Multi-turn accuracy: every turn of every conversation generated from
// its inference view with the gold history (earlier thinking stripped) up to the
// assistant header, and its answer checked.

// One turn to generate and check.
typedef struct {
    TokenSpan prompt;    // the turn's inference view up to the assistant header
    int turn;            // 0-based turn index in its conversation
    const char *gold;    // the gold answer text (into the dataset)
    bool numeric;        // synthetic data: check the final number against `expected`
    long long expected;
} AccuracyItem;

typedef struct {
    Dataset data;
    AccuracyItem *items;
    int n_items, n_conversations;
    int n_shared_prefix;  // shared-prefix sets in the file: no turns to score, left out
    int n_too_long;       // turns left out: their prompt (or an earlier one's) over max_prompt_tokens
    const ChatTemplate *chat_template;  // NULL: onepass
} AccuracySet;

// The first max_conversations conversations of path (0: all), read under opt as every
// JSONL reader is (data_load_options: the line limit, skip_bad, ignore_unknown_keys),
// with its chat_template and special_in_text. Fatal, naming path:line, for a line that
// does not parse or tokenize. A turn whose generation prompt is longer than opt->seq_len
// (0: no limit) is left out with every later turn of its conversation (their prompts are
// longer still), counted in n_too_long: the prompts of a line of many turns cost at most
// seq_len each, never the whole line's square.
void accuracy_set_load(AccuracySet *a, const Tokenizer *tok, const DataOptions *opt,
                       const char *path, int max_conversations);
void accuracy_set_free(AccuracySet *a);

// The answer part of a generated text: what follows the first think_close, or the whole
// text when it has none (NULL when it opened a thinking block it never closed:
// think_open at its start). Leading and trailing whitespace are not part of it: the
// result points into text, *len is its length.
const char *answer_part(const char *text, const char *think_open, const char *think_close,
                        size_t *len);
// Whether a generated text answers right: synthetic (numeric) turns by the answer's last
// integer against expected, other turns by the answer text equal to gold (whitespace
// at either end aside).
bool answer_correct(const char *text, const GenerateTemplate *tmpl, const char *gold,
                    bool numeric, long long expected);

typedef struct {
    int n_conversations, n_turns, n_correct;
    int first_n, first_correct, later_n, later_correct;
    int n_indices;     // turn indices seen (max turn index + 1)
    int *per_turn_n;   // [n_indices]
    int *per_turn_correct;
    GenerateStats gen;
} AccuracyReport;

// Generates every item on ops (params: fp32 host weights) and scores it.
void accuracy_evaluate(const AccuracySet *a, const DecodeOps *ops, const ModelConfig *cfg,
                       const float *params, const GenerateOptions *opt, const Tokenizer *tok,
                       AccuracyReport *r);
void accuracy_report_free(AccuracyReport *r);
// correct / n, NAN for n == 0.
double accuracy_ratio(int correct, int n);
// The report as JSON: accuracy overall, first turn, later turns, per turn index, with
// the generation's tokens and time.
json_t *accuracy_report_json(const AccuracyReport *r);
