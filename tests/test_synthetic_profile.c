// gen-data's chat and agentic profiles (data/synthetic_profile.h): every length in its
// documented range, counted here with the tokenizer itself; the structure (system prompt,
// user turns, tool definitions, calls each followed by their result); lengths drawn
// log-uniformly (the median thinking sits near the geometric mean, far below the
// middle of the range); the same bytes for a seed, others for another seed.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "data/synthetic_profile.h"
#include "test_util.h"

static Tokenizer *tok;

static int tokens(const char *text) {
    static int32_t ids[1 << 16];
    return tokenizer_encode_flags(tok, text, TOKENIZER_PLAIN | TOKENIZER_CONTINUE, ids, 1 << 16);
}

static char *generate(SynthProfile p, uint64_t seed, int n, long long max_tokens, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    synth_profile_write(f, p, tok, seed, n, max_tokens);
    fclose(f);
    return buf;
}

#define IN(v, lo, hi, what) EXPECT((v) >= (lo) && (v) <= (hi), "%s: %d not in [%d, %d]", what, v, lo, hi)

static const char *str(json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

// The documented ranges (data/synthetic_profile.h, README), written out here.
static void check(SynthProfile p, const char *text) {
    const bool agentic = p == SYNTH_PROFILE_AGENTIC;
    int *thinking = malloc(100000 * sizeof(int)), n_thinking = 0, n_lines = 0;
    for (const char *line = text; *line; n_lines++) {
        const char *end = strchr(line, '\n');
        json_error_t e;
        json_t *c = json_loadb(line, (size_t)(end - line), 0, &e);
        EXPECT(c != NULL, "line %d: %s", n_lines + 1, e.text);
        line = end + 1;
        if (!c) continue;
        json_t *tools = json_object_get(c, "tools"), *msgs = json_object_get(c, "messages");
        const char *names[8];
        int n_tools = 0;
        if (agentic) {
            n_tools = (int)json_array_size(tools);
            IN(n_tools, 2, 4, "tool definitions");
            for (int t = 0; t < n_tools && t < 8; t++) {
                json_t *f = json_object_get(json_array_get(tools, (size_t)t), "function");
                names[t] = str(f, "name");
                IN(tokens(str(f, "description")), 30, 150, "tool description");
            }
        } else {
            EXPECT(tools == NULL, "chat has no tools");
        }
        const size_t n = json_array_size(msgs);
        EXPECT(n > 0 && strcmp(str(json_array_get(msgs, 0), "role"), "system") == 0, "system first");
        IN(tokens(str(json_array_get(msgs, 0), "content")), 100, 800, "system");
        int users = 0, calls = 0;
        for (size_t i = 1; i < n; i++) {
            json_t *m = json_array_get(msgs, i);
            const char *role = str(m, "role");
            if (strcmp(role, "user") == 0) {
                EXPECT(i == 1 || strcmp(str(json_array_get(msgs, i - 1), "role"), "assistant") == 0,
                       "a user turn follows an answer");
                users++;
                calls = 0;
                IN(tokens(str(m, "content")), 20, 300, "user");
            } else if (strcmp(role, "assistant") == 0) {
                const int think = tokens(str(m, "reasoning_content"));
                if (n_thinking < 100000) thinking[n_thinking++] = think;
                if (agentic) IN(think, 100, 1000, "thinking"); else IN(think, 200, 3000, "thinking");
                json_t *tc = json_object_get(m, "tool_calls");
                if (tc) {
                    EXPECT(agentic && json_array_size(tc) == 1, "one call per message, agentic only");
                    calls++;
                    json_t *fn = json_object_get(json_array_get(tc, 0), "function");
                    bool known = false;
                    for (int t = 0; t < n_tools; t++) known |= strcmp(names[t], str(fn, "name")) == 0;
                    EXPECT(known, "call of a defined tool: %s", str(fn, "name"));
                    json_t *res = json_array_get(msgs, i + 1);
                    EXPECT(res && strcmp(str(res, "role"), "tool") == 0 &&
                           strcmp(str(res, "tool_call_id"), str(json_array_get(tc, 0), "id")) == 0,
                           "each call is followed by its result");
                    if (res) IN(tokens(str(res, "content")), 100, 1500, "tool result");
                    EXPECT(strcmp(str(m, "content"), "") == 0, "a call has no answer text");
                } else {
                    const int answer = tokens(str(m, "content"));
                    if (agentic) IN(answer, 100, 500, "answer"); else IN(answer, 50, 800, "answer");
                    if (agentic) IN(calls, 1, 4, "calls in a user turn");
                    EXPECT(i + 1 == n || strcmp(str(json_array_get(msgs, i + 1), "role"), "user") == 0,
                           "an answer ends the turn");
                }
            } else {
                EXPECT(agentic && strcmp(role, "tool") == 0, "role %s", role);
            }
        }
        if (agentic) IN(users, 2, 5, "user turns"); else IN(users, 2, 8, "user turns");
        json_decref(c);
    }
    qsort(thinking, (size_t)n_thinking, sizeof(int), cmp_int);
    const int median = n_thinking ? thinking[n_thinking / 2] : 0;
    // log-uniform on [200, 3000]: median ~775; on [100, 1000]: ~316 (uniform: 1600, 550)
    if (agentic) IN(median, 200, 450, "median thinking"); else IN(median, 500, 1100, "median thinking");
    EXPECT(n_thinking > 50, "%d thinking texts", n_thinking);
    free(thinking);
    EXPECT(n_lines == 30, "%d conversations", n_lines);
}

int main(void) {
    char err[1024];
    tok = tokenizer_load("datasets/synthetic/tokenizer.model", err, sizeof err);
    if (!tok) {
        printf("skip: %s\n", err);
        return 77;
    }
    SynthProfile p;
    EXPECT(synth_profile_parse("chat", &p) == 0 && p == SYNTH_PROFILE_CHAT, "chat");
    EXPECT(synth_profile_parse("agentic", &p) == 0 && p == SYNTH_PROFILE_AGENTIC, "agentic");
    EXPECT(synth_profile_parse("code", &p) != 0, "unknown profile refused");
    for (int k = 0; k < 2; k++) {
        const SynthProfile profile = k ? SYNTH_PROFILE_AGENTIC : SYNTH_PROFILE_CHAT;
        size_t len1, len2, len3;
        char *a = generate(profile, 7, 30, 0, &len1), *b = generate(profile, 7, 30, 0, &len2),
             *c = generate(profile, 8, 30, 0, &len3);
        check(profile, a);
        EXPECT(len1 == len2 && memcmp(a, b, len1) == 0, "same seed, same bytes");
        EXPECT(len1 != len3 || memcmp(a, c, len1) != 0, "another seed, other conversations");
        free(a);
        free(b);
        free(c);
    }
    // max_tokens: no conversation's texts add up to more (the markup counted on top).
    size_t len;
    char *capped = generate(SYNTH_PROFILE_AGENTIC, 9, 8, 12000, &len);
    int n_capped = 0;
    for (const char *line = capped; *line; n_capped++) {
        const char *end = strchr(line, '\n');
        json_t *c = json_loadb(line, (size_t)(end - line), 0, NULL);
        line = end + 1;
        json_t *msgs = json_object_get(c, "messages");
        int total = 0;
        for (size_t i = 0; i < json_array_size(msgs); i++) {
            json_t *m = json_array_get(msgs, i);
            total += tokens(str(m, "content"));
            if (json_object_get(m, "reasoning_content")) total += tokens(str(m, "reasoning_content"));
        }
        EXPECT(total <= 12000, "conversation %d: %d tokens of text over max_tokens 12000", n_capped, total);
        json_decref(c);
    }
    EXPECT(n_capped == 8, "%d capped conversations", n_capped);
    free(capped);
    tokenizer_free(tok);
    return test_finish();
}
