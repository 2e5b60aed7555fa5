// JSONL conversation parsing (formats in data/conversation.h). Every error names
// "path:line: field: what", with field paths like messages[2].role; the parsers write
// "field: what" and sample_parse_line puts the location in front (fail_at).
#define _POSIX_C_SOURCE 200809L
#include "data/conversation.h"

#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "common/check.h"
#include "common/output_file.h"
#include "common/json_names.h"
#include "data/template.h"

// The two message spellings: OpenAI-style "messages" and ShareGPT "conversations".
typedef struct {
    const char *role_key, *content_key;
    const char *role_names[3];  // indexed by MessageRole, for error messages
    bool has_reasoning_field;   // "reasoning_content" (messages format only)
} MessageFormat;

static const MessageFormat FORMAT_MESSAGES = {
    "role", "content", {"system", "user", "assistant"}, true};
static const MessageFormat FORMAT_SHAREGPT = {
    "from", "value", {"system", "human", "gpt"}, false};

static int role_from_name(const char *name) {
    static const struct {
        const char *name;
        MessageRole role;
    } names[] = {{"system", MSG_SYSTEM}, {"user", MSG_USER},       {"human", MSG_USER},
                 {"assistant", MSG_ASSISTANT}, {"gpt", MSG_ASSISTANT}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i].name) == 0) return (int)names[i].role;
    return -1;
}

