// trainer/split_float.h, the CUDA backend's split master weights:
//  - every one of the 2^32 - 2^24 non-NaN fp32 bit patterns comes back bit for bit from
//    its halves (exhaustive: 6 s at -O2, 40 s with ASan + UBSan at -O0);
//  - the high half is the value rounded to bf16 to nearest with ties away from zero,
//    against a rounding computed here in double arithmetic (round() on the value scaled
//    to its bf16 quantum, overflow to inf by hand), over every high half with the low
//    halves around the tie, ties exactly, and 4M random patterns; it equals round to
//    nearest even (nearbyint) except at ties, where it is the larger magnitude;
//  - each of the 2^24 NaN patterns splits into a NaN high half and joins to a NaN;
//  - the array helpers split_floats / join_floats round-trip edge values exactly.
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "test_util.h"
#include "trainer/split_float.h"

static float from_bits(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static bool is_nan_bits(uint32_t b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }

// x (finite or inf) rounded to bf16 (8 significant bits, exponents down to -126, then
// the fixed quantum 2^-133 of its denormals), in double: ties away from zero with
// round(), to even with nearbyint() (the default rounding mode).
static double bf16_round(double x, bool ties_even) {
    if (isinf(x) || x == 0.0) return x;
    const int e = ilogb(x) < -126 ? -126 : ilogb(x);
    const double quantum = ldexp(1.0, e - 7);
    const double r = (ties_even ? nearbyint(x / quantum) : round(x / quantum)) * quantum;
    const double bf16_max = ldexp(255.0, 120);  // 0x7F7F: (2 - 2^-7) 2^127
    return fabs(r) > bf16_max ? copysign(INFINITY, x) : r;
}

// The double value and its sign bit equal the bf16 whose bits are hi.
static bool same_value(uint16_t hi, double want) {
    const double got = from_bits((uint32_t)hi << 16);
    return got == want && signbit(got) == signbit(want);
}

int main(void) {
    TestRng rng = test_rng_from_env();

    // Round trip, exhaustively.
    uint64_t mismatches = 0, first_bad = 0;
    for (uint64_t i = 0; i < ((uint64_t)1 << 32); i++) {
        const uint32_t b = (uint32_t)i;
        if (is_nan_bits(b)) continue;
        if (split_float_join(split_float_hi(b), (uint16_t)b) != b && mismatches++ == 0)
            first_bad = i;
    }
    EXPECT(mismatches == 0, "%llu non-NaN patterns do not round-trip (first 0x%08llx)",
           (unsigned long long)mismatches, (unsigned long long)first_bad);

    // The high half against the double rounding: every high half x low halves around
    // the tie, then random patterns.
    static const uint16_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
    uint64_t checked = 0, wrong = 0, not_even = 0, ties = 0, ties_up = 0;
    uint32_t bad_bits = 0;
    for (uint64_t k = 0; k < 65536 * 6 + 4000000; k++) {
        const uint32_t b = k < 65536 * 6 ? (uint32_t)(k / 6) << 16 | lows[k % 6]
                                         : (uint32_t)test_rng_next(&rng);
        if (is_nan_bits(b)) continue;
        const double x = from_bits(b);
        const uint16_t hi = split_float_hi(b);
        checked++;
        if (!same_value(hi, bf16_round(x, false)) && wrong++ == 0) bad_bits = b;
        const bool tie = (b & 0xFFFF) == 0x8000;
        if (!tie) {
            not_even += !same_value(hi, bf16_round(x, true));
        } else {
            ties++;
            const double even = bf16_round(x, true);
            // An odd high half rounds up either way; an even one: away from zero, not kept.
            ties_up += same_value(hi, even) == ((b >> 16 & 1) == 1);
        }
    }
    EXPECT(wrong == 0, "%llu of %llu high halves are not round-half-away (first 0x%08x -> 0x%04x)",
           (unsigned long long)wrong, (unsigned long long)checked, bad_bits,
           split_float_hi(bad_bits));
    EXPECT(not_even == 0 && ties > 65000 && ties_up == ties,
           "round to nearest even except at ties: %llu differ off ties; %llu of %llu ties "
           "as expected (even kept, odd rounded away)",
           (unsigned long long)not_even, (unsigned long long)ties_up, (unsigned long long)ties);

    // Named edges.
    const struct { uint32_t bits, hi; } edges[] = {
        {0x00000000, 0x0000}, {0x80000000, 0x8000},  // +-0
        {0x00000001, 0x0000}, {0x00008000, 0x0001},  // smallest denormal; a denormal tie
        {0x807FFFFF, 0x8080},                        // largest denormal rounds to -2^-126
        {0x3F808000, 0x3F81}, {0x3F818000, 0x3F82},  // ties: even and odd halves both go up
        {0xBF808000, 0xBF81},                        // a negative tie: away from zero
        {0x3F807FFF, 0x3F80},                        // just below a tie
        {0x7F7F7FFF, 0x7F7F}, {0x7F7F8000, 0x7F80},  // below / at the overflow tie
        {0x7F7FFFFF, 0x7F80}, {0xFF7FFFFF, 0xFF80},  // FLT_MAX -> inf, -FLT_MAX -> -inf
        {0x7F800000, 0x7F80}, {0xFF800000, 0xFF80},  // +-inf
    };
    int bad_edges = 0;
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        const uint16_t hi = split_float_hi(edges[i].bits);
        if (hi != edges[i].hi || split_float_join(hi, (uint16_t)edges[i].bits) != edges[i].bits) {
            bad_edges++;
            fprintf(stderr, "  0x%08x: high half 0x%04x (want 0x%04x), joined 0x%08x\n",
                    edges[i].bits, hi, edges[i].hi, split_float_join(hi, (uint16_t)edges[i].bits));
        }
    }
    EXPECT(bad_edges == 0, "%d edge values split or join wrongly", bad_edges);

    // NaN: every pattern, either sign.
    uint64_t lost = 0;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t mantissa = 1; mantissa < (1u << 23); mantissa++) {
            const uint32_t b = sign << 31 | 0x7F800000u | mantissa;
            const uint16_t hi = split_float_hi(b);
            lost += !isnan(from_bits((uint32_t)hi << 16)) ||
                    !isnan(from_bits(split_float_join(hi, (uint16_t)b)));
        }
    EXPECT(lost == 0, "%llu NaN patterns lose their NaN", (unsigned long long)lost);

    // The array helpers.
    enum { N = 12 };
    float x[N] = {0.0f, -0.0f, 1e-45f, -1.17549421e-38f, 3.40282347e38f, -INFINITY, INFINITY,
                  1.00390625f, -1.00390625f, 0.1f, 0.0f, 0.0f};
    x[10] = test_rng_uniform(&rng), x[11] = 1e-3f * test_rng_uniform(&rng);
    uint16_t hi[N], lo[N];
    float back[N];
    split_floats(x, N, hi, lo);
    join_floats(hi, lo, N, back);
    EXPECT(!memcmp(back, x, sizeof x) && hi[7] == 0x3F81 && lo[7] == 0x8000 && hi[1] == 0x8000,
           "split_floats / join_floats round-trip bit for bit (1.00390625 -> 0x%04x|0x%04x)",
           hi[7], lo[7]);
    float nan_in = NAN, nan_back;
    split_floats(&nan_in, 1, hi, lo);
    join_floats(hi, lo, 1, &nan_back);
    EXPECT(isnan(nan_back), "NaN through the array helpers stays NaN");
    return test_finish();
}
