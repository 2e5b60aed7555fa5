// train.offload_optimizer (trainer/backend_cuda.cu): a CUDA trainer with the master
// weights and AdamW m, v in pinned host memory against one that keeps them on the
// device, in deterministic mode, on packed rows of the synthetic data set.
//  - set_state / get_state round-trip bit for bit, edge values included;
//  - steps with clipping (weight decay of norms and embeddings drawn at random), without
//    clipping, through train_step with one rank and the backend's calls one by one, over
//    more chunks than the gradients' ring holds, and after a reload of the downloaded state (what train.resume does):
//    the loss, the gradient norm and the state (weights, m, v, step) after each step
//    are bitwise the device optimizer's, and so are the forward's losses (the bf16
//    weights went up);
//  - steps back to back, each host update running behind what follows it (the next
//    step's forward and backward, an eval forward, get_state): the losses, norms and
//    eval losses after every step, and the state read every other step, are bitwise
//    the device optimizer's; a trainer destroyed while its update runs frees cleanly;
//  - the model's weights_ready calls (what the forward waits on): L + 2 of them on the
//    model's stream, from the table's start, in order, each starting inside what the
//    ones before covered, together the whole table;
//  - the device memory the offloaded trainer takes is the device one's less the
//    estimate's difference (trainer/device_memory.h), within a slack (not compared with
//    TEST_UNDER_SANITIZER=1 set, as the memcheck run of bench/run_gpu.sh tests sets it);
//  - a NaN planted in one tensor is found and named; finite weights are reported finite;
//  - a trainer handed the state's own pinned arrays (BackendSetup.host_params, as `train`
//    runs it) updates them in place to the device optimizer's state, bit for bit.
#include "trainer/backend_cuda.h"
extern "C" {  // plain C headers without guards of their own
#include "trainer/backend_registry.h"
#include "trainer/data_options.h"
#include "trainer/device_memory.h"
#include "trainer/setup.h"
#include "trainer/step.h"
}
#include <math.h>
#include <string.h>
#include "common/cuda_check.h"
#include "model/model_cuda.h"
#include "tests/test_util.h"
#include "tests/test_train_fixture.cuh"

enum { SEQ_LEN = 1024, MICRO_ROWS = 2, N_CONVERSATIONS = 10 };

static size_t device_used(void) {
    size_t free_bytes, total;
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemGetInfo(&free_bytes, &total));
    return total - free_bytes;
}

// The ranges a model's forward announced (cuda_model_set_weights_ready).
struct Announced {
    cudaStream_t stream;
    int calls, wrong_stream;
    size_t from[64], to[64];
};

static void record_range(void *ctx, size_t from, size_t to, cudaStream_t stream) {
    Announced *a = (Announced *)ctx;
    if (stream != a->stream) a->wrong_stream++;
    if (a->calls < 64) {
        a->from[a->calls] = from;
        a->to[a->calls] = to;
    }
    a->calls++;
}

static bool same_state(const float *pa, const AdamWState *a, const float *pb, const AdamWState *b,
                       size_t n) {
    return !memcmp(pa, pb, n * sizeof(float)) && !memcmp(a->m, b->m, n * sizeof(float)) &&
           !memcmp(a->v, b->v, n * sizeof(float)) && a->step == b->step;
}

