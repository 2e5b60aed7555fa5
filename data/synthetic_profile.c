// Synthetic conversations of realistic shapes (data/synthetic_profile.h).
#include "data/synthetic_profile.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

static const SynthProfileRanges CHAT = {
    .system = {100, 800}, .user_turns = {2, 8}, .user = {20, 300}, .thinking = {200, 3000},
    .answer = {50, 800},
};
static const SynthProfileRanges AGENTIC = {
    .system = {100, 800}, .user_turns = {2, 5}, .user = {20, 300}, .thinking = {100, 1000},
    .answer = {100, 500}, .tools = {2, 4}, .tool_description = {30, 150},
    .calls_per_turn = {1, 4}, .tool_result = {100, 1500},
};

int synth_profile_parse(const char *name, SynthProfile *out) {
    if (strcmp(name, "chat") == 0) *out = SYNTH_PROFILE_CHAT;
    else if (strcmp(name, "agentic") == 0) *out = SYNTH_PROFILE_AGENTIC;
    else return -1;
    return 0;
}

const SynthProfileRanges *synth_profile_ranges(SynthProfile p) {
    return p == SYNTH_PROFILE_CHAT ? &CHAT : &AGENTIC;
}

// The filler vocabulary: plain lower-case words.
static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on",
    "be", "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they",
    "which", "one", "you", "were", "all", "we", "when", "there", "can", "been", "has", "more",
    "if", "no", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them",
    "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do",
    "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most",
    "made", "after", "also", "did", "many", "before", "must", "through", "back", "years",
    "where", "much", "your", "way", "well", "down", "should", "because", "each", "just",
    "those", "people", "how", "too", "little", "state", "good", "very", "make", "world",
    "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life",
    "being", "under", "never", "day", "same", "another", "know", "while", "last", "might",
    "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used",
    "take", "three", "function", "value", "result", "check", "file", "list", "number",
    "query", "search", "step", "case", "error", "output", "input", "test", "data", "next",
    "a", "x", "y", "z", "i", "e", "s", "t", "n", "o",
};
enum { N_WORDS = sizeof WORDS / sizeof WORDS[0] };

static const char *const TOOL_NAMES[] = {"search", "read_file", "run_python", "get_weather"};

typedef struct {
    uint64_t state;
    const Tokenizer *tok;
    int cost_first[N_WORDS], cost[N_WORDS];  // tokens of "w" (text start) and " w"
    int one_first, one;                      // a word of one token in each place; -1: none
    long long size;  // the conversation's size so far (synth_profile_write's max_tokens)
    int last;        // the tokens of the last filler text
} Gen;

enum { MESSAGE_OVERHEAD = 32 };  // tokens counted per message for the template's markup

static int count_tokens(const Tokenizer *tok, const char *text) {
    int32_t small[64];
    int n = tokenizer_encode_flags(tok, text, TOKENIZER_PLAIN | TOKENIZER_CONTINUE, small, 64);
    if (n < 0) fatal("gen-data: the tokenizer cannot encode '%.40s'", text);
    return n;
}

int synth_text_tokens(const Tokenizer *tok, const char *text) {
    int32_t *ids = NULL;
    int cap = 0, n;
    while ((n = tokenizer_encode_flags(tok, text, TOKENIZER_PLAIN | TOKENIZER_CONTINUE, ids, cap)) > cap) {
        cap = n;
        ids = xrealloc(ids, (size_t)cap * sizeof *ids);
    }
    free(ids);
    if (n < 0) fatal("gen-data: the tokenizer cannot encode a generated text");
    return n;
}

static void gen_init(Gen *g, const Tokenizer *tok, uint64_t seed) {
    *g = (Gen){.state = seed, .tok = tok, .one_first = -1, .one = -1};
    char buf[64];
    for (int w = 0; w < N_WORDS; w++) {
        g->cost_first[w] = count_tokens(tok, WORDS[w]);
        snprintf(buf, sizeof buf, " %s", WORDS[w]);
        g->cost[w] = count_tokens(tok, buf);
        if (g->cost_first[w] == 1 && g->one_first < 0) g->one_first = w;
        if (g->cost[w] == 1 && g->one < 0) g->one = w;
    }
}

static uint64_t gen_next(Gen *g) { return splitmix64(&g->state); }

static int uniform(Gen *g, SynthRange r) {
    return r.lo + (int)(gen_next(g) % (uint64_t)(r.hi - r.lo + 1));
}

// Log-uniform on [lo, hi]: exp of a uniform draw on [log lo, log(hi + 1)), floored.
static int log_uniform(Gen *g, SynthRange r) {
    const double u = (double)(gen_next(g) >> 11) / 9007199254740992.0;  // [0, 1)
    int v = (int)floor(exp(log((double)r.lo) + u * (log((double)r.hi + 1.0) - log((double)r.lo))));
    return v < r.lo ? r.lo : v > r.hi ? r.hi : v;
}

typedef struct {
    char *s;
    size_t len, cap;
} Text;

static void text_add(Text *t, const char *word, bool first) {
    const size_t n = strlen(word) + 1;
    if (t->len + n + 1 > t->cap) {
        t->cap = 2 * (t->len + n + 1);
        t->s = xrealloc(t->s, t->cap);
    }
    t->len += (size_t)sprintf(t->s + t->len, first ? "%s" : " %s", word);
}

