// CUDA block-sparse attention against the fp32 CPU oracle (attention_cpu.c) on the same
// bf16-rounded inputs: random Q, K, V, dO (fresh each run), interval masks of every
// layout family plus random intervals, keys scaled up along the sequence (scores whose
// row maxima keep growing), ragged seq_len, GQA (bench_attention's H=12/KV=4/D=64 and
// H=32/KV=8/D=128 among them), head_dim 64 and 128, and sparse rows of 131072 keys.
// Also: the GPU tile-mask builder equals the CPU one; kernels follow the tile lists
// (empty lists give zeros although lo/hi see keys); deterministic backward is bitwise
// reproducible; a NaN reaches exactly its query's dq row (a NaN key the rows that see it),
// and gradients of 2^70 stay exact (run_nan_case). ATTN_TEST_QUICK=1 runs two small cases
// and the NaN cases (for compute-sanitizer).
#include "attention/attention_cuda.h"

#include <math.h>
#include <string.h>
#include <vector>
#include "common/cuda_check.h"
#include "tests/test_cuda_util.cuh"
#include "tests/test_util.h"

namespace {

enum MaskKind { CAUSAL, DOCS, SHARED_PREFIX, STRIP_THINKING, DUPLICATE, RANDOM_INTERVALS, SINK_LOCAL,
                LONG_DOCS_SINK };
const char *const MASK_NAMES[] = {"causal", "docs", "shared_prefix", "strip_thinking",
                                  "duplicate", "random_intervals", "sink_local", "long_docs_sink"};

// Sets hi for keys [k0, k1) (clipped to the document end), lo = own slot (causal).
void causal_span(int32_t *lo, int32_t *hi, int k0, int k1, int doc_end, int visible_until) {
    for (int k = k0; k < k1 && k < doc_end; k++) {
        lo[k] = k;
        hi[k] = visible_until < doc_end ? visible_until : doc_end;
    }
}

// One document [d0, d1) of a layout family (DESIGN.md §3), lo/hi in row slots.
void fill_doc(MaskKind kind, int d0, int d1, TestRng *rng, int32_t *lo, int32_t *hi) {
    const int len = d1 - d0;
    if (kind == DOCS || kind == CAUSAL) {
        causal_span(lo, hi, d0, d1, d1, d1);
    } else if (kind == SHARED_PREFIX) {  // prefix sees all; completion i only itself
        int p = d0 + test_rng_int(rng, 1, len > 2 ? len / 2 : 1);
        causal_span(lo, hi, d0, p, d1, d1);
        for (int c0 = p; c0 < d1;) {
            int c1 = c0 + test_rng_int(rng, 1, 40);
            causal_span(lo, hi, c0, c1, d1, c1);
            c0 = c1;
        }
    } else {  // turns of prompt, think, answer (duplicate: answer copies aA, aB)
        for (int t0 = d0; t0 < d1;) {
            int p1 = t0 + test_rng_int(rng, 1, 12);
            int th1 = p1 + test_rng_int(rng, 0, 20);
            int a1 = th1 + test_rng_int(rng, 1, 12);
            causal_span(lo, hi, t0, p1, d1, d1);
            if (kind == STRIP_THINKING) {
                causal_span(lo, hi, p1, th1, d1, a1);  // later turns do not see this thinking
                causal_span(lo, hi, th1, a1, d1, d1);
                t0 = a1;
            } else {
                int b1 = a1 + (a1 - th1);  // aB repeats aA; past the document end it is the last turn
                bool last = b1 > d1;
                causal_span(lo, hi, p1, th1, d1, a1);
                causal_span(lo, hi, th1, a1, d1, last ? d1 : a1);
                causal_span(lo, hi, a1, b1, d1, d1);
                t0 = last ? d1 : b1;
            }
        }
    }
}

// SINK_LOCAL: keys [0, SINK_KEYS) visible to every later query, key k to queries
// [k, k + LOCAL_KEYS): a query tile's line lists the first tiles, then after a gap of
// many tiles its own (the walks' windows of 32 tiles far from tile 0).
constexpr int SINK_KEYS = 100, LOCAL_KEYS = 300;

// LONG_DOCS_SINK: causal documents of 1 to 2048 keys packed back to back, the last one of
// LONG_LAST_DOC keys, and the first SINK_KEYS keys visible to every later query of the
// row: a long row that stays sparse (the CPU oracle keeps up), whose first keys' dK sum
// over every query and whose last document's dQ rows over thousands of keys.
constexpr int LONG_LAST_DOC = 4096;

// One row's lo/hi [S]: documents packed back to back, then padding (lo = hi).
void fill_row(MaskKind kind, int S, TestRng *rng, int32_t *lo, int32_t *hi) {
    if (kind == LONG_DOCS_SINK) {
        const int last = S > 2 * LONG_LAST_DOC ? S - LONG_LAST_DOC : S / 2;
        for (int d0 = 0; d0 < last;) {
            int d1 = d0 + test_rng_int(rng, 1, 2048);
            if (d1 > last) d1 = last;
            causal_span(lo, hi, d0, d1, d1, d1);
            d0 = d1;
        }
        causal_span(lo, hi, last, S, S, S);
        for (int k = 0; k < SINK_KEYS && k < last; k++) hi[k] = S;
        return;
    }
    if (kind == SINK_LOCAL) {  // every query sees the first keys and its last ones
        for (int k = 0; k < S; k++) {
            lo[k] = k;
            hi[k] = k < SINK_KEYS ? S : (k + LOCAL_KEYS < S ? k + LOCAL_KEYS : S);
        }
        return;
    }
    if (kind == RANDOM_INTERVALS) {  // arbitrary intervals; queries 0..3 see nothing
        for (int k = 0; k < S; k++) {
            lo[k] = test_rng_int(rng, 4, S);
            hi[k] = test_rng_int(rng, 0, 7) == 0 ? lo[k] : test_rng_int(rng, lo[k], S);
        }
        return;
    }
    const int end = kind == CAUSAL ? S : S - test_rng_int(rng, 1, S / 8);
    for (int k = end; k < S; k++) lo[k] = hi[k] = k;
    for (int d0 = 0; d0 < end;) {
        int d1 = kind == CAUSAL ? end : d0 + test_rng_int(rng, 8, S / 2);
        if (d1 > end) d1 = end;
        fill_doc(kind, d0, d1, rng, lo, hi);
        d0 = d1;
    }
}

struct Case {
    int batch, seq_len, n_heads, n_kv_heads, head_dim;
    MaskKind rows[2];     // per batch row
    float key_growth = 0;  // key k scaled by 1 + key_growth * k: row maxima that keep growing
};

template <typename T>
T *host_alloc(size_t n) {
    return static_cast<T *>(xmalloc(n * sizeof(T)));
}
template <typename T>
T *device_alloc(size_t n) {
    T *p;
    cudaCheck(cudaMalloc(&p, n * sizeof(T)));
    return p;
}

// Random values in [-amp, amp), rounded to bf16: x keeps the rounded floats for the oracle.
std::vector<attn_bf16> random_bf16(TestRng *rng, size_t n, float amp, std::vector<float> *x) {
    std::vector<attn_bf16> h(n);
    x->resize(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = __float2bfloat16(amp * test_rng_uniform(rng));
        (*x)[i] = __bfloat162float(h[i]);
    }
    return h;
}

attn_bf16 *upload(const std::vector<attn_bf16> &h) {
    attn_bf16 *d = device_alloc<attn_bf16>(h.size());
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(attn_bf16), cudaMemcpyHostToDevice));
    return d;
}

