#include "data/visibility.h"

#include <stdbool.h>
#include <stdlib.h>

#include "common/check.h"

// Where a token sits in its (doc, turn), read from the tags in order: the turn's first
// prompt, then the loss copy (from its first think or answer token), then the history
// copy (from its first history token); DESIGN.md §3, §8.
enum { COPY_FIRST_PROMPT = 0, COPY_LOSS = 1, COPY_HISTORY = 2 };

// Strip-thinking visibility of key k to query q (same document, k <= q), shared by
// mask_only and duplicate. k_has_history: k's (doc, turn) has a history copy.
static bool strip_thinking_visible(int32_t turn_q, int copy_q, int32_t turn_k, int32_t role_k,
                                   int copy_k, bool k_has_history) {
    if (copy_k == COPY_LOSS && k_has_history) return turn_q == turn_k && copy_q != COPY_HISTORY;
    if (role_k == ROLE_THINK) return turn_q == turn_k;
    return true;
}

void layout_visibility_from_tags(LayoutKind layout, const int32_t *doc, const int32_t *turn,
                                 const int32_t *role, int seq_len, uint8_t *mask) {
    size_t n = (size_t)seq_len;
    // has_history[k]: some token of k's (doc, turn) is a history copy.
    bool *has_history = xcalloc(n, sizeof(bool));  // [seq_len]
    int *copy = xcalloc(n, sizeof(int));            // [seq_len]
    for (size_t j = 0; j < n; j++) {
        if (doc[j] == -1 || role[j] != ROLE_ANSWER_HISTORY) continue;
        for (size_t k = 0; k < n; k++)
            if (doc[k] == doc[j] && turn[k] == turn[j]) has_history[k] = true;
    }
    for (size_t k = 0, state = 0; k < n; k++) {  // a (doc, turn) is contiguous in a row
        if (k == 0 || doc[k] != doc[k - 1] || turn[k] != turn[k - 1]) state = COPY_FIRST_PROMPT;
        if (role[k] == ROLE_ANSWER_HISTORY) state = COPY_HISTORY;
        else if ((role[k] == ROLE_THINK || role[k] == ROLE_ANSWER) && state == COPY_FIRST_PROMPT)
            state = COPY_LOSS;
        copy[k] = (int)state;
    }
    for (size_t q = 0; q < n; q++) {
        for (size_t k = 0; k < n; k++) {
            bool visible = doc[k] != -1 && doc[k] == doc[q] && k <= q;
            if (visible) {
                switch (layout) {
                case LAYOUT_NPASS:
                case LAYOUT_AS_RENDERED:
                case LAYOUT_PRESERVE: break;  // causal within the document
                case LAYOUT_SHARED_PREFIX: visible = turn[k] == 0 || turn[k] == turn[q]; break;
                case LAYOUT_MASK_ONLY:
                case LAYOUT_DUPLICATE:
                    visible = strip_thinking_visible(turn[q], copy[q], turn[k], role[k], copy[k],
                                                     has_history[k]);
                    break;
                default: CHECK(false, "unknown layout %d", (int)layout);
                }
            }
            mask[q * n + k] = visible;
        }
    }
    free(copy);
    free(has_history);
}
