// NCCL at world size 1 (trainer/nccl_cuda.h), on one GPU: the communicator is made
// (unique id, rendezvous, ncclCommInitRank), the bucketed all-reduce of random
// gradients on the side stream returns them bit for bit (the sum over one rank is the
// identity, so NCCL's result equals no NCCL's), ordered after the work queued before it
// and before the work queued after it, and the host sums come back unchanged.
// SKIP without a GPU, in a build without NCCL, or when libnccl.so.2 cannot be loaded
// (ONEPASS_NCCL_LIBRARY names it).
#include <stdio.h>
#include <string.h>
#include "common/check.h"
#include "trainer/backend_cuda.h"
#include "tests/test_model_util.h"
#include "tests/test_util.h"
#ifdef ONEPASS_HAVE_NCCL
#include "common/cuda_check.h"
#include "trainer/nccl_cuda.h"

__global__ void scale_kernel(float *x, size_t n, float by) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= by;
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

    const DistComm dc = nccl_dist_comm(comm);
    double v[3] = {12345.0, -0.125, 1e300};
    dc.sum(&dc, v, 3);
    EXPECT(v[0] == 12345.0 && v[1] == -0.125 && v[2] == 1e300, "host sums over one rank unchanged");
    EXPECT(dist_step_trained_tokens(&dc, 4242) == 4242, "the step's trained tokens over one rank");

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
