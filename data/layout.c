// The layouts (DESIGN.md §3): one tokenized sample becomes documents, one sequence each
// with per-token records; layout_sample is the one place that picks the layout.
#include "data/layout.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

static const char *const LAYOUT_NAMES[] = {"npass",         "mask_only",   "duplicate",
                                           "shared_prefix", "as_rendered", "preserve"};

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

static void finish_doc(DocBuilder *b, int sample_index, int line, DocList *out) {
    for (int k = 0; k < b->doc.n; k++)
        if (b->doc.hi[k] < 0) b->doc.hi[k] = b->doc.n;
    b->doc.sample = sample_index;
    b->doc.line = line;
    ARRAY_PUSH(out->docs, out->n_docs, out->cap, b->doc);
    memset(b, 0, sizeof *b);
}

int train_on_from_name(const char *name) {
    if (name && strcmp(name, "think_answer") == 0) return TRAIN_THINK_ANSWER;
    if (name && strcmp(name, "answer") == 0) return TRAIN_ANSWER;
    return -1;
}

static bool turn_trained(const TurnTokens *t, const LossOptions *loss) {
    return !t->context && !(loss->skip_empty_think && t->empty_think);
}

// Index after the last message of the user turn that starts at message `first`.
static int turn_end(const TokenizedSample *s, int first) {
    int end = first + 1;
    while (end < s->n_turns && s->turns[end].continues) end++;
    return end;
}

// Trains [first, end): each position predicts the next slot, which in every layout
// is the next token of its own view within "last prompt token, think, answer"; under
// TRAIN_ANSWER only the positions that predict an answer token. The last token
// (end-of-turn) has no target.
static void train_range(DocBuilder *b, int first, int end, const LossOptions *loss) {
    for (int k = first; k + 1 < end; k++)
        if (loss->train_on != TRAIN_ANSWER || b->doc.role[k + 1] != ROLE_THINK)
            b->doc.target[k] = b->doc.token[k + 1];
}

// Appends message m (prompt, think unless with_think is false, answer) at positions
// from pos0, tagged with user turn `turn`; its think and answer are trained when
// `trained`. Returns the position after the answer.
static int push_message(DocBuilder *b, const TurnTokens *m, int turn, int pos0, bool with_think,
                        bool trained, const LossOptions *loss) {
    int p = push_span(b, m->prompt.ids, m->prompt.n, pos0, turn, ROLE_PROMPT);
    pos0 += m->prompt.n;
    if (with_think) {
        push_span(b, m->think.ids, m->think.n, pos0, turn, ROLE_THINK);
        pos0 += m->think.n;
    }
    push_span(b, m->answer.ids, m->answer.n, pos0, turn, ROLE_ANSWER);
    if (trained) train_range(b, p + m->prompt.n - 1, b->doc.n, loss);
    return pos0 + m->answer.n;
}

// npass: one document per user turn (a run of continuing messages) with a target: the
// inference view of its last trained message (earlier user turns without their
// reasoning, the turn as it is, up to that message), every message of the turn in it
// trained. The view of each earlier message of the turn is a prefix of it, so one causal
// pass trains them all in their own views (DESIGN.md §3, §8).
static void layout_npass_conversation(const TokenizedSample *s, const LossOptions *loss,
                                      int sample_index, DocList *out) {
    for (int first = 0, turn = 0; first < s->n_turns; turn++) {
        const int end = turn_end(s, first);
        int last = -1;  // the turn's last trained message
        for (int t = first; t < end; t++)
            if (turn_trained(&s->turns[t], loss)) last = t;
        if (last >= 0) {
            DocBuilder b = {0};  // positions = indices
            for (int h = 0, ht = -1; h <= last; h++) {
                ht += !s->turns[h].continues;
                push_message(&b, &s->turns[h], ht, b.doc.n, h >= first,
                             h >= first && turn_trained(&s->turns[h], loss), loss);
            }
            finish_doc(&b, sample_index, s->line, out);
        }
        first = end;
    }
}

