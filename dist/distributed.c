#define _POSIX_C_SOURCE 200809L
#include "dist/distributed.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/output_file.h"

// ------------------------------------------------------------- the environment

const char *env_lookup_getenv(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

// The variables of one launcher; local_size may be absent or not a plain integer
// (SLURM_NTASKS_PER_NODE "2(x3)"): then the local world size is unknown.
typedef struct {
    Launcher kind;
    const char *name;  // as ONEPASS_LAUNCHER names it
    const char *rank, *size, *local_rank, *local_size;
} LauncherVars;

// Innermost first: the first one present gives the rank.
static const LauncherVars LAUNCHERS[] = {
    {LAUNCHER_TORCHRUN, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {LAUNCHER_MPIRUN, "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {LAUNCHER_SLURM, "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
     "SLURM_NTASKS_PER_NODE"},
};
enum { N_LAUNCHERS = sizeof LAUNCHERS / sizeof *LAUNCHERS };

const char *launcher_name(Launcher launcher) {
    for (int i = 0; i < N_LAUNCHERS; i++)
        if (LAUNCHERS[i].kind == launcher) return LAUNCHERS[i].name;
    return "none";
}

// A decimal integer in [lo, hi] (no sign, no spaces, nothing after it).
static bool parse_int(const char *text, long lo, long hi, long *out) {
    if (!text || *text < '0' || *text > '9') return false;
    errno = 0;
    char *end;
    const long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int env_int(EnvLookup lookup, void *ctx, const char *name, long lo, long hi, long *out,
                   char *err, size_t err_len) {
    const char *text = lookup(name, ctx);
    if (!parse_int(text, lo, hi, out))
        return fail(err, err_len, "environment variable %s='%s': expected an integer in [%ld, %ld]",
                    name, text, lo, hi);
    return 0;
}

typedef struct {
    bool present;
    long rank, size, local_rank, local_size;
} LauncherValues;

// One launcher's values: present when its rank or world size variable is set (for SLURM
// only SLURM_PROCID, a task's own: an allocation's shell has SLURM_NTASKS too); then
// its rank, world size and local rank must all be set and consistent.
static int read_launcher(EnvLookup lookup, void *ctx, const LauncherVars *v, LauncherValues *out,
                         char *err, size_t err_len) {
    *out = (LauncherValues){0};
    if (!lookup(v->rank, ctx) && (v->kind == LAUNCHER_SLURM || !lookup(v->size, ctx))) return 0;
    out->present = true;
    const char *names[3] = {v->rank, v->size, v->local_rank};
    for (int i = 0; i < 3; i++)
        if (!lookup(names[i], ctx))
            return fail(err, err_len, "environment variable %s is not set, but %s is (%s launch)",
                        names[i], lookup(v->rank, ctx) ? v->rank : v->size, v->name);
    if (env_int(lookup, ctx, v->size, 1, INT_MAX, &out->size, err, err_len) ||
        env_int(lookup, ctx, v->rank, 0, out->size - 1, &out->rank, err, err_len) ||
        env_int(lookup, ctx, v->local_rank, 0, out->rank, &out->local_rank, err, err_len))
        return -1;
    const char *local_size = lookup(v->local_size, ctx);
    if (local_size && !parse_int(local_size, 1, out->size, &out->local_size)) {
        if (v->kind == LAUNCHER_SLURM) return 0;  // "2(x3)": per-node counts, not one size
        return fail(err, err_len, "environment variable %s='%s': expected an integer in [1, %ld]",
                    v->local_size, local_size, out->size);
    }
    if (out->local_size && out->local_rank >= out->local_size)
        return fail(err, err_len, "environment variables %s=%ld and %s=%ld: the local rank must "
                    "be below the local world size", v->local_rank, out->local_rank,
                    v->local_size, out->local_size);
    return 0;
}

// An outer launcher agrees with the inner one when it started world/k tasks that each
// run k inner ranks: inner rank r belongs to outer task r / k.
static bool nested_consistently(const LauncherValues *inner, const LauncherValues *outer) {
    if (inner->size % outer->size != 0) return false;
    const long k = inner->size / outer->size;
    return inner->rank / k == outer->rank;
}

static int choose_launcher(EnvLookup lookup, void *ctx, int *chosen, LauncherValues *values,
                           char *err, size_t err_len) {
    const char *only = lookup("ONEPASS_LAUNCHER", ctx);
    int forced = -1;
    if (only) {
        for (int i = 0; i < N_LAUNCHERS; i++)
            if (strcmp(only, LAUNCHERS[i].name) == 0) forced = i;
        if (forced < 0 && strcmp(only, "none") != 0)
            return fail(err, err_len, "environment variable ONEPASS_LAUNCHER='%s': expected "
                        "torchrun, mpirun, slurm or none", only);
    }
    *chosen = -1;
    for (int i = 0; i < N_LAUNCHERS; i++) {
        if (only && i != forced) continue;
        if (read_launcher(lookup, ctx, &LAUNCHERS[i], &values[i], err, err_len)) return -1;
        if (!values[i].present) continue;
        if (*chosen < 0) {
            *chosen = i;
            continue;
        }
        const LauncherValues *in = &values[*chosen], *out = &values[i];
        if (!nested_consistently(in, out))
            return fail(err, err_len, "the launchers' environments contradict each other: %s=%ld "
                        "%s=%ld (%s) but %s=%ld %s=%ld (%s); unset the stale variables or set "
                        "ONEPASS_LAUNCHER to the launcher that started this process",
                        LAUNCHERS[*chosen].rank, in->rank, LAUNCHERS[*chosen].size, in->size,
                        LAUNCHERS[*chosen].name, LAUNCHERS[i].rank, out->rank, LAUNCHERS[i].size,
                        out->size, LAUNCHERS[i].name);
    }
    if (forced >= 0 && *chosen < 0)
        return fail(err, err_len, "ONEPASS_LAUNCHER=%s but %s and %s are not set", only,
                    LAUNCHERS[forced].rank, LAUNCHERS[forced].size);
    return 0;
}

int dist_env_parse(EnvLookup lookup, void *ctx, DistEnv *out, char *err, size_t err_len) {
    *out = (DistEnv){.launcher = LAUNCHER_NONE, .world_size = 1, .local_world_size = 1};
    LauncherValues values[N_LAUNCHERS];
    int chosen = -1;
    if (choose_launcher(lookup, ctx, &chosen, values, err, err_len)) return -1;
    if (chosen >= 0) {
        const LauncherValues *v = &values[chosen];
        out->launcher = LAUNCHERS[chosen].kind;
        out->rank = (int)v->rank;
        out->world_size = (int)v->size;
        out->local_rank = (int)v->local_rank;
        out->local_world_size = (int)v->local_size;
    }
    out->master_addr = lookup("MASTER_ADDR", ctx);
    if (out->master_addr && !*out->master_addr)
        return fail(err, err_len, "environment variable MASTER_ADDR is empty");
    long port = 0;
    const char *agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE", ctx);
    const bool next_port = agent_store && strcmp(agent_store, "True") == 0;
    if (lookup("MASTER_PORT", ctx) &&
        env_int(lookup, ctx, "MASTER_PORT", 1, next_port ? 65534 : 65535, &port, err, err_len))
        return -1;
    out->master_port = (int)port + (port && next_port);
    return 0;
}

// ------------------------------------------------------------- the rendezvous

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// What a rank > 0 sends rank 0 on connecting. Rank 0 answers the rendezvous's with the
// id; the TCP communicator's (id_len 0) stay open for the reductions.
typedef struct {
    char magic[8];  // "onepass1"
    int32_t rank, world_size, id_len;
} Hello;

static const char HELLO_MAGIC[8] = {'o', 'n', 'e', 'p', 'a', 's', 's', '1'};

enum { TRANSFER_TIMEOUT = -1, TRANSFER_CLOSED = -2 };

// The reductions go back and forth in small messages: no Nagle delay.
static void no_delay(int fd) {
    const int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

// Puts "what: " in front of the message in err. Returns -1.
static int prefixed(const char *what, char *err, size_t err_len) {
    char message[1024];
    snprintf(message, sizeof message, "%s", err);
    return fail(err, err_len, "%s: %s", what, message);
}

// All n bytes through fd before the deadline (poll on each part). Returns 0,
// TRANSFER_TIMEOUT, or TRANSFER_CLOSED (the peer closed the connection or it broke).
// A signal (the stop handler only sets a flag) does not end the wait.
static int transfer_all(int fd, void *buf, size_t n, bool send_, double deadline) {
    char *p = buf;
    while (n > 0) {
        const int wait_ms = (int)((deadline - monotonic_s()) * 1000);
        if (wait_ms <= 0) return TRANSFER_TIMEOUT;
        struct pollfd pfd = {fd, send_ ? POLLOUT : POLLIN, 0};
        const int ready = poll(&pfd, 1, wait_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) return TRANSFER_TIMEOUT;
        if (ready < 0) return TRANSFER_CLOSED;
        const ssize_t k = send_ ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return TRANSFER_CLOSED;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

// A socket listening on port (0: the kernel picks one, returned in *bound), dual-stack
// where the kernel has IPv6, else IPv4 only. Returns the socket, or -1 with a message.
static int tcp_listen(int port, int backlog, int *bound, char *err, size_t err_len) {
    int listener = socket(AF_INET6, SOCK_STREAM, 0);
    const bool v6 = listener >= 0;
    if (!v6) listener = socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) return fail(err, err_len, "socket: %s", strerror(errno));
    const int on = 1, off = 0;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = in6addr_any,
                              .sin6_port = htons((uint16_t)port)};
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY),
                             .sin_port = htons((uint16_t)port)};
    if (v6) setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);  // IPv4 too
    socklen_t len = v6 ? sizeof a6 : sizeof a4;
    struct sockaddr *a = v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4;
    if (bind(listener, a, len) != 0 || listen(listener, backlog) != 0 ||
        getsockname(listener, a, &len) != 0) {
        const int e = errno;
        close(listener);
        return fail(err, err_len, "rank 0 cannot listen on port %d: %s", port, strerror(e));
    }
    *bound = ntohs(v6 ? a6.sin6_port : a4.sin_port);
    return listener;
}

// Rank 0: every other rank's connection into peers[1 .. world_size - 1] (its Hello for
// this world size and id_len), before the deadline. Returns 0, or -1 with a message
// (the connections made so far are the caller's to close).
static int star_accept(int listener, const DistEnv *env, int port, int32_t id_len,
                       double timeout_s, int *peers, char *err, size_t err_len) {
    const double deadline = monotonic_s() + timeout_s;
    for (int arrived = 1; arrived < env->world_size;) {
        const int wait_ms = (int)((deadline - monotonic_s()) * 1000);
        struct pollfd pfd = {listener, POLLIN, 0};
        const int ready = wait_ms > 0 ? poll(&pfd, 1, wait_ms) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0)
            return fail(err, err_len, "rank 0 waited %.1f s on port %d, and only %d of "
                        "WORLD_SIZE=%d ranks arrived", timeout_s, port, arrived, env->world_size);
        const int fd = accept(listener, NULL, NULL);
        if (fd < 0) continue;
        Hello h;
        if (transfer_all(fd, &h, sizeof h, false, deadline) != 0 ||
            memcmp(h.magic, HELLO_MAGIC, sizeof HELLO_MAGIC) != 0) {
            close(fd);  // not one of ours (a port scanner, a stale client): ignore it
            continue;
        }
        if (h.world_size != env->world_size || h.id_len != id_len) {
            close(fd);
            return fail(err, err_len, "rank %d says world size %d (%s), rank 0 has %d (%s)",
                        h.rank, h.world_size, h.id_len ? "an NCCL id" : "the cpu backend",
                        env->world_size, id_len ? "an NCCL id" : "the cpu backend");
        }
        if (h.rank <= 0 || h.rank >= env->world_size || peers[h.rank] >= 0) {
            close(fd);
            return fail(err, err_len, "two processes claim rank %d (of %d)", h.rank,
                        env->world_size);
        }
        no_delay(fd);
        peers[h.rank] = fd;
        arrived++;
    }
    return 0;
}

