// Data parallel without NCCL (dist/distributed.h), on the CPU:
//  - launcher environments: torchrun, mpirun, SLURM values read; missing, malformed and
//    out-of-range variables refused by name; nested launchers accepted when consistent,
//    stale or contradicting ones refused naming both; ONEPASS_LAUNCHER picks one; under
//    torchrun's agent store rank 0 listens on MASTER_PORT + 1;
//  - the id rendezvous over TCP on loopback and through a file, with forked ranks and a
//    random 128-byte id: every rank gets rank 0's bytes; a missing rank times out with a
//    message; two processes claiming one rank are refused; no file is left behind;
//  - the TCP communicator (forked ranks over loopback and through a rendezvous file):
//    float and double sums over several reduction chunks equal the test's own sums in
//    rank order bit for bit (and differ from the reverse order's, so order is tested);
//    a peer that exits gives an error naming it, a silent one a timeout, both promptly;
//  - row sharding: the ranks' rows in rank order are the step's rows, sizes within one;
//    a loader resumed on another number of ranks continues the one-rank order;
//  - loss normalisation over ranks: a step's micro-batches split over N simulated ranks
//    (trained tokens summed over ranks, gradients summed) give the one-rank step's loss
//    and gradients up to float summation order;
//  - the gradient bucket plan: reverse table order, contiguous, each bucket at least the
//    bucket size but for the last, never splitting a tensor.
#define _POSIX_C_SOURCE 200809L
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "dist/distributed.h"
#include "test_util.h"
#include "trainer/backend.h"
#include "trainer/backend_registry.h"
#include "trainer/data_options.h"
#include "trainer/loader.h"
#include "trainer/prefetch.h"
#include "trainer/setup.h"
#include "trainer/step.h"

// ------------------------------------------------------------- the environment

typedef struct {
    const char *vars[24];  // "NAME=value", NULL-terminated
} FakeEnv;

static const char *fake_lookup(const char *name, void *ctx) {
    const FakeEnv *e = ctx;
    const size_t len = strlen(name);
    for (int i = 0; e->vars[i]; i++)
        if (strncmp(e->vars[i], name, len) == 0 && e->vars[i][len] == '=') return e->vars[i] + len + 1;
    return NULL;
}

// Parses e; returns the rc, the result in *out and the message in err.
static int parse(FakeEnv e, DistEnv *out, char *err, size_t err_len) {
    err[0] = 0;
    return dist_env_parse(fake_lookup, &e, out, err, err_len);
}

// The environment must be refused with a message containing every word of want.
static void expect_refused(FakeEnv e, const char *want1, const char *want2, const char *what) {
    DistEnv d;
    char err[512];
    const int rc = parse(e, &d, err, sizeof err);
    EXPECT(rc == -1 && strstr(err, want1) && (!want2 || strstr(err, want2)),
           "%s: refused naming %s%s%s (rc %d: %s)", what, want1, want2 ? " and " : "",
           want2 ? want2 : "", rc, err);
}

