// The step loader: under npass, duplicate and mask_only a step takes the same samples
// with the same trained tokens; a step stops as soon as its budget is reached; every
// epoch visits each sample once (a seeded order, or file order without shuffle); a
// loader moved to a saved position continues with the same batches.
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/batch.h"
#include "test_util.h"
#include "trainer/loader.h"

enum { SEQ_LEN = 2048 };

// The sample indices of a batch, in the order taken (docs of one sample are adjacent).
static int batch_samples(const StepBatch *b, int *out) {
    int n = 0;
    for (int d = 0; d < b->docs.n_docs; d++)
        if (n == 0 || out[n - 1] != b->docs.docs[d].sample) out[n++] = b->docs.docs[d].sample;
    return n;
}

static long long sample_trained(const TokenizedSample *s, int index) {
    DocList docs = {0};
    char err[512];
    if (layout_sample(LAYOUT_NPASS, NULL, s, index, &docs, err, sizeof err) != 0) fatal("%s", err);
    long long n = 0;
    for (int d = 0; d < docs.n_docs; d++)
        for (int i = 0; i < docs.docs[d].n; i++) n += docs.docs[d].target[i] != -1;
    doc_list_free(&docs);
    return n;
}

int main(void) {
    TestRng rng = test_rng_from_env();
    char err[512];
    Tokenizer *tok = tokenizer_load("datasets/synthetic/tokenizer.model", err, sizeof err);
    if (!tok) fatal("%s", err);
    PackedDataset data;
    DataOptions opt = {.layout = LAYOUT_NPASS, .seq_len = SEQ_LEN};
    packed_dataset_load(tok, "datasets/synthetic/eval.jsonl", opt, &data);
    const int n = data.n_samples;
    long long *trained = xmalloc((size_t)n * sizeof(long long));
    for (int i = 0; i < n; i++) trained[i] = sample_trained(&data.samples[i], i);
    const uint64_t seed = test_rng_next(&rng);
    const long long budget = 500 + test_rng_int(&rng, 0, 1500);
    PackOptions pack = {0};

    // Same samples and trained tokens under each layout, step after step.
    const LayoutKind kinds[3] = {LAYOUT_NPASS, LAYOUT_DUPLICATE, LAYOUT_MASK_ONLY};
    StepLoader loaders[3];
    for (int k = 0; k < 3; k++)
        step_loader_init(&loaders[k], data.samples, n, kinds[k], SEQ_LEN, pack, budget, true, seed);
    int *taken[3];
    for (int k = 0; k < 3; k++) taken[k] = xmalloc((size_t)n * 4 * sizeof(int));
    int mismatches = 0, over_budget = 0;
    for (int step = 0; step < 40; step++) {
        StepBatch b[3];
        int count[3];
        for (int k = 0; k < 3; k++) {
            step_loader_next(&loaders[k], &b[k]);
            count[k] = batch_samples(&b[k], taken[k]);
        }
        for (int k = 1; k < 3; k++)
            if (count[k] != count[0] || memcmp(taken[k], taken[0], (size_t)count[0] * sizeof(int)) ||
                b[k].trained_tokens != b[0].trained_tokens)
                mismatches++;
        // Budget: reached, and not by more than the last sample taken.
        long long sum = 0;
        for (int i = 0; i < count[0]; i++) sum += trained[taken[0][i]];
        if (sum != b[0].trained_tokens || sum < budget || sum - trained[taken[0][count[0] - 1]] >= budget)
            over_budget++;
        EXPECT(b[1].tokens < b[0].tokens, "step %d: duplicate uses fewer tokens than npass", step);
        for (int k = 0; k < 3; k++) step_batch_free(&b[k]);
    }
    EXPECT(mismatches == 0, "%d layout/step pairs took different samples (budget %lld)", mismatches, budget);
    EXPECT(over_budget == 0, "%d steps broke the budget rule", over_budget);

    // Resuming from a saved position continues with the same batches.
    StepLoader resumed;
    step_loader_init(&resumed, data.samples, n, LAYOUT_DUPLICATE, SEQ_LEN, pack, budget, true, seed);
    step_loader_seek(&resumed, loaders[1].epoch, loaders[1].cursor);
    for (int step = 0; step < 5; step++) {
        StepBatch a, b;
        step_loader_next(&loaders[1], &a);
        step_loader_next(&resumed, &b);
        int na = batch_samples(&a, taken[0]), nb = batch_samples(&b, taken[1]);
        EXPECT(na == nb && memcmp(taken[0], taken[1], (size_t)na * sizeof(int)) == 0 &&
                  a.rows.n_rows == b.rows.n_rows &&
                  memcmp(a.rows.token, b.rows.token, (size_t)a.rows.n_rows * SEQ_LEN * sizeof(int32_t)) == 0,
              "step %d after seek: same batch", step);
        step_batch_free(&a);
        step_batch_free(&b);
    }
    for (int k = 0; k < 3; k++) step_loader_free(&loaders[k]);
    step_loader_free(&resumed);

    // Budget 1: one sample per step, so steps enumerate the epochs' orders.
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        StepLoader l;
        step_loader_init(&l, data.samples, n, LAYOUT_NPASS, SEQ_LEN, pack, 1, shuffle, seed);
        int *order = taken[0];  // [2n]: epochs 0 and 1
        for (int i = 0; i < 2 * n; i++) {
            StepBatch b;
            step_loader_next(&l, &b);
            EXPECT(batch_samples(&b, &order[i]) == 1, "budget 1 takes one sample");
            step_batch_free(&b);
        }
        for (int e = 0; e < 2; e++) {
            int *seen = xcalloc((size_t)n, sizeof(int));
            bool file_order = true;
            for (int i = 0; i < n; i++) {
                seen[order[e * n + i]]++;
                file_order &= order[e * n + i] == i;
            }
            int once = 0;
            for (int i = 0; i < n; i++) once += seen[i] == 1;
            EXPECT(once == n, "shuffle %d epoch %d: every sample exactly once (%d of %d)", shuffle, e, once, n);
            EXPECT(file_order == !shuffle, "shuffle %d epoch %d: %s", shuffle, e,
                  shuffle ? "a shuffled order" : "file order");
            free(seen);
        }
        if (shuffle)
            EXPECT(memcmp(order, order + n, (size_t)n * sizeof(int)) != 0, "epochs get different orders");
        step_loader_free(&l);
    }

    // A sample whose document does not fit seq_len: the error names its line.
    {
        int longest = 0;
        for (int i = 1; i < n; i++)
            if (trained[i] > trained[longest]) longest = i;
        StepLoader l;
        step_loader_init(&l, &data.samples[longest], 1, LAYOUT_NPASS, 8, pack, 1, false, seed);
        StepBatch b;
        char why[1200], expected[64];
        snprintf(expected, sizeof expected, "sample at line %d: ", data.samples[longest].line);
        const int rc = step_loader_try_next(&l, &b, why, sizeof why);
        EXPECT(rc != 0 && strncmp(why, expected, strlen(expected)) == 0,
               "too-long document: rc %d, message '%s' (expected it to start '%s')", rc,
               rc ? why : "", expected);
        if (rc == 0) step_batch_free(&b);  // on an error the loader frees it
        step_loader_free(&l);
    }

    for (int k = 0; k < 3; k++) free(taken[k]);
    free(trained);
    packed_dataset_free(&data);
    tokenizer_free(tok);
    return test_finish();
}
