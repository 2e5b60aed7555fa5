#include "trainer/slot_context.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

static uint64_t mix(uint64_t x) { return splitmix64(&x); }

// ctx[q] for a causal sequence whose keys' intervals index the same sequence: a hash of
// (token, pos) and of the multiset of visible keys' contexts (a sum of mixed hashes,
// so the keys' order does not count).
static void context_hashes(int n, const int32_t *token, const int32_t *pos, const int32_t *lo,
                           const int32_t *hi, uint64_t *ctx) {
    for (int q = 0; q < n; q++) {
        uint64_t seen = 0;
        for (int k = 0; k < q; k++)
            if (lo[k] <= q && q < hi[k]) seen += mix(ctx[k]);
        ctx[q] = mix(mix(((uint64_t)(uint32_t)token[q] << 32) | (uint32_t)pos[q]) + seen);
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

// The sorted contexts of each npass view of one sample (one per user turn with a target;
// for a shared-prefix set one per completion) and the turn tag of each view's last token
// (its user turn; a completion's index + 1, turn tags counting the prefix as 0).
typedef struct {
    int n_views;
    uint64_t **ctx;  // [n_views][n_ctx[v]], sorted
    int *n_ctx;      // [n_views]
    int *turn;       // [n_views]
} Views;

static Views npass_views(const TokenizedSample *s, int sample_index) {
    DocList docs = {0};
    char err[256];
    if (layout_sample(LAYOUT_NPASS, NULL, s, sample_index, &docs, err, sizeof err) != 0)
        fatal("npass views: %s", err);
    Views v = {.n_views = docs.n_docs};
    v.ctx = xmalloc((size_t)docs.n_docs * sizeof *v.ctx);
    v.n_ctx = xmalloc((size_t)docs.n_docs * sizeof *v.n_ctx);
    v.turn = xmalloc((size_t)docs.n_docs * sizeof *v.turn);
    for (int d = 0; d < docs.n_docs; d++) {
        const Doc *doc = &docs.docs[d];
        v.turn[d] = doc->turn[doc->n - 1];
        v.ctx[d] = xmalloc((size_t)doc->n * sizeof(uint64_t));
        v.n_ctx[d] = doc->n;
        context_hashes(doc->n, doc->token, doc->pos, doc->lo, doc->hi, v.ctx[d]);
        qsort(v.ctx[d], (size_t)doc->n, sizeof(uint64_t), cmp_u64);
    }
    doc_list_free(&docs);
    return v;
}

static void views_free(Views *v) {
    for (int d = 0; d < v->n_views; d++) free(v->ctx[d]);
    free(v->ctx);
    free(v->n_ctx);
    free(v->turn);
}

static bool view_has(const Views *v, int view, uint64_t ctx) {
    return bsearch(&ctx, v->ctx[view], (size_t)v->n_ctx[view], sizeof ctx, cmp_u64) != NULL;
}

// The view of a query of turn `turn` with context ctx (see the header).
static int view_of(const Views *v, int turn, uint64_t ctx) {
    int first = 0;
    while (first < v->n_views && v->turn[first] < turn) first++;
    if (first == v->n_views) first = v->n_views - 1;  // an untrained turn after the last view
    for (int view = first; view < v->n_views; view++)
        if (view_has(v, view, ctx)) return view;
    return first;
}

void pair_kinds_against_npass(const TokenizedSample *samples, const DocList *docs,
                              const PackedRows *rows, int row, uint8_t *pairs,
                              PairCounts *counts) {
    int n = rows->seq_len;
    size_t base = (size_t)row * (size_t)n;
    const int32_t *lo = rows->lo + base, *hi = rows->hi + base, *doc = rows->doc + base;
    uint64_t *ctx = xmalloc((size_t)n * sizeof(uint64_t));  // [seq_len]
    context_hashes(n, rows->token + base, rows->pos + base, lo, hi, ctx);
    memset(pairs, PAIR_HIDDEN, (size_t)n * (size_t)n);
    memset(counts, 0, sizeof *counts);
    Views views = {0};
    int views_doc = -1;  // the document whose sample `views` holds
    for (int q = 0; q < n; q++) {
        if (doc[q] == -1) continue;
        if (doc[q] != views_doc) {
            views_free(&views);
            int s = docs->docs[doc[q]].sample;
            views = npass_views(&samples[s], s);
            views_doc = doc[q];
        }
        // A trained slot belongs to its own turn's view, the one npass trains it in (as_rendered
        // trains an earlier turn's answer inside a later turn's view): its pairs and its
        // exactness are judged there; every other slot in the first view holding it.
        const bool trained = rows->target[base + q] != -1;
        int own = 0;
        while (own < views.n_views && views.turn[own] < rows->turn[base + q]) own++;
        const bool has_own = own < views.n_views && views.turn[own] == rows->turn[base + q];
        int view = trained && has_own ? own : view_of(&views, rows->turn[base + q], ctx[q]);
        for (int k = 0; k <= q; k++) {
            if (!(lo[k] <= q && q < hi[k])) continue;
            bool same = view_has(&views, view, ctx[k]);
            pairs[(size_t)q * n + k] = same ? PAIR_SAME : PAIR_DIFFERS;
            counts->visible++;
            counts->differ += !same;
        }
        if (trained) {
            counts->trained++;
            counts->trained_differ += !(has_own && view_has(&views, own, ctx[q]));
        }
    }
    views_free(&views);
    free(ctx);
}
