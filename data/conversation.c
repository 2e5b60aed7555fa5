// JSONL conversation parsing (formats in data/conversation.h). Every error names
// "path:line: field: what", with field paths like messages[2].role; the parsers write
// "field: what" and sample_parse_line puts the location in front (fail_at).
#define _POSIX_C_SOURCE 200809L
#include "data/conversation.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/output_file.h"
#include "common/json_names.h"

// The two message spellings: OpenAI-style "messages" and ShareGPT "conversations".
typedef struct {
    const char *role_key, *content_key;
    const char *role_names[4];  // indexed by MessageRole, for error messages
} MessageFormat;

static const MessageFormat FORMAT_MESSAGES = {
    "role", "content", {"system", "user", "assistant", "tool"}};
static const MessageFormat FORMAT_SHAREGPT = {
    "from", "value", {"system", "human", "gpt", "tool"}};

static int role_from_name(const char *name) {
    static const struct {
        const char *name;
        MessageRole role;
    } names[] = {{"system", MSG_SYSTEM},       {"developer", MSG_SYSTEM}, {"user", MSG_USER},
                 {"human", MSG_USER},          {"assistant", MSG_ASSISTANT},
                 {"gpt", MSG_ASSISTANT},       {"tool", MSG_TOOL}};
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

static char *copy_string(const char *s) { return s ? copy_text(s, strlen(s)) : NULL; }

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void message_free(Message *m) {
    free(m->content);
    free(m->reasoning);
    for (int i = 0; i < m->n_tool_calls; i++) {
        free(m->tool_calls[i].id);
        free(m->tool_calls[i].name);
        free(m->tool_calls[i].arguments);
        free(m->tool_calls[i].arguments_text);
    }
    free(m->tool_calls);
    free(m->name);
    free(m->tool_call_id);
    memset(m, 0, sizeof *m);
}

static void messages_free(Message *msgs, int n) {
    for (int i = 0; i < n; i++) message_free(&msgs[i]);
    free(msgs);
}

// ---- Unknown keys: refused by name, or counted under ignore_unknown_keys.

static void key_tally_list(const KeyTally *t, char *buf, size_t len, size_t n);

static void key_tally_add(KeyTally *t, const char *name) {
    t->total++;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->names[i], name) == 0) {
            t->counts[i]++;
            return;
        }
    if (t->n == KEY_TALLY_NAMES) {
        t->others++;
        return;
    }
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 8;
        t->names = xrealloc(t->names, (size_t)t->cap * sizeof *t->names);
        t->counts = xrealloc(t->counts, (size_t)t->cap * sizeof *t->counts);
    }
    t->names[t->n] = copy_string(name);
    t->counts[t->n++] = 1;
}

void key_tally_describe(const KeyTally *t, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%lld unknown key%s ignored (data.ignore_unknown_keys):",
                                t->total, t->total == 1 ? "" : "s");
    key_tally_list(t, buf, len, n);
}

void metadata_tally_describe(const KeyTally *t, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%lld metadata key%s read, not rendered:", t->total,
                                t->total == 1 ? "" : "s");
    key_tally_list(t, buf, len, n);
}

// Appends " name (count), ..." to buf, which holds n bytes.
static void key_tally_list(const KeyTally *t, char *buf, size_t len, size_t n) {
    for (int i = 0; i < t->n && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s %s (%lld)", i ? "," : "", t->names[i],
                              t->counts[i]);
    if (t->others && n < len) snprintf(buf + n, len - n, ", %lld of other names", t->others);
}

void key_tally_free(KeyTally *t) {
    for (int i = 0; i < t->n; i++) free(t->names[i]);
    free(t->names);
    free(t->counts);
    memset(t, 0, sizeof *t);
}

static bool in_list(const char *key, const char *const *known) {
    for (int i = 0; known[i]; i++)
        if (strcmp(key, known[i]) == 0) return true;
    return false;
}

// The key of known (NULL-terminated) within 2 edits of key (a typo), or NULL.
static const char *closest_key(const char *key, const char *const *known) {
    const size_t n = strlen(key);
    for (int i = 0; known[i] && n < 64; i++) {
        const size_t m = strlen(known[i]);
        if (m >= 64) continue;
        int row[65];
        for (size_t j = 0; j <= m; j++) row[j] = (int)j;
        for (size_t a = 1; a <= n; a++) {
            int diag = row[0];
            row[0] = (int)a;
            for (size_t j = 1; j <= m; j++) {
                const int up = row[j], sub = diag + (key[a - 1] != known[i][j - 1]);
                row[j] = sub < up + 1 ? sub : up + 1;
                if (row[j - 1] + 1 < row[j]) row[j] = row[j - 1] + 1;
                diag = up;
            }
        }
        if (row[m] <= 2 && row[m] < (int)m / 2) return known[i];
    }
    return NULL;
}

// The top-level keys of Hub datasets that describe a line rather than hold its
// conversation: read, counted in ParseOptions.metadata, never rendered.
static const char *const METADATA_KEYS[] = {
    "id", "uuid", "conversation_id", "source", "dataset", "category", "domain", "difficulty",
    "metadata", "license", "language", "model", "generator", "version", NULL};

