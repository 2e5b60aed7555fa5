// NCCL at world size 1 (dist/nccl_cuda.h), on one GPU: the communicator is made
// (unique id, rendezvous, ncclCommInitRank), the bucketed all-reduce of random
// gradients on the side stream returns them bit for bit (the sum over one rank is the
// identity, so NCCL's result equals no NCCL's), ordered after the work queued before it
// and before the work queued after it, and the host sums come back unchanged; two
// train_step calls of the CUDA backend through the communicator (its gradient all-reduce by
// the bucket plan) give the loss, gradient norm, weights and moments of two without it,
// bit for bit.
// SKIP without a GPU, in a build without NCCL, or when libnccl.so.2 cannot be loaded
// (ONEPASS_NCCL_LIBRARY names it).
#include <stdio.h>
#include <string.h>
#include "common/check.h"
#include "trainer/backend_cuda.h"
extern "C" {  // plain C headers without guards of their own
#include "trainer/data_options.h"
#include "trainer/setup.h"
#include "trainer/step.h"
}
#include "tests/test_model_util.h"
#include "tests/test_util.h"
#ifdef ONEPASS_HAVE_NCCL
#include "common/cuda_check.h"
#include "dist/nccl_cuda.h"

__global__ void scale_kernel(float *x, size_t n, float by) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= by;
}

// Two steps on backend a with dist_comm_single and on b through the NCCL communicator.
static void test_train_step(NcclComm *comm, TestRng *rng) {
    const char *overrides[] = {"model.hidden_size=128", "model.num_attention_heads=2",
                               "model.num_key_value_heads=1", "model.intermediate_size=256",
                               "model.num_hidden_layers=2"};
    RunConfig *config = config_load(NULL, 5, (char **)overrides);
    Tokenizer *tok = tokenizer_with_added(config);
    const ModelConfig mc = model_config_with(config, tok);
    DataOptions opt_data = data_options_from_config(config);
    opt_data.max_samples = 6;
    PackedDataset data;
    packed_dataset_load(tok, "datasets/synthetic/train.jsonl", opt_data, &data);
    MicroBatches micro;
    micro_batches_build(&data.rows, 1, &micro);
    long long tokens, trained;
    packed_rows_count(&data.rows, &tokens, &trained);

    ParamTable table;
    param_table_build(&mc, &table);
    BucketPlan plan;
    bucket_plan_build(&table, 64 << 10, &plan);
    float *params = (float *)xmalloc(table.total * sizeof(float));
    params_init(&mc, &table, test_rng_next(rng), params);
    AdamWState opt, got[2];
    adamw_init(&opt, table.total);
    const TrainBackendOps *ops = cuda_train_backend();
    const BackendSetup setup = {&mc, &table, 1, opt_data.seq_len, true,
                                MODEL_RECOMPUTE_MLP, nullptr, nullptr, nullptr, false, false,
                                nullptr, nullptr, nullptr};
    void *backends[2] = {ops->create(&setup), ops->create(&setup)};
    const DistComm comms[2] = {dist_comm_single(), nccl_dist_comm(comm, &plan)};
    const AdamWHyper h = {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, false, false};
    StepOutcome out[2][2];
    char err[512];
    float *weights[2];
    for (int k = 0; k < 2; k++) {
        ops->set_state(backends[k], params, &opt);
        for (int step = 0; step < 2; step++)
            EXPECT(train_step(ops, backends[k], &micro, trained, &comms[k], &h, 1.0,
                              &out[k][step], err, sizeof err) == 0, "train_step: %s", err);
        weights[k] = (float *)xmalloc(table.total * sizeof(float));
        adamw_init(&got[k], table.total);
        ops->get_state(backends[k], weights[k], &got[k]);
    }
    const size_t bytes = table.total * sizeof(float);
    EXPECT(micro.n_micro >= 2 && plan.n_buckets > 2, "%d micro-batches, %d buckets",
           micro.n_micro, plan.n_buckets);
    EXPECT(out[0][0].loss == out[1][0].loss && out[0][1].loss == out[1][1].loss &&
               out[0][1].grad_norm == out[1][1].grad_norm && out[0][1].loss != out[0][0].loss,
           "train_step through NCCL: losses %.9g %.9g, grad norm %.9g (without: %.9g %.9g, %.9g)",
           out[1][0].loss, out[1][1].loss, out[1][1].grad_norm, out[0][0].loss, out[0][1].loss,
           out[0][1].grad_norm);
    EXPECT(!memcmp(weights[0], weights[1], bytes) && !memcmp(got[0].m, got[1].m, bytes) &&
               !memcmp(got[0].v, got[1].v, bytes),
           "train_step through NCCL: weights and moments bit for bit");
    for (int k = 0; k < 2; k++) {
        ops->destroy(backends[k]);
        free(weights[k]);
        adamw_free(&got[k]);
    }
    adamw_free(&opt);
    free(params);
    bucket_plan_free(&plan);
    param_table_free(&table);
    micro_batches_free(&micro);
    packed_dataset_free(&data);
    tokenizer_free(tok);
    config_free(config);
}
#endif

