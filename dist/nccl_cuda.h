// NCCL for data parallel, only in builds with NCCL (ONEPASS_HAVE_NCCL: CMake
// finds nccl.h in the CUDA toolkit; option ONEPASS_NCCL). libnccl.so.2 is loaded when
// the first communicator is made (ONEPASS_NCCL_LIBRARY: its path), so nothing links it.
// One communicator per process, its all-reduces on a side stream of their own.
//
// Status: the training step's gradient all-reduce on the CUDA backend (`train run` with
// several ranks), each bucket started as the last micro-batch's backward completes it
// (cuda_model_set_grads_ready). Checked at world size 1 only (tests/test_nccl_cuda.cu:
// the reduced gradients and sums equal the inputs bit for bit, and a train_step through
// this communicator equals one without it; test_model_cuda: every part the backward
// names final is final); not run on several GPUs.
#pragma once
#include <stddef.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {  // plain C headers without guards of their own
#endif
#include "dist/distributed.h"

typedef struct NcclComm NcclComm;

// Selects device env->local_rank, makes the unique id on rank 0 (ncclGetUniqueId), hands
// it to every rank (dist_rendezvous: TCP or rendezvous_file, timeout_s) and joins the
// communicator (ncclCommInitRank), with NCCL_NVLS_ENABLE=0 unless set. Returns NULL with
// a message on any failure (libnccl not found, the rendezvous, NCCL's own).
NcclComm *nccl_comm_create(const DistEnv *env, const char *rendezvous_file, double timeout_s,
                           char *err, size_t err_len);
void nccl_comm_destroy(NcclComm *c);

// Sums grads (device, fp32, the plan's flat buffer) over the ranks in place: one
// all-reduce per bucket, in the plan's order, grouped, on the communicator's stream,
// which first waits for the work queued on `stream` (the backward's); `stream` then waits
// for the reduction. Buckets that DistComm.sum_floats_ready started during the backward
// are not started again. Returns at once (nothing is synchronised on the host). NCCL adds in
// its own order (its ring or tree), the same run to run for one topology and NCCL
// version, not rank order as the TCP communicator does.
void nccl_all_reduce_buckets(NcclComm *c, float *grads, const BucketPlan *plan,
                             cudaStream_t stream);

// The step's reductions through the communicator: DistComm.sum's values go to the
// device, are summed in fp64 and come back (synchronous); DistComm.sum_floats is
// nccl_all_reduce_buckets of plan's buffer (device memory, plan->buckets covering it;
// the plan must outlive the DistComm), DistComm.sum_floats_ready starts the buckets
// wholly inside the final part as the backward produces it.
DistComm nccl_dist_comm(NcclComm *c, const BucketPlan *plan);

#ifdef __cplusplus
}
#endif