// Connects to host:port and says Hello, retrying until rank 0 listens or the deadline.
// Returns the socket, or -1 with a message.
static int star_connect(const DistEnv *env, const char *host, int port, int32_t id_len,
                        double deadline, char *err, size_t err_len) {
    char port_text[8];
    snprintf(port_text, sizeof port_text, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *found;
    const int gai = getaddrinfo(host, port_text, &hints, &found);
    if (gai != 0) return fail(err, err_len, "rank 0's address %s: %s", host, gai_strerror(gai));
    int fd = -1;
    while (fd < 0 && monotonic_s() < deadline) {
        for (struct addrinfo *a = found; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
                close(fd);
                fd = -1;
            }
        }
        if (fd < 0) sleep_ms(50);
    }
    freeaddrinfo(found);
    Hello h = {.rank = env->rank, .world_size = env->world_size, .id_len = id_len};
    memcpy(h.magic, HELLO_MAGIC, sizeof h.magic);
    if (fd >= 0) no_delay(fd);
    if (fd >= 0 && transfer_all(fd, &h, sizeof h, true, deadline) != 0) {
        close(fd);
        fd = -1;
    }
    if (fd < 0)
        return fail(err, err_len, "rank %d could not reach rank 0 at %s port %d before the "
                    "timeout", env->rank, host, port);
    return fd;
}