std::vector<float> download_bf16(const attn_bf16 *d, size_t n) {
    std::vector<attn_bf16> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(attn_bf16), cudaMemcpyDeviceToHost));
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = __bfloat162float(h[i]);
    return x;
}

template <typename T>
std::vector<T> download(const T *d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

std::vector<uint16_t> download_bits(const attn_bf16 *d, size_t n) {
    return download(reinterpret_cast<const uint16_t *>(d), n);
}

// ||x - ref|| / ||ref||; NaN if x has a NaN.
double rel_err(const std::vector<float> &x, const float *ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); i++) {
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

bool has_nan(const std::vector<float> &x) {
    for (float f : x)
        if (isnan(f)) return true;
    return false;
}

// Compares one orientation of a device-built mask with the CPU one: counts and the valid
// entries of each list (entries past a list's count are unspecified).
bool same_lists(const TileLists &cpu, const TileLists &gpu, int n_rows) {
    if (cpu.n_lines != gpu.n_lines || cpu.line_len != gpu.line_len) return false;
    const size_t lines = (size_t)n_rows * cpu.n_lines, len = cpu.line_len;
    const int32_t *counts_cpu[2] = {cpu.partial_count, cpu.full_count};
    const int32_t *counts_gpu[2] = {gpu.partial_count, gpu.full_count};
    const int32_t *idx_cpu[2] = {cpu.partial_idx, cpu.full_idx};
    const int32_t *idx_gpu[2] = {gpu.partial_idx, gpu.full_idx};
    for (int a = 0; a < 2; a++) {
        std::vector<int32_t> counts(lines), idx(lines * len);
        cudaCheck(cudaMemcpy(counts.data(), counts_gpu[a], lines * 4, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(idx.data(), idx_gpu[a], lines * len * 4, cudaMemcpyDeviceToHost));
        for (size_t line = 0; line < lines; line++) {
            if (counts[line] != counts_cpu[a][line]) return false;
            for (int i = 0; i < counts[line]; i++)
                if (idx[line * len + i] != idx_cpu[a][line * len + i]) return false;
        }
    }
    return true;
}

bool same_tile_mask(const AttnMask *cpu, const AttnMask *gpu) {
    return cpu->n_rows == gpu->n_rows && same_lists(cpu->by_query, gpu->by_query, cpu->n_rows) &&
           same_lists(cpu->by_key, gpu->by_key, cpu->n_rows);
}

// A case's interval mask: lo/hi [B, S] of the rows' layouts on the host and the device,
// the tile lists attn_mask_build makes of them, and those lists uploaded over the device
// intervals.
struct TestMask {
    int32_t *lo, *hi, *d_lo, *d_hi;
    AttnMask host, device;
};

TestMask make_test_mask(const MaskKind *rows, int B, int S, TestRng *rng) {
    const size_t n = (size_t)B * S;
    TestMask m;
    m.lo = host_alloc<int32_t>(n);
    m.hi = host_alloc<int32_t>(n);
    for (int b = 0; b < B; b++) fill_row(rows[b], S, rng, m.lo + (size_t)b * S, m.hi + (size_t)b * S);
    attn_mask_build(m.lo, m.hi, B, S, ATTN_TILE, ATTN_TILE, &m.host);
    m.d_lo = device_alloc<int32_t>(n);
    m.d_hi = device_alloc<int32_t>(n);
    cudaCheck(cudaMemcpy(m.d_lo, m.lo, n * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(m.d_hi, m.hi, n * 4, cudaMemcpyHostToDevice));
    m.device = attn_mask_upload(&m.host, m.d_lo, m.d_hi);
    return m;
}

void free_test_mask(TestMask *m) {
    attn_mask_free_device(&m->device);
    attn_mask_free(&m->host);
    cudaCheck(cudaFree(m->d_lo));
    cudaCheck(cudaFree(m->d_hi));
    free(m->lo);
    free(m->hi);
}

void run_case(const Case &c, TestRng *rng, int deterministic_runs) {
    const int B = c.batch, S = c.seq_len, H = c.n_heads, KVH = c.n_kv_heads, D = c.head_dim;
    const AttnShape shape = {B, S, H, KVH, D, 1.0f / sqrtf((float)D)};
    const size_t n_q = (size_t)B * S * H * D, n_kv = (size_t)B * S * KVH * D, n_lse = (size_t)B * H * S;
    printf("case B=%d S=%d H=%d KV=%d D=%d masks %s, %s key growth %g\n", B, S, H, KVH, D, MASK_NAMES[c.rows[0]],
           MASK_NAMES[c.rows[B > 1 ? 1 : 0]], c.key_growth);

    TestMask tm = make_test_mask(c.rows, B, S, rng);
    const AttnMask &host_mask = tm.host;
    AttnMask &mask = tm.device, gpu_built;
    attn_mask_build_cuda(tm.d_lo, tm.d_hi, B, S, ATTN_TILE, ATTN_TILE, &gpu_built, 0);
    cudaCheck(cudaDeviceSynchronize());
    EXPECT(same_tile_mask(&host_mask, &gpu_built), "GPU-built mask differs from attn_mask_build");

    std::vector<float> q, k, v, dout;
    attn_bf16 *d_q = upload(random_bf16(rng, n_q, 3.0f, &q));
    std::vector<attn_bf16> k_bf16 = random_bf16(rng, n_kv, 1.0f, &k);
    for (size_t i = 0; i < n_kv; i++) {
        const int key = (int)(i / ((size_t)KVH * D) % S);
        k_bf16[i] = __float2bfloat16(k[i] * (1.0f + c.key_growth * key));
        k[i] = __bfloat162float(k_bf16[i]);
    }
    attn_bf16 *d_k = upload(k_bf16);
    attn_bf16 *d_v = upload(random_bf16(rng, n_kv, 1.0f, &v));
    attn_bf16 *d_dout = upload(random_bf16(rng, n_q, 1.0f, &dout));
    attn_bf16 *d_out = device_alloc<attn_bf16>(n_q), *d_dq = device_alloc<attn_bf16>(n_q);
    attn_bf16 *d_dk = device_alloc<attn_bf16>(n_kv), *d_dv = device_alloc<attn_bf16>(n_kv);
    float *d_lse = device_alloc<float>(n_lse);
    // Backward workspaces of exactly the reported sizes (memcheck sees any overrun).
    void *d_ws[2] = {device_alloc<char>(attention_backward_workspace_bytes(&shape, false)),
                     device_alloc<char>(attention_backward_workspace_bytes(&shape, true))};

    float *out_ref = host_alloc<float>(n_q), *lse_ref = host_alloc<float>(n_lse);
    float *dq_ref = host_alloc<float>(n_q), *dk_ref = host_alloc<float>(n_kv), *dv_ref = host_alloc<float>(n_kv);
    attention_forward_cpu(&shape, &host_mask, q.data(), k.data(), v.data(), out_ref, lse_ref);
    attention_backward_cpu(&shape, &host_mask, q.data(), k.data(), v.data(), out_ref, lse_ref,
                           dout.data(), dq_ref, dk_ref, dv_ref);

    // Forward; outputs poisoned with NaN so unwritten elements fail.
    cudaCheck(cudaMemset(d_out, 0xff, n_q * 2));
    cudaCheck(cudaMemset(d_lse, 0xff, n_lse * 4));
    attention_forward_cuda(&shape, &mask, d_q, d_k, d_v, d_out, d_lse, 0);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> out = download_bf16(d_out, n_q), lse(n_lse);
    cudaCheck(cudaMemcpy(lse.data(), d_lse, n_lse * 4, cudaMemcpyDeviceToHost));
    double e_out = rel_err(out, out_ref);
    EXPECT(!has_nan(out) && e_out <= 1e-2, "O rel err %.3g", e_out);
    int lse_bad = 0, n_blind = 0, blind_nonzero = 0;
    for (size_t i = 0; i < n_lse; i++) {
        if (isinf(lse_ref[i])) {
            lse_bad += !(isinf(lse[i]) && lse[i] < 0);
        } else {
            lse_bad += !(fabsf(lse[i] - lse_ref[i]) <= 1e-2f * fmaxf(1.0f, fabsf(lse_ref[i])));
        }
    }
    EXPECT(lse_bad == 0, "%d LSE values differ", lse_bad);
    // Queries that see no key: output exactly 0 (lse index (b, h, q); out (b, q, h, d)).
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int qi = 0; qi < S; qi++) {
                if (!isinf(lse_ref[((size_t)b * H + h) * S + qi])) continue;
                n_blind++;
                for (int d = 0; d < D; d++)
                    blind_nonzero += out[(((size_t)b * S + qi) * H + h) * D + d] != 0.0f;
            }
    EXPECT(blind_nonzero == 0, "%d output values of fully masked queries are not 0", blind_nonzero);

    // Backward, both modes, against the oracle (which used its own fp32 O and LSE).
    for (int deterministic = 0; deterministic < 2; deterministic++) {
        cudaCheck(cudaMemset(d_dq, 0xff, n_q * 2));
        cudaCheck(cudaMemset(d_dk, 0xff, n_kv * 2));
        cudaCheck(cudaMemset(d_dv, 0xff, n_kv * 2));
        // The workspace is scratch: poisoned, so a kernel that relies on its contents fails.
        cudaCheck(cudaMemset(d_ws[deterministic], 0xff, attention_backward_workspace_bytes(&shape, deterministic)));
        attention_backward_cuda(&shape, &mask, d_q, d_k, d_v, d_out, d_lse, d_dout, d_dq,
                                d_dk, d_dv, deterministic, d_ws[deterministic], 0);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> dq = download_bf16(d_dq, n_q), dk = download_bf16(d_dk, n_kv),
                           dv = download_bf16(d_dv, n_kv);
        double e_dq = rel_err(dq, dq_ref), e_dk = rel_err(dk, dk_ref), e_dv = rel_err(dv, dv_ref);
        printf("  %s: rel err O %.2e  dQ %.2e  dK %.2e  dV %.2e  (%d fully masked query rows)\n",
               deterministic ? "deterministic" : "atomic dQ", e_out, e_dq, e_dk, e_dv, n_blind);
        EXPECT(!has_nan(dq) && e_dq <= 1e-2, "dQ rel err %.3g (deterministic %d)", e_dq, deterministic);
        EXPECT(!has_nan(dk) && e_dk <= 1e-2, "dK rel err %.3g (deterministic %d)", e_dk, deterministic);
        EXPECT(!has_nan(dv) && e_dv <= 1e-2, "dV rel err %.3g (deterministic %d)", e_dv, deterministic);
        int blind_grad = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int qi = 0; qi < S; qi++)
                    if (isinf(lse_ref[((size_t)b * H + h) * S + qi]))
                        for (int d = 0; d < D; d++)
                            blind_grad += dq[(((size_t)b * S + qi) * H + h) * D + d] != 0.0f;
        EXPECT(blind_grad == 0, "%d dQ values of fully masked queries are not 0", blind_grad);
    }

    // Deterministic mode: bitwise-identical gradients run after run (the last run above
    // was deterministic and is the reference).
    std::vector<uint16_t> dq0 = download_bits(d_dq, n_q), dk0 = download_bits(d_dk, n_kv),
                          dv0 = download_bits(d_dv, n_kv);
    int differing_runs = 0;
    for (int run = 0; run < deterministic_runs; run++) {
        attention_backward_cuda(&shape, &mask, d_q, d_k, d_v, d_out, d_lse, d_dout, d_dq,
                                d_dk, d_dv, true, d_ws[1], 0);
        cudaCheck(cudaDeviceSynchronize());
        differing_runs += download_bits(d_dq, n_q) != dq0 || download_bits(d_dk, n_kv) != dk0 ||
                          download_bits(d_dv, n_kv) != dv0;
    }
    EXPECT(differing_runs == 0, "%d of %d deterministic runs differ bitwise", differing_runs,
          deterministic_runs);

    // The kernels follow the tile lists, not lo/hi: with every list emptied, nothing is
    // visited, so O, dQ, dK, dV are 0 although lo/hi make keys visible.
    cudaCheck(cudaMemset(mask.by_query.partial_count, 0, (size_t)B * mask.by_query.n_lines * 4));
    cudaCheck(cudaMemset(mask.by_query.full_count, 0, (size_t)B * mask.by_query.n_lines * 4));
    cudaCheck(cudaMemset(mask.by_key.partial_count, 0, (size_t)B * mask.by_key.n_lines * 4));
    cudaCheck(cudaMemset(mask.by_key.full_count, 0, (size_t)B * mask.by_key.n_lines * 4));
    attention_forward_cuda(&shape, &mask, d_q, d_k, d_v, d_out, d_lse, 0);
    attention_backward_cuda(&shape, &mask, d_q, d_k, d_v, d_out, d_lse, d_dout, d_dq,
                            d_dk, d_dv, false, d_ws[0], 0);
    cudaCheck(cudaDeviceSynchronize());
    int nonzero = 0;
    for (const std::vector<float> &x : {download_bf16(d_out, n_q), download_bf16(d_dq, n_q),
                                        download_bf16(d_dk, n_kv), download_bf16(d_dv, n_kv)})
        for (float f : x) nonzero += f != 0.0f;
    EXPECT(nonzero == 0, "%d nonzero outputs with empty tile lists", nonzero);

    free_test_mask(&tm);
    attn_mask_free_device(&gpu_built);
    for (void *p : {(void *)d_q, (void *)d_k, (void *)d_v, (void *)d_dout, (void *)d_out, (void *)d_dq,
                    (void *)d_dk, (void *)d_dv, (void *)d_lse, d_ws[0], d_ws[1]})
        cudaCheck(cudaFree(p));
    for (void *p : {(void *)out_ref, (void *)lse_ref, (void *)dq_ref, (void *)dk_ref, (void *)dv_ref}) free(p);
}

// Heads [h0, h0 + n) of x [rows, H, D] (device) as a new [rows, n, D] tensor.
attn_bf16 *slice_heads(const attn_bf16 *x, size_t rows, int H, int h0, int n, int D) {
    attn_bf16 *y = device_alloc<attn_bf16>(rows * n * D);
    const size_t sz = sizeof(attn_bf16);
    cudaCheck(cudaMemcpy2D(y, n * D * sz, x + (size_t)h0 * D, H * D * sz, n * D * sz, rows, cudaMemcpyDeviceToDevice));
    return y;
}

// Elements of heads [h0, h0 + n) of full [rows, H, D] that differ from part [rows, n, D].
template <typename T>
int slice_mismatches(const std::vector<T> &full, const std::vector<T> &part, size_t rows, int H, int h0, int n,
                     int D) {
    int bad = 0;
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < n * D; i++) bad += full[(r * H + h0) * D + i] != part[(r * n) * D + i];
    return bad;
}

