// The CPU demonstration task: two turns about a code of four digits, made so that option
// (a)'s error shows in a model that trains in minutes on a CPU.
//
//   turn 1: user "Remember the code 3142."; thinking "Reversed: 2413."; answer "Noted."
//   turn 2: user "Say the code reversed."; thinking empty; answer "2413."
//
// Under mask_only the turn-2 answer sees turn 1's thinking and learns to copy the reversed
// code from it; inference strips that thinking, so the copy has nothing to read. Under
// npass and duplicate the turn-2 answer is trained on the stripped history, so the model
// learns to reverse the user's turn-1 code itself.
#pragma once
#include <stdint.h>
#include <stdio.h>

enum { SYNTH_DEMO_CODE_LEN = 4 };

// Writes n conversations (OpenAI messages JSONL with reasoning_content), deterministic
// for seed.
void synth_demo_write(FILE *f, uint64_t seed, int n);
