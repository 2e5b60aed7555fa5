// The offloaded optimizer's schedule (trainer/offload_pipeline.h): a worker thread that
// runs one update at a time over the chunks, in order, publishing each chunk once its
// upload is queued.
#define _POSIX_C_SOURCE 200809L
#include "trainer/offload_pipeline.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/check.h"

struct OffloadPipeline {
    OffloadStages stages;
    int n_chunks, slots;
    int threads;  // the update's OpenMP team; 0: the default
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    // Under lock:
    bool requested;  // start asked for an update the worker has not yet taken
    bool running;    // started, and finish has not yet returned for it
    bool quit;       // destroy: the worker returns
    int uploaded;    // chunks [0, uploaded) of the latest update are uploaded (queued)
    bool finite;     // every chunk of the latest update updated so far is finite
};

// One update: the stages in the order the header promises. Only this thread touches
// the ring; `uploaded` and `finite` are published under the lock.
static void run_update(OffloadPipeline *p) {
    const OffloadStages *s = &p->stages;
    for (int c = 0; c < p->n_chunks && c < p->slots; c++) s->download(s->ctx, c, c % p->slots);
    for (int c = 0; c < p->n_chunks; c++) {
        const int slot = c % p->slots;
        s->wait_download(s->ctx, c);
        const bool finite = s->update(s->ctx, c, slot);
        // The slot's reader (update) has returned: the chunk `slots` later may come in.
        if (c + p->slots < p->n_chunks) s->download(s->ctx, c + p->slots, slot);
        s->upload(s->ctx, c);
        pthread_mutex_lock(&p->lock);
        p->finite = p->finite && finite;
        p->uploaded = c + 1;
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
    }
}

static void *worker(void *arg) {
    OffloadPipeline *p = arg;
#ifdef _OPENMP
    if (p->threads > 0) omp_set_num_threads(p->threads);  // this thread's teams only
#endif
    if (p->stages.thread_init) p->stages.thread_init(p->stages.ctx);
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (!p->requested && !p->quit) pthread_cond_wait(&p->changed, &p->lock);
        const bool quit = p->quit && !p->requested;
        p->requested = false;
        pthread_mutex_unlock(&p->lock);
        if (quit) break;
        run_update(p);
    }
    return NULL;
}

OffloadPipeline *offload_pipeline_create(int n_chunks, int slots, const OffloadStages *stages) {
    CHECK(n_chunks >= 1 && slots >= 1 && stages->download && stages->wait_download &&
              stages->update && stages->upload,
          "offload pipeline: %d chunks, %d ring slots, or a stage missing", n_chunks, slots);
    OffloadPipeline *p = xcalloc(1, sizeof *p);
    p->stages = *stages;
    p->n_chunks = n_chunks;
    p->slots = slots;
    p->uploaded = n_chunks;  // nothing pending
    p->finite = true;
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
    p->threads = threads > 2 ? threads - 1 : threads;
#endif
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->changed, NULL);
    // Stop signals go to the training thread (it checkpoints), not to the worker.
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    const int rc = pthread_create(&p->thread, NULL, worker, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) fatal("offloaded optimizer: cannot start the update thread (error %d)", rc);
    return p;
}

void offload_pipeline_start(OffloadPipeline *p) {
    pthread_mutex_lock(&p->lock);
    const bool busy = p->running;
    if (!busy) {
        p->running = p->requested = true;
        p->uploaded = 0;
        p->finite = true;
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->lock);
    if (busy) fatal("internal: an offloaded update started while another one runs");
}

bool offload_pipeline_wait_uploaded(OffloadPipeline *p, int k) {
    if (k > p->n_chunks) k = p->n_chunks;
    pthread_mutex_lock(&p->lock);
    while (p->uploaded < k) pthread_cond_wait(&p->changed, &p->lock);
    const bool finite = p->finite;
    pthread_mutex_unlock(&p->lock);
    return finite;
}

bool offload_pipeline_running(OffloadPipeline *p) {
    pthread_mutex_lock(&p->lock);
    const bool running = p->running;
    pthread_mutex_unlock(&p->lock);
    return running;
}

bool offload_pipeline_finish(OffloadPipeline *p) {
    pthread_mutex_lock(&p->lock);
    while (p->uploaded < p->n_chunks) pthread_cond_wait(&p->changed, &p->lock);
    p->running = false;
    const bool finite = p->finite;
    pthread_mutex_unlock(&p->lock);
    return finite;
}

void offload_pipeline_destroy(OffloadPipeline *p) {
    if (!p) return;
    offload_pipeline_finish(p);
    pthread_mutex_lock(&p->lock);
    p->quit = true;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->changed);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
