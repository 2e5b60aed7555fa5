// JSONL parsing: every format gives the right messages and reasoning (random
// texts, built and serialized by jansson as the oracle); every kind of bad input
// gives "path:line: field: what"; dataset_load skips or fails as asked.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/conversation.h"
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
                             "id", "extra keys are ignored");
            char *line = json_dumps(root, JSON_COMPACT);
            Sample s;
            KeyTally tally = {0};
            ParseOptions ignore = {true, &tally};
            int rc = sample_parse_line(line, strlen(line), "rand.jsonl", trial + 1, &ignore, &s, err,
                                       sizeof err);
            EXPECT(rc == 0, "%s", err);
            EXPECT(tally.total == 1 && tally.n == 1 && strcmp(tally.names[0], "id") == 0,
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
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"A\"}]}",
     "messages[1].role: expected 'assistant' here, got 'user'"},
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

// Runs dataset_load(path, false) in a child; returns its exit status and stderr.
static int load_in_child(const char *path, char *out, size_t out_len) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        Dataset d;
        dataset_load(path, &(LoadOptions){0}, &d);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < out_len && (got = read(fds[0], out + n, out_len - 1 - n)) > 0) n += (size_t)got;
    out[n] = '\0';
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
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
        int status = load_in_child(path, msg, sizeof msg);
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
    EXPECT(load_in_child(path, msg, sizeof msg) == 1 && strstr(msg, path),
          "a missing file: '%s'", msg);
    snprintf(path, sizeof path, "%s/empty.jsonl", dir);
    fclose(fopen(path, "wb"));
    EXPECT(load_in_child(path, msg, sizeof msg) == 1 && strstr(msg, "no usable samples"),
          "an empty file: '%s'", msg);
    remove(path);
    snprintf(path, sizeof path, "%s/mixed.jsonl", dir);
    remove(path);
    rmdir(dir);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_random_round_trips(&rng);
    test_fixed_cases();
    test_bad_lines(&rng);
    test_dataset_files(&rng);
    return test_finish();
}
