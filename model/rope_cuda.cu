// Rotate-half RoPE on the GPU (twin of rope_*_cpu): in place on one tensor, or split
// out of / merged into the stacked q|k|v projection with a per-batch angle table.
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

// Up to three groups of heads of one token row, each read from src + n * src_ld and
// written to dst + n * dst_ld (dst may equal src: in place). Rotated groups get RoPE,
// the others are copied (v beside q and k in a stacked q|k|v row).
enum { ROPE_MAX_GROUPS = 3 };
typedef struct {
    const bf16 *src[ROPE_MAX_GROUPS];
    bf16 *dst[ROPE_MAX_GROUPS];
    int64_t src_ld[ROPE_MAX_GROUPS], dst_ld[ROPE_MAX_GROUPS];
    int heads[ROPE_MAX_GROUPS];
    bool rotate[ROPE_MAX_GROUPS];
} RopeGroups;

// The inverse frequencies of rope_inv_freq (theta under the scaling), computed on the
// host in double exactly as the CPU op does, passed by value to the kernels.
enum { ROPE_MAX_HALF = 256 };
typedef struct {
    double inv[ROPE_MAX_HALF];
} RopeFreqs;

static RopeFreqs rope_freqs(const char *op, int head_dim, float theta, const RopeScaling *scaling) {
    CHECK(head_dim > 0 && head_dim / 2 <= ROPE_MAX_HALF, "%s: head_dim %d outside (0, %d]", op,
          head_dim, 2 * ROPE_MAX_HALF);
    RopeFreqs f = {};
    if (theta > 0.0f) rope_inv_freq(f.inv, head_dim, theta, scaling);
    return f;
}

// cos and sin of angle pos * inv_freq[i], in double like the CPU op, then rounded to
// float (what the rotation multiplies by).
__device__ inline float2 rope_cos_sin(int32_t pos, int i, const RopeFreqs &freqs) {
    const double angle = pos * freqs.inv[i];
    double sin_d, cos_d;
    sincos(angle, &sin_d, &cos_d);
    return make_float2((float)cos_d, (float)sin_d);
}

__global__ void rope_angles_kernel(float2 *cos_sin, const int32_t *pos, int N, int head_dim,
                                   RopeFreqs freqs) {
    const int half = head_dim / 2;
    const int64_t total = (int64_t)N * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x)
        cos_sin[idx] = rope_cos_sin(pos[idx / half], (int)(idx % half), freqs);
}

// One block per token row (grid-stride over rows), one thread per (head of any group,
// pack of VEC frequencies i): it takes those angles (from the table cos_sin [N, half]
// when given, else computed) and rotates pairs (i, i + half) of its head, or copies them.
// direction = +1 forward, -1 inverse (the backward). The row and head come from the
// block and thread indices: no 64-bit division per element.
template <int VEC>
__global__ void rope_kernel(RopeGroups g, const float2 *cos_sin, const int32_t *pos, int N,
                            int head_dim, RopeFreqs freqs, float direction) {
    const int half = head_dim / 2, packs = half / VEC;
    const int heads = g.heads[0] + g.heads[1] + g.heads[2];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        for (int t = threadIdx.x; t < heads * packs; t += blockDim.x) {
            int h = t / packs;
            const int i0 = (t - h * packs) * VEC;
            int group = 0;
            while (h >= g.heads[group]) h -= g.heads[group++];
            const bf16 *src = g.src[group] + n * g.src_ld[group] + h * head_dim + i0;
            bf16 *dst = g.dst[group] + n * g.dst_ld[group] + h * head_dim + i0;
            Pack<bf16, VEC> x1 = load_bf16s<VEC>(src), x2 = load_bf16s<VEC>(src + half);
            if (g.rotate[group]) {
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    const float2 cs = cos_sin ? cos_sin[n * half + i0 + j]
                                              : rope_cos_sin(pos[n], i0 + j, freqs);
                    const float cos_f = cs.x, sin_f = direction * cs.y;
                    const float a = __bfloat162float(x1.x[j]), b = __bfloat162float(x2.x[j]);
                    x1.x[j] = __float2bfloat16_rn(a * cos_f - b * sin_f);
                    x2.x[j] = __float2bfloat16_rn(b * cos_f + a * sin_f);
                }
            }
            store_bf16s<VEC>(dst, x1);
            store_bf16s<VEC>(dst + half, x2);
        }
    }
}

// Unused groups have zero heads (their pointers are never dereferenced).
// theta 0: the angles come from cos_sin (no frequencies needed).
static void rope_launch(const char *op, RopeGroups g, const float2 *cos_sin, const int32_t *pos,
                        int N, int head_dim, float theta, const RopeScaling *scaling,
                        float direction, cudaStream_t stream) {
    CHECK(N >= 0 && head_dim > 0 && head_dim % 2 == 0,
          "%s: bad shape N=%d head_dim=%d (head_dim must be even)", op, N, head_dim);
    for (int i = 0; i < ROPE_MAX_GROUPS; i++)
        CHECK(g.heads[i] >= 0, "%s: negative head count %d", op, g.heads[i]);
    if (N == 0) return;
    bool packed = (head_dim / 2) % 8 == 0;
    for (int i = 0; i < ROPE_MAX_GROUPS; i++)
        if (g.heads[i] > 0)
            packed = packed && pack_aligned(g.src[i], 16) && pack_aligned(g.dst[i], 16) &&
                     g.src_ld[i] % 8 == 0 && g.dst_ld[i] % 8 == 0;
    const int vec = packed ? 8 : 1;
    const int64_t per_row = (int64_t)(g.heads[0] + g.heads[1] + g.heads[2]) * (head_dim / 2 / vec);
    CHECK(per_row <= INT32_MAX, "%s: %lld threads' work per token row", op, (long long)per_row);
    // Threads of a row rounded up to whole warps, at most ELEMENTWISE_THREADS (they loop).
    const int threads = per_row >= ELEMENTWISE_THREADS ? ELEMENTWISE_THREADS
                                                       : (int)(per_row + 31) / 32 * 32;
    const unsigned blocks = grid_for(N, 1);
    const RopeFreqs freqs = rope_freqs(op, head_dim, theta, scaling);
    if (packed)
        rope_kernel<8><<<blocks, threads, 0, stream>>>(g, cos_sin, pos, N, head_dim, freqs,
                                                       direction);
    else
        rope_kernel<1><<<blocks, threads, 0, stream>>>(g, cos_sin, pos, N, head_dim, freqs,
                                                       direction);
    cudaCheckLaunch();
}

