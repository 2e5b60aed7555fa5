// Parsed JSONL samples (text, before tokenization). See DESIGN.md §1-2, §8.
// Formats, detected per line:
//   {"messages": [message...], "tools"?: [...]}                         (OpenAI style)
//       message = {"role": "system"|"developer"|"user"|"assistant"|"tool",
//                  "content": text or parts,
//                  "reasoning_content"? | "reasoning"? | "thinking"?: ..., (assistant)
//                  "tool_calls"?: [{"type": "function", "function": {"name", "arguments"}}],
//                  "name"?, "tool_call_id"? (tool; "name" of other roles: metadata)}
//       Top-level metadata keys (id, uuid, conversation_id, source, dataset, category,
//       domain, difficulty, metadata, license, language, model, generator, version) are
//       read, counted, never rendered.
//       "developer" is the system message (a line may not have both). Consecutive user
//       messages are kept, each its own message.
//   {"conversations": [{"from": "system"|"human"|"gpt", "value": ...}], "system"?: ...}
//                                                                     (ShareGPT; inline <think>)
//   {"prompt": [messages], "completions": [assistant messages]}        (shared-prefix set)
//   {"prompt": [messages], "completion": [messages]}                   (TRL conversational
//                                        prompt-completion: one conversation, prompt untrained)
// Content is a string or an array of parts [{"type": "text", "text": ...}] (concatenated).
// Assistant reasoning comes from "reasoning_content" (or its other name "thinking") or an
// inline <think>…</think> at the start of the content; either way it ends up in
// Message.reasoning. Every key of a line is read or refused: an unknown key is an error
// naming it (messages[2].foo) unless ParseOptions.ignore_unknown_keys, which counts it.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "data/message.h"

// Distinct names of the keys ignored under ignore_unknown_keys ("id", "messages[].weight"),
// each with how many times it was met: the first KEY_TALLY_NAMES names; keys of further
// names are counted in `others`, so a line of many distinct keys costs linear work.
enum { KEY_TALLY_NAMES = 64 };
typedef struct {
    char **names;
    long long *counts;
    int n, cap;
    long long total, others;
} KeyTally;

typedef struct {
    bool ignore_unknown_keys;  // count unknown keys in *ignored instead of refusing the line
    KeyTally *ignored;         // NULL: not counted
    bool prompts;              // a conversation ends with a user message (the turn to generate)
    KeyTally *metadata;        // the metadata keys read ("id", "messages[].name"); NULL: not counted
} ParseOptions;

typedef struct {
    bool skip_bad;             // skip (and count) lines that fail to parse
    bool ignore_unknown_keys;  // data.ignore_unknown_keys
    // data.max_line_bytes: a longer line is refused before its JSON is parsed (fatal, or
    // skipped and counted in n_too_long under skip_too_long); 0: no limit.
    size_t max_line_bytes;
    bool skip_too_long;
    bool prompts;              // ParseOptions.prompts
} LoadOptions;

typedef struct {
    Sample *samples;
    int n_samples;
    int n_skipped;   // bad lines skipped under skip_bad
    int n_too_long;  // lines over max_line_bytes skipped under skip_too_long
    KeyTally ignored;
    KeyTally metadata;  // top-level metadata keys and non-tool messages' "name", by name
} Dataset;

// Parses one JSONL line. Returns 0 on success; on failure returns -1 and writes
// "path:line: <what is wrong>" (naming the field) into err. opt NULL: the defaults (strict).
int sample_parse_line(const char *text, size_t len, const char *path, int line,
                      const ParseOptions *opt, Sample *out, char *err, size_t err_len);

// Reads a whole JSONL file (blank lines ignored). A bad line is fatal (message names
// file:line and the field) unless skip_bad, which skips it and counts it in n_skipped.
// Ignored keys, if any, are reported in one line on stderr.
void dataset_load(const char *path, const LoadOptions *opt, Dataset *out);

// Reads a JSONL file of prompts: conversations whose last message is a user message (the
// turn to generate). Any bad line is fatal, naming file:line and the field.
void prompts_load(const char *path, Dataset *out);

// "N unknown keys ignored: id (6), messages[].weight (12)" into buf.
void key_tally_describe(const KeyTally *t, char *buf, size_t len);
// "N metadata keys read, not rendered: id (6), source (6)" into buf.
void metadata_tally_describe(const KeyTally *t, char *buf, size_t len);
void key_tally_free(KeyTally *t);
void sample_free(Sample *s);
void dataset_free(Dataset *d);
