// The chat template, defined here and nowhere else (DESIGN.md §2).
// Turn t renders as three segments, each tokenized on its own:
//   prompt_t = [system text (turn 0 only)] + user header + user text + assistant header
//   think_t  = THINK_OPEN + reasoning + THINK_CLOSE      (absent without reasoning)
//   answer_t = answer text + END_OF_TURN
#pragma once

#define TEMPLATE_SYSTEM_HEADER "<|system|>"
#define TEMPLATE_USER_HEADER "<|user|>"
#define TEMPLATE_ASSISTANT_HEADER "<|assistant|>"
#define TEMPLATE_THINK_OPEN "<think>"
#define TEMPLATE_THINK_CLOSE "</think>"
#define TEMPLATE_END_OF_TURN "<|end|>"

// All special tokens, for tokenizer training (user-defined symbols) and tests.
extern const char *const TEMPLATE_SPECIAL_TOKENS[];
extern const int TEMPLATE_N_SPECIAL_TOKENS;
