// The four layouts (DESIGN.md §3): one tokenized sample becomes documents, one sequence
// each with per-token records; layout_sample is the one place that picks the layout.
#include "data/layout.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

static const char *const LAYOUT_NAMES[] = {"npass", "mask_only", "duplicate", "shared_prefix"};

int layout_from_name(const char *name) {
    for (int i = 0; i < (int)(sizeof LAYOUT_NAMES / sizeof *LAYOUT_NAMES); i++)
        if (name && strcmp(name, LAYOUT_NAMES[i]) == 0) return i;
    return -1;
}

const char *layout_name(LayoutKind kind) {
    if ((int)kind < 0 || (int)kind >= (int)(sizeof LAYOUT_NAMES / sizeof *LAYOUT_NAMES))
        return "unknown";
    return LAYOUT_NAMES[kind];
}

// A document under construction. hi = -1 marks "document end", resolved on finish.
typedef struct {
    Doc doc;
    int cap;
} DocBuilder;

static void builder_reserve(DocBuilder *b, int extra) {
    if (b->doc.n + extra <= b->cap) return;
    b->cap = 2 * (b->doc.n + extra);
    doc_reserve(&b->doc, b->cap);
}

// Appends a span at positions pos0, pos0+1, …; returns the index of its first token.
// Causal (lo = own index), visible to the document end until narrowed, no loss.
static int push_span(DocBuilder *b, const int32_t *ids, int n, int pos0, int turn, TokenRole role) {
    builder_reserve(b, n);
    int start = b->doc.n;
    for (int i = 0; i < n; i++) {
        int k = start + i;
        b->doc.token[k] = ids[i];
        b->doc.target[k] = -1;
        b->doc.pos[k] = pos0 + i;
        b->doc.lo[k] = k;
        b->doc.hi[k] = -1;
        b->doc.turn[k] = turn;
        b->doc.role[k] = role;
    }
    b->doc.n += n;
    return start;
}

static void set_hi(DocBuilder *b, int from, int to, int hi) {
    for (int k = from; k < to; k++) b->doc.hi[k] = hi;
}

// Trains [first, end): each position predicts the next slot, which in every layout
// is the next token of its own view within "last prompt token, think, answer".
// The last token (end-of-turn) has no target.
static void train_range(DocBuilder *b, int first, int end) {
    for (int k = first; k + 1 < end; k++) b->doc.target[k] = b->doc.token[k + 1];
}

static void finish_doc(DocBuilder *b, int sample_index, int line, DocList *out) {
    for (int k = 0; k < b->doc.n; k++)
        if (b->doc.hi[k] < 0) b->doc.hi[k] = b->doc.n;
    b->doc.sample = sample_index;
    b->doc.line = line;
    ARRAY_PUSH(out->docs, out->n_docs, out->cap, b->doc);
    memset(b, 0, sizeof *b);
}

// Appends turn t's trained part (prompt end, think, answer) as seen in its inference
// view, with the prompt at position pos0; returns the position after the answer.
static int push_trained_turn(DocBuilder *b, const TurnTokens *turn, int t, int pos0) {
    int p = push_span(b, turn->prompt.ids, turn->prompt.n, pos0, t, ROLE_PROMPT);
    pos0 += turn->prompt.n;
    push_span(b, turn->think.ids, turn->think.n, pos0, t, ROLE_THINK);
    pos0 += turn->think.n;
    push_span(b, turn->answer.ids, turn->answer.n, pos0, t, ROLE_ANSWER);
    train_range(b, p + turn->prompt.n - 1, b->doc.n);
    return pos0 + turn->answer.n;
}

static void layout_npass_conversation(const TokenizedSample *s, int sample_index, DocList *out) {
    for (int t = 0; t < s->n_turns; t++) {
        DocBuilder b = {0};  // positions = indices: the inference view of turn t
        for (int h = 0; h < t; h++) {
            push_span(&b, s->turns[h].prompt.ids, s->turns[h].prompt.n, b.doc.n, h, ROLE_PROMPT);
            push_span(&b, s->turns[h].answer.ids, s->turns[h].answer.n, b.doc.n, h, ROLE_ANSWER);
        }
        push_trained_turn(&b, &s->turns[t], t, b.doc.n);
        finish_doc(&b, sample_index, s->line, out);
    }
}

static void layout_mask_only(const TokenizedSample *s, int sample_index, DocList *out) {
    DocBuilder b = {0};
    for (int t = 0; t < s->n_turns; t++) {
        int think_start = b.doc.n + s->turns[t].prompt.n;
        push_trained_turn(&b, &s->turns[t], t, b.doc.n);
        // Later turns must not see this thinking: visible only up to the answer's end.
        set_hi(&b, think_start, think_start + s->turns[t].think.n, b.doc.n);
    }
    finish_doc(&b, sample_index, s->line, out);
}