static int tcp_rank0(const DistEnv *env, const void *id, size_t id_len, double timeout_s,
                     char *err, size_t err_len) {
    int port;
    const int listener = tcp_listen(env->master_port, env->world_size, &port, err, err_len);
    if (listener < 0) return -1;
    int *peers = xmalloc((size_t)env->world_size * sizeof(int));
    for (int r = 0; r < env->world_size; r++) peers[r] = -1;
    int rc = star_accept(listener, env, port, (int32_t)id_len, timeout_s, peers, err, err_len);
    const double deadline = monotonic_s() + timeout_s;
    for (int r = 1; r < env->world_size; r++) {
        if (peers[r] < 0) continue;
        if (rc == 0 && transfer_all(peers[r], (void *)id, id_len, true, deadline) != 0)
            rc = fail(err, err_len, "sending the id to rank %d failed", r);
        close(peers[r]);
    }
    free(peers);
    close(listener);
    return rc;
}

static int tcp_other_rank(const DistEnv *env, void *id, size_t id_len, double timeout_s,
                          char *err, size_t err_len) {
    const double deadline = monotonic_s() + timeout_s;
    const int fd = star_connect(env, env->master_addr, env->master_port, (int32_t)id_len,
                                deadline, err, err_len);
    if (fd < 0) return -1;
    int rc = 0;
    if (transfer_all(fd, id, id_len, false, deadline) != 0)
        rc = fail(err, err_len, "rank %d got no id from rank 0 at MASTER_ADDR=%s "
                  "MASTER_PORT=%d (rank 0 refused this rank or timed out: see its message)",
                  env->rank, env->master_addr, env->master_port);
    close(fd);
    return rc;
}

