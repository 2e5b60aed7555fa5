// The CPU model ops (model/ops.h) against an independent oracle: a plain
// double-precision forward of each op written here from its definition. Each
// float backward is compared with central finite differences of that double
// forward, for the scalar sum(r * out) with a random projection r (so the
// backward's dout is r). Gradient buffers start random to check accumulation.
#define _DEFAULT_SOURCE  // M_PI
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/ops.h"
#include "tests/test_util.h"

static TestRng rng;

static void fill_uniform(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * test_rng_uniform(&rng);
}

static double *to_double(const float *x, size_t n) {
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static float *copy_floats(const float *x, size_t n) {
    float *c = malloc(n * sizeof(float));
    memcpy(c, x, n * sizeof(float));
    return c;
}

// Scalar objective of one op in double; reads every input from its context.
typedef double (*ScalarFn)(const void *ctx);

// Central differences of f with respect to x (an array inside f's context).
static void numeric_gradient(ScalarFn f, const void *ctx, double *x, size_t n, double *grad) {
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        const double saved = x[i];
        x[i] = saved + h;
        const double plus = f(ctx);
        x[i] = saved - h;
        const double minus = f(ctx);
        x[i] = saved;
        grad[i] = (plus - minus) / (2 * h);
    }
}

// The float backward added `accumulated - base` into a buffer that started at
// `base`; compares that increment with the numeric gradient of f along x.
static void check_gradient(const char *what, ScalarFn f, const void *ctx, double *x, size_t n,
                           const float *accumulated, const float *base) {
    double *numeric = malloc(n * sizeof(double));
    float *analytic = malloc(n * sizeof(float));
    numeric_gradient(f, ctx, x, n, numeric);
    for (size_t i = 0; i < n; i++) analytic[i] = accumulated[i] - (base ? base[i] : 0.0f);
    const double err = test_relative_error(analytic, numeric, n);
    EXPECT(err < 1e-4, "%s: gradient relative error %.3g", what, err);
    free(numeric);
    free(analytic);
}

// ---- embedding ----
typedef struct {
    int N, C;
    const int32_t *tokens;
    double *wte;       // [V,C]
    const double *r;   // [N,C]
} EmbeddingCtx;

static double embedding_objective(const void *p) {
    const EmbeddingCtx *c = p;
    double s = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int j = 0; j < c->C; j++) s += c->r[n * c->C + j] * c->wte[c->tokens[n] * c->C + j];
    return s;
}

static void test_embedding(void) {
    enum { V = 7, C = 5, N = 11 };
    int32_t tokens[N];
    for (int n = 0; n < N; n++) tokens[n] = test_rng_int(&rng, 0, V - 1);
    tokens[1] = tokens[0];  // a repeated token must accumulate both rows
    float wte[V * C], r[N * C], out[N * C], base[V * C];
    fill_uniform(wte, V * C, 1.0f);
    fill_uniform(r, N * C, 1.0f);
    fill_uniform(base, V * C, 1.0f);
    embedding_forward_cpu(out, tokens, wte, N, C);
    int exact = 1;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < C; j++) exact &= out[n * C + j] == wte[tokens[n] * C + j];
    EXPECT(exact, "embedding_forward copies the token rows");

    float *dwte = copy_floats(base, V * C);
    embedding_backward_cpu(dwte, r, tokens, N, C);
    EmbeddingCtx ctx = {N, C, tokens, to_double(wte, V * C), to_double(r, N * C)};
    check_gradient("embedding dwte", embedding_objective, &ctx, ctx.wte, V * C, dwte, base);
    free(ctx.wte);
    free((void *)ctx.r);
    free(dwte);
}

// ---- rmsnorm ----
typedef struct {
    int N, C;
    double eps;
    double *x, *w;    // [N,C], [C]
    const double *r;  // [N,C]
} RmsNormCtx;

static double rmsnorm_reference(const RmsNormCtx *c, int n, int j) {
    double ms = 0.0;
    for (int i = 0; i < c->C; i++) ms += c->x[n * c->C + i] * c->x[n * c->C + i];
    return c->x[n * c->C + j] / sqrt(ms / c->C + c->eps) * c->w[j];
}

static double rmsnorm_objective(const void *p) {
    const RmsNormCtx *c = p;
    double s = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int j = 0; j < c->C; j++) s += c->r[n * c->C + j] * rmsnorm_reference(c, n, j);
    return s;
}

