// The layouts' intervals (data/layout.c, packed by data/pack.c) against the tag
// oracle layout_visibility_from_tags, for every layout on random conversations and
// shared-prefix sets and on the shipped synthetic data; plus the worked example of
// DESIGN.md §3 against its table. tests/mutation.cmake builds this file once more against
// an off-by-one copy of the oracle (causal `k < q`) and expects it to fail.
#include <stdlib.h>
#include <string.h>
#include "common/check.h"
#include "data/batch.h"
#include "data/layout.h"
#include "data/pack.h"
#include "data/visibility.h"
#include "tests/test_util.h"

static TokenSpan random_span(TestRng *rng, int n) {
    TokenSpan s = {xmalloc((size_t)(n ? n : 1) * sizeof(int32_t)), n};
    for (int i = 0; i < n; i++) s.ids[i] = test_rng_int(rng, 3, 999);
    return s;
}

// A conversation of 1-8 turns (or a shared-prefix set of 1-5 completions) with random
// segment lengths; some turns, or whole samples, have no reasoning.
static TokenizedSample random_sample(TestRng *rng, SampleKind kind, int line) {
    TokenizedSample s = {.kind = kind, .line = line};
    s.n_turns = kind == SAMPLE_CONVERSATION ? test_rng_int(rng, 1, 8) : test_rng_int(rng, 1, 5);
    s.turns = xcalloc((size_t)s.n_turns, sizeof(TurnTokens));
    int reasoning = test_rng_int(rng, 0, 3);  // 0: no turn has reasoning
    // data.history_thinking "keep" one time in six: every reply continues the one before.
    const bool keep = kind == SAMPLE_CONVERSATION && test_rng_int(rng, 0, 5) == 0;
    if (kind == SAMPLE_SHARED_PREFIX) s.prefix = random_span(rng, test_rng_int(rng, 1, 8));
    for (int t = 0; t < s.n_turns; t++) {
        TurnTokens *turn = &s.turns[t];
        turn->prompt = random_span(rng, kind == SAMPLE_CONVERSATION ? test_rng_int(rng, 1, 6) : 0);
        bool thinks = reasoning > 0 && test_rng_int(rng, 0, 3) < 3;
        turn->think = random_span(rng, thinks ? test_rng_int(rng, 1, 7) : 0);
        turn->answer = random_span(rng, test_rng_int(rng, 1, 5));
        // A reply after tool results continues its user turn (DESIGN.md §8).
        turn->continues = kind == SAMPLE_CONVERSATION && t > 0 && (keep || test_rng_int(rng, 0, 3) == 0);
    }
    return s;
}

static bool layout_applies(LayoutKind layout, SampleKind kind) {
    if (layout == LAYOUT_NPASS) return true;
    return (layout == LAYOUT_SHARED_PREFIX) == (kind == SAMPLE_SHARED_PREFIX);
}

// Interval mask of every packed row equals the tag oracle; returns mismatching pairs.
static long compare_rows(LayoutKind layout, const PackedRows *rows) {
    size_t S = (size_t)rows->seq_len;
    uint8_t *oracle = xmalloc(S * S);  // [seq_len, seq_len]
    long mismatches = 0;
    for (int r = 0; r < rows->n_rows; r++) {
        size_t at = (size_t)r * S;
        layout_visibility_from_tags(layout, rows->doc + at, rows->turn + at, rows->role + at,
                                    (int)S, oracle);
        for (size_t q = 0; q < S; q++)
            for (size_t k = 0; k < S; k++) {
                bool interval = rows->lo[at + k] <= (int32_t)q && (int32_t)q < rows->hi[at + k];
                if (interval != oracle[q * S + k]) {
                    if (mismatches < 5)
                        fprintf(stderr, "  %s row %d q %zu k %zu: interval %d oracle %d "
                                "(k: doc %d turn %d role %d; q: doc %d turn %d role %d)\n",
                                layout_name(layout), r, q, k, interval, oracle[q * S + k],
                                rows->doc[at + k], rows->turn[at + k], rows->role[at + k],
                                rows->doc[at + q], rows->turn[at + q], rows->role[at + q]);
                    mismatches++;
                }
            }
    }
    free(oracle);
    return mismatches;
}

