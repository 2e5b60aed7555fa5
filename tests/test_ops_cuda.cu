// Every CUDA model op (model/ops_cuda.h) against its CPU twin (model/ops.h), and the
// CUDA AdamW against the CPU one (trainer/adamw.h). Inputs are random (fresh each
// run, replay with TEST_SEED) and rounded to bf16 (AdamW's: full fp32), so the CPU op
// sees exactly the values the GPU op reads; outputs are poisoned with NaN bit patterns
// first, so an element the op never writes shows up as non-finite. Accumulating outputs
// start random.
// Metric: ||gpu - cpu|| / ||cpu||, at most 1e-2 for bf16 outputs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>
extern "C" {
#include "model/model.h"
#include "model/ops.h"
}
#include "common/cuda_check.h"
#include "model/ops_cuda.h"
#include "tests/test_util.h"
#include "trainer/adamw.h"
#include "trainer/split_float.h"

typedef __nv_bfloat16 bf16;

static const double BF16_TOL = 1e-2;  // outputs stored in bf16
static const double FP32_TOL = 1e-4;  // fp32 outputs whose summation order differs

static TestRng rng;

// ------------------------------------------------------------------ helpers

// Every device buffer of the test, freed together at the end.
static void *device_buffers[256];
static int n_device_buffers;

static void *device_alloc(size_t bytes) {
    if (n_device_buffers == (int)(sizeof device_buffers / sizeof device_buffers[0]))
        fatal("test_ops_cuda: too many device buffers");
    void *p;
    cudaCheck(cudaMalloc(&p, bytes ? bytes : 1));
    device_buffers[n_device_buffers++] = p;
    return p;
}

static void device_free_all(void) {
    for (int i = 0; i < n_device_buffers; i++) cudaCheck(cudaFree(device_buffers[i]));
    n_device_buffers = 0;
}

static float *host_floats(size_t n) { return (float *)xmalloc(n * sizeof(float)); }

static float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// n values uniform in [-scale, scale) + offset, rounded to bf16 (exactly representable).
static float *random_bf16_values(size_t n, float scale, float offset) {
    float *x = host_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = round_bf16(offset + scale * test_rng_uniform(&rng));
    return x;
}

static float *copy_floats(const float *x, size_t n) {
    float *c = host_floats(n);
    memcpy(c, x, n * sizeof(float));
    return c;
}

static bf16 *upload_bf16(const float *host, size_t n) {
    bf16 *staging = (bf16 *)xmalloc(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) staging[i] = __float2bfloat16_rn(host[i]);
    bf16 *dev = (bf16 *)device_alloc(n * sizeof(bf16));
    cudaCheck(cudaMemcpy(dev, staging, n * sizeof(bf16), cudaMemcpyHostToDevice));
    free(staging);
    return dev;
}

static void upload_bf16_into(bf16 *dev, const float *host, size_t n) {
    bf16 *staging = (bf16 *)xmalloc(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) staging[i] = __float2bfloat16_rn(host[i]);
    cudaCheck(cudaMemcpy(dev, staging, n * sizeof(bf16), cudaMemcpyHostToDevice));
    free(staging);
}

static float *upload_f32(const float *host, size_t n) {
    float *dev = (float *)device_alloc(n * sizeof(float));
    cudaCheck(cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice));
    return dev;
}

static int32_t *upload_i32(const int32_t *host, size_t n) {
    int32_t *dev = (int32_t *)device_alloc(n * sizeof(int32_t));
    cudaCheck(cudaMemcpy(dev, host, n * sizeof(int32_t), cudaMemcpyHostToDevice));
    return dev;
}

