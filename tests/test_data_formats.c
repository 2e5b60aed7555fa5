// JSONL parsing: every format gives the right messages and reasoning (random
// texts, built and serialized by jansson as the oracle); every kind of bad input
// gives "path:line: field: what"; dataset_load skips or fails as asked.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "data/conversation.h"
#include "tests/test_child.h"
#include "tests/test_util.h"

// ---- Random texts. No 't' in the alphabet, so "<think>" never appears by accident;
// '<', '>', '/', quotes, backslashes, newlines and multi-byte UTF-8 all do.
static const char *const PIECES[] = {"a", "b", "Z", "0", "7", " ", "  ", "\n", "\t", "<", ">",
                                     "/", "\"", "\\", "{", "}", "é", "ß", "Ж", "中", "😀", "×"};

// Random text of 1..max pieces; `trimmed` keeps whitespace off both ends.
static char *random_text(TestRng *rng, int max_pieces, bool trimmed) {
    int n = test_rng_int(rng, 1, max_pieces);
    char *s = calloc((size_t)n * 4 + 8, 1);
    const int n_pieces = (int)(sizeof(PIECES) / sizeof(PIECES[0]));
    for (int i = 0; i < n; i++) {
        const char *p = PIECES[test_rng_int(rng, 0, n_pieces - 1)];
        bool edge = i == 0 || i == n - 1;
        if (trimmed && edge && strchr(" \n\t", p[0])) p = "q";
        strcat(s, p);
    }
    return s;
}

typedef struct {
    MessageRole role;
    char *content, *reasoning;
} ExpectedMessage;

static const char *const ROLE_NAMES[3] = {"system", "user", "assistant"};
static const char *const SHAREGPT_NAMES[3] = {"system", "human", "gpt"};

// Random valid conversation: optional system, then user/assistant turns.
static int random_conversation(TestRng *rng, ExpectedMessage *msgs, int cap) {
    int n = 0;
    if (test_rng_int(rng, 0, 1)) msgs[n++] = (ExpectedMessage){MSG_SYSTEM, random_text(rng, 20, false), NULL};
    int turns = test_rng_int(rng, 1, (cap - 1) / 2);
    for (int t = 0; t < turns; t++) {
        msgs[n++] = (ExpectedMessage){MSG_USER, random_text(rng, 20, false), NULL};
        bool reasons = test_rng_int(rng, 0, 3) > 0;
        // Answers keep no leading whitespace (the parser drops it after </think>).
        msgs[n++] = (ExpectedMessage){MSG_ASSISTANT, random_text(rng, 20, true),
                                      reasons ? random_text(rng, 40, true) : NULL};
    }
    return n;
}

typedef enum { STYLE_REASONING_FIELD, STYLE_INLINE, STYLE_SHAREGPT } Style;

static json_t *message_json(const ExpectedMessage *m, Style style) {
    const char *role = (style == STYLE_SHAREGPT ? SHAREGPT_NAMES : ROLE_NAMES)[m->role];
    const char *role_key = style == STYLE_SHAREGPT ? "from" : "role";
    const char *content_key = style == STYLE_SHAREGPT ? "value" : "content";
    if (style == STYLE_REASONING_FIELD || !m->reasoning) {
        json_t *o = json_pack("{s:s, s:s}", role_key, role, content_key, m->content);
        if (m->reasoning) json_object_set_new(o, "reasoning_content", json_string(m->reasoning));
        return o;
    }
    // Inline: whitespace around the block, as real data has it.
    size_t len = strlen(m->reasoning) + strlen(m->content) + 64;
    char *text = malloc(len);
    snprintf(text, len, " <think>\n %s \n</think>\n\n%s", m->reasoning, m->content);
    json_t *o = json_pack("{s:s, s:s}", role_key, role, content_key, text);
    free(text);
    return o;
}