// mask_only: every message in order; a user turn's thinking is visible up to the end of
// that turn, never to later turns.
static void layout_mask_only(const TokenizedSample *s, const LossOptions *loss, int sample_index,
                             DocList *out) {
    DocBuilder b = {0};
    for (int first = 0, turn = 0; first < s->n_turns; turn++) {
        const int end = turn_end(s, first);
        int *think_at = xmalloc((size_t)(end - first) * sizeof(int));  // [messages of the turn]
        for (int t = first; t < end; t++) {
            think_at[t - first] = b.doc.n + s->turns[t].prompt.n;
            push_message(&b, &s->turns[t], turn, b.doc.n, true, turn_trained(&s->turns[t], loss),
                         loss);
        }
        for (int t = first; t < end; t++)
            set_hi(&b, think_at[t - first], think_at[t - first] + s->turns[t].think.n, b.doc.n);
        free(think_at);
        first = end;
    }
    finish_doc(&b, sample_index, s->line, out);
}

// duplicate (DESIGN.md §3, §8 "Layout (b) with tools"): per user turn, its first prompt,
// then its messages with their reasoning (the loss copy), then a history copy of all
// after the first prompt except the reasoning, positions restarting right after that
// prompt; later turns see the history copy only. A turn without reasoning, and the last
// turn, have only the one copy; a turn with no target only the history form.
static void layout_duplicate(const TokenizedSample *s, const LossOptions *loss, int sample_index,
                             DocList *out) {
    DocBuilder b = {0};
    int context = 0;  // c_t = Σ_{i<t} (prompts and answers of user turn i): where turn t starts
    for (int first = 0, turn = 0; first < s->n_turns; turn++) {
        const int end = turn_end(s, first);
        bool trained = false, thinks = false;
        for (int t = first; t < end; t++) {
            trained |= turn_trained(&s->turns[t], loss);
            thinks |= s->turns[t].think.n > 0;
        }
        const bool two_copies = trained && thinks && end < s->n_turns;
        const int loss_copy = b.doc.n + s->turns[first].prompt.n;
        int pos = context;
        for (int t = first; t < end; t++)
            pos = push_message(&b, &s->turns[t], turn, pos, trained, turn_trained(&s->turns[t], loss),
                               loss);
        if (two_copies) {
            // th, aA and the tool results of the loss copy stop being visible where the
            // history copy starts, so it and everything later see the stripped turn.
            set_hi(&b, loss_copy, b.doc.n, b.doc.n);
            pos = context + s->turns[first].prompt.n;
            for (int t = first; t < end; t++) {
                const TurnTokens *m = &s->turns[t];
                if (t > first) {
                    push_span(&b, m->prompt.ids, m->prompt.n, pos, turn, ROLE_PROMPT);
                    pos += m->prompt.n;
                }
                push_span(&b, m->answer.ids, m->answer.n, pos, turn, ROLE_ANSWER_HISTORY);
                pos += m->answer.n;
            }
        }
        for (int t = first; t < end; t++)
            context += s->turns[t].prompt.n + s->turns[t].answer.n;
        first = end;
    }
    finish_doc(&b, sample_index, s->line, out);
}

// The first message of the conversation's last user turn.
static int last_turn_start(const TokenizedSample *s) {
    int first = s->n_turns - 1;
    while (first > 0 && s->turns[first].continues) first--;
    return first;
}