static char *copy_text(const char *s, size_t n) {
    char *out = xmalloc(n + 1);
    memcpy(out, s, n);
    out[n] = '\0';
    return out;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void message_free(Message *m) {
    free(m->content);
    free(m->reasoning);
    m->content = m->reasoning = NULL;
}

static void messages_free(Message *msgs, int n) {
    for (int i = 0; i < n; i++) message_free(&msgs[i]);
    free(msgs);
}

// Splits an assistant text "<think>R</think>A" into reasoning R and answer A.
// Whitespace around the think block (and at both ends of R) is dropped; the
// answer is otherwise kept byte for byte. Without a leading <think>, the whole
// text is the answer.
static int split_inline_think(const char *field, const char *text, Message *out, char *err,
                              size_t err_len) {
    const char *p = text;
    while (is_space(*p)) p++;
    const size_t open_len = strlen(TEMPLATE_THINK_OPEN), close_len = strlen(TEMPLATE_THINK_CLOSE);
    const char *answer = text;
    if (strncmp(p, TEMPLATE_THINK_OPEN, open_len) == 0) {
        const char *r = p + open_len;
        const char *close = strstr(r, TEMPLATE_THINK_CLOSE);
        if (!close)
            return fail(err, err_len, "%s: unclosed think tag ('%s' without '%s')", field,
                        TEMPLATE_THINK_OPEN, TEMPLATE_THINK_CLOSE);
        const char *r_end = close;
        while (r < r_end && is_space(*r)) r++;
        while (r_end > r && is_space(r_end[-1])) r_end--;
        out->reasoning = copy_text(r, (size_t)(r_end - r));
        answer = close + close_len;
        while (is_space(*answer)) answer++;
    }
    // A tag left in the answer would break the prompt/think/answer segments.
    if (strstr(answer, TEMPLATE_THINK_CLOSE) || strstr(answer, TEMPLATE_THINK_OPEN)) {
        free(out->reasoning);
        out->reasoning = NULL;
        return fail(err, err_len,
                    "%s: think tag inside the answer (only one '%s…%s' block, at the start)", field,
                    TEMPLATE_THINK_OPEN, TEMPLATE_THINK_CLOSE);
    }
    out->content = copy_text(answer, strlen(answer));
    return 0;
}

// Parses element `index` of array `array_name` into `out` (fields named in errors
// as array_name[index].key).
static int parse_message(const MessageFormat *fmt, const char *array_name, int index,
                         const json_t *obj, Message *out, char *err, size_t err_len) {
    char field[160];
    memset(out, 0, sizeof(*out));
    snprintf(field, sizeof(field), "%s[%d]", array_name, index);
    if (!json_is_object(obj))
        return fail(err, err_len, "%s: expected an object, got %s", field, json_type_name(obj));

    const json_t *role = json_object_get(obj, fmt->role_key);
    if (!role) return fail(err, err_len, "%s: missing field '%s'", field, fmt->role_key);
    if (!json_is_string(role))
        return fail(err, err_len, "%s.%s: expected a string, got %s", field, fmt->role_key,
                    json_type_name(role));
    int r = role_from_name(json_string_value(role));
    if (r < 0)
        return fail(err, err_len, "%s.%s: unknown role '%s'", field, fmt->role_key,
                    json_string_value(role));
    out->role = (MessageRole)r;

    const json_t *content = json_object_get(obj, fmt->content_key);
    if (!content) return fail(err, err_len, "%s: missing field '%s'", field, fmt->content_key);
    if (!json_is_string(content))
        return fail(err, err_len, "%s.%s: expected a string, got %s", field, fmt->content_key,
                    json_type_name(content));

    // reasoning_content: a string or null; "" and null both mean "no reasoning".
    const char *reasoning = NULL;
    const json_t *reasoning_json =
        fmt->has_reasoning_field ? json_object_get(obj, "reasoning_content") : NULL;
    if (reasoning_json && !json_is_null(reasoning_json)) {
        if (!json_is_string(reasoning_json))
            return fail(err, err_len, "%s.reasoning_content: expected a string, got %s", field,
                        json_type_name(reasoning_json));
        if (out->role != MSG_ASSISTANT)
            return fail(err, err_len,
                        "%s.reasoning_content: only assistant messages have reasoning", field);
        if (json_string_length(reasoning_json) > 0) reasoning = json_string_value(reasoning_json);
    }

    const char *text = json_string_value(content);
    if (out->role != MSG_ASSISTANT) {
        out->content = copy_text(text, strlen(text));
        return 0;
    }
    char content_field[200];
    snprintf(content_field, sizeof(content_field), "%s.%s", field, fmt->content_key);
    if (split_inline_think(content_field, text, out, err, err_len) != 0) return -1;
    if (reasoning) {
        if (out->reasoning) {
            message_free(out);
            return fail(err, err_len, "%s: both reasoning_content and an inline '%s' block", field,
                        TEMPLATE_THINK_OPEN);
        }
        out->reasoning = copy_text(reasoning, strlen(reasoning));
    }
    return 0;
}

// Parses the array under `key` of `root` into a malloc'd message list.
static int parse_message_array(const MessageFormat *fmt, const json_t *root, const char *key,
                               Message **out, int *n_out, char *err, size_t err_len) {
    *out = NULL;
    *n_out = 0;
    const json_t *arr = json_object_get(root, key);
    if (!arr) return fail(err, err_len, "missing field '%s'", key);
    if (!json_is_array(arr))
        return fail(err, err_len, "%s: expected an array, got %s", key, json_type_name(arr));
    int n = (int)json_array_size(arr);
    Message *msgs = xcalloc((size_t)n, sizeof(Message));
    for (int i = 0; i < n; i++) {
        if (parse_message(fmt, key, i, json_array_get(arr, i), &msgs[i], err, err_len) != 0) {
            messages_free(msgs, i);
            return -1;
        }
    }
    *out = msgs;
    *n_out = n;
    return 0;
}

// Checks the turn structure: an optional system message first, then user and
// assistant alternating, ending with `last_role`.
static int check_turn_order(const MessageFormat *fmt, const char *key, const Message *msgs, int n,
                            MessageRole last_role, char *err, size_t err_len) {
    if (n == 0) return fail(err, err_len, "%s: empty conversation", key);
    MessageRole expected = MSG_USER;
    bool has_assistant = false;
    for (int i = 0; i < n; i++) {
        MessageRole role = msgs[i].role;
        if (role == MSG_SYSTEM) {
            if (i > 0)
                return fail(err, err_len, "%s[%d].%s: a system message may only come first", key, i,
                            fmt->role_key);
            continue;
        }
        if (role != expected)
            return fail(err, err_len, "%s[%d].%s: expected '%s' here, got '%s'", key, i,
                        fmt->role_key, fmt->role_names[expected], fmt->role_names[role]);
        has_assistant |= role == MSG_ASSISTANT;
        expected = role == MSG_USER ? MSG_ASSISTANT : MSG_USER;
    }
    if (last_role == MSG_ASSISTANT && !has_assistant)
        return fail(err, err_len, "%s: no %s message", key, fmt->role_names[MSG_ASSISTANT]);
    if (msgs[n - 1].role != last_role)
        return fail(err, err_len, "%s[%d].%s: the last message must be '%s', got '%s'", key, n - 1,
                    fmt->role_key, fmt->role_names[last_role], fmt->role_names[msgs[n - 1].role]);
    return 0;
}

static int parse_conversation(const MessageFormat *fmt, const json_t *root, const char *key,
                              MessageRole last_role, Sample *out, char *err, size_t err_len) {
    out->kind = SAMPLE_CONVERSATION;
    if (parse_message_array(fmt, root, key, &out->messages, &out->n_messages, err, err_len) != 0)
        return -1;
    return check_turn_order(fmt, key, out->messages, out->n_messages, last_role, err, err_len);
}

static int parse_shared_prefix(const json_t *root, Sample *out, char *err, size_t err_len) {
    const MessageFormat *fmt = &FORMAT_MESSAGES;
    out->kind = SAMPLE_SHARED_PREFIX;
    if (parse_message_array(fmt, root, "prompt", &out->messages, &out->n_messages, err,
                            err_len) != 0)
        return -1;
    if (out->n_messages == 0) return fail(err, err_len, "prompt: empty prompt");
    if (check_turn_order(fmt, "prompt", out->messages, out->n_messages, MSG_USER, err,
                         err_len) != 0)
        return -1;
    if (parse_message_array(fmt, root, "completions", &out->completions, &out->n_completions, err,
                            err_len) != 0)
        return -1;
    if (out->n_completions == 0) return fail(err, err_len, "completions: empty completions list");
    for (int i = 0; i < out->n_completions; i++)
        if (out->completions[i].role != MSG_ASSISTANT)
            return fail(err, err_len, "completions[%d].role: expected 'assistant', got '%s'", i,
                        fmt->role_names[out->completions[i].role]);
    return 0;
}

// Parses one JSON line into out; a conversation must end with last_role. Returns 0, or -1
// with a location-free message in err.
static int parse_sample(const char *text, size_t len, MessageRole last_role, Sample *out,
                        char *err, size_t err_len) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_invalid_utf8)
            return fail(err, err_len, "invalid UTF-8 at byte %d (%s)", jerr.position, jerr.text);
        return fail(err, err_len, "malformed JSON at column %d: %s", jerr.column, jerr.text);
    }
    int rc;
    const bool has_messages = json_object_get(root, "messages") != NULL;
    const bool has_sharegpt = json_object_get(root, "conversations") != NULL;
    const bool has_prompt =
        json_object_get(root, "prompt") != NULL || json_object_get(root, "completions") != NULL;
    if (!json_is_object(root))
        rc = fail(err, err_len, "top level: expected an object, got %s", json_type_name(root));
    else if (has_messages + has_sharegpt + has_prompt > 1)
        rc = fail(err, err_len, "ambiguous line: more than one of 'messages', 'conversations', "
                                "'prompt'/'completions'");
    else if (has_messages)
        rc = parse_conversation(&FORMAT_MESSAGES, root, "messages", last_role, out, err, err_len);
    else if (has_sharegpt)
        rc = parse_conversation(&FORMAT_SHAREGPT, root, "conversations", last_role, out, err,
                                err_len);
    else if (has_prompt)
        rc = parse_shared_prefix(root, out, err, err_len);
    else
        rc = fail(err, err_len, "missing field: expected 'messages', 'conversations' or "
                                "'prompt' with 'completions'");
    json_decref(root);
    return rc;
}

