// The CUDA training backend (trainer/backend_cuda.cu) through the backend interface, on
// packed rows of the synthetic data set (duplicate layout, 2 micro-batches), a model
// with head_dim 64, GQA and an untied head. Oracles are independent of the code under
// test: the CPU backend (fp32, on the same bf16-rounded weights) and trainer/adamw_cpu.c's
// AdamW applied on the host to the GPU's own gradients.
//  - set_state / get_state round-trip bit for bit (weights, m, v, step), also for -0,
//    denormals, bf16 ties, FLT_MAX and +-inf (the master is split into the bf16
//    weights and low halves on the way, trainer/split_float.h);
//  - loss within 1e-2 relative and every gradient tensor at cosine >= 0.99 vs the CPU;
//  - the gradient norm equals the host norm of the downloaded gradients; the clipped
//    AdamW update (per-tensor weight decay, bias correction at a random step) matches
//    the host's to 1e-5 and the bf16 weights the model runs on follow the master;
//  - deterministic mode: gradients bitwise identical run to run;
//  - eval forward: per-position losses close to the CPU's, their sum equal to the
//    forward+backward loss; a NaN planted in one tensor is found and named;
//  - steps after the first allocate no device memory;
//  - backend "auto" picks cuda for this model and cpu (with the reason) for head_dim 16.
#include "trainer/backend_cuda.h"
extern "C" {  // plain C headers without guards of their own
#include "trainer/backend_registry.h"
#include "trainer/data_options.h"
#include "trainer/setup.h"
#include "trainer/step.h"
}
#include <math.h>
#include <string.h>
#include "common/cuda_check.h"
#include "tests/test_util.h"
#include "tests/test_train_fixture.cuh"
#include "trainer/split_float.h"

enum { SEQ_LEN = 1024, MICRO_ROWS = 2, N_CONVERSATIONS = 10 };

// The bf16 weights the GPU runs on for fp32 master weights x, as floats.
static void gpu_weights(const float *x, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], sizeof b);
        b = (uint32_t)split_float_hi(b) << 16;
        memcpy(&out[i], &b, sizeof b);
    }
}

static size_t worst_index(const float *got, const float *want, size_t n, double abs_floor,
                          double *worst) {
    size_t at = 0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) + abs_floor);
        if (!(e <= *worst)) {  // NaN counts as the worst
            *worst = isnan(e) ? INFINITY : e;
            at = i;
        }
    }
    return at;
}

