#include "dist/nccl_cuda.h"

#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include "common/check.h"
#include "common/cuda_check.h"

// libnccl is opened at run time (nccl.h gives only the types): a binary that never uses
// NCCL needs no libnccl (220 MB) beside it, and the library can be the one a Python
// package ships (ONEPASS_NCCL_LIBRARY=path/libnccl.so.2).
typedef struct {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
} NcclApi;

static NcclApi g_nccl;

// Loads libnccl once. Returns 0, or -1 with a message naming the library.
static int nccl_load(char *err, size_t err_len) {
    if (g_nccl.all_reduce) return 0;
    const char *path = getenv("ONEPASS_NCCL_LIBRARY");
    if (!path) path = "libnccl.so.2";
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return fail(err, err_len, "cannot load NCCL (%s): %s; set ONEPASS_NCCL_LIBRARY to the "
                    "path of libnccl.so.2", path, dlerror());
    struct { void **fn; const char *name; } syms[] = {
        {(void **)&g_nccl.get_unique_id, "ncclGetUniqueId"},
        {(void **)&g_nccl.comm_init_rank, "ncclCommInitRank"},
        {(void **)&g_nccl.comm_destroy, "ncclCommDestroy"},
        {(void **)&g_nccl.group_start, "ncclGroupStart"},
        {(void **)&g_nccl.group_end, "ncclGroupEnd"},
        {(void **)&g_nccl.error_string, "ncclGetErrorString"},
        {(void **)&g_nccl.all_reduce, "ncclAllReduce"},  // last: marks the table loaded
    };
    for (auto &s : syms) {
        *s.fn = dlsym(lib, s.name);
        if (!*s.fn) {
            g_nccl = NcclApi{};
            return fail(err, err_len, "NCCL library %s has no %s", path, s.name);
        }
    }
    return 0;
}

enum { MAX_HOST_SUM = 64 };  // doubles one DistComm.sum call may reduce

struct NcclComm {
    ncclComm_t comm;
    int rank, world_size;
    cudaStream_t stream;             // the all-reduces run here
    cudaEvent_t ready, reduced;      // the backward's work done; the reduction done
    double *device_sum, *host_sum;   // [MAX_HOST_SUM] device / pinned: DistComm.sum
    const BucketPlan *plan;          // DistComm.sum_floats's buckets (nccl_dist_comm)
    size_t plan_total;               // the elements the plan's buckets cover
    int next_bucket;                 // buckets [0, next_bucket) already started (overlap)
};

#define ncclCheck(call)                                                                    \
    do {                                                                                   \
        ncclResult_t r_ = (call);                                                          \
        if (r_ != ncclSuccess)                                                             \
            fatal("NCCL error at %s:%d: %s", __FILE__, __LINE__, g_nccl.error_string(r_));     \
    } while (0)

NcclComm *nccl_comm_create(const DistEnv *env, const char *rendezvous_file, double timeout_s,
                           char *err, size_t err_len) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || env->local_rank >= devices) {
        (void)cudaGetLastError();
        fail(err, err_len, "local rank %d (%s) needs GPU %d, but %d CUDA devices are visible",
             env->local_rank, launcher_name(env->launcher), env->local_rank, devices);
        return NULL;
    }
    if (nccl_load(err, err_len) != 0) return NULL;
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off
    cudaCheck(cudaSetDevice(env->local_rank));
    ncclUniqueId id;
    static_assert(sizeof id == DIST_ID_BYTES, "ncclUniqueId is DIST_ID_BYTES");
    if (env->rank == 0) ncclCheck(g_nccl.get_unique_id(&id));
    if (dist_rendezvous(env, rendezvous_file, &id, sizeof id, timeout_s, err, err_len) != 0)
        return NULL;
    NcclComm *c = (NcclComm *)xcalloc(1, sizeof *c);
    c->rank = env->rank;
    c->world_size = env->world_size;
    const ncclResult_t r = g_nccl.comm_init_rank(&c->comm, env->world_size, id, env->rank);
    if (r != ncclSuccess) {
        fail(err, err_len, "ncclCommInitRank (rank %d of %d): %s", env->rank, env->world_size,
             g_nccl.error_string(r));
        free(c);
        return NULL;
    }
    cudaCheck(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&c->reduced, cudaEventDisableTiming));
    cudaCheck(cudaMalloc(&c->device_sum, MAX_HOST_SUM * sizeof(double)));
    cudaCheck(cudaMallocHost(&c->host_sum, MAX_HOST_SUM * sizeof(double)));
    return c;
}

