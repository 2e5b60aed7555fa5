// Fatal paths under test: a call run in a forked child whose stderr is kept.
#pragma once
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

// Runs fn(arg) in a child process and returns its exit status (0 when fn returns, -1
// when it did not exit); its stderr goes into out (NUL-terminated, out_len at most).
static inline int test_run_in_child(void (*fn)(void *), void *arg, char *out, size_t out_len) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < out_len && (got = read(fds[0], out + n, out_len - 1 - n)) > 0) n += (size_t)got;
    out[n] = '\0';
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
