#include "trainer/loader.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// The epoch's order is a pure function of (seed, epoch): resuming needs no RNG state.
static void make_order(StepLoader *l) {
    for (int i = 0; i < l->n_samples; i++) l->order[i] = i;
    if (!l->shuffle) return;
    uint64_t state = l->seed ^ (0xD1B54A32D192ED03ULL * (uint64_t)(l->epoch + 1));
    for (int i = l->n_samples - 1; i > 0; i--) {
        int j = (int)(splitmix64(&state) % (uint64_t)(i + 1));
        int t = l->order[i];
        l->order[i] = l->order[j];
        l->order[j] = t;
    }
}

void step_loader_init(StepLoader *l, const TokenizedSample *samples, int n_samples,
                      LayoutKind layout, int seq_len, PackOptions pack, long long budget,
                      bool shuffle, uint64_t seed) {
    if (n_samples <= 0) fatal("step loader: no samples");
    if (budget <= 0) fatal("config key 'train.tokens_per_step': must be positive, got %lld", budget);
    *l = (StepLoader){.samples = samples, .n_samples = n_samples, .layout = layout,
                      .seq_len = seq_len, .pack = pack, .budget = budget, .shuffle = shuffle,
                      .seed = seed};
    l->order = xmalloc((size_t)n_samples * sizeof(int));
    l->npass_tokens = xmalloc((size_t)n_samples * sizeof(long long));
    for (int i = 0; i < n_samples; i++) l->npass_tokens[i] = -1;
    make_order(l);
}

// The tokens of sample `index` under npass (the npass-equivalent count of the step
// metrics), counted once per sample. Returns -1 with a message when it cannot be laid out.
static long long sample_npass_tokens(StepLoader *l, int index, char *why, size_t why_len) {
    if (l->npass_tokens[index] >= 0) return l->npass_tokens[index];
    DocList docs = {0};
    if (layout_sample(LAYOUT_NPASS, &l->loss, &l->samples[index], index, &docs, why, why_len) != 0) {
        doc_list_free(&docs);
        return -1;
    }
    long long n = 0;
    for (int d = 0; d < docs.n_docs; d++) n += docs.docs[d].n;
    doc_list_free(&docs);
    return l->npass_tokens[index] = n;
}

void step_loader_seek(StepLoader *l, long long epoch, long long cursor) {
    if (cursor < 0 || cursor > l->n_samples)
        fatal("resume: data position %lld is outside the %d samples of this data set", cursor,
              l->n_samples);
    l->epoch = epoch;
    l->cursor = cursor;
    make_order(l);
}

static long long doc_trained(const Doc *d) {
    long long n = 0;
    for (int i = 0; i < d->n; i++) n += d->target[i] != -1;
    return n;
}

void packed_rows_count(const PackedRows *rows, long long *tokens, long long *trained) {
    *tokens = *trained = 0;
    size_t slots = (size_t)rows->n_rows * (size_t)rows->seq_len;
    for (size_t i = 0; i < slots; i++) {
        *tokens += rows->doc[i] != -1;
        *trained += rows->target[i] != -1;
    }
}

long step_loader_steps_for_epochs(const StepLoader *l, double epochs) {
    long long *trained = xcalloc((size_t)l->n_samples, sizeof(long long));
    long long total = 0;
    char why[1024];
    for (int i = 0; i < l->n_samples; i++) {
        DocList docs = {0};
        if (layout_sample(l->layout, &l->loss, &l->samples[i], i, &docs, why, sizeof why) != 0)
            fatal("sample at line %d: %s", l->samples[i].line, why);
        for (int d = 0; d < docs.n_docs; d++) trained[i] += doc_trained(&docs.docs[d]);
        total += trained[i];
        doc_list_free(&docs);
    }
    if (total == 0) fatal("no sample of the data set has a trained token under layout %s", layout_name(l->layout));
    StepLoader sim = *l;
    sim.order = xmalloc((size_t)l->n_samples * sizeof(int));
    sim.epoch = sim.cursor = 0;
    make_order(&sim);
    const long long target = (long long)ceil(epochs * (double)l->n_samples);
    long steps = 0;
    for (long long taken = 0; taken < target; steps++) {
        for (long long step_trained = 0; step_trained < l->budget; taken++) {
            if (sim.cursor == sim.n_samples) {
                sim.epoch++;
                sim.cursor = 0;
                make_order(&sim);
            }
            step_trained += trained[sim.order[sim.cursor++]];
        }
    }
    free(sim.order);
    free(trained);
    return steps;
}

