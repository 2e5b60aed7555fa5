#include "data/template.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/check.h"
#include "data/template_jinja.h"

// Tool calls as Qwen3 writes them (onepass's wording too).
#define TOOL_CALL_FIELDS \
    .call_open = "<tool_call>\n{\"name\": \"", .call_mid = "\", \"arguments\": ", .call_close = "}\n</tool_call>"

// onepass: text, no control tokens of its own; a tool result under the user header.
static const ToolFormat ONEPASS_TOOLS = {
    .tools_open = TEMPLATE_SYSTEM_HEADER, .tools_intro = "# Tools\n", .def_open = "", .def_close = "\n",
    .tools_close = "", .results_open = "", .result_open = TEMPLATE_USER_HEADER "<tool_response>\n",
    .result_close = "\n</tool_response>", .results_close = "", TOOL_CALL_FIELDS,
};

// Order fixes the ids of a tokenizer trained here (data/tokenizer.cc): 1..6.
#define ONEPASS_FIELDS                                                                        \
    .name = "onepass", .bos = "",                                                             \
    .system_open = TEMPLATE_SYSTEM_HEADER, .system_close = "",                                \
    .user_open = TEMPLATE_USER_HEADER, .user_close = "",                                      \
    .assistant_open = TEMPLATE_ASSISTANT_HEADER,                                              \
    .think_open = TEMPLATE_THINK_OPEN, .think_close = TEMPLATE_THINK_CLOSE,                   \
    .end_of_turn = TEMPLATE_END_OF_TURN, .after_turn = "", .tools = &ONEPASS_TOOLS,           \
    .controls = {TEMPLATE_SYSTEM_HEADER, TEMPLATE_USER_HEADER, TEMPLATE_ASSISTANT_HEADER,      \
                 TEMPLATE_THINK_OPEN, TEMPLATE_THINK_CLOSE, TEMPLATE_END_OF_TURN},            \
    .n_controls = 6

// onepass under data.history_thinking "keep": every reply keeps its reasoning in later views
// (onepass.jinja with preserve_thinking).
static const ChatTemplate ONEPASS_KEEP = {ONEPASS_FIELDS, .keep_thinking = true};

const ChatTemplate TEMPLATE_ONEPASS = {ONEPASS_FIELDS, .keeping = &ONEPASS_KEEP};

// Qwen3's tool use: the definitions as its system block (the first system message inside),
// a run of tool results in one user block; <tool_call>, <tool_response> and their closes
// are control tokens (added tokens of its vocabulary).
static const ToolFormat QWEN3_TOOLS = {
    .tools_open = "<|im_start|>system\n", .system_sep = "\n\n",
    .tools_intro = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                   "You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    .def_open = "\n", .def_close = "",
    .tools_close = "\n</tools>\n\nFor each function call, return a json object with function name and "
                   "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                   "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n",
    .results_open = "<|im_start|>user", .result_open = "\n<tool_response>\n",
    .result_close = "\n</tool_response>", .results_close = "<|im_end|>\n", TOOL_CALL_FIELDS,
    .raw_arguments = true, .refuse_user_tool_response = true,
};

// Qwen3: the reply renders "<think>\n{reasoning}\n</think>\n\n{answer}", an empty think
// block without reasoning; history replies render without it. Within a turn (after the
// last user message) earlier replies keep their think block when they have reasoning.
static const ChatTemplate QWEN3 = {
    .name = "qwen3", .bos = "",
    .system_open = "<|im_start|>system\n", .system_close = "<|im_end|>\n",
    .user_open = "<|im_start|>user\n", .user_close = "<|im_end|>\n",
    .assistant_open = "<|im_start|>assistant\n",
    .think_open = "<think>\n", .think_close = "\n</think>\n\n",
    .end_of_turn = "<|im_end|>", .after_turn = "\n",
    .always_think = true, .strip_reasoning_newlines = true, .answer_no_leading_newline = true,
    .tools = &QWEN3_TOOLS,
    .controls = {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                 "<tool_response>", "</tool_response>"},
    .n_controls = 8,
};

