// A parsed sample tokenized with a chat template (DESIGN.md §2, §8): each turn's prompt,
// think and answer segments as token ids, before any layout.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "data/conversation.h"
#include "data/template.h"
#include "data/tokenizer.h"

typedef struct {
    int32_t *ids;
    int n;
} TokenSpan;

typedef struct {
    TokenSpan prompt;  // shared-prefix completions: empty (the prefix is in TokenizedSample.prefix)
    TokenSpan think;   // n == 0: the turn has no reasoning
    TokenSpan answer;  // answer text (and its tool calls) + end-of-turn
    bool continues;    // the message answers tool results: it is in the same user turn
                       // (DESIGN.md §8) as the message before it, not a new one
    bool empty_think;  // the message's reasoning is absent or "" (data.skip_empty_think_turns)
    bool context;      // a TRL prompt's assistant message: rendered, never trained
} TurnTokens;

typedef struct {
    SampleKind kind;
    TurnTokens *turns;  // conversation: one per assistant turn; shared-prefix: one per completion
    int n_turns;
    TokenSpan prefix;   // shared-prefix only: P (all prompt messages + assistant header)
    int line;           // source line, for error messages
} TokenizedSample;

// 0 when the tokenizer encodes each of the template's control tokens as exactly one id;
// else -1 with the token named in err.
int template_check_tokenizer(const Tokenizer *tok, const ChatTemplate *t, char *err, size_t err_len);

// Tokenizes one parsed sample with the template. Returns 0, or -1 with a location-free
// message in err (see template_render; or a segment boundary that this tokenizer does not
// keep, naming the field); the caller names the sample's line.
int sample_tokenize(const Tokenizer *tok, const ChatTemplate *t, const Sample *s,
                    SpecialInText special_in_text, TokenizedSample *out, char *err, size_t err_len);
void tokenized_sample_free(TokenizedSample *s);
// The generation prompt of a conversation whose last message is a user message: its
// inference view (earlier thinking stripped) up to and including the assistant header,
// into *out (ids malloc'd). Returns 0, or -1 with a location-free message in err.
int sample_tokenize_prompt(const Tokenizer *tok, const ChatTemplate *t, const Sample *s,
                           SpecialInText special_in_text, TokenSpan *out, char *err,
                           size_t err_len);
