// CPU decode attention (attention/attention_decode_cpu.c, the oracle of the CUDA kernel)
// against the block-sparse CPU attention (attention_cpu.c, itself checked against a dense
// double attention): a token with n_keys = m over its slot's cache equals the causal
// forward over that cache at query row m - 1. Random q and caches, GQA groups 1..4, head
// dims 32, 36 and 64, cache lengths 1..97 and tokens of no key (zero output).
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "attention/attention.h"
#include "attention/attention_decode.h"
#include "common/check.h"
#include "tests/test_util.h"

static float *random_floats(TestRng *rng, size_t n) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * test_rng_uniform(rng);
    return x;
}

static void decode_case(TestRng *rng, int n_tokens, int n_heads, int n_kv_heads, int head_dim,
                        int n_seqs, int max_len) {
    const int H = n_heads, D = head_dim, S = max_len;
    const size_t row = (size_t)H * D, cache = (size_t)n_seqs * S * n_kv_heads * D;
    float *q = random_floats(rng, (size_t)n_tokens * row);
    float *k = random_floats(rng, cache), *v = random_floats(rng, cache);
    float *out = xmalloc((size_t)n_tokens * row * sizeof(float));
    int32_t *slot = xmalloc((size_t)n_tokens * sizeof(int32_t));
    int32_t *n_keys = xmalloc((size_t)n_tokens * sizeof(int32_t));
    for (int i = 0; i < n_tokens; i++) {
        slot[i] = test_rng_int(rng, 0, n_seqs - 1);
        n_keys[i] = i == 0 ? S : i == 1 ? 0 : test_rng_int(rng, 0, S);
    }
    const DecodeShape shape = {n_tokens, H, n_kv_heads, D, n_seqs, S, S, 1.0f / sqrtf((float)D)};
    attention_decode_cpu(&shape, q, k, v, slot, n_keys, out);

    // The causal forward over one slot's cache with the token's query at row n_keys - 1.
    int32_t *lo = xmalloc((size_t)S * sizeof(int32_t)), *hi = xmalloc((size_t)S * sizeof(int32_t));
    for (int j = 0; j < S; j++) lo[j] = j, hi[j] = S;
    AttnMask mask;
    attn_mask_build(lo, hi, 1, S, 16, 16, &mask);
    const AttnShape full = {1, S, H, n_kv_heads, D, shape.scale};
    float *q_rows = xcalloc((size_t)S * row, sizeof(float));
    float *want = xmalloc((size_t)S * row * sizeof(float)), *lse = xmalloc((size_t)S * H * sizeof(float));
    double max_err = 0.0, max_ref = 1e-30;
    int nonzero_empty = 0;
    for (int i = 0; i < n_tokens; i++) {
        const float *got = out + (size_t)i * row;
        if (n_keys[i] == 0) {
            for (size_t j = 0; j < row; j++) nonzero_empty += got[j] != 0.0f;
            continue;
        }
        const int at = n_keys[i] - 1;
        memcpy(q_rows + (size_t)at * row, q + (size_t)i * row, row * sizeof(float));
        const size_t base = (size_t)slot[i] * S * n_kv_heads * D;
        attention_forward_cpu(&full, &mask, q_rows, k + base, v + base, want, lse);
        for (size_t j = 0; j < row; j++) {
            const float w = want[(size_t)at * row + j];
            max_err = isfinite(got[j]) ? fmax(max_err, fabs(got[j] - w)) : INFINITY;
            max_ref = fmax(max_ref, fabs(w));
        }
    }
    const double rel = max_err / max_ref;
    printf("  N=%d H=%d KV=%d D=%d cache %dx%d: max error %.2e of %.3f\n", n_tokens, H,
           n_kv_heads, D, n_seqs, S, max_err, max_ref);
    EXPECT(rel <= 1e-5, "decode N=%d H=%d KV=%d D=%d: relative error %.3e", n_tokens, H,
           n_kv_heads, D, rel);
    EXPECT(nonzero_empty == 0, "decode D=%d: %d nonzero outputs of tokens with no key", D,
           nonzero_empty);
    attn_mask_free(&mask);
    free(q), free(k), free(v), free(out), free(slot), free(n_keys), free(lo), free(hi);
    free(q_rows), free(want), free(lse);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    decode_case(&rng, 24, 8, 2, 64, 3, 97);
    decode_case(&rng, 16, 4, 4, 32, 5, 40);
    decode_case(&rng, 12, 6, 3, 36, 2, 65);
    decode_case(&rng, 3, 4, 1, 64, 1, 1);
    return test_finish();
}