// Outputs of one forward and both backwards of a problem: bit patterns, and fast mode's
// dQ as floats (its fp32 reductions run in no fixed order).
struct AttnRun {
    std::vector<uint16_t> out, dq_det, dk_det, dv_det, dk_fast, dv_fast;
    std::vector<float> lse, dq_fast;
};

AttnRun run_all(const AttnShape &shape, const AttnMask &mask, const attn_bf16 *q, const attn_bf16 *k,
                const attn_bf16 *v, const attn_bf16 *dout) {
    const size_t n_q = (size_t)shape.batch * shape.seq_len * shape.n_heads * shape.head_dim;
    const size_t n_kv = (size_t)shape.batch * shape.seq_len * shape.n_kv_heads * shape.head_dim;
    const size_t n_lse = (size_t)shape.batch * shape.n_heads * shape.seq_len;
    attn_bf16 *out = device_alloc<attn_bf16>(n_q), *dq = device_alloc<attn_bf16>(n_q);
    attn_bf16 *dk = device_alloc<attn_bf16>(n_kv), *dv = device_alloc<attn_bf16>(n_kv);
    float *lse = device_alloc<float>(n_lse);
    AttnRun r;
    cudaCheck(cudaMemset(out, 0xff, n_q * 2));
    attention_forward_cuda(&shape, &mask, q, k, v, out, lse, 0);
    r.out = download_bits(out, n_q);
    r.lse = download(lse, n_lse);
    for (int det = 0; det < 2; det++) {
        const size_t ws_bytes = attention_backward_workspace_bytes(&shape, det);
        void *ws = device_alloc<char>(ws_bytes);
        cudaCheck(cudaMemset(ws, 0xff, ws_bytes));  // scratch: poisoned
        cudaCheck(cudaMemset(dq, 0xff, n_q * 2));
        cudaCheck(cudaMemset(dk, 0xff, n_kv * 2));
        cudaCheck(cudaMemset(dv, 0xff, n_kv * 2));
        attention_backward_cuda(&shape, &mask, q, k, v, out, lse, dout, dq, dk, dv, det, ws, 0);
        cudaCheck(cudaDeviceSynchronize());
        if (det) r.dq_det = download_bits(dq, n_q);
        else r.dq_fast = download_bf16(dq, n_q);
        (det ? r.dk_det : r.dk_fast) = download_bits(dk, n_kv);
        (det ? r.dv_det : r.dv_fast) = download_bits(dv, n_kv);
        cudaCheck(cudaFree(ws));
    }
    for (void *p : {(void *)out, (void *)dq, (void *)dk, (void *)dv, (void *)lse}) cudaCheck(cudaFree(p));
    return r;
}

