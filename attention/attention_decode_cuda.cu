// Decode attention kernels (attention_decode_cuda.h): one block per (token, KV head,
// split), one warp per query head of the KV head's group, so the group's warps read the
// same cache rows (L1 hits). Per step of 32 keys a warp scores them lane-per-key (each
// lane a whole dot product, no shuffles), updates the online softmax, then accumulates
// P V with lanes over pairs of head dims (coalesced V rows). Scores are kept in log2
// units (q pre-scaled by scale * log2(e)) for exp2f.
#include "attention/attention_decode_cuda.h"

#include <math.h>
#include "common/cuda_check.h"

typedef __nv_bfloat16 bf16;

enum {
    DECODE_WARP = 32,
    DECODE_MAX_GROUP = 32,         // query heads per KV head: one warp each in one block
    DECODE_MAX_HEAD_DIM = 256,     // 4 pairs of dims per lane
    DECODE_MIN_SPLIT_KEYS = 128,   // a split reduces at least this many keys
    DECODE_TARGET_WARPS = 4096,    // splits are added until a call runs about this many warps
    DECODE_MERGE_THREADS = 128,
};

// How a call cuts the caches: splits of split_keys keys (whole 32-key steps).
typedef struct {
    int splits, split_keys;
} DecodeSplits;

// At most this many splits for n_tokens: enough for about DECODE_TARGET_WARPS warps, none
// shorter than DECODE_MIN_SPLIT_KEYS. Grows with max_keys, shrinks with n_tokens.
static int split_bound(const DecodeShape *s, int n_tokens) {
    const int64_t warps = (int64_t)n_tokens * s->n_heads;
    int64_t want = warps >= DECODE_TARGET_WARPS ? 1 : (DECODE_TARGET_WARPS + warps - 1) / warps;
    const int64_t most = (s->max_keys + DECODE_MIN_SPLIT_KEYS - 1) / DECODE_MIN_SPLIT_KEYS;
    if (want > most) want = most;
    return want < 1 ? 1 : (int)want;
}

// A function of the shape and n_tokens only (no device query): a fixed summation order.
// Never more splits than split_bound (what the workspace is sized for).
static DecodeSplits decode_splits(const DecodeShape *s, int n_tokens) {
    const int bound = split_bound(s, n_tokens);
    int keys = (s->max_keys + bound - 1) / bound;
    keys = (keys + DECODE_WARP - 1) / DECODE_WARP * DECODE_WARP;
    if (keys < DECODE_WARP) keys = DECODE_WARP;
    DecodeSplits r = {(s->max_keys + keys - 1) / keys, keys};
    if (r.splits < 1) r.splits = 1;
    return r;
}

// Partial results of a split call: unnormalised outputs, then (max, sum) per split.
static size_t partial_bytes(const DecodeShape *s, int n_tokens, int splits) {
    if (splits == 1) return 0;  // the main kernel writes the output directly
    const size_t parts = (size_t)n_tokens * s->n_heads * splits;
    return parts * s->head_dim * sizeof(float) + parts * sizeof(float2);
}

size_t attention_decode_workspace_bytes(const DecodeShape *shape) {
    decode_shape_check(shape);
    size_t most = 0;
    for (int n = 1; n <= shape->n_tokens; n++) {  // fewer tokens may take more splits
        const size_t bytes = partial_bytes(shape, n, split_bound(shape, n));
        if (bytes > most) most = bytes;
    }
    return most;
}

typedef struct {
    const bf16 *q, *k_cache, *v_cache;
    const int32_t *slot, *n_keys;
    bf16 *out;
    float *part_acc;   // [n_tokens, H, splits, D] unnormalised partial outputs (splits > 1)
    float2 *part_ml;   // [n_tokens, H, splits] (running max in log2 units, sum of exp2)
    int H, KV, D, max_len, splits, split_keys;
    float scale_log2;  // softmax scale * log2(e)
} DecodeArgs;

