// Tokenization of parsed samples with a chat template (DESIGN.md §2, §8).
//
// data/template.c renders each segment as pieces: control tokens and text runs. Each piece
// is encoded on its own and the ids concatenated: a control token through the tokenizer's
// own matching (one id, checked at load by template_check_tokenizer), a text run with
// TOKENIZER_PLAIN, so a control token's string inside a message is ordinary text and
// never its control id. Every piece but the first of a view is encoded with
// TOKENIZER_CONTINUE: with a dummy-prefix SentencePiece model the pieces then give the ids
// of the whole rendered view.
// Pieces split at control tokens give the ids of the whole text (the tokenizers match
// control tokens before pre-tokenizing). A segment boundary inside a text run (Qwen3's
// "</think>\n\n" | answer, ChatML's "assistant\n" | "<think>…") is checked per sample: the
// two runs encoded joined must give the ids they give apart, else the sample is refused.
// Tool results, tool calls and tool definitions are rendered by the template too.
// Non-assistant messages after the last assistant message have nothing to train and are
// dropped. A shared-prefix prompt is tokenized exactly like the history of a conversation
// (p_0 a_0 … p_k, the inference view, thinking stripped), so "prompt + completion" has the
// same ids as the last turn of that conversation.
#include "data/tokenize.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

int template_check_tokenizer(const Tokenizer *tok, const ChatTemplate *t, char *err, size_t err_len) {
    for (int i = 0; i < t->n_controls; i++) {
        int32_t ids[64];
        int n = tokenizer_encode_flags(tok, t->controls[i], TOKENIZER_CONTINUE, ids, 64);
        if (n != 1)
            return fail(err, err_len, "the tokenizer has no id for the template token '%s' (it "
                        "encodes as %d ids; data.chat_template is %s)", t->controls[i], n, t->name);
    }
    return 0;
}

// A segment's ids piece by piece; fixed[i]: piece i's ids were settled by a view (below).
typedef struct {
    const RenderedSegment *seg;
    TokenSpan *ids;  // [seg->n]
    bool *fixed;     // [seg->n]
    bool view_start; // piece 0 begins its view
} Encoded;

// One sample's encoder: the tokenizer, whether the next piece begins its view, the first error.
typedef struct {
    const Tokenizer *tok;
    bool at_view_start;
    char *err;
    size_t err_len;
    int rc;
} Encoder;

// Appends the ids of text to out; returns their number.
static int append(Encoder *e, TokenSpan *out, const char *text, unsigned flags) {
    if (e->rc != 0 || !*text) return 0;
    int cap = (int)strlen(text) + 16;
    out->ids = xrealloc(out->ids, (size_t)(out->n + cap) * sizeof(int32_t));
    int n = tokenizer_encode_flags(e->tok, text, flags, out->ids + out->n, cap);
    if (n > cap) {
        out->ids = xrealloc(out->ids, (size_t)(out->n + n) * sizeof(int32_t));
        n = tokenizer_encode_flags(e->tok, text, flags, out->ids + out->n, n);
    }
    if (n < 0) {
        e->rc = fail(e->err, e->err_len, "the tokenizer failed on this sample");
        return 0;
    }
    out->n += n;
    return n;
}

static unsigned text_flags(bool view_start) {
    return TOKENIZER_PLAIN | (view_start ? 0u : (unsigned)TOKENIZER_CONTINUE);
}

static Encoded encode_segment(Encoder *e, const RenderedSegment *s) {
    Encoded out = {s, xcalloc((size_t)s->n + 1, sizeof(TokenSpan)), xcalloc((size_t)s->n + 1, sizeof(bool)),
                   e->at_view_start};
    for (int i = 0; i < s->n; i++) {
        const RenderedPiece *p = &s->pieces[i];
        append(e, &out.ids[i], p->text, p->control ? (e->at_view_start ? 0u : (unsigned)TOKENIZER_CONTINUE)
                                                   : text_flags(e->at_view_start));
        e->at_view_start = false;
    }
    return out;
}