static void count_metadata(const ParseOptions *opt, const char *name) {
    if (opt->metadata) key_tally_add(opt->metadata, name);
}

// Every key of obj not in known (NULL-terminated): an error naming field.key, or counted
// as tally_prefix + key ("messages[].weight") under ignore_unknown_keys. At the top level
// (field ""), METADATA_KEYS are known and counted as metadata.
static int check_keys(const ParseOptions *opt, const json_t *obj, const char *const *known,
                      const char *field, const char *tally_prefix, char *err, size_t err_len) {
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        if (in_list(key, known)) continue;
        if (!*field && in_list(key, METADATA_KEYS)) {
            count_metadata(opt, key);
            continue;
        }
        const char *near = closest_key(key, known);
        if (!near && !*field) near = closest_key(key, METADATA_KEYS);
        if (!opt->ignore_unknown_keys)
            return fail(err, err_len, "%s%s%s: unknown key%s%s%s (set data.ignore_unknown_keys to "
                        "ignore such keys)", field, *field ? "." : "", key, near ? " (did you mean '" : "",
                        near ? near : "", near ? "'?)" : "");
        if (opt->ignored) {
            char name[256];
            snprintf(name, sizeof name, "%s%s%s", tally_prefix, *tally_prefix ? "." : "", key);
            key_tally_add(opt->ignored, name);
        }
    }
    return 0;
}

// ---- Canonical JSON text: what Python's json.dumps(v, ensure_ascii=False) writes, the
// text the chat templates' `tojson` renders for tool arguments and definitions.

typedef struct {
    char *s;
    size_t n, cap;
} Text;

static void text_put(Text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = 2 * (t->n + n + 1);
        t->s = xrealloc(t->s, t->cap);
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = '\0';
}

static void text_puts(Text *t, const char *s) { text_put(t, s, strlen(s)); }

static void json_string_python(Text *t, const char *s, size_t n) {
    text_puts(t, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *named = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                          : c == '\f' ? "\\f" : NULL;
        if (named) {
            text_puts(t, named);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            text_puts(t, esc);
        } else {
            text_put(t, (const char *)&c, 1);
        }
    }
    text_puts(t, "\"");
}

// Python's repr(float): the shortest digits that read back as x, in fixed notation for
// decimal exponents -4..15 ("0.0001", "1.0"), else "1.5e+16" / "1e-05".
static void json_real_python(Text *t, double x) {
    char buf[64], digits[32], out[96];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    snprintf(buf, sizeof buf, "%.*e", p - 1, fabs(x));
    int nd = 0;
    for (const char *c = buf; *c && *c != 'e'; c++)
        if (*c != '.') digits[nd++] = *c;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp = atoi(strchr(buf, 'e') + 1);
    int n = 0;
    if (signbit(x)) out[n++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            n += snprintf(out + n, sizeof out - (size_t)n, "0.%.*s%s", -exp - 1, "0000", digits);
        } else {
            for (int i = 0; i <= exp; i++) out[n++] = i < nd ? digits[i] : '0';
            n += snprintf(out + n, sizeof out - (size_t)n, ".%s", nd > exp + 1 ? digits + exp + 1 : "0");
        }
    } else {
        out[n++] = digits[0];
        if (nd > 1) n += snprintf(out + n, sizeof out - (size_t)n, ".%s", digits + 1);
        n += snprintf(out + n, sizeof out - (size_t)n, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    }
    text_put(t, out, (size_t)n);
}

static void json_python(Text *t, const json_t *v) {
    char buf[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        const json_t *value;
        bool first = true;
        text_puts(t, "{");
        json_object_foreach((json_t *)v, key, value) {
            if (!first) text_puts(t, ", ");
            first = false;
            json_string_python(t, key, strlen(key));
            text_puts(t, ": ");
            json_python(t, value);
        }
        text_puts(t, "}");
        return;
    }
    case JSON_ARRAY:
        text_puts(t, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) text_puts(t, ", ");
            json_python(t, json_array_get(v, i));
        }
        text_puts(t, "]");
        return;
    case JSON_STRING: json_string_python(t, json_string_value(v), json_string_length(v)); return;
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        text_puts(t, buf);
        return;
    case JSON_REAL: json_real_python(t, json_real_value(v)); return;
    case JSON_TRUE: text_puts(t, "true"); return;
    case JSON_FALSE: text_puts(t, "false"); return;
    case JSON_NULL: text_puts(t, "null"); return;
    }
}

// A value given as a JSON string of itself (tool arguments, some sets' "tools"): *v
// becomes the decoded value, owned by *parsed (NULL when *v was no string).
static int decode_json_string(const json_t **v, json_t **parsed, const char *field, char *err,
                              size_t err_len) {
    *parsed = NULL;
    if (!json_is_string(*v)) return 0;
    json_error_t jerr;
    *parsed = json_loadb(json_string_value(*v), json_string_length(*v),
                         JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!*parsed)
        return fail(err, err_len, "%s: a string that is not valid JSON (%s)", field, jerr.text);
    *v = *parsed;
    return 0;
}

