// LoRA on the GPU against its oracle, the CPU fp32 model with the same adapters
// (model/lora.h), both on the SAME bf16-rounded base and adapter weights, on two packed
// rows (causal documents, restarting positions, padding):
//  - the model (cuda_model_set_lora, base frozen: NULL base gradients): loss within 1e-2
//    relative, every adapter gradient tensor at cosine >= 0.99 against the CPU's, on every
//    projection, for head_dim 64 and Qwen3's q/k norms with head_dim 128; a forward-only
//    call gives forward_backward's loss; a second call adds the same gradients again;
//    recompute layer gives bitwise mlp's adapter gradients;
//  - the ops: lora_forward_cuda / lora_backward_cuda on a group of three adapters writing
//    column ranges of wider rows (as the stacked q|k|v) against lora_forward_cpu /
//    lora_backward_cpu, the columns outside the members' untouched;
//  - the backend (BackendSetup.lora): three AdamW steps on the cuda and the cpu backends
//    from the same state give adapters within 2e-2 relative of each other, and the
//    adapters moved (B was zero at init).
#include "model/model_cuda.h"
#include <math.h>
#include <string.h>
#include "common/cuda_check.h"
#include "model/lora_cuda.h"
#include "model/ops_cuda.h"
#include "tests/test_cuda_util.cuh"
#include "tests/test_util.h"
#include "trainer/backend_cuda.h"
extern "C" {  // plain C headers without guards of their own
#include "trainer/backend_registry.h"
}

enum { ROWS = 2, SEQ = 256, T = ROWS * SEQ, MAX_CHANNELS = 512 };

static TestRng rng;

typedef struct {
    int32_t token[T], target[T], pos[T], lo[T], hi[T];
} Batch;

// Row 0: documents of 100 and 120 tokens, then padding; row 1: one of 200, then padding.
static void build_batch(Batch *b, int V) {
    for (int t = 0; t < T; t++) {
        b->token[t] = test_rng_int(&rng, 0, V - 1);
        b->target[t] = -1, b->pos[t] = 0, b->lo[t] = b->hi[t] = t % SEQ;
    }
    const int docs[3][3] = {{0, 0, 100}, {0, 100, 220}, {1, 0, 200}};
    for (int d = 0; d < 3; d++)
        for (int s = docs[d][1]; s < docs[d][2]; s++) {
            const int slot = docs[d][0] * SEQ + s;
            b->pos[slot] = s - docs[d][1];
            b->lo[slot] = s, b->hi[slot] = docs[d][2];
            if (s + 1 < docs[d][2]) b->target[slot] = test_rng_int(&rng, 0, V - 1);
        }
}

