// Matmuls of the HF Linear layout through cuBLASLt: bf16 A/B, fp32 compute, bf16
// or fp32 output. cuBLASLt is column-major; a row-major [R, K] matrix is read as
// a column-major K x R one, so every product below is written for the transposes.
#include <stdbool.h>
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"
#include "model/lora_cuda.h"

// Largest power of two (up to 256) dividing the address: tells the heuristic
// which alignment the algorithm may assume (its default, 256, would reject
// pointers into the middle of a buffer at launch).
static uint32_t pointer_alignment(const void *p) {
    uint32_t alignment = 256;
    while (alignment > 1 && (uintptr_t)p % alignment != 0) alignment /= 2;
    return alignment;
}

// Everything cuBLASLt needs for one product shape: the descriptors and the algorithm
// its heuristic picked. Building these takes more host time than a small product takes
// on the GPU, so each shape is planned once.
typedef struct {
    int m, n, k;
    int lda, ldb, ldd;  // leading dimensions (the stored rows, or more for a strided view)
    bool transpose_a, transpose_b;
    cudaDataType_t d_type;
    uint32_t align_a, align_b, align_d;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, d_layout;
    cublasLtMatmulAlgo_t algo;
} MatmulPlan;

// A model uses a handful of shapes; when a caller cycles through more than this,
// the cache is simply emptied and refilled.
enum { MATMUL_PLAN_CAPACITY = 128 };
static MatmulPlan g_plans[MATMUL_PLAN_CAPACITY];
static int g_n_plans;

void matmul_plans_clear(void) {
    for (int i = 0; i < g_n_plans; i++) {
        MatmulPlan *p = &g_plans[i];
        cublasCheck(cublasLtMatrixLayoutDestroy(p->d_layout));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->b_layout));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->a_layout));
        cublasCheck(cublasLtMatmulDescDestroy(p->desc));
    }
    g_n_plans = 0;
}

static const MatmulPlan *plan_for(const char *op, const OpsCudaState *s, cudaDataType_t d_type,
                                  bool transpose_a, bool transpose_b, int m, int n, int k,
                                  int lda, int ldb, int ldd, uint32_t align_a, uint32_t align_b,
                                  uint32_t align_d) {
    for (int i = 0; i < g_n_plans; i++) {
        const MatmulPlan *p = &g_plans[i];
        if (p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb &&
            p->ldd == ldd && p->transpose_a == transpose_a &&
            p->transpose_b == transpose_b && p->d_type == d_type && p->align_a == align_a &&
            p->align_b == align_b && p->align_d == align_d)
            return p;
    }
    if (g_n_plans == MATMUL_PLAN_CAPACITY) matmul_plans_clear();
    MatmulPlan *p = &g_plans[g_n_plans];
    *p = MatmulPlan{};
    p->m = m, p->n = n, p->k = k, p->transpose_a = transpose_a, p->transpose_b = transpose_b;
    p->lda = lda, p->ldb = ldb, p->ldd = ldd;
    p->d_type = d_type, p->align_a = align_a, p->align_b = align_b, p->align_d = align_d;

    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                               sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                               sizeof(op_b)));
    if (transpose_a) cublasCheck(cublasLtMatrixLayoutCreate(&p->a_layout, CUDA_R_16BF, k, m, lda));
    else cublasCheck(cublasLtMatrixLayoutCreate(&p->a_layout, CUDA_R_16BF, m, k, lda));
    if (transpose_b) cublasCheck(cublasLtMatrixLayoutCreate(&p->b_layout, CUDA_R_16BF, n, k, ldb));
    else cublasCheck(cublasLtMatrixLayoutCreate(&p->b_layout, CUDA_R_16BF, k, n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->d_layout, d_type, m, n, ldd));

    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace_bytes = s->cublaslt_workspace_bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
        sizeof(workspace_bytes)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int n_results = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(s->cublaslt, p->desc, p->a_layout, p->b_layout,
                                       p->d_layout, p->d_layout, preference, 1, &heuristic,
                                       &n_results);
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    if (status != CUBLAS_STATUS_SUCCESS || n_results == 0)
        fatal("%s: cuBLASLt has no algorithm for m=%d n=%d k=%d (alignments %u/%u/%u): %s", op,
              m, n, k, align_a, align_b, align_d, cublasLtGetStatusString(status));
    p->algo = heuristic.algo;
    g_n_plans++;
    return p;
}

