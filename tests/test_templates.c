// Every chat template against the model's own Jinja template, offline (DESIGN.md §2, §8):
// tests/data/templates/NAME/expected.json (scripts/fixtures/make_template_fixtures.py,
// rendered by transformers' apply_chat_template, ids by the `tokenizers` package on the
// whole text) holds each turn's inference view of a set of conversations. For every
// conversation, turn and template: the segments' text equals the view byte for byte, the
// trained segments start where the reply after the generation prompt starts, and the
// segments' ids equal the ids of the whole view (tool use too, under qwen3 and onepass: a
// reply that continues its turn sees the think blocks kept before it). Also: the default
// template from a model folder's chat_template, the refusals, and control-token strings in
// text under both data.special_in_text policies.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "data/conversation.h"
#include "data/template.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

#define FIXTURES "tests/data/templates"

static const char *const NAMES[] = {"qwen3",  "deepseek_r1", "chatml", "qwen2.5",
                                    "smollm2", "llama3",     "zephyr", "onepass"};
enum { N_NAMES = sizeof NAMES / sizeof NAMES[0] };

static Tokenizer *load_tokenizer(const char *name) {
    char dir[256], err[1024];
    snprintf(dir, sizeof dir, FIXTURES "/%s", name);
    Tokenizer *tok = tokenizer_load(dir, err, sizeof err);
    EXPECT(tok != NULL, "%s: %s", dir, err);
    return tok;
}

// Appends a segment's text to *text (malloc'd, grown) and its ids to *ids.
static void append_segment(char **text, const RenderedSegment *s, int32_t **ids, int *n_ids,
                           const TokenSpan *span) {
    char *t = segment_text(s);
    size_t old = *text ? strlen(*text) : 0, n = strlen(t);
    *text = xrealloc(*text, old + n + 1);
    memcpy(*text + old, t, n + 1);
    free(t);
    *ids = xrealloc(*ids, (size_t)(*n_ids + span->n + 1) * sizeof(int32_t));
    if (span->n > 0) memcpy(*ids + *n_ids, span->ids, (size_t)span->n * sizeof(int32_t));
    *n_ids += span->n;
}

static bool ids_equal(const int32_t *got, int n, const json_t *want) {
    if (n != (int)json_array_size(want)) return false;
    for (int i = 0; i < n; i++)
        if (got[i] != json_integer_value(json_array_get(want, (size_t)i))) return false;
    return true;
}

// One sample's views against the fixture's; returns the number of views checked.
static int check_sample(const char *name, const ChatTemplate *t, const Tokenizer *tok, const Sample *s,
                        const json_t *views, int line) {
    char err[1024];
    RenderedSample r;
    TokenizedSample ts;
    int rc = template_render(t, s, SPECIAL_IN_TEXT_PLAIN, &r, err, sizeof err);
    EXPECT(rc == 0, "%s case %d: render: %s", name, line, err);
    if (rc != 0) return 0;
    rc = sample_tokenize(tok, t, s, SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err);
    EXPECT(rc == 0, "%s case %d: tokenize: %s", name, line, err);
    if (rc != 0) {
        rendered_sample_free(&r);
        return 0;
    }
    EXPECT(r.n_turns == (int)json_array_size(views) && ts.n_turns == r.n_turns, "%s case %d: %d turns, %zu views",
           name, line, r.n_turns, json_array_size(views));
    int checked = 0;
    for (int v = 0; v < r.n_turns && v < (int)json_array_size(views); v++) {
        const json_t *want = json_array_get(views, (size_t)v);
        char *text = NULL;
        int32_t *ids = NULL;
        int n_ids = 0;
        if (s->kind == SAMPLE_CONVERSATION) {
            int first = v;  // the replies from first on keep their think block in this view
            while (first > 0 && r.turns[first].continues && ts.turns[first].continues) first--;
            for (int i = 0; i < v; i++) {  // history: prompt + answer (+ think within the turn)
                append_segment(&text, &r.turns[i].prompt, &ids, &n_ids, &ts.turns[i].prompt);
                if (i >= first) append_segment(&text, &r.turns[i].think, &ids, &n_ids, &ts.turns[i].think);
                append_segment(&text, &r.turns[i].answer, &ids, &n_ids, &ts.turns[i].answer);
            }
            append_segment(&text, &r.turns[v].prompt, &ids, &n_ids, &ts.turns[v].prompt);
        } else {
            append_segment(&text, &r.prefix, &ids, &n_ids, &ts.prefix);
        }
        const size_t prompt_bytes = strlen(text);
        append_segment(&text, &r.turns[v].think, &ids, &n_ids, &ts.turns[v].think);
        append_segment(&text, &r.turns[v].answer, &ids, &n_ids, &ts.turns[v].answer);
        const char *want_text = json_string_value(json_object_get(want, "text"));
        EXPECT(strcmp(text, want_text) == 0, "%s case %d view %d: text\n got: %s\nwant: %s", name, line,
               v, text, want_text);
        EXPECT((json_int_t)prompt_bytes == json_integer_value(json_object_get(want, "trained_from")),
               "%s case %d view %d: trained part starts at byte %zu, want %lld", name, line, v,
               prompt_bytes, (long long)json_integer_value(json_object_get(want, "trained_from")));
        EXPECT(ids_equal(ids, n_ids, json_object_get(want, "ids")), "%s case %d view %d: ids (%d, want %zu)",
               name, line, v, n_ids, json_array_size(json_object_get(want, "ids")));
        free(text);
        free(ids);
        checked++;
    }
    tokenized_sample_free(&ts);
    rendered_sample_free(&r);
    return checked;
}