static double rel_diff(const float *got, const float *want, size_t n) {
    double worst = 0.0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        worst = fmax(worst, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    return worst / scale;
}

static void model_check(const char *label, ModelConfig cfg, const LoraConfig *lc) {
    printf("model: %s\n", label);
    ParamTable table;
    param_table_build(&cfg, &table);
    LoraLayout l;
    lora_layout_build(&cfg, lc, &l);
    const size_t n = table.total, na = l.table.total;
    float *params = (float *)xmalloc(n * sizeof(float));
    params_init(&cfg, &table, 5, params);
    for (int i = 0; i < table.n_tensors; i++) {  // norms away from 1, as trained ones are
        const ParamTensor *p = &table.tensors[i];
        if (p->is_norm || p->is_bias)
            for (size_t j = 0; j < p->numel; j++) params[p->offset + j] += 0.2f * test_rng_uniform(&rng);
    }
    float *adapter = (float *)xmalloc(na * sizeof(float));
    for (size_t j = 0; j < na; j++) adapter[j] = 0.05f * test_rng_uniform(&rng);
    round_bf16(params, n);
    round_bf16(adapter, na);

    Batch batch;
    build_batch(&batch, cfg.vocab_size);
    AttnMask mask;
    attn_mask_build(batch.lo, batch.hi, ROWS, SEQ, ATTN_TILE, ATTN_TILE, &mask);
    const ModelBatch mb = {ROWS, SEQ, batch.token, batch.target, batch.pos, &mask};
    int n_targets = 0;
    for (int t = 0; t < T; t++) n_targets += batch.target[t] >= 0;
    const float scale = 1.0f / n_targets;

    CpuModel *cpu = cpu_model_create(&cfg, ROWS, SEQ, MODEL_RECOMPUTE_NONE);
    float *cpu_grads = (float *)xcalloc(na, sizeof(float));
    cpu_model_set_lora(cpu, &l, adapter, cpu_grads);
    const double cpu_loss = cpu_model_forward_backward(cpu, params, NULL, &mb, scale);

    __nv_bfloat16 *base_dev = upload_bf16(params, n), *adapter_dev = upload_bf16(adapter, na);
    float *grads_dev;
    cudaCheck(cudaMalloc(&grads_dev, na * sizeof(float)));
    cudaCheck(cudaMemset(grads_dev, 0, na * sizeof(float)));
    CudaModel *gpu = cuda_model_create(&cfg, ROWS, SEQ, MODEL_RECOMPUTE_MLP);
    cuda_model_set_lora(gpu, &l, adapter_dev, grads_dev);
    const double loss = cuda_model_forward_backward(gpu, base_dev, NULL, &mb, scale);
    const double fwd = cuda_model_forward(gpu, base_dev, &mb, NULL);
    float *grads = (float *)xmalloc(na * sizeof(float));
    cudaCheck(cudaMemcpy(grads, grads_dev, na * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(isfinite(loss) && fabs(loss - cpu_loss) <= 1e-2 * fabs(cpu_loss),
           "%s: loss %.6g vs cpu %.6g", label, loss, cpu_loss);
    EXPECT(fwd == loss, "%s: forward-only loss %.9g vs %.9g", label, fwd, loss);
    double worst = 1.0;
    for (int i = 0; i < l.table.n_tensors; i++) {
        const ParamTensor *p = &l.table.tensors[i];
        const double c = test_cosine(grads + p->offset, cpu_grads + p->offset, p->numel);
        worst = fmin(worst, c);
        EXPECT(c >= 0.99, "%s: %s at cosine %.6f", label, p->name, c);
    }
    printf("  adapter gradients: worst cosine %.6f, loss %.6g vs cpu %.6g\n", worst, loss, cpu_loss);

    // A second call adds the same gradients again.
    cuda_model_forward_backward(gpu, base_dev, NULL, &mb, scale);
    float *twice = (float *)xmalloc(na * sizeof(float));
    cudaCheck(cudaMemcpy(twice, grads_dev, na * sizeof(float), cudaMemcpyDeviceToHost));
    double acc = 0.0, top = 1e-30;
    for (size_t i = 0; i < na; i++)
        acc = fmax(acc, fabs(twice[i] - 2.0 * grads[i])), top = fmax(top, fabs(grads[i]));
    EXPECT(acc <= 1e-5 * top, "%s: a second call is off the double by %g", label, acc / top);

    // recompute layer: bitwise mlp's adapter gradients.
    CudaModel *layer = cuda_model_create(&cfg, ROWS, SEQ, MODEL_RECOMPUTE_LAYER);
    cuda_model_set_lora(layer, &l, adapter_dev, grads_dev);
    cudaCheck(cudaMemset(grads_dev, 0, na * sizeof(float)));
    const double layer_loss = cuda_model_forward_backward(layer, base_dev, NULL, &mb, scale);
    cudaCheck(cudaMemcpy(twice, grads_dev, na * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(layer_loss == loss && memcmp(twice, grads, na * sizeof(float)) == 0,
           "%s: recompute layer differs from mlp", label);

    cuda_model_free(layer);
    cuda_model_free(gpu);
    cpu_model_free(cpu);
    cudaCheck(cudaFree(base_dev));
    cudaCheck(cudaFree(adapter_dev));
    cudaCheck(cudaFree(grads_dev));
    attn_mask_free(&mask);
    free(params), free(adapter), free(cpu_grads), free(grads), free(twice);
    lora_layout_free(&l);
    param_table_free(&table);
}

// The ops on a group of three adapters with stacked A's whose members write column
// ranges of wider rows with gaps between them (as q, v of the stacked q|k|v without k).
static void ops_check(void) {
    const int TT = 200, IC = 128, R = 16, LD = 256;
    LoraGroup g;
    memset(&g, 0, sizeof g);
    g.n = 3, g.in = IC, g.r = R, g.scale = 2.0f, g.a = 0;
    const int outs[3] = {64, 32, 64}, cols[3] = {0, 96, 160};
    size_t na = (size_t)3 * R * IC;
    for (int j = 0; j < 3; j++) {
        g.out[j] = outs[j], g.col[j] = cols[j], g.b[j] = na;
        na += (size_t)outs[j] * R;
    }
    const size_t nx = (size_t)TT * IC, nout = (size_t)TT * LD, nu = (size_t)TT * 3 * R;
    float *x = (float *)xmalloc(nx * 4), *adapter = (float *)xmalloc(na * 4);
    float *out = (float *)xmalloc(nout * 4), *dout = (float *)xmalloc(nout * 4);
    for (size_t i = 0; i < nx; i++) x[i] = test_rng_uniform(&rng);
    for (size_t i = 0; i < na; i++) adapter[i] = 0.1f * test_rng_uniform(&rng);
    for (size_t i = 0; i < nout; i++) out[i] = test_rng_uniform(&rng), dout[i] = test_rng_uniform(&rng);
    round_bf16(x, nx), round_bf16(adapter, na), round_bf16(out, nout), round_bf16(dout, nout);
    // CPU oracle
    float *u = (float *)xmalloc(nu * 4), *du = (float *)xmalloc(nu * 4);
    float *want_out = (float *)xmalloc(nout * 4);
    memcpy(want_out, out, nout * 4);
    lora_forward_cpu(want_out, LD, u, x, adapter, &g, TT);
    float *dgrads = (float *)xcalloc(na, 4), *dx = (float *)xcalloc(nx, 4);
    __nv_bfloat16 *dx_d = upload_bf16(dx, nx);  // zeros, before the oracle adds into dx
    lora_backward_cpu(dx, dgrads, u, du, dout, LD, x, adapter, &g, TT);
    // GPU
    __nv_bfloat16 *x_d = upload_bf16(x, nx), *adapter_d = upload_bf16(adapter, na);
    __nv_bfloat16 *out_d = upload_bf16(out, nout), *dout_d = upload_bf16(dout, nout);
    __nv_bfloat16 *u_d, *du_d;
    float *grads_d;
    cudaCheck(cudaMalloc(&u_d, nu * 2));
    cudaCheck(cudaMalloc(&du_d, nu * 2));
    cudaCheck(cudaMalloc(&grads_d, na * 4));
    cudaCheck(cudaMemset(grads_d, 0, na * 4));
    lora_forward_cuda(out_d, LD, u_d, x_d, adapter_d, &g, TT, 0);
    lora_backward_cuda(dx_d, grads_d, u_d, du_d, dout_d, LD, x_d, adapter_d, &g, TT, 0);
    float *got_out = (float *)xmalloc(nout * 4), *got_dx = (float *)xmalloc(nx * 4);
    float *f32;
    cudaCheck(cudaMalloc(&f32, (nout > nx ? nout : nx) * 4));
    bf16_to_float_cuda(f32, out_d, (int64_t)nout, 0);
    cudaCheck(cudaMemcpy(got_out, f32, nout * 4, cudaMemcpyDeviceToHost));
    bf16_to_float_cuda(f32, dx_d, (int64_t)nx, 0);
    cudaCheck(cudaMemcpy(got_dx, f32, nx * 4, cudaMemcpyDeviceToHost));
    float *got_grads = (float *)xmalloc(na * 4);
    cudaCheck(cudaMemcpy(got_grads, grads_d, na * 4, cudaMemcpyDeviceToHost));
    // The columns between and after the members' are untouched, bit for bit.
    bool outside = true;
    for (int t = 0; t < TT; t++)
        for (int c = 0; c < LD; c++) {
            bool member = false;
            for (int j = 0; j < 3; j++) member |= c >= cols[j] && c < cols[j] + outs[j];
            if (!member) outside &= got_out[(size_t)t * LD + c] == out[(size_t)t * LD + c];
        }
    EXPECT(outside, "lora_forward_cuda wrote outside its members' columns");
    const double e_out = rel_diff(got_out, want_out, nout), e_dx = rel_diff(got_dx, dx, nx);
    const size_t nA = (size_t)3 * R * IC;
    const double e_dA = rel_diff(got_grads, dgrads, nA);
    double e_dB = 0.0;
    for (int j = 0; j < 3; j++)
        e_dB = fmax(e_dB, rel_diff(got_grads + g.b[j], dgrads + g.b[j], (size_t)outs[j] * R));
    printf("ops (a group of 3): out %.3g, dx %.3g, dA %.3g, dB %.3g (relative to the largest)\n",
           e_out, e_dx, e_dA, e_dB);
    EXPECT(e_out < 1e-2 && e_dx < 2e-2 && e_dA < 2e-2 && e_dB < 2e-2,
           "lora ops against the cpu: out %.3g dx %.3g dA %.3g dB %.3g", e_out, e_dx, e_dA, e_dB);
    free(x), free(adapter), free(out), free(dout), free(u), free(du), free(want_out);
    free(dgrads), free(dx), free(got_out), free(got_dx), free(got_grads);
    void *device[] = {x_d, adapter_d, out_d, dout_d, dx_d, u_d, du_d, grads_d, f32};
    for (void *p : device) cudaCheck(cudaFree(p));
}

// Three AdamW steps of each backend from the same state.
static void backend_check(ModelConfig cfg, const LoraConfig *lc) {
    ParamTable table;
    param_table_build(&cfg, &table);
    LoraLayout l;
    lora_layout_build(&cfg, lc, &l);
    float *base = (float *)xmalloc(table.total * sizeof(float));
    params_init(&cfg, &table, 9, base);
    round_bf16(base, table.total);
    float *adapter = (float *)xmalloc(l.table.total * sizeof(float));
    lora_init(&l, 3, adapter);
    round_bf16(adapter, l.table.total);  // the GPU's split halves then hold it exactly
    Batch batch;
    build_batch(&batch, cfg.vocab_size);
    AttnMask mask;
    attn_mask_build(batch.lo, batch.hi, ROWS, SEQ, ATTN_TILE, ATTN_TILE, &mask);
    const ModelBatch mb = {ROWS, SEQ, batch.token, batch.target, batch.pos, &mask};
    int n_targets = 0;
    for (int t = 0; t < T; t++) n_targets += batch.target[t] >= 0;
    BackendSetup setup;  // C++17: no designated initializers
    memset(&setup, 0, sizeof setup);
    setup.mc = &cfg, setup.table = &l.table, setup.micro_rows = ROWS, setup.seq_len = SEQ;
    setup.deterministic = true, setup.recompute = MODEL_RECOMPUTE_MLP;
    setup.lora = &l, setup.base_table = &table, setup.base_params = base;
    AdamWHyper h;
    memset(&h, 0, sizeof h);
    // eps far above the gradients makes each update ~ lr g: with a small eps AdamW's
    // first steps are lr sign(g), and the bf16 noise flips the sign of tiny gradients.
    h.lr = 1.0f, h.beta1 = 0.9f, h.beta2 = 0.95f, h.eps = 1.0f, h.weight_decay = 0.01f;
    float *result[2];
    const TrainBackendOps *ops[2] = {backend_ops(BACKEND_CPU), cuda_train_backend()};
    for (int b = 0; b < 2; b++) {
        void *state = ops[b]->create(&setup);
        AdamWState opt;
        adamw_init(&opt, l.table.total);
        ops[b]->set_state(state, adapter, &opt);
        for (int step = 0; step < 3; step++) {
            ops[b]->zero_grads(state);
            ops[b]->forward_backward(state, &mb, 1.0f / n_targets);
            const double norm = ops[b]->grad_norm(state);
            ops[b]->optimizer_step(state, &h, norm, 1.0);
        }
        result[b] = (float *)xmalloc(l.table.total * sizeof(float));
        ops[b]->get_state(state, result[b], &opt);
        ops[b]->destroy(state);
        adamw_free(&opt);
    }
    const double moved = rel_diff(result[0], adapter, l.table.total);
    const double e = rel_diff(result[1], result[0], l.table.total);
    printf("backend: 3 steps, cuda vs cpu adapters %.3g (moved %.3g)\n", e, moved);
    EXPECT(moved > 1e-3 && e < 2e-2, "backends: adapters differ by %.3g (moved %.3g)", e, moved);
    free(result[0]), free(result[1]), free(base), free(adapter);
    attn_mask_free(&mask);
    lora_layout_free(&l);
    param_table_free(&table);
}

static LoraConfig lora_config(int r, double alpha, bool rslora, const char *targets) {
    LoraConfig c;
    memset(&c, 0, sizeof c);
    c.r = r, c.alpha = alpha, c.rslora = rslora;
    for (int t = 0; t < LORA_TARGETS; t++) c.target[t] = strchr(targets, "qkvoGUD"[t]) != NULL;
    return c;
}

static ModelConfig base_config(void) {
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 300, c.hidden_size = 128, c.intermediate_size = 256, c.num_hidden_layers = 2;
    c.num_attention_heads = 2, c.num_key_value_heads = 1, c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    return c;
}

int main(void) {
    SKIP_WITHOUT_CUDA_DEVICE();
    rng = test_rng_from_env();
    ops_cuda_init(T, MAX_CHANNELS);
    ops_check();
    const ModelConfig d64 = base_config();  // head_dim 64, untied
    const LoraConfig all = lora_config(16, 32, false, "qkvoGUD");
    model_check("head_dim 64, every projection", d64, &all);
    ModelConfig qwen3 = d64;
    qwen3.qk_norm = true, qwen3.head_dim = 128, qwen3.arch = ARCH_QWEN3;
    qwen3.tie_word_embeddings = true;
    const LoraConfig some = lora_config(8, 16, true, "qvUD");
    model_check("qwen3 q/k norms, head_dim 128, q v up down under rslora", qwen3, &some);
    ModelConfig qwen2 = d64;
    qwen2.attention_bias = true, qwen2.arch = ARCH_QWEN2;
    model_check("qwen2 biases, every projection", qwen2, &all);
    ops_cuda_destroy();
    backend_check(d64, &all);
    return test_finish();
}