// The file's bytes: world size then the id.
static int file_rank0(const DistEnv *env, const char *path, const void *id, size_t id_len,
                      double timeout_s, char *err, size_t err_len) {
    struct stat st;
    if (stat(path, &st) == 0)
        return fail(err, err_len, "dist.rendezvous_file '%s' exists: remove it (a file left by "
                    "an earlier run would hand its id to this run's ranks)", path);
    const int32_t world = env->world_size;
    char *bytes = xmalloc(sizeof world + id_len);
    memcpy(bytes, &world, sizeof world);
    memcpy(bytes + sizeof world, id, id_len);
    const int rc = write_file_atomic(path, bytes, sizeof world + id_len, err, err_len);
    free(bytes);
    if (rc) return -1;
    // Every other rank acknowledges with <path>.<rank>; then rank 0 removes the files.
    const double deadline = monotonic_s() + timeout_s;
    char ack[4096];
    for (int r = 1; r < env->world_size; r++) {
        snprintf(ack, sizeof ack, "%s.%d", path, r);
        while (stat(ack, &st) != 0) {
            if (monotonic_s() > deadline) {
                unlink(path);
                return fail(err, err_len, "rendezvous: rank 0 waited %.1f s for rank %d to read "
                            "dist.rendezvous_file '%s'", timeout_s, r, path);
            }
            sleep_ms(20);
        }
    }
    for (int r = 1; r < env->world_size; r++) {
        snprintf(ack, sizeof ack, "%s.%d", path, r);
        unlink(ack);
    }
    unlink(path);
    return 0;
}