// The canonical text of `v`, an object or a JSON string holding one; field names it in
// errors.
static int canonical_json(const json_t *v, const char *field, char **out, char *err,
                          size_t err_len) {
    json_t *parsed = NULL;
    if (decode_json_string(&v, &parsed, field, err, err_len) != 0) return -1;
    if (!json_is_object(v)) {
        const char *got = json_type_name(v);
        json_decref(parsed);
        return fail(err, err_len, "%s: expected an object (or a JSON string of one), got %s",
                    field, got);
    }
    Text t = {0};
    json_python(&t, v);
    json_decref(parsed);
    *out = t.s;
    return 0;
}

// ---- Messages

// Content: a string, or an array of parts of which only {"type": "text", "text": ...}
// is supported (concatenated). null only where allow_null ("" then).
static int parse_content(const ParseOptions *opt, const json_t *v, const char *field,
                         const char *tally_field, bool allow_null, char **out, char *err,
                         size_t err_len) {
    *out = NULL;
    if (json_is_null(v) && allow_null) {
        *out = copy_string("");
        return 0;
    }
    if (json_is_string(v)) {
        *out = copy_text(json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!json_is_array(v))
        return fail(err, err_len, "%s: expected a string or an array of parts, got %s", field,
                    json_type_name(v));
    static const char *const part_keys[] = {"type", "text", NULL};
    char part_field[240], tally[240];
    snprintf(tally, sizeof tally, "%s[]", tally_field);
    Text t = {0};
    text_puts(&t, "");
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *part = json_array_get(v, i);
        snprintf(part_field, sizeof part_field, "%s[%zu]", field, i);
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        int rc = 0;
        if (!json_is_object(part))
            rc = fail(err, err_len, "%s: expected an object, got %s", part_field,
                      json_type_name(part));
        else if (!json_is_string(type))
            rc = fail(err, err_len, "%s.type: expected a string, got %s", part_field,
                      type ? json_type_name(type) : "nothing");
        else if (strcmp(json_string_value(type), "text") != 0)
            rc = fail(err, err_len, "%s.type: \"%s\" is not supported (only \"text\" parts)",
                      part_field, json_string_value(type));
        else if (!json_is_string(text))
            rc = fail(err, err_len, "%s.text: expected a string, got %s", part_field,
                      text ? json_type_name(text) : "nothing");
        else
            rc = check_keys(opt, part, part_keys, part_field, tally, err, err_len);
        if (rc != 0) {
            free(t.s);
            return -1;
        }
        text_put(&t, json_string_value(text), json_string_length(text));
    }
    *out = t.s;
    return 0;
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

// An optional string field of obj into *out (NULL when absent).
static int optional_string(const json_t *obj, const char *key, const char *field, char **out,
                           char *err, size_t err_len) {
    const json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    if (!json_is_string(v))
        return fail(err, err_len, "%s.%s: expected a string, got %s", field, key, json_type_name(v));
    *out = copy_text(json_string_value(v), json_string_length(v));
    return 0;
}

// One tool call, OpenAI {"id"?, "type"?: "function", "function": {"name", "arguments"}}
// or bare {"id"?, "type"?, "name", "arguments"}.
static int parse_tool_call(const ParseOptions *opt, const json_t *obj, const char *field,
                           ToolCall *out, char *err, size_t err_len) {
    static const char *const wrapped_keys[] = {"id", "type", "function", NULL};
    static const char *const bare_keys[] = {"id", "type", "name", "arguments", NULL};
    static const char *const function_keys[] = {"name", "arguments", NULL};
    if (!json_is_object(obj))
        return fail(err, err_len, "%s: expected an object, got %s", field, json_type_name(obj));
    const json_t *type = json_object_get(obj, "type");
    if (type && !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0))
        return fail(err, err_len, "%s.type: only \"function\" tool calls are supported", field);
    if (optional_string(obj, "id", field, &out->id, err, err_len) != 0) return -1;
    const json_t *fn = json_object_get(obj, "function");
    char fn_field[260];
    if (fn) {
        if (check_keys(opt, obj, wrapped_keys, field, "messages[].tool_calls[]", err, err_len) != 0)
            return -1;
        snprintf(fn_field, sizeof fn_field, "%s.function", field);
        if (!json_is_object(fn))
            return fail(err, err_len, "%s: expected an object, got %s", fn_field, json_type_name(fn));
        if (check_keys(opt, fn, function_keys, fn_field, "messages[].tool_calls[].function", err,
                       err_len) != 0)
            return -1;
    } else {
        if (check_keys(opt, obj, bare_keys, field, "messages[].tool_calls[]", err, err_len) != 0)
            return -1;
        snprintf(fn_field, sizeof fn_field, "%s", field);
        fn = obj;
    }
    const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
    if (!name) return fail(err, err_len, "%s: missing field 'name'", fn_field);
    if (!json_is_string(name))
        return fail(err, err_len, "%s.name: expected a string, got %s", fn_field, json_type_name(name));
    if (!args) return fail(err, err_len, "%s: missing field 'arguments'", fn_field);
    out->name = copy_string(json_string_value(name));
    char args_field[280];
    snprintf(args_field, sizeof args_field, "%s.arguments", fn_field);
    if (json_is_string(args)) out->arguments_text = copy_string(json_string_value(args));
    return canonical_json(args, args_field, &out->arguments, err, err_len);
}

