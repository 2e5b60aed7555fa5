// A parsed sample tokenized with the chat template (DESIGN.md §2): each turn's
// prompt, think and answer segments as token ids, before any layout.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "data/conversation.h"
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

// What a template token's string inside a text field of the data becomes (DESIGN.md §8:
// control ids come only from the template), data.special_in_text:
//   "plain" (default): ordinary text ids. A conversation about chat formats trains as
//                      written, and nothing in the data can forge a turn.
//   "error":           the sample is refused, naming the field (messages[i].content).
typedef enum { SPECIAL_IN_TEXT_PLAIN = 0, SPECIAL_IN_TEXT_ERROR = 1 } SpecialInText;
// The policy named "plain" or "error"; -1 for any other name.
int special_in_text_from_name(const char *name);

// 0 when the tokenizer encodes each template token as exactly one id; else -1 with the
// token named in err.
int template_check_tokenizer(const Tokenizer *tok, char *err, size_t err_len);

// Tokenizes one parsed sample with the template. Returns 0, or -1 with a location-free
// message in err (e.g. no assistant turn, or the field holding a template token under
// SPECIAL_IN_TEXT_ERROR); the caller names the sample's line.
int sample_tokenize(const Tokenizer *tok, const Sample *s, SpecialInText special_in_text,
                    TokenizedSample *out, char *err, size_t err_len);
void tokenized_sample_free(TokenizedSample *s);