// Enough heads' bytes for several L2 sections in every kernel (the kernels' schedulers,
// l2_item; a short last section, sections across batch rows): each KV group run alone (one
// section) gives the same O, LSE, dK, dV and deterministic dQ bit for bit, and fast dQ up
// to its rounding, so every block ran once, with the right head and tiles.
void run_sections_case(const Case &c, TestRng *rng) {
    const int B = c.batch, S = c.seq_len, H = c.n_heads, KVH = c.n_kv_heads, D = c.head_dim, G = H / KVH;
    const AttnShape shape = {B, S, H, KVH, D, 1.0f / sqrtf((float)D)};
    const size_t rows = (size_t)B * S;
    printf("sections case B=%d S=%d H=%d KV=%d D=%d masks %s, %s\n", B, S, H, KVH, D, MASK_NAMES[c.rows[0]],
           MASK_NAMES[c.rows[B > 1 ? 1 : 0]]);
    TestMask tm = make_test_mask(c.rows, B, S, rng);
    const AttnMask &mask = tm.device;
    std::vector<float> unused;
    attn_bf16 *q = upload(random_bf16(rng, rows * H * D, 3.0f, &unused));
    attn_bf16 *k = upload(random_bf16(rng, rows * KVH * D, 1.0f, &unused));
    attn_bf16 *v = upload(random_bf16(rng, rows * KVH * D, 1.0f, &unused));
    attn_bf16 *dout = upload(random_bf16(rng, rows * H * D, 1.0f, &unused));
    const AttnRun all = run_all(shape, mask, q, k, v, dout);

    const AttnShape unit_shape = {B, S, G, 1, D, shape.scale};
    int bad_out = 0, bad_lse = 0, bad_det = 0, bad_dkv = 0;
    double worst_dq = 0;
    for (int u = 0; u < KVH; u++) {
        attn_bf16 *uq = slice_heads(q, rows, H, u * G, G, D), *udout = slice_heads(dout, rows, H, u * G, G, D);
        attn_bf16 *uk = slice_heads(k, rows, KVH, u, 1, D), *uv = slice_heads(v, rows, KVH, u, 1, D);
        const AttnRun one = run_all(unit_shape, mask, uq, uk, uv, udout);
        bad_out += slice_mismatches(all.out, one.out, rows, H, u * G, G, D);
        bad_lse += slice_mismatches(all.lse, one.lse, B, H, u * G, G, S);  // lse [B, H, S]: rows B, "D" = S
        bad_det += slice_mismatches(all.dq_det, one.dq_det, rows, H, u * G, G, D) +
                   slice_mismatches(all.dk_det, one.dk_det, rows, KVH, u, 1, D) +
                   slice_mismatches(all.dv_det, one.dv_det, rows, KVH, u, 1, D);
        bad_dkv += slice_mismatches(all.dk_fast, one.dk_fast, rows, KVH, u, 1, D) +
                   slice_mismatches(all.dv_fast, one.dv_fast, rows, KVH, u, 1, D);
        std::vector<float> dq_all(rows * G * D);
        for (size_t r = 0; r < rows; r++)
            memcpy(&dq_all[r * G * D], &all.dq_fast[(r * H + u * G) * D], G * D * sizeof(float));
        const double e = rel_err(dq_all, one.dq_fast.data());
        worst_dq = e > worst_dq || isnan(e) ? e : worst_dq;
        for (void *p : {(void *)uq, (void *)udout, (void *)uk, (void *)uv}) cudaCheck(cudaFree(p));
    }
    printf("  per KV group alone: O %d, LSE %d, deterministic dQ/dK/dV %d, fast dK/dV %d elements differ; "
           "fast dQ rel diff %.2e\n", bad_out, bad_lse, bad_det, bad_dkv, worst_dq);
    EXPECT(bad_out == 0 && bad_lse == 0, "sections: O %d, LSE %d elements differ from one group alone", bad_out,
           bad_lse);
    EXPECT(bad_det == 0, "sections: %d deterministic gradient elements differ from one group alone", bad_det);
    EXPECT(bad_dkv == 0, "sections: %d fast-mode dK/dV elements differ from one group alone", bad_dkv);
    EXPECT(!isnan(worst_dq) && worst_dq <= 5e-3, "sections: fast dQ rel diff %.3g from one group alone", worst_dq);

    free_test_mask(&tm);
    for (void *p : {(void *)q, (void *)k, (void *)v, (void *)dout}) cudaCheck(cudaFree(p));
}

