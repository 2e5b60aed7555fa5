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
                        "encodes as %d ids; data.template is %s)", t->controls[i], n, t->name);
    }
    return 0;
}

// A segment's ids and the number of ids of its first and last pieces when they are text
// (0 when control), for the boundary check.
typedef struct {
    TokenSpan span;
    int head_text, tail_text;
    bool tail_starts_view;  // the last piece is the view's first
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

static unsigned piece_flags(const RenderedPiece *p, bool at_view_start) {
    return (p->control ? 0u : (unsigned)TOKENIZER_PLAIN) | (at_view_start ? 0u : (unsigned)TOKENIZER_CONTINUE);
}

static Encoded encode_segment(Encoder *e, const RenderedSegment *s) {
    Encoded out = {0};
    for (int i = 0; i < s->n; i++) {
        const RenderedPiece *p = &s->pieces[i];
        out.tail_starts_view = e->at_view_start;
        const int n = append(e, &out.span, p->text, piece_flags(p, e->at_view_start));
        e->at_view_start = false;
        if (i == 0 && !p->control) out.head_text = n;
        out.tail_text = p->control ? 0 : n;
    }
    return out;
}

// The view continues from segment a into segment b: when both meet in text runs, those
// runs encoded joined must give their ids apart. b's field is named in the error.
static void check_boundary(Encoder *e, const RenderedSegment *a, const Encoded *ea, const RenderedSegment *b,
                           const Encoded *eb, const char *array, int index, const char *what) {
    if (e->rc != 0 || a->n == 0 || b->n == 0 || a->pieces[a->n - 1].control || b->pieces[0].control)
        return;
    const char *left = a->pieces[a->n - 1].text, *right = b->pieces[0].text;
    size_t nl = strlen(left), nr = strlen(right);
    char *joined = xmalloc(nl + nr + 1);
    memcpy(joined, left, nl);
    memcpy(joined + nl, right, nr + 1);
    TokenSpan ids = {0};
    int n = append(e, &ids, joined, TOKENIZER_PLAIN | (ea->tail_starts_view ? 0u : (unsigned)TOKENIZER_CONTINUE));
    const int32_t *l = ea->span.ids + ea->span.n - ea->tail_text, *r = eb->span.ids;
    bool same = n == ea->tail_text + eb->head_text &&
                memcmp(ids.ids, l, (size_t)ea->tail_text * sizeof(int32_t)) == 0 &&
                memcmp(ids.ids + ea->tail_text, r, (size_t)eb->head_text * sizeof(int32_t)) == 0;
    if (e->rc == 0 && !same)
        e->rc = fail(e->err, e->err_len, "%s[%d].%s: this tokenizer merges the start of the %s with "
                     "the template text before it ('%s'), so the segments would not give the ids of "
                     "the whole view (does it begin with whitespace?)", array, index,
                     strcmp(what, "think") == 0 ? "reasoning" : "content", what, left);
    free(ids.ids);
    free(joined);
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

// A reply's think and answer after prompt (its ids in ep); history: the reply also appears
// in later views right after the prompt, without its think block.
static void encode_reply(Encoder *e, const RenderedSegment *prompt, const Encoded *ep, const RenderedTurn *rt,
                         bool history, const char *array, TurnTokens *out) {
    Encoded th = encode_segment(e, &rt->think), an = encode_segment(e, &rt->answer);
    if (rt->think.n > 0) {
        check_boundary(e, prompt, ep, &rt->think, &th, array, rt->message, "think");
        check_boundary(e, &rt->think, &th, &rt->answer, &an, array, rt->message, "answer");
    }
    if (rt->think.n == 0 || history)
        check_boundary(e, prompt, ep, &rt->answer, &an, array, rt->message, "answer");
    out->think = th.span;
    out->answer = an.span;
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
    if (s->kind == SAMPLE_CONVERSATION) {
        for (int i = 0; i < r.n_turns; i++) {
            Encoded ep = encode_segment(&e, &r.turns[i].prompt);
            out->turns[i].prompt = ep.span;
            encode_reply(&e, &r.turns[i].prompt, &ep, &r.turns[i], i + 1 < r.n_turns, "messages",
                         &out->turns[i]);
        }
    } else {
        Encoded ep = encode_segment(&e, &r.prefix);
        out->prefix = ep.span;
        for (int i = 0; i < r.n_turns; i++)
            encode_reply(&e, &r.prefix, &ep, &r.turns[i], false, "completions", &out->turns[i]);
    }
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
