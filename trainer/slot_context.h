// What a packed row computes against what the N-pass views compute (`train show`'s
// comparison with npass). A slot's context is, recursively, its (token, position) and
// the multiset of the contexts of the keys it sees (the definition of
// tests/test_exactness.c), hashed; a layout is exact where its trained slots have the
// contexts of their own inference views.
#pragma once
#include <stdint.h>
#include "data/layout.h"
#include "data/pack.h"
#include "data/tokenize.h"

// Classes of a (query, key) pair of a row.
typedef enum {
    PAIR_HIDDEN = 0,   // k not visible to q
    PAIR_SAME = 1,     // visible, and k holds a context of q's inference view
    PAIR_DIFFERS = 2,  // visible, but k holds a context no slot of q's view has
} PairKind;

typedef struct {
    long long visible, differ;  // visible pairs; those of them that differ
    int trained, trained_differ;  // trained slots; those not exact in their own turn's view
} PairCounts;

// Classifies every pair of row `row` of `rows`, laid out from `docs` (Doc.sample
// indexes `samples`): pairs[q * seq_len + k] (PairKind). A trained q's inference view is
// the npass view of its own turn (one per user turn: the document that trains it), and q is
// inexact unless its context is in it; any other q's is the first npass view (of q's sample,
// from q's turn on) holding q's context, else the first view from q's turn on (the last view
// if none). The pair differs when k's context is not in q's view.
void pair_kinds_against_npass(const TokenizedSample *samples, const DocList *docs,
                              const PackedRows *rows, int row, uint8_t *pairs,
                              PairCounts *counts);