// A problem whose forward ran once on clean inputs (K, V, O and lse on the device), for
// backward_dq: the backward with the Q and dO given (copies with a NaN, or scaled), dq
// back as floats.
struct NanProblem {
    AttnShape shape;
    const AttnMask *mask;
    std::vector<attn_bf16> q, dout;  // clean
    attn_bf16 *k, *v, *out;
    float *lse;
};

// k: K for the backward (nullptr: the problem's clean K).
std::vector<float> backward_dq(const NanProblem &pr, bool det, const std::vector<attn_bf16> &q,
                               const std::vector<attn_bf16> &dout, const attn_bf16 *k = nullptr) {
    const AttnShape &s = pr.shape;
    const size_t n_q = q.size(), n_kv = (size_t)s.batch * s.seq_len * s.n_kv_heads * s.head_dim;
    attn_bf16 *d_q = upload(q), *d_dout = upload(dout), *d_dq = device_alloc<attn_bf16>(n_q);
    cudaCheck(cudaMemset(d_dq, 0, n_q * sizeof(attn_bf16)));  // not NaN: an unwritten row fails the NaN checks
    attn_bf16 *d_dk = device_alloc<attn_bf16>(n_kv), *d_dv = device_alloc<attn_bf16>(n_kv);
    const size_t ws_bytes = attention_backward_workspace_bytes(&s, det);
    void *ws = device_alloc<char>(ws_bytes);
    cudaCheck(cudaMemset(ws, 0xff, ws_bytes));
    attention_backward_cuda(&s, pr.mask, d_q, k ? k : pr.k, pr.v, pr.out, pr.lse, d_dout, d_dq, d_dk, d_dv, det, ws,
                            0);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> dq = download_bf16(d_dq, n_q);
    for (void *p : {(void *)d_q, (void *)d_dout, (void *)d_dq, (void *)d_dk, (void *)d_dv, ws}) cudaCheck(cudaFree(p));
    return dq;
}