static void test_env(void) {
    DistEnv d;
    char err[512];
    EXPECT(parse((FakeEnv){{NULL}}, &d, err, sizeof err) == 0 && d.launcher == LAUNCHER_NONE &&
               d.world_size == 1 && d.rank == 0 && !d.master_addr && d.master_port == 0,
           "no launcher: one process (%s)", err);
    EXPECT(parse((FakeEnv){{"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
                            "MASTER_ADDR=node7", "MASTER_PORT=29500"}},
                 &d, err, sizeof err) == 0 &&
               d.launcher == LAUNCHER_TORCHRUN && d.rank == 5 && d.world_size == 8 &&
               d.local_rank == 1 && d.local_world_size == 4 && strcmp(d.master_addr, "node7") == 0 &&
               d.master_port == 29500,
           "torchrun read (%s)", err);
    EXPECT(parse((FakeEnv){{"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=node7",
                            "MASTER_PORT=29500", "TORCHELASTIC_USE_AGENT_STORE=True"}},
                 &d, err, sizeof err) == 0 && d.master_port == 29501,
           "under torchrun's agent store (which holds MASTER_PORT) rank 0 listens on the next "
           "port: %d (%s)", d.master_port, err);
    EXPECT(parse((FakeEnv){{"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
                            "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=2"}},
                 &d, err, sizeof err) == 0 &&
               d.launcher == LAUNCHER_MPIRUN && d.rank == 3 && d.world_size == 4 &&
               d.local_rank == 1 && d.local_world_size == 2,
           "mpirun read (%s)", err);
    EXPECT(parse((FakeEnv){{"SLURM_PROCID=6", "SLURM_NTASKS=8", "SLURM_LOCALID=2",
                            "SLURM_NTASKS_PER_NODE=4(x2)"}},
                 &d, err, sizeof err) == 0 &&
               d.launcher == LAUNCHER_SLURM && d.rank == 6 && d.world_size == 8 &&
               d.local_rank == 2 && d.local_world_size == 0,
           "SLURM read, per-node counts leave the local size unknown (%s)", err);
    EXPECT(parse((FakeEnv){{"SLURM_NTASKS=4", "SLURM_NTASKS_PER_NODE=4"}}, &d, err, sizeof err) == 0 &&
               d.launcher == LAUNCHER_NONE && d.world_size == 1,
           "an allocation's shell (SLURM_NTASKS, no SLURM_PROCID): one process (%s)", err);
    // torchrun with 4 ranks per node under srun of 2 tasks: node 1 holds ranks 4..7.
    EXPECT(parse((FakeEnv){{"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "RANK=6",
                            "WORLD_SIZE=8", "LOCAL_RANK=2"}},
                 &d, err, sizeof err) == 0 &&
               d.launcher == LAUNCHER_TORCHRUN && d.rank == 6,
           "torchrun under srun: torchrun's rank (%s)", err);
    EXPECT(parse((FakeEnv){{"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "OMPI_COMM_WORLD_RANK=2",
                            "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=2",
                            "ONEPASS_LAUNCHER=mpirun"}},
                 &d, err, sizeof err) == 0 &&
               d.launcher == LAUNCHER_MPIRUN && d.rank == 2 && d.world_size == 4,
           "ONEPASS_LAUNCHER=mpirun ignores stale torchrun variables (%s)", err);

    expect_refused((FakeEnv){{"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "OMPI_COMM_WORLD_RANK=2",
                              "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=2"}},
                   "RANK=0 WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=2", "stale torchrun under mpirun");
    expect_refused((FakeEnv){{"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "SLURM_PROCID=2",
                              "SLURM_NTASKS=4", "SLURM_LOCALID=0"}},
                   "RANK=1", "SLURM_PROCID=2", "same world, other rank");
    expect_refused((FakeEnv){{"RANK=1", "WORLD_SIZE=4"}}, "LOCAL_RANK", NULL, "LOCAL_RANK missing");
    expect_refused((FakeEnv){{"RANK=1", "LOCAL_RANK=1"}}, "WORLD_SIZE", NULL, "WORLD_SIZE missing");
    expect_refused((FakeEnv){{"SLURM_PROCID=1", "SLURM_LOCALID=0"}}, "SLURM_NTASKS", NULL,
                   "SLURM_NTASKS missing");
    const char *bad_ranks[] = {"RANK=abc", "RANK=-1", "RANK= 1", "RANK=+1", "RANK=1x", "RANK=4", "RANK="};
    for (int i = 0; i < 7; i++)
        expect_refused((FakeEnv){{bad_ranks[i], "WORLD_SIZE=4", "LOCAL_RANK=0"}}, "RANK", "[0, 3]",
                       bad_ranks[i]);
    expect_refused((FakeEnv){{"RANK=0", "WORLD_SIZE=0", "LOCAL_RANK=0"}}, "WORLD_SIZE='0'", NULL,
                   "WORLD_SIZE=0");
    expect_refused((FakeEnv){{"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"}},
                   "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", "local rank beyond the local world");
    expect_refused((FakeEnv){{"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2x"}},
                   "LOCAL_WORLD_SIZE='2x'", NULL, "malformed LOCAL_WORLD_SIZE");
    expect_refused((FakeEnv){{"MASTER_PORT=70000"}}, "MASTER_PORT='70000'", NULL, "port range");
    expect_refused((FakeEnv){{"MASTER_ADDR="}}, "MASTER_ADDR", NULL, "empty MASTER_ADDR");
    expect_refused((FakeEnv){{"ONEPASS_LAUNCHER=pbs"}}, "ONEPASS_LAUNCHER='pbs'", NULL,
                   "unknown ONEPASS_LAUNCHER");
    expect_refused((FakeEnv){{"ONEPASS_LAUNCHER=slurm"}}, "SLURM_PROCID", NULL,
                   "ONEPASS_LAUNCHER names an absent launcher");
}