static int parse_tool_calls(const ParseOptions *opt, const json_t *arr, const char *field,
                            Message *out, char *err, size_t err_len) {
    if (!json_is_array(arr))
        return fail(err, err_len, "%s.tool_calls: expected an array, got %s", field,
                    json_type_name(arr));
    out->tool_calls = xcalloc(json_array_size(arr) + 1, sizeof(ToolCall));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        char call_field[240];
        snprintf(call_field, sizeof call_field, "%s.tool_calls[%zu]", field, i);
        out->n_tool_calls++;  // counted first, so that message_free frees a half-parsed call
        if (parse_tool_call(opt, json_array_get(arr, i), call_field, &out->tool_calls[i], err,
                            err_len) != 0)
            return -1;
    }
    return 0;
}

// The assistant's reasoning field: "reasoning_content", "reasoning" (vLLM) or "thinking",
// a string or null; "" and null both mean "no reasoning". More than one given: they must
// hold the same text. *key_out names the first one given.
static int reasoning_field(const json_t *obj, const char *field, MessageRole role,
                           const json_t **out, const char **key_out, char *err, size_t err_len) {
    static const char *const names[] = {"reasoning_content", "reasoning", "thinking"};
    const json_t *v = NULL;
    *out = NULL;
    *key_out = names[0];
    for (int i = 0; i < 3; i++) {
        const json_t *w = json_object_get(obj, names[i]);
        if (!w) continue;
        if (!json_is_null(w) && !json_is_string(w))
            return fail(err, err_len, "%s.%s: expected a string, got %s", field, names[i],
                        json_type_name(w));
        if (!v) {
            v = w;
            *key_out = names[i];
            continue;
        }
        const char *a = json_is_string(v) ? json_string_value(v) : "";
        const char *b = json_is_string(w) ? json_string_value(w) : "";
        if (strcmp(a, b) != 0)
            return fail(err, err_len, "%s: both %s and %s, with different texts (names of the "
                        "same reasoning: give one)", field, *key_out, names[i]);
    }
    if (!v || json_is_null(v)) return 0;
    if (role != MSG_ASSISTANT)
        return fail(err, err_len, "%s.%s: only assistant messages have reasoning", field, *key_out);
    if (json_string_length(v) > 0) *out = v;
    return 0;
}

// Parses element `index` of array `array_name` into `out` (fields named in errors
// as array_name[index].key).
static int parse_message(const ParseOptions *opt, const MessageFormat *fmt, const char *array_name,
                         int index, const json_t *obj, Message *out, char *err, size_t err_len) {
    char field[160], tally[64];
    memset(out, 0, sizeof(*out));
    snprintf(field, sizeof(field), "%s[%d]", array_name, index);
    snprintf(tally, sizeof tally, "%s[]", array_name);
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

    // The keys each role reads; any other is unknown.
    // "name" of a system, user or assistant message (a speaker's name): read, counted as
    // metadata, not rendered (the chat templates do not render it).
    const char *const common_keys[] = {fmt->role_key, fmt->content_key, "reasoning_content",
                                       "reasoning", "thinking", "name", NULL};
    const char *const assistant_keys[] = {fmt->role_key, fmt->content_key, "reasoning_content",
                                          "reasoning", "thinking", "tool_calls", "name", NULL};
    const char *const tool_keys[] = {fmt->role_key, fmt->content_key, "name", "tool_call_id", NULL};
    const char *const *known = out->role == MSG_ASSISTANT ? assistant_keys
                             : out->role == MSG_TOOL      ? tool_keys
                                                          : common_keys;
    if (check_keys(opt, obj, known, field, tally, err, err_len) != 0) return -1;
    if (out->role != MSG_TOOL && json_object_get(obj, "name")) {
        const json_t *name = json_object_get(obj, "name");
        if (!json_is_string(name) && !json_is_null(name))
            return fail(err, err_len, "%s.name: expected a string, got %s", field,
                        json_type_name(name));
        char meta[96];
        snprintf(meta, sizeof meta, "%s.name", tally);
        count_metadata(opt, meta);
    }

    const json_t *calls = out->role == MSG_ASSISTANT ? json_object_get(obj, "tool_calls") : NULL;
    if (calls && parse_tool_calls(opt, calls, field, out, err, err_len) != 0) goto fail;
    if (out->role == MSG_TOOL &&
        (optional_string(obj, "name", field, &out->name, err, err_len) != 0 ||
         optional_string(obj, "tool_call_id", field, &out->tool_call_id, err, err_len) != 0))
        goto fail;

    // An assistant message that calls tools may have no content (OpenAI: null).
    const bool calls_tools = out->n_tool_calls > 0;
    const json_t *content = json_object_get(obj, fmt->content_key);
    char content_field[200];
    snprintf(content_field, sizeof(content_field), "%s.%s", field, fmt->content_key);
    char tally_content[96];
    snprintf(tally_content, sizeof tally_content, "%s.%s", tally, fmt->content_key);
    char *text = NULL;
    if (!content && calls_tools) {
        text = copy_string("");
    } else if (!content) {
        fail(err, err_len, "%s: missing field '%s'", field, fmt->content_key);
        goto fail;
    } else if (parse_content(opt, content, content_field, tally_content, calls_tools, &text, err,
                             err_len) != 0) {
        goto fail;
    }

    const json_t *reasoning;
    const char *reasoning_key;
    if (reasoning_field(obj, field, out->role, &reasoning, &reasoning_key, err, err_len) != 0) {
        free(text);
        goto fail;
    }
    if (out->role != MSG_ASSISTANT) {
        out->content = text;
        return 0;
    }
    int rc = split_inline_think(content_field, text, out, err, err_len);
    free(text);
    if (rc != 0) goto fail;
    if (reasoning) {
        if (out->reasoning) {
            fail(err, err_len, "%s: both %s and an inline '%s' block", field, reasoning_key,
                 TEMPLATE_THINK_OPEN);
            goto fail;
        }
        out->reasoning = copy_text(json_string_value(reasoning), json_string_length(reasoning));
    }
    return 0;
fail:
    message_free(out);
    return -1;
}