static int parse_line(const char *text, size_t len, const char *path, int line,
                      MessageRole last_role, Sample *out, char *err, size_t err_len) {
    memset(out, 0, sizeof(*out));
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        return fail_at(err, err_len, path, line, "starts with a UTF-8 byte order mark (BOM); "
                       "save the file without one");
    char why[1024];
    int rc = parse_sample(text, len, last_role, out, why, sizeof why);
    if (rc != 0) {
        sample_free(out);
        fail_at(err, err_len, path, line, "%s", why);
    }
    out->line = line;
    return rc;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_space(s[i])) return false;
    return true;
}

int sample_parse_line(const char *text, size_t len, const char *path, int line, Sample *out,
                      char *err, size_t err_len) {
    return parse_line(text, len, path, line, MSG_ASSISTANT, out, err, err_len);
}

static void load_lines(const char *path, bool skip_bad, MessageRole last_role, Dataset *out) {
    enum { MAX_SKIP_WARNINGS = 5 };
    memset(out, 0, sizeof(*out));
    char err[1024];
    if (input_file_check(path, err, sizeof err) != 0) fatal("%s", err);
    FILE *f = fopen(path, "rb");
    if (!f) fatal("%s: cannot open: %s", path, strerror(errno));
    int cap = 0, line = 0;
    char *buf = NULL;
    size_t buf_cap = 0;
    ssize_t n;
    while ((n = getline(&buf, &buf_cap, f)) >= 0) {
        line++;
        if (is_blank(buf, (size_t)n)) continue;
        Sample s;
        if (parse_line(buf, (size_t)n, path, line, last_role, &s, err, sizeof(err)) != 0) {
            if (!skip_bad) fatal("%s", err);
            if (out->n_skipped++ < MAX_SKIP_WARNINGS)
                fprintf(stderr, "onepass: warning: skipping bad line: %s\n", err);
            continue;
        }
        ARRAY_PUSH(out->samples, out->n_samples, cap, s);
    }
    if (ferror(f)) fatal("%s: read error: %s", path, strerror(errno));
    free(buf);
    fclose(f);
    if (out->n_skipped > MAX_SKIP_WARNINGS)
        fprintf(stderr, "onepass: warning: %s: %d bad lines skipped in all\n", path,
                out->n_skipped);
    if (out->n_samples == 0)
        fatal("%s: no usable samples (%d bad lines skipped)", path, out->n_skipped);
}

void dataset_load(const char *path, bool skip_bad, Dataset *out) {
    load_lines(path, skip_bad, MSG_ASSISTANT, out);
}

void prompts_load(const char *path, Dataset *out) { load_lines(path, false, MSG_USER, out); }

void sample_free(Sample *s) {
    messages_free(s->messages, s->n_messages);
    messages_free(s->completions, s->n_completions);
    s->messages = s->completions = NULL;
    s->n_messages = s->n_completions = 0;
}

void dataset_free(Dataset *d) {
    for (int i = 0; i < d->n_samples; i++) sample_free(&d->samples[i]);
    free(d->samples);
    memset(d, 0, sizeof(*d));
}