// Column-major D[m,n] = alpha op(A)[m,k] @ op(B)[k,n] + beta * D with leading dimensions
// lda, ldb, ldd (at least the stored rows: a strided view of a wider matrix). A and B
// are bf16; D is bf16 or fp32.
static void lt_matmul_ld(const char *op, void *d, cudaDataType_t d_type, int ldd, const bf16 *a,
                         int lda, bool transpose_a, const bf16 *b, int ldb, bool transpose_b,
                         int m, int n, int k, float alpha, float beta, cudaStream_t stream) {
    const OpsCudaState *s = ops_cuda_state(op);
    const MatmulPlan *p = plan_for(op, s, d_type, transpose_a, transpose_b, m, n, k, lda, ldb,
                                   ldd, pointer_alignment(a), pointer_alignment(b),
                                   pointer_alignment(d));
    // C and D are the same buffer with the same layout: beta = 1 accumulates in place.
    cublasCheck(cublasLtMatmul(s->cublaslt, p->desc, &alpha, a, p->a_layout, b, p->b_layout,
                               &beta, d, p->d_layout, d, p->d_layout, &p->algo,
                               s->cublaslt_workspace, s->cublaslt_workspace_bytes, stream));
}

// lt_matmul_ld with every matrix tight (leading dimension = stored rows) and alpha 1.
static void lt_matmul(const char *op, void *d, cudaDataType_t d_type, const bf16 *a,
                      bool transpose_a, const bf16 *b, bool transpose_b, int m, int n, int k,
                      float beta, cudaStream_t stream) {
    lt_matmul_ld(op, d, d_type, m, a, transpose_a ? k : m, transpose_a, b, transpose_b ? n : k,
                 transpose_b, m, n, k, 1.0f, beta, stream);
}

static void check_matmul_shape(const char *op, int N, int IC, int OC) {
    CHECK(N >= 0 && IC > 0 && OC > 0, "%s: bad shape N=%d IC=%d OC=%d", op, N, IC, OC);
}

void matmul_forward_cuda(bf16 *out, const bf16 *inp, const bf16 *weight, int N, int IC, int OC,
                         cudaStream_t stream) {
    check_matmul_shape("matmul_forward_cuda", N, IC, OC);
    if (N == 0) return;
    // out^T[OC,N] = W[OC,IC] @ inp^T[IC,N]; weight's column-major view is W^T.
    lt_matmul("matmul_forward_cuda", out, CUDA_R_16BF, weight, true, inp, false, OC, N, IC, 0.0f,
              stream);
}

// dinp is accumulated (beta 1) or overwritten (beta 0); dweight always accumulated.
static void matmul_backward(const char *op, bf16 *dinp, float dinp_beta, float *dweight,
                            const bf16 *dout, const bf16 *inp, const bf16 *weight, int N, int IC,
                            int OC, cudaStream_t stream) {
    check_matmul_shape(op, N, IC, OC);
    if (N == 0) return;
    // dinp^T[IC,N] (+)= W^T[IC,OC] @ dout^T[OC,N]
    if (dinp) lt_matmul(op, dinp, CUDA_R_16BF, weight, false, dout, false, IC, N, OC, dinp_beta,
                        stream);
    // dweight^T[IC,OC] += inp^T[IC,N] @ dout[N,OC]; none for a frozen weight (NULL)
    if (dweight) lt_matmul(op, dweight, CUDA_R_32F, inp, false, dout, true, IC, OC, N, 1.0f, stream);
}

void matmul_backward_cuda(bf16 *dinp, float *dweight, const bf16 *dout, const bf16 *inp,
                          const bf16 *weight, int N, int IC, int OC, cudaStream_t stream) {
    matmul_backward("matmul_backward_cuda", dinp, 1.0f, dweight, dout, inp, weight, N, IC, OC,
                    stream);
}

