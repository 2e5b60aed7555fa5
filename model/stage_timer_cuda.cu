// The per-stage timer of the CUDA model (model/stage_timer_cuda.cuh).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/cuda_check.h"
#include "model/stage_timer_cuda.cuh"

// Ranges per step beyond STAGE_MAX_RANGES are not timed; names beyond STAGE_MAX_NAMES
// are not reported.
enum { STAGE_MAX_RANGES = 4096, STAGE_MAX_NAMES = 48, STAGE_WARMUP_STEPS = 2 };

struct StageTimer {
    cudaStream_t stream;
    int n_ranges;           // closed ranges of the current step
    const char *open_name;  // the open range's stage, NULL between ranges
    int n_names, steps, steps_seen;
    cudaEvent_t begin[STAGE_MAX_RANGES], end[STAGE_MAX_RANGES];  // created on first use
    const char *range_names[STAGE_MAX_RANGES];
    const char *names[STAGE_MAX_NAMES];
    double total_ms[STAGE_MAX_NAMES];
};

StageTimer *stage_timer_from_env(cudaStream_t stream) {
    const char *stage_times = getenv("ONEPASS_STAGE_TIMES");
    if (!stage_times || strcmp(stage_times, "1") != 0) return NULL;
    StageTimer *t = (StageTimer *)xcalloc(1, sizeof(StageTimer));
    t->stream = stream;
    return t;
}

static void record(cudaEvent_t *event, cudaStream_t stream) {
    if (!*event) cudaCheck(cudaEventCreate(event));
    cudaCheck(cudaEventRecord(*event, stream));
}

void stage_timer_open(StageTimer *t, const char *name) {
    if (!t) return;
    CHECK(!t->open_name, "stage \"%s\" opened inside stage \"%s\"", name, t->open_name);
    t->open_name = name;
    if (t->n_ranges < STAGE_MAX_RANGES) record(&t->begin[t->n_ranges], t->stream);
}

void stage_timer_close(StageTimer *t) {
    if (!t) return;
    CHECK(t->open_name, "stage closed without being opened");
    if (t->n_ranges < STAGE_MAX_RANGES) {
        record(&t->end[t->n_ranges], t->stream);
        t->range_names[t->n_ranges++] = t->open_name;
    }
    t->open_name = NULL;
}

void stage_timer_collect(StageTimer *t) {
    if (!t || t->n_ranges == 0) return;
    if (t->steps_seen++ < STAGE_WARMUP_STEPS) {
        t->n_ranges = 0;
        return;
    }
    for (int i = 0; i < t->n_ranges; i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, t->begin[i], t->end[i]));
        int k = 0;
        while (k < t->n_names && strcmp(t->names[k], t->range_names[i]) != 0) k++;
        if (k == STAGE_MAX_NAMES) continue;
        if (k == t->n_names) t->names[t->n_names++] = t->range_names[i];
        t->total_ms[k] += ms;
    }
    t->steps++;
    t->n_ranges = 0;
}

void stage_timer_print_and_free(StageTimer *t) {
    if (!t) return;
    double sum = 0.0;
    printf("{\"stage_ms_per_step\": {");
    for (int k = 0; k < t->n_names; k++) {
        const double ms = t->total_ms[k] / (t->steps ? t->steps : 1);
        sum += ms;
        printf("%s\"%s\": %.3f", k ? ", " : "", t->names[k], ms);
    }
    printf("}, \"sum_ms\": %.3f, \"steps\": %d}\n", sum, t->steps);
    for (int i = 0; i < STAGE_MAX_RANGES; i++) {
        if (t->begin[i]) cudaCheck(cudaEventDestroy(t->begin[i]));
        if (t->end[i]) cudaCheck(cudaEventDestroy(t->end[i]));
    }
    free(t);
}