int main(void) {
    char device[256];
    if (cuda_device_count(device, sizeof device) == 0) {
        printf("SKIP: no CUDA device\n");
        return EXIT_SKIP;
    }
    TestRng rng = test_rng_from_env();
    TrainFixture fx;
    train_fixture_load(&fx, &rng, SEQ_LEN, MICRO_ROWS, N_CONVERSATIONS, 256);
    const ModelConfig &mc = fx.mc;
    const MicroBatches &micro = fx.micro;
    const ParamTable &table = fx.table;
    const size_t n = fx.n;
    float *params = fx.params;
    AdamWState &opt = fx.opt;
    EXPECT(micro.n_micro >= 2, "the batch spans %d micro-batches (want >= 2)", micro.n_micro);
    const long long trained = fx.trained;
    const float loss_scale = (float)(1.0 / (double)trained);

    const TrainBackendOps *gpu = cuda_train_backend(), *cpu = backend_ops(BACKEND_CPU);
    const BackendSetup setup = {&mc, &table, MICRO_ROWS, SEQ_LEN, true,
                                MODEL_RECOMPUTE_MLP, nullptr, nullptr, nullptr, false, false,
                                nullptr, nullptr, nullptr};
    void *g = gpu->create(&setup), *c = cpu->create(&setup);

    // Round trip.
    gpu->set_state(g, params, &opt);
    float *back = (float *)xmalloc(n * sizeof(float));
    AdamWState opt_back;
    adamw_init(&opt_back, n);
    gpu->get_state(g, back, &opt_back);
    EXPECT(!memcmp(back, params, n * sizeof(float)) && !memcmp(opt_back.m, opt.m, n * sizeof(float)) &&
              !memcmp(opt_back.v, opt.v, n * sizeof(float)) && opt_back.step == opt.step,
          "set_state / get_state round-trip bit for bit");
    float *edges = (float *)xmalloc(n * sizeof(float));
    memcpy(edges, params, n * sizeof(float));
    const uint32_t edge_bits[] = {0x80000000, 0x00000001, 0x807FFFFF, 0x3C808000, 0xBC818000,
                                  0x3C80FFFF, 0x7F7FFFFF, 0x7F800000, 0xFF800000};
    for (size_t k = 0; k < sizeof edge_bits / sizeof edge_bits[0]; k++)
        memcpy(&edges[test_rng_int(&rng, 0, (int)n - 1)], &edge_bits[k], sizeof(float));
    gpu->set_state(g, edges, &opt);
    gpu->get_state(g, back, &opt_back);
    EXPECT(!memcmp(back, edges, n * sizeof(float)),
           "set_state / get_state round-trip bit for bit with edge values planted");
    free(edges);
    gpu->set_state(g, params, &opt);

    // Forward+backward against the CPU on the bf16-rounded weights.
    float *rounded = (float *)xmalloc(n * sizeof(float));
    gpu_weights(params, n, rounded);
    cpu->set_state(c, rounded, &opt);
    const double loss_gpu = train_step_forward_backward(gpu, g, &micro, loss_scale) / (double)trained;
    const double loss_cpu = train_step_forward_backward(cpu, c, &micro, loss_scale) / (double)trained;
    EXPECT(fabs(loss_gpu - loss_cpu) <= 1e-2 * fabs(loss_cpu), "loss %.6f vs CPU %.6f", loss_gpu,
          loss_cpu);
    float *grads = (float *)xmalloc(n * sizeof(float)), *grads_cpu = (float *)xmalloc(n * sizeof(float));
    gpu->get_grads(g, grads);
    cpu->get_grads(c, grads_cpu);
    int low_cosine = 0;
    for (int t = 0; t < table.n_tensors; t++) {
        const ParamTensor *pt = &table.tensors[t];
        const double cs = test_cosine(grads + pt->offset, grads_cpu + pt->offset, pt->numel);
        if (!(cs >= 0.99)) {
            low_cosine++;
            fprintf(stderr, "  %s: gradient cosine %.5f vs CPU\n", pt->name, cs);
        }
    }
    EXPECT(low_cosine == 0, "%d gradient tensors below cosine 0.99 vs the CPU", low_cosine);

    // Determinism.
    float *grads_again = (float *)xmalloc(n * sizeof(float));
    const double loss_again = train_step_forward_backward(gpu, g, &micro, loss_scale) / (double)trained;
    gpu->get_grads(g, grads_again);
    EXPECT(loss_again == loss_gpu && !memcmp(grads_again, grads, n * sizeof(float)),
          "deterministic mode: a second forward+backward is bitwise identical");

    // Norm, clipping and AdamW against trainer/adamw_cpu.c on the same gradients.
    const double norm = gpu->grad_norm(g), norm_host = grad_global_norm_cpu(grads, n);
    EXPECT(fabs(norm - norm_host) <= 1e-5 * norm_host, "grad norm %.8g vs host %.8g", norm, norm_host);
    EXPECT(gpu->first_nonfinite(g, true) == NULL, "finite gradients reported finite");
    AdamWHyper h = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, false, test_rng_int(&rng, 0, 1) == 1};
    const double max_norm = 0.5 * norm_host;  // forces clipping
    gpu->optimizer_step(g, &h, norm, max_norm);
    grad_clip_cpu(grads, n, norm_host, max_norm);
    adamw_step_cpu(&opt, &table, &h, params, grads);
    gpu->get_state(g, back, &opt_back);
    double worst_p, worst_m, worst_v;
    const size_t at_p = worst_index(back, params, n, h.lr, &worst_p);
    // Floors near the moments' scale (m ~1e-3, v ~1e-6): m = b1 m + (1 - b1) g cancels
    // to tiny values whose rounding error is relative to the inputs, not the result.
    worst_index(opt_back.m, opt.m, n, 1e-4, &worst_m);
    worst_index(opt_back.v, opt.v, n, 1e-7, &worst_v);
    EXPECT(opt_back.step == opt.step, "AdamW step %ld vs host %ld", opt_back.step, opt.step);
    EXPECT(worst_p <= 1e-5, "weights after AdamW: worst relative error %.3g at %zu (%.9g vs %.9g)",
          worst_p, at_p, back[at_p], params[at_p]);
    EXPECT(worst_m <= 1e-5 && worst_v <= 1e-5, "moments after AdamW: worst errors m %.3g v %.3g",
          worst_m, worst_v);

    // The bf16 weights follow the master: forward after the step == forward after a
    // fresh upload of the downloaded state.
    float *losses = (float *)xmalloc((size_t)fx.data.rows.n_rows * SEQ_LEN * sizeof(float));
    float *losses_ref = (float *)xmalloc((size_t)fx.data.rows.n_rows * SEQ_LEN * sizeof(float));
    const double eval_after_step = train_step_forward(gpu, g, &micro, losses);
    gpu->set_state(g, back, &opt_back);
    const double eval_uploaded = train_step_forward(gpu, g, &micro, NULL);
    EXPECT(eval_after_step == eval_uploaded, "bf16 weights updated in the step (%.9g vs %.9g)",
          eval_after_step, eval_uploaded);

    // Eval forward against the CPU, and against forward+backward's loss.
    gpu_weights(back, n, rounded);
    cpu->set_state(c, rounded, &opt_back);
    const double eval_cpu = train_step_forward(cpu, c, &micro, losses_ref);
    double diff = 0;
    for (size_t i = 0; i < (size_t)fx.data.rows.n_rows * SEQ_LEN; i++) diff += fabs(losses[i] - losses_ref[i]);
    diff /= (double)trained;
    EXPECT(fabs(eval_after_step - eval_cpu) <= 1e-2 * fabs(eval_cpu) && diff <= 3e-2,
          "eval: CE sum %.4f vs CPU %.4f, mean |per-position diff| %.4f", eval_after_step, eval_cpu,
          diff);
    const double fb = train_step_forward_backward(gpu, g, &micro, loss_scale);
    EXPECT(fabs(fb - eval_after_step) <= 1e-6 * fabs(fb), "forward %.9g vs forward+backward %.9g",
          eval_after_step, fb);

    // No device allocation after the first step.
    size_t used_before, used_after, total;
    for (int i = 0; i < 2; i++) {
        train_step_forward_backward(gpu, g, &micro, loss_scale);
        gpu->optimizer_step(g, &h, gpu->grad_norm(g), 1.0);
    }
    gpu->device_memory(&used_before, &total);
    for (int i = 0; i < 3; i++) {
        train_step_forward_backward(gpu, g, &micro, loss_scale);
        gpu->optimizer_step(g, &h, gpu->grad_norm(g), 1.0);
        gpu->first_nonfinite(g, false);
    }
    cudaCheck(cudaDeviceSynchronize());
    gpu->device_memory(&used_after, &total);
    EXPECT(used_after == used_before, "device memory in use %zu before 3 steps, %zu after",
          used_before, used_after);

    // A NaN in one tensor is named.
    gpu->get_state(g, back, &opt_back);
    EXPECT(gpu->first_nonfinite(g, false) == NULL, "finite weights reported finite");
    const int bad = test_rng_int(&rng, 0, table.n_tensors - 1);
    const ParamTensor *bt = &table.tensors[bad];
    back[bt->offset + (size_t)test_rng_int(&rng, 0, (int)bt->numel - 1)] = NAN;
    gpu->set_state(g, back, &opt_back);
    const char *found = gpu->first_nonfinite(g, false);
    EXPECT(found && !strcmp(found, bt->name), "NaN planted in %s, found in %s", bt->name,
          found ? found : "(none)");

    // Backend choice.
    char why[512];
    EXPECT(backend_choose("auto", &mc, why, sizeof why) == BACKEND_CUDA, "auto picks cuda: %s", why);
    ModelConfig narrow = mc;
    narrow.num_attention_heads = 8;  // head_dim 16
    EXPECT(backend_choose("auto", &narrow, why, sizeof why) == BACKEND_CPU && strstr(why, "head_dim"),
          "auto picks cpu for head_dim 16 and says why: %s", why);

    gpu->destroy(g);
    cpu->destroy(c);
    free(back); free(rounded); free(grads); free(grads_cpu); free(grads_again);
    free(losses); free(losses_ref);
    adamw_free(&opt_back);
    train_fixture_free(&fx);
    return test_finish();
}