static void layout_duplicate(const TokenizedSample *s, int sample_index, DocList *out) {
    DocBuilder b = {0};
    int context = 0;  // c_t = Σ_{i<t} (|p_i| + |a_i|): where p_t sits in its inference view
    for (int t = 0; t < s->n_turns; t++) {
        const TurnTokens *turn = &s->turns[t];
        int think_start = b.doc.n + turn->prompt.n;
        push_trained_turn(&b, turn, t, context);
        if (turn->think.n > 0 && t + 1 < s->n_turns) {
            // History copy aB: positions restart right after p_t; th_t and aA_t stop
            // being visible where aB starts, so aB and everything later see p_t aB_t.
            set_hi(&b, think_start, b.doc.n, b.doc.n);
            push_span(&b, turn->answer.ids, turn->answer.n, context + turn->prompt.n, t,
                      ROLE_ANSWER_HISTORY);
        }
        context += turn->prompt.n + turn->answer.n;
    }
    finish_doc(&b, sample_index, s->line, out);
}

static void layout_npass_shared_prefix(const TokenizedSample *s, int sample_index,
                                       DocList *out) {
    for (int i = 0; i < s->n_turns; i++) {
        DocBuilder b = {0};
        push_span(&b, s->prefix.ids, s->prefix.n, 0, 0, ROLE_PROMPT);
        int first = b.doc.n - 1;
        push_span(&b, s->turns[i].think.ids, s->turns[i].think.n, b.doc.n, i + 1, ROLE_THINK);
        push_span(&b, s->turns[i].answer.ids, s->turns[i].answer.n, b.doc.n, i + 1, ROLE_ANSWER);
        train_range(&b, first, b.doc.n);
        finish_doc(&b, sample_index, s->line, out);
    }
}

static void layout_shared_prefix(const TokenizedSample *s, int sample_index, DocList *out) {
    DocBuilder b = {0};
    int last = s->prefix.n - 1;  // P[-1] is repeated at the head of every block
    push_span(&b, s->prefix.ids, last, 0, 0, ROLE_PROMPT);
    for (int i = 0; i < s->n_turns; i++) {
        const TurnTokens *c = &s->turns[i];
        int block = push_span(&b, &s->prefix.ids[last], 1, last, i + 1, ROLE_PROMPT);
        push_span(&b, c->think.ids, c->think.n, last + 1, i + 1, ROLE_THINK);
        push_span(&b, c->answer.ids, c->answer.n, last + 1 + c->think.n, i + 1, ROLE_ANSWER);
        train_range(&b, block, b.doc.n);
        set_hi(&b, block, b.doc.n, b.doc.n);  // a block is seen only by itself
    }
    finish_doc(&b, sample_index, s->line, out);
}

// Every layout trains "last prompt token → first think/answer token", so each turn
// needs a non-empty prompt (or prefix) and an answer (at least the end-of-turn).
static int check_spans(const TokenizedSample *s, char *err, size_t err_len) {
    if (s->n_turns == 0) return fail(err, err_len, "sample has no turn");
    if (s->kind == SAMPLE_SHARED_PREFIX && s->prefix.n == 0)
        return fail(err, err_len, "shared prefix is empty");
    for (int t = 0; t < s->n_turns; t++) {
        if ((s->kind == SAMPLE_CONVERSATION && s->turns[t].prompt.n == 0) ||
            s->turns[t].answer.n == 0)
            return fail(err, err_len, "turn %d has an empty %s", t,
                        s->turns[t].answer.n == 0 ? "answer" : "prompt");
    }
    return 0;
}

int layout_sample(LayoutKind kind, const TokenizedSample *s, int sample_index, DocList *out,
                  char *err, size_t err_len) {
    if (check_spans(s, err, err_len) != 0) return -1;
    bool shared = s->kind == SAMPLE_SHARED_PREFIX;
    // npass applies to both kinds of sample, every other layout to one.
    if (kind != LAYOUT_NPASS && shared != (kind == LAYOUT_SHARED_PREFIX))
        return fail(err, err_len, "layout %s does not apply to a %s", layout_name(kind),
                    shared ? "shared-prefix set" : "conversation");
    switch (kind) {
    case LAYOUT_NPASS:
        if (shared) layout_npass_shared_prefix(s, sample_index, out);
        else layout_npass_conversation(s, sample_index, out);
        return 0;
    case LAYOUT_MASK_ONLY: layout_mask_only(s, sample_index, out); return 0;
    case LAYOUT_DUPLICATE: layout_duplicate(s, sample_index, out); return 0;
    case LAYOUT_SHARED_PREFIX: layout_shared_prefix(s, sample_index, out); return 0;
    }
    return fail(err, err_len, "unknown layout %d", (int)kind);
}

void doc_reserve(Doc *d, int cap) {
#define RESERVE_COLUMN(field, json_name, holders, ...) \
    IF_IN_DOC_##holders(d->field = xrealloc(d->field, (size_t)cap * sizeof(int32_t));)
    TOKEN_COLUMNS(RESERVE_COLUMN)
#undef RESERVE_COLUMN
}

void doc_list_free(DocList *list) {
    for (int i = 0; i < list->n_docs; i++) {
#define FREE_COLUMN(field, json_name, holders, ...) IF_IN_DOC_##holders(free(list->docs[i].field);)
        TOKEN_COLUMNS(FREE_COLUMN)
#undef FREE_COLUMN
    }
    free(list->docs);
    memset(list, 0, sizeof *list);
}
