// Packing documents into rows of seq_len (first-fit-decreasing; a document is never split).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "data/layout.h"

// Rows of the packed batch. lo/hi are in row slots. Padding slots: token 0,
// target -1, pos 0, lo = hi = slot (visible to nobody), doc/turn/role -1.
typedef struct {
    int n_rows, seq_len;
    int32_t *token;   // [n_rows, seq_len]
    int32_t *target;  // [n_rows, seq_len]
    int32_t *pos;     // [n_rows, seq_len]
    int32_t *lo;      // [n_rows, seq_len]
    int32_t *hi;      // [n_rows, seq_len]
    int32_t *doc;     // [n_rows, seq_len] index into the DocList, -1 = padding
    int32_t *turn;    // [n_rows, seq_len]
    int32_t *role;    // [n_rows, seq_len]
} PackedRows;

typedef struct {
    bool unpacked;       // one document per row (npass "unpacked" training)
    bool skip_too_long;  // skip documents longer than seq_len (counted) instead of failing
} PackOptions;

// Returns 0; or -1 with a message naming the sample's line when a document does not
// fit and skip_too_long is off. n_skipped counts skipped documents.
int pack_docs(const DocList *docs, int seq_len, PackOptions opt, PackedRows *out,
              int *n_skipped, char *err, size_t err_len);
void packed_rows_free(PackedRows *rows);