// Filler text of `target` tokens: words while they fit, then one-token words; the exact
// count is checked by encoding the whole text, and words are added or dropped until it
// is in [r.lo, r.hi].
static char *filler(Gen *g, int target, SynthRange r) {
    Text t = {0};
    int words[1 << 14], n_words = 0, used = 0;
    while (used < target && n_words < (int)(sizeof words / sizeof words[0])) {
        const bool first = n_words == 0;
        int w = (int)(gen_next(g) % N_WORDS);
        const int *cost = first ? g->cost_first : g->cost;
        if (used + cost[w] > target) {
            const int one = first ? g->one_first : g->one;
            if (one >= 0) w = one;
        }
        words[n_words++] = w;
        used += cost[w];
    }
    for (int tries = 0;; tries++) {
        t.len = 0;
        for (int i = 0; i < n_words; i++) text_add(&t, WORDS[words[i]], i == 0);
        const int n = synth_text_tokens(g->tok, t.s);
        if (n >= r.lo && n <= r.hi) {
            g->size += n;
            g->last = n;
            return t.s;
        }
        if (tries == 64) fatal("gen-data: cannot make a text of %d..%d tokens with this tokenizer", r.lo, r.hi);
        if (n < r.lo && n_words < (int)(sizeof words / sizeof words[0]))
            words[n_words++] = g->one >= 0 ? g->one : 0;
        else if (n > r.hi && n_words > 1) n_words--;
    }
}

// Counts the message's markup; an answer's or a tool result's text and markup twice
// (duplicate lays out a history copy of them).
static json_t *message(Gen *g, const char *role, char *content) {
    g->size += MESSAGE_OVERHEAD;
    if (strcmp(role, "assistant") == 0 || strcmp(role, "tool") == 0)
        g->size += MESSAGE_OVERHEAD + (content[0] ? g->last : 0);
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string(role));
    json_object_set_new(m, "content", json_string(content));
    free(content);
    return m;
}

static json_t *assistant(Gen *g, const SynthProfileRanges *r, bool with_answer) {
    json_t *m = with_answer ? message(g, "assistant", filler(g, log_uniform(g, r->answer), r->answer))
                            : message(g, "assistant", strdup(""));
    char *think = filler(g, log_uniform(g, r->thinking), r->thinking);
    json_object_set_new(m, "reasoning_content", json_string(think));
    free(think);
    return m;
}

static json_t *tool_definitions(Gen *g, const SynthProfileRanges *r, int n_tools) {
    json_t *tools = json_array();
    for (int i = 0; i < n_tools; i++) {
        char *description = filler(g, log_uniform(g, r->tool_description), r->tool_description);
        json_t *f = json_pack("{s:s, s:s, s:{s:s, s:{s:{s:s}}, s:[s]}}", "name", TOOL_NAMES[i],
                              "description", description, "parameters", "type", "object",
                              "properties", "query", "type", "string", "required", "query");
        free(description);
        json_array_append_new(tools, json_pack("{s:s, s:o}", "type", "function", "function", f));
    }
    char *text = json_dumps(tools, JSON_COMPACT);
    g->size += synth_text_tokens(g->tok, text);
    free(text);
    return tools;
}

static json_t *conversation(Gen *g, SynthProfile p) {
    const SynthProfileRanges *r = synth_profile_ranges(p);
    g->size = 0;
    json_t *root = json_object(), *msgs = json_array();
    int n_tools = 0;
    if (p == SYNTH_PROFILE_AGENTIC) {
        n_tools = uniform(g, r->tools);
        json_object_set_new(root, "tools", tool_definitions(g, r, n_tools));
    }
    json_array_append_new(msgs, message(g, "system", filler(g, log_uniform(g, r->system), r->system)));
    const int turns = uniform(g, r->user_turns);
    int call_id = 0;
    for (int t = 0; t < turns; t++) {
        json_array_append_new(msgs, message(g, "user", filler(g, log_uniform(g, r->user), r->user)));
        if (p == SYNTH_PROFILE_AGENTIC) {
            const int calls = uniform(g, r->calls_per_turn);
            for (int c = 0; c < calls; c++) {
                const char *name = TOOL_NAMES[gen_next(g) % (uint64_t)n_tools];
                char id[32];
                snprintf(id, sizeof id, "call_%d", call_id++);
                const SynthRange args = {3, 20};
                char *query = filler(g, uniform(g, args), (SynthRange){1, 40});
                char *arguments = NULL;
                json_t *a = json_pack("{s:s}", "query", query);
                arguments = json_dumps(a, JSON_COMPACT);
                g->size += 2 * (synth_text_tokens(g->tok, arguments) + MESSAGE_OVERHEAD);
                json_decref(a);
                free(query);
                json_t *call = assistant(g, r, false);
                json_object_set_new(call, "tool_calls",
                                    json_pack("[{s:s, s:s, s:{s:s, s:s}}]", "id", id, "type",
                                              "function", "function", "name", name,
                                              "arguments", arguments));
                free(arguments);
                json_array_append_new(msgs, call);
                json_t *result = message(g, "tool", filler(g, log_uniform(g, r->tool_result), r->tool_result));
                json_object_set_new(result, "name", json_string(name));
                json_object_set_new(result, "tool_call_id", json_string(id));
                json_array_append_new(msgs, result);
            }
        }
        json_array_append_new(msgs, assistant(g, r, true));
    }
    json_object_set_new(root, "messages", msgs);
    return root;
}

void synth_profile_write(FILE *f, SynthProfile p, const Tokenizer *tok, uint64_t seed, int n,
                         long long max_tokens) {
    Gen *g = xmalloc(sizeof *g);
    gen_init(g, tok, seed);
    for (int i = 0; i < n; i++) {
        json_t *c = conversation(g, p);
        for (int tries = 1; max_tokens > 0 && g->size > max_tokens; tries++) {
            if (tries == 1000)
                fatal("gen-data: --max-tokens %lld: 1000 conversations in a row were larger",
                      max_tokens);
            json_decref(c);
            c = conversation(g, p);
        }
        char *line = json_dumps(c, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fprintf(f, "%s\n", line);
        free(line);
        json_decref(c);
    }
    free(g);
}
