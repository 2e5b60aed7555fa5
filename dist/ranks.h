// The ranks of a run: the launcher's environment (dist/distributed.h) and the
// communicator the step's sums go through. One rank without a launcher; several ranks
// connect, host gradients (the cpu backend) through the TCP communicator, device
// gradients (the cuda backend) through NCCL, whose unique id travels through the
// rendezvous, running the plan's gradient buckets.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "dist/distributed.h"

typedef struct {
    DistEnv env;
    DistComm comm;    // dist_comm_single() until connected
    BucketPlan plan;  // the gradient buckets (several ranks)
    void *nccl;       // NcclComm (dist/nccl_cuda.h) when NCCL connects the ranks, else NULL
} DistRanks;

// This process's launcher environment (dist_env_parse of getenv); fatal for a malformed
// one.
DistEnv dist_env_from_environment(void);

// Connects r->env's ranks with r->plan set: through NCCL when `device` (the gradients
// live on the GPU), else through the TCP communicator; both meet through
// rendezvous_file when not NULL, else MASTER_ADDR:MASTER_PORT, within timeout_s.
// Returns 0, or -1 with a message (device in a build without NCCL included).
int dist_ranks_connect(DistRanks *r, bool device, const char *rendezvous_file, double timeout_s,
                       char *err, size_t err_len);
// Closes the communicator and frees the plan.
void dist_ranks_free(DistRanks *r);
