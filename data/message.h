// The parsed messages and samples (text, before tokenization), shared by the parsers
// (data/conversation.h) and the chat templates (data/template.h). DESIGN.md §1-2, §8.
#pragma once
#include <stdbool.h>

// The inline think tags of the data formats ("<think>…</think>" at the start of an
// assistant message's content); also the onepass template's think tokens.
#define TEMPLATE_THINK_OPEN "<think>"
#define TEMPLATE_THINK_CLOSE "</think>"

typedef enum { MSG_SYSTEM = 0, MSG_USER = 1, MSG_ASSISTANT = 2, MSG_TOOL = 3 } MessageRole;

// One assistant tool call, OpenAI style {"id"?, "type": "function", "function": {"name",
// "arguments"}} (or the bare {"name", "arguments"}).
typedef struct {
    char *id;         // NULL when the call has none
    char *name;
    // The arguments object as the JSON text Python's json.dumps(args, ensure_ascii=False)
    // writes (", " and ": " separators, key order kept), i.e. what the chat templates'
    // `tojson` renders; given as a JSON string, it is parsed and written the same way.
    char *arguments;
    char *arguments_text;  // given as a JSON string: that string as written (Qwen3 renders
                           // it so); NULL when given as an object
} ToolCall;

typedef struct {
    MessageRole role;
    char *content;          // answer text for assistant messages (think block removed)
    char *reasoning;        // NULL when the message has no reasoning
    ToolCall *tool_calls;   // assistant only: [n_tool_calls], in order
    int n_tool_calls;
    char *name;             // tool only: the function whose result this is; NULL: absent
    char *tool_call_id;     // tool only: the call it answers; NULL: absent
    bool context;           // a TRL prompt's assistant message: rendered, never trained
} Message;

typedef enum { SAMPLE_CONVERSATION = 0, SAMPLE_SHARED_PREFIX = 1 } SampleKind;

typedef struct {
    SampleKind kind;
    Message *messages;      // conversation, or the prompt of a shared-prefix set
    int n_messages;
    Message *completions;   // shared-prefix only: assistant messages
    int n_completions;
    int line;               // 1-based line in the source file
    char **tools;           // top-level "tools": each definition as JSON text (as ToolCall
    int n_tools;            // arguments); [n_tools]
} Sample;