// as_rendered, (i): the whole conversation as the template renders it (npass's view of the
// last user turn), one causal pass, every trained message trained in it. An earlier turn's
// answer is trained without its own reasoning in context, and its reasoning is not trained
// at all: inexact wherever an earlier turn has reasoning.
// preserve, (ii): one causal pass with every turn's reasoning visible and trained, which the
// inference view never shows of an earlier turn: inexact wherever a later turn sees it.
static void layout_one_pass(const TokenizedSample *s, const LossOptions *loss, int sample_index,
                            bool keep_history_thinking, DocList *out) {
    DocBuilder b = {0};
    const int last = last_turn_start(s);
    for (int t = 0, turn = -1; t < s->n_turns; t++) {
        turn += !s->turns[t].continues;
        push_message(&b, &s->turns[t], turn, b.doc.n, keep_history_thinking || t >= last,
                     turn_trained(&s->turns[t], loss), loss);
    }
    finish_doc(&b, sample_index, s->line, out);
}

static void layout_npass_shared_prefix(const TokenizedSample *s, const LossOptions *loss,
                                       int sample_index, DocList *out) {
    for (int i = 0; i < s->n_turns; i++) {
        if (!turn_trained(&s->turns[i], loss)) continue;
        DocBuilder b = {0};
        push_span(&b, s->prefix.ids, s->prefix.n, 0, 0, ROLE_PROMPT);
        int first = b.doc.n - 1;
        push_span(&b, s->turns[i].think.ids, s->turns[i].think.n, b.doc.n, i + 1, ROLE_THINK);
        push_span(&b, s->turns[i].answer.ids, s->turns[i].answer.n, b.doc.n, i + 1, ROLE_ANSWER);
        train_range(&b, first, b.doc.n, loss);
        finish_doc(&b, sample_index, s->line, out);
    }
}

static void layout_shared_prefix(const TokenizedSample *s, const LossOptions *loss,
                                 int sample_index, DocList *out) {
    DocBuilder b = {0};
    int last = s->prefix.n - 1;  // P[-1] is repeated at the head of every block
    push_span(&b, s->prefix.ids, last, 0, 0, ROLE_PROMPT);
    for (int i = 0; i < s->n_turns; i++) {
        const TurnTokens *c = &s->turns[i];
        if (!turn_trained(c, loss)) continue;  // a block is seen only by itself
        int block = push_span(&b, &s->prefix.ids[last], 1, last, i + 1, ROLE_PROMPT);
        push_span(&b, c->think.ids, c->think.n, last + 1, i + 1, ROLE_THINK);
        push_span(&b, c->answer.ids, c->answer.n, last + 1 + c->think.n, i + 1, ROLE_ANSWER);
        train_range(&b, block, b.doc.n, loss);
        set_hi(&b, block, b.doc.n, b.doc.n);
    }
    finish_doc(&b, sample_index, s->line, out);
}

// Every layout trains "last prompt token → first think/answer token", so each turn
// needs a non-empty prompt (or prefix) and an answer (at least the end-of-turn).
static int check_spans(const TokenizedSample *s, char *err, size_t err_len) {
    if (s->n_turns == 0) return fail(err, err_len, "sample has no turn");
    if (s->kind == SAMPLE_SHARED_PREFIX && s->prefix.n == 0)
        return fail(err, err_len, "shared prefix is empty");
    if (s->turns[0].continues) return fail(err, err_len, "the first message continues no turn");
    for (int t = 0; t < s->n_turns; t++) {
        if ((s->kind == SAMPLE_CONVERSATION && s->turns[t].prompt.n == 0) ||
            s->turns[t].answer.n == 0)
            return fail(err, err_len, "turn %d has an empty %s", t,
                        s->turns[t].answer.n == 0 ? "answer" : "prompt");
    }
    return 0;
}

static int span_sum(const TurnTokens *m, bool with_think) {
    return m->prompt.n + (with_think ? m->think.n : 0) + m->answer.n;
}

