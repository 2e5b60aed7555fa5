// The CUDA bf16 model against its oracle, the CPU fp32 model (model_cpu.c) run on the
// SAME bf16-rounded weights, on packed rows of random conversations under the real
// layout code (duplicate and npass, FFD packing, tile metadata):
//  - loss within 1e-2 relative, per-slot losses close, every gradient tensor at cosine
//    similarity >= 0.99, nothing NaN; head_dim 64 (untied head) and 128 (tied head),
//    Qwen2's q/k/v biases, llama3 RoPE scaling, head_dim decoupled from hidden / heads,
//    Qwen3's q_norm/k_norm; the loss head in chunks gives the same result;
//  - forward-only equals forward_backward's loss; a second call adds the same
//    gradient again; the deterministic mode is bitwise reproducible; the recompute
//    modes none and layer give bitwise the losses and gradients of mlp (and with the MLP
//    in tiles of tokens, layer's those of mlp, both close to one tile's); the atomic dQ
//    mode agrees; a mask built with other block sizes is rebuilt and gives the same loss;
//  - parity on the GPU: duplicate against npass, loss within 5e-3 relative, gradient
//    tensors at cosine >= 0.999 (exact in real arithmetic, see DESIGN.md §3); mask_only,
//    inexact, must fail that gradient threshold (fp32 CPU: q/k cosine ~0.8);
//  - train.offload_activations (cuda_model_create_offload) on 6 layers (a ring of 3
//    slots, 3 layer inputs on the host), plain and Qwen3-shaped: bitwise the loss, per-slot
//    losses and gradients of recompute layer, in deterministic mode, over steps of
//    different row counts with forward-only calls (which copy nothing) between them, and
//    with the copy stream held 10 ms before the forward and at each part of the backward
//    (so a missing wait reads or overwrites a slot too early); every grads_ready part final
//    when named; an arena 3 residuals smaller.
#include "model/model_cuda.h"
extern "C" {  // plain C headers without guards of their own
#include "data/layout.h"
#include "data/pack.h"
}
#include <limits.h>
#include <math.h>
#include <string.h>
#include "attention/attention_cuda.h"
#include "common/cuda_check.h"
#include "model/ops_cuda.h"
#include "tests/test_cuda_util.cuh"
#include "tests/test_model_util.h"
#include "tests/test_util.h"

// Conversations are at most 3 turns of prompt <= 30, think <= 80, answer <= 30 tokens:
// duplicate documents <= 3 * 170 = 510 tokens, so every document fits a row; npass has
// at most one document per turn, so at most 3 * N_CONVERSATIONS rows.
enum { SEQ_LEN = 512, N_CONVERSATIONS = 6, MAX_ROWS = 3 * N_CONVERSATIONS, MAX_CHANNELS = 512 };

static TestRng rng;

static TokenSpan random_span(int n, int vocab) {
    TokenSpan s = {(int32_t *)xmalloc((size_t)(n ? n : 1) * sizeof(int32_t)), n};
    for (int i = 0; i < n; i++) s.ids[i] = test_rng_int(&rng, 1, vocab - 1);
    return s;
}

// history_thinking: 3 turns, all with reasoning (mask_only is then inexact).
static TokenizedSample random_conversation(int vocab, int line, bool history_thinking) {
    TokenizedSample s;
    memset(&s, 0, sizeof(s));
    s.kind = SAMPLE_CONVERSATION;
    s.n_turns = history_thinking ? 3 : test_rng_int(&rng, 1, 3);
    s.line = line;
    s.turns = (TurnTokens *)xcalloc((size_t)s.n_turns, sizeof(TurnTokens));
    for (int t = 0; t < s.n_turns; t++) {
        s.turns[t].prompt = random_span(test_rng_int(&rng, 4, 30), vocab);
        // A quarter of the turns has no reasoning (a single answer copy under duplicate).
        const bool think = history_thinking || test_rng_int(&rng, 0, 3) > 0;
        s.turns[t].think = random_span(think ? test_rng_int(&rng, 8, 80) : 0, vocab);
        s.turns[t].answer = random_span(test_rng_int(&rng, 4, 30), vocab);
    }
    return s;
}

// One layout of the conversations, packed, with its tile metadata.
typedef struct {
    DocList docs;
    PackedRows rows;
    AttnMask mask;
    ModelBatch batch;
    int n_targets;
} PackedBatch;

