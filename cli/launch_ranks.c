#define _POSIX_C_SOURCE 200809L
#include "cli/launch_ranks.h"

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/check.h"
#include "dist/distributed.h"

enum { MAX_LOCAL_RANKS = 64 };

int take_gpus_arg(int *argc, char **argv) {
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], "--gpus") != 0) continue;
        char *end = NULL;
        const long v = i + 1 < *argc ? strtol(argv[i + 1], &end, 10) : 0;
        if (!end || end == argv[i + 1] || *end || v < 1 || v > MAX_LOCAL_RANKS)
            fatal("--gpus: expected a number of processes in [1, %d], got '%s'", MAX_LOCAL_RANKS,
                  i + 1 < *argc ? argv[i + 1] : "");
        n = (int)v;
        memmove(argv + i, argv + i + 2, (size_t)(*argc - i - 2) * sizeof *argv);
        *argc -= 2;
        i--;
    }
    return n;
}

// A port nobody listens on now (the kernel's pick); rank 0 binds it a moment later.
static int free_loopback_port(void) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        fatal("--gpus: no free local port for MASTER_PORT: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static volatile sig_atomic_t forwarded_signal;

static void on_signal(int sig) { forwarded_signal = sig; }

static void set_env_int(const char *name, int value) {
    char text[16];
    snprintf(text, sizeof text, "%d", value);
    setenv(name, text, 1);
}

static void stop_ranks(const pid_t *pids, const int *done, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (!done[r]) kill(pids[r], sig);
}

int launch_local_ranks(int n, int argc, char **argv) {
    DistEnv outer;
    char err[512];
    if (dist_env_parse(env_lookup_getenv, NULL, &outer, err, sizeof err) != 0) fatal("%s", err);
    if (outer.world_size > 1)
        fatal("--gpus %d: this process is rank %d of %d under %s already; start either one "
              "process per GPU with the launcher or `train --gpus N`, not both", n, outer.rank,
              outer.world_size, launcher_name(outer.launcher));
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) fatal("--gpus: cannot find this program (/proc/self/exe): %s", strerror(errno));
    self[len] = 0;
    char **child_argv = xcalloc((size_t)argc + 3, sizeof *child_argv);
    child_argv[0] = self;
    child_argv[1] = "run";
    memcpy(child_argv + 2, argv, (size_t)argc * sizeof *argv);

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    const int port = free_loopback_port();
    // Like torchrun: the ranks share the cores rather than each taking them all.
    if (!getenv("OMP_NUM_THREADS")) {
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        set_env_int("OMP_NUM_THREADS", cores > n ? (int)(cores / n) : 1);
    }
    printf("train --gpus %d: starting ranks 0..%d (MASTER_ADDR=127.0.0.1 MASTER_PORT=%d, "
           "OMP_NUM_THREADS=%s)\n", n, n - 1, port, getenv("OMP_NUM_THREADS"));
    fflush(stdout);
    pid_t pids[MAX_LOCAL_RANKS];
    int done[MAX_LOCAL_RANKS] = {0};
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            stop_ranks(pids, done, r, SIGTERM);
            fatal("--gpus: fork: %s", strerror(errno));
        }
        if (pids[r] > 0) continue;
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        set_env_int("RANK", r);
        set_env_int("WORLD_SIZE", n);
        set_env_int("LOCAL_RANK", r);
        set_env_int("LOCAL_WORLD_SIZE", n);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        set_env_int("MASTER_PORT", port);
        execv(self, child_argv);
        fprintf(stderr, "onepass: error: --gpus: exec %s: %s\n", self, strerror(errno));
        _exit(127);
    }
    int failed_rank = -1, failed_status = 0, left = n, stop_sent = 0;
    while (left > 0) {
        int status;
        const pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno != EINTR) break;
            // Ctrl-C reaches the ranks from the terminal (one process group): a second
            // SIGINT would kill them before their checkpoint. A SIGTERM is forwarded.
            if (forwarded_signal == SIGTERM && !stop_sent) {
                stop_ranks(pids, done, n, SIGTERM);
                stop_sent = 1;
            }
            continue;
        }
        int r = 0;
        while (r < n && pids[r] != pid) r++;
        if (r == n) continue;
        done[r] = 1;
        left--;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code != 0 && failed_rank < 0) {
            failed_rank = r;
            failed_status = code;
            fprintf(stderr, "onepass: error: --gpus %d: rank %d %s %d; stopping the other ranks\n",
                    n, r, WIFEXITED(status) ? "exited with status" : "was killed by signal",
                    WIFEXITED(status) ? code : WTERMSIG(status));
            stop_ranks(pids, done, n, SIGTERM);
        }
    }
    free(child_argv);
    return failed_rank < 0 ? 0 : failed_status;
}
