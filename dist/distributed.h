// Data parallel over ranks: one process per GPU. What does not need NCCL lives here and
// is tested on the CPU: the launcher's environment, the exchange of the NCCL unique id
// (TCP through MASTER_ADDR:MASTER_PORT, or a file on a shared path), the rows of a step
// each rank trains, the step's reductions over ranks, the plan of gradient all-reduce
// buckets, and a communicator over TCP for the CPU backend. dist/nccl_cuda.cu
// (ONEPASS_HAVE_NCCL) is the GPU one, running the buckets; dist/ranks.h connects a
// run's ranks through one or the other. The dist/ stage knows no model and no data:
// tensors are sizes, rows are counts.
//
// Status: several ranks train on the CPU backend through the TCP communicator (CI:
// tests/cli_data_parallel.sh, 2 ranks against 1 rank of twice the micro-batches bit for
// bit, resumes across world sizes). The NCCL path (the CUDA backend) is written and
// checked at world size 1 only (tests/test_nccl_cuda.cu): not run on several GPUs.
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef enum { LAUNCHER_NONE, LAUNCHER_TORCHRUN, LAUNCHER_MPIRUN, LAUNCHER_SLURM } Launcher;

typedef struct {
    Launcher launcher;     // LAUNCHER_NONE: one process, no launcher variable set
    int rank, world_size;
    int local_rank;        // on this node: the GPU this rank uses
    int local_world_size;  // ranks on this node; 0: the launcher does not say
    const char *master_addr;  // MASTER_ADDR (the environment's string) or NULL
    // Where rank 0 listens: MASTER_PORT, or 0 when not set. Under torchrun's agent store
    // (TORCHELASTIC_USE_AGENT_STORE=True) the agent's TCPStore holds MASTER_PORT on
    // MASTER_ADDR, so rank 0 takes MASTER_PORT + 1.
    int master_port;
} DistEnv;

// The environment's lookup (getenv in the program, a table in the tests).
typedef const char *(*EnvLookup)(const char *name, void *ctx);
const char *env_lookup_getenv(const char *name, void *ctx);

const char *launcher_name(Launcher launcher);

// Reads the launcher variables: torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
// mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE), SLURM (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE), and MASTER_ADDR / MASTER_PORT.
// Launchers nest (torchrun under srun, mpirun inside an allocation), so the innermost
// one present gives the rank (torchrun, then mpirun, then SLURM) and every outer one
// must agree with it: its world size divides the inner one (k inner ranks per outer
// task) and its rank is the inner rank / k. ONEPASS_LAUNCHER=torchrun|mpirun|slurm|none
// takes only that one. Returns 0, or -1 with a message naming the variables for a
// malformed value (not a decimal integer, out of range), a launcher's variable missing,
// or two launchers that contradict each other.
int dist_env_parse(EnvLookup lookup, void *ctx, DistEnv *out, char *err, size_t err_len);

// Where the NCCL unique id travels. With neither, ranks above 0 have no way to find
// rank 0: dist_rendezvous refuses, naming MASTER_ADDR / MASTER_PORT and the file key.
enum { DIST_ID_BYTES = 128 };  // sizeof(ncclUniqueId)

// Rank 0 hands its id [id_len] to every other rank, which receives it into id; returns
// once every rank has it (a barrier). Through a file when rendezvous_file is not NULL
// (dist.rendezvous_file, on a path every rank sees: rank 0 refuses one that exists,
// writes it atomically and removes it once all ranks have read it), else over TCP: rank
// 0 listens on MASTER_PORT, the others connect to MASTER_ADDR:MASTER_PORT. A rank that
// does not arrive within timeout_s, a second process claiming a rank or another world
// size is an error with a message. Returns 0 or -1.
int dist_rendezvous(const DistEnv *env, const char *rendezvous_file, void *id, size_t id_len,
                    double timeout_s, char *err, size_t err_len);

// ------------------------------------------------------------ the step over ranks

