// The layouts (DESIGN.md §3). Every layout turns a tokenized sample into documents: one
// sequence each, with per-token records.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "data/token_columns.h"
#include "data/tokenize.h"

typedef enum {
    LAYOUT_NPASS = 0,
    LAYOUT_MASK_ONLY = 1,
    LAYOUT_DUPLICATE = 2,
    LAYOUT_SHARED_PREFIX = 3,
    LAYOUT_AS_RENDERED = 4,  // (i) the conversation as the template renders it, one pass
    LAYOUT_PRESERVE = 5,     // (ii) one pass with every turn's thinking visible and trained
} LayoutKind;

// Per-token role tag (packed-row "role" field). Padding is -1.
typedef enum {
    ROLE_PROMPT = 0,          // system/user text, headers; a shared prefix
    ROLE_THINK = 1,           // <think> … </think>
    ROLE_ANSWER = 2,          // the answer (for duplicate: the loss copy aA, or the only copy)
    ROLE_ANSWER_HISTORY = 3,  // duplicate only: the history copy aB (no loss)
} TokenRole;

// Which tokens of which turns are trained (data.train_on, data.skip_empty_think_turns).
// The zero value is the default: think and answer of every turn.
typedef enum { TRAIN_THINK_ANSWER = 0, TRAIN_ANSWER = 1 } TrainOn;
typedef struct {
    TrainOn train_on;       // TRAIN_ANSWER: only answer tokens are targets (the thinking is
                            // context): the position before the answer predicts its first token
    bool skip_empty_think;  // no target in a turn whose reasoning is absent or empty
} LossOptions;
// Parses "think_answer" | "answer"; -1 if unknown.
int train_on_from_name(const char *name);

// One layout sequence. lo/hi are relative to the document start: key k is visible
// to query q (both document indices) iff lo[k] <= q < hi[k].
typedef struct {
    int n;
    TOKEN_COLUMNS(DOC_COLUMN_MEMBER)  // [n] each: token, target, pos, lo, hi, turn, role
    int sample;  // index of the source sample
    int line;    // its line in the source file, for error messages
} Doc;

typedef struct {
    Doc *docs;
    int n_docs, cap;
} DocList;

// Parses "npass" | "mask_only" | "duplicate" | "shared_prefix" | "as_rendered" | "preserve";
// -1 if unknown.
int layout_from_name(const char *name);
const char *layout_name(LayoutKind kind);

// Appends the documents of one sample under a layout and loss options (NULL: the
// defaults). A turn (Doc.turn) is a user turn: the assistant messages that answer tool
// results continue it (DESIGN.md §8). Turns with no target keep only what later turns
// see; a sample with no target at all gives no document. Returns 0, or -1 with a
// location-free message when the layout does not apply (e.g. duplicate on a
// shared-prefix set); the caller names the sample's line.
int layout_sample(LayoutKind kind, const LossOptions *loss, const TokenizedSample *s,
                  int sample_index, DocList *out, char *err, size_t err_len);
// The number of tokens of the longest document layout_sample would append for s, counted
// from the spans without building anything (O(turns)); 0 when it would append none. Callers
// check it against seq_len before laying out, so no layout builds a document that cannot
// fit: npass's work is then at most one seq_len per user turn.
long long layout_longest_doc(LayoutKind kind, const LossOptions *loss, const TokenizedSample *s);
// (Re)allocates every column of d for cap tokens, keeping the first d->n.
void doc_reserve(Doc *d, int cap);
void doc_list_free(DocList *list);
