// Tokenization of parsed samples with the chat template (DESIGN.md §2).
//
// Rendering (data/template.h), chosen so that every segment is one SentencePiece call
// and the special tokens alone delimit the text (no newlines are inserted):
//   prompt_t = for each non-assistant message since the previous assistant message:
//                  role header + content            (system: <|system|>, user: <|user|>)
//              + <|assistant|>
//   think_t  = <think> + reasoning + </think>        (only when reasoning != NULL;
//                                                      an empty string still renders)
//   answer_t = content + <|end|>
// Non-assistant messages after the last assistant message have nothing to train and
// are dropped. A shared-prefix prompt is tokenized exactly like the history of a
// conversation (p_0 a_0 … p_k, i.e. the inference view, thinking stripped), so
// "prompt + completion" has the same ids as the last turn of that conversation.
#include "data/tokenize.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/template.h"

typedef struct {
    char *s;
    size_t len, cap;
} TextBuf;

static void text_append(TextBuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        b->cap = 2 * (b->len + n + 1);
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

static void text_clear(TextBuf *b) {
    b->len = 0;
    if (b->s) b->s[0] = '\0';
}

static int encode_text(const Tokenizer *tok, const char *text, TokenSpan *out) {
    int cap = (int)strlen(text) + 16;
    out->ids = xmalloc((size_t)cap * sizeof(int32_t));
    int n = tokenizer_encode(tok, text, out->ids, cap);
    if (n > cap) {
        out->ids = xrealloc(out->ids, (size_t)n * sizeof(int32_t));
        n = tokenizer_encode(tok, text, out->ids, n);
    }
    out->n = n < 0 ? 0 : n;
    return n < 0 ? -1 : 0;
}

static const char *role_header(MessageRole role) {
    return role == MSG_SYSTEM ? TEMPLATE_SYSTEM_HEADER : TEMPLATE_USER_HEADER;
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

// Tokenizes one assistant message's think and answer segments.
static int encode_reply(const Tokenizer *tok, const Message *m, TextBuf *buf, TurnTokens *turn) {
    int rc = 0;
    if (m->reasoning) {
        text_clear(buf);
        text_append(buf, TEMPLATE_THINK_OPEN);
        text_append(buf, m->reasoning);
        text_append(buf, TEMPLATE_THINK_CLOSE);
        rc |= encode_text(tok, buf->s, &turn->think);
    }
    text_clear(buf);
    text_append(buf, m->content ? m->content : "");
    text_append(buf, TEMPLATE_END_OF_TURN);
    rc |= encode_text(tok, buf->s, &turn->answer);
    return rc;
}

// Walks messages into turns (one per assistant message). The rendered non-assistant
// messages after the last assistant message, plus the assistant header, are left
// tokenized in *trailing_prompt (the next turn's prompt).
static int encode_turns(const Tokenizer *tok, const Message *msgs, int n_msgs, TurnTokens **turns,
                        int *n_turns, TokenSpan *trailing_prompt) {
    TextBuf prompt = {0}, scratch = {0};
    int cap = 0, rc = 0;
    *turns = NULL;
    *n_turns = 0;
    text_clear(&prompt);
    for (int i = 0; i < n_msgs; i++) {
        const Message *m = &msgs[i];
        if (m->role != MSG_ASSISTANT) {
            text_append(&prompt, role_header(m->role));
            text_append(&prompt, m->content ? m->content : "");
            continue;
        }
        TurnTokens turn = {0};
        text_append(&prompt, TEMPLATE_ASSISTANT_HEADER);
        rc |= encode_text(tok, prompt.s, &turn.prompt);
        rc |= encode_reply(tok, m, &scratch, &turn);
        ARRAY_PUSH(*turns, *n_turns, cap, turn);
        text_clear(&prompt);
    }
    text_append(&prompt, TEMPLATE_ASSISTANT_HEADER);
    rc |= encode_text(tok, prompt.s, trailing_prompt);
    free(prompt.s);
    free(scratch.s);
    return rc;
}

static void span_concat(TokenSpan *dst, const TokenSpan *src) {
    dst->ids = xrealloc(dst->ids, (size_t)(dst->n + src->n) * sizeof(int32_t));
    memcpy(dst->ids + dst->n, src->ids, (size_t)src->n * sizeof(int32_t));
    dst->n += src->n;
}

int sample_tokenize(const Tokenizer *tok, const Sample *s, TokenizedSample *out, char *err,
                    size_t err_len) {
    memset(out, 0, sizeof *out);
    out->kind = s->kind;
    out->line = s->line;
    TokenSpan trailing = {0};
    int rc = encode_turns(tok, s->messages, s->n_messages, &out->turns, &out->n_turns, &trailing);
    if (s->kind == SAMPLE_CONVERSATION) {
        span_free(&trailing);
        if (rc == 0 && out->n_turns == 0) {
            tokenized_sample_free(out);
            return fail(err, err_len, "conversation has no assistant message");
        }
    } else {
        // The prefix is the inference view of the prompt messages: p_0 a_0 … p_k.
        for (int t = 0; t < out->n_turns; t++) {
            span_concat(&out->prefix, &out->turns[t].prompt);
            span_concat(&out->prefix, &out->turns[t].answer);
            turn_free(&out->turns[t]);
        }
        span_concat(&out->prefix, &trailing);
        span_free(&trailing);
        free(out->turns);
        out->turns = xcalloc((size_t)s->n_completions, sizeof(TurnTokens));
        out->n_turns = s->n_completions;
        TextBuf scratch = {0};
        for (int i = 0; i < s->n_completions; i++)
            rc |= encode_reply(tok, &s->completions[i], &scratch, &out->turns[i]);
        free(scratch.s);
        if (rc == 0 && out->n_turns == 0) {
            tokenized_sample_free(out);
            return fail(err, err_len, "shared-prefix set has no completion");
        }
    }
    if (rc != 0) {
        tokenized_sample_free(out);
        return fail(err, err_len, "the tokenizer failed on this sample");
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