static void test_rmsnorm(void) {
    enum { N = 6, C = 16 };
    const float eps = 1e-5f;
    float x[N * C], w[C], r[N * C], out[N * C], rstd[N], dx_base[N * C], dw_base[C];
    fill_uniform(x, N * C, 2.0f);
    for (int j = 0; j < C; j++) w[j] = 1.0f + 0.5f * test_rng_uniform(&rng);
    fill_uniform(r, N * C, 1.0f);
    fill_uniform(dx_base, N * C, 1.0f);
    fill_uniform(dw_base, C, 1.0f);
    RmsNormCtx ctx = {N, C, eps, to_double(x, N * C), to_double(w, C), to_double(r, N * C)};

    rmsnorm_forward_cpu(out, rstd, x, w, N, C, eps);
    double *ref = malloc(N * C * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < C; j++) ref[n * C + j] = rmsnorm_reference(&ctx, n, j);
    EXPECT(test_relative_error(out, ref, N * C) < 1e-6, "rmsnorm forward");

    float *dx = copy_floats(dx_base, N * C), *dw = copy_floats(dw_base, C);
    rmsnorm_backward_cpu(dx, dw, r, x, w, rstd, N, C);
    check_gradient("rmsnorm dinp", rmsnorm_objective, &ctx, ctx.x, N * C, dx, dx_base);
    check_gradient("rmsnorm dweight", rmsnorm_objective, &ctx, ctx.w, C, dw, dw_base);
    free(ref);
    free(dx);
    free(dw);
    free(ctx.x);
    free(ctx.w);
    free((void *)ctx.r);
}

// ---- rope ----
typedef struct {
    int N, H, D;
    double theta;
    const int32_t *pos;
    double *x;        // [N,H,D]
    const double *r;  // [N,H,D]
} RopeCtx;

// HF rotate-half: out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1].
static void rope_reference(const RopeCtx *c, double *out) {
    const int half = c->D / 2;
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->D; i++) {
                const int k = i % half;
                const double angle = c->pos[n] * pow(c->theta, -2.0 * k / c->D);
                const double *x = c->x + (n * c->H + h) * c->D;
                const double rotated = i < half ? -x[i + half] : x[i - half];
                out[(n * c->H + h) * c->D + i] = x[i] * cos(angle) + rotated * sin(angle);
            }
}

static double rope_objective(const void *p) {
    const RopeCtx *c = p;
    const int n = c->N * c->H * c->D;
    double *out = malloc(n * sizeof(double)), s = 0.0;
    rope_reference(c, out);
    for (int i = 0; i < n; i++) s += c->r[i] * out[i];
    free(out);
    return s;
}