// DeepSeek-R1-Distill: the template cuts every reply up to "</think>", the last one too;
// the trained reply is what the model emits after its generation prompt
// "<｜Assistant｜><think>\n" (the "<think>\n" opens the think segment, DESIGN.md §8), and a
// history reply is what the template keeps of that output: "\n\n" + answer.
static const ChatTemplate DEEPSEEK_R1 = {
    .name = "deepseek_r1", .bos = "<｜begin▁of▁sentence｜>",
    .system_open = "", .system_close = "",
    .user_open = "<｜User｜>", .user_close = "",
    .assistant_open = "<｜Assistant｜>",
    .think_open = "<think>\n", .think_close = "\n</think>", .answer_open = "\n\n",
    .end_of_turn = "<｜end▁of▁sentence｜>", .after_turn = "",
    .always_think = true,
    .controls = {"<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
                 "<｜end▁of▁sentence｜>"},
    .n_controls = 6,
};

// ChatML and its families (the models have no think tokens: the think block is text, in
// the reply's content as reasoning models fine-tuned from them write it).
#define CHATML_FIELDS                                                                    \
    .bos = "", .system_open = "<|im_start|>system\n", .system_close = "<|im_end|>\n",      \
    .user_open = "<|im_start|>user\n", .user_close = "<|im_end|>\n",                       \
    .assistant_open = "<|im_start|>assistant\n", .think_open = "<think>\n",                \
    .think_close = "\n</think>\n\n", .end_of_turn = "<|im_end|>", .after_turn = "\n",      \
    .controls = {"<|im_start|>", "<|im_end|>"}, .n_controls = 2

