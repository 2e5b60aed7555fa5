// An fp32 value stored as two 16-bit halves, so that the high half is the value's bf16
// rounding (the CUDA backend's master weights, trainer/backend_cuda.cu: the bf16 weights
// the model runs on ARE the high halves, and a [n] uint16 low half beside them replaces
// a separate fp32 master copy, 2 bytes per parameter less). For the fp32 bits b:
//   hi = (b + 0x8000) >> 16   bf16 rounded to nearest, ties AWAY from zero (the carry
//                             of the add is the rounding up; it never reaches the sign:
//                             the largest non-NaN magnitude, inf, is 0x7F800000)
//   lo = b & 0xFFFF
// and back: b = ((hi - (lo >= 0x8000)) << 16) | lo, since hi was rounded up exactly
// when lo >= 0x8000. Exact for every non-NaN pattern (finite, denormal, -0, +-inf): the
// master trajectory is bitwise the fp32 one. The bf16 value differs from round to
// nearest EVEN (__float2bfloat16_rn) only at exact ties (lo == 0x8000 with an even high
// half). A NaN is kept a NaN (its high half with the quiet bit set; its decode a NaN, not
// necessarily the same one). Host and device (nvcc) alike; tests/test_split_float.c
// checks every pattern.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SPLIT_FLOAT_FN static inline __host__ __device__
#else
#define SPLIT_FLOAT_FN static inline
#endif

SPLIT_FLOAT_FN uint16_t split_float_hi(uint32_t b) {
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((b >> 16) | 0x0040u);  // NaN
    return (uint16_t)((b + 0x8000u) >> 16);
}

SPLIT_FLOAT_FN uint32_t split_float_join(uint16_t hi, uint16_t lo) {
    return ((uint32_t)(uint16_t)(hi - (lo >> 15)) << 16) | lo;
}

// The host side of set_state / get_state: n floats <-> their halves.
static inline void split_floats(const float *x, size_t n, uint16_t *hi, uint16_t *lo) {
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], sizeof b);
        hi[i] = split_float_hi(b);
        lo[i] = (uint16_t)b;
    }
}

static inline void join_floats(const uint16_t *hi, const uint16_t *lo, size_t n, float *x) {
    for (size_t i = 0; i < n; i++) {
        const uint32_t b = split_float_join(hi[i], lo[i]);
        memcpy(&x[i], &b, sizeof b);
    }
}