static int file_other_rank(const DistEnv *env, const char *path, void *id, size_t id_len,
                           double timeout_s, char *err, size_t err_len) {
    const double deadline = monotonic_s() + timeout_s;
    FILE *f;
    while (!(f = fopen(path, "rb"))) {
        if (monotonic_s() > deadline)
            return fail(err, err_len, "rendezvous: rank %d waited %.1f s for rank 0 to write "
                        "dist.rendezvous_file '%s'", env->rank, timeout_s, path);
        sleep_ms(20);
    }
    int32_t world = 0;
    const bool whole = fread(&world, sizeof world, 1, f) == 1 && fread(id, 1, id_len, f) == id_len;
    fclose(f);
    if (!whole || world != env->world_size)
        return fail(err, err_len, "dist.rendezvous_file '%s': %s", path,
                    whole ? "written for another world size" : "truncated");
    char ack[4096];
    snprintf(ack, sizeof ack, "%s.%d", path, env->rank);
    return write_file_atomic(ack, "", 0, err, err_len);
}

// Without a rendezvous file every rank needs MASTER_PORT, ranks above 0 MASTER_ADDR.
static bool has_address(const DistEnv *env) {
    return env->master_port && (env->rank == 0 || env->master_addr);
}

static int refuse_no_address(const DistEnv *env, char *err, size_t err_len) {
    return fail(err, err_len, "%s launch of %d ranks: set %s (where rank 0 listens) or config "
                "key dist.rendezvous_file (a path every rank sees)", launcher_name(env->launcher),
                env->world_size, !env->master_addr && !env->master_port
                                     ? "MASTER_ADDR and MASTER_PORT"
                                 : env->master_port ? "MASTER_ADDR" : "MASTER_PORT");
}

int dist_rendezvous(const DistEnv *env, const char *rendezvous_file, void *id, size_t id_len,
                    double timeout_s, char *err, size_t err_len) {
    if (env->world_size == 1) return 0;
    if (rendezvous_file)
        return env->rank == 0
                   ? file_rank0(env, rendezvous_file, id, id_len, timeout_s, err, err_len)
                   : file_other_rank(env, rendezvous_file, id, id_len, timeout_s, err, err_len);
    if (!has_address(env)) return refuse_no_address(env, err, err_len);
    const int rc = env->rank == 0 ? tcp_rank0(env, id, id_len, timeout_s, err, err_len)
                                  : tcp_other_rank(env, id, id_len, timeout_s, err, err_len);
    return rc ? prefixed("rendezvous", err, err_len) : 0;
}

// ------------------------------------------------------------ the step over ranks

void dist_shard_rows(int n_rows, int rank, int world_size, int *first, int *count) {
    CHECK(world_size > 0 && rank >= 0 && rank < world_size && n_rows >= 0,
          "dist_shard_rows: rank %d of %d, %d rows", rank, world_size, n_rows);
    const long long lo = (long long)n_rows * rank / world_size;
    const long long hi = (long long)n_rows * (rank + 1) / world_size;
    *first = (int)lo;
    *count = (int)(hi - lo);
}

static void sum_single(const DistComm *comm, double *values, int n) {
    (void)comm;
    (void)values;
    (void)n;
}

static void sum_floats_single(const DistComm *comm, float *values, size_t n, void *stream) {
    (void)comm;
    (void)values;
    (void)n;
    (void)stream;
}

DistComm dist_comm_single(void) {
    return (DistComm){.rank = 0, .world_size = 1, .sum = sum_single,
                      .sum_floats = sum_floats_single};
}

void dist_comm_free(DistComm *comm) {
    if (comm->destroy) comm->destroy(comm);
    *comm = dist_comm_single();
}

// ------------------------------------------------------ the TCP communicator