int main(void) {
    char device[256];
    if (cuda_device_count(device, sizeof device) == 0) {
        printf("SKIP: no CUDA device\n");
        return EXIT_SKIP;
    }
#ifndef ONEPASS_HAVE_NCCL
    printf("SKIP: built without NCCL\n");
    return EXIT_SKIP;
#else
    TestRng rng = test_rng_from_env();
    const ModelConfig mc = test_model_config(1000, 128, 384, 3, 2, 1);
    ParamTable table;
    param_table_build(&mc, &table);
    const size_t n = table.total;
    BucketPlan plan;
    bucket_plan_build(&table, 256 << 10, &plan);  // 256 KiB: several buckets
    EXPECT(plan.n_buckets > 2, "%d buckets", plan.n_buckets);

    const DistEnv env = {LAUNCHER_NONE, 0, 1, 0, 1, NULL, 0};
    char err[512];
    NcclComm *comm = nccl_comm_create(&env, NULL, 10, err, sizeof err);
    if (!comm && strstr(err, "cannot load NCCL")) {
        printf("SKIP: %s\n", err);
        return EXIT_SKIP;
    }
    EXPECT(comm != NULL, "communicator of one rank: %s", comm ? "made" : err);
    if (!comm) return test_finish();

    float *host = (float *)xmalloc(n * sizeof(float)), *back = (float *)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) host[i] = test_rng_uniform(&rng);
    float *grads;
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    cudaCheck(cudaMalloc(&grads, n * sizeof(float)));
    cudaCheck(cudaMemcpyAsync(grads, host, n * sizeof(float), cudaMemcpyHostToDevice, stream));
    // Queued before: x2 (the "backward"); after: x0.5. Both exact in fp32.
    scale_kernel<<<256, 256, 0, stream>>>(grads, n, 2.0f);
    nccl_all_reduce_buckets(comm, grads, &plan, stream);
    scale_kernel<<<256, 256, 0, stream>>>(grads, n, 0.5f);
    cudaCheck(cudaMemcpyAsync(back, grads, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    EXPECT(memcmp(back, host, n * sizeof(float)) == 0,
           "bucketed all-reduce over one rank: the gradients bit for bit");

    const DistComm dc = nccl_dist_comm(comm, &plan);
    double v[3] = {12345.0, -0.125, 1e300};
    dc.sum(&dc, v, 3);
    EXPECT(v[0] == 12345.0 && v[1] == -0.125 && v[2] == 1e300, "host sums over one rank unchanged");
    EXPECT(dist_step_trained_tokens(&dc, 4242) == 4242, "the step's trained tokens over one rank");
    cudaCheck(cudaMemcpy(grads, host, n * sizeof(float), cudaMemcpyHostToDevice));
    dc.sum_floats(&dc, grads, n, stream);
    cudaCheck(cudaMemcpyAsync(back, grads, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    EXPECT(memcmp(back, host, n * sizeof(float)) == 0, "DistComm.sum_floats over one rank: bit for bit");
    test_train_step(comm, &rng);

    nccl_comm_destroy(comm);
    cudaCheck(cudaFree(grads));
    cudaCheck(cudaStreamDestroy(stream));
    free(host);
    free(back);
    bucket_plan_free(&plan);
    param_table_free(&table);
    return test_finish();
#endif
}
