// Packing of random documents against a naive first-fit-decreasing oracle and the
// invariants of data/pack.h (no split, contents intact, offsets, padding, errors).
#include <stdlib.h>
#include <string.h>

#include "data/pack.h"
#include "tests/test_util.h"

// A random document of n tokens; lo = own index, hi anywhere in (own index, n].
static Doc random_doc(TestRng *rng, int n, int line) {
    Doc d = {0};
    d.n = n;
    d.line = line;
    doc_reserve(&d, n);
    for (int i = 0; i < n; i++) {
        d.token[i] = test_rng_int(rng, 1, 1000);
        d.target[i] = test_rng_int(rng, -1, 1000);
        d.pos[i] = test_rng_int(rng, 0, 5000);
        d.lo[i] = i;
        d.hi[i] = test_rng_int(rng, i + 1, n);
        d.turn[i] = test_rng_int(rng, 0, 7);
        d.role[i] = test_rng_int(rng, 0, 3);
    }
    return d;
}

// Naive first-fit-decreasing: scan rows left to right for each document, longest
// first, ties in document order. Fills row/offset per document (-1: not packed).
static int naive_ffd(const DocList *docs, int seq_len, int *row, int *offset) {
    int *used = calloc((size_t)docs->n_docs + 1, sizeof(int));
    int n_rows = 0;
    for (int i = 0; i < docs->n_docs; i++) row[i] = offset[i] = -1;
    for (int length = seq_len; length >= 1; length--)
        for (int i = 0; i < docs->n_docs; i++) {
            if (docs->docs[i].n != length) continue;
            int r = 0;
            while (r < n_rows && used[r] + length > seq_len) r++;
            if (r == n_rows) n_rows++;
            row[i] = r;
            offset[i] = used[r];
            used[r] += length;
        }
    free(used);
    return n_rows;
}

// Checks every invariant of rows packed from docs; row_of/offset_of (or NULL) are
// where each document is expected.
static void check_rows(const DocList *docs, const PackedRows *rows, int seq_len,
                       const int *row_of, const int *offset_of) {
    EXPECT(rows->seq_len == seq_len, "seq_len %d", rows->seq_len);
    int *seen = calloc((size_t)docs->n_docs, sizeof(int));
    for (int r = 0; r < rows->n_rows; r++) {
        const int32_t *doc = rows->doc + (size_t)r * seq_len;
        const int32_t *lo = rows->lo + (size_t)r * seq_len, *hi = rows->hi + (size_t)r * seq_len;
        int used = 0;
        for (int q = 0; q < seq_len;) {
            if (doc[q] == -1) {
                size_t slot = (size_t)r * seq_len + q;
                EXPECT(lo[q] == q && hi[q] == q && rows->target[slot] == -1 &&
                          rows->token[slot] == 0 && rows->turn[slot] == -1 && rows->role[slot] == -1,
                      "padding slot %d of row %d", q, r);
                for (int k = 0; k < seq_len; k++)
                    if (lo[k] <= q && q < hi[k]) {
                        EXPECT(0, "padding query %d of row %d sees key %d", q, r, k);
                        break;
                    }
                q++;
                continue;
            }
            int d = doc[q];
            EXPECT(d >= 0 && d < docs->n_docs, "doc index %d", d);
            if (d < 0 || d >= docs->n_docs) break;
            const Doc *src = &docs->docs[d];
            seen[d]++;
            used += src->n;
            if (row_of) EXPECT(row_of[d] == r && offset_of[d] == q,
                              "doc %d at row %d offset %d, oracle row %d offset %d", d, r, q,
                              row_of[d], offset_of[d]);
            EXPECT(q + src->n <= seq_len, "doc %d runs past the row", d);
            for (int i = 0; i < src->n && q + i < seq_len; i++) {
                size_t slot = (size_t)r * seq_len + q + i;
                EXPECT(rows->doc[slot] == d && rows->token[slot] == src->token[i] &&
                          rows->target[slot] == src->target[i] && rows->pos[slot] == src->pos[i] &&
                          rows->turn[slot] == src->turn[i] && rows->role[slot] == src->role[i],
                      "doc %d token %d intact", d, i);
                EXPECT(rows->lo[slot] == src->lo[i] + q && rows->hi[slot] == src->hi[i] + q,
                      "doc %d token %d: lo/hi offset by %d", d, i, q);
            }
            q += src->n;
        }
        EXPECT(used > 0, "row %d is empty", r);
    }
    for (int d = 0; d < docs->n_docs; d++) {
        bool fits = docs->docs[d].n <= seq_len;
        EXPECT(seen[d] == (fits ? 1 : 0), "doc %d (n %d) appears %d times", d, docs->docs[d].n, seen[d]);
    }
    free(seen);
}