// ------------------------------------------------------------- the rendezvous

static int free_port(void) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind");
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

// Forks one process per rank in ranks[n] (world world_size), each running the
// rendezvous; a rank > 0 exits 0 when it got `id`, rank 0 when it handed it over.
// Returns how many ranks failed; the messages go to stderr, rank 0's also into err0.
static int run_ranks(const int *ranks, int n, int world_size, int port, const char *file,
                     const unsigned char *id, double timeout_s) {
    pid_t pids[8];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        CHECK(pids[i] >= 0, "fork");
        if (pids[i] > 0) continue;
        const DistEnv env = {.launcher = LAUNCHER_TORCHRUN, .rank = ranks[i], .world_size = world_size,
                             .master_addr = "localhost", .master_port = port};
        unsigned char got[DIST_ID_BYTES];
        if (ranks[i] == 0) memcpy(got, id, DIST_ID_BYTES);
        else memset(got, 0, sizeof got);
        char err[512];
        if (dist_rendezvous(&env, file, got, sizeof got, timeout_s, err, sizeof err) != 0) {
            fprintf(stderr, "rank %d: %s\n", ranks[i], err);
            _exit(2);
        }
        _exit(memcmp(got, id, DIST_ID_BYTES) == 0 ? 0 : 3);
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        int status;
        waitpid(pids[i], &status, 0);
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    return failed;
}

static void test_rendezvous(TestRng *rng, const char *dir) {
    unsigned char id[DIST_ID_BYTES];
    for (int i = 0; i < DIST_ID_BYTES; i++) id[i] = (unsigned char)test_rng_next(rng);
    const int all[4] = {2, 0, 3, 1};
    EXPECT(run_ranks(all, 4, 4, free_port(), NULL, id, 20) == 0, "TCP: 4 ranks get rank 0's id");
    char file[512];
    snprintf(file, sizeof file, "%s/rendezvous", dir);
    EXPECT(run_ranks(all, 4, 4, 0, file, id, 20) == 0, "file: 4 ranks get rank 0's id");
    struct stat st;
    char ack[600];
    snprintf(ack, sizeof ack, "%s.1", file);
    EXPECT(stat(file, &st) != 0 && stat(ack, &st) != 0, "file: rank 0 removed the files");

    fprintf(stderr, "(expected below: rendezvous errors)\n");
    const int only0[1] = {0}, only1[1] = {1}, dup[3] = {0, 1, 1};
    EXPECT(run_ranks(only0, 1, 2, free_port(), NULL, id, 0.3) == 1, "TCP: rank 0 alone times out");
    EXPECT(run_ranks(only1, 1, 2, free_port(), NULL, id, 0.3) == 1, "TCP: rank 1 alone times out");
    EXPECT(run_ranks(dup, 3, 3, free_port(), NULL, id, 5) >= 2,
           "TCP: two processes claiming rank 1 are refused");
    EXPECT(run_ranks(only1, 1, 2, 0, file, id, 0.3) == 1, "file: rank 1 alone times out");
    FILE *stale = fopen(file, "wb");
    fputs("stale", stale);
    fclose(stale);
    EXPECT(run_ranks(only0, 1, 2, 0, file, id, 0.3) == 1, "file: rank 0 refuses an existing file");
    unlink(file);

    const DistEnv no_port = {.launcher = LAUNCHER_SLURM, .rank = 1, .world_size = 2,
                             .master_addr = "localhost"};
    char err[512];
    unsigned char got[DIST_ID_BYTES];
    EXPECT(dist_rendezvous(&no_port, NULL, got, sizeof got, 1, err, sizeof err) == -1 &&
               strstr(err, "MASTER_PORT") && strstr(err, "dist.rendezvous_file"),
           "no port and no file: refused naming both (%s)", err);
}

// ------------------------------------------------------------ the TCP communicator

