#include "trainer/loader.h"

#include <stdlib.h>
#include <string.h>

#include "attention/mask.h"
#include "common/check.h"

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

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
    make_order(l);
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

void step_loader_next(StepLoader *l, StepBatch *out) {
    memset(out, 0, sizeof *out);
    long long trained = 0;
    char err[1024];
    while (trained < l->budget) {
        if (l->cursor == l->n_samples) {
            l->epoch++;
            l->cursor = 0;
            make_order(l);
        }
        int index = l->order[l->cursor++];
        const TokenizedSample *s = &l->samples[index];
        int first_doc = out->docs.n_docs;
        if (layout_sample(l->layout, s, index, &out->docs, err, sizeof err) != 0)
            fatal("sample at line %d: %s", s->line, err);
        for (int d = first_doc; d < out->docs.n_docs; d++) trained += doc_trained(&out->docs.docs[d]);
        out->n_samples++;
        if (trained == 0 && out->n_samples >= l->n_samples)
            fatal("no sample of the data set has a trained token under layout %s",
                  layout_name(l->layout));
    }
    if (pack_docs(&out->docs, l->seq_len, l->pack, &out->rows, &out->n_skipped_too_long, err,
                  sizeof err) != 0)
        fatal("%s", err);
    packed_rows_count(&out->rows, &out->tokens, &out->trained_tokens);
}

void step_batch_free(StepBatch *b) {
    doc_list_free(&b->docs);
    packed_rows_free(&b->rows);
    memset(b, 0, sizeof *b);
}

void step_loader_free(StepLoader *l) {
    free(l->order);
    memset(l, 0, sizeof *l);
}

// Runs one micro-batch of rows [r0, r0+n); losses (may be NULL) is this batch's slice.
static double run_micro(CpuModel *model, const float *params, float *grads, const PackedRows *rows,
                        int r0, int n, float loss_scale, float *losses) {
    size_t off = (size_t)r0 * (size_t)rows->seq_len;
    TileMask mask;
    tile_mask_build(rows->lo + off, rows->hi + off, n, rows->seq_len, CPU_ATTENTION_TILE,
                    CPU_ATTENTION_TILE, &mask);
    ModelBatch b = {.n_rows = n, .seq_len = rows->seq_len, .token = rows->token + off,
                    .target = rows->target + off, .pos = rows->pos + off, .lo = rows->lo + off,
                    .hi = rows->hi + off, .mask = &mask};
    double sum = grads ? cpu_model_forward_backward(model, params, grads, &b, loss_scale)
                       : cpu_model_forward(model, params, &b, losses);
    tile_mask_free(&mask);
    return sum;
}

double rows_forward_backward(CpuModel *model, const float *params, float *grads,
                             const PackedRows *rows, int micro_rows, float loss_scale) {
    double sum = 0.0;
    for (int r = 0; r < rows->n_rows; r += micro_rows) {
        int n = rows->n_rows - r < micro_rows ? rows->n_rows - r : micro_rows;
        sum += run_micro(model, params, grads, rows, r, n, loss_scale, NULL);
    }
    return sum;
}

double rows_forward(CpuModel *model, const float *params, const PackedRows *rows, int micro_rows,
                    float *losses) {
    double sum = 0.0;
    for (int r = 0; r < rows->n_rows; r += micro_rows) {
        int n = rows->n_rows - r < micro_rows ? rows->n_rows - r : micro_rows;
        sum += run_micro(model, params, NULL, rows, r, n, 0.0f,
                         losses + (size_t)r * (size_t)rows->seq_len);
    }
    return sum;
}