static void test_random(TestRng *rng, int round) {
    int seq_len = test_rng_int(rng, 8, 96);
    int n_docs = test_rng_int(rng, 1, 60);
    DocList docs = {0};
    docs.docs = calloc((size_t)n_docs, sizeof(Doc));
    docs.cap = n_docs;
    int n_too_long = 0, first_too_long_line = -1;
    for (int i = 0; i < n_docs; i++) {
        // Mostly short documents, some exactly seq_len, a few too long.
        int kind = test_rng_int(rng, 0, 19);
        int n = kind == 0 ? seq_len + test_rng_int(rng, 1, 10)
                : kind == 1 ? seq_len
                            : test_rng_int(rng, 1, seq_len / 2 + 1);
        docs.docs[docs.n_docs++] = random_doc(rng, n, 100 + i);
        if (n > seq_len && n_too_long++ == 0) first_too_long_line = 100 + i;
    }

    PackedRows rows;
    int skipped;
    char err[512] = "";
    if (n_too_long > 0) {
        EXPECT(pack_docs(&docs, seq_len, (PackOptions){false, false}, &rows, &skipped, err, sizeof err) == -1,
              "round %d: a too-long document is an error", round);
        EXPECT(strstr(err, "does not fit seq_len") != NULL, "round %d: %s", round, err);
        // The message is location-free; callers name the line of first_doc_too_long's document.
        int refused = first_doc_too_long(&docs, seq_len);
        EXPECT(refused >= 0 && docs.docs[refused].line == first_too_long_line,
              "round %d: the refused document is on line %d, want %d", round,
              refused >= 0 ? docs.docs[refused].line : -1, first_too_long_line);
    }

    int *row_of = malloc((size_t)n_docs * sizeof(int)), *offset_of = malloc((size_t)n_docs * sizeof(int));
    int oracle_rows = naive_ffd(&docs, seq_len, row_of, offset_of);
    EXPECT(pack_docs(&docs, seq_len, (PackOptions){false, true}, &rows, &skipped, err, sizeof err) == 0,
          "round %d: %s", round, err);
    EXPECT(skipped == n_too_long, "round %d: skipped %d, want %d", round, skipped, n_too_long);
    EXPECT(rows.n_rows == oracle_rows, "round %d: %d rows, naive FFD %d", round, rows.n_rows, oracle_rows);
    check_rows(&docs, &rows, seq_len, row_of, offset_of);

    // Deterministic: the same input packs to the same bytes.
    PackedRows again;
    pack_docs(&docs, seq_len, (PackOptions){false, true}, &again, &skipped, err, sizeof err);
    EXPECT(again.n_rows == rows.n_rows &&
              memcmp(again.token, rows.token, (size_t)rows.n_rows * seq_len * sizeof(int32_t)) == 0 &&
              memcmp(again.doc, rows.doc, (size_t)rows.n_rows * seq_len * sizeof(int32_t)) == 0,
          "round %d: deterministic", round);
    packed_rows_free(&again);
    packed_rows_free(&rows);

    // Unpacked: one document per row, in document order, at offset 0.
    int next_row = 0;
    for (int d = 0; d < n_docs; d++) {
        bool fits = docs.docs[d].n <= seq_len;
        row_of[d] = fits ? next_row++ : -1;
        offset_of[d] = fits ? 0 : -1;
    }
    EXPECT(pack_docs(&docs, seq_len, (PackOptions){true, true}, &rows, &skipped, err, sizeof err) == 0,
          "round %d unpacked: %s", round, err);
    EXPECT(rows.n_rows == next_row, "round %d unpacked: %d rows, want %d", round, rows.n_rows, next_row);
    check_rows(&docs, &rows, seq_len, row_of, offset_of);
    packed_rows_free(&rows);

    free(row_of);
    free(offset_of);
    doc_list_free(&docs);
}

// A hand-sized case, seq_len 8, lengths 2 5 1 4 3 (docs 0-4). Longest first:
// 5 → row 0, 4 → row 1, 3 → row 0 (full), 2 → row 1, 1 → row 1 (7 of 8).
static void test_hand_case(TestRng *rng) {
    DocList docs = {0};
    int lengths[] = {2, 5, 1, 4, 3};
    docs.docs = calloc(5, sizeof(Doc));
    docs.cap = 5;
    for (int i = 0; i < 5; i++) docs.docs[docs.n_docs++] = random_doc(rng, lengths[i], i + 1);
    PackedRows rows;
    int skipped;
    char err[256];
    EXPECT(pack_docs(&docs, 8, (PackOptions){false, false}, &rows, &skipped, err, sizeof err) == 0, "%s", err);
    int32_t want_doc[2][8] = {{1, 1, 1, 1, 1, 4, 4, 4}, {3, 3, 3, 3, 0, 0, 2, -1}};
    EXPECT(rows.n_rows == 2, "2 rows, got %d", rows.n_rows);
    for (int r = 0; r < 2 && rows.n_rows == 2; r++)
        for (int q = 0; q < 8; q++)
            EXPECT(rows.doc[r * 8 + q] == want_doc[r][q], "row %d slot %d: doc %d, want %d", r, q,
                  rows.doc[r * 8 + q], want_doc[r][q]);
    packed_rows_free(&rows);
    doc_list_free(&docs);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_hand_case(&rng);
    for (int round = 0; round < 200; round++) test_random(&rng, round);
    return test_finish();
}
