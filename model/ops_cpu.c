// CPU fp32 reference of the model ops (model/ops.h). Written for clarity first:
// every reduction that feeds a gradient runs in a fixed order, so results are
// bit-identical from run to run with the same thread count.
#include <cblas.h>
#include <math.h>
#include <string.h>
#include "common/check.h"
#include "model/ops.h"

// Columns per OpenMP task for column-wise reductions over tokens: wide enough
// to stream whole cache lines, narrow enough to keep the accumulator in L1.
enum { COLUMN_BLOCK = 64 };

void embedding_forward_cpu(float *out, const int32_t *tokens, const float *wte, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, (size_t)C * sizeof(float));
}

// Parallel over column blocks, tokens in order inside each: deterministic even
// when several tokens share a row of dwte.
void embedding_backward_cpu(float *dwte, const float *dout, const int32_t *tokens, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COLUMN_BLOCK) {
        const int c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
        for (int n = 0; n < N; n++) {
            float *row = dwte + (size_t)tokens[n] * C;
            const float *d = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) row[c] += d[c];
        }
    }
}

void rmsnorm_forward_cpu(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        double sum_sq = 0.0;
        for (int c = 0; c < C; c++) sum_sq += (double)x[c] * x[c];
        const float r = (float)(1.0 / sqrt(sum_sq / C + eps));
        for (int c = 0; c < C; c++) y[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

// y = w * x * r with r = (mean(x^2) + eps)^(-1/2), so
// dx_j = r * (w_j dy_j - x_j * r^2 * mean_i(w_i dy_i x_i)),  dw_i = sum_n dy_i x_i r.
void rmsnorm_backward_cpu(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        const float r = rstd[n];
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)weight[c] * dy[c] * x[c];
        const float correction = (float)(dot / C) * r * r;
        for (int c = 0; c < C; c++) dx[c] += r * (weight[c] * dy[c] - x[c] * correction);
    }
    if (!dweight) return;  // a frozen weight
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COLUMN_BLOCK) {
        const int c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
        double acc[COLUMN_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) acc[c - c0] += (double)dy[c] * x[c] * rstd[n];
        }
        for (int c = c0; c < c1; c++) dweight[c] += (float)acc[c - c0];
    }
}

// Rotates every head of every token by its position's angles; direction +1 is
// the forward rotation, -1 its inverse (= transpose, the backward of a rotation).
// Angles are computed in double: fp32 pos * inv_freq loses ~1e-4 rad at pos 4k.
static void rope_rotate(float *x, const int32_t *pos, int N, int n_heads, int head_dim,
                        float theta, const RopeScaling *scaling, float direction) {
    CHECK(head_dim % 2 == 0, "rope: head_dim %d is odd", head_dim);
    const int half = head_dim / 2;
    double *inv_freq = xmalloc((size_t)half * sizeof(double));  // [half]
    rope_inv_freq(inv_freq, head_dim, theta, scaling);
#pragma omp parallel
    {
        float *cos_t = xmalloc((size_t)half * sizeof(float));  // [half] per token
        float *sin_t = xmalloc((size_t)half * sizeof(float));  // [half] per token
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            for (int i = 0; i < half; i++) {
                const double angle = pos[n] * inv_freq[i];
                cos_t[i] = (float)cos(angle);
                sin_t[i] = direction * (float)sin(angle);
            }
            for (int h = 0; h < n_heads; h++) {
                float *x1 = x + ((size_t)n * n_heads + h) * head_dim, *x2 = x1 + half;
                for (int i = 0; i < half; i++) {
                    const float a = x1[i], b = x2[i];
                    x1[i] = a * cos_t[i] - b * sin_t[i];
                    x2[i] = b * cos_t[i] + a * sin_t[i];
                }
            }
        }
        free(cos_t);
        free(sin_t);
    }
    free(inv_freq);
}

void rope_forward_cpu(float *x, const int32_t *pos, int N, int n_heads, int head_dim, float theta,
                      const RopeScaling *scaling) {
    rope_rotate(x, pos, N, n_heads, head_dim, theta, scaling, 1.0f);
}

void rope_backward_cpu(float *dx, const int32_t *pos, int N, int n_heads, int head_dim,
                       float theta, const RopeScaling *scaling) {
    rope_rotate(dx, pos, N, n_heads, head_dim, theta, scaling, -1.0f);
}

void bias_forward_cpu(float *out, const float *bias, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] += bias[c];
}

// Column blocks in parallel, rows in order inside each: deterministic.
void bias_backward_cpu(float *dbias, const float *dout, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COLUMN_BLOCK) {
        const int c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
        double acc[COLUMN_BLOCK] = {0};
        for (int n = 0; n < N; n++)
            for (int c = c0; c < c1; c++) acc[c - c0] += dout[(size_t)n * C + c];
        for (int c = c0; c < c1; c++) dbias[c] += (float)acc[c - c0];
    }
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

void swiglu_forward_cpu(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

// d silu(g)/dg = s * (1 + g * (1 - s)) with s = sigmoid(g).
void swiglu_backward_cpu(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], s = sigmoidf(g);
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = dout[i] * g * s;
    }
}

void matmul_forward_cpu(float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC,
                0.0f, out, OC);
}

void matmul_backward_cpu(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int IC, int OC) {
    if (dinp)  // [N,IC] += [N,OC] @ [OC,IC]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight,
                    IC, 1.0f, dinp, IC);
    // [OC,IC] += [N,OC]^T @ [N,IC]
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                    1.0f, dweight, IC);
}

// Max-subtracted log-sum-exp in double per row. Each row reads its logits
// fully before writing dlogits, which is why dlogits may alias logits.
// Also accepts dlogits == NULL (loss only) and losses == NULL (sum only).
// The returned sum adds rows in order, so it does not depend on the threads.
double cross_entropy_forward_backward_cpu(float *losses, float *dlogits, const float *logits,
                                          const int32_t *targets, int N, int V, float loss_scale) {
    for (int n = 0; n < N; n++)
        CHECK(targets[n] >= -1 && targets[n] < V,
              "cross_entropy: target %d at row %d is outside [-1, %d)", targets[n], n, V);
    double *row_loss = xmalloc((size_t)N * sizeof(double));  // [N]
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float *dz = dlogits ? dlogits + (size_t)n * V : NULL;
        const int t = targets[n];
        row_loss[n] = 0.0;
        if (t < 0) {
            if (dz) memset(dz, 0, (size_t)V * sizeof(float));
            continue;
        }
        float max = z[0];
        for (int v = 1; v < V; v++) max = z[v] > max ? z[v] : max;
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += exp((double)z[v] - max);
        const double log_sum = log(sum) + max;
        row_loss[n] = log_sum - z[t];
        if (dz) {
            for (int v = 0; v < V; v++) dz[v] = (float)(exp((double)z[v] - log_sum) * loss_scale);
            dz[t] -= loss_scale;
        }
    }
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        if (losses) losses[n] = (float)row_loss[n];
        total += row_loss[n];
    }
    free(row_loss);
    return total;
}