// Parses the array under `key` of `root` into a malloc'd message list.
static int parse_message_array(const ParseOptions *opt, const MessageFormat *fmt,
                               const json_t *root, const char *key, Message **out, int *n_out,
                               char *err, size_t err_len) {
    *out = NULL;
    *n_out = 0;
    const json_t *arr = json_object_get(root, key);
    if (!arr) return fail(err, err_len, "missing field '%s'", key);
    if (json_is_string(arr))
        return fail(err, err_len, "%s: a string (TRL's standard, non-conversational format) is "
                    "not supported: give a list of messages", key);
    if (!json_is_array(arr))
        return fail(err, err_len, "%s: expected an array, got %s", key, json_type_name(arr));
    int n = (int)json_array_size(arr);
    // "developer" is the system message (no template here has a developer role): a line
    // with both names it twice.
    int system_at = -1, developer_at = -1;
    for (int i = 0; i < n; i++) {
        const json_t *role = json_object_get(json_array_get(arr, i), fmt->role_key);
        const char *r = json_is_string(role) ? json_string_value(role) : "";
        if (strcmp(r, "system") == 0 && system_at < 0) system_at = i;
        if (strcmp(r, "developer") == 0 && developer_at < 0) developer_at = i;
    }
    if (system_at >= 0 && developer_at >= 0)
        return fail(err, err_len, "%s[%d].%s: 'developer' is the system message (the chat "
                    "templates have no developer role), and %s[%d] is 'system' already: give one",
                    key, developer_at, fmt->role_key, key, system_at);
    Message *msgs = xcalloc((size_t)n + 1, sizeof(Message));
    for (int i = 0; i < n; i++) {
        if (parse_message(opt, fmt, key, i, json_array_get(arr, i), &msgs[i], err, err_len) != 0) {
            messages_free(msgs, i);
            return -1;
        }
    }
    *out = msgs;
    *n_out = n;
    return 0;
}

// Checks the turn structure: an optional system message first, then user turns: one or
// more user messages, an assistant message, and, while the last assistant message called tools,
// tool results and the assistant's next message; ending with `last_role`. `before`: the
// role of the message before msgs[0] (MSG_SYSTEM: none, msgs starts the conversation).
static int check_turn_order(const MessageFormat *fmt, const char *key, const Message *msgs, int n,
                            MessageRole before, MessageRole last_role, char *err, size_t err_len) {
    if (n == 0) return fail(err, err_len, "%s: empty conversation", key);
    MessageRole prev = before;
    bool has_assistant = false, calls_pending = false;
    for (int i = 0; i < n; i++) {
        MessageRole role = msgs[i].role;
        const char *const *names = fmt->role_names;
        if (role == MSG_SYSTEM) {
            if (i > 0 || before != MSG_SYSTEM)
                return fail(err, err_len, "%s[%d].%s: a system message may only come first", key, i,
                            fmt->role_key);
            continue;
        }
        bool ok;
        const char *expected;
        if (prev == MSG_SYSTEM) {
            ok = role == MSG_USER, expected = names[MSG_USER];
        } else if (prev == MSG_USER) {
            // Consecutive user messages render one after the other, as the official
            // templates render them, all in the prompt of the next reply.
            ok = role == MSG_ASSISTANT || role == MSG_USER, expected = names[MSG_ASSISTANT];
        } else if (prev == MSG_TOOL) {
            ok = role == MSG_TOOL || role == MSG_ASSISTANT;
            expected = "tool' or 'assistant";
        } else {  // after an assistant message: the results of its calls, else the next turn
            ok = role == (calls_pending ? MSG_TOOL : MSG_USER);
            expected = names[calls_pending ? MSG_TOOL : MSG_USER];
        }
        if (!ok) {
            if (role == MSG_TOOL && prev == MSG_ASSISTANT)
                return fail(err, err_len, "%s[%d].%s: a tool result must follow an assistant "
                            "message with tool_calls", key, i, fmt->role_key);
            return fail(err, err_len, "%s[%d].%s: expected '%s' here, got '%s'", key, i,
                        fmt->role_key, expected, names[role]);
        }
        if (role == MSG_ASSISTANT) calls_pending = msgs[i].n_tool_calls > 0;
        has_assistant |= role == MSG_ASSISTANT;
        prev = role;
    }
    if (last_role == MSG_ASSISTANT && !has_assistant)
        return fail(err, err_len, "%s: no %s message", key, fmt->role_names[MSG_ASSISTANT]);
    if (msgs[n - 1].role != last_role)
        return fail(err, err_len, "%s[%d].%s: the last message must be '%s', got '%s'", key, n - 1,
                    fmt->role_key, fmt->role_names[last_role], fmt->role_names[msgs[n - 1].role]);
    return 0;
}