// Mirrors the layouts above, counting instead of building.
long long layout_longest_doc(LayoutKind kind, const LossOptions *loss, const TokenizedSample *s) {
    static const LossOptions defaults = {0};
    if (!loss) loss = &defaults;
    bool any_trained = false;
    for (int t = 0; t < s->n_turns; t++) any_trained |= turn_trained(&s->turns[t], loss);
    if (!any_trained) return 0;
    long long longest = 0, n = 0;
    if (s->kind == SAMPLE_SHARED_PREFIX) {
        if (kind == LAYOUT_SHARED_PREFIX) n = s->prefix.n - 1;
        for (int i = 0; i < s->n_turns; i++) {
            if (!turn_trained(&s->turns[i], loss)) continue;
            const long long completion = s->turns[i].think.n + s->turns[i].answer.n;
            if (kind == LAYOUT_SHARED_PREFIX) n += 1 + completion;
            else if (s->prefix.n + completion > longest) longest = s->prefix.n + completion;
        }
        return kind == LAYOUT_SHARED_PREFIX ? n : longest;
    }
    if (kind == LAYOUT_AS_RENDERED || kind == LAYOUT_PRESERVE) {
        const int last = last_turn_start(s);
        for (int t = 0; t < s->n_turns; t++)
            n += span_sum(&s->turns[t], kind == LAYOUT_PRESERVE || t >= last);
        return n;
    }
    long long stripped = 0;  // the earlier user turns without reasoning
    for (int first = 0; first < s->n_turns;) {
        const int end = turn_end(s, first);
        int last = -1;
        bool thinks = false;
        for (int t = first; t < end; t++) {
            if (turn_trained(&s->turns[t], loss)) last = t;
            thinks |= s->turns[t].think.n > 0;
        }
        long long whole = 0, history = 0;  // the turn with its reasoning; its history copy
        for (int t = first; t < end; t++) {
            if (kind == LAYOUT_NPASS && t == last + 1) break;
            whole += span_sum(&s->turns[t], kind == LAYOUT_MASK_ONLY || last >= 0);
            history += span_sum(&s->turns[t], false);
        }
        if (kind == LAYOUT_NPASS && last >= 0 && stripped + whole > longest) longest = stripped + whole;
        if (kind == LAYOUT_DUPLICATE && last >= 0 && thinks && end < s->n_turns)
            n += history - s->turns[first].prompt.n;  // the history copy
        n += whole;
        for (int t = first; t < end; t++) stripped += span_sum(&s->turns[t], false);
        first = end;
    }
    return kind == LAYOUT_NPASS ? longest : n;
}

int layout_sample(LayoutKind kind, const LossOptions *loss, const TokenizedSample *s,
                  int sample_index, DocList *out, char *err, size_t err_len) {
    static const LossOptions defaults = {0};
    if (!loss) loss = &defaults;
    if (check_spans(s, err, err_len) != 0) return -1;
    bool shared = s->kind == SAMPLE_SHARED_PREFIX;
    // npass applies to both kinds of sample, every other layout to one.
    if (kind != LAYOUT_NPASS && shared != (kind == LAYOUT_SHARED_PREFIX))
        return fail(err, err_len, "layout %s does not apply to a %s", layout_name(kind),
                    shared ? "shared-prefix set" : "conversation");
    bool any_trained = false;
    for (int t = 0; t < s->n_turns; t++) any_trained |= turn_trained(&s->turns[t], loss);
    if (!any_trained) return 0;
    switch (kind) {
    case LAYOUT_NPASS:
        if (shared) layout_npass_shared_prefix(s, loss, sample_index, out);
        else layout_npass_conversation(s, loss, sample_index, out);
        return 0;
    case LAYOUT_MASK_ONLY: layout_mask_only(s, loss, sample_index, out); return 0;
    case LAYOUT_DUPLICATE: layout_duplicate(s, loss, sample_index, out); return 0;
    case LAYOUT_SHARED_PREFIX: layout_shared_prefix(s, loss, sample_index, out); return 0;
    case LAYOUT_AS_RENDERED: layout_one_pass(s, loss, sample_index, false, out); return 0;
    case LAYOUT_PRESERVE: layout_one_pass(s, loss, sample_index, true, out); return 0;
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