// The fixtures of folder `name` under template t.
static void test_fixtures(const char *name, const ChatTemplate *t) {
    EXPECT(t != NULL, "no template for %s", name);
    Tokenizer *tok = load_tokenizer(name);
    if (!t || !tok) return;
    char dir[256], path[300], err[4600];
    snprintf(dir, sizeof dir, FIXTURES "/%s", name);
    // The folder's chat_template (the official text) picks the template; onepass's has none.
    const ChatTemplate *found = NULL;
    EXPECT(template_of_folder(dir, &found, err, sizeof err) == 0, "%s: %s", dir, err);
    EXPECT(found == (strcmp(t->name, "onepass") == 0 ? NULL : t), "%s: the folder's chat_template gives %s", dir,
           found ? found->name : "none");
    EXPECT(template_check_tokenizer(tok, t, err, sizeof err) == 0, "%s: %s", name, err);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    EXPECT(root != NULL, "%s: %s", path, jerr.text);
    const json_t *cases = json_object_get(root, "cases");
    int views = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *line = json_string_value(json_object_get(c, "line"));
        Sample s;
        int rc = sample_parse_line(line, strlen(line), path, (int)i + 1, NULL, &s, err, sizeof err);
        EXPECT(rc == 0, "%s", err);
        if (rc != 0) continue;
        views += check_sample(name, t, tok, &s, json_object_get(c, "views"), (int)i + 1);
        sample_free(&s);
    }
    EXPECT(views >= 30, "%s: only %d views checked", name, views);
    json_decref(root);
    tokenizer_free(tok);
}

// Tokenizes a one-line sample; returns sample_tokenize's result, err filled.
static int tokenize_line(const ChatTemplate *t, const Tokenizer *tok, const char *line,
                         SpecialInText policy, TokenizedSample *ts, char *err, size_t err_len) {
    Sample s;
    if (sample_parse_line(line, strlen(line), "case.jsonl", 1, NULL, &s, err, err_len) != 0) return -2;
    int rc = sample_tokenize(tok, t, &s, policy, ts, err, err_len);
    sample_free(&s);
    return rc;
}

static void expect_refused(const char *name, const char *line, const char *message) {
    Tokenizer *tok = load_tokenizer(name);
    if (!tok) return;
    char err[1024] = "";
    TokenizedSample ts;
    int rc = tokenize_line(template_by_name(name), tok, line, SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err);
    EXPECT(rc == -1 && strstr(err, message), "%s: %s refused with '%s', got rc %d '%s'", name, line, message,
           rc, err);
    if (rc == 0) tokenized_sample_free(&ts);
    tokenizer_free(tok);
}

