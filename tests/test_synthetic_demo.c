// gen-data's demo profile (data/synthetic_demo.h): two turns per conversation; turn 1's
// thinking is its code reversed and its answer only acknowledges it; turn 2's thinking is
// empty and its answer is the same reversed code; every digit shows in every place of
// the code; the same bytes for a seed, others for another seed.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "data/synthetic_demo.h"
#include "test_util.h"

static char *generate(uint64_t seed, int n, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    synth_demo_write(f, seed, n);
    fclose(f);
    return buf;
}

static const char *field(json_t *m, const char *key) {
    const char *s = json_string_value(json_object_get(m, key));
    return s ? s : "(missing)";
}

static bool is_code(const char *s) {
    for (int k = 0; k < SYNTH_DEMO_CODE_LEN; k++)
        if (s[k] < '0' || s[k] > '9') return false;
    return true;
}

int main(void) {
    enum { N = 500 };
    size_t len, len2, len3;
    char *text = generate(7, N, &len), *again = generate(7, N, &len2), *other = generate(8, N, &len3);
    EXPECT(len == len2 && memcmp(text, again, len) == 0, "seed 7 twice: the same bytes");
    EXPECT(len != len3 || memcmp(text, other, len) != 0, "seeds 7 and 8: other bytes");

    bool seen[SYNTH_DEMO_CODE_LEN][10] = {{false}};
    int n_lines = 0;
    for (const char *line = text; *line; n_lines++) {
        const char *end = strchr(line, '\n');
        json_error_t e;
        json_t *c = json_loadb(line, (size_t)(end - line), 0, &e);
        EXPECT(c != NULL, "line %d: %s", n_lines + 1, e.text);
        line = end + 1;
        if (!c) continue;
        json_t *msgs = json_object_get(c, "messages");
        EXPECT(json_array_size(msgs) == 4, "line %d: 4 messages", n_lines + 1);
        if (json_array_size(msgs) != 4) {
            json_decref(c);
            continue;
        }
        json_t *u1 = json_array_get(msgs, 0), *a1 = json_array_get(msgs, 1),
               *u2 = json_array_get(msgs, 2), *a2 = json_array_get(msgs, 3);
        EXPECT(!strcmp(field(u1, "role"), "user") && !strcmp(field(a1, "role"), "assistant") &&
                   !strcmp(field(u2, "role"), "user") && !strcmp(field(a2, "role"), "assistant"),
               "line %d: user, assistant, user, assistant", n_lines + 1);
        // Turn 1: "Remember the code DDDD."; its thinking "Reversed: RRRR."; "Noted.".
        const char *ask = field(u1, "content"), *prefix = "Remember the code ";
        const size_t p = strlen(prefix);
        const bool ok_ask = strncmp(ask, prefix, p) == 0 && strlen(ask) == p + SYNTH_DEMO_CODE_LEN + 1 &&
                            is_code(ask + p) && ask[p + SYNTH_DEMO_CODE_LEN] == '.';
        EXPECT(ok_ask, "line %d: turn 1 asks 'Remember the code DDDD.', got '%s'", n_lines + 1, ask);
        if (ok_ask) {
            char want_think[64], want_answer[16], reversed[SYNTH_DEMO_CODE_LEN + 1];
            for (int k = 0; k < SYNTH_DEMO_CODE_LEN; k++) {
                reversed[k] = ask[p + SYNTH_DEMO_CODE_LEN - 1 - k];
                seen[k][ask[p + k] - '0'] = true;
            }
            reversed[SYNTH_DEMO_CODE_LEN] = '\0';
            snprintf(want_think, sizeof want_think, "Reversed: %s.", reversed);
            snprintf(want_answer, sizeof want_answer, "%s.", reversed);
            EXPECT(!strcmp(field(a1, "reasoning_content"), want_think),
                   "line %d: turn 1 thinks '%s', got '%s'", n_lines + 1, want_think,
                   field(a1, "reasoning_content"));
            EXPECT(!strcmp(field(a2, "content"), want_answer),
                   "line %d: turn 2 answers '%s', got '%s'", n_lines + 1, want_answer,
                   field(a2, "content"));
        }
        EXPECT(!strcmp(field(a1, "content"), "Noted."), "line %d: turn 1 answers 'Noted.'", n_lines + 1);
        EXPECT(!strcmp(field(u2, "content"), "Say the code reversed."), "line %d: turn 2's question",
               n_lines + 1);
        EXPECT(!strcmp(field(a2, "reasoning_content"), ""), "line %d: turn 2's thinking is empty, got '%s'",
               n_lines + 1, field(a2, "reasoning_content"));
        json_decref(c);
    }
    EXPECT(n_lines == N, "%d lines, want %d", n_lines, N);
    for (int k = 0; k < SYNTH_DEMO_CODE_LEN; k++)
        for (int d = 0; d < 10; d++) EXPECT(seen[k][d], "digit %d never in place %d of the code", d, k);
    free(text);
    free(again);
    free(other);
    return test_finish();
}