// The segment's ids, all pieces concatenated; frees the per-piece ids.
static TokenSpan encoded_take(Encoded *x) {
    TokenSpan out = {0};
    for (int i = 0; x->seg && i < x->seg->n; i++) {
        out.ids = xrealloc(out.ids, (size_t)(out.n + x->ids[i].n + 1) * sizeof(int32_t));
        if (x->ids[i].n > 0) memcpy(out.ids + out.n, x->ids[i].ids, (size_t)x->ids[i].n * sizeof(int32_t));
        out.n += x->ids[i].n;
        free(x->ids[i].ids);
    }
    free(x->ids);
    free(x->fixed);
    memset(x, 0, sizeof *x);
    return out;
}

static bool spans_equal(const int32_t *a, int na, const TokenSpan *b) {
    return na == b->n && memcmp(a, b->ids, (size_t)na * sizeof(int32_t)) == 0;
}

// A text run that a view continues across segments (the last piece of one segment, then the
// first of the next: "</think>\n\n" | answer): its parts' ids must be the ids of the whole
// run cut at the parts' byte boundaries, and the same in every view the parts appear in.
// parts[k] = (segment, piece); the run's first part is its segment's last piece.
typedef struct {
    Encoded *seg;
    int piece;
} Part;

static void settle_run(Encoder *e, const Part *parts, int n_parts, const char *field) {
    size_t len = 0;
    for (int k = 0; k < n_parts; k++) len += strlen(parts[k].seg->seg->pieces[parts[k].piece].text);
    char *joined = xmalloc(len + 1);
    joined[0] = '\0';
    for (int k = 0; k < n_parts; k++) strcat(joined, parts[k].seg->seg->pieces[parts[k].piece].text);
    const bool view_start = parts[0].piece == 0 && parts[0].seg->view_start;
    TokenSpan whole = {0};
    append(e, &whole, joined, text_flags(view_start));
    // Each part's slice of the whole: ids whose decoded bytes add up to the part's length.
    int at = 0;
    bool ok = e->rc == 0;
    for (int k = 0; ok && k < n_parts; k++) {
        const Part *p = &parts[k];
        const TokenSpan *current = &p->seg->ids[p->piece];
        int n = 0;
        if (at + current->n <= whole.n && spans_equal(whole.ids + at, current->n, current)) {
            n = current->n;  // the ids it has alone: the common case, nothing to decode
        } else {
            const size_t want = strlen(p->seg->seg->pieces[p->piece].text);
            size_t bytes = 0;
            while (bytes < want && at + n < whole.n) {
                char *piece = tokenizer_decode(e->tok, whole.ids + at + n, 1);
                bytes += piece ? strlen(piece) : want + 1;
                free(piece);
                n++;
            }
            ok = bytes == want && !(p->seg->fixed[p->piece] && !spans_equal(whole.ids + at, n, current));
            if (ok) {
                TokenSpan *dst = &p->seg->ids[p->piece];
                dst->ids = xrealloc(dst->ids, (size_t)(n + 1) * sizeof(int32_t));
                memcpy(dst->ids, whole.ids + at, (size_t)n * sizeof(int32_t));
                dst->n = n;
            }
        }
        p->seg->fixed[p->piece] = true;
        at += n;
    }
    if (e->rc == 0 && (!ok || at != whole.n))
        e->rc = fail(e->err, e->err_len, "%s: this tokenizer merges its start with the template text "
                     "before it into tokens across the segment boundary, so the segments cannot give "
                     "the ids of the whole view (does it begin with whitespace?)", field);
    free(whole.ids);
    free(joined);
}

// The consecutive segments of one view (what[i]: the field that segment i renders, for the
// error): settles every text run that crosses a segment boundary.
static void settle_view(Encoder *e, Encoded *const *segs, const char *const *what, int n_segs,
                        const char *array, int index) {
    Part parts[8];
    int n_parts = 0;
    char field[96] = "";
    for (int i = 0; i <= n_segs; i++) {
        const RenderedSegment *s = i < n_segs ? segs[i]->seg : NULL;
        if (s && s->n == 0) continue;
        // A run from earlier segments continues into this one's first piece when it is text,
        // and on into the next segment when that piece is the whole segment.
        if (s && n_parts > 0 && !s->pieces[0].control) {
            CHECK(n_parts < 8, "a text run across %d segments", n_parts);
            if (n_parts == 1) snprintf(field, sizeof field, "%s[%d].%s", array, index, what[i]);
            parts[n_parts++] = (Part){segs[i], 0};
            if (s->n == 1) continue;
        }
        if (n_parts > 1) settle_run(e, parts, n_parts, field);
        n_parts = 0;
        if (s && !s->pieces[s->n - 1].control) parts[n_parts++] = (Part){segs[i], s->n - 1};
    }
}

