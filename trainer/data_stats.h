// Statistics of a dataset under a layout: how many tokens the layout spends against
// the npass reference, how well rows pack, and how sparse their attention tiles are.
#pragma once
#include <stdbool.h>
#include <stdio.h>
#include "data/layout.h"
#include "data/pack.h"

typedef struct {
    LayoutKind layout;
    int n_samples, n_turns;
    int n_docs, n_rows, seq_len;
    long long layout_tokens, layout_trained;  // over all documents of the layout
    int longest_doc;                          // tokens; must fit seq_len unless skipped
    int longest_line;                         // the source line of the longest document's
                                              // conversation (0: no document)
    long long npass_tokens, npass_trained;    // the same samples under npass
    long long real_slots;                     // non-padding slots of the packed rows
    int tile;                                 // tile size (tile x tile) for the sparsity count
    long long tiles_empty, tiles_partial, tiles_full;
    int n_skipped_bad;       // lines or samples skipped under skip_bad
    int n_skipped_too_long;  // samples skipped under skip_too_long
    bool keep_thinking;      // data.history_thinking "keep": set by the caller
} DatasetStats;

// Counts everything above. `samples` are the tokenized samples that `docs` were laid
// out from (the npass figures are recomputed from them, under the same loss options);
// `rows` are the packed docs.
void stats_compute(const TokenizedSample *samples, int n_samples, LayoutKind layout,
                   const LossOptions *loss, const DocList *docs, const PackedRows *rows, int tile, DatasetStats *out);
void stats_print(const DatasetStats *s, FILE *f);
