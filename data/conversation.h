// Parsed JSONL samples (text, before tokenization). See DESIGN.md §1-2.
// Formats, detected per line:
//   {"messages": [{"role": "system"|"user"|"assistant", "content": ..., "reasoning_content"?: ...}]}
//   {"conversations": [{"from": "system"|"human"|"gpt", "value": ...}]}     (inline <think>…</think>)
//   {"prompt": [messages], "completions": [assistant messages]}              (shared-prefix set)
// Assistant reasoning comes from "reasoning_content" or an inline <think>…</think>
// at the start of the content; either way it ends up in Message.reasoning.
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef enum { MSG_SYSTEM = 0, MSG_USER = 1, MSG_ASSISTANT = 2 } MessageRole;

typedef struct {
    MessageRole role;
    char *content;    // answer text for assistant messages (think block removed)
    char *reasoning;  // NULL when the message has no reasoning
} Message;

typedef enum { SAMPLE_CONVERSATION = 0, SAMPLE_SHARED_PREFIX = 1 } SampleKind;

typedef struct {
    SampleKind kind;
    Message *messages;      // conversation, or the prompt of a shared-prefix set
    int n_messages;
    Message *completions;   // shared-prefix only: assistant messages
    int n_completions;
    int line;               // 1-based line in the source file
} Sample;

typedef struct {
    Sample *samples;
    int n_samples;
    int n_skipped;  // bad lines skipped under skip_bad
} Dataset;

// Parses one JSONL line. Returns 0 on success; on failure returns -1 and writes
// "path:line: <what is wrong>" (naming the field) into err.
int sample_parse_line(const char *text, size_t len, const char *path, int line, Sample *out,
                      char *err, size_t err_len);

// Reads a whole JSONL file (blank lines ignored). A bad line is fatal (message names
// file:line and the field) unless skip_bad, which skips it and counts it in n_skipped.
void dataset_load(const char *path, bool skip_bad, Dataset *out);

// Reads a JSONL file of prompts: conversations whose last message is a user message (the
// turn to generate). Any bad line is fatal, naming file:line and the field.
void prompts_load(const char *path, Dataset *out);

void sample_free(Sample *s);
void dataset_free(Dataset *d);