// Lays out samples until the budget is reached, then packs them; on error a message
// into err (why: a scratch buffer) and what was built is left in out for the caller to free.
static int fill_step(StepLoader *l, StepBatch *out, char *why, size_t why_len, char *err,
                     size_t err_len) {
    long long trained = 0;
    while (trained < l->budget) {
        if (l->cursor == l->n_samples) {
            l->epoch++;
            l->cursor = 0;
            make_order(l);
        }
        int index = l->order[l->cursor++];
        const TokenizedSample *s = &l->samples[index];
        int first_doc = out->docs.n_docs;
        if (layout_sample(l->layout, &l->loss, s, index, &out->docs, why, why_len) != 0)
            return fail(err, err_len, "sample at line %d: %s", s->line, why);
        for (int d = first_doc; d < out->docs.n_docs; d++) trained += doc_trained(&out->docs.docs[d]);
        const long long npass = sample_npass_tokens(l, index, why, why_len);
        if (npass < 0) return fail(err, err_len, "sample at line %d: %s", s->line, why);
        out->npass_tokens += npass;
        out->n_samples++;
        if (trained == 0 && out->n_samples >= l->n_samples)
            return fail(err, err_len, "no sample of the data set has a trained token under layout %s",
                        layout_name(l->layout));
    }
    if (pack_docs(&out->docs, l->seq_len, l->pack, &out->rows, &out->n_skipped_too_long, why,
                  why_len) != 0) {
        const int too_long = first_doc_too_long(&out->docs, l->seq_len);
        if (too_long >= 0)
            return fail(err, err_len, "sample at line %d: %s", out->docs.docs[too_long].line, why);
        return fail(err, err_len, "%s", why);
    }
    packed_rows_count(&out->rows, &out->tokens, &out->trained_tokens);
    return 0;
}

int step_loader_try_next(StepLoader *l, StepBatch *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    char why[1024];
    if (fill_step(l, out, why, sizeof why, err, err_len) == 0) return 0;
    step_batch_free(out);  // on error out holds nothing
    return -1;
}

void step_loader_next(StepLoader *l, StepBatch *out) {
    char err[1200];
    if (step_loader_try_next(l, out, err, sizeof err) != 0) fatal("%s", err);
}

void step_batch_free(StepBatch *b) {
    doc_list_free(&b->docs);
    packed_rows_free(&b->rows);
    memset(b, 0, sizeof *b);
}

void step_loader_free(StepLoader *l) {
    free(l->order);
    free(l->npass_tokens);
    memset(l, 0, sizeof *l);
}

// ------------------------------------------------------------- micro-batches

static int micro_batch_rows(const MicroBatches *mb, int i) {
    const int left = mb->rows.n_rows - i * mb->micro_rows;
    return left < mb->micro_rows ? left : mb->micro_rows;
}

void micro_batches_build(const PackedRows *rows, int micro_rows, MicroBatches *out) {
    if (micro_rows <= 0) fatal("config key 'train.micro_rows': must be positive, got %d", micro_rows);
    *out = (MicroBatches){.rows = *rows, .micro_rows = micro_rows,
                          .n_micro = (rows->n_rows + micro_rows - 1) / micro_rows};
    out->masks = xcalloc((size_t)out->n_micro, sizeof(AttnMask));
    for (int i = 0; i < out->n_micro; i++) {
        const size_t off = (size_t)i * (size_t)micro_rows * (size_t)rows->seq_len;
        attn_mask_build(rows->lo + off, rows->hi + off, micro_batch_rows(out, i), rows->seq_len,
                        ATTN_TILE, ATTN_TILE, &out->masks[i]);
    }
}

void micro_batches_free(MicroBatches *mb) {
    for (int i = 0; i < mb->n_micro; i++) attn_mask_free(&mb->masks[i]);
    free(mb->masks);
    memset(mb, 0, sizeof *mb);
}

ModelBatch micro_batch(const MicroBatches *mb, int i) {
    const PackedRows *r = &mb->rows;
    const size_t off = (size_t)i * (size_t)mb->micro_rows * (size_t)r->seq_len;
    return (ModelBatch){.n_rows = micro_batch_rows(mb, i), .seq_len = r->seq_len,
                        .token = r->token + off, .target = r->target + off, .pos = r->pos + off,
                        .mask = &mb->masks[i]};
}