void matmul_backward_overwrite_cuda(bf16 *dinp, float *dweight, const bf16 *dout,
                                    const bf16 *inp, const bf16 *weight, int N, int IC, int OC,
                                    cudaStream_t stream) {
    matmul_backward("matmul_backward_overwrite_cuda", dinp, 0.0f, dweight, dout, inp, weight, N,
                    IC, OC, stream);
}

// LoRA (model/lora_cuda.h), the products of lora_forward_cpu / lora_backward_cpu with the
// same roles: one product over the group's stacked A's (u, dA, dx read or write the shared
// input once for all members), one per member for its B.
static void check_lora_group(const char *op, const LoraGroup *g, int T, int ld) {
    CHECK(T >= 0 && g->n >= 1 && g->n <= LORA_GROUP_MAX && g->in > 0 && g->r > 0,
          "%s: bad group n=%d in=%d r=%d T=%d", op, g->n, g->in, g->r, T);
    for (int j = 0; j < g->n; j++)
        CHECK(g->out[j] > 0 && g->col[j] >= 0 && g->col[j] + g->out[j] <= ld,
              "%s: member %d's columns %d + %d outside rows of %d", op, j, g->col[j], g->out[j],
              ld);
}

void lora_forward_cuda(bf16 *out, int ld_out, bf16 *u, const bf16 *x, const bf16 *adapter,
                       const LoraGroup *g, int T, cudaStream_t stream) {
    const char *op = "lora_forward_cuda";
    check_lora_group(op, g, T, ld_out);
    if (T == 0) return;
    const int r = g->r, nr = g->n * r;
    // u^T[n r, T] = A[n r, in] @ x^T[in, T]
    lt_matmul_ld(op, u, CUDA_R_16BF, nr, adapter + g->a, g->in, true, x, g->in, false, nr, T,
                 g->in, 1.0f, 0.0f, stream);
    // member j: out_j^T[out_j, T] += s B_j[out_j, r] @ u_j^T[r, T]
    for (int j = 0; j < g->n; j++)
        lt_matmul_ld(op, out + g->col[j], CUDA_R_16BF, ld_out, adapter + g->b[j], r, true,
                     u + (size_t)j * r, nr, false, g->out[j], T, r, g->scale, 1.0f, stream);
}

void lora_backward_cuda(bf16 *dx, float *adapter_grads, bf16 *u, bf16 *du, const bf16 *dout,
                        int ld_dout, const bf16 *x, const bf16 *adapter, const LoraGroup *g,
                        int T, cudaStream_t stream) {
    const char *op = "lora_backward_cuda";
    check_lora_group(op, g, T, ld_dout);
    if (T == 0) return;
    const int r = g->r, nr = g->n * r, in = g->in;
    const bf16 *A = adapter + g->a;
    lt_matmul_ld(op, u, CUDA_R_16BF, nr, A, in, true, x, in, false, nr, T, in, 1.0f, 0.0f, stream);
    for (int j = 0; j < g->n; j++) {
        const bf16 *dout_j = dout + g->col[j], *u_j = u + (size_t)j * r;
        // dB_j^T[r, out_j] += s u_j^T[r, T] @ dout_j[T, out_j]
        lt_matmul_ld(op, adapter_grads + g->b[j], CUDA_R_32F, r, u_j, nr, false, dout_j, ld_dout,
                     true, r, g->out[j], T, g->scale, 1.0f, stream);
        // du_j^T[r, T] = s B_j^T[r, out_j] @ dout_j^T[out_j, T]
        lt_matmul_ld(op, du + (size_t)j * r, CUDA_R_16BF, nr, adapter + g->b[j], r, false, dout_j,
                     ld_dout, false, r, T, g->out[j], g->scale, 0.0f, stream);
    }
    // dA^T[in, n r] += x^T[in, T] @ du[T, n r]
    lt_matmul_ld(op, adapter_grads + g->a, CUDA_R_32F, in, x, in, false, du, nr, true, in, nr, T,
                 1.0f, 1.0f, stream);
    // dx^T[in, T] += A^T[in, n r] @ du^T[n r, T]
    if (dx)
        lt_matmul_ld(op, dx, CUDA_R_16BF, in, A, in, false, du, nr, false, in, T, nr, 1.0f, 1.0f,
                     stream);
}
