// Minimal test harness: EXPECT records a failure and continues; test_finish prints
// the closing "N passed, N failed" line and returns the exit code.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include "common/vec_math.h"

static int test_passed_count, test_failed_count;

#define EXPECT(cond, ...)                                                            \
    do {                                                                            \
        if (cond) {                                                                 \
            test_passed_count++;                                                    \
        } else {                                                                    \
            test_failed_count++;                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
        }                                                                           \
    } while (0)

static inline int test_finish(void) {
    printf("%d passed, %d failed\n", test_passed_count, test_failed_count);
    return test_failed_count ? 1 : 0;
}

// Deterministic-per-run random numbers (xorshift64*); seed from the environment
// variable TEST_SEED when set, else from the clock, and print it so a failure
// can be replayed.
typedef struct { uint64_t s; } TestRng;
static inline uint64_t test_rng_next(TestRng *r) {
    r->s ^= r->s >> 12; r->s ^= r->s << 25; r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ULL;
}
static inline int test_rng_int(TestRng *r, int lo, int hi_inclusive) {
    return lo + (int)(test_rng_next(r) % (uint64_t)(hi_inclusive - lo + 1));
}
static inline float test_rng_uniform(TestRng *r) {  // [-1, 1)
    return (float)((test_rng_next(r) >> 40) * (1.0 / (1ULL << 24))) * 2.0f - 1.0f;
}
#include <stdlib.h>
#include <time.h>

// Comparisons shared by the tests. A NaN or an infinity in the values under test makes
// the error +inf (fmax alone would step over a NaN).
// max |x|.
static inline double test_max_abs(const float *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return INFINITY;
        m = fmax(m, fabs(x[i]));
    }
    return m;
}
// max |got - want| / max |want|: the error of `got` relative to the reference's scale.
static inline double test_relative_error(const float *got, const double *want, size_t n) {
    double max_diff = 0.0, max_want = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        max_diff = fmax(max_diff, fabs(got[i] - want[i]));
        max_want = fmax(max_want, fabs(want[i]));
    }
    return max_diff / max_want;
}
// Cosine similarity in double (common/vec_math.h).
static inline double test_cosine(const float *a, const float *b, size_t n) {
    return cosine_similarity(a, b, n);
}
static inline TestRng test_rng_from_env(void) {
    const char *env = getenv("TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("TEST_SEED=%llu\n", (unsigned long long)seed);
    TestRng r = {seed * 0x9E3779B97F4A7C15ULL + 1};
    return r;
}