__device__ inline float decode_warp_max(float x) {
    for (int offset = 16; offset > 0; offset >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}
__device__ inline float decode_warp_sum(float x) {
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

template <int VEC>
struct alignas(2 * VEC) Bf16Pack {
    bf16 x[VEC];
};

// PAIRS: pairs of head dims per lane in P V (D <= 64 PAIRS); VEC: bf16 per K load
// (8: 16-byte loads when D % 8 == 0, else 2).
template <int PAIRS, int VEC>
__global__ void __launch_bounds__(DECODE_WARP * DECODE_MAX_GROUP)
    attn_decode_kernel(DecodeArgs a) {
    extern __shared__ float q_shared[];  // [group, D] the block's queries, pre-scaled
    const int group = a.H / a.KV, D = a.D;
    const int token = blockIdx.x / a.KV, kv_head = blockIdx.x % a.KV, split = blockIdx.y;
    const int warp = threadIdx.x / DECODE_WARP, lane = threadIdx.x % DECODE_WARP;
    const int64_t out_row = (int64_t)token * a.H + kv_head * group + warp;
    float *qs = q_shared + warp * D;
    for (int d = lane; d < D; d += DECODE_WARP)
        qs[d] = __bfloat162float(a.q[out_row * D + d]) * a.scale_log2;
    __syncwarp();

    const int k_begin = split * a.split_keys;
    const int k_end = min(a.n_keys[token], k_begin + a.split_keys);
    const int64_t row = (int64_t)a.KV * D;  // one cache position
    const int64_t base = (int64_t)a.slot[token] * a.max_len * row + (int64_t)kv_head * D;
    const bf16 *kc = a.k_cache + base, *vc = a.v_cache + base;

    float run_max = -INFINITY, run_sum = 0.0f;
    float2 acc[PAIRS];
#pragma unroll
    for (int c = 0; c < PAIRS; c++) acc[c] = make_float2(0.0f, 0.0f);
    for (int k0 = k_begin; k0 < k_end; k0 += DECODE_WARP) {
        const int key = k0 + lane;
        float score = -INFINITY;
        if (key < k_end) {
            const bf16 *kr = kc + key * row;
            float dot = 0.0f;
            for (int d = 0; d < D; d += VEC) {
                const Bf16Pack<VEC> k = *reinterpret_cast<const Bf16Pack<VEC> *>(kr + d);
#pragma unroll
                for (int j = 0; j < VEC; j++) dot += qs[d + j] * __bfloat162float(k.x[j]);
            }
            score = dot;
        }
        // Lane 0's key exists (k0 < k_end), so new_max is finite.
        const float new_max = fmaxf(run_max, decode_warp_max(score));
        const float p = exp2f(score - new_max);          // 0 for lanes past the end
        const float rescale = exp2f(run_max - new_max);  // 0 on the first step
        run_sum = run_sum * rescale + decode_warp_sum(p);
        run_max = new_max;
#pragma unroll
        for (int c = 0; c < PAIRS; c++) acc[c].x *= rescale, acc[c].y *= rescale;
        const int n = min(DECODE_WARP, k_end - k0);
#pragma unroll 4
        for (int j = 0; j < n; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const bf16 *vr = vc + (k0 + j) * row;
#pragma unroll
            for (int c = 0; c < PAIRS; c++) {
                const int d = 2 * (lane + DECODE_WARP * c);
                if (d < D) {
                    const float2 v =
                        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(vr + d));
                    acc[c].x += pj * v.x;
                    acc[c].y += pj * v.y;
                }
            }
        }
    }

    if (a.splits == 1) {
        const float inv = run_sum > 0.0f ? 1.0f / run_sum : 0.0f;  // no key: zero output
        bf16 *o = a.out + out_row * D;
#pragma unroll
        for (int c = 0; c < PAIRS; c++) {
            const int d = 2 * (lane + DECODE_WARP * c);
            if (d < D)
                *reinterpret_cast<__nv_bfloat162 *>(o + d) =
                    __floats2bfloat162_rn(acc[c].x * inv, acc[c].y * inv);
        }
        return;
    }
    // An empty split (past its token's keys) writes zeros and sum 0.
    const int64_t part = out_row * a.splits + split;
    float *pa = a.part_acc + part * D;
#pragma unroll
    for (int c = 0; c < PAIRS; c++) {
        const int d = 2 * (lane + DECODE_WARP * c);
        if (d < D) *reinterpret_cast<float2 *>(pa + d) = acc[c];
    }
    if (lane == 0) a.part_ml[part] = make_float2(run_max, run_sum);
}

// One block per (token, head): out = sum_s acc_s 2^(m_s - m) / sum_s l_s 2^(m_s - m),
// in split order.
__global__ void attn_decode_merge_kernel(DecodeArgs a) {
    const int64_t out_row = blockIdx.x;
    const float2 *ml = a.part_ml + out_row * a.splits;
    float m = -INFINITY;
    for (int s = 0; s < a.splits; s++)
        if (ml[s].y > 0.0f) m = fmaxf(m, ml[s].x);
    float sum = 0.0f;
    for (int s = 0; s < a.splits; s++)
        if (ml[s].y > 0.0f) sum += ml[s].y * exp2f(ml[s].x - m);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < a.splits; s++)
            if (ml[s].y > 0.0f) o += a.part_acc[(out_row * a.splits + s) * a.D + d] * exp2f(ml[s].x - m);
        a.out[out_row * a.D + d] = __float2bfloat16_rn(o * inv);
    }
}