static double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_seconds(double s) {
    const struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

enum { COMM_FLOATS = 600000 };  // over two of the communicator's 1 MiB chunks

// Rank r's values (3 ranks or more: with two, a + b is b + a): random signs and magnitudes over 2^-10 .. 2^10, so the order of the
// additions shows in the rounding.
static void rank_values(uint64_t seed, int rank, float *f, size_t n, double *d, int nd) {
    TestRng rng = {seed * 2 + 1 + (uint64_t)rank * 0x9E3779B97F4A7C15ULL};
    for (size_t i = 0; i < n; i++)
        f[i] = ldexpf(test_rng_uniform(&rng), test_rng_int(&rng, -10, 10));
    for (int i = 0; i < nd; i++) d[i] = ldexp((double)test_rng_uniform(&rng), test_rng_int(&rng, -30, 30));
}

typedef enum { RANK_REDUCES, RANK_EXITS, RANK_SLEEPS } RankPart;

// One forked rank: connects, then reduces twice (exit 0 when every sum equals the rank-
// order sum computed here bit for bit), or exits at once, or sleeps past the timeout.
static void comm_rank(const DistEnv *env, const char *file, double timeout_s, uint64_t seed,
                      RankPart part) {
    DistComm comm;
    char err[512];
    if (dist_comm_tcp_create(env, file, timeout_s, &comm, err, sizeof err) != 0) {
        fprintf(stderr, "rank %d: %s\n", env->rank, err);
        _exit(2);
    }
    if (part == RANK_EXITS) _exit(0);
    if (part == RANK_SLEEPS) {
        sleep_seconds(3 * timeout_s);
        _exit(0);
    }
    enum { ND = 5 };
    const size_t n = COMM_FLOATS;
    float *mine = xmalloc(n * sizeof(float)), *other = xmalloc(n * sizeof(float));
    float *forward = xcalloc(n, sizeof(float)), *backward = xcalloc(n, sizeof(float));
    double d[ND], d_other[ND], d_want[ND] = {0};
    for (int r = 0; r < env->world_size; r++) {  // the sums in rank order
        rank_values(seed, r, other, n, d_other, ND);
        for (size_t i = 0; i < n; i++) forward[i] = r == 0 ? other[i] : forward[i] + other[i];
        for (int i = 0; i < ND; i++) d_want[i] = r == 0 ? d_other[i] : d_want[i] + d_other[i];
    }
    for (int r = env->world_size - 1; r >= 0; r--) {
        rank_values(seed, r, other, n, d_other, ND);
        for (size_t i = 0; i < n; i++) backward[i] += other[i];
    }
    int wrong = memcmp(forward, backward, n * sizeof(float)) == 0 ? 10 : 0;  // no order shown
    for (int round = 0; round < 2; round++) {
        rank_values(seed, env->rank, mine, n, d, ND);
        comm.sum_floats(&comm, mine, n, NULL);
        comm.sum(&comm, d, ND);
        wrong += memcmp(mine, forward, n * sizeof(float)) != 0;
        wrong += memcmp(d, d_want, sizeof d) != 0;
    }
    dist_comm_free(&comm);
    _exit(wrong ? 3 : 0);
}

// Forks ranks 0 .. world_size - 1 (part[r] each), rank 0's stderr into err_path (NULL:
// inherited). Returns how many ranks did not exit 0; *status0 is rank 0's exit status.
static int run_comm_ranks(int world_size, const char *file, double timeout_s, uint64_t seed,
                          const RankPart *part, const char *err_path, int *status0) {
    const int port = file ? 0 : free_port();
    pid_t pids[8];
    fflush(stdout);  // a rank that exits through fatal() flushes its copy
    for (int r = 0; r < world_size; r++) {
        pids[r] = fork();
        CHECK(pids[r] >= 0, "fork");
        if (pids[r] > 0) continue;
        if (r == 0 && err_path) CHECK(freopen(err_path, "w", stderr), "%s", err_path);
        const DistEnv env = {.launcher = LAUNCHER_TORCHRUN, .rank = r, .world_size = world_size,
                             .master_addr = "127.0.0.1", .master_port = port};
        comm_rank(&env, file, timeout_s, seed, part[r]);
    }
    int failed = 0;
    for (int r = 0; r < world_size; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        if (r == 0) *status0 = code;
        failed += code != 0;
    }
    return failed;
}

static bool file_has(const char *path, const char *want) {
    char text[2048] = {0};
    FILE *f = fopen(path, "r");
    if (!f) return false;
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return strstr(text, want) != NULL;
}

static void test_comm(TestRng *rng, const char *dir) {
    const RankPart reduce[3] = {RANK_REDUCES, RANK_REDUCES, RANK_REDUCES};
    int status0;
    EXPECT(run_comm_ranks(3, NULL, 20, test_rng_next(rng), reduce, NULL, &status0) == 0,
           "TCP, 3 ranks: sums in rank order bit for bit (rank 0 status %d)", status0);
    char file[512], log[512];
    snprintf(file, sizeof file, "%s/comm_rendezvous", dir);
    snprintf(log, sizeof log, "%s/rank0.log", dir);
    EXPECT(run_comm_ranks(3, file, 20, test_rng_next(rng), reduce, NULL, &status0) == 0,
           "rendezvous file, 3 ranks: sums in rank order bit for bit (rank 0 status %d)", status0);

    fprintf(stderr, "(expected below: a rank's exit and a timeout)\n");
    const double start = monotonic_seconds();
    const RankPart exits[2] = {RANK_REDUCES, RANK_EXITS};
    run_comm_ranks(2, NULL, 20, 1, exits, log, &status0);
    EXPECT(status0 == 1 && file_has(log, "rank 0 of 2: the gradient all-reduce: the connection "
                                         "to rank 1 was closed"),
           "a peer that exits: rank 0 stops naming it (status %d)", status0);
    EXPECT(monotonic_seconds() - start < 10, "... at once, not after the 20 s timeout");
    const RankPart sleeps[2] = {RANK_REDUCES, RANK_SLEEPS};
    run_comm_ranks(2, NULL, 0.5, 1, sleeps, log, &status0);
    EXPECT(status0 == 1 && file_has(log, "rank 1 did not answer within dist.timeout_s 0.5 s"),
           "a silent peer: rank 0 times out naming it (status %d)", status0);
    unlink(log);
}

// ------------------------------------------------------------ the step over ranks

static void test_shards(TestRng *rng) {
    int bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        const int n_rows = test_rng_int(rng, 0, 40), world = test_rng_int(rng, 1, 9);
        int next = 0, lo = n_rows, hi = 0;
        for (int r = 0; r < world; r++) {
            int first, count;
            dist_shard_rows(n_rows, r, world, &first, &count);
            bad += first != next || count < 0;
            next = first + count;
            lo = count < lo ? count : lo;
            hi = count > hi ? count : hi;
        }
        bad += next != n_rows || hi - lo > 1;
    }
    EXPECT(bad == 0, "shards tile the rows in rank order, sizes within one (%d bad)", bad);
}

