// Model-free exactness of the layouts (DESIGN.md §3), the heart of the method.
//
// A transformer's output at query q is a function of (token[q], pos[q]) and of the
// outputs at the keys it sees (attention is order-free over keys once RoPE has
// put their positions in). So define, recursively,
//   ctx(q) = (token[q], pos[q], multiset { ctx(k) : k != q visible to q by lo/hi })
// and hash it bottom-up. Two trained positions with equal (ctx, target) get equal
// loss and gradient in any model. We pack random conversations under each layout
// (FFD rows, so packing is covered too) and compare against npass.
#include <stdlib.h>
#include <string.h>

#include "data/batch.h"
#include "data/layout.h"
#include "data/pack.h"
#include "tests/test_util.h"

enum { SEQ_LEN = 256, VOCAB = 50 };

static uint64_t mix(uint64_t x) {  // splitmix64 finalizer
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

// One trained position: which sample and turn it belongs to, its rank among that
// turn's trained positions (0 = last prompt token), its context hash and target.
typedef struct {
    int sample, turn, rank;
    long long slot;  // row * seq_len + column, to order a turn's positions
    uint64_t ctx;
    int32_t target;
} Entry;

static int by_sample_turn_slot(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    if (x->sample != y->sample) return x->sample - y->sample;
    if (x->turn != y->turn) return x->turn - y->turn;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

static int by_ctx_target(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    if (x->ctx != y->ctx) return x->ctx > y->ctx ? 1 : -1;
    return x->target - y->target;
}

// Context hashes of every slot of the packed rows; entries for the trained slots,
// sorted by (sample, turn, rank). A trained slot's turn is its user turn (Doc.turn); for
// npass over a shared-prefix set it is the document's index among its sample's documents
// + 1 (the completions are turns 1..n, the trained last prompt token is tagged 0).
static Entry *trained_entries(const PackedRows *rows, const DocList *docs,
                              const TokenizedSample *samples, bool npass, int *n_entries) {
    int *doc_in_sample = malloc((size_t)docs->n_docs * sizeof(int));
    for (int d = 0; d < docs->n_docs; d++)
        doc_in_sample[d] = d > 0 && docs->docs[d - 1].sample == docs->docs[d].sample
                               ? doc_in_sample[d - 1] + 1 : 0;
    int seq_len = rows->seq_len;
    uint64_t *ctx = malloc((size_t)seq_len * sizeof(uint64_t));       // [seq_len] of the current row
    uint64_t *children = malloc((size_t)seq_len * sizeof(uint64_t));  // [seq_len]
    Entry *entries = NULL;
    int n = 0, cap = 0;
    for (int r = 0; r < rows->n_rows; r++) {
        size_t base = (size_t)r * seq_len;
        const int32_t *lo = rows->lo + base, *hi = rows->hi + base;
        for (int q = 0; q < seq_len; q++) {
            int n_children = 0;
            for (int k = 0; k < seq_len; k++) {
                if (k == q || !(lo[k] <= q && q < hi[k])) continue;
                if (k > q) {
                    EXPECT(false, "row %d: query %d sees a later key %d (not causal)", r, q, k);
                    continue;
                }
                children[n_children++] = ctx[k];
            }
            qsort(children, (size_t)n_children, sizeof(uint64_t), cmp_u64);
            uint64_t h = mix(mix((uint64_t)(uint32_t)rows->token[base + q]) ^ (uint64_t)rows->pos[base + q]);
            for (int c = 0; c < n_children; c++) h = mix(h ^ children[c]);
            ctx[q] = h;
            if (rows->target[base + q] == -1) continue;
            int d = rows->doc[base + q];
            int sample = docs->docs[d].sample;
            int turn = npass && samples[sample].kind == SAMPLE_SHARED_PREFIX ? doc_in_sample[d] + 1
                                                                             : rows->turn[base + q];
            Entry e = {sample, turn, 0, (long long)base + q, h, rows->target[base + q]};
            if (n == cap) entries = realloc(entries, (size_t)(cap = 2 * cap + 64) * sizeof(Entry));
            entries[n++] = e;
        }
    }
    qsort(entries, (size_t)n, sizeof(Entry), by_sample_turn_slot);
    for (int i = 0; i < n; i++)
        entries[i].rank = i > 0 && entries[i - 1].sample == entries[i].sample &&
                                  entries[i - 1].turn == entries[i].turn
                              ? entries[i - 1].rank + 1 : 0;
    free(doc_in_sample);
    free(ctx);
    free(children);
    *n_entries = n;
    return entries;
}

typedef struct {
    Entry *e;
    int n;
} EntrySet;

// The entries of one sample: a slice of a sorted entry array.
static EntrySet sample_slice(EntrySet all, int sample) {
    int i = 0;
    while (i < all.n && all.e[i].sample < sample) i++;
    int j = i;
    while (j < all.n && all.e[j].sample == sample) j++;
    return (EntrySet){all.e + i, j - i};
}

// Matched by (turn, rank): same context and target at every trained position.
static bool positions_match(EntrySet a, EntrySet b) {
    if (a.n != b.n) return false;
    for (int i = 0; i < a.n; i++)
        if (a.e[i].turn != b.e[i].turn || a.e[i].rank != b.e[i].rank || a.e[i].ctx != b.e[i].ctx ||
            a.e[i].target != b.e[i].target)
            return false;
    return true;
}

// Counts positions of a whose (ctx, target) has no equal in b.
static int unmatched(EntrySet a, EntrySet b) {
    Entry *sorted = malloc((size_t)(b.n ? b.n : 1) * sizeof(Entry));
    memcpy(sorted, b.e, (size_t)b.n * sizeof(Entry));
    qsort(sorted, (size_t)b.n, sizeof(Entry), by_ctx_target);
    int missing = 0;
    for (int i = 0; i < a.n; i++)
        missing += bsearch(&a.e[i], sorted, (size_t)b.n, sizeof(Entry), by_ctx_target) == NULL;
    free(sorted);
    return missing;
}

// Equal multisets of (ctx, target).
static bool multisets_equal(EntrySet a, EntrySet b) {
    if (a.n != b.n) return false;
    Entry *x = malloc((size_t)(a.n ? a.n : 1) * sizeof(Entry)), *y = malloc((size_t)(b.n ? b.n : 1) * sizeof(Entry));
    memcpy(x, a.e, (size_t)a.n * sizeof(Entry));
    memcpy(y, b.e, (size_t)b.n * sizeof(Entry));
    qsort(x, (size_t)a.n, sizeof(Entry), by_ctx_target);
    qsort(y, (size_t)b.n, sizeof(Entry), by_ctx_target);
    bool equal = true;
    for (int i = 0; i < a.n && equal; i++) equal = x[i].ctx == y[i].ctx && x[i].target == y[i].target;
    free(x);
    free(y);
    return equal;
}

// The entries of one user turn: a slice of a sample's entries (sorted by turn).
static EntrySet turn_slice(EntrySet sample, int turn) {
    int i = 0;
    while (i < sample.n && sample.e[i].turn < turn) i++;
    int j = i;
    while (j < sample.n && sample.e[j].turn == turn) j++;
    return (EntrySet){sample.e + i, j - i};
}

static bool has_history_thinking(const TokenizedSample *s);

// The trainers' one-pass layouts against npass, per user turn. as_rendered renders earlier
// user turns without their reasoning: a turn is exact where it is the last or has no
// reasoning, inexact elsewhere (its answer computed without its thinking). preserve shows
// every turn's reasoning: exact when no later turn sees earlier thinking.
static void check_one_pass_layouts(const TokenizedSample *s, EntrySet ref, EntrySet rendered,
                                   EntrySet preserve, bool options, int round, int index) {
    int n_user_turns = 0;
    for (int t = 0; t < s->n_turns; t++) n_user_turns += !s->turns[t].continues;
    for (int u = 0, t = 0; u < n_user_turns; u++) {
        bool thinks = false;
        do thinks |= s->turns[t].think.n > 0;
        while (++t < s->n_turns && s->turns[t].continues);
        EntrySet got = turn_slice(rendered, u), want = turn_slice(ref, u);
        if (u == n_user_turns - 1 || !thinks)
            EXPECT(positions_match(got, want), "round %d sample %d turn %d: as_rendered differs from "
                   "npass in a turn it renders as inference does", round, index, u);
        else if (!options && want.n > 0)
            // Its thinking is not trained, and every answer position after the first sits at
            // another position than in npass (the first's context is the prompt's in both).
            EXPECT(got.n < want.n && (got.n < 2 || unmatched(got, want) > 0), "round %d sample %d turn %d: as_rendered "
                   "matched npass on a turn whose thinking it strips (%d of %d trained)", round, index,
                   u, got.n, want.n);
    }
    if (!has_history_thinking(s))
        EXPECT(positions_match(preserve, ref), "round %d sample %d: preserve differs from npass "
               "without history thinking", round, index);
    else if (!options)
        EXPECT(preserve.n == ref.n && unmatched(preserve, ref) > 0, "round %d sample %d: preserve "
               "matched npass although a later turn sees earlier thinking", round, index);
}

static TokenSpan random_span(TestRng *rng, int n) {
    TokenSpan s = {malloc((size_t)(n ? n : 1) * sizeof(int32_t)), n};
    for (int i = 0; i < n; i++) s.ids[i] = test_rng_int(rng, 1, VOCAB);
    return s;
}

static TurnTokens random_turn(TestRng *rng, bool with_prompt) {
    TurnTokens t = {0};
    t.prompt = random_span(rng, with_prompt ? test_rng_int(rng, 1, 5) : 0);
    t.think = random_span(rng, test_rng_int(rng, 0, 9) < 3 ? 0 : test_rng_int(rng, 1, 6));
    t.answer = random_span(rng, test_rng_int(rng, 1, 4));
    // Reasoning opens with its own tag, never with the answer's first token, as in every
    // template: otherwise a turn whose thinking repeats its answer's start renders, with
    // the thinking stripped, token for token as npass's pass and as_rendered is exact there.
    if (t.think.n > 0 && t.think.ids[0] == t.answer.ids[0])
        t.think.ids[0] = t.think.ids[0] % VOCAB + 1;
    return t;
}

// A conversation's messages after the first continue the user turn of the one before
// (they answer tool results, DESIGN.md §8) one time in four when `tools`.
static TokenizedSample random_sample(TestRng *rng, SampleKind kind, int line, bool tools) {
    TokenizedSample s = {kind, NULL, test_rng_int(rng, 1, 8), {NULL, 0}, line};
    s.turns = malloc((size_t)s.n_turns * sizeof(TurnTokens));
    for (int t = 0; t < s.n_turns; t++) {
        s.turns[t] = random_turn(rng, kind == SAMPLE_CONVERSATION);
        s.turns[t].continues = tools && t > 0 && test_rng_int(rng, 0, 3) == 0;
    }
    if (kind == SAMPLE_SHARED_PREFIX) s.prefix = random_span(rng, test_rng_int(rng, 1, 12));
    return s;
}

// Lays out and packs every sample; returns its trained entries.
static EntrySet layout_entries(LayoutKind layout, const LossOptions *loss,
                               const TokenizedSample *samples, int n_samples,
                               PackedRows *rows_out, DocList *docs_out) {
    DocList docs = {0};
    char err[256];
    for (int s = 0; s < n_samples; s++) {
        const int first = docs.n_docs;
        EXPECT(layout_sample(layout, loss, &samples[s], s, &docs, err, sizeof err) == 0, "%s: %s",
              layout_name(layout), err);
        // The length check before laying out counts what the layout builds.
        long long longest = 0;
        for (int d = first; d < docs.n_docs; d++)
            if (docs.docs[d].n > longest) longest = docs.docs[d].n;
        EXPECT(layout_longest_doc(layout, loss, &samples[s]) == longest,
               "%s sample %d: layout_longest_doc %lld, built %lld", layout_name(layout), s,
               layout_longest_doc(layout, loss, &samples[s]), longest);
    }
    PackedRows rows;
    int skipped;
    EXPECT(pack_docs(&docs, SEQ_LEN, (PackOptions){false, false}, &rows, &skipped, err, sizeof err) == 0,
          "%s", err);
    EntrySet set;
    set.e = trained_entries(&rows, &docs, samples, layout == LAYOUT_NPASS, &set.n);
    if (rows_out) *rows_out = rows;
    else packed_rows_free(&rows);
    if (docs_out) *docs_out = docs;
    else doc_list_free(&docs);
    return set;
}

// Thinking that a later user turn must not see (a message after it starts a new turn).
static bool has_history_thinking(const TokenizedSample *s) {
    bool thinking = false;
    for (int t = 0; t < s->n_turns; t++) {
        if (thinking && !s->turns[t].continues) return true;
        thinking |= s->turns[t].think.n > 0;
    }
    return false;
}

static bool has_tool_turns(const TokenizedSample *s) {
    for (int t = 0; t < s->n_turns; t++)
        if (s->turns[t].continues) return true;
    return false;
}

static void test_conversations(TestRng *rng, int round) {
    enum { N_SAMPLES = 24 };
    TokenizedSample samples[N_SAMPLES];
    for (int s = 0; s < N_SAMPLES; s++)
        samples[s] = random_sample(rng, SAMPLE_CONVERSATION, s + 1, round % 2 == 1);
    // Rounds 5 and 11 keep every turn's thinking (data.history_thinking "keep": every reply
    // continues the one before): no view strips anything, so every layout is npass's one pass.
    const bool keep = round % 6 == 5;
    for (int s = 0; keep && s < N_SAMPLES; s++)
        for (int t = 1; t < samples[s].n_turns; t++) samples[s].turns[t].continues = true;

    PackedRows npass_rows;
    DocList npass_docs;
    // Every fourth round draws loss options and turns with empty reasoning: the trained
    // positions change, their contexts must still be npass's.
    const bool options = round % 4 == 3;
    LossOptions loss = {0};
    if (options) {
        loss = (LossOptions){test_rng_int(rng, 0, 1) ? TRAIN_ANSWER : TRAIN_THINK_ANSWER, true};
        for (int s = 0; s < N_SAMPLES; s++)
            for (int t = 0; t < samples[s].n_turns; t++)
                samples[s].turns[t].empty_think = test_rng_int(rng, 0, 2) == 0;
    }
    EntrySet npass = layout_entries(LAYOUT_NPASS, &loss, samples, N_SAMPLES, &npass_rows, &npass_docs);
    EntrySet duplicate = layout_entries(LAYOUT_DUPLICATE, &loss, samples, N_SAMPLES, NULL, NULL);
    EntrySet mask_only = layout_entries(LAYOUT_MASK_ONLY, &loss, samples, N_SAMPLES, NULL, NULL);
    EntrySet rendered = layout_entries(LAYOUT_AS_RENDERED, &loss, samples, N_SAMPLES, NULL, NULL);
    EntrySet preserve = layout_entries(LAYOUT_PRESERVE, &loss, samples, N_SAMPLES, NULL, NULL);
    int n_inexact = 0, n_tools = 0;
    for (int s = 0; s < N_SAMPLES; s++) {
        // npass trains a user turn's messages in one document, in order, as the other
        // layouts do: the trained positions match one to one, tool turns or not.
        n_tools += has_tool_turns(&samples[s]);
        EntrySet ref = sample_slice(npass, s);
        EntrySet dup = sample_slice(duplicate, s), mask = sample_slice(mask_only, s);
        check_one_pass_layouts(&samples[s], ref, sample_slice(rendered, s), sample_slice(preserve, s),
                               options, round, s);
        int want_trained = 0;
        for (int t = 0; t < samples[s].n_turns; t++)
            want_trained += samples[s].turns[t].think.n + samples[s].turns[t].answer.n;
        // Minimal: one npass document per user turn with a target.
        int want_docs = 0, got_docs = 0;
        for (int t = 0, turn_trained = 0; t < samples[s].n_turns; t++) {
            if (!samples[s].turns[t].continues) want_docs += turn_trained, turn_trained = 0;
            turn_trained |= !(loss.skip_empty_think && samples[s].turns[t].empty_think);
            if (t + 1 == samples[s].n_turns) want_docs += turn_trained;
        }
        for (int d = 0; d < npass_docs.n_docs; d++) got_docs += npass_docs.docs[d].sample == s;
        EXPECT(got_docs == want_docs, "round %d sample %d: npass has %d documents, want one per "
               "trained user turn: %d", round, s, got_docs, want_docs);
        EXPECT(options || ref.n == want_trained, "round %d sample %d: npass trains %d, want |think|+|answer| = %d",
              round, s, ref.n, want_trained);
        EXPECT(positions_match(dup, ref), "round %d sample %d: duplicate differs from npass",
               round, s);
        EXPECT(multisets_equal(dup, ref), "round %d sample %d: duplicate multiset", round, s);
        if (has_history_thinking(&samples[s]) && !options) {
            n_inexact++;
            EXPECT(unmatched(mask, ref) > 0,
                  "round %d sample %d: mask_only matched npass although history answers "
                  "followed thinking", round, s);
        } else if (!has_history_thinking(&samples[s])) {
            EXPECT(positions_match(mask, ref),
                   "round %d sample %d: without history thinking mask_only is npass", round, s);
        }
    }
    EXPECT(n_inexact > 0 || options || keep, "round %d: no sample with history thinking was drawn", round);
    EXPECT(n_tools > 0 || round % 2 == 0, "round %d: no sample with tool turns was drawn", round);

    // The hash can fail: change one token that some trained position sees.
    int trained_slot;
    do trained_slot = test_rng_int(rng, 0, npass_rows.n_rows * SEQ_LEN - 1);
    while (npass_rows.target[trained_slot] == -1);
    int doc_start = trained_slot;
    while (doc_start % SEQ_LEN > 0 && npass_rows.doc[doc_start - 1] == npass_rows.doc[trained_slot])
        doc_start--;
    int victim = test_rng_int(rng, doc_start, trained_slot);
    npass_rows.token[victim] += VOCAB;
    int sample = npass_docs.docs[npass_rows.doc[victim]].sample;
    EntrySet perturbed;
    perturbed.e = trained_entries(&npass_rows, &npass_docs, samples, true, &perturbed.n);
    EXPECT(!multisets_equal(sample_slice(duplicate, sample), sample_slice(perturbed, sample)),
          "round %d: perturbing slot %d did not change any context", round, victim);
    free(perturbed.e);

    free(npass.e);
    free(duplicate.e);
    free(mask_only.e);
    free(rendered.e);
    free(preserve.e);
    packed_rows_free(&npass_rows);
    doc_list_free(&npass_docs);
    for (int s = 0; s < N_SAMPLES; s++) tokenized_sample_free(&samples[s]);
}

static void test_shared_prefix(TestRng *rng, int round) {
    enum { N_SAMPLES = 16 };
    TokenizedSample samples[N_SAMPLES];
    for (int s = 0; s < N_SAMPLES; s++) samples[s] = random_sample(rng, SAMPLE_SHARED_PREFIX, s + 1, false);
    EntrySet npass = layout_entries(LAYOUT_NPASS, NULL, samples, N_SAMPLES, NULL, NULL);
    EntrySet shared = layout_entries(LAYOUT_SHARED_PREFIX, NULL, samples, N_SAMPLES, NULL, NULL);
    for (int s = 0; s < N_SAMPLES; s++) {
        EntrySet ref = sample_slice(npass, s), got = sample_slice(shared, s);
        EXPECT(positions_match(got, ref), "round %d set %d: shared_prefix differs from the "
              "separate passes", round, s);
        EXPECT(multisets_equal(got, ref), "round %d set %d: shared_prefix multiset", round, s);
    }
    free(npass.e);
    free(shared.e);
    for (int s = 0; s < N_SAMPLES; s++) tokenized_sample_free(&samples[s]);
}

// The same on the shipped synthetic data, through the tokenizer, the chat template and the
// loader.
static void test_synthetic_data(const char *tokenizer_path, const ChatTemplate *chat_template) {
    char err[512];
    Tokenizer *tok = tokenizer_load(tokenizer_path, err, sizeof err);
    if (!tok) {
        printf("skipping the synthetic-data check: %s\n", err);
        return;
    }
    struct {
        const char *path;
        LayoutKind layout;
    } cases[] = {{"datasets/synthetic/train.jsonl", LAYOUT_DUPLICATE},
                 {"datasets/synthetic/shared_prefix.jsonl", LAYOUT_SHARED_PREFIX},
                 {"tests/data/consecutive_users.jsonl", LAYOUT_DUPLICATE},
                 {"datasets/tool_use/train.jsonl", LAYOUT_DUPLICATE}};
    // The tool-use data under the templates that render tools (the others refuse it).
    const int n_cases = chat_template->tools ? 4 : 3;
    for (int c = 0; c < n_cases; c++) {
        const bool tools = c == 3;
        DataOptions opt = {.layout = LAYOUT_NPASS, .seq_len = 8192,
                           .max_samples = tools ? 40 : 6, .chat_template = chat_template};
        PackedDataset ref_data, data;
        packed_dataset_load(tok, cases[c].path, opt, &ref_data);
        opt.layout = cases[c].layout;
        packed_dataset_load(tok, cases[c].path, opt, &data);
        EntrySet ref, got;
        ref.e = trained_entries(&ref_data.rows, &ref_data.docs, ref_data.samples, true, &ref.n);
        got.e = trained_entries(&data.rows, &data.docs, data.samples, false, &got.n);
        EXPECT(ref.n > 0 && positions_match(got, ref) && multisets_equal(got, ref),
               "%s, %s template: %s differs from npass (%d vs %d trained)", cases[c].path,
               chat_template->name, layout_name(cases[c].layout), got.n, ref.n);
        if (chat_template->keep_thinking && cases[c].layout == LAYOUT_DUPLICATE) {
            // Under keep npass is one pass per conversation, and mask_only is exact too.
            EXPECT(ref_data.docs.n_docs == ref_data.n_samples, "%s, keep: npass has %d documents "
                   "for %d conversations", cases[c].path, ref_data.docs.n_docs, ref_data.n_samples);
            PackedDataset mask;
            opt.layout = LAYOUT_MASK_ONLY;
            packed_dataset_load(tok, cases[c].path, opt, &mask);
            EntrySet m;
            m.e = trained_entries(&mask.rows, &mask.docs, mask.samples, false, &m.n);
            EXPECT(positions_match(m, ref), "%s, keep: mask_only differs from npass", cases[c].path);
            free(m.e);
            packed_dataset_free(&mask);
        }
        free(ref.e);
        free(got.e);
        packed_dataset_free(&ref_data);
        packed_dataset_free(&data);
    }
    tokenizer_free(tok);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    for (int round = 0; round < 12; round++) {
        test_conversations(&rng, round);
        test_shared_prefix(&rng, round);
    }
    test_synthetic_data("datasets/synthetic/tokenizer.model", &TEMPLATE_ONEPASS);
    // Every template, with its fixture tokenizer (tests/data/templates/, test_templates.c).
    static const char *const TEMPLATES[] = {"qwen3", "deepseek_r1", "chatml", "qwen2.5",
                                            "smollm2", "llama3", "zephyr", "onepass"};
    for (size_t i = 0; i < sizeof TEMPLATES / sizeof TEMPLATES[0]; i++) {
        char dir[128];
        snprintf(dir, sizeof dir, "tests/data/templates/%s", TEMPLATES[i]);
        test_synthetic_data(dir, template_by_name(TEMPLATES[i]));
    }
    char err[256];
    test_synthetic_data("tests/data/templates/onepass",
                        template_with_history(&TEMPLATE_ONEPASS, HISTORY_THINKING_KEEP, err, sizeof err));
    return test_finish();
}