template <int PAIRS>
static void launch_pairs(const DecodeArgs &a, bool vec8, dim3 grid, int threads, size_t smem,
                         cudaStream_t stream) {
    if (vec8) attn_decode_kernel<PAIRS, 8><<<grid, threads, smem, stream>>>(a);
    else attn_decode_kernel<PAIRS, 2><<<grid, threads, smem, stream>>>(a);
}

void attention_decode_cuda(const DecodeShape *shape, const bf16 *q, const bf16 *k_cache,
                           const bf16 *v_cache, const int32_t *slot, const int32_t *n_keys,
                           bf16 *out, void *workspace, cudaStream_t stream) {
    decode_shape_check(shape);
    const int H = shape->n_heads, KV = shape->n_kv_heads, D = shape->head_dim, N = shape->n_tokens;
    const int group = H / KV;
    CHECK(D % 2 == 0 && D <= DECODE_MAX_HEAD_DIM,
          "attention_decode_cuda: head_dim %d must be even and at most %d", D, DECODE_MAX_HEAD_DIM);
    CHECK(group <= DECODE_MAX_GROUP,
          "attention_decode_cuda: %d query heads per KV head, at most %d", group,
          DECODE_MAX_GROUP);
    CHECK((uintptr_t)k_cache % 4 == 0 && (uintptr_t)v_cache % 4 == 0 && (uintptr_t)out % 4 == 0,
          "attention_decode_cuda: caches and output must be 4-byte aligned");
    if (N == 0) return;
    const DecodeSplits sp = decode_splits(shape, N);
    DecodeArgs a = {q, k_cache, v_cache, slot, n_keys, out, nullptr, nullptr, H, KV, D,
                    shape->max_len, sp.splits, sp.split_keys,
                    shape->scale * 1.4426950408889634f};
    if (sp.splits > 1) {
        CHECK(workspace && (uintptr_t)workspace % 16 == 0,
              "attention_decode_cuda: a split call needs a 16-byte aligned workspace");
        a.part_acc = (float *)workspace;
        a.part_ml = (float2 *)(a.part_acc + (size_t)N * H * sp.splits * D);
    }
    const bool vec8 = D % 8 == 0 && (uintptr_t)k_cache % 16 == 0;
    const dim3 grid((unsigned)N * KV, (unsigned)sp.splits);
    const int threads = DECODE_WARP * group;
    const size_t smem = (size_t)group * D * sizeof(float);
    if (D <= 64) launch_pairs<1>(a, vec8, grid, threads, smem, stream);
    else if (D <= 128) launch_pairs<2>(a, vec8, grid, threads, smem, stream);
    else launch_pairs<4>(a, vec8, grid, threads, smem, stream);
    cudaCheckLaunch();
    if (sp.splits > 1) {
        attn_decode_merge_kernel<<<(unsigned)N * H, DECODE_MERGE_THREADS, 0, stream>>>(a);
        cudaCheckLaunch();
    }
}
