// The offloaded optimizer's schedule (trainer/offload_pipeline.h) with fake copies: a
// "device" of plain arrays, a download that lands only when waited for (so an update
// that ran before its wait, or a slot refilled before its reader returned, reads the
// wrong gradients), an upload that takes a random while. The update is the real host
// AdamW (adamw_master_range_cpu), its bf16 weights into a ring of slots the upload
// reads. Checked:
//  - while an update runs, the caller's thread waits for growing prefixes of chunks and
//    finds exactly those chunks' weights on the "device", equal to adamw_step_cpu's
//    bf16 rounding; the stages ran in the promised order (each chunk downloaded,
//    waited, updated, uploaded; a ring slot refilled only after its reader returned);
//  - after finish, the fp32 master weights and m, v equal adamw_step_cpu's bit for
//    bit over several steps, with clipping;
//  - a non-finite gradient: a wait past its chunk and finish report non-finite;
//  - waits without a running update return at once; offload_pipeline_running follows start and finish.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "test_util.h"
#include "trainer/adamw.h"
#include "trainer/offload_pipeline.h"
#include "trainer/split_float.h"

enum { CHUNK = 1000, SLOTS = 2 };

// What a chunk has been through in the running update.
enum { QUEUED = 1, LANDED, UPDATED, UPLOADED };

typedef struct {
    size_t n;
    int n_chunks;
    const ParamTable *table;
    // the "device"
    float *dev_grads;
    uint16_t *dev_weights;
    // the host
    float *ring;        // [SLOTS * CHUNK] gradients come down into
    uint16_t *hi_ring;  // [SLOTS * CHUNK] weights go up from
    float *master;      // [n]
    AdamWState opt;
    AdamWHyper h;
    float clip_scale;
    // bookkeeping, touched by the worker only while an update runs
    int *stage;        // [n_chunks]
    int *slot_of;      // [n_chunks] the slot a chunk was queued into
    int slot_holder[SLOTS];
    int order_errors;
    TestRng rng;
} Fake;

static size_t chunk_len(const Fake *f, int c) {
    const size_t from = (size_t)c * CHUNK;
    return f->n - from < CHUNK ? f->n - from : CHUNK;
}

static void pause_a_little(TestRng *rng) {
    const struct timespec ts = {0, 1000L * test_rng_int(rng, 0, 300)};
    nanosleep(&ts, NULL);
}

static void fake_download(void *ctx, int c, int slot) {
    Fake *f = ctx;
    const int holder = f->slot_holder[slot];
    if (f->stage[c] != 0 || (holder >= 0 && f->stage[holder] < UPDATED)) f->order_errors++;
    f->slot_holder[slot] = c;
    f->slot_of[c] = slot;
    f->stage[c] = QUEUED;
}

// The copy lands now: a pipeline that read the slot before waiting reads stale values.
static void fake_wait_download(void *ctx, int c) {
    Fake *f = ctx;
    if (f->stage[c] != QUEUED) f->order_errors++;
    pause_a_little(&f->rng);
    const size_t from = (size_t)c * CHUNK, k = chunk_len(f, c);
    memcpy(f->ring + (size_t)f->slot_of[c] * CHUNK, f->dev_grads + from, k * sizeof(float));
    memset(f->dev_grads + from, 0, k * sizeof(float));
    f->stage[c] = LANDED;
}

static bool fake_update(void *ctx, int c, int slot) {
    Fake *f = ctx;
    if (f->stage[c] != LANDED || f->slot_of[c] != slot) f->order_errors++;
    const size_t from = (size_t)c * CHUNK;
    const bool finite =
        adamw_master_range_cpu(&f->opt, f->table, &f->h, from, from + chunk_len(f, c), f->master,
                               f->hi_ring + (size_t)slot * CHUNK, f->ring + (size_t)slot * CHUNK,
                               f->clip_scale);
    f->stage[c] = UPDATED;
    return finite;
}