// One group x [N, n_heads, head_dim], in place.
static RopeGroups rope_in_place(bf16 *x, int n_heads, int head_dim) {
    const int64_t ld = (int64_t)n_heads * head_dim;
    return RopeGroups{{x, x, x}, {x, x, x}, {ld, ld, ld}, {ld, ld, ld}, {n_heads, 0, 0},
                      {true, false, false}};
}

void rope_forward_cuda(bf16 *x, const int32_t *pos, int N, int n_heads, int head_dim,
                       float theta, const RopeScaling *scaling, cudaStream_t stream) {
    rope_launch("rope_forward_cuda", rope_in_place(x, n_heads, head_dim), nullptr, pos, N, head_dim,
                theta, scaling, 1.0f, stream);
}

void rope_backward_cuda(bf16 *dx, const int32_t *pos, int N, int n_heads, int head_dim,
                        float theta, const RopeScaling *scaling, cudaStream_t stream) {
    rope_launch("rope_backward_cuda", rope_in_place(dx, n_heads, head_dim), nullptr, pos, N,
                head_dim, theta, scaling, -1.0f, stream);
}

// The stacked row [q (H heads) | k (KV heads) | v (KV heads)] against the three
// separate tensors [N, H, D], [N, KV, D], [N, KV, D].
// rotate: false copies q and k too.
static RopeGroups rope_qkv_groups(const bf16 *src_q, const bf16 *src_k, const bf16 *src_v,
                                  bool src_stacked, bf16 *dst_q, bf16 *dst_k, bf16 *dst_v,
                                  int n_heads, int n_kv_heads, int head_dim, bool rotate) {
    const int64_t stacked = (int64_t)(n_heads + 2 * n_kv_heads) * head_dim;
    const int64_t q_ld = (int64_t)n_heads * head_dim, kv_ld = (int64_t)n_kv_heads * head_dim;
    const int64_t src_q_ld = src_stacked ? stacked : q_ld, src_kv_ld = src_stacked ? stacked : kv_ld;
    const int64_t dst_q_ld = src_stacked ? q_ld : stacked, dst_kv_ld = src_stacked ? kv_ld : stacked;
    return RopeGroups{{src_q, src_k, src_v},
                      {dst_q, dst_k, dst_v},
                      {src_q_ld, src_kv_ld, src_kv_ld},
                      {dst_q_ld, dst_kv_ld, dst_kv_ld},
                      {n_heads, n_kv_heads, n_kv_heads},
                      {rotate, rotate, false}};
}

void rope_angles_cuda(float2 *cos_sin, const int32_t *pos, int N, int head_dim, float theta,
                      const RopeScaling *scaling, cudaStream_t stream) {
    CHECK(N >= 0 && head_dim > 0 && head_dim % 2 == 0,
          "rope_angles_cuda: bad shape N=%d head_dim=%d (head_dim must be even)", N, head_dim);
    if (N == 0) return;
    const int64_t total = (int64_t)N * (head_dim / 2);
    rope_angles_kernel<<<grid_for(total, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        cos_sin, pos, N, head_dim, rope_freqs("rope_angles_cuda", head_dim, theta, scaling));
    cudaCheckLaunch();
}

void rope_split_qkv_cuda(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float2 *cos_sin, int N,
                         int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    const int64_t q_dim = (int64_t)n_heads * head_dim, kv_dim = (int64_t)n_kv_heads * head_dim;
    rope_launch("rope_split_qkv_cuda",
                rope_qkv_groups(qkv, qkv + q_dim, qkv + q_dim + kv_dim, true, q, k, v, n_heads,
                                n_kv_heads, head_dim, cos_sin != nullptr),
                cos_sin, nullptr, N, head_dim, 0.0f, nullptr, 1.0f, stream);
}

void rope_merge_qkv_backward_cuda(bf16 *dqkv, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                                  const float2 *cos_sin, int N, int n_heads, int n_kv_heads,
                                  int head_dim, cudaStream_t stream) {
    const int64_t q_dim = (int64_t)n_heads * head_dim, kv_dim = (int64_t)n_kv_heads * head_dim;
    rope_launch("rope_merge_qkv_backward_cuda",
                rope_qkv_groups(dq, dk, dv, false, dqkv, dqkv + q_dim, dqkv + q_dim + kv_dim,
                                n_heads, n_kv_heads, head_dim, cos_sin != nullptr),
                cos_sin, nullptr, N, head_dim, 0.0f, nullptr, -1.0f, stream);
}