static void pack_layout(LayoutKind kind, const TokenizedSample *samples, int n_samples,
                        PackedBatch *out) {
    memset(out, 0, sizeof(*out));
    char err[256];
    for (int s = 0; s < n_samples; s++)
        if (layout_sample(kind, NULL, &samples[s], s, &out->docs, err, sizeof err) != 0)
            fatal("layout %s: %s", layout_name(kind), err);
    int skipped = 0;
    if (pack_docs(&out->docs, SEQ_LEN, PackOptions{false, false}, &out->rows, &skipped, err,
                  sizeof err) != 0)
        fatal("pack %s: %s", layout_name(kind), err);
    if (out->rows.n_rows > MAX_ROWS)
        fatal("%s packed %d rows, the test sized for %d", layout_name(kind), out->rows.n_rows,
              MAX_ROWS);
    attn_mask_build(out->rows.lo, out->rows.hi, out->rows.n_rows, SEQ_LEN, ATTN_TILE,
                    ATTN_TILE, &out->mask);
    const PackedRows *r = &out->rows;
    out->batch = ModelBatch{r->n_rows, SEQ_LEN, r->token, r->target, r->pos, &out->mask};
    for (int i = 0; i < r->n_rows * SEQ_LEN; i++) out->n_targets += r->target[i] >= 0;
}

static void packed_batch_free(PackedBatch *p) {
    attn_mask_free(&p->mask);
    packed_rows_free(&p->rows);
    doc_list_free(&p->docs);
}

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

// Every tensor of `got` at cosine >= min_cosine against `want`; prints one line each.
static void compare_gradients(const char *what, const ParamTable *table, const float *got,
                              const float *want, double min_cosine) {
    double worst = 1.0;
    for (int i = 0; i < table->n_tensors; i++) {
        const ParamTensor *p = &table->tensors[i];
        const double c = test_cosine(got + p->offset, want + p->offset, p->numel);
        worst = fmin(worst, c);
        printf("  %s %-48s cosine %.6f\n", what, p->name, c);
        EXPECT(c >= min_cosine, "%s: gradient of %s at cosine %.6f < %g", what, p->name, c,
              min_cosine);
    }
    printf("  %s: worst cosine %.6f\n", what, worst);
}

