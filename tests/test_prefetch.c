// The prefetcher (data path on a thread, a ring of prepared steps) hands out exactly the
// synchronous loader's steps: the same rows, the same per-micro-batch tile masks (the
// oracle builds them from the rows with attn_mask_build), the same counts and the same
// loader position after each step, across epochs, with the ring wrapping many times,
// with and without a seek; with several ranks, each rank's steps hold its rows of the
// loader's step (dist_rank_rows) and the whole step's counts.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "data/batch.h"
#include "dist/distributed.h"
#include "test_util.h"
#include "trainer/prefetch.h"

enum { SEQ_LEN = 1024 };

static void *test_alloc(size_t bytes) { return xmalloc(bytes); }

static bool same_ints(const int32_t *a, const int32_t *b, size_t n) {
    return memcmp(a, b, n * sizeof(int32_t)) == 0;
}

static bool same_mask(const AttnMask *a, const AttnMask *b) {
    if (a->n_rows != b->n_rows || a->seq_len != b->seq_len || a->block_m != b->block_m ||
        a->block_n != b->block_n)
        return false;
    return same_ints(a->storage, b->storage,
                     attn_mask_storage_count(a->n_rows, a->seq_len, a->block_m, a->block_n));
}

// Compares `steps` prefetched steps with the synchronous loader's; returns the mismatches.
static int compare_run(const PackedDataset *data, LayoutKind layout, long long budget,
                       int micro_rows, int depth, uint64_t seed, long long seek_epoch,
                       long long seek_cursor, int steps, int rank, int world_size) {
    StepLoader sync, ahead;
    const PackOptions pack = {0};
    step_loader_init(&sync, data->samples, data->n_samples, layout, SEQ_LEN, pack, budget, true, seed);
    step_loader_init(&ahead, data->samples, data->n_samples, layout, SEQ_LEN, pack, budget, true, seed);
    step_loader_seek(&sync, seek_epoch, seek_cursor);
    step_loader_seek(&ahead, seek_epoch, seek_cursor);
    Prefetcher *p = prefetcher_start(&ahead, micro_rows, depth, (HostAllocator){test_alloc, free}, rank,
                                     world_size);
    int mismatches = 0;
    for (int step = 0; step < steps; step++) {
        StepBatch b;
        step_loader_next(&sync, &b);
        const PackedRows want = dist_rank_rows(&b.rows, rank, world_size);
        long long want_tokens, want_trained;
        packed_rows_count(&want, &want_tokens, &want_trained);
        const PreparedStep *got = prefetcher_next(p);
        const PackedRows *r = &got->micro.rows;
        const size_t slots = (size_t)want.n_rows * SEQ_LEN;
        bool same = r->n_rows == want.n_rows && r->seq_len == SEQ_LEN &&
                    got->n_samples == b.n_samples && got->tokens == b.tokens &&
                    got->trained_tokens == b.trained_tokens &&
                    got->rank_tokens == want_tokens && got->rank_trained_tokens == want_trained &&
                    got->epoch == sync.epoch &&
                    got->cursor == sync.cursor && got->micro.micro_rows == micro_rows &&
                    same_ints(r->token, want.token, slots) &&
                    same_ints(r->target, want.target, slots) &&
                    same_ints(r->pos, want.pos, slots) && same_ints(r->lo, want.lo, slots) &&
                    same_ints(r->hi, want.hi, slots);
        const int n_micro = (want.n_rows + micro_rows - 1) / micro_rows;
        same = same && got->micro.n_micro == n_micro;
        for (int i = 0; same && i < n_micro; i++) {
            const int r0 = i * micro_rows;
            const int n = want.n_rows - r0 < micro_rows ? want.n_rows - r0 : micro_rows;
            AttnMask oracle;
            const size_t off = (size_t)r0 * SEQ_LEN;
            attn_mask_build(want.lo + off, want.hi + off, n, SEQ_LEN, ATTN_TILE,
                            ATTN_TILE, &oracle);
            same = same_mask(&got->micro.masks[i], &oracle);
            const ModelBatch mb = micro_batch(&got->micro, i);
            same = same && mb.n_rows == n && mb.token == r->token + off && mb.mask == &got->micro.masks[i] &&
                   mb.mask->lo == r->lo + off && mb.mask->hi == r->hi + off;
            attn_mask_free(&oracle);
        }
        if (!same) mismatches++;
        // A slow consumer now and then, so the producer fills the ring and waits.
        if (step % 7 == 3) nanosleep(&(struct timespec){0, 2000000}, NULL);
        prefetcher_release(p, got);
        step_batch_free(&b);
    }
    EXPECT(sync.epoch > seek_epoch, "the run crosses an epoch boundary (%d steps, budget %lld)",
          steps, budget);
    prefetcher_stop(p);
    step_loader_free(&sync);
    step_loader_free(&ahead);
    return mismatches;
}

int main(void) {
    TestRng rng = test_rng_from_env();
    char err[512];
    Tokenizer *tok = tokenizer_load("datasets/synthetic/tokenizer.model", err, sizeof err);
    if (!tok) fatal("%s", err);
    PackedDataset data;
    DataOptions opt = {.layout = LAYOUT_NPASS, .seq_len = SEQ_LEN};
    packed_dataset_load(tok, "datasets/synthetic/eval.jsonl", opt, &data);

    const LayoutKind layouts[3] = {LAYOUT_NPASS, LAYOUT_DUPLICATE, LAYOUT_MASK_ONLY};
    for (int k = 0; k < 3; k++) {
        const long long budget = 600 + test_rng_int(&rng, 0, 1500);
        const int micro_rows = test_rng_int(&rng, 1, 3), depth = test_rng_int(&rng, 2, 4);
        const uint64_t seed = test_rng_next(&rng);
        // Enough steps to roll over into the next epoch inside the ring.
        const int mismatches = compare_run(&data, layouts[k], budget, micro_rows, depth, seed, 0, 0, 120, 0, 1);
        EXPECT(mismatches == 0, "layout %s, budget %lld, micro_rows %d, depth %d: %d of 120 steps differ",
              layout_name(layouts[k]), budget, micro_rows, depth, mismatches);
    }
    const long long cursor = test_rng_int(&rng, 0, data.n_samples - 1);
    const int mismatches = compare_run(&data, LAYOUT_DUPLICATE, 2000, 2, 2, test_rng_next(&rng), 3,
                                       cursor, 60, 0, 1);
    EXPECT(mismatches == 0, "after seek to epoch 3 cursor %lld: %d of 60 steps differ", cursor, mismatches);
    for (int rank = 0; rank < 3; rank++) {
        const int wrong = compare_run(&data, LAYOUT_NPASS, 3000, 1, 3, 77, 0, 0, 40, rank, 3);
        EXPECT(wrong == 0, "rank %d of 3: %d of 40 steps are not its rows of the step", rank, wrong);
    }

    packed_dataset_free(&data);
    tokenizer_free(tok);
    return test_finish();
}