static bool rows_equal(const PackedRows *a, const PackedRows *b, int b_first) {
    const size_t n = (size_t)a->n_rows * a->seq_len, off = (size_t)b_first * b->seq_len;
    return !memcmp(a->token, b->token + off, n * 4) && !memcmp(a->target, b->target + off, n * 4) &&
           !memcmp(a->pos, b->pos + off, n * 4) && !memcmp(a->lo, b->lo + off, n * 4) &&
           !memcmp(a->hi, b->hi + off, n * 4);
}

// A run on 2 ranks for 3 steps resumed on 3 ranks: step 4's rows over the 3 ranks are
// the one-rank run's step 4.
static void test_resume_other_world(const PackedDataset *data, TestRng *rng) {
    const uint64_t seed = test_rng_next(rng);
    const long long budget = 4000;
    StepLoader one, two, three;
    step_loader_init(&one, data->samples, data->n_samples, LAYOUT_DUPLICATE, data->rows.seq_len,
                     (PackOptions){0}, budget, true, seed);
    step_loader_init(&two, data->samples, data->n_samples, LAYOUT_DUPLICATE, data->rows.seq_len,
                     (PackOptions){0}, budget, true, seed);
    StepBatch b;
    for (int s = 0; s < 3; s++) {
        step_loader_next(&one, &b);
        step_batch_free(&b);
        step_loader_next(&two, &b);
        step_batch_free(&b);
    }
    step_loader_init(&three, data->samples, data->n_samples, LAYOUT_DUPLICATE, data->rows.seq_len,
                     (PackOptions){0}, budget, true, seed);
    step_loader_seek(&three, two.epoch, two.cursor);
    StepBatch want, got;
    step_loader_next(&one, &want);
    step_loader_next(&three, &got);
    int at = 0, bad = 0;
    for (int r = 0; r < 3; r++) {
        const PackedRows mine = dist_rank_rows(&got.rows, r, 3);
        bad += !rows_equal(&mine, &want.rows, at);
        at += mine.n_rows;
    }
    EXPECT(bad == 0 && at == want.rows.n_rows && want.rows.n_rows >= 3,
           "resumed on 3 ranks: the ranks' rows are the one-rank step's (%d of %d rows)", at,
           want.rows.n_rows);
    step_batch_free(&want);
    step_batch_free(&got);
    step_loader_free(&one);
    step_loader_free(&two);
    step_loader_free(&three);
}