static double dot_floats(const float *a, const float *b, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static void test_rope(void) {
    enum { N = 5, H = 3, D = 8, SIZE = N * H * D };
    const float theta = 100.0f;  // small base: even the last frequency turns visibly
    int32_t pos[N];
    for (int n = 0; n < N; n++) pos[n] = test_rng_int(&rng, 0, 60);
    pos[2] = 0;
    float x[SIZE], r[SIZE];
    fill_uniform(x, SIZE, 1.0f);
    fill_uniform(r, SIZE, 1.0f);
    RopeCtx ctx = {N, H, D, theta, pos, to_double(x, SIZE), to_double(r, SIZE)};

    float *y = copy_floats(x, SIZE);
    rope_forward_cpu(y, pos, N, H, D, theta, NULL);
    double ref[SIZE];
    rope_reference(&ctx, ref);
    EXPECT(test_relative_error(y, ref, SIZE) < 1e-6, "rope forward");
    int identity = 1;
    for (int i = 0; i < H * D; i++) identity &= y[2 * H * D + i] == x[2 * H * D + i];
    EXPECT(identity, "rope at position 0 is the identity");
    for (int n = 0; n < N * H; n++) {
        const double before = dot_floats(x + n * D, x + n * D, D);
        const double after = dot_floats(y + n * D, y + n * D, D);
        EXPECT(fabs(after - before) < 1e-5 * before, "rope preserves each head's norm");
    }

    // Hand value: head_dim 2, position 1 turns (1, 0) by exactly 1 radian.
    float unit[2] = {1.0f, 0.0f};
    const int32_t one = 1;
    rope_forward_cpu(unit, &one, 1, 1, 2, 10000.0f, NULL);
    EXPECT(fabsf(unit[0] - cosf(1.0f)) < 1e-6f && fabsf(unit[1] - sinf(1.0f)) < 1e-6f,
          "rope (1,0) at pos 1 -> (%g, %g)", unit[0], unit[1]);

    // Scores depend only on the position difference.
    float q[D], k[D];
    fill_uniform(q, D, 1.0f);
    fill_uniform(k, D, 1.0f);
    double score[2];
    for (int shift = 0; shift < 2; shift++) {
        float qs[D], ks[D];
        memcpy(qs, q, sizeof(q));
        memcpy(ks, k, sizeof(k));
        const int32_t pq = 9 + 31 * shift, pk = 4 + 31 * shift;
        rope_forward_cpu(qs, &pq, 1, 1, D, theta, NULL);
        rope_forward_cpu(ks, &pk, 1, 1, D, theta, NULL);
        score[shift] = dot_floats(qs, ks, D);
    }
    EXPECT(fabs(score[0] - score[1]) < 1e-5, "rope scores are relative: %g vs %g", score[0],
          score[1]);

    float *dx = copy_floats(r, SIZE);
    rope_backward_cpu(dx, pos, N, H, D, theta, NULL);
    check_gradient("rope dx", rope_objective, &ctx, ctx.x, SIZE, dx, NULL);
    free(y);
    free(dx);
    free(ctx.x);
    free((void *)ctx.r);
}

// ---- swiglu ----
typedef struct {
    int n;
    double *gate, *up;
    const double *r;
} SwigluCtx;

static double swiglu_objective(const void *p) {
    const SwigluCtx *c = p;
    double s = 0.0;
    for (int i = 0; i < c->n; i++)
        s += c->r[i] * c->gate[i] / (1.0 + exp(-c->gate[i])) * c->up[i];
    return s;
}

static void test_swiglu(void) {
    enum { n = 64 };
    float gate[n], up[n], r[n], out[n], dgate[n], dup[n];
    fill_uniform(gate, n, 5.0f);
    fill_uniform(up, n, 2.0f);
    fill_uniform(r, n, 1.0f);
    SwigluCtx ctx = {n, to_double(gate, n), to_double(up, n), to_double(r, n)};
    swiglu_forward_cpu(out, gate, up, n);
    double ref[n];
    for (int i = 0; i < n; i++) ref[i] = ctx.gate[i] / (1.0 + exp(-ctx.gate[i])) * ctx.up[i];
    EXPECT(test_relative_error(out, ref, n) < 1e-6, "swiglu forward");
    for (int i = 0; i < n; i++) dgate[i] = dup[i] = 1e30f;  // must be overwritten
    swiglu_backward_cpu(dgate, dup, r, gate, up, n);
    check_gradient("swiglu dgate", swiglu_objective, &ctx, ctx.gate, n, dgate, NULL);
    check_gradient("swiglu dup", swiglu_objective, &ctx, ctx.up, n, dup, NULL);
    free(ctx.gate);
    free(ctx.up);
    free((void *)ctx.r);
}

// ---- matmul ----
typedef struct {
    int N, IC, OC;
    double *inp, *weight;  // [N,IC], [OC,IC]
    const double *r;       // [N,OC]
} MatmulCtx;

static double matmul_reference(const MatmulCtx *c, int n, int o) {
    double s = 0.0;
    for (int i = 0; i < c->IC; i++) s += c->inp[n * c->IC + i] * c->weight[o * c->IC + i];
    return s;
}

static double matmul_objective(const void *p) {
    const MatmulCtx *c = p;
    double s = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) s += c->r[n * c->OC + o] * matmul_reference(c, n, o);
    return s;
}