// Top-level "tools": an array of definitions (or a JSON string of one, as some ShareGPT
// sets have it), each kept as canonical JSON text.
static int parse_tools(const json_t *root, Sample *out, char *err, size_t err_len) {
    const json_t *tools = json_object_get(root, "tools");
    if (!tools || json_is_null(tools)) return 0;
    json_t *parsed = NULL;
    if (decode_json_string(&tools, &parsed, "tools", err, err_len) != 0) return -1;
    int rc = 0;
    if (!json_is_array(tools)) {
        rc = fail(err, err_len, "tools: expected an array (or a JSON string of one), got %s",
                  json_type_name(tools));
    } else {
        out->tools = xcalloc(json_array_size(tools) + 1, sizeof(char *));
        for (size_t i = 0; i < json_array_size(tools) && rc == 0; i++) {
            char field[64];
            snprintf(field, sizeof field, "tools[%zu]", i);
            rc = canonical_json(json_array_get(tools, i), field, &out->tools[i], err, err_len);
            if (rc == 0) out->n_tools++;
        }
    }
    json_decref(parsed);
    return rc;
}

static int parse_conversation(const ParseOptions *opt, const MessageFormat *fmt,
                              const json_t *root, const char *key, Sample *out, char *err,
                              size_t err_len) {
    static const char *const messages_keys[] = {"messages", "tools", NULL};
    static const char *const sharegpt_keys[] = {"conversations", "system", "tools", NULL};
    const bool sharegpt = fmt == &FORMAT_SHAREGPT;
    const MessageRole last = opt->prompts ? MSG_USER : MSG_ASSISTANT;
    out->kind = SAMPLE_CONVERSATION;
    if (check_keys(opt, root, sharegpt ? sharegpt_keys : messages_keys, "", "", err, err_len) != 0 ||
        parse_tools(root, out, err, err_len) != 0 ||
        parse_message_array(opt, fmt, root, key, &out->messages, &out->n_messages, err, err_len) != 0)
        return -1;
    const json_t *system = sharegpt ? json_object_get(root, "system") : NULL;
    if (system && !json_is_null(system)) {
        // ShareGPT's top-level system prompt: the conversation's system message.
        if (!json_is_string(system))
            return fail(err, err_len, "system: expected a string, got %s", json_type_name(system));
        if (out->n_messages > 0 && out->messages[0].role == MSG_SYSTEM)
            return fail(err, err_len, "system: given both at the top level and as "
                        "conversations[0] (give one)");
        memmove(out->messages + 1, out->messages, (size_t)out->n_messages * sizeof(Message));
        out->messages[0] = (Message){.role = MSG_SYSTEM,
                                     .content = copy_text(json_string_value(system),
                                                          json_string_length(system))};
        out->n_messages++;
        // Errors below name conversations[i] of the file: check the file's own messages.
        return check_turn_order(fmt, key, out->messages + 1, out->n_messages - 1, MSG_SYSTEM, last,
                                err, err_len);
    }
    return check_turn_order(fmt, key, out->messages, out->n_messages, MSG_SYSTEM, last, err, err_len);
}

// The top-level keys (known: the format's) and the "prompt" of the two prompt formats:
// messages ending with a user message.
static int parse_prompt(const ParseOptions *opt, const json_t *root, const char *const *keys,
                        Sample *out, char *err, size_t err_len) {
    const MessageFormat *fmt = &FORMAT_MESSAGES;
    if (check_keys(opt, root, keys, "", "", err, err_len) != 0 ||
        parse_tools(root, out, err, err_len) != 0 ||
        parse_message_array(opt, fmt, root, "prompt", &out->messages, &out->n_messages, err,
                            err_len) != 0)
        return -1;
    if (out->n_messages == 0) return fail(err, err_len, "prompt: empty prompt");
    if (check_turn_order(fmt, "prompt", out->messages, out->n_messages, MSG_SYSTEM, MSG_USER, err,
                         err_len) != 0)
        return -1;
    return 0;
}