// Rank `rank` of `world_size` trains rows [*first, *first + *count) of a step's n_rows
// packed rows: contiguous blocks in row order, sizes differing by at most one, so the
// ranks' rows in rank order are the one-rank step's rows (an N-rank step is the
// one-rank step with its micro-batches spread over the ranks) and the data cursor
// stays in global samples (resume on another number of ranks continues the same order).
void dist_shard_rows(int n_rows, int rank, int world_size, int *first, int *count);

// The reductions a step needs over ranks: every rank calls them in the same order.
// Sums are added in rank order 0, 1, ... (the same bits on every run). A peer that died
// or did not answer within the communicator's timeout is fatal with a message naming it.
typedef struct DistComm DistComm;
struct DistComm {
    int rank, world_size;
    // values [n]: each replaced by its sum over the ranks (exact for integers < 2^53).
    void (*sum)(const DistComm *comm, double *values, int n);
    // values [n] fp32, in the backend's memory (host for the TCP communicator, device
    // for NCCL's, ordered on `stream`, a cudaStream_t or NULL): each replaced by its sum
    // over the ranks. The gradient all-reduce (TrainBackendOps.all_reduce_grads).
    void (*sum_floats)(const DistComm *comm, float *values, size_t n, void *stream);
    // Overlap with the backward (NCCL; NULL: not offered): values[from, n) of the next
    // sum_floats call are final once the work queued on `stream` has run, so the sums of
    // the parts inside may start now; sum_floats then sums the rest and returns the
    // whole. Calls come with from decreasing.
    void (*sum_floats_ready)(const DistComm *comm, float *values, size_t from, void *stream);
    bool device;  // sum_floats takes device memory (NCCL)
    void (*destroy)(DistComm *comm);  // NULL: nothing to free (dist_comm_free)
    void *ctx;
};
// World size 1: the identity.
DistComm dist_comm_single(void);

// Several ranks over TCP, for the CPU backend (no NCCL): rank 0 holds a connection to
// every other rank, gathers each reduction, sums in rank order and sends the sums back.
// The connections are made like dist_rendezvous's: rank 0 listens on MASTER_PORT and the
// others connect to MASTER_ADDR, or (rendezvous_file set) rank 0 listens on a port of
// the kernel's choosing and hands "host port" through the file (host: MASTER_ADDR, else
// rank 0's host name). timeout_s bounds the wait for the connections and for each
// reduction (dist.timeout_s). Returns 0, or -1 with a message.
int dist_comm_tcp_create(const DistEnv *env, const char *rendezvous_file, double timeout_s,
                         DistComm *out, char *err, size_t err_len);
// Closes a communicator's connections (nothing for dist_comm_single).
void dist_comm_free(DistComm *comm);

// DESIGN §5: the loss of a step is divided by the trained positions of all its
// micro-batches on all ranks. The step's trained tokens over all ranks from this rank's
// (the loss scale, needed before the backward), and the step's CE sum over all ranks
// from this rank's (the logged loss, after it).
long long dist_step_trained_tokens(const DistComm *comm, long long trained_tokens);
double dist_step_ce_sum(const DistComm *comm, double ce_sum);

// ------------------------------------------------------- gradient all-reduce buckets

// Which parameter tensors each all-reduce carries: tensors in reverse table order (the
// backward produces the last layer's gradients first, so a bucket can be reduced while
// the backward runs on), each bucket a contiguous range of the flat gradient buffer.
// A bucket takes tensors until it holds at least bucket_bytes (fp32 gradients), so it
// exceeds that by less than its last tensor; a tensor is never split.
typedef struct {
    size_t offset, count;        // elements [offset, offset + count) of the gradients
    int first_tensor, n_tensors;  // table tensors [first_tensor, + n_tensors)
} GradBucket;

typedef struct {
    GradBucket *buckets;  // [n_buckets], in reduce order (last tensors first)
    int n_buckets;
} BucketPlan;

// The plan of n_tensors tensors that tile the flat gradient buffer in order, tensor t
// holding numel[t] elements (trainer/step.h's bucket_plan_build: a model's parameter
// table). Fatal (CHECK) for bucket_bytes 0.
void bucket_plan_from_sizes(const size_t *numel, int n_tensors, size_t bucket_bytes,
                            BucketPlan *out);
void bucket_plan_free(BucketPlan *plan);
