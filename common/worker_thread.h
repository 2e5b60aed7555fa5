// Starting a helper thread of the training process (the data prefetcher, the offloaded
// optimizer's update): stop signals (SIGINT, SIGTERM) stay with the training thread, which
// finishes its step and checkpoints, so the new thread starts with them blocked.
#pragma once
#include <pthread.h>
#include <signal.h>

#include "common/check.h"

// Starts fn(arg) in *thread; what names the thread in the error when it cannot start.
static inline void worker_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg,
                                       const char *what) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    const int rc = pthread_create(thread, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) fatal("%s: cannot start its thread (error %d)", what, rc);
}