static const ChatTemplate CHATML = {.name = "chatml", CHATML_FIELDS};
static const ChatTemplate QWEN25 = {
    .name = "qwen2.5", CHATML_FIELDS,
    .default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."};
static const ChatTemplate SMOLLM2 = {
    .name = "smollm2", CHATML_FIELDS,
    .default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"};

// Llama 3.1 Instruct: the system block is always there, with the template's date lines as
// it renders them without a date_string ("26 Jul 2024"); every text is trimmed.
static const ChatTemplate LLAMA3 = {
    .name = "llama3", .bos = "<|begin_of_text|>", .default_system = "",
    .system_open = "<|start_header_id|>system<|end_header_id|>\n\n"
                   "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
    .system_close = "<|eot_id|>",
    .user_open = "<|start_header_id|>user<|end_header_id|>\n\n", .user_close = "<|eot_id|>",
    .assistant_open = "<|start_header_id|>assistant<|end_header_id|>\n\n",
    .think_open = "<think>\n", .think_close = "\n</think>\n\n",
    .end_of_turn = "<|eot_id|>", .after_turn = "", .trim_text = true,
    .controls = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
    .n_controls = 4,
};

// Zephyr (TinyLlama-1.1B-Chat): the headers are text in the model's vocabulary; only the
// end-of-sentence token is a control token.
static const ChatTemplate ZEPHYR = {
    .name = "zephyr", .bos = "",
    .system_open = "<|system|>\n", .system_close = "</s>\n",
    .user_open = "<|user|>\n", .user_close = "</s>\n",
    .assistant_open = "<|assistant|>\n",
    .think_open = "<think>\n", .think_close = "\n</think>\n\n",
    .end_of_turn = "</s>", .after_turn = "\n",
    .controls = {"</s>"}, .n_controls = 1,
};

static const ChatTemplate *const TEMPLATES[] = {&QWEN3,  &DEEPSEEK_R1, &CHATML, &QWEN25,
                                                &SMOLLM2, &LLAMA3,     &ZEPHYR, &TEMPLATE_ONEPASS};
enum { N_TEMPLATES = sizeof TEMPLATES / sizeof TEMPLATES[0] };

const ChatTemplate *template_by_name(const char *name) {
    for (int i = 0; name && i < N_TEMPLATES; i++)
        if (strcmp(TEMPLATES[i]->name, name) == 0) return TEMPLATES[i];
    return NULL;
}

const char *template_names(void) {
    return "qwen3, deepseek_r1, chatml, qwen2.5, smollm2, llama3, zephyr, onepass";
}

int history_thinking_from_name(const char *name) {
    if (name && strcmp(name, "strip") == 0) return HISTORY_THINKING_STRIP;
    if (name && strcmp(name, "keep") == 0) return HISTORY_THINKING_KEEP;
    return -1;
}

const ChatTemplate *template_with_history(const ChatTemplate *t, HistoryThinking h, char *err,
                                          size_t err_len) {
    if (h == HISTORY_THINKING_STRIP) return t;
    if (t->keep_thinking) return t;
    if (t->keeping) return t->keeping;
    fail(err, err_len, "keep: the %s template renders earlier turns without their reasoning, as "
         "its official chat template does (keep applies to: onepass)", t->name);
    return NULL;
}

// Fingerprints of the official templates (tests/data/templates/*/tokenizer_config.json
// holds each text): substrings that the family's template has and its look-alikes lack.
// The Jinja source spells a newline inside a string as the two characters "\n".
typedef struct {
    const ChatTemplate *t;
    const char *has[4];
    const char *lacks;  // NULL: nothing
} Fingerprint;

static const Fingerprint FINGERPRINTS[] = {
    // Qwen3 (both revisions); a thinking-only variant that opens <think> in the generation
    // prompt renders differently and is not matched.
    {&QWEN3, {"<|im_start|>", "reasoning_content", "last_query_index", "<think>\\n"},
     "'<|im_start|>assistant\\n<think>"},
    {&DEEPSEEK_R1, {"<｜User｜>", "<｜Assistant｜>", "</think>", "'<｜Assistant｜><think>\\n'"}, NULL},
    {&QWEN25, {"<|im_start|>", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
     "<think>"},
    {&SMOLLM2, {"<|im_start|>", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
     "<think>"},
    {&LLAMA3, {"<|start_header_id|>", "Cutting Knowledge Date: December 2023\\n", "date_string",
               "message['content'] | trim + '<|eot_id|>'"},
     NULL},
    // TinyLlama's template has real newlines inside its string literals.
    {&ZEPHYR, {"'<|user|>", "'<|assistant|>", "+ message['content'] + eos_token", "{{ '<|assistant|>' }}"},
     "<|im_start|>"},
};

// Plain ChatML has no distinctive substring: its whole text (outer whitespace aside).
static const char CHATML_TEXT[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

const ChatTemplate *template_recognise(const char *text) {
    // A checkpoint's chat_template.jinja is the official text of the template it trained.
    const char *official = template_official_name(text);
    if (official) return template_by_name(official);
    for (size_t i = 0; i < sizeof FINGERPRINTS / sizeof FINGERPRINTS[0]; i++) {
        const Fingerprint *f = &FINGERPRINTS[i];
        bool all = !f->lacks || !strstr(text, f->lacks);
        for (int k = 0; all && k < 4 && f->has[k]; k++) all = strstr(text, f->has[k]) != NULL;
        if (all) return f->t;
    }
    while (*text == ' ' || *text == '\n') text++;
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\n')) n--;
    if (n == strlen(CHATML_TEXT) && memcmp(text, CHATML_TEXT, n) == 0) return &CHATML;
    return NULL;
}

// A text file's bytes as a JSON string (null when unreadable or not UTF-8).
static json_t *file_json_string(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return json_null();
    char *text = NULL;
    size_t n = 0, cap = 0, got;
    do {
        text = xrealloc(text, cap += 65536);
        n += got = fread(text + n, 1, cap - n, f);
    } while (got > 0);
    fclose(f);
    json_t *s = json_stringn(text, n);
    free(text);
    return s ? s : json_null();
}

int template_of_folder(const char *dir, const ChatTemplate **out, char *err, size_t err_len) {
    *out = NULL;
    struct stat st;
    if (!dir || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    char path[4200];
    // chat_template.jinja (what transformers writes today) before tokenizer_config.json's
    // key; that file's integers may exceed int64 (model_max_length 1e30): read as reals.
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    json_t *root = stat(path, &st) == 0 ? json_pack("{s:o}", "chat_template", file_json_string(path)) : NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!root && stat(path, &st) != 0) return 0;
    json_error_t jerr;
    if (!root) root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) return fail(err, err_len, "%s:%d: %s", path, jerr.line, jerr.text);
    const json_t *ct = json_object_get(root, "chat_template");
    int rc = 0;
    if (ct && !json_is_null(ct)) {
        *out = json_is_string(ct) ? template_recognise(json_string_value(ct)) : NULL;
        if (!*out)
            rc = fail(err, err_len, "%s: the chat_template of this model folder is not one onepass "
                      "knows; set data.chat_template (%s)", dir, template_names());
    }
    json_decref(root);
    return rc;
}

int special_in_text_from_name(const char *name) {
    if (name && strcmp(name, "plain") == 0) return SPECIAL_IN_TEXT_PLAIN;
    if (name && strcmp(name, "error") == 0) return SPECIAL_IN_TEXT_ERROR;
    return -1;
}

// ---- Rendering.

// One sample's renderer: the template, the policy for control tokens in text, the first error.
typedef struct {
    const ChatTemplate *t;
    SpecialInText special_in_text;
    char *err;
    size_t err_len;
    int rc;
} Renderer;

// Appends n bytes of text as a control piece or to the segment's last text run.
static void push(RenderedSegment *s, const char *text, size_t n, bool control) {
    if (n == 0) return;
    RenderedPiece *last = s->n > 0 ? &s->pieces[s->n - 1] : NULL;
    if (!control && last && !last->control) {
        size_t old = strlen(last->text);
        last->text = xrealloc(last->text, old + n + 1);
        memcpy(last->text + old, text, n);
        last->text[old + n] = '\0';
        return;
    }
    RenderedPiece p = {xmalloc(n + 1), control};
    memcpy(p.text, text, n);
    p.text[n] = '\0';
    ARRAY_PUSH(s->pieces, s->n, s->cap, p);
}

// The first control token in text at or after p; its length in *len (NULL: none).
static const char *next_control(const ChatTemplate *t, const char *p, size_t *len) {
    const char *best = NULL;
    for (int i = 0; i < t->n_controls; i++) {
        const char *at = strstr(p, t->controls[i]);
        if (at && (!best || at < best)) best = at, *len = strlen(t->controls[i]);
    }
    return best;
}

static int count_controls(const ChatTemplate *t, const char *text) {
    int n = 0;
    size_t len = 0;
    for (const char *at; text && (at = next_control(t, text, &len)) != NULL; text = at + len) n++;
    return n;
}

int template_min_tokens(const ChatTemplate *t, MessageRole role) {
    switch (role) {
    case MSG_USER: return count_controls(t, t->user_open) + count_controls(t, t->user_close);
    case MSG_ASSISTANT:
        return count_controls(t, t->assistant_open) + count_controls(t, t->answer_open) +
               count_controls(t, t->end_of_turn);
    default: return 0;
    }
}

// n bytes of template text: its control tokens become control pieces.
static void literal_n(Renderer *r, RenderedSegment *s, const char *text, size_t n) {
    char *copy = xmalloc(n + 1);
    memcpy(copy, text, n);
    copy[n] = '\0';
    const char *p = copy;
    size_t len = 0;
    for (const char *at; (at = next_control(r->t, p, &len)) != NULL; p = at + len) {
        push(s, p, (size_t)(at - p), false);
        push(s, at, len, true);
    }
    push(s, p, strlen(p), false);
    free(copy);
}

static void literal(Renderer *r, RenderedSegment *s, const char *text) { literal_n(r, s, text, strlen(text)); }

// Python's str.isspace for the code point starting at p (its byte length in *n), for `| trim`.
static bool space_at(const unsigned char *p, size_t *n) {
    *n = 1;
    if (*p == ' ' || (*p >= '\t' && *p <= '\r') || (*p >= 0x1c && *p <= 0x1f)) return true;
    static const char *const WIDE[] = {"\xc2\x85", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
                                       "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008",
                                       "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
                                       "\u3000"};
    for (size_t i = 0; i < sizeof WIDE / sizeof WIDE[0]; i++) {
        *n = strlen(WIDE[i]);
        if (strncmp((const char *)p, WIDE[i], *n) == 0) return true;
    }
    return false;
}

// The part of text that renders: trimmed (trim) or with '\n' stripped (strip_newlines).
static const char *rendered_part(const char *text, bool trim, bool strip_newlines, size_t *n) {
    const char *end = text + strlen(text);
    size_t k;
    if (trim) {
        while (text < end && space_at((const unsigned char *)text, &k)) text += k;
        const char *last = text;  // the end of the last non-space code point
        for (const char *q = text; q < end;) {
            const bool space = space_at((const unsigned char *)q, &k);
            if (!space)
                for (k = 1; q + k < end && ((unsigned char)q[k] & 0xC0) == 0x80; k++) {}
            q += k;
            if (!space) last = q;
        }
        end = last;
    }
    if (strip_newlines) {
        while (*text == '\n') text++;
        while (end > text && end[-1] == '\n') end--;
    }
    *n = (size_t)(end - text);
    return text;
}

// Text from the data field "<array>[index].<key>"; trimmed as the template trims it.
static void text(Renderer *r, RenderedSegment *s, const char *value, const char *array, int index,
                 const char *key, bool trim, bool strip_newlines) {
    if (r->rc != 0) return;
    if (r->special_in_text == SPECIAL_IN_TEXT_ERROR) {
        for (int i = 0; i < r->t->n_controls; i++) {
            if (!strstr(value, r->t->controls[i])) continue;
            r->rc = fail(r->err, r->err_len, "%s[%d].%s: contains the template token '%s' "
                         "(data.special_in_text is \"error\")", array, index, key, r->t->controls[i]);
            return;
        }
    }
    size_t n = 0;
    const char *part = rendered_part(value, trim, strip_newlines, &n);
    push(s, part, n, false);
}

// array[index].key: "<why>, which the <name> template cannot render the same in the reply
// and in later views" (the first error wins).
static void refuse(Renderer *r, const char *array, int index, const char *key, const char *why) {
    if (r->rc == 0)
        r->rc = fail(r->err, r->err_len, "%s[%d].%s: %s, which the %s template cannot render "
                     "the same in the reply and in later views", array, index, key, why, r->t->name);
}

static bool starts_ends(const char *text, const char *start, const char *end) {
    size_t n = strlen(text), ne = strlen(end);
    return strncmp(text, start, strlen(start)) == 0 && n >= ne && strcmp(text + n - ne, end) == 0;
}

// One assistant message's think and answer segments; array[index] names it.
static void reply(Renderer *r, const Message *m, const char *array, int index, RenderedTurn *turn) {
    const ChatTemplate *t = r->t;
    const char *content = m->content ? m->content : "";
    if (t->answer_no_leading_newline && content[0] == '\n')
        refuse(r, array, index, "content", "the answer begins with a newline");
    if (t->always_think && strstr(content, TEMPLATE_THINK_CLOSE))
        refuse(r, array, index, "content", "the answer contains '</think>'");
    size_t answer_len = 0;
    rendered_part(content, t->trim_text, false, &answer_len);
    if (m->reasoning || t->always_think) {
        literal(r, &turn->think, t->think_open);
        text(r, &turn->think, m->reasoning ? m->reasoning : "", array, index, "reasoning", false,
             t->strip_reasoning_newlines);
        // Trimming the whole reply trims the think block's end when the answer is empty.
        size_t close_len = strlen(t->think_close);
        while (t->trim_text && answer_len == 0 && close_len > 0 && strchr(" \t\n\r", t->think_close[close_len - 1]))
            close_len--;
        literal_n(r, &turn->think, t->think_close, close_len);
    }
    if (t->answer_open) literal(r, &turn->answer, t->answer_open);
    text(r, &turn->answer, content, array, index, "content", t->trim_text, false);
    for (int c = 0; c < m->n_tool_calls; c++) {
        const ToolFormat *f = t->tools;
        const ToolCall *call = &m->tool_calls[c];
        if (c > 0 || *content) literal(r, &turn->answer, "\n");
        literal(r, &turn->answer, f->call_open);
        text(r, &turn->answer, call->name, array, index, "tool_calls", false, false);
        literal(r, &turn->answer, f->call_mid);
        text(r, &turn->answer, f->raw_arguments && call->arguments_text ? call->arguments_text : call->arguments,
             array, index, "tool_calls", false, false);
        literal(r, &turn->answer, f->call_close);
    }
    literal(r, &turn->answer, t->end_of_turn);
    turn->empty_think = !m->reasoning || !*m->reasoning;
    turn->context = m->context;
}

// Tool use under a template without tools: refused, naming the first field that has it.
static void refuse_tools(Renderer *r, const Sample *s) {
    const bool conversation = s->kind == SAMPLE_CONVERSATION;
    for (int k = 0; k < 2 && r->rc == 0; k++) {
        const Message *msgs = k == 0 ? s->messages : s->completions;
        const int n = k == 0 ? s->n_messages : s->n_completions;
        const char *array = k == 1 ? "completions" : conversation ? "messages" : "prompt";
        for (int i = 0; i < n && r->rc == 0; i++) {
            const char *what = msgs[i].role == MSG_TOOL ? "role" : msgs[i].n_tool_calls > 0 ? "tool_calls" : NULL;
            if (what)
                r->rc = fail(r->err, r->err_len, "%s[%d].%s: the %s template is not supported with tool %s here",
                             array, i, what, r->t->name, msgs[i].role == MSG_TOOL ? "results" : "calls");
        }
    }
    if (r->rc == 0 && s->n_tools > 0)
        r->rc = fail(r->err, r->err_len, "tools: the %s template is not supported with tool definitions here",
                     r->t->name);
}

// The sample's tool definitions (f->system_sep: with the first system message inside).
static void render_tools(Renderer *r, RenderedSegment *s, const Sample *sample, const Message *system,
                         const char *array) {
    const ToolFormat *f = r->t->tools;
    literal(r, s, f->tools_open);
    if (system) {
        text(r, s, system->content ? system->content : "", array, 0, "content", false, false);
        literal(r, s, f->system_sep);
    }
    literal(r, s, f->tools_intro);
    for (int i = 0; i < sample->n_tools; i++) {
        literal(r, s, f->def_open);
        text(r, s, sample->tools[i], "tools", i, "function", false, false);
        literal(r, s, f->def_close);
    }
    literal(r, s, f->tools_close);
}

// A tool message; msgs[i - 1] and msgs[i + 1] decide whether it opens or closes a run.
static void render_tool_result(Renderer *r, RenderedSegment *s, const Message *msgs, int n_msgs, int i,
                               const char *array) {
    const ToolFormat *f = r->t->tools;
    if (i == 0 || msgs[i - 1].role != MSG_TOOL) literal(r, s, f->results_open);
    literal(r, s, f->result_open);
    text(r, s, msgs[i].content ? msgs[i].content : "", array, i, "content", false, false);
    literal(r, s, f->result_close);
    if (i + 1 == n_msgs || msgs[i + 1].role != MSG_TOOL) literal(r, s, f->results_close);
}

static void segment_free(RenderedSegment *s) {
    for (int i = 0; i < s->n; i++) free(s->pieces[i].text);
    free(s->pieces);
    memset(s, 0, sizeof *s);
}

static void segment_concat(RenderedSegment *dst, const RenderedSegment *src) {
    for (int i = 0; i < src->n; i++)
        push(dst, src->pieces[i].text, strlen(src->pieces[i].text), src->pieces[i].control);
}

static void turn_free(RenderedTurn *t) {
    segment_free(&t->prompt);
    segment_free(&t->think);
    segment_free(&t->answer);
}

// Walks the sample's messages into turns (one per assistant message). The non-assistant
// messages after the last assistant message, plus the assistant header, are left in *trailing.
static void render_turns(Renderer *r, const Sample *s, const char *array, RenderedTurn **turns,
                         int *n_turns, RenderedSegment *trailing) {
    const ChatTemplate *t = r->t;
    const Message *msgs = s->messages;
    const int n_msgs = s->n_messages;
    int cap = 0;
    *turns = NULL;
    *n_turns = 0;
    RenderedSegment prompt = {0};
    literal(r, &prompt, t->bos);
    if (t->default_system && (n_msgs == 0 || msgs[0].role != MSG_SYSTEM)) {
        literal(r, &prompt, t->system_open);
        literal(r, &prompt, t->default_system);
        literal(r, &prompt, t->system_close);
    }
    const bool system_in_tools = s->n_tools > 0 && t->tools->system_sep && n_msgs > 0 && msgs[0].role == MSG_SYSTEM;
    if (s->n_tools > 0) render_tools(r, &prompt, s, system_in_tools ? &msgs[0] : NULL, array);
    bool user_since_reply = true;  // a user message since the previous assistant message
    for (int i = system_in_tools ? 1 : 0; i < n_msgs; i++) {
        const Message *m = &msgs[i];
        const char *content = m->content ? m->content : "";
        if (m->role == MSG_TOOL) {
            render_tool_result(r, &prompt, msgs, n_msgs, i, array);
            continue;
        }
        if (m->role != MSG_ASSISTANT) {
            const bool system = m->role == MSG_SYSTEM;
            if (!system && t->tools && t->tools->refuse_user_tool_response &&
                starts_ends(content, "<tool_response>", "</tool_response>"))
                refuse(r, array, i, "content", "a user message written as a tool response (the "
                       "template takes it for tool results)");
            literal(r, &prompt, system ? t->system_open : t->user_open);
            text(r, &prompt, content, array, i, "content", t->trim_text, false);
            literal(r, &prompt, system ? t->system_close : t->user_close);
            user_since_reply |= !system;
            continue;
        }
        RenderedTurn turn = {.message = i, .continues = *n_turns > 0 && (t->keep_thinking || !user_since_reply)};
        user_since_reply = false;
        const RenderedTurn *prev = *n_turns > 0 ? &(*turns)[*n_turns - 1] : NULL;
        if (turn.continues && t->always_think && prev->empty_think) {
            // The template keeps a reply's think block in the later views of its turn only
            // when it has reasoning: the empty block of prev's own view is not in this view,
            // which starts a new run of kept think blocks (the layouts' turn).
            if (prev->continues)
                refuse(r, array, prev->message, "reasoning", "a reply without reasoning after one "
                       "with reasoning in the same turn, before more tool results");
            turn.continues = false;
        }
        literal(r, &prompt, t->assistant_open);
        turn.prompt = prompt;
        prompt = (RenderedSegment){0};
        literal(r, &prompt, t->after_turn);
        reply(r, m, array, i, &turn);
        ARRAY_PUSH(*turns, *n_turns, cap, turn);
    }
    literal(r, &prompt, t->assistant_open);
    *trailing = prompt;
}

int template_render(const ChatTemplate *t, const Sample *s, SpecialInText special_in_text,
                    RenderedSample *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    out->kind = s->kind;
    Renderer r = {t, special_in_text, err, err_len, 0};
    RenderedSegment trailing = {0};
    const bool conversation = s->kind == SAMPLE_CONVERSATION;
    if (!t->tools) refuse_tools(&r, s);
    if (r.rc != 0) return -1;
    render_turns(&r, s, conversation ? "messages" : "prompt", &out->turns, &out->n_turns, &trailing);
    if (conversation) {
        segment_free(&trailing);
        if (r.rc == 0 && out->n_turns == 0) r.rc = fail(err, err_len, "conversation has no assistant message");
    } else {
        // The prefix is the inference view of the prompt messages: p_0 a_0 … p_k (p_0 th_0 a_0
        // … under keep_thinking).
        for (int i = 0; i < out->n_turns; i++) {
            segment_concat(&out->prefix, &out->turns[i].prompt);
            if (t->keep_thinking) segment_concat(&out->prefix, &out->turns[i].think);
            segment_concat(&out->prefix, &out->turns[i].answer);
            turn_free(&out->turns[i]);
        }
        segment_concat(&out->prefix, &trailing);
        segment_free(&trailing);
        free(out->turns);
        out->turns = xcalloc((size_t)s->n_completions + 1, sizeof(RenderedTurn));
        out->n_turns = s->n_completions;
        for (int i = 0; i < s->n_completions; i++) {
            out->turns[i].message = i;
            reply(&r, &s->completions[i], "completions", i, &out->turns[i]);
        }
        if (r.rc == 0 && out->n_turns == 0) r.rc = fail(err, err_len, "shared-prefix set has no completion");
    }
    if (r.rc != 0) {
        rendered_sample_free(out);
        return -1;
    }
    return 0;
}

void rendered_sample_free(RenderedSample *r) {
    for (int i = 0; i < r->n_turns; i++) turn_free(&r->turns[i]);
    free(r->turns);
    segment_free(&r->prefix);
    r->turns = NULL;
    r->n_turns = 0;
}

char *segment_text(const RenderedSegment *s) {
    size_t n = 0;
    for (int i = 0; i < s->n; i++) n += strlen(s->pieces[i].text);
    char *out = xmalloc(n + 1), *p = out;
    for (int i = 0; i < s->n; i++) {
        size_t k = strlen(s->pieces[i].text);
        memcpy(p, s->pieces[i].text, k);
        p += k;
    }
    *p = '\0';
    return out;
}