// One forward+backward from zero gradients; grads_host receives them.
static double gpu_gradients(CudaModel *model, const void *params, float *grads_dev,
                            float *grads_host, size_t n, const ModelBatch *b, float loss_scale) {
    cudaCheck(cudaMemset(grads_dev, 0, n * sizeof(float)));
    const double loss = cuda_model_forward_backward(model, params, grads_dev, b, loss_scale);
    cudaCheck(cudaMemcpy(grads_host, grads_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    return loss;
}

// cuda_model_set_grads_ready's calls during one backward: each snapshots grads[from, n)
// on the model's stream into a buffer of its own, so afterwards every snapshot must equal
// the final gradients bit for bit if the part was complete when named.
enum { MAX_READY_CALLS = 8 };
typedef struct {
    const float *grads;  // [n] device: the backward's gradients
    size_t n;
    float *snapshot[MAX_READY_CALLS];  // [n] device each
    size_t from[MAX_READY_CALLS];
    int n_calls;
} ReadySnapshots;

static void snapshot_ready(void *ctx, size_t from, cudaStream_t stream) {
    ReadySnapshots *r = (ReadySnapshots *)ctx;
    CHECK(r->n_calls < MAX_READY_CALLS, "more than %d grads_ready calls", MAX_READY_CALLS);
    CHECK(from <= r->n, "grads_ready from %zu past the %zu gradients", from, r->n);
    float *snap = r->snapshot[r->n_calls];
    cudaCheck(cudaMemcpyAsync(snap + from, r->grads + from, (r->n - from) * sizeof(float),
                              cudaMemcpyDeviceToDevice, stream));
    r->from[r->n_calls++] = from;
}

// One call per layer, one after the loss head and final norm, one after the embedding
// (from 0), with from decreasing, and every part final when named.
static void check_grads_ready(CudaModel *model, const ModelConfig *cfg, const void *params,
                              float *grads_dev, size_t n, const ModelBatch *b, float loss_scale) {
    ReadySnapshots r = {grads_dev, n, {}, {}, 0};
    for (int i = 0; i < MAX_READY_CALLS; i++)
        cudaCheck(cudaMalloc(&r.snapshot[i], n * sizeof(float)));
    cudaCheck(cudaMemset(grads_dev, 0, n * sizeof(float)));
    cuda_model_set_grads_ready(model, snapshot_ready, &r);
    cuda_model_forward_backward(model, params, grads_dev, b, loss_scale);
    cuda_model_set_grads_ready(model, NULL, NULL);
    float *final_grads = (float *)xmalloc(n * sizeof(float)), *snap = (float *)xmalloc(n * sizeof(float));
    cudaCheck(cudaMemcpy(final_grads, grads_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(r.n_calls == cfg->num_hidden_layers + 2, "%d grads_ready calls for %d layers", r.n_calls,
           cfg->num_hidden_layers);
    bool decreasing = r.n_calls > 0 && r.from[r.n_calls - 1] == 0;
    int stale = 0;
    for (int i = 0; i < r.n_calls; i++) {
        if (i > 0) decreasing = decreasing && r.from[i] < r.from[i - 1];
        cudaCheck(cudaMemcpy(snap, r.snapshot[i], n * sizeof(float), cudaMemcpyDeviceToHost));
        stale += memcmp(snap + r.from[i], final_grads + r.from[i], (n - r.from[i]) * sizeof(float)) != 0;
    }
    EXPECT(decreasing, "grads_ready parts decrease to 0");
    EXPECT(stale == 0, "%d of %d grads_ready parts changed after they were named final", stale,
           r.n_calls);
    for (int i = 0; i < MAX_READY_CALLS; i++) cudaCheck(cudaFree(r.snapshot[i]));
    free(final_grads), free(snap);
}

static void run_config(const char *label, const ModelConfig *cfg) {
    printf("config %s: V=%d C=%d F=%d L=%d H=%d KV=%d head_dim=%d %s head\n", label,
           cfg->vocab_size, cfg->hidden_size, cfg->intermediate_size, cfg->num_hidden_layers,
           cfg->num_attention_heads, cfg->num_key_value_heads,
           model_dims(cfg).head_dim,
           cfg->tie_word_embeddings ? "tied" : "untied");
    ParamTable table;
    param_table_build(cfg, &table);
    const size_t n = table.total;

    // Weights: the seeded init, rounded to bf16 on the device; the CPU gets the same
    // rounded values back as fp32.
    float *params_host = (float *)xmalloc(n * sizeof(float));
    params_init(cfg, &table, test_rng_next(&rng), params_host);
    // Norm weights and biases off their 1 / 0 init, so a weight applied to the wrong
    // tensor (q_norm's to k, say) shows.
    for (int i = 0; i < table.n_tensors; i++) {
        const ParamTensor *p = &table.tensors[i];
        if (p->is_norm || p->is_bias)
            for (size_t j = 0; j < p->numel; j++)
                params_host[p->offset + j] += 0.2f * (float)test_rng_uniform(&rng);
    }
    round_bf16(params_host, n);  // what the CPU oracle reads: the GPU's values
    __nv_bfloat16 *params_dev = upload_bf16(params_host, n);
    float *grads_dev;
    cudaCheck(cudaMalloc(&grads_dev, n * sizeof(float)));

    TokenizedSample samples[N_CONVERSATIONS];
    for (int s = 0; s < N_CONVERSATIONS; s++)
        samples[s] = random_conversation(cfg->vocab_size, s + 1, s == 0);
    PackedBatch dup, npass, mask_only;
    pack_layout(LAYOUT_DUPLICATE, samples, N_CONVERSATIONS, &dup);
    pack_layout(LAYOUT_NPASS, samples, N_CONVERSATIONS, &npass);
    pack_layout(LAYOUT_MASK_ONLY, samples, N_CONVERSATIONS, &mask_only);
    printf("  duplicate: %d rows, %d targets, tile sparsity %.3f; npass: %d rows, %d targets\n",
           dup.rows.n_rows, dup.n_targets, attn_mask_sparsity(&dup.mask), npass.rows.n_rows,
           npass.n_targets);
    EXPECT(dup.n_targets == npass.n_targets && dup.n_targets > 0,
          "duplicate trains %d positions, npass %d", dup.n_targets, npass.n_targets);
    const float loss_scale = 1.0f / (float)dup.n_targets;
    int max_rows = dup.rows.n_rows > npass.rows.n_rows ? dup.rows.n_rows : npass.rows.n_rows;
    if (mask_only.rows.n_rows > max_rows) max_rows = mask_only.rows.n_rows;
    const int T_dup = dup.rows.n_rows * SEQ_LEN;

    // ---- the CPU oracle on the duplicate batch
    CpuModel *cpu = cpu_model_create(cfg, dup.rows.n_rows, SEQ_LEN, MODEL_RECOMPUTE_NONE);
    float *cpu_losses = (float *)xmalloc((size_t)T_dup * sizeof(float));
    float *cpu_grads = (float *)xcalloc(n, sizeof(float));
    const double cpu_loss = cpu_model_forward(cpu, params_host, &dup.batch, cpu_losses);
    cpu_model_forward_backward(cpu, params_host, cpu_grads, &dup.batch, loss_scale);
    cpu_model_free(cpu);

    // ---- the GPU model
    CudaModel *model = cuda_model_create(cfg, max_rows, SEQ_LEN, MODEL_RECOMPUTE_MLP);
    printf("  activation arena %.1f MiB for %d rows\n", cuda_model_arena_bytes(model) / 1048576.0,
           max_rows);
    float *gpu_losses = (float *)xmalloc((size_t)T_dup * sizeof(float));
    float *grads = (float *)xmalloc(n * sizeof(float));
    float *grads_again = (float *)xmalloc(n * sizeof(float));

    const double fwd_loss = cuda_model_forward(model, params_dev, &dup.batch, gpu_losses);
    const double loss = gpu_gradients(model, params_dev, grads_dev, grads, n, &dup.batch,
                                      loss_scale);
    printf("  loss: cuda %.6f cpu %.6f (per target %.5f vs %.5f)\n", loss, cpu_loss,
           loss / dup.n_targets, cpu_loss / dup.n_targets);
    EXPECT(isfinite(loss) && fabs(loss - cpu_loss) <= 1e-2 * fabs(cpu_loss),
          "loss %.6f vs cpu %.6f", loss, cpu_loss);
    EXPECT(fwd_loss == loss, "forward-only loss %.9g differs from forward_backward's %.9g",
          fwd_loss, loss);
    double slot_sum = 0.0, worst_slot = 0.0;
    bool untrained_zero = true;
    for (int i = 0; i < T_dup; i++) {
        slot_sum += gpu_losses[i];
        if (dup.rows.target[i] < 0) untrained_zero &= gpu_losses[i] == 0.0f;
        else worst_slot = fmax(worst_slot, fabs(gpu_losses[i] - cpu_losses[i]) /
                                               (fabs(cpu_losses[i]) + 1e-3));
    }
    EXPECT(all_finite(gpu_losses, (size_t)T_dup), "per-slot losses finite");
    EXPECT(untrained_zero, "slots without a target have loss 0");
    EXPECT(fabs(slot_sum - fwd_loss) <= 1e-9 * fabs(fwd_loss), "per-slot losses sum %.9g vs %.9g",
          slot_sum, fwd_loss);
    EXPECT(worst_slot <= 2e-2, "per-slot loss relative difference to cpu %.4g", worst_slot);
    EXPECT(all_finite(grads, n), "gradients finite (no NaN)");
    compare_gradients("cuda vs cpu", &table, grads, cpu_grads, 0.99);

    // Deterministic mode: bitwise the same gradients from a second run.
    gpu_gradients(model, params_dev, grads_dev, grads_again, n, &dup.batch, loss_scale);
    EXPECT(memcmp(grads, grads_again, n * sizeof(float)) == 0,
          "deterministic gradients differ between two runs");
    check_grads_ready(model, cfg, params_dev, grads_dev, n, &dup.batch, loss_scale);

    // The other recompute modes: each layer keeping its gate|up (none), or keeping only
    // its input residual and running its forward again in the backward (layer): the same
    // kernels on the same inputs, so in deterministic mode bitwise the same loss, per-slot
    // losses and gradients as recomputing the MLP (and so as each other); none takes more
    // memory than mlp, layer less.
    for (ModelRecompute mode : {MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_LAYER}) {
        const char *name = model_recompute_name(mode);
        CudaModel *other = cuda_model_create(cfg, max_rows, SEQ_LEN, mode);
        float *other_losses = (float *)xmalloc((size_t)T_dup * sizeof(float));
        const double other_fwd = cuda_model_forward(other, params_dev, &dup.batch, other_losses);
        const double other_loss = gpu_gradients(other, params_dev, grads_dev, grads_again, n,
                                                &dup.batch, loss_scale);
        printf("  recompute %s: arena %.1f MiB (mlp %.1f), loss %.9g\n", name,
               cuda_model_arena_bytes(other) / 1048576.0,
               cuda_model_arena_bytes(model) / 1048576.0, other_loss);
        EXPECT(other_loss == loss && other_fwd == fwd_loss,
               "recompute %s: loss %.9g (forward %.9g) vs %.9g", name, other_loss, other_fwd,
               loss);
        EXPECT(memcmp(other_losses, gpu_losses, (size_t)T_dup * sizeof(float)) == 0,
               "recompute %s: per-slot losses differ", name);
        size_t first = n;
        for (size_t i = 0; i < n && first == n; i++)
            if (memcmp(&grads[i], &grads_again[i], sizeof(float)) != 0) first = i;
        EXPECT(first == n, "recompute %s: gradient %zu is %.9g, mlp's %.9g", name, first,
               first < n ? grads_again[first] : 0.0f, first < n ? grads[first] : 0.0f);
        const bool more = mode == MODEL_RECOMPUTE_NONE;
        EXPECT(more ? cuda_model_arena_bytes(other) > cuda_model_arena_bytes(model)
                    : cuda_model_arena_bytes(other) < cuda_model_arena_bytes(model),
               "recompute %s takes %s memory than mlp (%zu vs %zu bytes)", name,
               more ? "more" : "less", cuda_model_arena_bytes(other),
               cuda_model_arena_bytes(model));
        // A second step on the same model: the layer blocks it refilled last step hold
        // nothing this step depends on.
        gpu_gradients(other, params_dev, grads_dev, grads_again, n, &dup.batch, loss_scale);
        EXPECT(memcmp(grads, grads_again, n * sizeof(float)) == 0,
               "recompute %s: a second step's gradients differ", name);
        free(other_losses);
        cuda_model_free(other);
    }

    // The MLP in tiles of 200 tokens (the last one partial; the arena's tile holds the
    // whole micro-batch here): the same losses and gradients up to the order of the weight
    // gradients' sums and the products' shapes; and the layer mode's, with the same tiles,
    // bitwise the tiled mlp model's.
    {
        cuda_model_set_mlp_tile_rows(model, 200);
        float *tiled = (float *)xmalloc(n * sizeof(float));
        const double tiled_loss = gpu_gradients(model, params_dev, grads_dev, tiled, n,
                                                &dup.batch, loss_scale);
        printf("  MLP in tiles of 200 tokens (%d in all): loss %.9g vs %.9g\n", T_dup,
               tiled_loss, loss);
        EXPECT(T_dup > 400 && fabs(tiled_loss - loss) <= 1e-3 * fabs(loss),
               "MLP tiles: loss %.9g vs %.9g (%d tokens)", tiled_loss, loss, T_dup);
        double tiled_worst = 1.0;
        for (int i = 0; i < table.n_tensors; i++) {
            const ParamTensor *p = &table.tensors[i];
            tiled_worst = fmin(tiled_worst,
                               test_cosine(tiled + p->offset, grads + p->offset, p->numel));
        }
        EXPECT(tiled_worst >= 0.999, "MLP tiles: gradients at cosine %.6f", tiled_worst);
        CudaModel *layer = cuda_model_create(cfg, max_rows, SEQ_LEN, MODEL_RECOMPUTE_LAYER);
        cuda_model_set_mlp_tile_rows(layer, 200);
        const double layer_loss = gpu_gradients(layer, params_dev, grads_dev, grads_again, n,
                                                &dup.batch, loss_scale);
        EXPECT(layer_loss == tiled_loss && memcmp(tiled, grads_again, n * sizeof(float)) == 0,
               "MLP tiles: the layer mode's loss %.9g or gradients differ from mlp's (%.9g)",
               layer_loss, tiled_loss);
        cuda_model_free(layer);
        cuda_model_set_mlp_tile_rows(model, INT_MAX);
        free(tiled);
    }

    // Accumulation: a second call on the same buffer adds the same gradient again.
    cuda_model_forward_backward(model, params_dev, grads_dev, &dup.batch, loss_scale);
    cudaCheck(cudaMemcpy(grads_again, grads_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    double accumulate_err = 0.0;
    for (size_t i = 0; i < n; i++)
        accumulate_err = fmax(accumulate_err, fabs(grads_again[i] - 2.0 * grads[i]));
    EXPECT(accumulate_err <= 1e-5 * test_max_abs(grads, n), "second call doubles: off by %g (max %g)",
          accumulate_err, test_max_abs(grads, n));

    // The loss head in chunks of 100 target rows (the arena's chunk holds them all here):
    // the same losses and gradients up to the order of the LM head's fp32 sums.
    cuda_model_set_logit_chunk_rows(model, 100);
    const double chunked_loss = gpu_gradients(model, params_dev, grads_dev, grads_again, n,
                                              &dup.batch, loss_scale);
    cuda_model_set_logit_chunk_rows(model, INT_MAX);
    printf("  loss head in chunks of 100 rows: loss %.9g vs %.9g in one chunk\n", chunked_loss,
           loss);
    EXPECT(fabs(chunked_loss - loss) <= 1e-4 * fabs(loss), "chunked loss %.9g vs %.9g",
           chunked_loss, loss);
    double chunked_worst = 1.0;
    for (int i = 0; i < table.n_tensors; i++) {
        const ParamTensor *p = &table.tensors[i];
        chunked_worst = fmin(chunked_worst, test_cosine(grads_again + p->offset,
                                                        grads + p->offset, p->numel));
    }
    EXPECT(chunked_worst >= 0.9999, "chunked loss head gradients at cosine %.6f", chunked_worst);

    // Atomic dQ mode: the same forward, gradients within bf16 noise.
    cuda_model_set_deterministic(model, false);
    const double atomic_loss = gpu_gradients(model, params_dev, grads_dev, grads_again, n,
                                             &dup.batch, loss_scale);
    cuda_model_set_deterministic(model, true);
    EXPECT(atomic_loss == loss, "atomic mode loss %.9g vs %.9g", atomic_loss, loss);
    EXPECT(all_finite(grads_again, n), "atomic mode gradients finite");
    double atomic_worst = 1.0;
    for (int i = 0; i < table.n_tensors; i++) {
        const ParamTensor *p = &table.tensors[i];
        atomic_worst = fmin(atomic_worst, test_cosine(grads_again + p->offset, grads + p->offset,
                                                 p->numel));
    }
    EXPECT(atomic_worst >= 0.999, "atomic dQ mode gradients at cosine %.6f", atomic_worst);

    // ---- parity on the GPU: duplicate against npass
    const double npass_loss = gpu_gradients(model, params_dev, grads_dev, grads_again, n,
                                            &npass.batch, loss_scale);
    printf("  parity: duplicate %.6f npass %.6f (relative %.2e)\n", loss, npass_loss,
           fabs(loss - npass_loss) / fabs(npass_loss));
    EXPECT(fabs(loss - npass_loss) <= 5e-3 * fabs(npass_loss), "duplicate loss %.6f vs npass %.6f",
          loss, npass_loss);
    EXPECT(all_finite(grads_again, n), "npass gradients finite");
    compare_gradients("duplicate vs npass", &table, grads, grads_again, 0.999);

    // The comparison can fail: mask_only (inexact once history answers followed their
    // thinking, conversation 0) is caught by the same gradient threshold.
    float *mask_only_grads = (float *)xmalloc(n * sizeof(float));
    gpu_gradients(model, params_dev, grads_dev, mask_only_grads, n, &mask_only.batch, loss_scale);
    double mask_only_worst = 1.0;
    for (int i = 0; i < table.n_tensors; i++) {
        const ParamTensor *p = &table.tensors[i];
        mask_only_worst = fmin(mask_only_worst, test_cosine(mask_only_grads + p->offset,
                                                       grads_again + p->offset, p->numel));
    }
    printf("  mask_only vs npass: worst cosine %.6f (must fail the 0.999 threshold)\n",
           mask_only_worst);
    EXPECT(mask_only_worst < 0.999, "mask_only passed as npass (worst cosine %.6f)",
          mask_only_worst);
    free(mask_only_grads);

    cuda_model_free(model);
    cudaCheck(cudaFree(params_dev));
    cudaCheck(cudaFree(grads_dev));
    free(params_host), free(cpu_losses), free(cpu_grads), free(gpu_losses), free(grads);
    free(grads_again);
    packed_batch_free(&dup);
    packed_batch_free(&npass);
    packed_batch_free(&mask_only);
    for (int s = 0; s < N_CONVERSATIONS; s++) tokenized_sample_free(&samples[s]);
    param_table_free(&table);
}

// Holds its stream for ns nanoseconds of the GPU's global timer.
__global__ void hold_kernel(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// A grads_ready callback that holds the copy stream (ctx) 10 ms more at each part.
static void hold_copies(void *ctx, size_t, cudaStream_t) {
    hold_kernel<<<1, 1, 0, (cudaStream_t)ctx>>>(10000000ull);
    cudaCheck(cudaGetLastError());
}

// Bitwise equal float arrays; the first difference printed.
static bool same_floats(const char *what, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            printf("  %s: element %zu is %.9g, want %.9g\n", what, i, got[i], want[i]);
            return false;
        }
    return true;
}

// train.offload_activations against recompute layer alone, the same kernels on the same
// inputs: every loss and gradient bitwise equal, step after step.
static void run_offload(const char *label, const ModelConfig *cfg) {
    printf("offload %s: L=%d C=%d head_dim=%d\n", label, cfg->num_hidden_layers,
           cfg->hidden_size, model_dims(cfg).head_dim);
    ParamTable table;
    param_table_build(cfg, &table);
    const size_t n = table.total;
    float *params_host = (float *)xmalloc(n * sizeof(float));
    params_init(cfg, &table, test_rng_next(&rng), params_host);
    __nv_bfloat16 *params_dev = upload_bf16(params_host, n);
    float *grads_dev;
    cudaCheck(cudaMalloc(&grads_dev, n * sizeof(float)));

    TokenizedSample samples[N_CONVERSATIONS];
    for (int s = 0; s < N_CONVERSATIONS; s++)
        samples[s] = random_conversation(cfg->vocab_size, s + 1, s == 0);
    PackedBatch dup, npass;
    pack_layout(LAYOUT_DUPLICATE, samples, N_CONVERSATIONS, &dup);
    pack_layout(LAYOUT_NPASS, samples, N_CONVERSATIONS, &npass);
    const int max_rows = dup.rows.n_rows > npass.rows.n_rows ? dup.rows.n_rows : npass.rows.n_rows;
    // duplicate's first row alone: a micro-batch below the arena's rows copies less.
    AttnMask one_mask;
    attn_mask_build(dup.rows.lo, dup.rows.hi, 1, SEQ_LEN, ATTN_TILE, ATTN_TILE, &one_mask);
    const ModelBatch one_row = {1, SEQ_LEN, dup.rows.token, dup.rows.target, dup.rows.pos,
                                &one_mask};
    const float loss_scale = 1.0f / (float)dup.n_targets;

    CudaModel *layer = cuda_model_create(cfg, max_rows, SEQ_LEN, MODEL_RECOMPUTE_LAYER);
    CudaModel *off = cuda_model_create_offload(cfg, max_rows, SEQ_LEN, MODEL_RECOMPUTE_LAYER, true);
    const size_t residual = ((size_t)max_rows * SEQ_LEN * cfg->hidden_size * 2 + 255) / 256 * 256;
    printf("  arena %.1f MiB offloaded, %.1f MiB layer\n", cuda_model_arena_bytes(off) / 1048576.0,
           cuda_model_arena_bytes(layer) / 1048576.0);
    EXPECT(cuda_model_arena_bytes(layer) - cuda_model_arena_bytes(off) ==
               (size_t)(cfg->num_hidden_layers - 3) * residual,
           "offloaded arena %zu bytes, layer's %zu: %d residuals of %zu apart",
           cuda_model_arena_bytes(off), cuda_model_arena_bytes(layer), cfg->num_hidden_layers - 3,
           residual);

    float *want = (float *)xmalloc(n * sizeof(float)), *got = (float *)xmalloc(n * sizeof(float));
    const int T_max = max_rows * SEQ_LEN;
    float *want_losses = (float *)xmalloc((size_t)T_max * sizeof(float));
    float *got_losses = (float *)xmalloc((size_t)T_max * sizeof(float));
    // Steps: duplicate, its first row, npass, duplicate again, each after a forward-only
    // call on the next batch.
    const ModelBatch *steps[] = {&dup.batch, &one_row, &npass.batch, &dup.batch};
    for (int i = 0; i < 4; i++) {
        const ModelBatch *b = steps[i], *other = steps[(i + 1) % 4];
        const double want_fwd = cuda_model_forward(layer, params_dev, other, want_losses);
        const double got_fwd = cuda_model_forward(off, params_dev, other, got_losses);
        const size_t T_other = (size_t)other->n_rows * SEQ_LEN;
        EXPECT(got_fwd == want_fwd && same_floats("forward-only losses", got_losses, want_losses,
                                                  T_other),
               "step %d: forward-only loss %.9g vs %.9g", i, got_fwd, want_fwd);
        const double want_loss = gpu_gradients(layer, params_dev, grads_dev, want, n, b,
                                               loss_scale);
        const double got_loss = gpu_gradients(off, params_dev, grads_dev, got, n, b, loss_scale);
        printf("  step %d (%d rows): loss %.9g offloaded, %.9g layer\n", i, b->n_rows, got_loss,
               want_loss);
        EXPECT(got_loss == want_loss && got_loss > 0,
               "step %d: offloaded loss %.9g vs layer %.9g", i, got_loss, want_loss);
        EXPECT(all_finite(got, n) && same_floats("gradients", got, want, n),
               "step %d (%d rows): offloaded gradients differ from layer's", i, b->n_rows);
    }
    check_grads_ready(off, cfg, params_dev, grads_dev, n, &dup.batch, loss_scale);
    // Slow copies: the copy stream held before the forward (its copies out start late) and
    // at each part of the backward (its copies back too): the waits keep the bits.
    {
        cudaStream_t copies = cuda_model_copy_stream(off);
        EXPECT(copies != nullptr && cuda_model_copy_stream(layer) == nullptr,
               "the offloaded model has a copy stream, layer's none");
        if (copies) {
            gpu_gradients(layer, params_dev, grads_dev, want, n, &npass.batch, loss_scale);
            cuda_model_set_grads_ready(off, hold_copies, copies);
            hold_kernel<<<1, 1, 0, copies>>>(10000000ull);
            cudaCheck(cudaGetLastError());
            gpu_gradients(off, params_dev, grads_dev, got, n, &npass.batch, loss_scale);
            cuda_model_set_grads_ready(off, NULL, NULL);
            EXPECT(same_floats("gradients with slow copies", got, want, n),
                   "copies held back: offloaded gradients differ from layer's");
        }
    }
    // A micro-batch without targets: no backward, the next step as before.
    {
        ModelBatch empty = dup.batch;
        int32_t *no_target = (int32_t *)xmalloc((size_t)dup.rows.n_rows * SEQ_LEN * sizeof(int32_t));
        for (int t = 0; t < dup.rows.n_rows * SEQ_LEN; t++) no_target[t] = -1;
        empty.target = no_target;
        EXPECT(cuda_model_forward_backward(off, params_dev, grads_dev, &empty, loss_scale) == 0.0,
               "no targets: loss 0");
        gpu_gradients(off, params_dev, grads_dev, got, n, &npass.batch, loss_scale);
        gpu_gradients(layer, params_dev, grads_dev, want, n, &npass.batch, loss_scale);
        EXPECT(same_floats("gradients after an empty step", got, want, n),
               "after a micro-batch without targets: offloaded gradients differ");
        free(no_target);
    }
    cuda_model_free(off);
    cuda_model_free(layer);
    cudaCheck(cudaFree(params_dev));
    cudaCheck(cudaFree(grads_dev));
    free(params_host), free(want), free(got), free(want_losses), free(got_losses);
    attn_mask_free(&one_mask);
    packed_batch_free(&dup);
    packed_batch_free(&npass);
    for (int s = 0; s < N_CONVERSATIONS; s++) tokenized_sample_free(&samples[s]);
    param_table_free(&table);
}

// V = 512, 2 layers, 4 query heads sharing 2 KV heads (GQA).
static ModelConfig tiny_config(int hidden, int intermediate, bool tied) {
    ModelConfig c = test_model_config(512, hidden, intermediate, 2, 4, 2);
    c.tie_word_embeddings = tied;
    return c;
}

int main(void) {
    SKIP_WITHOUT_CUDA_DEVICE();
    rng = test_rng_from_env();
    ops_cuda_init(MAX_ROWS * SEQ_LEN, MAX_CHANNELS);
    const ModelConfig head64 = tiny_config(256, 512, false);    // 4 heads of 64
    const ModelConfig head128 = tiny_config(512, 1024, true);   // 4 heads of 128
    run_config("head_dim 64", &head64);
    run_config("head_dim 128", &head128);
    ModelConfig qwen2 = head64;  // Qwen2: q/k/v biases
    qwen2.attention_bias = true, qwen2.arch = ARCH_QWEN2;
    run_config("qwen2 q/k/v bias, head_dim 64", &qwen2);
    ModelConfig llama3 = head128;  // Llama 3: scaled RoPE (positions < 512: original 256)
    llama3.rope_theta = 500000.0f;
    const RopeScaling llama3_scaling = {ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 256};
    llama3.rope_scaling = llama3_scaling;
    run_config("llama3 rope scaling, head_dim 128", &llama3);
    ModelConfig decoupled = head64;  // head_dim 128 with hidden 256 / 4 heads: q_dim 512
    decoupled.head_dim = 128;
    run_config("explicit head_dim 128 != hidden / heads", &decoupled);
    ModelConfig qwen3 = decoupled;  // Qwen3: q_norm/k_norm, head_dim 128 != 256 / 4, tied
    qwen3.qk_norm = true, qwen3.arch = ARCH_QWEN3, qwen3.tie_word_embeddings = true;
    run_config("qwen3 q_norm/k_norm, head_dim 128, tied", &qwen3);
    ModelConfig deep = head64;  // 6 layers: 3 inputs go to the host
    deep.num_hidden_layers = 6;
    run_offload("head_dim 64", &deep);
    ModelConfig deep_qwen3 = qwen3;
    deep_qwen3.num_hidden_layers = 6;
    run_offload("qwen3 q_norm/k_norm", &deep_qwen3);
    ops_cuda_destroy();
    return test_finish();
}