static void test_refusals(void) {
    char err[4600];
    // Qwen3 drops a leading newline from the reply being generated, not from history.
    expect_refused("qwen3",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                   "{\"role\":\"assistant\",\"content\":\"\\nA\",\"reasoning_content\":\"r\"}]}",
                   "messages[1].content: the answer begins with a newline");
    // ChatML's "assistant\n" + "\nA" is one newline run in the whole view, which this
    // tokenizer merges into one token: no segment boundary can fall between them.
    expect_refused("chatml",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                   "{\"role\":\"assistant\",\"content\":\"\\nA\"}]}",
                   "messages[1].content: ");
    // Tool use under the templates that do not render it here: refused by name.
    const char *call = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                       "\"content\":\"\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                       "\"arguments\":{}}}]},{\"role\":\"tool\",\"content\":\"1\"},{\"role\":\"assistant\","
                       "\"content\":\"A\"}]}";
    static const char *const NO_TOOLS[] = {"deepseek_r1", "chatml", "qwen2.5", "smollm2", "llama3", "zephyr"};
    for (int i = 0; i < 6; i++) {
        char want[160];
        snprintf(want, sizeof want, "messages[1].tool_calls: the %s template is not supported with tool calls here",
                 NO_TOOLS[i]);
        expect_refused(NO_TOOLS[i], call, want);
    }
    expect_refused("llama3",
                   "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"messages\":["
                   "{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"A\"}]}",
                   "tools: the llama3 template is not supported with tool definitions here");
    // Qwen3 keeps an earlier reply's think block in a turn only when it has reasoning: a
    // reply without it after one with it, before more results, fits no run of kept blocks.
    const char *mixed = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                        "\"content\":\"\",\"reasoning_content\":\"r\",\"tool_calls\":[{\"name\":\"f\","
                        "\"arguments\":{}}]},{\"role\":\"tool\",\"content\":\"1\"},{\"role\":\"assistant\","
                        "\"content\":\"\",\"tool_calls\":[{\"name\":\"f\",\"arguments\":{}}]},"
                        "{\"role\":\"tool\",\"content\":\"2\"},{\"role\":\"assistant\",\"content\":\"A\"}]}";
    expect_refused("qwen3", mixed, "messages[3].reasoning: a reply without reasoning after one with reasoning "
                   "in the same turn, before more tool results, which the qwen3 template cannot render");
    Tokenizer *tok = load_tokenizer("onepass");
    if (tok) {  // onepass renders every reply's think block the same in all its views
        TokenizedSample ts;
        EXPECT(tokenize_line(&TEMPLATE_ONEPASS, tok, mixed, SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err) == 0 &&
                   ts.n_turns == 3 && ts.turns[1].continues && ts.turns[2].continues,
               "onepass: %s", err);
        tokenized_sample_free(&ts);
        tokenizer_free(tok);
    }
    expect_refused("qwen3",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"<tool_response>x</tool_response>\"},"
                   "{\"role\":\"assistant\",\"content\":\"A\"}]}",
                   "messages[0].content: a user message written as a tool response");
    // An unknown chat_template: the folder is named, and data.chat_template is the way out.
    char dir[] = "/tmp/onepass_templates_XXXXXX";
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    EXPECT(f != NULL, "%s", path);
    if (!f) return;
    fputs("{\"chat_template\": \"{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}\"}", f);
    fclose(f);
    const ChatTemplate *t = &TEMPLATE_ONEPASS;
    EXPECT(template_of_folder(dir, &t, err, sizeof err) == -1 && t == NULL && strstr(err, dir) &&
               strstr(err, "set data.chat_template"),
           "unknown chat_template: %s", err);
    remove(path);
    rmdir(dir);
    EXPECT(template_of_folder("tests/data/tokenizers/qwen2", &t, err, sizeof err) == 0 && t == NULL,
           "a folder without tokenizer_config.json has no template");
    EXPECT(template_by_name("llama2") == NULL && template_by_name(NULL) == NULL, "unknown names");
}

