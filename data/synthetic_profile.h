// Synthetic conversations of realistic shapes, for wall-time benchmarks: the content is
// filler words, the lengths (in tokens of a given tokenizer) and the structure are
// those of real chat and agentic data. Every length is drawn log-uniformly from its
// range (SYNTH_PROFILE_RANGES); counts (turns, tools, calls) uniformly.
//
//   chat:    a system prompt, 2-8 user turns; each user message is answered by one
//            assistant message with thinking and an answer.
//   agentic: 2-4 tool definitions ("tools"), a system prompt, 2-5 user turns; each turn
//            has 1-4 tool calls (an assistant message with thinking and one call, then
//            the tool's result), then a final answer with thinking.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "data/tokenizer.h"

typedef enum { SYNTH_PROFILE_CHAT, SYNTH_PROFILE_AGENTIC } SynthProfile;

typedef struct {
    int lo, hi;  // inclusive
} SynthRange;

// The ranges of a profile; lengths in tokens (tokenizer_encode_flags with
// TOKENIZER_PLAIN | TOKENIZER_CONTINUE of the field's text).
typedef struct {
    SynthRange system, user_turns, user, thinking, answer;
    SynthRange tools, tool_description, calls_per_turn, tool_result;  // agentic only
} SynthProfileRanges;

// Parses "chat" | "agentic". Returns 0, or -1.
int synth_profile_parse(const char *name, SynthProfile *out);
const SynthProfileRanges *synth_profile_ranges(SynthProfile p);

// The tokens of a text field as the profiles count them.
int synth_text_tokens(const Tokenizer *tok, const char *text);

// Writes n conversations (OpenAI messages JSONL with reasoning_content) of the profile,
// deterministic for (seed, tokenizer, max_tokens). max_tokens > 0: a conversation whose
// size is larger is drawn again; its size is the tokens of its texts, tool definitions
// (as compact JSON) and call arguments plus 32 per message for the template's markup,
// answers, calls and tool results counted twice (duplicate's history copy), so that it
// fits a row of data.seq_len max_tokens under every layout.
void synth_profile_write(FILE *f, SynthProfile p, const Tokenizer *tok, uint64_t seed, int n,
                         long long max_tokens);