static int parse_shared_prefix(const ParseOptions *opt, const json_t *root, Sample *out, char *err,
                               size_t err_len) {
    static const char *const keys[] = {"prompt", "completions", "tools", NULL};
    const MessageFormat *fmt = &FORMAT_MESSAGES;
    out->kind = SAMPLE_SHARED_PREFIX;
    if (parse_prompt(opt, root, keys, out, err, err_len) != 0) return -1;
    if (parse_message_array(opt, fmt, root, "completions", &out->completions, &out->n_completions,
                            err, err_len) != 0)
        return -1;
    if (out->n_completions == 0) return fail(err, err_len, "completions: empty completions list");
    for (int i = 0; i < out->n_completions; i++) {
        const Message *c = &out->completions[i];
        if (c->role != MSG_ASSISTANT)
            return fail(err, err_len, "completions[%d].role: expected 'assistant', got '%s'", i,
                        fmt->role_names[c->role]);
        if (c->n_tool_calls > 0)
            return fail(err, err_len, "completions[%d].tool_calls: a shared-prefix completion is "
                        "one message and cannot call tools (use the prompt/completion format)", i);
    }
    return 0;
}

// TRL's conversational prompt-completion: one conversation, prompt + completion, whose
// prompt messages are context (its assistant messages are not trained).
static int parse_prompt_completion(const ParseOptions *opt, const json_t *root, Sample *out,
                                   char *err, size_t err_len) {
    static const char *const keys[] = {"prompt", "completion", "tools", NULL};
    const MessageFormat *fmt = &FORMAT_MESSAGES;
    out->kind = SAMPLE_CONVERSATION;
    Message *completion = NULL;
    int n_completion = 0;
    if (parse_prompt(opt, root, keys, out, err, err_len) != 0) return -1;
    if (parse_message_array(opt, fmt, root, "completion", &completion, &n_completion, err,
                            err_len) != 0)
        return -1;
    // The completion continues the prompt's last user message, within its turn.
    int rc = 0;
    for (int i = 0; i < n_completion && rc == 0; i++)
        if (completion[i].role == MSG_USER || completion[i].role == MSG_SYSTEM)
            rc = fail(err, err_len, "completion[%d].role: expected 'assistant' or 'tool', got '%s'",
                      i, fmt->role_names[completion[i].role]);
    if (rc == 0)
        rc = check_turn_order(fmt, "completion", completion, n_completion, MSG_USER, MSG_ASSISTANT,
                              err, err_len);
    if (rc != 0) {
        messages_free(completion, n_completion);
        return -1;
    }
    for (int i = 0; i < out->n_messages; i++) out->messages[i].context = true;
    out->messages = xrealloc(out->messages,
                             (size_t)(out->n_messages + n_completion) * sizeof(Message));
    memcpy(out->messages + out->n_messages, completion, (size_t)n_completion * sizeof(Message));
    out->n_messages += n_completion;
    free(completion);
    return 0;
}