// N simulated ranks in one process: a reduction returns the sum of every rank's
// contribution to it, which the loop fills in for all ranks before any rank reduces;
// each rank must pass its own contribution.
typedef struct {
    double contribution[8];
    int wrong_input;
} FakeReduce;

static void fake_sum(const DistComm *comm, double *values, int n) {
    FakeReduce *f = comm->ctx;
    CHECK(n == 1, "one value per reduction here");
    f->wrong_input += values[0] != f->contribution[comm->rank];
    values[0] = 0;
    for (int r = 0; r < comm->world_size; r++) values[0] += f->contribution[r];
}

static void test_loss_over_ranks(const PackedDataset *data, const ModelConfig *mc) {
    enum { MICRO_ROWS = 1 };
    const TrainBackendOps *ops = backend_ops(BACKEND_CPU);
    ParamTable table;
    param_table_build(mc, &table);
    const size_t n = table.total;
    float *params = xmalloc(n * sizeof(float));
    params_init(mc, &table, 11, params);
    AdamWState opt;
    adamw_init(&opt, n);
    const BackendSetup setup = {mc, &table, MICRO_ROWS, data->rows.seq_len, true,
                                MODEL_RECOMPUTE_MLP, false};
    void *backend = ops->create(&setup);
    ops->set_state(backend, params, &opt);

    MicroBatches all;
    micro_batches_build(&data->rows, MICRO_ROWS, &all);
    long long tokens, trained;
    packed_rows_count(&data->rows, &tokens, &trained);
    const double loss_one =
        train_step_forward_backward(ops, backend, &all, (float)(1.0 / trained)) / (double)trained;
    float *want = xmalloc(n * sizeof(float)), *grads = xmalloc(n * sizeof(float));
    double *sum = xmalloc(n * sizeof(double));
    ops->get_grads(backend, want);

    for (int world = 2; world <= 3; world++) {
        FakeReduce reduce = {0};
        MicroBatches mb[3];
        long long local[3];
        for (int r = 0; r < world; r++) {
            const PackedRows mine = dist_rank_rows(&data->rows, r, world);
            packed_rows_count(&mine, &tokens, &local[r]);
            reduce.contribution[r] = (double)local[r];
            micro_batches_build(&mine, MICRO_ROWS, &mb[r]);
        }
        long long global[3];
        for (int r = 0; r < world; r++) {
            const DistComm comm = {.rank = r, .world_size = world, .sum = fake_sum, .ctx = &reduce};
            global[r] = dist_step_trained_tokens(&comm, local[r]);
        }
        memset(sum, 0, n * sizeof(double));
        for (int r = 0; r < world; r++) {  // each rank's backward; the all-reduce sums
            reduce.contribution[r] =
                train_step_forward_backward(ops, backend, &mb[r], (float)(1.0 / global[r]));
            ops->get_grads(backend, grads);
            for (size_t i = 0; i < n; i++) sum[i] += grads[i];
        }
        int bad = 0;
        for (int r = 0; r < world; r++) {
            const DistComm comm = {.rank = r, .world_size = world, .sum = fake_sum, .ctx = &reduce};
            const double loss = dist_step_ce_sum(&comm, reduce.contribution[r]) / (double)global[r];
            bad += global[r] != trained || !(fabs(loss - loss_one) <= 1e-6 * loss_one);
            micro_batches_free(&mb[r]);
        }
        EXPECT(bad == 0 && reduce.wrong_input == 0,
               "%d ranks: every rank's trained tokens are the step's %lld and its loss the "
               "one-rank loss %.9g", world, trained, loss_one);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            const double e = fabs(sum[i] - want[i]) / (fabs((double)want[i]) + 1e-6);
            worst = e > worst || isnan(e) ? e : worst;
        }
        EXPECT(worst <= 1e-4, "%d ranks: summed gradients vs one rank: worst rel. diff %g",
               world, worst);
    }
    free(want);
    free(grads);
    free(sum);
    micro_batches_free(&all);
    ops->destroy(backend);
    adamw_free(&opt);
    free(params);
    param_table_free(&table);
}

