// Tokenization of parsed samples with the chat template (DESIGN.md §2).
//
// Rendering (data/template.h); the special tokens alone delimit the text (no newlines
// are inserted):
//   prompt_t = for each non-assistant message since the previous assistant message:
//                  role header + content            (system: <|system|>, user: <|user|>;
//                                                    tool: <|user|><tool_response>\n
//                                                    content \n</tool_response>)
//              + <|assistant|>                       (the sample's "tools" first, as a
//                                                    <|system|># Tools\n block, a line each)
//   think_t  = <think> + reasoning + </think>        (only when reasoning != NULL;
//                                                      an empty string still renders)
//   answer_t = content + per tool call [\n]<tool_call>\n{"name": N, "arguments": A}
//              \n</tool_call> + <|end|>
// One turn per assistant message; one that follows tool results (no user message since
// the previous assistant message) `continues` its user turn (DESIGN.md §8).
// Each part is encoded on its own and the ids concatenated: a template token through the
// tokenizer's own matching (one id, checked at load by template_check_tokenizer), text
// from the data with TOKENIZER_PLAIN, so a template token's string inside a message is
// ordinary text and never its control id (or, with SPECIAL_IN_TEXT_ERROR, the sample is
// refused naming the field). Every part but the first of a view is encoded with
// TOKENIZER_CONTINUE: with a dummy-prefix SentencePiece model the parts then give the
// ids of the whole rendered view.
// Non-assistant messages after the last assistant message have nothing to train and
// are dropped. A shared-prefix prompt is tokenized exactly like the history of a
// conversation (p_0 a_0 … p_k, i.e. the inference view, thinking stripped), so
// "prompt + completion" has the same ids as the last turn of that conversation.
#include "data/tokenize.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/template.h"

int special_in_text_from_name(const char *name) {
    if (name && strcmp(name, "plain") == 0) return SPECIAL_IN_TEXT_PLAIN;
    if (name && strcmp(name, "error") == 0) return SPECIAL_IN_TEXT_ERROR;
    return -1;
}

int template_check_tokenizer(const Tokenizer *tok, char *err, size_t err_len) {
    for (int i = 0; i < TEMPLATE_N_SPECIAL_TOKENS; i++) {
        int32_t ids[64];
        int n = tokenizer_encode_flags(tok, TEMPLATE_SPECIAL_TOKENS[i], TOKENIZER_CONTINUE, ids, 64);
        if (n != 1)
            return fail(err, err_len, "the tokenizer has no id for the template token '%s' (it "
                        "encodes as %d ids)", TEMPLATE_SPECIAL_TOKENS[i], n);
    }
    return 0;
}

// One sample's encoder: the tokenizer, the policy for template tokens in text, whether
// the next part begins its view, and the first error.
typedef struct {
    const Tokenizer *tok;
    SpecialInText special_in_text;
    bool at_view_start;
    char *err;
    size_t err_len;
    int rc;
} Encoder;

// Appends the ids of text to out.
static void span_append(Encoder *e, TokenSpan *out, const char *text, unsigned flags) {
    if (e->rc != 0 || !*text) return;
    if (!e->at_view_start) flags |= TOKENIZER_CONTINUE;
    e->at_view_start = false;
    int cap = (int)strlen(text) + 16;
    out->ids = xrealloc(out->ids, (size_t)(out->n + cap) * sizeof(int32_t));
    int n = tokenizer_encode_flags(e->tok, text, flags, out->ids + out->n, cap);
    if (n > cap) {
        out->ids = xrealloc(out->ids, (size_t)(out->n + n) * sizeof(int32_t));
        n = tokenizer_encode_flags(e->tok, text, flags, out->ids + out->n, n);
    }
    if (n < 0) {
        e->rc = fail(e->err, e->err_len, "the tokenizer failed on this sample");
        return;
    }
    out->n += n;
}

// A template token: its control id.
static void span_control(Encoder *e, TokenSpan *out, const char *token) {
    span_append(e, out, token, 0);
}

// Text from the data field named "<array>[index].<key>" (for the error message).
static void span_text(Encoder *e, TokenSpan *out, const char *text, const char *array, int index,
                      const char *key) {
    if (e->rc != 0 || !text) return;
    if (e->special_in_text == SPECIAL_IN_TEXT_ERROR) {
        for (int i = 0; i < TEMPLATE_N_SPECIAL_TOKENS; i++) {
            if (!strstr(text, TEMPLATE_SPECIAL_TOKENS[i])) continue;
            e->rc = fail(e->err, e->err_len, "%s[%d].%s: contains the template token '%s' "
                         "(data.special_in_text is \"error\")", array, index, key,
                         TEMPLATE_SPECIAL_TOKENS[i]);
            return;
        }
    }
    span_append(e, out, text, TOKENIZER_PLAIN);
}

static const char *role_header(MessageRole role) {
    return role == MSG_SYSTEM ? TEMPLATE_SYSTEM_HEADER : TEMPLATE_USER_HEADER;
}

