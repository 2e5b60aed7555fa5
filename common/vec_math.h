// Comparisons of float vectors in double precision, shared by reports and tests.
#pragma once
#include <math.h>
#include <stddef.h>

// Cosine similarity: 1 when both are all zeros, 0 when only one is.
static inline double cosine_similarity(const float *a, const float *b, size_t n) {
    double dot = 0.0, aa = 0.0, bb = 0.0;
    for (size_t i = 0; i < n; i++) {
        dot += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0.0 && bb == 0.0) return 1.0;
    return aa > 0.0 && bb > 0.0 ? dot / sqrt(aa * bb) : 0.0;
}