static void fake_upload(void *ctx, int c) {
    Fake *f = ctx;
    if (f->stage[c] != UPDATED) f->order_errors++;
    pause_a_little(&f->rng);
    const size_t from = (size_t)c * CHUNK;
    memcpy(f->dev_weights + from, f->hi_ring + (size_t)f->slot_of[c] * CHUNK,
           chunk_len(f, c) * sizeof(uint16_t));
    f->stage[c] = UPLOADED;
}

// A table of several tensors whose boundaries fall inside chunks.
static ParamTable make_table(void) {
    static ParamTensor tensors[6] = {
        {.name = "model.embed_tokens.weight", .ndim = 2, .shape = {311, 23}, .is_embedding = true},
        {.name = "model.layers.0.input_layernorm.weight", .ndim = 1, .shape = {23}, .is_norm = true},
        {.name = "model.layers.0.self_attn.q_proj.weight", .ndim = 2, .shape = {97, 23}},
        {.name = "model.layers.0.self_attn.q_proj.bias", .ndim = 1, .shape = {97}, .is_bias = true},
        {.name = "model.layers.0.mlp.up_proj.weight", .ndim = 2, .shape = {401, 23}},
        {.name = "model.norm.weight", .ndim = 1, .shape = {23}, .is_norm = true},
    };
    size_t offset = 0;
    for (int i = 0; i < 6; i++) {
        tensors[i].numel =
            (size_t)tensors[i].shape[0] * (tensors[i].ndim == 2 ? (size_t)tensors[i].shape[1] : 1);
        tensors[i].offset = offset;
        offset += tensors[i].numel;
    }
    return (ParamTable){.tensors = tensors, .n_tensors = 6, .total = offset};
}

static bool high_halves_match(const uint16_t *got, const float *want, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) {
        uint32_t bits;
        memcpy(&bits, &want[i], sizeof bits);
        if (got[i] != split_float_hi(bits)) return false;
    }
    return true;
}

