// The layouts' visibility written as a predicate over the per-token tags (doc, turn, role),
// independent of the lo/hi intervals the layouts emit: the test oracle of DESIGN.md §3-4
// for the intervals and everything built from them.
#pragma once
#include <stdint.h>
#include "data/layout.h"

// mask[q * seq_len + k] = 1 iff key k is visible to query q in one packed row under
// `layout` (doc, turn, role: [seq_len], doc -1 = padding).
void layout_visibility_from_tags(LayoutKind layout, const int32_t *doc, const int32_t *turn,
                                 const int32_t *role, int seq_len, uint8_t *mask);