// The star of connections: rank 0 holds fds[1 .. world_size - 1], another rank fds[0].
typedef struct {
    int *fds;           // [world_size], -1 where there is none
    double timeout_s;   // per reduction
    unsigned char *scratch;  // [REDUCE_CHUNK] rank 0: one peer's part
} TcpComm;

enum { REDUCE_CHUNK = 1 << 20 };  // bytes a reduction moves per round trip

static void tcp_comm_destroy(DistComm *comm) {
    TcpComm *t = comm->ctx;
    for (int r = 0; r < comm->world_size; r++)
        if (t->fds[r] >= 0) close(t->fds[r]);
    free(t->fds);
    free(t->scratch);
    free(t);
}

// A failed transfer with peer `peer` during `what`: fatal, naming both ranks.
static void transfer_failed(const DistComm *comm, int peer, int code, const char *what) {
    const TcpComm *t = comm->ctx;
    if (code == TRANSFER_TIMEOUT)
        fatal("rank %d of %d: %s: rank %d did not answer within dist.timeout_s %.1f s",
              comm->rank, comm->world_size, what, peer, t->timeout_s);
    fatal("rank %d of %d: %s: the connection to rank %d was closed (that rank stopped: see "
          "its message)", comm->rank, comm->world_size, what, peer);
}

typedef void (*AddFn)(void *into, const void *from, size_t n);

static void add_doubles(void *into, const void *from, size_t n) {
    double *a = into;
    const double *b = from;
    for (size_t i = 0; i < n; i++) a[i] += b[i];
}

static void add_floats(void *into, const void *from, size_t n) {
    float *a = into;
    const float *b = from;
    for (size_t i = 0; i < n; i++) a[i] += b[i];
}

// values [n elements of `size` bytes] summed over the ranks in place, a chunk at a time:
// every other rank sends its chunk and waits for the sums; rank 0 adds the chunks of
// ranks 1, 2, ... to its own in that order and sends the sums to every rank.
static void tcp_reduce(const DistComm *comm, void *values, size_t n, size_t size, AddFn add,
                       const char *what) {
    const TcpComm *t = comm->ctx;
    const size_t per_chunk = REDUCE_CHUNK / size;
    for (size_t at = 0; at < n; at += per_chunk) {
        const size_t count = n - at < per_chunk ? n - at : per_chunk, bytes = count * size;
        unsigned char *part = (unsigned char *)values + at * size;
        const double deadline = monotonic_s() + t->timeout_s;
        int rc;
        if (comm->rank > 0) {
            if ((rc = transfer_all(t->fds[0], part, bytes, true, deadline)) != 0 ||
                (rc = transfer_all(t->fds[0], part, bytes, false, deadline)) != 0)
                transfer_failed(comm, 0, rc, what);
            continue;
        }
        for (int r = 1; r < comm->world_size; r++) {
            if ((rc = transfer_all(t->fds[r], t->scratch, bytes, false, deadline)) != 0)
                transfer_failed(comm, r, rc, what);
            add(part, t->scratch, count);
        }
        for (int r = 1; r < comm->world_size; r++)
            if ((rc = transfer_all(t->fds[r], part, bytes, true, deadline)) != 0)
                transfer_failed(comm, r, rc, what);
    }
}

static void tcp_sum(const DistComm *comm, double *values, int n) {
    tcp_reduce(comm, values, (size_t)n, sizeof(double), add_doubles, "summing the step's counts");
}

static void tcp_sum_floats(const DistComm *comm, float *values, size_t n, void *stream) {
    CHECK(!stream, "the TCP communicator sums host memory");
    tcp_reduce(comm, values, n, sizeof(float), add_floats, "the gradient all-reduce");
}