// Top-level keys of formats onepass does not train on: refused by name, whatever
// ignore_unknown_keys says (ignoring them would train on the wrong thing).
static int refuse_unsupported(const json_t *root, char *err, size_t err_len) {
    static const struct {
        const char *key, *what;
    } refused[] = {
        {"chosen", "preference pairs (TRL's chosen/rejected, for DPO) are not supported"},
        {"rejected", "preference pairs (TRL's chosen/rejected, for DPO) are not supported"},
        {"label", "labelled completions (TRL's unpaired preference format, for KTO) are not "
                  "supported"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const json_t *v = json_object_get(root, refused[i].key);
        // KTO's label is a boolean; any other "label" is an ordinary unknown key.
        if (v && (strcmp(refused[i].key, "label") != 0 || json_is_boolean(v)))
            return fail(err, err_len, "%s: %s", refused[i].key, refused[i].what);
    }
    return 0;
}

// Parses one JSON line into out. Returns 0, or -1 with a location-free message in err.
static int parse_sample(const ParseOptions *opt, const char *text, size_t len, Sample *out,
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
    const bool has_completions = json_object_get(root, "completions") != NULL;
    const bool has_completion = json_object_get(root, "completion") != NULL;
    const bool has_prompt =
        json_object_get(root, "prompt") != NULL || has_completions || has_completion;
    if (!json_is_object(root))
        rc = fail(err, err_len, "top level: expected an object, got %s", json_type_name(root));
    else if (refuse_unsupported(root, err, err_len) != 0)
        rc = -1;
    else if (has_messages + has_sharegpt + has_prompt > 1 || (has_completion && has_completions))
        rc = fail(err, err_len, "ambiguous line: more than one of 'messages', 'conversations', "
                                "'prompt'/'completions', 'prompt'/'completion'");
    else if (has_messages)
        rc = parse_conversation(opt, &FORMAT_MESSAGES, root, "messages", out, err, err_len);
    else if (has_sharegpt)
        rc = parse_conversation(opt, &FORMAT_SHAREGPT, root, "conversations", out, err, err_len);
    else if (has_completion)
        rc = parse_prompt_completion(opt, root, out, err, err_len);
    else if (has_prompt)
        rc = parse_shared_prefix(opt, root, out, err, err_len);
    else {
        static const char *const formats[] = {"messages", "conversations", "prompt", "completions",
                                              "completion", NULL};
        const char *key, *near = NULL;
        const json_t *value;
        json_object_foreach(root, key, value) if (!near && (near = closest_key(key, formats))) break;
        rc = fail(err, err_len, "missing field: expected 'messages', 'conversations' or "
                                "'prompt' with 'completions' or 'completion'%s%s%s%s%s",
                  near ? " (is '" : "", near ? key : "", near ? "' meant to be '" : "",
                  near ? near : "", near ? "'?)" : "");
    }
    json_decref(root);
    return rc;
}

int sample_parse_line(const char *text, size_t len, const char *path, int line,
                      const ParseOptions *opt, Sample *out, char *err, size_t err_len) {
    static const ParseOptions strict = {0};
    memset(out, 0, sizeof(*out));
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        return fail_at(err, err_len, path, line, "starts with a UTF-8 byte order mark (BOM); "
                       "save the file without one");
    char why[1024];
    int rc = parse_sample(opt ? opt : &strict, text, len, out, why, sizeof why);
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

// Reads one line into *buf (NUL-terminated), keeping at most max bytes of it (0: no
// limit): a longer line is read to its end without being kept. *len is the line's length
// without its '\n' (and without a '\r' before it when kept). Returns false at the end of
// the file.
static bool read_line_bounded(FILE *f, size_t max, char **buf, size_t *cap, size_t *len) {
    size_t n = 0;
    int c = EOF, prev = EOF;
    flockfile(f);
    while ((c = getc_unlocked(f)) != EOF && c != '\n') {
        prev = c;
        if (max == 0 || n < max) {
            if (n + 2 > *cap) {
                *cap = *cap ? 2 * *cap : 4096;
                *buf = xrealloc(*buf, *cap);
            }
            (*buf)[n] = (char)c;
        }
        n++;
    }
    funlockfile(f);
    if (n == 0 && c == EOF) return false;
    if (!*buf) *buf = xcalloc(1, *cap = 1);
    if (prev == '\r') n--;
    if (max == 0 || n < max) (*buf)[n] = '\0';
    *len = n;
    return true;
}

void dataset_load(const char *path, const LoadOptions *opt, Dataset *out) {
    enum { MAX_SKIP_WARNINGS = 5 };
    memset(out, 0, sizeof(*out));
    ParseOptions parse = {opt->ignore_unknown_keys, &out->ignored, opt->prompts, &out->metadata};
    char err[1024];
    if (input_file_check(path, err, sizeof err) != 0) fatal("%s", err);
    FILE *f = fopen(path, "rb");
    if (!f) fatal("%s: cannot open: %s", path, strerror(errno));
    int cap = 0, line = 0;
    char *buf = NULL;
    size_t buf_cap = 0, n;
    // A line's JSON is parsed only if it is at most max_line_bytes long, its '\n' and a
    // Windows '\r' not counted.
    // Kept: the limit and a '\r' after it.
    const size_t max = opt->max_line_bytes ? opt->max_line_bytes + 1 : 0;
    while (read_line_bounded(f, max, &buf, &buf_cap, &n)) {
        line++;
        if (opt->max_line_bytes && n > opt->max_line_bytes) {
            fail_at(err, sizeof err, path, line, "the line is %zu bytes, over data.max_line_bytes "
                    "%zu: not parsed (raise data.max_line_bytes, or set data.skip_too_long to "
                    "skip such lines)", n, opt->max_line_bytes);
            if (!opt->skip_too_long) fatal("%s", err);
            out->n_too_long++;
            continue;
        }
        if (is_blank(buf, n)) continue;
        Sample s;
        if (sample_parse_line(buf, n, path, line, &parse, &s, err, sizeof(err)) != 0) {
            if (!opt->skip_bad) fatal("%s", err);
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
    if (out->ignored.total > 0) {
        char what[2048];
        key_tally_describe(&out->ignored, what, sizeof what);
        fprintf(stderr, "onepass: %s: %s\n", path, what);
    }
    if (out->metadata.total > 0) {
        char what[2048];
        metadata_tally_describe(&out->metadata, what, sizeof what);
        fprintf(stderr, "onepass: %s: %s\n", path, what);
    }
    if (out->n_samples == 0)
        fatal("%s: no usable samples (%d bad lines skipped, %d too long)", path, out->n_skipped,
              out->n_too_long);
}

void prompts_load(const char *path, Dataset *out) { dataset_load(path, &(LoadOptions){.prompts = true}, out); }

void sample_free(Sample *s) {
    messages_free(s->messages, s->n_messages);
    messages_free(s->completions, s->n_completions);
    for (int i = 0; i < s->n_tools; i++) free(s->tools[i]);
    free(s->tools);
    s->messages = s->completions = NULL;
    s->tools = NULL;
    s->n_messages = s->n_completions = s->n_tools = 0;
}

void dataset_free(Dataset *d) {
    for (int i = 0; i < d->n_samples; i++) sample_free(&d->samples[i]);
    free(d->samples);
    key_tally_free(&d->ignored);
    key_tally_free(&d->metadata);
    memset(d, 0, sizeof(*d));
}
