// Chat templates, defined here and nowhere else (DESIGN.md §2, §8): one ChatTemplate per
// model family, one renderer for all of them. Turn t renders as three segments:
//   prompt_t = [after_turn of the previous reply] [bos, default system (turn 0 only)]
//              + each non-assistant message (open + text + close) + assistant_open
//   think_t  = think_open + reasoning + think_close   (absent without reasoning, unless
//                                                      always_think: then empty reasoning)
//   answer_t = answer_open + answer text + end_of_turn
// A history turn (an earlier turn of a view) is prompt_t + answer_t: its reasoning is dropped.
// Template strings are split at the template's control tokens (each one id); everything
// else is text. Text of the data is never a control token (data.special_in_text). Where a
// segment boundary falls inside text, data/tokenize.c cuts the whole run's ids there.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "data/message.h"

// The onepass template's tokens (its think tags, TEMPLATE_THINK_OPEN and
// TEMPLATE_THINK_CLOSE, are the data formats' inline ones: data/message.h).
#define TEMPLATE_SYSTEM_HEADER "<|system|>"
#define TEMPLATE_USER_HEADER "<|user|>"
#define TEMPLATE_ASSISTANT_HEADER "<|assistant|>"
#define TEMPLATE_END_OF_TURN "<|end|>"

enum { TEMPLATE_MAX_CONTROLS = 8 };

// How a template renders tool use (DESIGN.md §8). A tool call renders after the answer
// text as call_open + name + call_mid + arguments + call_close, with a '\n' before it when
// it is not the first or the answer text is not empty.
typedef struct {
    // The sample's "tools": tools_open [first system message + system_sep] tools_intro, then
    // def_open + definition + def_close each, then tools_close; all before the messages.
    const char *tools_open;
    const char *system_sep;      // NULL: a first system message renders on its own, after
    const char *tools_intro, *def_open, *def_close, *tools_close;
    // A run of consecutive tool messages: results_open, result_open + content + result_close
    // each, results_close.
    const char *results_open, *result_open, *result_close, *results_close;
    const char *call_open, *call_mid, *call_close;
    bool raw_arguments;          // arguments given as a JSON string render as written
    // A user message written as "<tool_response>…</tool_response>" is taken for tool
    // results by the template (Qwen3's last_query_index): refused.
    bool refuse_user_tool_response;
} ToolFormat;

typedef struct ChatTemplate {
    const char *name;            // data.chat_template
    const char *bos;             // once, at the start of every view ("": none)
    const char *default_system;  // rendered when the first message is not a system one (NULL: none)
    const char *system_open, *system_close;
    const char *user_open, *user_close;
    const char *assistant_open;  // every assistant message's header; the generation prompt
    const char *think_open, *think_close;
    const char *answer_open;     // before the answer text, in history too (NULL: none)
    const char *end_of_turn;     // ends every reply: the model emits it (the stop token)
    const char *after_turn;      // after end_of_turn: never emitted, so it opens the next prompt
    bool always_think;           // a reply without reasoning renders an empty think block
    bool strip_reasoning_newlines;  // reasoning renders with '\n' stripped at both ends (Qwen3)
    bool trim_text;              // every message's text renders trimmed (Llama 3's `| trim`)
    bool answer_no_leading_newline;  // an answer beginning with '\n' is refused (Qwen3 drops
                                     // it from the reply being generated, not from history)
    const ToolFormat *tools;     // NULL: tool use is refused by name
    // Earlier turns keep their reasoning in every later view (data.history_thinking "keep"):
    // every reply after the first continues the view of the one before.
    bool keep_thinking;
    // This family's keep variant (its official template renders earlier turns' reasoning on
    // request, like onepass.jinja's preserve_thinking); NULL: it always strips it.
    const struct ChatTemplate *keeping;
    const char *controls[TEMPLATE_MAX_CONTROLS];  // the control tokens, each one id
    int n_controls;
} ChatTemplate;