int main(void) {
    char device[256];
    if (cuda_device_count(device, sizeof device) == 0) {
        printf("SKIP: no CUDA device\n");
        return EXIT_SKIP;
    }
    TestRng rng = test_rng_from_env();
    TrainFixture fx;
    // An MLP wide enough for more chunks than the gradients' ring holds (3 of them).
    train_fixture_load(&fx, &rng, SEQ_LEN, MICRO_ROWS, N_CONVERSATIONS, 44032);
    const ModelConfig &mc = fx.mc;
    const MicroBatches &micro = fx.micro;
    const ParamTable &table = fx.table;
    const size_t n = fx.n;
    float *params = fx.params;
    AdamWState &opt = fx.opt;
    EXPECT(n > 2 * CUDA_OFFLOAD_CHUNK, "%zu parameters: more than the gradients' ring holds", n);
    const long long trained = fx.trained;
    const float loss_scale = (float)(1.0 / (double)trained);

    const TrainBackendOps *gpu = cuda_train_backend();
    // Each trainer's own device memory: what freeing it gives back while the other
    // keeps the ops' shared scratch.
    const BackendSetup on_device = {&mc, &table, MICRO_ROWS, SEQ_LEN, true, MODEL_RECOMPUTE_MLP,
                                    nullptr, nullptr, nullptr, false, false, nullptr, nullptr, nullptr};
    const BackendSetup offloaded = {&mc, &table, MICRO_ROWS, SEQ_LEN, true, MODEL_RECOMPUTE_MLP,
                                    nullptr, nullptr, nullptr, true, false, nullptr, nullptr, nullptr};
    void *d = gpu->create(&on_device);
    void *o = gpu->create(&offloaded);
    const size_t used_both = device_used();
    gpu->destroy(o);
    const size_t used_d = device_used();
    o = gpu->create(&offloaded);
    gpu->destroy(d);
    const size_t used_o = device_used();
    d = gpu->create(&on_device);

    // Device memory: the offloaded trainer's less the estimate's state difference.
    CudaMemoryRequest request = {&mc, MICRO_ROWS, SEQ_LEN, MODEL_RECOMPUTE_MLP,
                                 cuda_model_attention_workspace_bytes, nullptr, false, false};
    const size_t state_device = cuda_memory_request_estimate(&request).state;
    request.offload_optimizer = true;
    const size_t state_offload = cuda_memory_request_estimate(&request).state;
    const double taken_device = (double)(used_both - used_o);
    const double taken_offload = (double)(used_both - used_d);
    const double want = (double)(state_device - state_offload);
    // Slack: 16 MiB or 8% of the difference. On an H100 at 34M parameters the device
    // trainer took 342.0 MiB more, the estimate says 324.7; the 17 MiB beyond the state
    // (every allocation rounds to 2 MiB, pinned host memory takes none) are unexplained.
    // Under compute-sanitizer (TEST_UNDER_SANITIZER=1) allocations are padded: 904 MiB
    // measured where the estimate says 325, so the comparison means nothing there.
    const double slack = fmax(16.0 * (1 << 20), 0.08 * want);
    if (getenv("TEST_UNDER_SANITIZER"))
        printf("device memory against the estimate: not compared under the sanitizer\n");
    else
        EXPECT(fabs((taken_device - taken_offload) - want) <= slack,
               "the offloaded trainer takes %.1f MiB less device memory, the estimate %.1f "
               "MiB less", (taken_device - taken_offload) / (1 << 20), want / (1 << 20));

    // Round trip, edge values planted.
    float *edges = (float *)xmalloc(n * sizeof(float)), *back = (float *)xmalloc(n * sizeof(float));
    memcpy(edges, params, n * sizeof(float));
    const uint32_t edge_bits[] = {0x80000000, 0x00000001, 0x807FFFFF, 0x3C808000, 0xBC818000,
                                  0x3C80FFFF, 0x7F7FFFFF, 0x7F800000, 0xFF800000};
    for (size_t k = 0; k < sizeof edge_bits / sizeof edge_bits[0]; k++)
        memcpy(&edges[test_rng_int(&rng, 0, (int)n - 1)], &edge_bits[k], sizeof(float));
    AdamWState back_opt;
    adamw_init(&back_opt, n);
    gpu->set_state(o, edges, &opt);
    gpu->get_state(o, back, &back_opt);
    EXPECT(same_state(back, &back_opt, edges, &opt, n),
           "offloaded set_state / get_state round-trip bit for bit");
    EXPECT(gpu->first_nonfinite(o, false) != NULL, "planted infinities reported");
    free(edges);

    gpu->set_state(d, params, &opt);
    gpu->set_state(o, params, &opt);
    float *pd = (float *)xmalloc(n * sizeof(float)), *po = (float *)xmalloc(n * sizeof(float));
    AdamWState sd, so;
    adamw_init(&sd, n);
    adamw_init(&so, n);
    AdamWHyper h = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, test_rng_int(&rng, 0, 1) == 1,
                    test_rng_int(&rng, 0, 1) == 1};
    const DistComm single = dist_comm_single();
    for (int step = 0; step < 4; step++) {
        if (step == 3) {  // a reload of the downloaded state, as train.resume does
            gpu->get_state(o, po, &so);
            gpu->set_state(o, po, &so);
        }
        h.lr = 1e-2f / (float)(step + 1);
        double max_norm;
        if (step < 2) {  // the backend's calls one by one
            const double ld = train_step_forward_backward(gpu, d, &micro, loss_scale);
            const double lo = train_step_forward_backward(gpu, o, &micro, loss_scale);
            const double nd = gpu->grad_norm(d), no = gpu->grad_norm(o);
            EXPECT(ld == lo && nd == no, "step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", step,
                   lo, ld, no, nd);
            max_norm = step == 0 ? 0.5 * nd : 0.0;
            gpu->optimizer_step(d, &h, nd, max_norm);
            gpu->optimizer_step(o, &h, no, max_norm);
        } else {  // train_step with one rank, as `train` runs it
            max_norm = step == 2 ? 1e-3 : 1e3;
            StepOutcome od, oo;
            char err[512] = "";
            EXPECT(train_step(gpu, d, &micro, trained, &single, &h, max_norm, &od, err,
                              sizeof err) == 0 &&
                       train_step(gpu, o, &micro, trained, &single, &h, max_norm, &oo, err,
                                  sizeof err) == 0,
                   "step %d: %s", step, err);
            EXPECT(od.loss == oo.loss && od.grad_norm == oo.grad_norm,
                   "step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", step, oo.loss, od.loss,
                   oo.grad_norm, od.grad_norm);
        }
        gpu->get_state(d, pd, &sd);
        gpu->get_state(o, po, &so);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++)
            differ += memcmp(&pd[i], &po[i], sizeof(float)) || memcmp(&sd.m[i], &so.m[i], 4) ||
                      memcmp(&sd.v[i], &so.v[i], 4);
        EXPECT(differ == 0 && sd.step == so.step,
               "step %d (max norm %g): offloaded state equals the device optimizer's bit for "
               "bit (%zu elements differ)", step, max_norm, differ);
        EXPECT(gpu->first_nonfinite(o, false) == NULL, "finite weights reported finite");
    }
    // Back to back: optimizer_step returns while the host update runs; what follows
    // waits for it per layer (the forwards) or whole (get_state). After steps 4 and 8
    // the next step's zero_grads and forward meet the running update, after 6 and 9 an
    // eval forward does; the odd steps end with get_state.
    for (int step = 4; step < 10; step++) {
        h.lr = 1e-2f / (float)(step + 1);
        const double max_norm = step % 2 ? 1e-3 : 0.0;
        StepOutcome od, oo;
        char err[512] = "";
        // The offloaded trainer first, while its previous update is most likely running.
        EXPECT(train_step(gpu, o, &micro, trained, &single, &h, max_norm, &oo, err, sizeof err) ==
                       0 &&
                   train_step(gpu, d, &micro, trained, &single, &h, max_norm, &od, err,
                              sizeof err) == 0,
               "step %d: %s", step, err);
        EXPECT(od.loss == oo.loss && od.grad_norm == oo.grad_norm,
               "step %d back to back: loss %.9g vs %.9g, norm %.9g vs %.9g", step, oo.loss,
               od.loss, oo.grad_norm, od.grad_norm);
        if (step % 3 == 0) {  // an eval forward while the update runs
            const double fo = train_step_forward(gpu, o, &micro, NULL);
            const double fd = train_step_forward(gpu, d, &micro, NULL);
            EXPECT(fd == fo, "eval forward behind step %d's update: %.9g vs %.9g", step, fo, fd);
        }
        if (step % 2 == 1) {
            gpu->get_state(d, pd, &sd);
            gpu->get_state(o, po, &so);
            EXPECT(same_state(pd, &sd, po, &so, n),
                   "after step %d back to back: the offloaded state equals the device "
                   "optimizer's bit for bit", step);
        }
    }

    // The bf16 weights went up: the forward's losses are the same.
    const double fd = train_step_forward(gpu, d, &micro, NULL);
    const double fo = train_step_forward(gpu, o, &micro, NULL);
    EXPECT(fd == fo, "forward after the steps: %.9g vs %.9g", fo, fd);

    // A NaN in one tensor is named.
    const int bad = test_rng_int(&rng, 0, table.n_tensors - 1);
    const ParamTensor *bt = &table.tensors[bad];
    po[bt->offset + (size_t)test_rng_int(&rng, 0, (int)bt->numel - 1)] = NAN;
    gpu->set_state(o, po, &so);
    const char *found = gpu->first_nonfinite(o, false);
    EXPECT(found && !strcmp(found, bt->name), "NaN planted in %s, found in %s", bt->name,
           found ? found : "(none)");

    // The forward's announced ranges cover the table in order, before it reads them.
    {
        CudaModel *m = cuda_model_create(&mc, MICRO_ROWS, SEQ_LEN, MODEL_RECOMPUTE_MLP);
        Announced a = {};
        a.stream = cuda_model_stream(m);
        cuda_model_set_weights_ready(m, record_range, &a);
        void *zeros;  // bf16 zeros: the forward's values do not matter here
        cudaCheck(cudaMalloc(&zeros, n * 2));
        cudaCheck(cudaMemset(zeros, 0, n * 2));
        const ModelBatch batch = micro_batch(&micro, 0);
        cuda_model_forward(m, zeros, &batch, NULL);
        const int L = mc.num_hidden_layers;
        bool ordered = a.calls == L + 2 && a.from[0] == 0;
        size_t covered = 0;
        for (int i = 0; ordered && i < a.calls; i++) {
            const bool head = i == L + 1;  // the LM head: the table's tail, or the embedding
            ordered = a.from[i] < a.to[i] && a.from[i] <= covered &&
                      (head || a.to[i] > covered);
            if (a.to[i] > covered) covered = a.to[i];
        }
        EXPECT(ordered && covered == n && a.wrong_stream == 0,
               "%d weights_ready calls (want %d) in table order covering %zu of %zu elements, "
               "%d on another stream", a.calls, L + 2, covered, n, a.wrong_stream);
        cudaCheck(cudaFree(zeros));
        cuda_model_free(m);
    }

    // A trainer handed the state's own arrays (pinned, from host_allocator), as `train`
    // hands its state over (BackendSetup.host_params): two steps beside the device
    // trainer from the same state; the arrays themselves, never copied back, then hold
    // the device optimizer's weights, m and v, and get_state into other arrays does too.
    {
        float *hp = (float *)gpu->host_allocator.alloc(n * sizeof(float));
        AdamWState hs;
        adamw_init_from(&hs, n, gpu->host_allocator.alloc);
        gpu->get_state(d, hp, &hs);
        BackendSetup handed = offloaded;
        handed.host_params = hp;
        handed.host_m = hs.m;
        handed.host_v = hs.v;
        void *ho = gpu->create(&handed);
        gpu->set_state(ho, hp, &hs);
        for (int step = 0; step < 2; step++) {
            StepOutcome od, oh;
            char err[512] = "";
            EXPECT(train_step(gpu, ho, &micro, trained, &single, &h, step ? 1e-3 : 0.0, &oh, err,
                              sizeof err) == 0 &&
                       train_step(gpu, d, &micro, trained, &single, &h, step ? 1e-3 : 0.0, &od,
                                  err, sizeof err) == 0,
                   "handed arrays, step %d: %s", step, err);
            EXPECT(od.loss == oh.loss && od.grad_norm == oh.grad_norm,
                   "handed arrays, step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", step, oh.loss,
                   od.loss, oh.grad_norm, od.grad_norm);
        }
        gpu->get_state(d, pd, &sd);
        gpu->get_state(ho, po, &so);  // finishes the update, copies into other arrays
        EXPECT(same_state(po, &so, pd, &sd, n), "handed arrays: get_state equals the device "
               "optimizer's state bit for bit");
        const long step_before = hs.step;
        hs.step = -1;
        gpu->get_state(ho, hp, &hs);  // the same arrays: only the step count is written
        EXPECT(!memcmp(hp, pd, n * sizeof(float)) && !memcmp(hs.m, sd.m, n * sizeof(float)) &&
                   !memcmp(hs.v, sd.v, n * sizeof(float)) && hs.step == sd.step &&
                   hs.step == step_before + 2,
               "handed arrays: updated in place to the device optimizer's state (step %ld, "
               "want %ld)", hs.step, sd.step);
        gpu->destroy(ho);
        gpu->host_allocator.free(hp);
        adamw_free_from(&hs, gpu->host_allocator.free);
    }

    // A step, and the trainer destroyed while its update runs.
    gpu->set_state(o, pd, &sd);
    StepOutcome oo;
    char err[512] = "";
    EXPECT(train_step(gpu, o, &micro, trained, &single, &h, 1.0, &oo, err, sizeof err) == 0,
           "a step before destroy: %s", err);
    gpu->destroy(d);
    gpu->destroy(o);
    free(back); free(pd); free(po);
    adamw_free(&back_opt); adamw_free(&sd); adamw_free(&so);
    train_fixture_free(&fx);
    return test_finish();
}