// A NaN in one query's dO or Q makes that query's dq row NaN in both modes (every key's dS
// is NaN) and, in deterministic mode, leaves every other dq element bitwise as with clean
// inputs (nothing else reads that row). A NaN in one key's K makes the dq rows of the
// queries that see it NaN and, in deterministic mode, leaves the other KV head's rows and
// the rows before the key's 128-key block bitwise as they were (the fixed-point bound
// takes finite keys only; the block's dQ product multiplies the NaN by the zero dS of the
// queries that do not see it, so rows between the block's start and the key may come out
// NaN). dO scaled by 2^70 (gradients far from 1, exact in fp32) scales deterministic dq by
// 2^70 exactly.
void run_nan_case(int D, TestRng *rng) {
    const int B = 1, S = 200, H = 4, KVH = 2, POISON_ROW = 150;
    NanProblem pr;
    pr.shape = {B, S, H, KVH, D, 1.0f / sqrtf((float)D)};
    printf("NaN and range case B=%d S=%d H=%d KV=%d D=%d causal\n", B, S, H, KVH, D);
    const MaskKind causal = CAUSAL;
    TestMask tm = make_test_mask(&causal, B, S, rng);
    pr.mask = &tm.device;
    const size_t n_q = (size_t)B * S * H * D, n_kv = (size_t)B * S * KVH * D;
    std::vector<float> unused;
    pr.q = random_bf16(rng, n_q, 3.0f, &unused);
    const std::vector<attn_bf16> k_clean = random_bf16(rng, n_kv, 1.0f, &unused);
    pr.k = upload(k_clean);
    pr.v = upload(random_bf16(rng, n_kv, 1.0f, &unused));
    pr.dout = random_bf16(rng, n_q, 1.0f, &unused);
    attn_bf16 *clean_q = upload(pr.q);
    pr.out = device_alloc<attn_bf16>(n_q);
    pr.lse = device_alloc<float>((size_t)B * H * S);
    attention_forward_cuda(&pr.shape, pr.mask, clean_q, pr.k, pr.v, pr.out, pr.lse, 0);
    cudaCheck(cudaFree(clean_q));
    const std::vector<float> clean = backward_dq(pr, true, pr.q, pr.dout);
    auto at = [&](int row, int head, int col) { return ((size_t)row * H + head) * D + col; };  // B = 1
    const uint16_t NAN_BF16 = 0x7fc0;
    // what: 0 dO, 1 Q (row POISON_ROW of head 1 / 2), 2 K (key POISON_KEY of KV head 1, seen
    // by query heads 2 and 3 from that row on; its block of two key tiles starts at 128).
    const int POISON_KEY = 150, KEY_BLOCK = 2 * ATTN_TILE;
    for (int what_i = 0; what_i < 3; what_i++) {
        const int head = what_i == 0 ? 1 : 2;
        std::vector<attn_bf16> q = pr.q, dout = pr.dout;
        attn_bf16 *d_k = nullptr;  // the clean K unless K is poisoned
        if (what_i < 2) {
            reinterpret_cast<uint16_t *>(what_i == 1 ? q.data() : dout.data())[at(POISON_ROW, head, 3)] = NAN_BF16;
        } else {
            std::vector<attn_bf16> k = k_clean;
            reinterpret_cast<uint16_t *>(k.data())[((size_t)POISON_KEY * KVH + 1) * D + 3] = NAN_BF16;
            d_k = upload(k);
        }
        const std::vector<float> det = backward_dq(pr, true, q, dout, d_k), fast = backward_dq(pr, false, q, dout, d_k);
        if (d_k) cudaCheck(cudaFree(d_k));
        // The dq rows that must be NaN: the poisoned query's, or every one that sees the key;
        // and those left unchecked: the key's block's rows before it.
        auto poisoned = [&](int r, int h) {
            return what_i < 2 ? h == head && r == POISON_ROW : h / (H / KVH) == 1 && r >= POISON_KEY;
        };
        auto unchecked = [&](int r, int h) {
            return what_i == 2 && h / (H / KVH) == 1 && r >= POISON_KEY / KEY_BLOCK * KEY_BLOCK && r < POISON_KEY;
        };
        int row_not_nan = 0, other_differ = 0, fast_row_not_nan = 0;
        for (int r = 0; r < S; r++)
            for (int h = 0; h < H; h++)
                for (int c = 0; c < D; c++) {
                    const float x = det[at(r, h, c)];
                    if (unchecked(r, h)) continue;
                    if (poisoned(r, h)) {
                        row_not_nan += !isnan(x);
                        fast_row_not_nan += !isnan(fast[at(r, h, c)]);
                    } else {
                        other_differ += memcmp(&x, &clean[at(r, h, c)], sizeof x) != 0;
                    }
                }
        const char *what = what_i == 0 ? "dO" : what_i == 1 ? "Q" : "K";
        printf("  NaN in %s: poisoned dq elements not NaN: deterministic %d, fast %d; other deterministic dq elements "
               "changed: %d\n", what, row_not_nan, fast_row_not_nan, other_differ);
        EXPECT(row_not_nan == 0 && fast_row_not_nan == 0, "NaN in %s: %d deterministic, %d fast dq elements not NaN",
               what, row_not_nan, fast_row_not_nan);
        EXPECT(other_differ == 0, "NaN in %s: %d other deterministic dq elements changed", what, other_differ);
    }
    const float BIG = 0x1p70f;
    std::vector<attn_bf16> big = pr.dout;
    for (attn_bf16 &x : big) x = __float2bfloat16(__bfloat162float(x) * BIG);
    const std::vector<float> scaled = backward_dq(pr, true, pr.q, big);
    int not_scaled = 0;
    for (size_t i = 0; i < n_q; i++) not_scaled += !(scaled[i] == clean[i] * BIG);
    printf("  dO x 2^70: %d deterministic dq elements not exactly 2^70 x the clean ones\n", not_scaled);
    EXPECT(not_scaled == 0, "dO x 2^70: %d deterministic dq elements not exactly scaled", not_scaled);
    free_test_mask(&tm);
    for (void *p : {(void *)pr.k, (void *)pr.v, (void *)pr.out, (void *)pr.lse}) cudaCheck(cudaFree(p));
}

}  // namespace