static bool same_text(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static void check_messages(const Message *got, int n_got, const ExpectedMessage *want, int n_want,
                           const char *what) {
    EXPECT(n_got == n_want, "%s: %d messages, want %d", what, n_got, n_want);
    for (int i = 0; i < n_got && i < n_want; i++) {
        EXPECT(got[i].role == want[i].role, "%s[%d]: role %d want %d", what, i, got[i].role,
              want[i].role);
        EXPECT(same_text(got[i].content, want[i].content), "%s[%d]: content '%s' want '%s'", what,
              i, got[i].content, want[i].content);
        EXPECT(same_text(got[i].reasoning, want[i].reasoning), "%s[%d]: reasoning '%s' want '%s'",
              what, i, got[i].reasoning ? got[i].reasoning : "(null)",
              want[i].reasoning ? want[i].reasoning : "(null)");
    }
}

static void free_expected(ExpectedMessage *m, int n) {
    for (int i = 0; i < n; i++) free(m[i].content), free(m[i].reasoning);
}

static void test_random_round_trips(TestRng *rng) {
    char err[512];
    for (int trial = 0; trial < 300; trial++) {
        ExpectedMessage msgs[17];
        int n = random_conversation(rng, msgs, 17);
        Style style = (Style)test_rng_int(rng, 0, 2);
        json_t *root;
        if (trial % 4 == 3) {
            // Shared prefix: the conversation minus its last answer is the prompt;
            // completions are random assistant messages.
            json_t *prompt = json_array(), *completions = json_array();
            for (int i = 0; i < n - 1; i++)
                json_array_append_new(prompt, message_json(&msgs[i], STYLE_REASONING_FIELD));
            int n_completions = test_rng_int(rng, 1, 4);
            ExpectedMessage comps[4];
            for (int c = 0; c < n_completions; c++) {
                comps[c] = (ExpectedMessage){MSG_ASSISTANT, random_text(rng, 20, true),
                                             random_text(rng, 40, true)};
                json_array_append_new(completions,
                                      message_json(&comps[c], c % 2 ? STYLE_INLINE : STYLE_REASONING_FIELD));
            }
            // An unknown key: ignored and counted under ignore_unknown_keys.
            root = json_pack("{s:o, s:o, s:s}", "prompt", prompt, "completions", completions,
                             "extra", "extra keys are ignored");
            char *line = json_dumps(root, JSON_COMPACT);
            Sample s;
            KeyTally tally = {0};
            ParseOptions ignore = {.ignore_unknown_keys = true, .ignored = &tally};
            int rc = sample_parse_line(line, strlen(line), "rand.jsonl", trial + 1, &ignore, &s, err,
                                       sizeof err);
            EXPECT(rc == 0, "%s", err);
            EXPECT(tally.total == 1 && tally.n == 1 && strcmp(tally.names[0], "extra") == 0,
                   "ignored keys: %lld", tally.total);
            key_tally_free(&tally);
            if (rc == 0) {
                EXPECT(s.kind == SAMPLE_SHARED_PREFIX && s.line == trial + 1, "kind %d line %d",
                      s.kind, s.line);
                check_messages(s.messages, s.n_messages, msgs, n - 1, "prompt");
                check_messages(s.completions, s.n_completions, comps, n_completions, "completions");
                sample_free(&s);
            }
            free_expected(comps, n_completions);
            free(line);
        } else {
            json_t *arr = json_array();
            for (int i = 0; i < n; i++) json_array_append_new(arr, message_json(&msgs[i], style));
            root = json_pack("{s:o}", style == STYLE_SHAREGPT ? "conversations" : "messages", arr);
            char *line = json_dumps(root, JSON_COMPACT | (trial % 2 ? JSON_ENSURE_ASCII : 0));
            Sample s;
            int rc = sample_parse_line(line, strlen(line), "rand.jsonl", trial + 1, NULL, &s, err, sizeof err);
            EXPECT(rc == 0, "%s", err);
            if (rc == 0) {
                EXPECT(s.kind == SAMPLE_CONVERSATION && s.n_completions == 0, "kind %d", s.kind);
                check_messages(s.messages, s.n_messages, msgs, n, "messages");
                sample_free(&s);
            }
            free(line);
        }
        json_decref(root);
        free_expected(msgs, n);
    }
}

// Hand-written cases where the exact text matters.
static void test_fixed_cases(void) {
    char err[512];
    Sample s;
    static const struct {
        const char *json;
        const char *content, *reasoning;  // of the last message
    } cases[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
         "\"content\":\"<think></think>A\"}]}",
         "A", ""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
         "\"content\":\"  Answer  \",\"reasoning_content\":null}]}",
         "  Answer  ", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
         "\"content\":\"A\",\"reasoning_content\":\"\"}]}",
         "A", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
         "\"content\":\"\\n<think>\\nstep 1\\n\\nstep 2\\n</think>\\n\\nThe answer.\\n\"}]}",
         "The answer.\n", "step 1\n\nstep 2"},
        {"{\"conversations\":[{\"from\":\"human\",\"value\":\"q\"},{\"from\":\"gpt\","
         "\"value\":\"<think>r \\u00e9</think> a\"}]}\r\n",
         "a", "r é"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"<think>user text keeps tags</think>\"},"
         "{\"role\":\"assistant\",\"content\":\"A\"}]}",
         "A", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = sample_parse_line(cases[i].json, strlen(cases[i].json), "fixed.jsonl", 1, NULL, &s, err,
                                   sizeof err);
        EXPECT(rc == 0, "case %zu: %s", i, err);
        if (rc != 0) continue;
        const Message *last = &s.messages[s.n_messages - 1];
        EXPECT(strcmp(last->content, cases[i].content) == 0, "case %zu: content '%s'", i,
              last->content);
        EXPECT(same_text(last->reasoning, cases[i].reasoning), "case %zu: reasoning '%s'", i,
              last->reasoning ? last->reasoning : "(null)");
        sample_free(&s);
    }
    // A user message's think tags are its text, not reasoning.
    int rc = sample_parse_line(cases[5].json, strlen(cases[5].json), "fixed.jsonl", 1, NULL, &s, err,
                               sizeof err);
    EXPECT(rc == 0 && strcmp(s.messages[0].content, "<think>user text keeps tags</think>") == 0 &&
              !s.messages[0].reasoning,
          "user think tags changed");
    if (rc == 0) sample_free(&s);
}

// ---- Bad input: each line must fail with "path:line: " and the expected words.
typedef struct {
    const char *json;
    const char *expect;
} BadCase;

static const BadCase BAD_CASES[] = {
    {"{\"messages\": [", "malformed JSON"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],}", "malformed JSON"},
    {"{\"messages\":[],\"messages\":[]}", "duplicate"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"},{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "malformed JSON"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\xff\"},{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "invalid UTF-8"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\xc3\x28\"}]}",
     "invalid UTF-8"},
    {"[1, 2]", "top level: expected an object, got an array"},
    {"{\"text\":\"hello\"}", "missing field"},
    {"{\"messages\":[],\"conversations\":[]}", "ambiguous"},
    {"{\"messages\":{}}", "messages: expected an array, got an object"},
    {"{\"messages\":[]}", "messages: empty conversation"},
    {"{\"messages\":[\"hi\"]}", "messages[0]: expected an object, got a string"},
    {"{\"messages\":[{\"content\":\"q\"}]}", "messages[0]: missing field 'role'"},
    {"{\"messages\":[{\"role\":\"user\"}]}", "messages[0]: missing field 'content'"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"robot\",\"content\":\"A\"}]}",
     "messages[1].role: unknown role 'robot'"},
    {"{\"messages\":[{\"role\":7,\"content\":\"q\"}]}", "messages[0].role: expected a string, got an integer"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":42}]}",
     "messages[1].content: expected a string or an array of parts, got an integer"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":null},{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "messages[0].content: expected a string or an array of parts, got null"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"A\",\"reasoning_content\":[1]}]}",
     "messages[1].reasoning_content: expected a string, got an array"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"reasoning_content\":\"r\"},{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "messages[0].reasoning_content: only assistant"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"<think>never closed\"}]}",
     "messages[1].content: unclosed think tag"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"reasoning</think>A\"}]}",
     "messages[1].content: think tag inside the answer"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"<think>r</think>A<think>s</think>\"}]}",
     "messages[1].content: think tag inside the answer"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"<think>r</think>A\",\"reasoning_content\":\"s\"}]}",
     "messages[1]: both reasoning_content and an inline"},
    {"{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"q\"}]}",
     "messages: no assistant message"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"user\",\"content\":\"q2\"}]}",
     "messages[2].role: the last message must be 'assistant', got 'user'"},
    {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "messages[0].role: expected 'user' here, got 'assistant'"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"user\",\"content\":\"q\"}]}",
     "messages: no assistant message"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]},{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "messages[2].role: expected 'tool' here, got 'user'"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "messages[1].role: a system message may only come first"},
    {"{\"conversations\":[{\"from\":\"human\",\"value\":\"q\"},{\"from\":\"robot\",\"value\":\"A\"}]}",
     "conversations[1].from: unknown role 'robot'"},
    {"{\"conversations\":[{\"from\":\"human\",\"value\":\"q\"},{\"from\":\"gpt\",\"value\":\"<think>open\"}]}",
     "conversations[1].value: unclosed think tag"},
    {"{\"conversations\":[{\"from\":\"human\",\"value\":\"q\"}]}", "conversations: no gpt message"},
    {"{\"conversations\":[{\"from\":\"human\",\"text\":\"q\"}]}", "conversations[0].text: unknown key"},
    {"{\"conversations\":[{\"from\":\"human\"}]}", "conversations[0]: missing field 'value'"},
    {"{\"prompt\":[{\"role\":\"user\",\"content\":\"q\"}],\"completions\":[]}",
     "completions: empty completions list"},
    {"{\"prompt\":[{\"role\":\"user\",\"content\":\"q\"}]}", "missing field 'completions'"},
    {"{\"prompt\":[],\"completions\":[{\"role\":\"assistant\",\"content\":\"A\"}]}", "prompt: empty prompt"},
    {"{\"prompt\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"A\"}],\"completions\":[{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "prompt[1].role: the last message must be 'user', got 'assistant'"},
    {"{\"prompt\":[{\"role\":\"user\",\"content\":\"q\"}],\"completions\":[{\"role\":\"user\",\"content\":\"A\"}]}",
     "completions[0].role: expected 'assistant', got 'user'"},
    {"{\"prompt\":[{\"role\":\"user\",\"content\":\"q\"}],\"completions\":[{\"role\":\"assistant\",\"content\":\"<think>x\"}]}",
     "completions[0].content: unclosed think tag"},
    {"{\"prompt\":[{\"role\":\"user\",\"content\":\"q\"}],\"completions\":{}}",
     "completions: expected an array, got an object"},
    // Newer formats: reasoning names, content parts, TRL, tool use, unknown keys.
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\", \"reasoning_content\": \"r\", \"thinking\": \"s\"}]}",
     "messages[1]: both reasoning_content and thinking, with different texts"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"thinking\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[0].thinking: only assistant messages have reasoning"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}",
     "messages[1].content[0].type: \"image_url\" is not supported"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[0].content[0].text: expected a string, got nothing"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [\"hi\"]}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[0].content[0]: expected an object, got a string"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\", \"extra\": 1}]}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[0].content[0].extra: unknown key"},
    {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"A\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"A\"}]}",
     "chosen: preference pairs"},
    {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"A\"}], \"label\": true}",
     "label: labelled completions"},
    {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"A\"}], \"completions\": [{\"role\": \"assistant\", \"content\": \"A\"}]}",
     "ambiguous line"},
    {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": [{\"role\": \"user\", \"content\": \"q\"}]}",
     "completion[0].role: expected 'assistant' or 'tool', got 'user'"},
    {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": []}",
     "completion: empty conversation"},
    {"{\"prompt\": \"q\", \"completion\": \"A\"}",
     "prompt: a string (TRL's standard, non-conversational format) is not supported"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[2].role: a tool result must follow an assistant message with tool_calls"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}, {\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[2].role: expected 'tool' here, got 'user'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}, {\"role\": \"tool\", \"content\": \"r\"}]}",
     "messages[2].role: the last message must be 'assistant', got 'tool'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"tool_calls\": []}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[0].tool_calls: unknown key"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"name\": 3}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[0].name: expected a string, got an integer"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\", \"reasoning\": \"r\", \"reasoning_content\": \"s\"}]}",
     "messages[1]: both reasoning_content and reasoning, with different texts"},
    {"{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"developer\", \"content\": \"d\"}, {\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].role: 'developer' is the system message (the chat templates have no developer role), and messages[0] is 'system' already"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"developer\", \"content\": \"d\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].role: a system message may only come first"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}], \"metadatas\": {}}",
     "metadatas: unknown key (did you mean 'metadata'?)"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"code\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].tool_calls[0].type: only \"function\" tool calls"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{oops\"}}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].tool_calls[0].function.arguments: a string that is not valid JSON"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": [1]}}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].tool_calls[0].function.arguments: expected an object (or a JSON string of one), got an array"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].tool_calls[0].function.arguments: expected an object (or a JSON string of one), got an array"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"arguments\": {}}}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].tool_calls[0].function: missing field 'name'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"name\": \"f\"}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].tool_calls[0]: missing field 'arguments'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}, \"strict\": true}}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].tool_calls[0].function.strict: unknown key"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": {}}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].tool_calls: expected an array, got an object"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null}, {\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[1].content: expected a string or an array of parts, got null"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}, {\"role\": \"tool\", \"content\": \"r\", \"reasoning_content\": \"r\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[2].reasoning_content: unknown key"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}, {\"role\": \"tool\", \"content\": \"r\", \"name\": 3}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "messages[2].name: expected a string, got an integer"},
    {"{\"system\": \"s\", \"conversations\": [{\"from\": \"system\", \"value\": \"t\"}, {\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"gpt\", \"value\": \"A\"}]}",
     "system: given both at the top level and as conversations[0]"},
    {"{\"system\": [\"s\"], \"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"gpt\", \"value\": \"A\"}]}",
     "system: expected a string, got an array"},
    {"{\"system\": \"s\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "system: unknown key"},
    {"{\"tools\": {}, \"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "tools: expected an array (or a JSON string of one), got an object"},
    {"{\"tools\": [[1]], \"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "tools[0]: expected an object (or a JSON string of one), got an array"},
    {"{\"tools\": \"[\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "tools: a string that is not valid JSON"},
    {"{\"origin\": \"web\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}",
     "origin: unknown key"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"A\", \"foo\": 1}]}",
     "messages[1].foo: unknown key"},
    {"{\"conversations\": [{\"from\": \"human\", \"value\": \"q\", \"weight\": 0}, {\"from\": \"gpt\", \"value\": \"A\"}]}",
     "conversations[0].weight: unknown key"},
    {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completions\": [{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}]}",
     "completions[0].tool_calls: a shared-prefix completion is one message"},
};
enum { N_BAD = sizeof(BAD_CASES) / sizeof(BAD_CASES[0]) };

static void test_bad_lines(TestRng *rng) {
    char err[1024], want_prefix[64];
    for (int i = 0; i < N_BAD; i++) {
        int line = test_rng_int(rng, 1, 100000);
        Sample s;
        int rc = sample_parse_line(BAD_CASES[i].json, strlen(BAD_CASES[i].json), "data.jsonl",
                                   line, NULL, &s, err, sizeof err);
        snprintf(want_prefix, sizeof want_prefix, "data.jsonl:%d: ", line);
        EXPECT(rc == -1, "bad case %d accepted: %s", i, BAD_CASES[i].json);
        if (rc != -1) {
            sample_free(&s);
            continue;
        }
        EXPECT(strncmp(err, want_prefix, strlen(want_prefix)) == 0, "case %d: '%s' lacks '%s'", i,
              err, want_prefix);
        EXPECT(strstr(err, BAD_CASES[i].expect) != NULL, "case %d: '%s' lacks '%s'", i, err,
              BAD_CASES[i].expect);
    }
}

// ---- dataset_load on files: blank lines, line numbers, skip_bad, and the fatal path.
static const char *const GOOD_LINE =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
    "\"<think>r</think>A\"}]}";

typedef struct {
    const char *path;
    LoadOptions opt;
} LoadCall;

static void load(void *arg) {
    const LoadCall *call = arg;
    Dataset d;
    dataset_load(call->path, &call->opt, &d);
}

// Runs dataset_load(path, opt) in a child; returns its exit status and stderr.
static int load_in_child(const char *path, LoadOptions opt, char *out, size_t out_len) {
    LoadCall call = {path, opt};
    return test_run_in_child(load, &call, out, out_len);
}

static void test_dataset_files(TestRng *rng) {
    char dir[] = "/tmp/onepass_formats_XXXXXX";
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp failed");
    char path[256];
    snprintf(path, sizeof path, "%s/mixed.jsonl", dir);
    for (int trial = 0; trial < 20; trial++) {
        FILE *f = fopen(path, "wb");
        int n_lines = test_rng_int(rng, 3, 30), n_good = 0, n_bad = 0, first_bad_line = 0;
        int good_lines[30], first_bad_case = -1;
        for (int line = 1; line <= n_lines; line++) {
            int kind = test_rng_int(rng, 0, 5);  // 0: blank, 1: bad, else good
            if (kind == 0) {
                fputs(test_rng_int(rng, 0, 1) ? "\n" : "  \t\r\n", f);
            } else if (kind == 1) {
                int c = test_rng_int(rng, 0, N_BAD - 1);
                fprintf(f, "%s\n", BAD_CASES[c].json);
                if (!n_bad++) first_bad_line = line, first_bad_case = c;
            } else {
                fprintf(f, "%s\n", GOOD_LINE);
                good_lines[n_good++] = line;
            }
        }
        fclose(f);
        if (n_good == 0) continue;  // an all-bad file is fatal even with skip_bad
        Dataset d;
        dataset_load(path, &(LoadOptions){.skip_bad = true}, &d);
        EXPECT(d.n_samples == n_good && d.n_skipped == n_bad, "got %d good %d skipped, want %d %d",
              d.n_samples, d.n_skipped, n_good, n_bad);
        for (int i = 0; i < d.n_samples && i < n_good; i++)
            EXPECT(d.samples[i].line == good_lines[i], "sample %d on line %d, want %d", i,
                  d.samples[i].line, good_lines[i]);
        dataset_free(&d);

        char msg[2048], want[512];
        int status = load_in_child(path, (LoadOptions){0}, msg, sizeof msg);
        if (n_bad == 0) {
            EXPECT(status == 0, "clean file failed to load: %s", msg);
        } else {
            snprintf(want, sizeof want, "%s:%d: ", path, first_bad_line);
            EXPECT(status == 1 && strstr(msg, want) && strstr(msg, BAD_CASES[first_bad_case].expect),
                  "status %d, message '%s', want '%s' and '%s'", status, msg, want,
                  BAD_CASES[first_bad_case].expect);
        }
    }
    char msg[1024];
    snprintf(path, sizeof path, "%s/missing.jsonl", dir);
    EXPECT(load_in_child(path, (LoadOptions){0}, msg, sizeof msg) == 1 && strstr(msg, path),
          "a missing file: '%s'", msg);
    snprintf(path, sizeof path, "%s/empty.jsonl", dir);
    fclose(fopen(path, "wb"));
    EXPECT(load_in_child(path, (LoadOptions){0}, msg, sizeof msg) == 1 && strstr(msg, "no usable samples"),
          "an empty file: '%s'", msg);
    remove(path);
    snprintf(path, sizeof path, "%s/mixed.jsonl", dir);
    remove(path);
    rmdir(dir);
}

// ---- tests/data/more_formats.jsonl: every newer format, parsed field by field.
typedef struct {
    MessageRole role;
    const char *content, *reasoning;
    const char *calls[2][2];  // per tool call: name, canonical arguments
    const char *name, *tool_call_id;
    bool context;
} WantMessage;

// Python's json.dumps(json.loads(ARGS), ensure_ascii=False) for the arguments of line 5
// (the reference the templates' `tojson` uses), transcribed.
static const char WEATHER_ARGS[] =
    "{\"city\": \"Paris \\\"\u00e9\\\"\\n\\t\\u0001\", \"n\": 1.5, \"big\": 1e+16, \"small\": 0.0001, "
    "\"tiny\": 1e-05, \"x\": 123456789.123, \"neg\": -0.0, \"i\": -42, \"deep\": [1, {\"a\": null, "
    "\"b\": true, \"c\": false}], \"e\": [], \"o\": {}, \"r\": 0.1, \"f\": 1.0, \"g\": 2.5e-300, "
    "\"h\": 1.7976931348623157e+308, \"s\": \"\U0001F600\x7f/\", \"k\": 1e+17, "
    "\"m\": 1.2345678901234567e+19, \"z\": 0.000123}";

#define M(role_, content_, reasoning_, ...) \
    {.role = role_, .content = content_, .reasoning = reasoning_, __VA_ARGS__}

static void check_want(const Sample *s, const WantMessage *want, int n, int line) {
    EXPECT(s->n_messages == n, "line %d: %d messages, want %d", line, s->n_messages, n);
    for (int i = 0; i < n && i < s->n_messages; i++) {
        const Message *m = &s->messages[i];
        const WantMessage *w = &want[i];
        EXPECT(m->role == w->role && same_text(m->content, w->content) &&
                   same_text(m->reasoning, w->reasoning) && same_text(m->name, w->name) &&
                   same_text(m->tool_call_id, w->tool_call_id) && m->context == w->context,
               "line %d message %d: role %d content '%s' reasoning '%s' name '%s' id '%s' context %d",
               line, i, m->role, m->content, m->reasoning ? m->reasoning : "(null)",
               m->name ? m->name : "(null)", m->tool_call_id ? m->tool_call_id : "(null)", m->context);
        int n_calls = (w->calls[0][0] != NULL) + (w->calls[1][0] != NULL);
        EXPECT(m->n_tool_calls == n_calls, "line %d message %d: %d tool calls, want %d", line, i,
               m->n_tool_calls, n_calls);
        for (int c = 0; c < n_calls && c < m->n_tool_calls; c++)
            EXPECT(strcmp(m->tool_calls[c].name, w->calls[c][0]) == 0 &&
                       strcmp(m->tool_calls[c].arguments, w->calls[c][1]) == 0,
                   "line %d message %d call %d: %s %s, want %s %s", line, i, c,
                   m->tool_calls[c].name, m->tool_calls[c].arguments, w->calls[c][0], w->calls[c][1]);
    }
}

static void test_more_formats(void) {
    Dataset d;
    dataset_load("tests/data/more_formats.jsonl", &(LoadOptions){0}, &d);
    EXPECT(d.n_samples == 8, "%d samples", d.n_samples);
    if (d.n_samples != 8) return;
    const WantMessage sharegpt_system[] = {M(MSG_SYSTEM, "You are terse.", NULL),
                                           M(MSG_USER, "Add 2 and 3.", NULL),
                                           M(MSG_ASSISTANT, "The result is 5.", "2+3=5.")};
    check_want(&d.samples[0], sharegpt_system, 3, 1);
    check_want(&d.samples[1], sharegpt_system + 1, 2, 2);  // "thinking"
    check_want(&d.samples[2], sharegpt_system + 1, 2, 3);  // content parts
    const WantMessage trl[] = {M(MSG_SYSTEM, "You are terse.", NULL, .context = true),
                               M(MSG_USER, "Add 2 and 3.", NULL, .context = true),
                               M(MSG_ASSISTANT, "The result is 5.", "2+3=5.", .context = true),
                               M(MSG_USER, "Now double it.", NULL, .context = true),
                               M(MSG_ASSISTANT, "The result is 10.", "5*2=10.")};
    EXPECT(d.samples[3].kind == SAMPLE_CONVERSATION, "TRL prompt/completion is a conversation");
    check_want(&d.samples[3], trl, 5, 4);
    const WantMessage weather[] = {
        M(MSG_USER, "Weather in Paris?", NULL),
        M(MSG_ASSISTANT, "", "I need the weather tool.", .calls = {{"get_weather", WEATHER_ARGS}}),
        M(MSG_TOOL, "{\"temp\": 21}", NULL, .name = "get_weather", .tool_call_id = "call_1"),
        M(MSG_ASSISTANT, "It is 21 degrees.", "The tool says 21."),
        M(MSG_USER, "Thanks.", NULL),
        M(MSG_ASSISTANT, "You are welcome.", NULL)};
    check_want(&d.samples[4], weather, 6, 5);
    EXPECT(d.samples[4].n_tools == 1 &&
               strcmp(d.samples[4].tools[0],
                      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                      "\"description\": \"Weather of a city.\", \"parameters\": {\"type\": "
                      "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
                      "\"required\": [\"city\"]}}}") == 0,
           "tools: %s", d.samples[4].n_tools ? d.samples[4].tools[0] : "none");
    const WantMessage adds[] = {
        M(MSG_USER, "Add 2 and 3, then 4 and 5.", NULL),
        M(MSG_ASSISTANT, "Adding.", NULL, .calls = {{"add", "{\"a\": 2, \"b\": 3}"}, {"add", "{\"a\": 4, \"b\": 5}"}}),
        M(MSG_TOOL, "5", NULL),
        M(MSG_TOOL, "9", NULL),
        M(MSG_ASSISTANT, "The results are 5 and 9.", "5 and 9.")};
    check_want(&d.samples[5], adds, 5, 6);
    const WantMessage oslo[] = {M(MSG_USER, "Weather in Oslo?", NULL, .context = true),
                                M(MSG_ASSISTANT, "", NULL, .calls = {{"get_weather", "{\"city\": \"Oslo\"}"}}),
                                M(MSG_TOOL, "-3", NULL),
                                M(MSG_ASSISTANT, "It is -3 degrees.", "Cold.")};
    check_want(&d.samples[6], oslo, 4, 7);
    const WantMessage hi[] = {M(MSG_SYSTEM, "Use tools.", NULL),
                              M(MSG_USER, "Hi", NULL),
                              M(MSG_ASSISTANT, "Hello.", "Greet.")};
    check_want(&d.samples[7], hi, 3, 8);
    EXPECT(d.samples[7].n_tools == 1 &&
               strcmp(d.samples[7].tools[0], "{\"type\": \"function\", \"function\": {\"name\": \"add\"}}") == 0,
           "tools from a JSON string");
    dataset_free(&d);
}

// Unknown keys: refused naming the field, or ignored and counted by name.
static void test_unknown_keys(void) {
    const char *line = "{\"idx\": 7, \"messages\": [{\"role\": \"user\", \"content\": \"q\", \"weight\": 1},"
                       "{\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"A\", "
                       "\"cache\": 1}], \"weight\": 0, \"foo\": null}], \"origin\": \"x\"}";
    char err[512];
    Sample s;
    EXPECT(sample_parse_line(line, strlen(line), "k.jsonl", 3, NULL, &s, err, sizeof err) == -1 &&
               strstr(err, "k.jsonl:3: ") && strstr(err, ": unknown key"),
           "strict: %s", err);
    KeyTally tally = {0};
    ParseOptions ignore = {.ignore_unknown_keys = true, .ignored = &tally};
    for (int rep = 0; rep < 2; rep++) {
        int rc = sample_parse_line(line, strlen(line), "k.jsonl", 3, &ignore, &s, err, sizeof err);
        EXPECT(rc == 0 && s.n_messages == 2 && strcmp(s.messages[1].content, "A") == 0, "%s", err);
        if (rc == 0) sample_free(&s);
    }
    char what[512];
    key_tally_describe(&tally, what, sizeof what);
    EXPECT(strcmp(what, "12 unknown keys ignored (data.ignore_unknown_keys): idx (2), origin (2), "
                        "messages[].weight (4), messages[].foo (2), messages[].content[].cache (2)") == 0,
           "tally: %s", what);
    key_tally_free(&tally);

    // A line of 80,000 distinct unknown keys: the tally keeps KEY_TALLY_NAMES names and counts
    // the rest, so its work stays linear in the keys (each lookup scans at most 64 names).
    enum { MANY = 80000 };
    char *big = malloc((size_t)MANY * 16 + 128);
    size_t at = (size_t)sprintf(big, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"},"
                                     "{\"role\": \"assistant\", \"content\": \"A\"}]");
    for (int k = 0; k < MANY; k++) at += (size_t)sprintf(big + at, ", \"k%d\": 0", k);
    strcpy(big + at, "}");
    KeyTally many = {0};
    ParseOptions ignore_many = {.ignore_unknown_keys = true, .ignored = &many};
    int rc = sample_parse_line(big, strlen(big), "m.jsonl", 1, &ignore_many, &s, err, sizeof err);
    EXPECT(rc == 0, "80k keys: %s", err);
    if (rc == 0) sample_free(&s);
    EXPECT(many.total == MANY && many.n <= 64, "80k keys: %lld counted under %d names", many.total, many.n);
    char listed[2048];
    key_tally_describe(&many, listed, sizeof listed);
    EXPECT(strstr(listed, "k63 (1), 79936 of other names") != NULL, "80k keys: %s", listed);
    key_tally_free(&many);
    free(big);
}

// Hub shapes (ShareGPT with "source" and "domain", as open-thoughts sets have it; Nemotron-style "uuid", "license",
// "metadata" with a developer message, a glaive-style tool call with message names, a
// vLLM-generated "reasoning"): parsed without data.ignore_unknown_keys, the metadata keys
// counted by name and never part of a message.
static void test_hub_shapes(void) {
    Dataset d;
    dataset_load("tests/data/hub_shapes.jsonl", &(LoadOptions){0}, &d);
    EXPECT(d.n_samples == 4, "%d samples", d.n_samples);
    if (d.n_samples != 4) return;
    const WantMessage openthoughts[] = {
        M(MSG_SYSTEM, "Your role as an assistant involves thoroughly exploring questions.", NULL),
        M(MSG_USER, "Add 2 and 3.", NULL), M(MSG_ASSISTANT, "The result is 5.", "2+3=5.")};
    check_want(&d.samples[0], openthoughts, 3, 1);
    const WantMessage nemotron[] = {M(MSG_SYSTEM, "Reason step by step.", NULL),
                                    M(MSG_USER, "Add 2 and 3.", NULL),
                                    M(MSG_ASSISTANT, "The result is 5.", "2+3=5.")};
    check_want(&d.samples[1], nemotron, 3, 2);
    const WantMessage glaive[] = {
        M(MSG_USER, "Weather in Paris?", NULL),
        M(MSG_ASSISTANT, "", NULL, .calls = {{"get_weather", "{\"city\": \"Paris\"}"}}),
        M(MSG_TOOL, "{\"temp\": 21}", NULL, .name = "get_weather", .tool_call_id = "call_1"),
        M(MSG_ASSISTANT, "It is 21 degrees.", NULL)};
    check_want(&d.samples[2], glaive, 4, 3);
    const WantMessage vllm[] = {M(MSG_USER, "Add 2 and 3.", NULL),
                                M(MSG_ASSISTANT, "The result is 5.", "2+3=5."),
                                M(MSG_USER, "Now double it.", NULL),
                                M(MSG_ASSISTANT, "The result is 10.", "5*2=10.")};
    check_want(&d.samples[3], vllm, 4, 4);
    char what[1024];
    metadata_tally_describe(&d.metadata, what, sizeof what);
    EXPECT(strcmp(what, "14 metadata keys read, not rendered: source (1), domain (1), difficulty (1), "
                        "uuid (1), license (1), generator (1), version (1), category (1), metadata (1), "
                        "id (1), messages[].name (2), conversation_id (1), model (1)") == 0,
           "metadata: %s", what);
    EXPECT(d.ignored.total == 0, "%lld keys ignored", d.ignored.total);
    dataset_free(&d);
}

// Consecutive user messages (as chat logs and some Hub sets have them): kept as they are,
// each its own user message, in the prompt of the reply after them.
static void test_consecutive_users(void) {
    Dataset d;
    dataset_load("tests/data/consecutive_users.jsonl", &(LoadOptions){0}, &d);
    EXPECT(d.n_samples == 3, "%d samples", d.n_samples);
    if (d.n_samples != 3) return;
    const WantMessage two[] = {M(MSG_SYSTEM, "You add numbers.", NULL),
                               M(MSG_USER, "I have 2 apples.", NULL),
                               M(MSG_USER, "And 3 pears. How many fruits?", NULL),
                               M(MSG_ASSISTANT, "5 fruits.", "2 + 3 = 5."),
                               M(MSG_USER, "Add 4 plums.", NULL),
                               M(MSG_ASSISTANT, "9 fruits.", "5 + 4 = 9.")};
    check_want(&d.samples[0], two, 6, 1);
    check_want(&d.samples[1], two + 1, 5, 2);  // ShareGPT: human, human, gpt
    const WantMessage three[] = {M(MSG_USER, "Hi.", NULL), M(MSG_USER, "Are you there?", NULL),
                                 M(MSG_USER, "Say yes.", NULL), M(MSG_ASSISTANT, "Yes.", "Answer yes.")};
    check_want(&d.samples[2], three, 4, 3);
    dataset_free(&d);
}

// data.max_line_bytes: a line of exactly the limit (a '\r' before its '\n' not counted) is
// parsed; one byte more is refused unparsed, or skipped and counted under skip_too_long.
static void test_max_line_bytes(void) {
    char dir[] = "/tmp/onepass_lines_XXXXXX", path[256];
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp failed");
    snprintf(path, sizeof path, "%s/lines.jsonl", dir);
    const size_t limit = strlen(GOOD_LINE);
    FILE *f = fopen(path, "wb");
    fprintf(f, "%s\r\n%s \n%s\n%s", GOOD_LINE, GOOD_LINE, GOOD_LINE, GOOD_LINE);
    fclose(f);
    Dataset d;
    dataset_load(path, &(LoadOptions){.max_line_bytes = limit, .skip_too_long = true}, &d);
    EXPECT(d.n_samples == 3 && d.n_too_long == 1 && d.samples[1].line == 3 && d.samples[2].line == 4,
           "%d samples, %d too long", d.n_samples, d.n_too_long);
    dataset_free(&d);
    char msg[1024], want[512];
    snprintf(want, sizeof want, "%s:2: the line is %zu bytes, over data.max_line_bytes %zu: not parsed",
             path, limit + 1, limit);
    int status = load_in_child(path, (LoadOptions){.max_line_bytes = limit}, msg, sizeof msg);
    EXPECT(status == 1 && strstr(msg, want), "'%s', want '%s'", msg, want);
    remove(path);
    rmdir(dir);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_random_round_trips(&rng);
    test_fixed_cases();
    test_bad_lines(&rng);
    test_dataset_files(&rng);
    test_more_formats();
    test_unknown_keys();
    test_hub_shapes();
    test_consecutive_users();
    test_max_line_bytes();
    return test_finish();
}