static void test_matmul(void) {
    enum { N = 5, IC = 7, OC = 6 };
    float inp[N * IC], weight[OC * IC], r[N * OC], out[N * OC], di_base[N * IC], dw_base[OC * IC];
    fill_uniform(inp, N * IC, 1.0f);
    fill_uniform(weight, OC * IC, 1.0f);
    fill_uniform(r, N * OC, 1.0f);
    fill_uniform(di_base, N * IC, 1.0f);
    fill_uniform(dw_base, OC * IC, 1.0f);
    MatmulCtx ctx = {N, IC, OC, to_double(inp, N * IC), to_double(weight, OC * IC),
                     to_double(r, N * OC)};
    matmul_forward_cpu(out, inp, weight, N, IC, OC);
    double ref[N * OC];
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) ref[n * OC + o] = matmul_reference(&ctx, n, o);
    EXPECT(test_relative_error(out, ref, N * OC) < 1e-6, "matmul forward");

    float *di = copy_floats(di_base, N * IC), *dw = copy_floats(dw_base, OC * IC);
    matmul_backward_cpu(di, dw, r, inp, weight, N, IC, OC);
    check_gradient("matmul dinp", matmul_objective, &ctx, ctx.inp, N * IC, di, di_base);
    check_gradient("matmul dweight", matmul_objective, &ctx, ctx.weight, OC * IC, dw, dw_base);
    float *dw_only = copy_floats(dw_base, OC * IC);
    matmul_backward_cpu(NULL, dw_only, r, inp, weight, N, IC, OC);
    EXPECT(memcmp(dw_only, dw, sizeof(float) * OC * IC) == 0, "matmul dweight without dinp");
    free(di);
    free(dw);
    free(dw_only);
    free(ctx.inp);
    free(ctx.weight);
    free((void *)ctx.r);
}

// ---- cross-entropy ----
typedef struct {
    int N, V;
    double scale;
    const int32_t *targets;
    double *logits;  // [N,V]
} CrossEntropyCtx;

static double cross_entropy_reference_row(const CrossEntropyCtx *c, int n) {
    const double *z = c->logits + n * c->V;
    double sum = 0.0;  // direct sum of exp: the logits here are moderate
    for (int v = 0; v < c->V; v++) sum += exp(z[v]);
    return log(sum) - z[c->targets[n]];
}

static double cross_entropy_objective(const void *p) {
    const CrossEntropyCtx *c = p;
    double s = 0.0;
    for (int n = 0; n < c->N; n++)
        if (c->targets[n] >= 0) s += cross_entropy_reference_row(c, n);
    return s * c->scale;
}

static void test_cross_entropy(void) {
    enum { N = 6, V = 11 };
    const float scale = 0.37f;
    int32_t targets[N];
    for (int n = 0; n < N; n++) targets[n] = test_rng_int(&rng, 0, V - 1);
    targets[1] = targets[4] = -1;
    float logits[N * V], losses[N], dlogits[N * V];
    fill_uniform(logits, N * V, 4.0f);
    CrossEntropyCtx ctx = {N, V, scale, targets, to_double(logits, N * V)};

    const double total = cross_entropy_forward_backward_cpu(losses, dlogits, logits, targets, N, V,
                                                            scale);
    double ref_total = 0.0;
    for (int n = 0; n < N; n++) {
        const double ref = targets[n] >= 0 ? cross_entropy_reference_row(&ctx, n) : 0.0;
        ref_total += ref;
        EXPECT(fabs(losses[n] - ref) < 1e-5 * fmax(1.0, ref), "row %d loss %g vs %g", n,
              losses[n], ref);
    }
    EXPECT(fabs(total - ref_total) < 1e-5 * ref_total, "loss sum %g vs %g", total, ref_total);
    for (int v = 0; v < V; v++)
        EXPECT(dlogits[1 * V + v] == 0.0f && dlogits[4 * V + v] == 0.0f,
              "target -1 rows have zero gradient");
    check_gradient("cross-entropy dlogits", cross_entropy_objective, &ctx, ctx.logits, N * V,
                   dlogits, NULL);

    // In place (dlogits aliasing logits) gives the same bytes.
    float *inplace = copy_floats(logits, N * V);
    cross_entropy_forward_backward_cpu(losses, inplace, inplace, targets, N, V, scale);
    EXPECT(memcmp(inplace, dlogits, sizeof(dlogits)) == 0, "cross-entropy in place");

    // Stability: a common shift of 1000 leaves loss and gradient (nearly) unchanged;
    // without the max subtraction exp overflows to inf.
    float shifted[N * V], shifted_losses[N], shifted_dlogits[N * V];
    for (int i = 0; i < N * V; i++) shifted[i] = logits[i] + 1000.0f;
    const double shifted_total = cross_entropy_forward_backward_cpu(
        shifted_losses, shifted_dlogits, shifted, targets, N, V, scale);
    EXPECT(isfinite(shifted_total) && fabs(shifted_total - ref_total) < 1e-3 * ref_total,
          "shifted logits: loss %g vs %g", shifted_total, ref_total);
    double max_diff = 0.0;
    for (int i = 0; i < N * V; i++) max_diff = fmax(max_diff, fabs(shifted_dlogits[i] - dlogits[i]));
    EXPECT(max_diff < 1e-3, "shifted logits: gradient differs by %g", max_diff);
    free(inplace);
    free(ctx.logits);
}