int main(void) {
    SKIP_WITHOUT_CUDA_DEVICE();
    TestRng rng = test_rng_from_env();
    const bool quick = getenv("ATTN_TEST_QUICK") != NULL;
    const Case cases[] = {
        {2, 200, 4, 2, 64, {CAUSAL, RANDOM_INTERVALS}},
        {2, 333, 4, 1, 128, {DOCS, STRIP_THINKING}},
        {1, 257, 2, 2, 128, {SHARED_PREFIX}},
        {2, 190, 6, 3, 64, {DUPLICATE, RANDOM_INTERVALS}},
        {1, 320, 2, 1, 128, {CAUSAL}},
        {2, 129, 2, 2, 64, {STRIP_THINKING, SHARED_PREFIX}},
        {1, 500, 4, 4, 128, {DUPLICATE}},
        // bench_attention's GQA shapes (the small trainer model, a Llama-3-like one)
        {2, 300, 12, 4, 64, {STRIP_THINKING, SHARED_PREFIX}},
        {2, 222, 32, 8, 128, {CAUSAL, DOCS}},
        // Scores that grow along the keys: the forward's rescaled steps, and a maximum that
        // ends over 2^7 above the first step's (exponentials against it would overflow).
        {1, 520, 2, 1, 128, {CAUSAL}, 0.08f},
        {2, 300, 4, 2, 64, {STRIP_THINKING, DOCS}, 0.02f},
        // Lines of more than 32 tiles, in windows away from tile 0, and gaps wider than a
        // window: the producers' walks (WarpWalk) past their first window.
        {1, 2200, 2, 1, 128, {CAUSAL}},
        {2, 4500, 2, 2, 64, {SINK_LOCAL, RANDOM_INTERVALS}},
    };
    const int n_cases = quick ? 2 : (int)(sizeof(cases) / sizeof(cases[0]));
    for (int i = 0; i < n_cases; i++) run_case(cases[i], &rng, quick ? 2 : 10);
    // Several L2 sections per kernel (bytes per head and section: bwd_l2_heads,
    // l2_section_heads): dK/dV 2 heads (a short last one), the forward 4 KV heads (case 1);
    // GQA (case 2); D = 64 (case 3).
    const Case sections[] = {
        {2, 16001, 9, 9, 128, {CAUSAL, STRIP_THINKING}},
        {1, 16384, 18, 9, 128, {SHARED_PREFIX}},
        {1, 16384, 24, 8, 64, {CAUSAL}},
    };
    if (!quick)
        for (const Case &c : sections) run_sections_case(c, &rng);
    // Rows of 131072 keys (the long-context trainings' seq_len): query and key tiles to
    // 2047, tile lists of 2048 x 2048 per orientation, the deterministic dQ's fixed point
    // over a row's 2048 key tiles, lse and workspace rows of 131072 per head.
    const Case long_rows[] = {
        {1, 131072, 2, 1, 128, {LONG_DOCS_SINK}},
        {1, 131072, 4, 2, 64, {SINK_LOCAL}},
    };
    if (!quick)
        for (const Case &c : long_rows) run_case(c, &rng, 2);
    for (int d : {64, 128}) run_nan_case(d, &rng);
    return test_finish();
}