void nccl_comm_destroy(NcclComm *c) {
    if (!c) return;
    cudaCheck(cudaStreamSynchronize(c->stream));
    ncclCheck(g_nccl.comm_destroy(c->comm));
    cudaCheck(cudaEventDestroy(c->ready));
    cudaCheck(cudaEventDestroy(c->reduced));
    cudaCheck(cudaStreamDestroy(c->stream));
    cudaCheck(cudaFree(c->device_sum));
    cudaCheck(cudaFreeHost(c->host_sum));
    free(c);
}

// Buckets [first, end) of plan, one grouped call, behind the work queued on `stream`.
static void start_buckets(NcclComm *c, float *grads, const BucketPlan *plan, int first, int end,
                          cudaStream_t stream) {
    if (first >= end) return;
    cudaCheck(cudaEventRecord(c->ready, stream));
    cudaCheck(cudaStreamWaitEvent(c->stream, c->ready, 0));
    ncclCheck(g_nccl.group_start());
    for (int b = first; b < end; b++) {
        float *at = grads + plan->buckets[b].offset;
        ncclCheck(g_nccl.all_reduce(at, at, plan->buckets[b].count, ncclFloat32, ncclSum, c->comm,
                                c->stream));
    }
    ncclCheck(g_nccl.group_end());
}

void nccl_all_reduce_buckets(NcclComm *c, float *grads, const BucketPlan *plan,
                             cudaStream_t stream) {
    CHECK(c->next_bucket == 0 || plan == c->plan,
          "nccl_all_reduce_buckets: another plan's buckets were started");
    start_buckets(c, grads, plan, c->next_bucket, plan->n_buckets, stream);
    c->next_bucket = 0;
    cudaCheck(cudaEventRecord(c->reduced, c->stream));
    cudaCheck(cudaStreamWaitEvent(stream, c->reduced, 0));
}

// The plan's buckets run in reverse table order, so those wholly inside [from, total)
// are the next ones not yet started.
static void nccl_sum_floats_ready(const DistComm *comm, float *values, size_t from,
                                  void *stream) {
    NcclComm *c = (NcclComm *)comm->ctx;
    int end = c->next_bucket;
    while (end < c->plan->n_buckets && c->plan->buckets[end].offset >= from) end++;
    start_buckets(c, values, c->plan, c->next_bucket, end, (cudaStream_t)stream);
    c->next_bucket = end;
}

static void nccl_sum(const DistComm *comm, double *values, int n) {
    NcclComm *c = (NcclComm *)comm->ctx;
    CHECK(n > 0 && n <= MAX_HOST_SUM, "nccl_sum: %d values (at most %d)", n, MAX_HOST_SUM);
    memcpy(c->host_sum, values, (size_t)n * sizeof(double));
    const size_t bytes = (size_t)n * sizeof(double);
    cudaCheck(cudaMemcpyAsync(c->device_sum, c->host_sum, bytes, cudaMemcpyHostToDevice, c->stream));
    ncclCheck(g_nccl.all_reduce(c->device_sum, c->device_sum, (size_t)n, ncclFloat64, ncclSum, c->comm,
                            c->stream));
    cudaCheck(cudaMemcpyAsync(c->host_sum, c->device_sum, bytes, cudaMemcpyDeviceToHost, c->stream));
    cudaCheck(cudaStreamSynchronize(c->stream));
    memcpy(values, c->host_sum, bytes);
}

static void nccl_sum_floats(const DistComm *comm, float *values, size_t n, void *stream) {
    NcclComm *c = (NcclComm *)comm->ctx;
    CHECK(n == c->plan_total, "nccl_sum_floats: %zu values, the bucket plan covers %zu", n,
          c->plan_total);
    nccl_all_reduce_buckets(c, values, c->plan, (cudaStream_t)stream);
}

DistComm nccl_dist_comm(NcclComm *c, const BucketPlan *plan) {
    c->plan = plan;
    c->plan_total = 0;
    for (int b = 0; b < plan->n_buckets; b++) c->plan_total += plan->buckets[b].count;
    DistComm d = {};
    d.rank = c->rank;
    d.world_size = c->world_size;
    d.sum = nccl_sum;
    d.sum_floats = nccl_sum_floats;
    d.sum_floats_ready = nccl_sum_floats_ready;
    d.device = true;
    d.ctx = c;
    return d;
}