// Tool use in the onepass template, as text (Qwen3's wording): a tool result renders
// under the user header, and each tool call after the answer text.
#define TOOL_RESPONSE_OPEN "<tool_response>\n"
#define TOOL_RESPONSE_CLOSE "\n</tool_response>"

static void encode_tool_calls(Encoder *e, TokenSpan *out, const Message *m, const char *array,
                              int index) {
    for (int c = 0; c < m->n_tool_calls; c++) {
        const ToolCall *call = &m->tool_calls[c];
        size_t len = strlen(call->name) + strlen(call->arguments) + 64;
        char *text = xmalloc(len);
        snprintf(text, len, "%s<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>",
                 c > 0 || *m->content ? "\n" : "", call->name, call->arguments);
        span_text(e, out, text, array, index, "tool_calls");
        free(text);
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

// Tokenizes one assistant message's think and answer segments; array[index] names it.
static void encode_reply(Encoder *e, const Message *m, const char *array, int index, TurnTokens *turn) {
    if (m->reasoning) {
        span_control(e, &turn->think, TEMPLATE_THINK_OPEN);
        span_text(e, &turn->think, m->reasoning, array, index, "reasoning");
        span_control(e, &turn->think, TEMPLATE_THINK_CLOSE);
    }
    span_text(e, &turn->answer, m->content ? m->content : "", array, index, "content");
    encode_tool_calls(e, &turn->answer, m, array, index);
    span_control(e, &turn->answer, TEMPLATE_END_OF_TURN);
    turn->empty_think = !m->reasoning || !*m->reasoning;
    turn->context = m->context;
}

// Walks messages into turns (one per assistant message). The rendered non-assistant
// messages after the last assistant message, plus the assistant header, are left
// tokenized in *trailing_prompt (the next turn's prompt).
static void encode_turns(Encoder *e, const Sample *s, const char *array, TurnTokens **turns,
                         int *n_turns, TokenSpan *trailing_prompt) {
    const Message *msgs = s->messages;
    const int n_msgs = s->n_messages;
    int cap = 0;
    *turns = NULL;
    *n_turns = 0;
    TokenSpan prompt = {0};
    if (s->n_tools > 0) {  // the tool definitions: a system block before everything
        span_control(e, &prompt, TEMPLATE_SYSTEM_HEADER);
        span_append(e, &prompt, "# Tools\n", TOKENIZER_PLAIN);
        for (int i = 0; i < s->n_tools; i++) {
            span_text(e, &prompt, s->tools[i], "tools", i, "function");
            span_append(e, &prompt, "\n", TOKENIZER_PLAIN);
        }
    }
    bool user_since_reply = true;  // a user message since the last assistant message
    for (int i = 0; i < n_msgs; i++) {
        const Message *m = &msgs[i];
        if (m->role != MSG_ASSISTANT) {
            span_control(e, &prompt, role_header(m->role));
            if (m->role == MSG_TOOL) span_append(e, &prompt, TOOL_RESPONSE_OPEN, TOKENIZER_PLAIN);
            span_text(e, &prompt, m->content ? m->content : "", array, i, "content");
            if (m->role == MSG_TOOL) span_append(e, &prompt, TOOL_RESPONSE_CLOSE, TOKENIZER_PLAIN);
            user_since_reply |= m->role == MSG_USER;
            continue;
        }
        TurnTokens turn = {.continues = !user_since_reply};
        user_since_reply = false;
        span_control(e, &prompt, TEMPLATE_ASSISTANT_HEADER);
        turn.prompt = prompt;
        prompt = (TokenSpan){0};
        encode_reply(e, m, array, i, &turn);
        ARRAY_PUSH(*turns, *n_turns, cap, turn);
    }
    span_control(e, &prompt, TEMPLATE_ASSISTANT_HEADER);
    *trailing_prompt = prompt;
}

static void span_concat(TokenSpan *dst, const TokenSpan *src) {
    dst->ids = xrealloc(dst->ids, (size_t)(dst->n + src->n) * sizeof(int32_t));
    memcpy(dst->ids + dst->n, src->ids, (size_t)src->n * sizeof(int32_t));
    dst->n += src->n;
}

int sample_tokenize(const Tokenizer *tok, const Sample *s, SpecialInText special_in_text,
                    TokenizedSample *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    out->kind = s->kind;
    out->line = s->line;
    Encoder e = {tok, special_in_text, true, err, err_len, 0};
    TokenSpan trailing = {0};
    const bool conversation = s->kind == SAMPLE_CONVERSATION;
    encode_turns(&e, s, conversation ? "messages" : "prompt", &out->turns, &out->n_turns,
                 &trailing);
    if (conversation) {
        span_free(&trailing);
        if (e.rc == 0 && out->n_turns == 0) {
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
        for (int i = 0; i < s->n_completions; i++)
            encode_reply(&e, &s->completions[i], "completions", i, &out->turns[i]);
        if (e.rc == 0 && out->n_turns == 0) {
            tokenized_sample_free(out);
            return fail(err, err_len, "shared-prefix set has no completion");
        }
    }
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