// Scaled RoPE: linear divides every frequency by the factor, so position p under factor
// f turns exactly as position p / f without scaling; llama3 keeps the high frequencies,
// divides the low ones by the factor and blends the band between (hand values).
static void test_rope_scaling(void) {
    enum { N = 4, H = 2, D = 8, SIZE = N * H * D };
    const float theta = 5000.0f;
    const int32_t pos[N] = {0, 4, 10, 36}, half_pos[N] = {0, 2, 5, 18};
    float x[SIZE], scaled[SIZE], plain[SIZE];
    fill_uniform(x, SIZE, 1.0f);
    memcpy(scaled, x, sizeof x), memcpy(plain, x, sizeof x);
    const RopeScaling linear = {.type = ROPE_LINEAR, .factor = 2.0f};
    rope_forward_cpu(scaled, pos, N, H, D, theta, &linear);
    rope_forward_cpu(plain, half_pos, N, H, D, theta, NULL);
    double plain_d[SIZE];
    for (int i = 0; i < SIZE; i++) plain_d[i] = plain[i];
    EXPECT(test_relative_error(scaled, plain_d, SIZE) < 1e-6, "linear factor 2 at p = plain at p/2");
    rope_backward_cpu(scaled, pos, N, H, D, theta, &linear);
    double x_d[SIZE];
    for (int i = 0; i < SIZE; i++) x_d[i] = x[i];
    EXPECT(test_relative_error(scaled, x_d, SIZE) < 1e-6, "scaled backward inverts the forward");

    // theta 5000, D 8: wavelengths 6.28, 52.8, 444, 3737 against original 128 with
    // factors 1 and 4: bands at 32 and 128.
    const RopeScaling llama3 = {ROPE_LLAMA3, 4.0f, 1.0f, 4.0f, 128};
    double inv[D / 2], base[D / 2];
    rope_inv_freq(inv, D, theta, &llama3);
    rope_inv_freq(base, D, theta, NULL);
    const double wavelen1 = 2.0 * M_PI / base[1], smooth = (128.0 / wavelen1 - 1.0) / 3.0;
    EXPECT(inv[0] == base[0], "llama3 keeps the highest frequency");
    EXPECT(fabs(inv[1] - ((1.0 - smooth) * base[1] / 4.0 + smooth * base[1])) < 1e-15 &&
               inv[1] < base[1] && inv[1] > base[1] / 4.0,
           "llama3 blends the medium band: %g of %g", inv[1], base[1]);
    EXPECT(fabs(inv[2] - base[2] / 4.0) < 1e-18 && fabs(inv[3] - base[3] / 4.0) < 1e-18,
           "llama3 divides the low frequencies by the factor");
}

// bias: forward adds the vector to every row; backward sums the rows (accumulating),
// against a double reference and finite differences of <r, out>.
static void test_bias(void) {
    enum { N = 37, C = 70 };  // C past one 64-column block
    float out[N * C], bias[C], dout[N * C], dbias[C];
    fill_uniform(out, N * C, 1.0f);
    fill_uniform(bias, C, 1.0f);
    fill_uniform(dout, N * C, 1.0f);
    float got[N * C];
    memcpy(got, out, sizeof out);
    bias_forward_cpu(got, bias, N, C);
    double want[N * C];
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) want[n * C + c] = (double)out[n * C + c] + bias[c];
    EXPECT(test_relative_error(got, want, N * C) < 1e-7, "bias forward");
    for (int c = 0; c < C; c++) dbias[c] = 0.5f;
    bias_backward_cpu(dbias, dout, N, C);
    double want_db[C];
    for (int c = 0; c < C; c++) {
        want_db[c] = 0.5;
        for (int n = 0; n < N; n++) want_db[c] += dout[n * C + c];
    }
    EXPECT(test_relative_error(dbias, want_db, C) < 1e-6, "bias backward accumulates column sums");
}

int main(void) {
    rng = test_rng_from_env();
    test_rope_scaling();
    test_bias();
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_matmul();
    test_cross_entropy();
    return test_finish();
}