int main(void) {
    TestRng rng = test_rng_from_env();
    ParamTable table = make_table();
    const size_t n = table.total;
    Fake f = {.n = n, .n_chunks = (int)((n + CHUNK - 1) / CHUNK), .table = &table,
              .rng = {rng.s ^ 0x5DEECE66DULL}};
    EXPECT(f.n_chunks > 2 * SLOTS, "%d chunks: more than the ring holds", f.n_chunks);
    f.dev_grads = xcalloc(n, sizeof(float));
    f.dev_weights = xcalloc(n, sizeof(uint16_t));
    f.ring = xcalloc((size_t)SLOTS * CHUNK, sizeof(float));
    f.hi_ring = xmalloc((size_t)SLOTS * CHUNK * sizeof(uint16_t));
    f.master = xmalloc(n * sizeof(float));
    f.stage = xcalloc((size_t)f.n_chunks, sizeof(int));
    f.slot_of = xcalloc((size_t)f.n_chunks, sizeof(int));
    adamw_init(&f.opt, n);
    f.h = (AdamWHyper){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                       .decay_norms = test_rng_int(&rng, 0, 1), .decay_embeddings = true};

    // The reference: fp32 params, adamw_step_cpu on the clipped gradients.
    float *ref = xmalloc(n * sizeof(float)), *g = xmalloc(n * sizeof(float));
    float *scaled = xmalloc(n * sizeof(float));
    AdamWState ref_opt;
    adamw_init(&ref_opt, n);
    for (size_t i = 0; i < n; i++) ref[i] = test_rng_uniform(&rng) * 0.05f;
    memcpy(f.master, ref, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &ref[i], sizeof bits);
        f.dev_weights[i] = split_float_hi(bits);
    }

    const OffloadStages stages = {&f, fake_download, fake_wait_download, fake_update, fake_upload,
                                  NULL};
    OffloadPipeline *p = offload_pipeline_create(f.n_chunks, SLOTS, &stages);
    EXPECT(!offload_pipeline_running(p) && offload_pipeline_wait_uploaded(p, f.n_chunks) &&
               offload_pipeline_finish(p),
           "without an update, waits return at once and report finite");

    const int steps = 4;
    for (int step = 1; step <= steps; step++) {
        const bool poisoned = step == steps;  // a non-finite gradient in the last step
        const size_t bad_at = (size_t)test_rng_int(&rng, 0, (int)n - 1);
        for (size_t i = 0; i < n; i++) g[i] = test_rng_uniform(&rng) * 0.1f;
        if (poisoned) g[bad_at] = INFINITY;
        const float norm = (float)grad_global_norm_cpu(g, n);
        f.clip_scale = adamw_clip_scale(norm, step == 2 ? 0.5f * norm : 0.0f);
        f.h.lr = 1e-3f * (float)step;
        for (size_t i = 0; i < n; i++) scaled[i] = g[i] * f.clip_scale;
        adamw_step_cpu(&ref_opt, &table, &f.h, ref, scaled);

        // As the backend does: the gradients in place, the step counted, then start.
        memcpy(f.dev_grads, g, n * sizeof(float));
        memset(f.stage, 0, (size_t)f.n_chunks * sizeof(int));
        for (int s = 0; s < SLOTS; s++) f.slot_holder[s] = -1;
        f.opt.step++;
        offload_pipeline_start(p);
        EXPECT(offload_pipeline_running(p), "step %d: running after start", step);

        // The caller's thread: growing prefixes of chunks, as the forward's layers ask.
        int bad_prefixes = 0, finite_past_bad = 0;
        const int bad_chunk = (int)(bad_at / CHUNK);
        for (int k = 1; k <= f.n_chunks; k += test_rng_int(&rng, 1, 3)) {
            const bool finite = offload_pipeline_wait_uploaded(p, k);
            // The weights of chunks [0, k) are up; those after the bad chunk's are NaN.
            const size_t to = (size_t)k * CHUNK < n ? (size_t)k * CHUNK : n;
            if (!poisoned && !high_halves_match(f.dev_weights, ref, 0, to)) bad_prefixes++;
            // At least chunks [0, k) are updated: past the bad chunk, non-finite.
            if (poisoned && finite && k > bad_chunk) finite_past_bad++;
        }
        EXPECT(bad_prefixes == 0, "step %d: %d prefixes of chunks waited for held other weights "
               "than adamw_step_cpu's bf16 rounding", step, bad_prefixes);
        EXPECT(finite_past_bad == 0, "step %d: %d waits past the infinity's chunk reported finite", step,
               finite_past_bad);
        const bool finite = offload_pipeline_finish(p);
        EXPECT(!offload_pipeline_running(p), "step %d: not running after finish", step);
        EXPECT(f.order_errors == 0, "step %d: %d stages out of order", step, f.order_errors);
        EXPECT(finite == !poisoned, "step %d: finish reports %s", step,
               finite ? "finite" : "non-finite");
        int uploaded = 0;
        for (int c = 0; c < f.n_chunks; c++) uploaded += f.stage[c] == UPLOADED;
        EXPECT(uploaded == f.n_chunks, "step %d: %d of %d chunks uploaded", step, uploaded,
               f.n_chunks);
        if (poisoned) continue;  // the state is lost to the infinity
        size_t differ = 0;
        for (size_t i = 0; i < n; i++)
            differ += memcmp(&f.master[i], &ref[i], sizeof(float)) != 0 ||
                      memcmp(&f.opt.m[i], &ref_opt.m[i], sizeof(float)) != 0 ||
                      memcmp(&f.opt.v[i], &ref_opt.v[i], sizeof(float)) != 0;
        EXPECT(differ == 0 && high_halves_match(f.dev_weights, ref, 0, n),
               "step %d: the pipelined update equals adamw_step_cpu bit for bit (%zu differ)",
               step, differ);
    }
    offload_pipeline_destroy(p);
    adamw_free(&f.opt);
    adamw_free(&ref_opt);
    free(ref); free(g); free(scaled);
    free(f.dev_grads); free(f.dev_weights); free(f.ring); free(f.hi_ring); free(f.master);
    free(f.stage); free(f.slot_of);
    return test_finish();
}
