// The CPU demonstration task (data/synthetic_demo.h).
#include "data/synthetic_demo.h"

#include <jansson.h>

#include "common/check.h"

static json_t *message(const char *role, const char *content, const char *reasoning) {
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    if (reasoning) json_object_set_new(m, "reasoning_content", json_string(reasoning));
    return m;
}

void synth_demo_write(FILE *f, uint64_t seed, int n) {
    uint64_t state = seed;
    for (int i = 0; i < n; i++) {
        char code[SYNTH_DEMO_CODE_LEN + 1], reversed[SYNTH_DEMO_CODE_LEN + 1];
        for (int k = 0; k < SYNTH_DEMO_CODE_LEN; k++) code[k] = (char)('0' + splitmix64(&state) % 10);
        for (int k = 0; k < SYNTH_DEMO_CODE_LEN; k++) reversed[k] = code[SYNTH_DEMO_CODE_LEN - 1 - k];
        code[SYNTH_DEMO_CODE_LEN] = reversed[SYNTH_DEMO_CODE_LEN] = '\0';
        char ask[64], think[64], answer[64];
        snprintf(ask, sizeof ask, "Remember the code %s.", code);
        snprintf(think, sizeof think, "Reversed: %s.", reversed);
        snprintf(answer, sizeof answer, "%s.", reversed);
        json_t *msgs = json_array();
        json_array_append_new(msgs, message("user", ask, NULL));
        json_array_append_new(msgs, message("assistant", "Noted.", think));
        json_array_append_new(msgs, message("user", "Say the code reversed.", NULL));
        json_array_append_new(msgs, message("assistant", answer, ""));
        json_t *c = json_pack("{s:o}", "messages", msgs);
        char *line = json_dumps(c, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fprintf(f, "%s\n", line);
        free(line);
        json_decref(c);
    }
}