// ------------------------------------------------------- gradient all-reduce buckets

static void test_buckets(const ModelConfig *mc, TestRng *rng) {
    ParamTable table;
    param_table_build(mc, &table);
    for (int trial = 0; trial < 5; trial++) {
        const size_t bytes = (size_t)test_rng_int(rng, 1, 64 * 1024);
        BucketPlan plan;
        bucket_plan_build(&table, bytes, &plan);
        int bad = 0, next_tensor = table.n_tensors - 1;
        size_t end = table.total;
        for (int b = 0; b < plan.n_buckets; b++) {
            const GradBucket *k = &plan.buckets[b];
            const int last = k->first_tensor + k->n_tensors - 1;
            const ParamTensor *first_t = &table.tensors[k->first_tensor];
            bad += last != next_tensor || k->offset != first_t->offset ||
                   k->offset + k->count != end || k->n_tensors < 1;
            // Without its first (lowest) tensor the bucket was still below the size.
            bad += k->n_tensors > 1 && (k->count - first_t->numel) * sizeof(float) >= bytes;
            bad += b < plan.n_buckets - 1 && k->count * sizeof(float) < bytes;
            next_tensor = k->first_tensor - 1;
            end = k->offset;
        }
        EXPECT(bad == 0 && next_tensor == -1 && end == 0,
               "bucket plan of %zu bytes: %d buckets, reverse order, tiling (%d bad)", bytes,
               plan.n_buckets, bad);
        if (trial == 0) {  // one bucket per tensor when the size is one element
            BucketPlan each;
            bucket_plan_build(&table, 1, &each);
            EXPECT(each.n_buckets == table.n_tensors &&
                       each.buckets[0].first_tensor == table.n_tensors - 1,
                   "bucket size 1: one bucket per tensor, last tensor first");
            bucket_plan_free(&each);
        }
        bucket_plan_free(&plan);
    }
    BucketPlan one;
    bucket_plan_build(&table, (size_t)1 << 40, &one);
    EXPECT(one.n_buckets == 1 && one.buckets[0].count == table.total,
           "a huge bucket size: one bucket of everything");
    bucket_plan_free(&one);
    param_table_free(&table);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    test_env();
    char dir[] = "/tmp/test_distributed_XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    test_rendezvous(&rng, dir);
    test_comm(&rng, dir);
    rmdir(dir);
    test_shards(&rng);

    const char *overrides[] = {"model.hidden_size=32", "model.intermediate_size=64",
                               "model.num_hidden_layers=2", "model.num_attention_heads=2",
                               "model.num_key_value_heads=1", "data.seq_len=1024"};
    RunConfig *config = config_load(NULL, 6, (char **)overrides);
    Tokenizer *tok = tokenizer_with_added(config);
    const ModelConfig mc = model_config_with(config, tok);
    DataOptions opt = data_options_from_config(config);
    opt.layout = LAYOUT_DUPLICATE;
    opt.max_samples = 6;
    PackedDataset data;
    packed_dataset_load(tok, "datasets/synthetic/eval.jsonl", opt, &data);
    EXPECT(data.rows.n_rows >= 4, "the batch has %d rows (want >= 4)", data.rows.n_rows);
    test_loss_over_ranks(&data, &mc);
    packed_dataset_free(&data);
    opt.max_samples = 0;
    packed_dataset_load(tok, "datasets/synthetic/eval.jsonl", opt, &data);
    test_resume_other_world(&data, &rng);
    packed_dataset_free(&data);
    test_buckets(&mc, &rng);
    tokenizer_free(tok);
    config_free(config);
    return test_finish();
}
