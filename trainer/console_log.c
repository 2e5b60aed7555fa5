#define _DEFAULT_SOURCE  // usleep, FIONREAD
#include "trainer/console_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "common/check.h"

static struct {
    bool on;
    int saved[2];   // the console's stdout and stderr
    int pipes[2];   // the read ends
    pthread_t threads[2];
    pthread_mutex_t mu;
    int log_fd;     // -1: not attached yet (kept in buf)
    char *buf;
    size_t len, cap;
} L = {.log_fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        const ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;  // the console or the log is gone: nothing to do about it here
        p += w;
        n -= (size_t)w;
    }
}

static void *pump(void *arg) {
    const int which = (int)(intptr_t)arg;
    char chunk[4096];
    for (;;) {
        const ssize_t n = read(L.pipes[which], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        // stderr after what stdout holds already: the order the run printed them in.
        for (int tries = 0, pending = 1; which == 1 && pending > 0 && tries < 2000; tries++)
            if (ioctl(L.pipes[0], FIONREAD, &pending) != 0 || (pending > 0 && usleep(100) != 0)) break;
        pthread_mutex_lock(&L.mu);
        write_all(L.saved[which], chunk, (size_t)n);
        if (L.log_fd >= 0) {
            write_all(L.log_fd, chunk, (size_t)n);
        } else {
            if (L.len + (size_t)n > L.cap) L.buf = xrealloc(L.buf, L.cap = 2 * (L.len + (size_t)n));
            memcpy(L.buf + L.len, chunk, (size_t)n);
            L.len += (size_t)n;
        }
        pthread_mutex_unlock(&L.mu);
    }
    return NULL;
}

int console_log_begin(char *err, size_t err_len) {
    if (L.on) return 0;
    fflush(stdout);
    fflush(stderr);
    int p[2][2];
    if (pipe(p[0]) != 0) return fail(err, err_len, "train.log: pipe: %s", strerror(errno));
    if (pipe(p[1]) != 0) {
        close(p[0][0]);
        close(p[0][1]);
        return fail(err, err_len, "train.log: pipe: %s", strerror(errno));
    }
    for (int i = 0; i < 2; i++) {
        L.saved[i] = dup(1 + i);
        L.pipes[i] = p[i][0];
        dup2(p[i][1], 1 + i);
        close(p[i][1]);
        pthread_create(&L.threads[i], NULL, pump, (void *)(intptr_t)i);
    }
    L.on = true;
    atexit(console_log_end);
    return 0;
}

int console_log_attach(const char *dir, bool append, char *err, size_t err_len) {
    if (!L.on) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/train.log", dir);
    fflush(stdout);
    const int fd = open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd < 0) return fail(err, err_len, "%s: %s", path, strerror(errno));
    pthread_mutex_lock(&L.mu);
    write_all(fd, L.buf, L.len);
    free(L.buf);
    L.buf = NULL;
    L.len = L.cap = 0;
    L.log_fd = fd;
    pthread_mutex_unlock(&L.mu);
    return 0;
}

void console_log_end(void) {
    if (!L.on) return;
    L.on = false;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2; i++) dup2(L.saved[i], 1 + i);  // closes the pipes' write ends
    for (int i = 0; i < 2; i++) {
        pthread_join(L.threads[i], NULL);
        close(L.pipes[i]);
        close(L.saved[i]);
    }
    if (L.log_fd >= 0) close(L.log_fd);
    L.log_fd = -1;
    free(L.buf);
    L.buf = NULL;
}
