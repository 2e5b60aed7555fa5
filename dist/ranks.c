// The ranks of a run (dist/ranks.h).
#include "dist/ranks.h"

#include "common/check.h"
#ifdef ONEPASS_HAVE_NCCL
#include "dist/nccl_cuda.h"
#endif

DistEnv dist_env_from_environment(void) {
    DistEnv env;
    char err[1024];
    if (dist_env_parse(env_lookup_getenv, NULL, &env, err, sizeof err) != 0) fatal("%s", err);
    return env;
}

// NCCL's communicator with the bucket plan of r->plan. Returns 0 or -1 with a message.
static int nccl_connect(DistRanks *r, const char *rendezvous_file, double timeout_s, char *err,
                        size_t err_len) {
#ifdef ONEPASS_HAVE_NCCL
    NcclComm *nccl = nccl_comm_create(&r->env, rendezvous_file, timeout_s, err, err_len);
    if (!nccl) return -1;
    r->nccl = nccl;
    r->comm = nccl_dist_comm(nccl, &r->plan);
    return 0;
#else
    (void)r;
    (void)rendezvous_file;
    (void)timeout_s;
    return fail(err, err_len, "several ranks on the cuda backend need NCCL, and this binary "
                "was built without it (CMake found no nccl.h; option ONEPASS_NCCL)");
#endif
}

int dist_ranks_connect(DistRanks *r, bool device, const char *rendezvous_file, double timeout_s,
                       char *err, size_t err_len) {
    return device ? nccl_connect(r, rendezvous_file, timeout_s, err, err_len)
                  : dist_comm_tcp_create(&r->env, rendezvous_file, timeout_s, &r->comm, err,
                                         err_len);
}

void dist_ranks_free(DistRanks *r) {
    dist_comm_free(&r->comm);
#ifdef ONEPASS_HAVE_NCCL
    nccl_comm_destroy((NcclComm *)r->nccl);
#endif
    bucket_plan_free(&r->plan);
}