// Settles the views a reply appears in: its own (prompt, think, answer) and, for a history
// reply, later views' (prompt, answer).
static void settle_reply(Encoder *e, Encoded *prompt, Encoded *think, Encoded *answer, bool history,
                         const char *array, int index) {
    Encoded *own[] = {prompt, think, answer};
    static const char *const OWN[] = {"content", "reasoning", "content"};
    settle_view(e, own, OWN, 3, array, index);
    if (history) {
        Encoded *later[] = {prompt, answer};
        static const char *const LATER[] = {"content", "content"};
        settle_view(e, later, LATER, 2, array, index);
    }
}

static void span_free(TokenSpan *s) {
    free(s->ids);
    s->ids = NULL;
    s->n = 0;
}

static void turn_free(TurnTokens *t) {
    span_free(&t->prompt);
    span_free(&t->think);
    span_free(&t->answer);
}

int sample_tokenize(const Tokenizer *tok, const ChatTemplate *t, const Sample *s,
                    SpecialInText special_in_text, TokenizedSample *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    out->kind = s->kind;
    out->line = s->line;
    RenderedSample r;
    if (template_render(t, s, special_in_text, &r, err, err_len) != 0) return -1;
    Encoder e = {tok, true, err, err_len, 0};
    out->n_turns = r.n_turns;
    out->turns = xcalloc((size_t)r.n_turns + 1, sizeof(TurnTokens));
    const bool conversation = s->kind == SAMPLE_CONVERSATION;
    Encoded prefix = {0};
    if (!conversation) prefix = encode_segment(&e, &r.prefix);
    for (int i = 0; i < r.n_turns; i++) {
        const RenderedTurn *rt = &r.turns[i];
        Encoded prompt = conversation ? encode_segment(&e, &rt->prompt) : (Encoded){0};
        Encoded think = encode_segment(&e, &rt->think), answer = encode_segment(&e, &rt->answer);
        settle_reply(&e, conversation ? &prompt : &prefix, &think, &answer,
                     conversation && i + 1 < r.n_turns, conversation ? "messages" : "completions",
                     rt->message);
        out->turns[i].prompt = encoded_take(&prompt);
        out->turns[i].think = encoded_take(&think);
        out->turns[i].answer = encoded_take(&answer);
        out->turns[i].continues = rt->continues;
        out->turns[i].empty_think = rt->empty_think;
        out->turns[i].context = rt->context;
    }
    out->prefix = encoded_take(&prefix);
    rendered_sample_free(&r);
    if (e.rc != 0) {
        tokenized_sample_free(out);
        return -1;
    }
    return 0;
}

void tokenized_sample_free(TokenizedSample *s) {
    for (int t = 0; t < s->n_turns; t++) turn_free(&s->turns[t]);
    free(s->turns);
    span_free(&s->prefix);
    s->turns = NULL;
    s->n_turns = 0;
}

int sample_tokenize_prompt(const Tokenizer *tok, const ChatTemplate *t, const Sample *s,
                           SpecialInText special_in_text, TokenSpan *out, char *err,
                           size_t err_len) {
    *out = (TokenSpan){0};
    if (s->kind != SAMPLE_CONVERSATION || s->n_messages == 0 ||
        s->messages[s->n_messages - 1].role != MSG_USER)
        return fail(err, err_len, "%s: the last message must be a user message (a prompt to "
                    "answer)", s->kind != SAMPLE_CONVERSATION ? "prompt" : "messages");
    // The prefix of a shared-prefix set with one empty completion is the generation
    // prompt, with the ids the conversation's next turn trains after.
    Message reply = {.role = MSG_ASSISTANT, .content = "", .reasoning = NULL};
    Sample set = *s;
    set.kind = SAMPLE_SHARED_PREFIX;
    set.completions = &reply;
    set.n_completions = 1;
    TokenizedSample tokenized;
    if (sample_tokenize(tok, t, &set, special_in_text, &tokenized, err, err_len) != 0) return -1;
    *out = tokenized.prefix;
    tokenized.prefix = (TokenSpan){0};
    tokenized_sample_free(&tokenized);
    return 0;
}
