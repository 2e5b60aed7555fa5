// Packing documents into rows of seq_len (first-fit-decreasing; a document is never split).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "data/layout.h"
#include "data/token_columns.h"

// Rows of the packed batch. lo/hi are in row slots. Padding slots hold each column's
// padding value (data/token_columns.h): token 0, target -1, pos 0, lo = hi = slot
// (visible to nobody), doc/turn/role -1.
typedef struct {
    int n_rows, seq_len;
    TOKEN_COLUMNS(ROW_COLUMN_MEMBER)  // [n_rows, seq_len] each: token, target, pos, lo, hi, doc, turn, role
} PackedRows;

typedef struct {
    bool unpacked;       // one document per row (npass "unpacked" training)
    bool skip_too_long;  // skip documents longer than seq_len (counted) instead of failing
} PackOptions;

// Packs docs into rows of seq_len (> 0). Returns 0; or, when a document does not fit and
// skip_too_long is off, -1 with a location-free message (the document is
// first_doc_too_long's, whose line the caller names). n_skipped counts skipped documents.
int pack_docs(const DocList *docs, int seq_len, PackOptions opt, PackedRows *out,
              int *n_skipped, char *err, size_t err_len);
// Index of the first document longer than seq_len, or -1.
int first_doc_too_long(const DocList *docs, int seq_len);
void packed_rows_free(PackedRows *rows);

// Copies the model-input columns of src (token, target, pos, lo, hi) one after the other
// into buffer ([N_MODEL_INPUT_COLUMNS, n_rows, seq_len]) and makes dst the rows of those
// copies, its other columns NULL. Returns the end of what was written.
int32_t *packed_rows_copy_inputs(const PackedRows *src, PackedRows *dst, int32_t *buffer);