// Waits for the GPU (surfacing asynchronous kernel faults here), then copies back.
static float *download_bf16(const bf16 *dev, size_t n) {
    cudaCheck(cudaDeviceSynchronize());
    bf16 *staging = (bf16 *)xmalloc(n * sizeof(bf16));
    cudaCheck(cudaMemcpy(staging, dev, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    float *host = host_floats(n);
    for (size_t i = 0; i < n; i++) host[i] = __bfloat162float(staging[i]);
    free(staging);
    return host;
}

static float *download_f32(const float *dev, size_t n) {
    cudaCheck(cudaDeviceSynchronize());
    float *host = host_floats(n);
    cudaCheck(cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

// All-ones bytes: NaN both as bf16 (0xFFFF) and as fp32 (0xFFFFFFFF).
static void poison(void *dev, size_t bytes) { cudaCheck(cudaMemset(dev, 0xFF, bytes)); }

// Prints one result line and checks: every element finite, relative L2 error <= tol.
static void expect_close(const char *what, const float *got, const float *ref, size_t n,
                         double tol) {
    size_t non_finite = 0;
    double diff_sq = 0.0, ref_sq = 0.0;
    for (size_t i = 0; i < n; i++) {
        ref_sq += (double)ref[i] * ref[i];
        if (!isfinite(got[i])) non_finite++;
        else diff_sq += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    }
    const double rel = ref_sq > 0.0 ? sqrt(diff_sq / ref_sq) : sqrt(diff_sq);
    const bool ok = non_finite == 0 && rel <= tol;
    printf("  %-44s rel_err %.3e (tol %.0e)  non-finite %zu/%zu  %s\n", what, rel, tol,
           non_finite, n, ok ? "ok" : "FAIL");
    EXPECT(non_finite == 0, "%s: %zu of %zu elements not finite (unwritten or NaN)", what,
          non_finite, n);
    EXPECT(rel <= tol, "%s: relative error %.3e > %.0e", what, rel, tol);
}

static void expect_bitwise(const char *what, bool equal) {
    printf("  %-44s %s\n", what, equal ? "bitwise equal ok" : "DIFFERS FAIL");
    EXPECT(equal, "%s: results are not bitwise equal", what);
}

static void expect_bitwise_equal(const char *what, const float *a, const float *b, size_t n) {
    expect_bitwise(what, memcmp(a, b, n * sizeof(float)) == 0);
}

// ------------------------------------------------------------------ ops

static void test_embedding(void) {
    printf("embedding\n");
    const int N = 4096, C = 768, V = 512;  // small V: most tokens repeat many times
    int32_t *tokens = (int32_t *)xmalloc(N * sizeof(int32_t));
    for (int n = 0; n < N; n++)  // a third of the positions share one hot token
        tokens[n] = n % 3 == 0 ? 7 : test_rng_int(&rng, 0, V - 1);
    float *wte = random_bf16_values((size_t)V * C, 1.0f, 0.0f);
    int32_t *d_tokens = upload_i32(tokens, N);
    bf16 *d_wte = upload_bf16(wte, (size_t)V * C);

    bf16 *d_out = (bf16 *)device_alloc((size_t)N * C * sizeof(bf16));
    poison(d_out, (size_t)N * C * sizeof(bf16));
    embedding_forward_cuda(d_out, d_tokens, d_wte, N, C, 0);
    float *out = download_bf16(d_out, (size_t)N * C);
    float *out_ref = host_floats((size_t)N * C);
    embedding_forward_cpu(out_ref, tokens, wte, N, C);
    expect_close("embedding_forward out", out, out_ref, (size_t)N * C, 0.0);

    float *dout = random_bf16_values((size_t)N * C, 1.0f, 0.0f);
    float *dwte_init = random_bf16_values((size_t)V * C, 1.0f, 0.0f);
    bf16 *d_dout = upload_bf16(dout, (size_t)N * C);
    float *d_dwte = (float *)device_alloc((size_t)V * C * sizeof(float));
    float *dwte_ref = copy_floats(dwte_init, (size_t)V * C);
    embedding_backward_cpu(dwte_ref, dout, tokens, N, C);
    float *first_dwte = NULL;
    bool all_equal = true;
    for (int run = 0; run < 5; run++) {
        cudaCheck(cudaMemcpy(d_dwte, dwte_init, (size_t)V * C * sizeof(float),
                             cudaMemcpyHostToDevice));
        embedding_backward_cuda(d_dwte, d_dout, d_tokens, N, C, 0);
        float *dwte = download_f32(d_dwte, (size_t)V * C);
        if (run == 0) {
            expect_close("embedding_backward dwte (accumulate)", dwte, dwte_ref, (size_t)V * C,
                         FP32_TOL);
            first_dwte = dwte;
            continue;
        }
        all_equal = all_equal && memcmp(dwte, first_dwte, (size_t)V * C * sizeof(float)) == 0;
        free(dwte);
    }
    expect_bitwise("embedding_backward dwte, 5 runs", all_equal);
    free(first_dwte), free(dwte_ref);
    free(tokens), free(wte), free(out), free(out_ref), free(dout), free(dwte_init);
}

// (N, C) = (4096, 768): a hidden-size norm; (4096 * 16, 128): narrow rows, a norm over
// each of 16 heads of head_dim 128 (the same op on [T * H, D]).
static void test_rmsnorm(int N, int C) {
    printf("rmsnorm N=%d C=%d\n", N, C);
    const float eps = 1e-5f;
    const size_t NC = (size_t)N * C;
    float *inp = random_bf16_values(NC, 2.0f, 0.0f);
    float *weight = random_bf16_values(C, 0.5f, 1.0f);
    bf16 *d_inp = upload_bf16(inp, NC), *d_weight = upload_bf16(weight, C);

    bf16 *d_out = (bf16 *)device_alloc(NC * sizeof(bf16));
    float *d_rstd = (float *)device_alloc(N * sizeof(float));
    poison(d_out, NC * sizeof(bf16));
    poison(d_rstd, N * sizeof(float));
    rmsnorm_forward_cuda(d_out, d_rstd, d_inp, d_weight, N, C, eps, 0);
    float *out = download_bf16(d_out, NC), *rstd = download_f32(d_rstd, N);
    float *out_ref = host_floats(NC), *rstd_ref = host_floats(N);
    rmsnorm_forward_cpu(out_ref, rstd_ref, inp, weight, N, C, eps);
    expect_close("rmsnorm_forward out", out, out_ref, NC, BF16_TOL);
    expect_close("rmsnorm_forward rstd", rstd, rstd_ref, N, FP32_TOL);

    // Backward from the CPU's rstd, so it is tested on its own.
    float *dout = random_bf16_values(NC, 1.0f, 0.0f);
    float *dinp_init = random_bf16_values(NC, 0.5f, 0.0f);
    float *dweight_init = random_bf16_values(C, 1.0f, 0.0f);
    bf16 *d_dout = upload_bf16(dout, NC), *d_dinp = upload_bf16(dinp_init, NC);
    float *d_rstd_ref = upload_f32(rstd_ref, N);
    float *d_dweight = upload_f32(dweight_init, C);
    float *dinp_ref = copy_floats(dinp_init, NC), *dweight_ref = copy_floats(dweight_init, C);
    rmsnorm_backward_cpu(dinp_ref, dweight_ref, dout, inp, weight, rstd_ref, N, C);

    float *first_dinp = NULL, *first_dweight = NULL;
    bool all_equal = true;
    for (int run = 0; run < 5; run++) {
        upload_bf16_into(d_dinp, dinp_init, NC);
        cudaCheck(cudaMemcpy(d_dweight, dweight_init, C * sizeof(float),
                             cudaMemcpyHostToDevice));
        rmsnorm_backward_cuda(d_dinp, d_dweight, d_dout, d_inp, d_weight, d_rstd_ref, N, C, 0);
        float *dinp = download_bf16(d_dinp, NC), *dweight = download_f32(d_dweight, C);
        if (run == 0) {
            expect_close("rmsnorm_backward dinp (accumulate)", dinp, dinp_ref, NC, BF16_TOL);
            expect_close("rmsnorm_backward dweight (accumulate)", dweight, dweight_ref, C,
                         FP32_TOL);
            first_dinp = dinp, first_dweight = dweight;
            continue;
        }
        all_equal = all_equal && memcmp(dinp, first_dinp, NC * sizeof(float)) == 0 &&
                    memcmp(dweight, first_dweight, C * sizeof(float)) == 0;
        free(dinp), free(dweight);
    }
    expect_bitwise("rmsnorm_backward dinp+dweight, 5 runs", all_equal);
    free(first_dinp), free(first_dweight);
    free(inp), free(weight), free(out), free(rstd), free(out_ref), free(rstd_ref);
    free(dout), free(dinp_init), free(dweight_init), free(dinp_ref), free(dweight_ref);
}

static void test_rope(void) {
    printf("rope\n");
    const int N = 4096, n_heads = 12, head_dim = 64;
    const float theta = 10000.0f;
    const size_t n = (size_t)N * n_heads * head_dim;
    int32_t *pos = (int32_t *)xmalloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) pos[i] = test_rng_int(&rng, 0, 16383);
    int32_t *d_pos = upload_i32(pos, N);
    const struct {
        const char *name;
        void (*cpu)(float *, const int32_t *, int, int, int, float, const RopeScaling *);
        void (*gpu)(bf16 *, const int32_t *, int, int, int, float, const RopeScaling *,
                    cudaStream_t);
    } directions[2] = {{"rope_forward x (in place)", rope_forward_cpu, rope_forward_cuda},
                       {"rope_backward dx (in place)", rope_backward_cpu, rope_backward_cuda}};
    for (int d = 0; d < 2; d++) {
        float *x = random_bf16_values(n, 1.0f, 0.0f);
        bf16 *d_x = upload_bf16(x, n);
        directions[d].gpu(d_x, d_pos, N, n_heads, head_dim, theta, NULL, 0);
        float *got = download_bf16(d_x, n);
        directions[d].cpu(x, pos, N, n_heads, head_dim, theta, NULL);
        expect_close(directions[d].name, got, x, n, BF16_TOL);
        free(x), free(got);
    }
    free(pos);
}

// RoPE under llama3 and linear scaling against the CPU op (head_dim 128 spans every
// llama3 band at theta 5e5, original context 8192).
static void test_rope_scaled(void) {
    printf("rope scaled\n");
    const int N = 2048, n_heads = 4, head_dim = 128;
    const float theta = 500000.0f;
    const RopeScaling scalings[2] = {{ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192},
                                     {ROPE_LINEAR, 4.0f, 0.0f, 0.0f, 0}};
    const size_t n = (size_t)N * n_heads * head_dim;
    int32_t *pos = (int32_t *)xmalloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) pos[i] = test_rng_int(&rng, 0, 131071);
    int32_t *d_pos = upload_i32(pos, N);
    for (int sc = 0; sc < 2; sc++) {
        float *x = random_bf16_values(n, 1.0f, 0.0f);
        bf16 *d_x = upload_bf16(x, n);
        rope_forward_cuda(d_x, d_pos, N, n_heads, head_dim, theta, &scalings[sc], 0);
        float *got = download_bf16(d_x, n);
        rope_forward_cpu(x, pos, N, n_heads, head_dim, theta, &scalings[sc]);
        expect_close(sc == 0 ? "rope_forward llama3" : "rope_forward linear", got, x, n, BF16_TOL);
        rope_backward_cuda(d_x, d_pos, N, n_heads, head_dim, theta, &scalings[sc], 0);
        float *back = download_bf16(d_x, n);
        rope_backward_cpu(x, pos, N, n_heads, head_dim, theta, &scalings[sc]);
        expect_close(sc == 0 ? "rope_backward llama3" : "rope_backward linear", back, x, n,
                     BF16_TOL);
        // The angle table of the stacked path: the same factors.
        float2 *d_cs = (float2 *)device_alloc((size_t)N * (head_dim / 2) * sizeof(float2));
        rope_angles_cuda(d_cs, d_pos, N, head_dim, theta, &scalings[sc], 0);
        float *cs = download_f32((const float *)d_cs, (size_t)N * head_dim);
        double *inv = (double *)xmalloc((head_dim / 2) * sizeof(double));
        rope_inv_freq(inv, head_dim, theta, &scalings[sc]);
        float *cs_ref = host_floats((size_t)N * head_dim);
        for (int t = 0; t < N; t++)
            for (int i = 0; i < head_dim / 2; i++) {
                cs_ref[((size_t)t * (head_dim / 2) + i) * 2] = (float)cos(pos[t] * inv[i]);
                cs_ref[((size_t)t * (head_dim / 2) + i) * 2 + 1] = (float)sin(pos[t] * inv[i]);
            }
        expect_close("rope_angles scaled", cs, cs_ref, (size_t)N * head_dim, 1e-6);
        free(x), free(got), free(back), free(cs), free(inv), free(cs_ref);
    }
    free(pos);
}

// N random positions (host, into *pos) and their RoPE angle table on the device.
static float2 *random_rope_angles(int N, int D, float theta, int32_t **pos) {
    *pos = (int32_t *)xmalloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) (*pos)[i] = test_rng_int(&rng, 0, 40959);
    int32_t *d_pos = upload_i32(*pos, N);
    float2 *d_cs = (float2 *)device_alloc((size_t)N * (D / 2) * sizeof(float2));
    rope_angles_cuda(d_cs, d_pos, N, D, theta, NULL, 0);
    return d_cs;
}

// The three parts of stacked rows qkv [N, (H + 2 KV) D] as separate tensors.
static void unstack_qkv(float *q, float *k, float *v, const float *qkv, int N, int H, int KV,
                        int D) {
    const size_t QKV = (size_t)(H + 2 * KV) * D;
    for (int n = 0; n < N; n++) {
        memcpy(q + (size_t)n * H * D, qkv + n * QKV, H * D * sizeof(float));
        memcpy(k + (size_t)n * KV * D, qkv + n * QKV + H * D, KV * D * sizeof(float));
        memcpy(v + (size_t)n * KV * D, qkv + n * QKV + (H + KV) * D, KV * D * sizeof(float));
    }
}

// The stacked q|k|v path against the CPU rope op: split with the angle table rotates q
// and k (v copied), without it copies all three (qk_norm: the norms and RoPE follow); the
// merge inverts either. Qwen3-like GQA, head_dim 128.
static void test_rope_qkv(void) {
    printf("rope q|k|v stacked\n");
    const int N = 1024, H = 4, KV = 2, D = 128, QKV = (H + 2 * KV) * D;
    const float theta = 1000000.0f;
    const size_t nq = (size_t)N * H * D, nkv = (size_t)N * KV * D, nqkv = (size_t)N * QKV;
    int32_t *pos;
    float2 *d_cs = random_rope_angles(N, D, theta, &pos);
    float *qkv = random_bf16_values(nqkv, 1.0f, 0.0f);
    bf16 *d_qkv = upload_bf16(qkv, nqkv);
    bf16 *d_q = (bf16 *)device_alloc(nq * sizeof(bf16)), *d_k = (bf16 *)device_alloc(nkv * 2),
         *d_v = (bf16 *)device_alloc(nkv * 2);
    float *q = host_floats(nq), *k = host_floats(nkv), *v = host_floats(nkv);
    unstack_qkv(q, k, v, qkv, N, H, KV, D);
    for (int rotate = 0; rotate < 2; rotate++) {
        poison(d_q, nq * 2), poison(d_k, nkv * 2), poison(d_v, nkv * 2);
        rope_split_qkv_cuda(d_q, d_k, d_v, d_qkv, rotate ? d_cs : NULL, N, H, KV, D, 0);
        float *got_q = download_bf16(d_q, nq), *got_k = download_bf16(d_k, nkv);
        float *got_v = download_bf16(d_v, nkv);
        float *ref_q = copy_floats(q, nq), *ref_k = copy_floats(k, nkv);
        if (rotate) {
            rope_forward_cpu(ref_q, pos, N, H, D, theta, NULL);
            rope_forward_cpu(ref_k, pos, N, KV, D, theta, NULL);
            expect_close("rope_split_qkv q", got_q, ref_q, nq, BF16_TOL);
            expect_close("rope_split_qkv k", got_k, ref_k, nkv, BF16_TOL);
        } else {
            expect_bitwise_equal("rope_split_qkv unrotated q (copy)", got_q, q, nq);
            expect_bitwise_equal("rope_split_qkv unrotated k (copy)", got_k, k, nkv);
        }
        expect_bitwise_equal("rope_split_qkv v (copy)", got_v, v, nkv);
        // Inverse: merge (rotating, or a plain copy) gives back the stacked rows, up to the
        // two bf16 roundings when rotating.
        bf16 *d_merged = (bf16 *)device_alloc(nqkv * sizeof(bf16));
        poison(d_merged, nqkv * 2);
        rope_merge_qkv_backward_cuda(d_merged, d_q, d_k, d_v, rotate ? d_cs : NULL, N, H, KV, D,
                                     0);
        float *merged = download_bf16(d_merged, nqkv);
        if (rotate)
            expect_close("rope_merge_qkv_backward (inverse)", merged, qkv, nqkv, BF16_TOL);
        else
            expect_bitwise_equal("rope_merge_qkv_backward unrotated (copy)", merged, qkv, nqkv);
        free(got_q), free(got_k), free(got_v), free(ref_q), free(ref_k), free(merged);
    }
    free(pos), free(qkv), free(q), free(k), free(v);
}

// Qwen3's q_norm / k_norm + RoPE, fused, against the CPU ops in sequence (rmsnorm over
// head rows, then rope; backward: rope_backward, then rmsnorm_backward into zeros), at
// every head dim, N not a multiple of any block's rows (and at head_dim 256 enough rows
// that the dweight partials' scratch caps the blocks); the backward five times bitwise.
static void test_qk_norm_rope(int N, int D) {
    printf("qk_norm + rope fused, N %d head_dim %d\n", N, D);
    const int H = 6, KV = 2, QKV = (H + 2 * KV) * D;
    const float theta = 1000000.0f, eps = 1e-6f;
    const size_t nq = (size_t)N * H * D, nkv = (size_t)N * KV * D, nqkv = (size_t)N * QKV;
    int32_t *pos;
    float2 *d_cs = random_rope_angles(N, D, theta, &pos);
    float *q = random_bf16_values(nq, 2.0f, 0.0f), *k = random_bf16_values(nkv, 2.0f, 0.0f);
    float *qw = random_bf16_values(D, 0.5f, 1.0f), *kw = random_bf16_values(D, 0.5f, 1.0f);
    bf16 *d_q = upload_bf16(q, nq), *d_k = upload_bf16(k, nkv);
    bf16 *d_qw = upload_bf16(qw, D), *d_kw = upload_bf16(kw, D);

    bf16 *d_qo = (bf16 *)device_alloc(nq * 2), *d_ko = (bf16 *)device_alloc(nkv * 2);
    float *d_qr = (float *)device_alloc((size_t)N * H * 4), *d_kr = (float *)device_alloc((size_t)N * KV * 4);
    poison(d_qo, nq * 2), poison(d_ko, nkv * 2), poison(d_qr, (size_t)N * H * 4),
        poison(d_kr, (size_t)N * KV * 4);
    qk_norm_rope_forward_cuda(d_qo, d_ko, d_qr, d_kr, d_q, d_k, d_qw, d_kw, d_cs, N, H, KV, D,
                              eps, 0);
    float *qo = download_bf16(d_qo, nq), *ko = download_bf16(d_ko, nkv);
    float *qr = download_f32(d_qr, (size_t)N * H), *kr = download_f32(d_kr, (size_t)N * KV);
    float *qo_ref = host_floats(nq), *ko_ref = host_floats(nkv);
    float *qr_ref = host_floats((size_t)N * H), *kr_ref = host_floats((size_t)N * KV);
    rmsnorm_forward_cpu(qo_ref, qr_ref, q, qw, N * H, D, eps);
    rmsnorm_forward_cpu(ko_ref, kr_ref, k, kw, N * KV, D, eps);
    rope_forward_cpu(qo_ref, pos, N, H, D, theta, NULL);
    rope_forward_cpu(ko_ref, pos, N, KV, D, theta, NULL);
    expect_close("qk_norm_rope_forward q", qo, qo_ref, nq, BF16_TOL);
    expect_close("qk_norm_rope_forward k", ko, ko_ref, nkv, BF16_TOL);
    expect_close("qk_norm_rope_forward q_rstd", qr, qr_ref, (size_t)N * H, FP32_TOL);
    expect_close("qk_norm_rope_forward k_rstd", kr, kr_ref, (size_t)N * KV, FP32_TOL);

    // Backward from the CPU's rstd, so it is tested on its own.
    float *dq = random_bf16_values(nq, 1.0f, 0.0f), *dk = random_bf16_values(nkv, 1.0f, 0.0f);
    float *dv = random_bf16_values(nkv, 1.0f, 0.0f);
    float *dqw_init = random_bf16_values(D, 1.0f, 0.0f), *dkw_init = random_bf16_values(D, 1.0f, 0.0f);
    bf16 *d_dq = upload_bf16(dq, nq), *d_dk = upload_bf16(dk, nkv), *d_dv = upload_bf16(dv, nkv);
    float *d_qr_ref = upload_f32(qr_ref, (size_t)N * H), *d_kr_ref = upload_f32(kr_ref, (size_t)N * KV);
    float *d_dqw = upload_f32(dqw_init, D), *d_dkw = upload_f32(dkw_init, D);
    bf16 *d_dqkv = (bf16 *)device_alloc(nqkv * 2);

    float *dq_un = copy_floats(dq, nq), *dk_un = copy_floats(dk, nkv);
    rope_backward_cpu(dq_un, pos, N, H, D, theta, NULL);
    rope_backward_cpu(dk_un, pos, N, KV, D, theta, NULL);
    float *dqin_ref = host_floats(nq), *dkin_ref = host_floats(nkv);
    memset(dqin_ref, 0, nq * sizeof(float)), memset(dkin_ref, 0, nkv * sizeof(float));
    float *dqw_ref = copy_floats(dqw_init, D), *dkw_ref = copy_floats(dkw_init, D);
    rmsnorm_backward_cpu(dqin_ref, dqw_ref, dq_un, q, qw, qr_ref, N * H, D);
    rmsnorm_backward_cpu(dkin_ref, dkw_ref, dk_un, k, kw, kr_ref, N * KV, D);

    float *first = NULL;
    bool all_equal = true;
    const size_t n_out = nqkv + 2 * (size_t)D;  // dqkv, then both dweights
    for (int run = 0; run < 5; run++) {
        poison(d_dqkv, nqkv * 2);
        cudaCheck(cudaMemcpy(d_dqw, dqw_init, D * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_dkw, dkw_init, D * sizeof(float), cudaMemcpyHostToDevice));
        qk_norm_rope_merge_qkv_backward_cuda(d_dqkv, d_dqw, d_dkw, d_dq, d_dk, d_dv, d_q, d_k,
                                             d_qw, d_kw, d_qr_ref, d_kr_ref, d_cs, N, H, KV, D, 0);
        float *dqkv = download_bf16(d_dqkv, nqkv);
        float *dqw = download_f32(d_dqw, D), *dkw = download_f32(d_dkw, D);
        float *out = host_floats(n_out);
        memcpy(out, dqkv, nqkv * sizeof(float));
        memcpy(out + nqkv, dqw, D * sizeof(float)), memcpy(out + nqkv + D, dkw, D * sizeof(float));
        if (run == 0) {
            float *got_q = host_floats(nq), *got_k = host_floats(nkv), *got_v = host_floats(nkv);
            unstack_qkv(got_q, got_k, got_v, dqkv, N, H, KV, D);
            expect_close("qk_norm_rope backward dq (before q_norm)", got_q, dqin_ref, nq, BF16_TOL);
            expect_close("qk_norm_rope backward dk (before k_norm)", got_k, dkin_ref, nkv, BF16_TOL);
            expect_bitwise_equal("qk_norm_rope backward dv (copy)", got_v, dv, nkv);
            expect_close("qk_norm_rope backward q_norm dweight (accumulate)", dqw, dqw_ref, D, FP32_TOL);
            expect_close("qk_norm_rope backward k_norm dweight (accumulate)", dkw, dkw_ref, D, FP32_TOL);
            free(got_q), free(got_k), free(got_v);
            first = out;
        } else {
            all_equal = all_equal && memcmp(out, first, n_out * sizeof(float)) == 0;
            free(out);
        }
        free(dqkv), free(dqw), free(dkw);
    }
    expect_bitwise("qk_norm_rope backward, 5 runs", all_equal);
    free(first), free(pos), free(q), free(k), free(qw), free(kw), free(qo), free(ko), free(qr),
        free(kr), free(qo_ref), free(ko_ref), free(qr_ref), free(kr_ref), free(dq), free(dk),
        free(dv), free(dqw_init), free(dkw_init), free(dq_un), free(dk_un), free(dqin_ref),
        free(dkin_ref), free(dqw_ref), free(dkw_ref);
}

// Linear biases (Qwen2's q/k/v over the stacked row): forward adds, backward sums rows
// into fp32, accumulating, bitwise the same run to run.
static void test_bias(void) {
    printf("bias\n");
    const int N = 8192, C = 1536 + 2 * 256;
    const size_t NC = (size_t)N * C;
    float *out = random_bf16_values(NC, 2.0f, 0.0f), *bias = random_bf16_values(C, 1.0f, 0.0f);
    bf16 *d_out = upload_bf16(out, NC), *d_bias = upload_bf16(bias, C);
    bias_forward_cuda(d_out, d_bias, N, C, 0);
    float *got = download_bf16(d_out, NC);
    bias_forward_cpu(out, bias, N, C);
    expect_close("bias_forward", got, out, NC, BF16_TOL);

    float *dout = random_bf16_values(NC, 1.0f, 0.0f), *dbias_init = random_bf16_values(C, 1.0f, 0.0f);
    bf16 *d_dout = upload_bf16(dout, NC);
    float *dbias_ref = copy_floats(dbias_init, C);
    bias_backward_cpu(dbias_ref, dout, N, C);
    float *d_dbias = upload_f32(dbias_init, C);
    bias_backward_cuda(d_dbias, d_dout, N, C, 0);
    float *dbias = download_f32(d_dbias, C);
    expect_close("bias_backward (accumulate)", dbias, dbias_ref, C, FP32_TOL);
    cudaCheck(cudaMemcpy(d_dbias, dbias_init, C * sizeof(float), cudaMemcpyHostToDevice));
    bias_backward_cuda(d_dbias, d_dout, N, C, 0);
    float *again = download_f32(d_dbias, C);
    expect_bitwise("bias_backward run to run", memcmp(again, dbias, C * sizeof(float)) == 0);
    free(out), free(bias), free(got), free(dout), free(dbias_init), free(dbias_ref), free(dbias);
    free(again);
}

static void test_swiglu(void) {
    printf("swiglu\n");
    const int64_t n = (int64_t)4096 * 2048;
    const size_t bytes = (size_t)n * sizeof(bf16);
    float *gate = random_bf16_values(n, 4.0f, 0.0f), *up = random_bf16_values(n, 2.0f, 0.0f);
    float *dout = random_bf16_values(n, 1.0f, 0.0f);
    bf16 *d_gate = upload_bf16(gate, n), *d_up = upload_bf16(up, n);
    bf16 *d_dout = upload_bf16(dout, n);

    bf16 *d_out = (bf16 *)device_alloc(bytes);
    poison(d_out, bytes);
    swiglu_forward_cuda(d_out, d_gate, d_up, n, 0);
    float *out = download_bf16(d_out, n), *out_ref = host_floats(n);
    swiglu_forward_cpu(out_ref, gate, up, n);
    expect_close("swiglu_forward out", out, out_ref, n, BF16_TOL);

    bf16 *d_dgate = (bf16 *)device_alloc(bytes), *d_dup = (bf16 *)device_alloc(bytes);
    poison(d_dgate, bytes);
    poison(d_dup, bytes);
    swiglu_backward_cuda(d_dgate, d_dup, d_dout, d_gate, d_up, n, 0);
    float *dgate = download_bf16(d_dgate, n), *dup = download_bf16(d_dup, n);
    float *dgate_ref = host_floats(n), *dup_ref = host_floats(n);
    swiglu_backward_cpu(dgate_ref, dup_ref, dout, gate, up, n);
    expect_close("swiglu_backward dgate", dgate, dgate_ref, n, BF16_TOL);
    expect_close("swiglu_backward dup", dup, dup_ref, n, BF16_TOL);

    // In place (dgate over gate, dup over up), as documented: same bits.
    swiglu_backward_cuda(d_gate, d_up, d_dout, d_gate, d_up, n, 0);
    float *dgate_inplace = download_bf16(d_gate, n), *dup_inplace = download_bf16(d_up, n);
    expect_bitwise_equal("swiglu_backward dgate in place", dgate_inplace, dgate, n);
    expect_bitwise_equal("swiglu_backward dup in place", dup_inplace, dup, n);
    free(gate), free(up), free(dout), free(out), free(out_ref), free(dgate), free(dup);
    free(dgate_ref), free(dup_ref), free(dgate_inplace), free(dup_inplace);
}

// One forward/backward comparison at the given shape. `offset` elements are
// skipped at the start of every device buffer, to exercise pointers that are
// not 256-byte aligned (slices of bigger buffers).
static void check_matmul(int N, int IC, int OC, size_t offset) {
    char label[96];
    const size_t n_inp = (size_t)N * IC, n_w = (size_t)OC * IC, n_out = (size_t)N * OC;
    float *inp = random_bf16_values(n_inp, 1.0f, 0.0f);
    float *weight = random_bf16_values(n_w, 0.05f, 0.0f);
    float *dout = random_bf16_values(n_out, 1.0f, 0.0f);
    float *dinp_init = random_bf16_values(n_inp, 0.5f, 0.0f);
    float *dweight_init = random_bf16_values(n_w, 10.0f, 0.0f);
    bf16 *d_inp = (bf16 *)device_alloc((n_inp + offset) * sizeof(bf16)) + offset;
    bf16 *d_weight = (bf16 *)device_alloc((n_w + offset) * sizeof(bf16)) + offset;
    bf16 *d_dout = (bf16 *)device_alloc((n_out + offset) * sizeof(bf16)) + offset;
    bf16 *d_out = (bf16 *)device_alloc((n_out + offset) * sizeof(bf16)) + offset;
    bf16 *d_dinp = (bf16 *)device_alloc((n_inp + offset) * sizeof(bf16)) + offset;
    float *d_dweight = (float *)device_alloc((n_w + offset) * sizeof(float)) + offset;
    upload_bf16_into(d_inp, inp, n_inp);
    upload_bf16_into(d_weight, weight, n_w);
    upload_bf16_into(d_dout, dout, n_out);
    upload_bf16_into(d_dinp, dinp_init, n_inp);
    cudaCheck(cudaMemcpy(d_dweight, dweight_init, n_w * sizeof(float), cudaMemcpyHostToDevice));

    poison(d_out, n_out * sizeof(bf16));
    matmul_forward_cuda(d_out, d_inp, d_weight, N, IC, OC, 0);
    float *out = download_bf16(d_out, n_out), *out_ref = host_floats(n_out);
    matmul_forward_cpu(out_ref, inp, weight, N, IC, OC);
    snprintf(label, sizeof label, "matmul_forward out [%d,%d]x[%d,%d]^T +%zu", N, IC, OC, IC,
             offset);
    expect_close(label, out, out_ref, n_out, BF16_TOL);

    matmul_backward_cuda(d_dinp, d_dweight, d_dout, d_inp, d_weight, N, IC, OC, 0);
    float *dinp = download_bf16(d_dinp, n_inp), *dweight = download_f32(d_dweight, n_w);
    float *dinp_ref = copy_floats(dinp_init, n_inp), *dweight_ref = copy_floats(dweight_init, n_w);
    matmul_backward_cpu(dinp_ref, dweight_ref, dout, inp, weight, N, IC, OC);
    snprintf(label, sizeof label, "matmul_backward dinp (accumulate) +%zu", offset);
    expect_close(label, dinp, dinp_ref, n_inp, BF16_TOL);
    snprintf(label, sizeof label, "matmul_backward dweight fp32 (accumulate) +%zu", offset);
    expect_close(label, dweight, dweight_ref, n_w, 1e-3);

    // dinp == NULL: only dweight, accumulated once more on top.
    matmul_backward_cuda(NULL, d_dweight, d_dout, d_inp, d_weight, N, IC, OC, 0);
    float *dweight2 = download_f32(d_dweight, n_w);
    matmul_backward_cpu(NULL, dweight_ref, dout, inp, weight, N, IC, OC);
    snprintf(label, sizeof label, "matmul_backward dinp=NULL, dweight +%zu", offset);
    expect_close(label, dweight2, dweight_ref, n_w, 1e-3);
    free(inp), free(weight), free(dout), free(dinp_init), free(dweight_init), free(out);
    free(out_ref), free(dinp), free(dweight), free(dinp_ref), free(dweight_ref), free(dweight2);
}

static void test_matmul(void) {
    printf("matmul (cuBLASLt)\n");
    check_matmul(4096, 768, 2304, 0);
    check_matmul(300, 192, 72, 8);  // ragged sizes, 16-byte-aligned pointers
}

static void test_cross_entropy(void) {
    printf("cross_entropy\n");
    const int N = 1024, V = 32000;
    const float loss_scale = 1.0f / 777.0f;
    const size_t NV = (size_t)N * V;
    float *logits = random_bf16_values(NV, 8.0f, 0.0f);
    int32_t *targets = (int32_t *)xmalloc(N * sizeof(int32_t));
    for (int n = 0; n < N; n++) targets[n] = n % 5 == 4 ? -1 : test_rng_int(&rng, 0, V - 1);
    int32_t *d_targets = upload_i32(targets, N);
    bf16 *d_logits = upload_bf16(logits, NV);

    // Loss only first (dlogits NULL), then loss and dlogits in place over the logits.
    float *d_losses_only = (float *)device_alloc(N * sizeof(float));
    float *d_losses = (float *)device_alloc(N * sizeof(float));
    poison(d_losses_only, N * sizeof(float));
    poison(d_losses, N * sizeof(float));
    cross_entropy_forward_backward_cuda(d_losses_only, NULL, d_logits, d_targets, N, V,
                                        loss_scale, 0);
    cross_entropy_forward_backward_cuda(d_losses, d_logits, d_logits, d_targets, N, V,
                                        loss_scale, 0);
    float *losses = download_f32(d_losses, N), *losses_only = download_f32(d_losses_only, N);
    float *dlogits = download_bf16(d_logits, NV);

    float *losses_ref = host_floats(N), *dlogits_ref = host_floats(NV);
    const double total_ref = cross_entropy_forward_backward_cpu(losses_ref, dlogits_ref, logits,
                                                                targets, N, V, loss_scale);
    expect_close("cross_entropy losses", losses, losses_ref, N, FP32_TOL);
    expect_close("cross_entropy dlogits (in place)", dlogits, dlogits_ref, NV, BF16_TOL);
    expect_bitwise_equal("cross_entropy losses with dlogits=NULL", losses_only, losses, N);
    double total = 0.0;
    for (int n = 0; n < N; n++) total += losses[n];
    const double total_err = fabs(total - total_ref) / fabs(total_ref);
    printf("  %-44s rel_err %.3e\n", "cross_entropy sum of losses", total_err);
    EXPECT(total_err <= FP32_TOL, "sum of losses %f vs CPU %f", total, total_ref);
    bool untargeted_zero = true;
    for (int n = 0; n < N; n++) {
        if (targets[n] != -1) continue;
        untargeted_zero = untargeted_zero && losses[n] == 0.0f;
        for (int v = 0; v < V; v++)
            untargeted_zero = untargeted_zero && dlogits[(size_t)n * V + v] == 0.0f;
    }
    printf("  %-44s %s\n", "cross_entropy rows with target -1 all zero",
           untargeted_zero ? "ok" : "FAIL");
    EXPECT(untargeted_zero, "rows without target must have loss 0 and dlogits 0");
    free(logits), free(targets), free(losses), free(losses_only), free(dlogits);
    free(losses_ref), free(dlogits_ref);
}

// Helpers without a CPU twin, against host arithmetic: all results exact.
static void test_elementwise(void) {
    printf("residual_add, bf16 <-> fp32\n");
    const int64_t n = (int64_t)4096 * 768 + 3;
    const size_t bf16_bytes = (size_t)n * sizeof(bf16), f32_bytes = (size_t)n * sizeof(float);
    float *a = random_bf16_values(n, 4.0f, 0.0f), *b = random_bf16_values(n, 4.0f, 0.0f);
    bf16 *d_a = upload_bf16(a, n), *d_b = upload_bf16(b, n);
    bf16 *d_sum = (bf16 *)device_alloc(bf16_bytes);
    poison(d_sum, bf16_bytes);
    residual_add_cuda(d_sum, d_a, d_b, n, 0);
    float *sum = download_bf16(d_sum, n), *sum_ref = host_floats(n);
    for (int64_t i = 0; i < n; i++) sum_ref[i] = round_bf16(a[i] + b[i]);
    expect_close("residual_add out", sum, sum_ref, n, 0.0);

    // fp32 values that are not bf16-representable, so rounding is exercised.
    float *wide = host_floats(n), *wide_rounded = host_floats(n);
    for (int64_t i = 0; i < n; i++) {
        wide[i] = 3.0f * test_rng_uniform(&rng);
        wide_rounded[i] = round_bf16(wide[i]);
    }
    float *d_wide = upload_f32(wide, n);
    bf16 *d_narrow = (bf16 *)device_alloc(bf16_bytes);
    float *d_back = (float *)device_alloc(f32_bytes);
    poison(d_narrow, bf16_bytes);
    poison(d_back, f32_bytes);
    float_to_bf16_cuda(d_narrow, d_wide, n, 0);
    bf16_to_float_cuda(d_back, d_narrow, n, 0);
    float *narrow = download_bf16(d_narrow, n), *back = download_f32(d_back, n);
    expect_close("float_to_bf16 (round to nearest even)", narrow, wide_rounded, n, 0.0);
    expect_close("bf16_to_float", back, wide_rounded, n, 0.0);
    free(a), free(b), free(sum), free(sum_ref), free(wide), free(wide_rounded), free(narrow);
    free(back);
}

static void test_grad_norm(void) {
    printf("grad_global_norm\n");
    const size_t n = (size_t)10 * 1000 * 1000 + 17;
    float *grads = random_bf16_values(n, 1.0f, 0.0f);
    float *d_grads = upload_f32(grads, n);
    float *d_norm = (float *)device_alloc(2 * sizeof(float));
    poison(d_norm, 2 * sizeof(float));
    grad_global_norm_cuda(d_norm, d_grads, n, 0);
    grad_global_norm_cuda(d_norm + 1, d_grads, n, 0);
    float *norms = download_f32(d_norm, 2);
    const float norm_ref = (float)grad_global_norm_cpu(grads, n);
    expect_close("grad_global_norm (10M elements)", norms, &norm_ref, 1, 1e-5);
    expect_bitwise_equal("grad_global_norm, 2 runs", &norms[0], &norms[1], 1);
    free(grads), free(norms);
}

// Three AdamW steps over a small model's parameter table, adamw_step_cuda on split master
// weights (trainer/split_float.h) against adamw_step_cpu with grad_clip_cpu: step 1
// clips, step 2 has clipping off, step 3 a limit above the norm. The host clips with the
// GPU's norm (its own sums in another order), so the arithmetic is the same and the
// results must be bit for bit: the GPU's halves equal the split of the host's params
// (the decoded master is the host's, the bf16 weights its rounding), m and v the host's.
// Params and gradients have full fp32 mantissas, with a tie, a low half above it, a
// denormal and -0 planted. shift 1 offsets every buffer by one element, so the kernels
// take their unaligned paths. Then split_global_norm_cuda against the fp32 norm of the
// same values at the same alignment (the same summation order: bitwise) and the host's.
static void test_adamw(int shift) {
    printf("adamw, split master weights%s\n", shift ? ", unaligned" : "");
    ModelConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = 256, cfg.hidden_size = 64, cfg.intermediate_size = 128;
    cfg.num_hidden_layers = 2, cfg.num_attention_heads = 4, cfg.num_key_value_heads = 2;
    cfg.rms_norm_eps = 1e-5f, cfg.rope_theta = 10000.0f, cfg.tie_word_embeddings = false;
    ParamTable table;
    param_table_build(&cfg, &table);
    const size_t n = table.total;
    AdamWHyper hyper;
    memset(&hyper, 0, sizeof hyper);
    hyper.lr = 1e-3f, hyper.beta1 = 0.9f, hyper.beta2 = 0.95f, hyper.eps = 1e-8f;
    hyper.weight_decay = 0.1f, hyper.decay_norms = false, hyper.decay_embeddings = false;
    AdamWState state;
    adamw_init(&state, n);

    float *params = host_floats(n);
    for (size_t i = 0; i < n; i++) params[i] = 0.1f * test_rng_uniform(&rng);
    const uint32_t edges[] = {0x3D808000, 0xBD80FFFF, 0x00000123, 0x80000000};
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++)
        memcpy(&params[test_rng_int(&rng, 0, (int)n - 1)], &edges[k], sizeof(float));
    uint16_t *hi = (uint16_t *)xmalloc(n * sizeof(uint16_t));
    uint16_t *lo = (uint16_t *)xmalloc(n * sizeof(uint16_t));
    uint16_t *want_hi = (uint16_t *)xmalloc(n * sizeof(uint16_t));
    uint16_t *want_lo = (uint16_t *)xmalloc(n * sizeof(uint16_t));
    split_floats(params, n, hi, lo);
    uint16_t *d_hi = (uint16_t *)device_alloc((n + 1) * sizeof(uint16_t)) + shift;
    uint16_t *d_lo = (uint16_t *)device_alloc((n + 1) * sizeof(uint16_t)) + shift;
    float *d_m = (float *)device_alloc((n + 1) * sizeof(float)) + shift;
    float *d_v = (float *)device_alloc((n + 1) * sizeof(float)) + shift;
    float *d_grads = (float *)device_alloc((n + 1) * sizeof(float)) + shift;
    float *d_f32 = (float *)device_alloc((n + 1) * sizeof(float)) + shift;
    float *d_norm = (float *)device_alloc(3 * sizeof(float));
    cudaCheck(cudaMemcpy(d_hi, hi, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_lo, lo, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(d_m, 0, n * sizeof(float)));  // AdamW's initial state is zero
    cudaCheck(cudaMemset(d_v, 0, n * sizeof(float)));
    const float max_norms[3] = {1.0f, 0.0f, 1e9f};
    AdamWState device_state = {n, d_m, d_v, 0};

    for (int step = 1; step <= 3; step++) {
        char label[96];
        float *grads = host_floats(n);
        for (size_t i = 0; i < n; i++) grads[i] = test_rng_uniform(&rng);
        cudaCheck(cudaMemcpy(d_grads, grads, n * sizeof(float), cudaMemcpyHostToDevice));
        grad_global_norm_cuda(d_norm, d_grads, n, 0);
        adamw_step_cuda(&device_state, &table, &hyper, (bf16 *)d_hi, d_lo, d_grads, d_norm,
                        max_norms[step - 1], 0);
        float *norm = download_f32(d_norm, 1);
        EXPECT(step != 1 || *norm > max_norms[0], "step 1 clips: norm %g", *norm);
        grad_clip_cpu(grads, n, *norm, max_norms[step - 1]);
        adamw_step_cpu(&state, &table, &hyper, params, grads);

        float *m = download_f32(d_m, n), *v = download_f32(d_v, n);
        cudaCheck(cudaMemcpy(hi, d_hi, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(lo, d_lo, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        split_floats(params, n, want_hi, want_lo);
        size_t bad_hi = 0, bad_lo = 0, first = n;
        for (size_t i = 0; i < n; i++) {
            bad_hi += hi[i] != want_hi[i];
            bad_lo += lo[i] != want_lo[i];
            if (first == n && (hi[i] != want_hi[i] || lo[i] != want_lo[i])) first = i;
        }
        snprintf(label, sizeof label, "step %d (max_norm %g) master halves", step,
                 max_norms[step - 1]);
        expect_bitwise(label, bad_hi == 0 && bad_lo == 0);
        if (first < n)
            fprintf(stderr, "  %zu high, %zu low halves differ; first at %zu: 0x%04x|0x%04x, "
                    "host 0x%04x|0x%04x\n", bad_hi, bad_lo, first, hi[first], lo[first],
                    want_hi[first], want_lo[first]);
        snprintf(label, sizeof label, "step %d m", step);
        expect_bitwise_equal(label, m, state.m, n);
        snprintf(label, sizeof label, "step %d v", step);
        expect_bitwise_equal(label, v, state.v, n);
        free(grads), free(norm), free(m), free(v);
    }

    cudaCheck(cudaMemcpy(d_f32, params, n * sizeof(float), cudaMemcpyHostToDevice));
    split_global_norm_cuda(d_norm + 1, (const bf16 *)d_hi, d_lo, n, 0);
    grad_global_norm_cuda(d_norm + 2, d_f32, n, 0);
    float *norms = download_f32(d_norm + 1, 2);
    const float norm_ref = (float)grad_global_norm_cpu(params, n);
    expect_close("split_global_norm", norms, &norm_ref, 1, 1e-5);
    expect_bitwise_equal("split_global_norm = the fp32 norm", &norms[0], &norms[1], 1);
    adamw_free(&state);
    param_table_free(&table);
    free(params), free(hi), free(lo), free(want_hi), free(want_lo), free(norms);
}

int main(void) {
    int n_devices = 0;
    const cudaError_t err = cudaGetDeviceCount(&n_devices);
    if (err != cudaSuccess || n_devices == 0) {
        printf("SKIP: no CUDA device (%s)\n", cudaGetErrorString(err));
        return EXIT_SKIP;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    rng = test_rng_from_env();
    // rmsnorm over head rows [T * H, D] exceeds max_tokens: its scratch is bounded by the
    // channels alone.
    ops_cuda_init(8192, 768);
    test_embedding();
    test_rmsnorm(4096, 768);
    test_rmsnorm(4096 * 16, 128);
    test_rope();
    test_rope_scaled();
    test_rope_qkv();
    test_qk_norm_rope(1000, 128);
    test_qk_norm_rope(1000, 64);
    test_qk_norm_rope(1000, 32);
    test_qk_norm_rope(4100, 256);
    test_bias();
    test_swiglu();
    test_matmul();
    test_cross_entropy();
    test_elementwise();
    test_grad_norm();
    test_adamw(0);
    test_adamw(1);
    ops_cuda_destroy();
    device_free_all();
    return test_finish();
}
