#include "data/visibility.h"

#include <stdbool.h>
#include <stdlib.h>

#include "common/check.h"

// Strip-thinking visibility of key k to query q (same document, k <= q), shared by
// mask_only and duplicate. answer_has_history: k's (doc, turn) has a history copy aB.
static bool strip_thinking_visible(int32_t turn_q, int32_t role_q, int32_t turn_k, int32_t role_k,
                                   bool answer_has_history) {
    bool later_turn_or_history = turn_k < turn_q || role_q == ROLE_ANSWER_HISTORY;
    if (role_k == ROLE_THINK) return !later_turn_or_history;
    if (role_k == ROLE_ANSWER && answer_has_history) return !later_turn_or_history;
    if (role_k == ROLE_ANSWER_HISTORY)
        return turn_q > turn_k || (role_q == ROLE_ANSWER_HISTORY && turn_q == turn_k);
    return true;
}

void layout_visibility_from_tags(LayoutKind layout, const int32_t *doc, const int32_t *turn,
                                 const int32_t *role, int seq_len, uint8_t *mask) {
    size_t n = (size_t)seq_len;
    // has_history[k]: some token of k's (doc, turn) is an answer history copy.
    bool *has_history = xcalloc(n, sizeof(bool));  // [seq_len]
    for (size_t j = 0; j < n; j++) {
        if (doc[j] == -1 || role[j] != ROLE_ANSWER_HISTORY) continue;
        for (size_t k = 0; k < n; k++)
            if (doc[k] == doc[j] && turn[k] == turn[j]) has_history[k] = true;
    }
    for (size_t q = 0; q < n; q++) {
        for (size_t k = 0; k < n; k++) {
            bool visible = doc[k] != -1 && doc[k] == doc[q] && k <= q;
            if (visible) {
                switch (layout) {
                case LAYOUT_NPASS: break;
                case LAYOUT_SHARED_PREFIX: visible = turn[k] == 0 || turn[k] == turn[q]; break;
                case LAYOUT_MASK_ONLY:
                case LAYOUT_DUPLICATE:
                    visible = strip_thinking_visible(turn[q], role[q], turn[k], role[k],
                                                     has_history[k]);
                    break;
                default: CHECK(false, "unknown layout %d", (int)layout);
                }
            }
            mask[q * n + k] = visible;
        }
    }
    free(has_history);
}
