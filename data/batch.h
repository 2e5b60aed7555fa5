// From a JSONL file to packed rows: parse, tokenize, lay out, pack. Shared by
// `train pack`, training and evaluation so they all see the same rows.
#pragma once
#include <stdbool.h>
#include "data/layout.h"
#include "data/pack.h"
#include "data/tokenizer.h"

typedef struct {
    LayoutKind layout;
    int seq_len;
    bool skip_bad;     // skip (and count) samples that fail to parse, tokenize or lay out
    PackOptions pack;  // unpacked rows; skip documents longer than seq_len
    int max_samples;   // keep only the first max_samples usable samples; 0 = all
    const ChatTemplate *chat_template;  // NULL: onepass
    SpecialInText special_in_text;  // control tokens' strings in text fields
    bool ignore_unknown_keys;       // count unknown JSONL keys instead of refusing the line
    size_t max_line_bytes;          // longer JSONL lines are refused unparsed; 0: no limit
    LossOptions loss;               // which tokens of which turns are trained
} DataOptions;

typedef struct {
    TokenizedSample *samples;  // [n_samples] usable samples, in file order
    int n_samples;
    DocList docs;              // the layout's documents; Doc.sample indexes samples[]
    PackedRows rows;
    int n_skipped_bad;         // lines / samples skipped under skip_bad
    int n_skipped_too_long;    // samples skipped under pack.skip_too_long: a line over
                               // data.max_line_bytes, or a document longer than seq_len
} PackedDataset;

// How dataset_load reads the file under opt (skip_bad, ignore_unknown_keys,
// max_line_bytes, and pack.skip_too_long for lines over it).
LoadOptions data_load_options(const DataOptions *opt);

// Any error is fatal; one about a sample names its "path:line: ". A tokenizer without
// the template's tokens is refused first (template_check_tokenizer).
void packed_dataset_load(const Tokenizer *tok, const char *path, DataOptions opt,
                         PackedDataset *out);
void packed_dataset_free(PackedDataset *d);
