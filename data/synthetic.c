// Synthetic chained-arithmetic conversations (data/synthetic.h).
#include "data/synthetic.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// Results stay below this (at most 5 digits), which keeps thinking short.
#define RESULT_LIMIT 100000LL
#define MAX_TURNS 8

// ---- PRNG (splitmix64): our own, so the data does not depend on the libc.

typedef struct {
    uint64_t state;
} SynthRng;

static uint64_t rng_next(SynthRng *r) { return splitmix64(&r->state); }

static long long rng_range(SynthRng *r, long long lo, long long hi_inclusive) {
    return lo + (long long)(rng_next(r) % (uint64_t)(hi_inclusive - lo + 1));
}

static bool rng_percent(SynthRng *r, int percent) { return (int)(rng_next(r) % 100) < percent; }

uint64_t synthetic_split_seed(uint64_t seed, int split) {
    SynthRng r = {seed ^ ((uint64_t)(split + 1) * 0xD1B54A32D192ED03ULL)};
    return rng_next(&r);
}

// ---- Growable text buffer.

typedef struct {
    char *s;
    size_t len, cap;
} StrBuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(StrBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->len + (size_t)n + 1 > b->cap) {
        b->cap = 2 * (b->len + (size_t)n + 1);
        b->s = xrealloc(b->s, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

// ---- Questions: one table both renders and parses them.

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_RECALL } Op;

typedef struct {
    Op op;
    bool opens;           // first question of a conversation: {a} is given, not "the result"
    const char *pattern;  // {a}, {b}: the operands
} QuestionPattern;

static const QuestionPattern QUESTIONS[] = {
    {OP_ADD, true, "Add {a} and {b}."},
    {OP_ADD, true, "What is {a} plus {b}?"},
    {OP_SUB, true, "Subtract {b} from {a}."},
    {OP_SUB, true, "What is {a} minus {b}?"},
    {OP_MUL, true, "Multiply {a} by {b}."},
    {OP_MUL, true, "What is {a} times {b}?"},
    {OP_ADD, false, "Now add {b} to the result."},
    {OP_ADD, false, "Add {b} to that."},
    {OP_SUB, false, "Now subtract {b} from the result."},
    {OP_SUB, false, "Take away {b}."},
    {OP_MUL, false, "Now multiply the result by {b}."},
    {OP_MUL, false, "Multiply that by {b}."},
    {OP_RECALL, false, "What is the result so far?"},
};
enum { N_QUESTIONS = sizeof(QUESTIONS) / sizeof(QUESTIONS[0]) };

static const char *const SYSTEM_PROMPTS[] = {
    "You are a careful calculator. Work out every step before answering.",
    "Solve each arithmetic step exactly. Keep track of the running result.",
    "Rechne Schritt für Schritt und nenne am Ende das Ergebnis.",
};

static long long apply_op(Op op, long long x, long long y) {
    switch (op) {
    case OP_ADD: return x + y;
    case OP_SUB: return x - y;
    case OP_MUL: return x * y;
    case OP_RECALL: return x;
    }
    return x;
}

// apply_op for the oracle, on numbers from any text: false when the result does not fit
// a long long (the generator's own stay below RESULT_LIMIT).
static bool apply_op_checked(Op op, long long x, long long y, long long *out) {
    switch (op) {
    case OP_ADD: return !__builtin_add_overflow(x, y, out);
    case OP_SUB: return !__builtin_sub_overflow(x, y, out);
    case OP_MUL: return !__builtin_mul_overflow(x, y, out);
    case OP_RECALL: *out = x; return true;
    }
    return false;
}

static const char *op_symbol(Op op) { return op == OP_ADD ? "+" : op == OP_SUB ? "-" : "×"; }

static void render_question(StrBuf *b, const char *pattern, long long a, long long y) {
    for (const char *p = pattern; *p; p++) {
        if (strncmp(p, "{a}", 3) == 0 || strncmp(p, "{b}", 3) == 0) {
            sb_printf(b, "%lld", p[1] == 'a' ? a : y);
            p += 2;
        } else {
            sb_printf(b, "%c", *p);
        }
    }
}

// Matches text against a pattern; on success stores the operands (absent ones: 0).
static bool match_question(const char *pattern, const char *text, long long *a, long long *y) {
    *a = *y = 0;
    const char *t = text;
    for (const char *p = pattern; *p; p++) {
        if (strncmp(p, "{a}", 3) == 0 || strncmp(p, "{b}", 3) == 0) {
            if (!isdigit((unsigned char)*t)) return false;
            char *end;
            errno = 0;
            long long v = strtoll(t, &end, 10);
            if (errno == ERANGE) return false;  // not a number a long long holds
            *(p[1] == 'a' ? a : y) = v;
            t = end;
            p += 2;
        } else if (*t++ != *p) {
            return false;
        }
    }
    return *t == '\0';
}

// ---- Thinking: the arithmetic written out, one of three methods.

typedef enum { METHOD_COLUMN, METHOD_SPLIT, METHOD_CHECKED, N_METHODS } Method;

static int n_digits(long long v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

static int digit_at(long long v, int i) {
    while (i-- > 0) v /= 10;
    return (int)(v % 10);
}

static void think_column_add(StrBuf *b, long long x, long long y) {
    sb_printf(b, "%lld + %lld by columns, right to left:\n", x, y);
    int nx = n_digits(x), ny = n_digits(y), carry = 0;
    for (int i = 0; i < nx || i < ny || carry; i++) {
        int sum = 0, n_terms = 0;
        const int terms[3] = {i < nx ? digit_at(x, i) : -1, i < ny ? digit_at(y, i) : -1,
                              carry ? carry : -1};
        for (int k = 0; k < 3; k++) {
            if (terms[k] < 0) continue;
            sb_printf(b, n_terms++ ? "+%d" : "%d", terms[k]);
            sum += terms[k];
        }
        if (n_terms > 1) sb_printf(b, "=%d", sum);
        carry = sum / 10;
        sb_printf(b, carry ? ", write %d carry %d.\n" : ", write %d.\n", sum % 10, carry);
    }
}

static void think_column_sub(StrBuf *b, long long x, long long y) {
    sb_printf(b, "%lld - %lld by columns, right to left:\n", x, y);
    int nx = n_digits(x), ny = n_digits(y), borrow = 0;
    for (int i = 0; i < nx; i++) {
        int top = digit_at(x, i), take = (i < ny ? digit_at(y, i) : 0) + borrow;
        if (i < ny && borrow)
            sb_printf(b, "%d-%d-1", top, digit_at(y, i));
        else if (i < ny || borrow)
            sb_printf(b, "%d-%d", top, take);
        else
            sb_printf(b, "%d", top);
        borrow = top < take;
        if (borrow)
            sb_printf(b, " is below 0, borrow: %d-%d=%d", top + 10, take, top + 10 - take);
        else if (i < ny || take)
            sb_printf(b, "=%d", top - take);
        sb_printf(b, ", write %d.\n", top + 10 * borrow - take);
    }
}

static void think_column_mul(StrBuf *b, long long x, long long k) {
    sb_printf(b, "%lld × %lld by digits, right to left:\n", x, k);
    int nx = n_digits(x), carry = 0;
    for (int i = 0; i < nx; i++) {
        int d = digit_at(x, i), prod = d * (int)k + carry;
        if (carry)
            sb_printf(b, "%d×%lld+%d=%d", d, k, carry, prod);
        else
            sb_printf(b, "%d×%lld=%d", d, k, prod);
        carry = prod / 10;
        sb_printf(b, carry ? ", write %d carry %d.\n" : ", write %d.\n", prod % 10, carry);
    }
    if (carry) sb_printf(b, "Write the last carry %d.\n", carry);
}

static void think_column(StrBuf *b, Op op, long long x, long long y) {
    if (op == OP_ADD) think_column_add(b, x, y);
    if (op == OP_SUB) think_column_sub(b, x, y);
    if (op == OP_MUL) think_column_mul(b, x, y);
}

// Place-value parts of v, largest first (zeros skipped). Returns the count.
static int place_parts(long long v, long long parts[static 7]) {
    int n = 0;
    long long scale = 1;
    for (int i = 0; i < n_digits(v); i++, scale *= 10)
        if (digit_at(v, i)) parts[n++] = digit_at(v, i) * scale;
    for (int i = 0; i < n / 2; i++) {
        long long t = parts[i];
        parts[i] = parts[n - 1 - i];
        parts[n - 1 - i] = t;
    }
    return n;
}

// Splits the number that gets decomposed (y for + and -, x for ×) into place
// values and works part by part. Needs at least two parts.
static bool split_applies(Op op, long long x, long long y) {
    long long parts[7];
    return place_parts(op == OP_MUL ? x : y, parts) >= 2;
}

static void think_split(StrBuf *b, Op op, long long x, long long y) {
    long long parts[7];
    int n = place_parts(op == OP_MUL ? x : y, parts);
    sb_printf(b, "Split %lld into %lld", op == OP_MUL ? x : y, parts[0]);
    for (int i = 1; i < n; i++) sb_printf(b, " + %lld", parts[i]);
    sb_printf(b, ".\n");
    if (op == OP_MUL) {
        for (int i = 0; i < n; i++)
            sb_printf(b, "%lld × %lld = %lld.\n", parts[i], y, parts[i] * y);
        sb_printf(b, "%lld", parts[0] * y);
        for (int i = 1; i < n; i++) sb_printf(b, " + %lld", parts[i] * y);
        sb_printf(b, " = %lld.\n", x * y);
        return;
    }
    long long acc = x;
    for (int i = 0; i < n; i++) {
        long long next = apply_op(op, acc, parts[i]);
        sb_printf(b, "%lld %s %lld = %lld.\n", acc, op_symbol(op), parts[i], next);
        acc = next;
    }
}

static void think_check(StrBuf *b, Op op, long long x, long long y) {
    long long r = apply_op(op, x, y);
    if (op == OP_ADD) sb_printf(b, "Check: %lld - %lld = %lld, correct.\n", r, y, x);
    if (op == OP_SUB) sb_printf(b, "Check: %lld + %lld = %lld, correct.\n", r, y, x);
    if (op == OP_MUL) sb_printf(b, "Check: %lld ÷ %lld = %lld, correct.\n", r, y, x);
}

// The reasoning of one turn (x: the running result before it, y: the operand).
static char *make_thinking(Op op, long long x, long long y, bool recalls, Method method) {
    StrBuf b = {0};
    if (recalls) sb_printf(&b, "The result so far is %lld.\n", x);
    if (method == METHOD_SPLIT)
        think_split(&b, op, x, y);
    else
        think_column(&b, op, x, y);
    if (method == METHOD_CHECKED) think_check(&b, op, x, y);
    sb_printf(&b, "So %lld %s %lld = %lld.", x, op_symbol(op), y, apply_op(op, x, y));
    return b.s;
}

static char *make_answer(long long result) {
    StrBuf b = {0};
    sb_printf(&b, "The result is %lld.", result);
    return b.s;
}

static Method pick_method(SynthRng *r, Op op, long long x, long long y) {
    int roll = (int)rng_range(r, 0, 99);
    if (roll < 20 && split_applies(op, x, y)) return METHOD_SPLIT;
    return roll >= 90 ? METHOD_CHECKED : METHOD_COLUMN;
}

// ---- One turn: question, operands, thinking, answer.

typedef struct {
    char *question;
    char *thinking;  // NULL for a recall turn
    char *answer;
    Op op;
    long long before, operand, result;
} Turn;

static void turn_free(Turn *t) {
    free(t->question);
    free(t->thinking);
    free(t->answer);
}

static const QuestionPattern *pick_pattern(SynthRng *r, Op op, bool opens) {
    int matching[N_QUESTIONS], n = 0;
    for (int i = 0; i < N_QUESTIONS; i++)
        if (QUESTIONS[i].op == op && QUESTIONS[i].opens == opens) matching[n++] = i;
    return &QUESTIONS[matching[rng_range(r, 0, n - 1)]];
}

// Draws the next question given the running result (`opens`: first question,
// whose first operand is drawn here); recall questions have no thinking.
static Turn make_turn(SynthRng *r, long long current, bool opens) {
    Turn t = {0};
    if (opens) current = rng_range(r, 100, 9999);
    for (;;) {
        int roll = (int)rng_range(r, 0, 99);
        t.op = !opens && roll < 8 ? OP_RECALL : roll < 45 ? OP_ADD : roll < 75 ? OP_SUB : OP_MUL;
        if (t.op == OP_SUB && current < 20) continue;
        if (t.op == OP_MUL && current * 9 >= RESULT_LIMIT) continue;
        if (t.op == OP_ADD && current + 9999 >= RESULT_LIMIT) continue;
        break;
    }
    t.before = current;
    t.operand = t.op == OP_ADD   ? rng_range(r, 10, 9999)
                : t.op == OP_SUB ? rng_range(r, 10, current < 9999 ? current : 9999)
                : t.op == OP_MUL ? rng_range(r, 2, 9)
                                 : 0;
    t.result = apply_op(t.op, current, t.operand);
    StrBuf q = {0};
    render_question(&q, pick_pattern(r, t.op, opens)->pattern, current, t.operand);
    t.question = q.s;
    if (t.op != OP_RECALL)
        t.thinking = make_thinking(t.op, current, t.operand, !opens,
                                   pick_method(r, t.op, current, t.operand));
    t.answer = make_answer(t.result);
    return t;
}

// ---- JSON lines.

typedef enum { FORMAT_REASONING_FIELD, FORMAT_INLINE_THINK, FORMAT_SHAREGPT } LineFormat;

static json_t *json_message(LineFormat fmt, const char *role, const char *content) {
    static const char *const sharegpt_roles[][2] = {
        {"system", "system"}, {"user", "human"}, {"assistant", "gpt"}};
    if (fmt != FORMAT_SHAREGPT) return json_pack("{s:s, s:s}", "role", role, "content", content);
    int i = 0;
    while (i < 3 && strcmp(role, sharegpt_roles[i][0]) != 0) i++;
    CHECK(i < 3, "no ShareGPT name for role '%s'", role);
    return json_pack("{s:s, s:s}", "from", sharegpt_roles[i][1], "value", content);
}

static json_t *json_assistant(LineFormat fmt, const char *thinking, const char *answer) {
    if (!thinking) return json_message(fmt, "assistant", answer);
    if (fmt == FORMAT_REASONING_FIELD)
        return json_pack("{s:s, s:s, s:s}", "role", "assistant", "content", answer,
                         "reasoning_content", thinking);
    StrBuf inline_text = {0};
    sb_printf(&inline_text, "<think>\n%s\n</think>\n\n%s", thinking, answer);
    json_t *m = json_message(fmt, "assistant", inline_text.s);
    free(inline_text.s);
    return m;
}

static void write_json_line(FILE *f, json_t *root) {
    char *text = json_dumps(root, JSON_COMPACT);
    CHECK(text, "cannot serialize a synthetic sample");
    fputs(text, f);
    fputc('\n', f);
    free(text);
    json_decref(root);
}

// A system message for about a third of the samples, else NULL.
static const char *pick_system(SynthRng *r) {
    const int n_prompts = (int)(sizeof(SYSTEM_PROMPTS) / sizeof(SYSTEM_PROMPTS[0]));
    return rng_percent(r, 30) ? SYSTEM_PROMPTS[rng_range(r, 0, n_prompts - 1)] : NULL;
}

// Estimated token count of text under a tokenizer trained on this data: each
// digit is a token (split_digits), as are a space before a digit, each word and
// each other character. Lets the generator bound lengths before any tokenizer
// exists; tests/test_synthetic.c checks the real counts.
static int estimate_tokens(const char *text) {
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; n++) {
        if (isalpha(*p)) {
            while (isalpha(*p)) p++;
        } else if (*p == ' ') {
            p++;
            if (!isdigit(*p)) n--;  // the space belongs to the word or symbol after it
        } else {
            p++;
            while ((*p & 0xC0) == 0x80) p++;  // the rest of a UTF-8 character
        }
    }
    return n;
}

// Estimated length of the conversation's duplicate-layout document, the longest
// layout: every prompt, thinking and answer, plus a history copy of each answer
// that has thinking, except the last (template tokens counted too).
static int estimate_duplicate_length(const char *system, const Turn *turns, int n_turns) {
    int n = system ? estimate_tokens(system) + 1 : 0;
    for (int t = 0; t < n_turns; t++) {
        int answer = estimate_tokens(turns[t].answer) + 1;
        n += estimate_tokens(turns[t].question) + 2 + answer;
        if (turns[t].thinking)
            n += estimate_tokens(turns[t].thinking) + 2 + (t + 1 < n_turns ? answer : 0);
    }
    return n;
}

void synthetic_write_conversations(FILE *f, uint64_t seed, int n) {
    // Keeps every layout's document under data.seq_len = 1024 with a margin.
    enum { TOKEN_BUDGET = 900 };
    SynthRng r = {seed};
    for (int i = 0; i < n; i++) {
        int roll = (int)rng_range(&r, 0, 99);
        LineFormat fmt = roll < 50   ? FORMAT_REASONING_FIELD
                         : roll < 80 ? FORMAT_INLINE_THINK
                                     : FORMAT_SHAREGPT;
        int n_turns = (int)rng_range(&r, 1, MAX_TURNS);
        const char *system = NULL;
        Turn turns[MAX_TURNS];
        // Redraw until it fits: the turn count stays uniform over 1..MAX_TURNS.
        for (bool fits = false; !fits;) {
            system = pick_system(&r);
            for (int t = 0; t < n_turns; t++)
                turns[t] = make_turn(&r, t ? turns[t - 1].result : 0, t == 0);
            fits = estimate_duplicate_length(system, turns, n_turns) <= TOKEN_BUDGET;
            if (!fits)
                for (int t = 0; t < n_turns; t++) turn_free(&turns[t]);
        }
        json_t *messages = json_array();
        if (system) json_array_append_new(messages, json_message(fmt, "system", system));
        for (int t = 0; t < n_turns; t++) {
            json_array_append_new(messages, json_message(fmt, "user", turns[t].question));
            json_array_append_new(messages,
                                  json_assistant(fmt, turns[t].thinking, turns[t].answer));
            turn_free(&turns[t]);
        }
        write_json_line(f, json_pack("{s:o}", fmt == FORMAT_SHAREGPT ? "conversations" : "messages",
                                     messages));
    }
}

void synthetic_write_shared_prefix(FILE *f, uint64_t seed, int n) {
    SynthRng r = {seed};
    for (int i = 0; i < n; i++) {
        json_t *prompt = json_array();
        const char *system = pick_system(&r);
        if (system)
            json_array_append_new(prompt, json_message(FORMAT_REASONING_FIELD, "system", system));
        // History: finished turns as the model sees them at inference (no thinking).
        int n_history = (int)rng_range(&r, 1, 5);
        long long current = 0;
        for (int t = 0; t < n_history; t++) {
            Turn turn = make_turn(&r, current, t == 0);
            json_array_append_new(prompt,
                                  json_message(FORMAT_REASONING_FIELD, "user", turn.question));
            json_array_append_new(prompt,
                                  json_message(FORMAT_REASONING_FIELD, "assistant", turn.answer));
            current = turn.result;
            turn_free(&turn);
        }
        Turn last;
        do {
            last = make_turn(&r, current, false);
            if (last.op == OP_RECALL) turn_free(&last);
        } while (last.op == OP_RECALL);
        json_array_append_new(prompt, json_message(FORMAT_REASONING_FIELD, "user", last.question));

        // Completions: the new question worked out by different methods.
        json_t *completions = json_array();
        bool can_split = split_applies(last.op, last.before, last.operand);
        int first_method = can_split ? (int)rng_range(&r, 0, N_METHODS - 1) : 0;
        int n_completions = can_split ? (int)rng_range(&r, 2, 3) : 2;
        for (int c = 0; c < n_completions; c++) {
            Method m = (Method)((first_method + c) % N_METHODS);
            if (m == METHOD_SPLIT && !can_split) m = METHOD_CHECKED;
            char *thinking = make_thinking(last.op, last.before, last.operand, true, m);
            LineFormat fmt = rng_percent(&r, 50) ? FORMAT_REASONING_FIELD : FORMAT_INLINE_THINK;
            json_array_append_new(completions, json_assistant(fmt, thinking, last.answer));
            free(thinking);
        }
        turn_free(&last);
        write_json_line(f, json_pack("{s:o, s:o}", "prompt", prompt, "completions", completions));
    }
}

// ---- Checking answers against the questions.

int synthetic_expected_results(const Message *messages, int n_messages, long long *results,
                               int cap) {
    long long current = 0;
    int n_questions = 0;
    for (int i = 0; i < n_messages; i++) {
        if (messages[i].role != MSG_USER) continue;
        bool opens = n_questions == 0, matched = false;
        for (int q = 0; q < N_QUESTIONS && !matched; q++) {
            long long a, y;
            if (QUESTIONS[q].opens != opens ||
                !match_question(QUESTIONS[q].pattern, messages[i].content, &a, &y))
                continue;
            if (!apply_op_checked(QUESTIONS[q].op, opens ? a : current, y, &current))
                return -1;  // a result past long long: no number to score against
            matched = true;
        }
        if (!matched) return -1;
        if (n_questions < cap) results[n_questions] = current;
        n_questions++;
    }
    return n_questions;
}

bool synthetic_check_answer(const char *answer, long long expected) {
    const char *last = NULL;
    for (const char *p = answer; *p; p++)
        if (isdigit((unsigned char)*p) && (p == answer || !isdigit((unsigned char)p[-1]))) last = p;
    if (!last) return false;
    errno = 0;
    long long v = strtoll(last, NULL, 10);
    return errno == 0 && v == expected;
}

int synthetic_check_sample(const Sample *s, char *err, size_t err_len) {
    long long *results = xmalloc((size_t)(s->n_messages + 1) * sizeof(long long));
    int n_results = synthetic_expected_results(s->messages, s->n_messages, results, s->n_messages);
    int rc = 0;
    if (n_results <= 0) {
        rc = fail(err, err_len, "a question is not a synthetic one");
    }
    // The assistant message after the k-th question must state results[k-1].
    for (int i = 0, asked = 0; rc == 0 && i < s->n_messages; i++) {
        asked += s->messages[i].role == MSG_USER;
        if (s->messages[i].role == MSG_ASSISTANT &&
            !synthetic_check_answer(s->messages[i].content, results[asked - 1])) {
            rc = fail(err, err_len, "messages[%d]: '%s' does not state %lld", i,
                      s->messages[i].content, results[asked - 1]);
        }
    }
    for (int c = 0; rc == 0 && c < s->n_completions; c++) {
        if (!synthetic_check_answer(s->completions[c].content, results[n_results - 1])) {
            rc = fail(err, err_len, "completions[%d]: '%s' does not state %lld", c,
                      s->completions[c].content, results[n_results - 1]);
        }
    }
    free(results);
    return rc;
}