// A user writing a control token's string: plain text under "plain" (the control id count
// is that of the same conversation without it), refused under "error".
static void test_special_in_text(const char *name) {
    const ChatTemplate *t = template_by_name(name);
    Tokenizer *tok = load_tokenizer(name);
    if (!tok) return;
    const int end_id = tokenizer_piece_to_id(tok, t->end_of_turn);
    EXPECT(end_id >= 0, "%s: %s has an id", name, t->end_of_turn);
    char with[512], without[512], err[1024];
    const char *fmt = "{\"messages\":[{\"role\":\"user\",\"content\":\"a%sb\"},"
                      "{\"role\":\"assistant\",\"content\":\"c%sd\",\"reasoning_content\":\"r\"}]}";
    snprintf(with, sizeof with, fmt, t->end_of_turn, t->end_of_turn);
    snprintf(without, sizeof without, fmt, "", "");
    int counts[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        TokenizedSample ts;
        int rc = tokenize_line(t, tok, k ? with : without, SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err);
        EXPECT(rc == 0, "%s: %s", name, err);
        if (rc != 0) continue;
        const TokenSpan *spans[] = {&ts.turns[0].prompt, &ts.turns[0].think, &ts.turns[0].answer};
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < spans[s]->n; i++) counts[k] += spans[s]->ids[i] == end_id;
        tokenized_sample_free(&ts);
    }
    EXPECT(counts[0] == counts[1] && counts[0] > 0, "%s: %d end-of-turn ids with '%s' in text, %d without",
           name, counts[1], t->end_of_turn, counts[0]);
    TokenizedSample ts;
    char want[256];
    snprintf(want, sizeof want, "messages[0].content: contains the template token '%s'", t->end_of_turn);
    int rc = tokenize_line(t, tok, with, SPECIAL_IN_TEXT_ERROR, &ts, err, sizeof err);
    EXPECT(rc == -1 && strstr(err, want), "%s error policy: %s", name, err);
    if (rc == 0) tokenized_sample_free(&ts);
    tokenizer_free(tok);
}

// data.history_thinking "keep": onepass's keep variant against onepass.jinja with
// preserve_thinking (every earlier reply keeps its reasoning: every reply continues the view
// before it); the templates whose official text always strips refuse it by name.
static void test_history_thinking(void) {
    char err[512];
    EXPECT(history_thinking_from_name("strip") == HISTORY_THINKING_STRIP &&
               history_thinking_from_name("keep") == HISTORY_THINKING_KEEP &&
               history_thinking_from_name("preserve") == -1 && history_thinking_from_name(NULL) == -1,
           "history_thinking names");
    const ChatTemplate *keep = template_with_history(&TEMPLATE_ONEPASS, HISTORY_THINKING_KEEP, err, sizeof err);
    EXPECT(keep && keep != &TEMPLATE_ONEPASS && keep->keep_thinking && strcmp(keep->name, "onepass") == 0,
           "onepass keeps: %s", err);
    EXPECT(template_with_history(&TEMPLATE_ONEPASS, HISTORY_THINKING_STRIP, err, sizeof err) == &TEMPLATE_ONEPASS,
           "strip is the template itself");
    if (keep) test_fixtures("onepass_keep", keep);
    for (int i = 0; i < N_NAMES; i++) {
        if (strcmp(NAMES[i], "onepass") == 0) continue;
        err[0] = '\0';
        const ChatTemplate *t = template_with_history(template_by_name(NAMES[i]), HISTORY_THINKING_KEEP, err, sizeof err);
        char want[128];
        snprintf(want, sizeof want, "keep: the %s template renders earlier turns without their reasoning", NAMES[i]);
        EXPECT(t == NULL && strstr(err, want), "%s under keep: %s", NAMES[i], err);
    }
}

int main(void) {
    for (int i = 0; i < N_NAMES; i++) {
        const ChatTemplate *t = template_by_name(NAMES[i]);
        EXPECT(t != NULL && strcmp(t->name, NAMES[i]) == 0, "template_by_name(%s)", NAMES[i]);
        test_fixtures(NAMES[i], t);
        test_special_in_text(NAMES[i]);
    }
    test_history_thinking();
    test_refusals();
    return test_finish();
}