// Through rendezvous_file, rank 0's address travels as the id, "host port" (rank 0
// listens on *port): into host and *port on every rank.
static int address_through_file(const DistEnv *env, const char *rendezvous_file,
                                double timeout_s, char *host, size_t host_len, int *port,
                                char *err, size_t err_len) {
    char id[DIST_ID_BYTES] = {0};
    if (env->rank == 0) {
        if (env->master_addr) snprintf(id, sizeof id, "%s", env->master_addr);
        else if (gethostname(id, sizeof id - 16) != 0)
            return fail(err, err_len, "gethostname: %s", strerror(errno));
        snprintf(id + strlen(id), sizeof id - strlen(id), " %d", *port);
    }
    if (dist_rendezvous(env, rendezvous_file, id, sizeof id, timeout_s, err, err_len)) return -1;
    id[sizeof id - 1] = 0;
    char *space = strrchr(id, ' ');
    long p;
    if (!space || !parse_int(space + 1, 1, 65535, &p))
        return fail(err, err_len, "dist.rendezvous_file '%s': no address of rank 0 in it",
                    rendezvous_file);
    *space = 0;
    snprintf(host, host_len, "%s", id);
    *port = (int)p;
    return 0;
}

int dist_comm_tcp_create(const DistEnv *env, const char *rendezvous_file, double timeout_s,
                         DistComm *out, char *err, size_t err_len) {
    *out = dist_comm_single();
    if (env->world_size == 1) return 0;
    if (!rendezvous_file && !has_address(env)) return refuse_no_address(env, err, err_len);
    TcpComm *t = xcalloc(1, sizeof *t);
    t->timeout_s = timeout_s;
    t->fds = xmalloc((size_t)env->world_size * sizeof(int));
    for (int r = 0; r < env->world_size; r++) t->fds[r] = -1;
    int listener = -1, port = env->master_port, rc = 0;
    if (env->rank == 0) {
        listener = tcp_listen(rendezvous_file ? 0 : port, env->world_size, &port, err, err_len);
        rc = listener < 0 ? -1 : 0;
        t->scratch = xmalloc(REDUCE_CHUNK);
    }
    char host[DIST_ID_BYTES];
    snprintf(host, sizeof host, "%s", env->master_addr ? env->master_addr : "");
    if (rc == 0 && rendezvous_file)
        rc = address_through_file(env, rendezvous_file, timeout_s, host, sizeof host, &port,
                                  err, err_len);
    if (rc == 0 && env->rank == 0)
        rc = star_accept(listener, env, port, 0, timeout_s, t->fds, err, err_len);
    else if (rc == 0)
        rc = (t->fds[0] = star_connect(env, host, port, 0, monotonic_s() + timeout_s, err,
                                       err_len)) < 0 ? -1 : 0;
    if (listener >= 0) close(listener);
    *out = (DistComm){.rank = env->rank, .world_size = env->world_size, .sum = tcp_sum,
                      .sum_floats = tcp_sum_floats, .destroy = tcp_comm_destroy, .ctx = t};
    if (rc == 0) return 0;
    dist_comm_free(out);
    return prefixed("connecting the ranks", err, err_len);
}

long long dist_step_trained_tokens(const DistComm *comm, long long trained_tokens) {
    double v = (double)trained_tokens;
    comm->sum(comm, &v, 1);
    return (long long)v;
}

double dist_step_ce_sum(const DistComm *comm, double ce_sum) {
    comm->sum(comm, &ce_sum, 1);
    return ce_sum;
}

// ------------------------------------------------------- gradient all-reduce buckets

void bucket_plan_from_sizes(const size_t *numel, int n_tensors, size_t bucket_bytes,
                           BucketPlan *out) {
    CHECK(bucket_bytes > 0, "bucket_plan_from_sizes: bucket_bytes is 0");
    size_t *offset = xmalloc(((size_t)n_tensors + 1) * sizeof *offset);
    offset[0] = 0;
    for (int t = 0; t < n_tensors; t++) offset[t + 1] = offset[t] + numel[t];
    *out = (BucketPlan){0};
    int cap = 0;
    for (int t = n_tensors - 1; t >= 0;) {
        GradBucket b = {.offset = offset[t], .first_tensor = t};
        // Take earlier tensors until the bucket holds bucket_bytes.
        while (t >= 0 && (b.count == 0 || b.count * sizeof(float) < bucket_bytes)) {
            b.offset = offset[t];
            b.count += numel[t];
            b.first_tensor = t;
            b.n_tensors++;
            t--;
        }
        ARRAY_PUSH(out->buckets, out->n_buckets, cap, b);
    }
    free(offset);
}

void bucket_plan_free(BucketPlan *plan) {
    free(plan->buckets);
    *plan = (BucketPlan){0};
}