static void test_random_samples(TestRng *rng) {
    char err[256];
    for (int trial = 0; trial < 150; trial++) {
        int n_samples = test_rng_int(rng, 1, 5);
        TokenizedSample samples[5];
        for (int i = 0; i < n_samples; i++)
            samples[i] = random_sample(rng, test_rng_int(rng, 0, 2) ? SAMPLE_CONVERSATION
                                                                    : SAMPLE_SHARED_PREFIX, i + 1);
        for (int layout = 0; layout <= LAYOUT_PRESERVE; layout++) {
            DocList docs = {0};
            for (int i = 0; i < n_samples; i++) {
                int rc = layout_sample((LayoutKind)layout, NULL, &samples[i], i, &docs, err, sizeof err);
                bool applies = layout_applies((LayoutKind)layout, samples[i].kind);
                EXPECT(rc == (applies ? 0 : -1), "%s on sample kind %d: rc %d (%s)",
                      layout_name((LayoutKind)layout), samples[i].kind, rc, rc ? err : "");
            }
            if (docs.n_docs == 0) continue;
            int longest = 0;
            for (int d = 0; d < docs.n_docs; d++) longest = docs.docs[d].n > longest ? docs.docs[d].n : longest;
            PackOptions opt = {.unpacked = test_rng_int(rng, 0, 4) == 0};
            PackedRows rows;
            int n_skipped;
            int rc = pack_docs(&docs, longest + test_rng_int(rng, 0, 40), opt, &rows, &n_skipped, err, sizeof err);
            EXPECT(rc == 0, "pack_docs: %s", err);
            if (rc == 0) {
                long mismatches = compare_rows((LayoutKind)layout, &rows);
                EXPECT(mismatches == 0, "trial %d %s: %ld (q, k) pairs where intervals and tags disagree",
                      trial, layout_name((LayoutKind)layout), mismatches);
                packed_rows_free(&rows);
            }
            doc_list_free(&docs);
        }
        for (int i = 0; i < n_samples; i++) tokenized_sample_free(&samples[i]);
    }
}

// DESIGN.md §3 worked example (duplicate, two turns): positions and hi from the table,
// and the oracle reproduces the table's intervals.
static void test_worked_example(TestRng *rng) {
    static const int lengths[2][3] = {{3, 4, 2}, {3, 3, 2}};  // |p|, |th|, |a| per turn
    static const int32_t want_pos[19] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    static const int32_t want_hi[19] = {19, 19, 19, 9, 9, 9, 9, 9, 9, 19, 19, 19, 19, 19, 19, 19, 19, 19, 19};
    TokenizedSample s = {.kind = SAMPLE_CONVERSATION, .n_turns = 2, .line = 1};
    s.turns = xcalloc(2, sizeof(TurnTokens));
    for (int t = 0; t < 2; t++) {
        s.turns[t].prompt = random_span(rng, lengths[t][0]);
        s.turns[t].think = random_span(rng, lengths[t][1]);
        s.turns[t].answer = random_span(rng, lengths[t][2]);
    }
    DocList docs = {0};
    char err[256];
    int rc = layout_sample(LAYOUT_DUPLICATE, NULL, &s, 0, &docs, err, sizeof err);
    EXPECT(rc == 0 && docs.n_docs == 1 && docs.docs[0].n == 19, "worked example layout: rc %d %s", rc,
          rc ? err : "");
    if (rc == 0 && docs.n_docs == 1 && docs.docs[0].n == 19) {
        const Doc *d = &docs.docs[0];
        int32_t doc_tags[19];
        uint8_t oracle[19 * 19];
        int bad = 0;
        for (int k = 0; k < 19; k++) {
            bad += d->pos[k] != want_pos[k] || d->lo[k] != k || d->hi[k] != want_hi[k];
            doc_tags[k] = 0;
        }
        EXPECT(bad == 0, "worked example: %d tokens with pos/lo/hi not as in DESIGN.md", bad);
        layout_visibility_from_tags(LAYOUT_DUPLICATE, doc_tags, d->turn, d->role, 19, oracle);
        bad = 0;
        for (int q = 0; q < 19; q++)
            for (int k = 0; k < 19; k++) bad += oracle[q * 19 + k] != (k <= q && q < want_hi[k]);
        EXPECT(bad == 0, "worked example: oracle disagrees with the table on %d pairs", bad);
    }
    doc_list_free(&docs);
    tokenized_sample_free(&s);
}

// The shipped data through the tokenizer and the loader, every layout that applies.
static void test_shipped_data(void) {
    char err[512];
    Tokenizer *tok = tokenizer_load("datasets/synthetic/tokenizer.model", err, sizeof err);
    if (!tok) {
        printf("skipping the shipped-data check: %s\n", err);
        return;
    }
    const struct {
        const char *path;
        LayoutKind layouts[5];
        int n_layouts;
    } cases[] = {{"datasets/synthetic/train.jsonl",
                  {LAYOUT_NPASS, LAYOUT_MASK_ONLY, LAYOUT_DUPLICATE, LAYOUT_AS_RENDERED, LAYOUT_PRESERVE}, 5},
                 {"datasets/synthetic/shared_prefix.jsonl", {LAYOUT_NPASS, LAYOUT_SHARED_PREFIX}, 2}};
    for (int c = 0; c < 2; c++)
        for (int l = 0; l < cases[c].n_layouts; l++) {
            DataOptions opt = {.layout = cases[c].layouts[l], .seq_len = 1024, .max_samples = 8};
            PackedDataset data;
            packed_dataset_load(tok, cases[c].path, opt, &data);
            long mismatches = compare_rows(opt.layout, &data.rows);
            EXPECT(mismatches == 0, "%s, %s: %ld (q, k) pairs where intervals and tags disagree",
                   cases[c].path, layout_name(opt.layout), mismatches);
            packed_dataset_free(&data);
        }
    tokenizer_free(tok);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_worked_example(&rng);
    test_random_samples(&rng);
    test_shipped_data();
    return test_finish();
}
