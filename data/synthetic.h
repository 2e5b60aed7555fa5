// Synthetic multi-turn reasoning data: chained integer arithmetic where each turn
// works on the previous turn's result ("Add 4821 and 377." → "Now multiply the
// result by 6." → …). The thinking does the arithmetic column by column; the
// answer is short ("The result is 5198."). Deterministic for a seed (own PRNG).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/conversation.h"

// Writes n conversations, one JSONL line each, 1–8 turns. Formats are mixed:
// "messages" with reasoning_content, "messages" with inline <think>, ShareGPT.
void synthetic_write_conversations(FILE *f, uint64_t seed, int n);

// Writes n shared-prefix sets {"prompt": [...], "completions": [...]}: a history
// of finished turns plus a new question, answered 2–3 ways (different methods,
// same result).
void synthetic_write_shared_prefix(FILE *f, uint64_t seed, int n);

// The seed of split `split` (0 train, 1 eval, 2 shared-prefix) for a base seed.
uint64_t synthetic_split_seed(uint64_t seed, int split);

// Recomputes, from the user questions alone, the result each question asks for.
// Writes one result per user message into results (at most cap); returns the
// number of user messages, or -1 when a question is not one of the generator's (an
// operand or a result that a long long cannot hold included: never a wrapped number).
int synthetic_expected_results(const Message *messages, int n_messages, long long *results,
                               int cap);

// True iff the answer text states `expected` (its last integer is `expected`).
bool synthetic_check_answer(const char *answer, long long expected);

// Checks every assistant answer of a parsed sample (history answers, and for a
// shared-prefix set every completion) against synthetic_expected_results.
// Returns 0, or -1 with a message naming the message (not the line) in err.
int synthetic_check_sample(const Sample *s, char *err, size_t err_len);
