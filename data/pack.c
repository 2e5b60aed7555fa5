// First-fit-decreasing packing of documents into rows of seq_len (DESIGN.md §1).
#include "data/pack.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

typedef struct {
    int n, index;
} DocRef;

// Longest first; equal lengths keep document order, so packing is deterministic.
static int by_length_desc(const void *a, const void *b) {
    const DocRef *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

// Max segment tree over the free space of candidate rows, so "the first row with room
// for n" costs O(log rows). Rows not opened yet are free (seq_len), so the leftmost
// fit is exactly first-fit, opening a new row only when no open row has room.
typedef struct {
    int size;      // leaves (power of two >= number of candidate rows)
    int32_t *max;  // [2 * size] free space, 1-based heap layout
} FreeTree;

static void free_tree_init(FreeTree *t, int n_rows, int seq_len) {
    t->size = 1;
    while (t->size < n_rows) t->size *= 2;
    t->max = xmalloc(2 * (size_t)t->size * sizeof(int32_t));
    for (int i = 0; i < t->size; i++) t->max[t->size + i] = i < n_rows ? seq_len : -1;
    for (int i = t->size - 1; i >= 1; i--)
        t->max[i] = t->max[2 * i] > t->max[2 * i + 1] ? t->max[2 * i] : t->max[2 * i + 1];
}

// Takes n slots from the leftmost row with at least n free; returns the row.
static int free_tree_take(FreeTree *t, int n) {
    int node = 1;
    while (node < t->size) node = t->max[2 * node] >= n ? 2 * node : 2 * node + 1;
    int row = node - t->size;
    t->max[node] -= n;
    for (node /= 2; node >= 1; node /= 2)
        t->max[node] = t->max[2 * node] > t->max[2 * node + 1] ? t->max[2 * node] : t->max[2 * node + 1];
    return row;
}

// A column of n slots, all padding; OWN_SLOT padding is the slot's index in its row.
static int32_t *padded_column(size_t n, int seq_len, int32_t padding) {
    int32_t *values = xmalloc(n * sizeof(int32_t));  // [n_rows, seq_len]
    for (size_t slot = 0; slot < n; slot++)
        values[slot] = padding == OWN_SLOT ? (int32_t)(slot % (size_t)seq_len) : padding;
    return values;
}

static void rows_alloc(PackedRows *out, int n_rows, int seq_len) {
    *out = (PackedRows){.n_rows = n_rows, .seq_len = seq_len};
    size_t n = (size_t)n_rows * (size_t)seq_len;
#define ALLOC_COLUMN(field, json_name, holders, use, padding) \
    out->field = padded_column(n, seq_len, padding);
    TOKEN_COLUMNS(ALLOC_COLUMN)
#undef ALLOC_COLUMN
}

static void copy_shifted(int32_t *dst, const int32_t *src, int n, int32_t shift) {
    for (int i = 0; i < n; i++) dst[i] = src[i] + shift;
}

// Copies document d into `row` at `offset`: its slot indices (lo, hi) move by offset.
static void place_doc(PackedRows *out, const Doc *d, int doc_index, int row, int offset) {
    size_t base = (size_t)row * (size_t)out->seq_len + (size_t)offset;
#define PLACE_COLUMN(field, json_name, holders, use, padding) \
    IF_IN_DOC_##holders(                                        \
        copy_shifted(out->field + base, d->field, d->n, (padding) == OWN_SLOT ? offset : 0);)
    TOKEN_COLUMNS(PLACE_COLUMN)
#undef PLACE_COLUMN
    for (int i = 0; i < d->n; i++) out->doc[base + i] = doc_index;  // the row-only column
}

int first_doc_too_long(const DocList *docs, int seq_len) {
    for (int i = 0; i < docs->n_docs; i++)
        if (docs->docs[i].n > seq_len) return i;
    return -1;
}

int pack_docs(const DocList *docs, int seq_len, PackOptions opt, PackedRows *out,
              int *n_skipped, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    *n_skipped = 0;
    CHECK(seq_len > 0, "seq_len must be positive, got %d", seq_len);
    const int too_long = first_doc_too_long(docs, seq_len);
    if (too_long >= 0 && !opt.skip_too_long)
        return fail(err, err_len,
                    "a document of %d tokens does not fit seq_len %d (raise data.seq_len, or set "
                    "data.skip_too_long to skip it)",
                    docs->docs[too_long].n, seq_len);
    DocRef *order = xmalloc((size_t)(docs->n_docs > 0 ? docs->n_docs : 1) * sizeof(DocRef));
    int n_kept = 0;
    for (int i = 0; i < docs->n_docs; i++) {
        if (docs->docs[i].n > seq_len) {
            (*n_skipped)++;
            continue;
        }
        if (docs->docs[i].n > 0) order[n_kept++] = (DocRef){docs->docs[i].n, i};
    }

    int *row_of = xmalloc((size_t)(n_kept ? n_kept : 1) * sizeof(int));     // [n_kept]
    int *offset_of = xmalloc((size_t)(n_kept ? n_kept : 1) * sizeof(int));  // [n_kept]
    int n_rows = 0;
    if (opt.unpacked) {
        for (int j = 0; j < n_kept; j++) {
            row_of[j] = j;
            offset_of[j] = 0;
        }
        n_rows = n_kept;
    } else {
        qsort(order, (size_t)n_kept, sizeof(DocRef), by_length_desc);
        FreeTree tree;
        free_tree_init(&tree, n_kept, seq_len);
        for (int j = 0; j < n_kept; j++) {
            int n = order[j].n;
            int row = free_tree_take(&tree, n);
            // Free space after taking n; the document starts where the used part ended.
            offset_of[j] = seq_len - tree.max[tree.size + row] - n;
            row_of[j] = row;
            if (row + 1 > n_rows) n_rows = row + 1;
        }
        free(tree.max);
    }

    rows_alloc(out, n_rows, seq_len);
    for (int j = 0; j < n_kept; j++)
        place_doc(out, &docs->docs[order[j].index], order[j].index, row_of[j], offset_of[j]);
    free(order);
    free(row_of);
    free(offset_of);
    return 0;
}

void packed_rows_free(PackedRows *rows) {
#define FREE_COLUMN(field, ...) free(rows->field);
    TOKEN_COLUMNS(FREE_COLUMN)
#undef FREE_COLUMN
    memset(rows, 0, sizeof *rows);
}

int32_t *packed_rows_copy_inputs(const PackedRows *src, PackedRows *dst, int32_t *buffer) {
    const size_t slots = (size_t)src->n_rows * (size_t)src->seq_len;
    *dst = (PackedRows){.n_rows = src->n_rows, .seq_len = src->seq_len};
#define COPY_INPUT(field, json_name, holders, use, ...)                  \
    IF_MODEL_INPUT_##use(dst->field = buffer;                              \
                         memcpy(buffer, src->field, slots * sizeof(int32_t)); \
                         buffer += slots;)
    TOKEN_COLUMNS(COPY_INPUT)
#undef COPY_INPUT
    return buffer;
}