extern const ChatTemplate TEMPLATE_ONEPASS;

// What earlier turns' reasoning becomes in later views, data.history_thinking: "strip"
// (the default: every shipped template strips it by default) or "keep".
typedef enum { HISTORY_THINKING_STRIP = 0, HISTORY_THINKING_KEEP = 1 } HistoryThinking;
// The policy named "strip" or "keep"; -1 for any other name.
int history_thinking_from_name(const char *name);
// t under policy h: t itself for strip, its keep variant for keep; NULL with a message in err
// when its official template cannot render earlier turns' reasoning.
const ChatTemplate *template_with_history(const ChatTemplate *t, HistoryThinking h, char *err,
                                          size_t err_len);

// The template named name; NULL for an unknown name.
const ChatTemplate *template_by_name(const char *name);
// "qwen3, deepseek_r1, …": every name, for error messages.
const char *template_names(void);
// The template whose official Jinja text chat_template is (exactly the text a checkpoint
// carries, data/template_jinja.h, else by the fingerprints in template.c); NULL when
// unrecognised.
const ChatTemplate *template_recognise(const char *chat_template);
// The template of a model folder: its tokenizer_config.json's chat_template. Returns 0
// with *out = the template, or *out = NULL when dir is no folder or has no chat_template;
// -1 with a message naming the folder when the chat_template is not recognised.
int template_of_folder(const char *dir, const ChatTemplate **out, char *err, size_t err_len);

// The fewest template tokens a message of this role renders with, whatever its text: the
// control tokens of the strings around every user message (user_open, user_close) or
// every assistant message (assistant_open, answer_open, end_of_turn); 0 for the others.
// A lower bound that needs no tokenizer (data/batch.c's length check before tokenizing).
int template_min_tokens(const ChatTemplate *t, MessageRole role);

// A segment's text as alternating pieces: a control token (one id) or a text run.
typedef struct {
    char *text;
    bool control;
} RenderedPiece;

typedef struct {
    RenderedPiece *pieces;
    int n, cap;
} RenderedSegment;

typedef struct {
    RenderedSegment prompt, think, answer;  // think.n == 0: no think block
    int message;                    // index of its message in messages (or completions)
    bool continues;    // its view keeps the previous reply's think block (TurnTokens.continues;
                       // every reply after the first under keep_thinking)
    bool empty_think;  // reasoning absent or ""
    bool context;      // a TRL prompt's assistant message: rendered, never trained
} RenderedTurn;

typedef struct {
    SampleKind kind;
    RenderedTurn *turns;  // conversation: one per assistant message; shared-prefix: per completion
    int n_turns;
    RenderedSegment prefix;       // shared-prefix only: the prompt messages' inference view + assistant_open
} RenderedSample;

// What a control token's string inside a text field of the data becomes (DESIGN.md §8:
// control ids come only from the template), data.special_in_text:
//   "plain" (default): ordinary text ids. A conversation about chat formats trains as
//                      written, and nothing in the data can forge a turn.
//   "error":           the sample is refused, naming the field (messages[i].content).
typedef enum { SPECIAL_IN_TEXT_PLAIN = 0, SPECIAL_IN_TEXT_ERROR = 1 } SpecialInText;
// The policy named "plain" or "error"; -1 for any other name.
int special_in_text_from_name(const char *name);

// Renders a parsed sample's segments. Returns 0, or -1 with a location-free message in
// err naming the field (a control token in text under SPECIAL_IN_TEXT_ERROR, a message the
// template cannot render byte-exactly, tool use under a template without tools) or saying
// the sample has no assistant turn.
int template_render(const ChatTemplate *t, const Sample *s, SpecialInText special_in_text,
                    RenderedSample *out, char *err, size_t err_len);
void rendered_sample_free(RenderedSample *r);
// The text of a segment, malloc'd.
char *segment_text(const RenderedSegment *s);
