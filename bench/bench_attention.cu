// Benchmark (not a test) of the CUDA block-sparse attention: B=1, H=16, D=128, bf16,
// S in {4096, 16384} (or the sizes given as arguments), masks causal, shared_prefix and
// strip_thinking defined exactly as tags()/mask_mod_for() in
// shared/anchors/anchor_attention.py, translated to one visible interval per key and
// checked pair by pair against the predicate. CUDA events, warm-up, median of 30 runs.
// Useful TFLOP/s count visible pairs only: 4*S^2*D*H*density forward, 3.5x fwd+bwd.
// Also times the tile metadata: CPU attn_mask_build + upload against the GPU builder.
#include "attention/attention_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>
#include "common/cuda_check.h"

namespace {

constexpr int H = 16, D = 128, WARMUP = 5, REPS = 30;
const char *const MASKS[] = {"causal", "shared_prefix", "strip_thinking"};

// anchor_attention.py's mask_mod_for(kind): is key k visible to query q?
struct Tags {
    std::vector<int32_t> seg, turn, role;  // [S]; role 0 user 1 think 2 answer
};

Tags make_tags(int kind, int S) {
    Tags t{std::vector<int32_t>(S, 0), std::vector<int32_t>(S, 0), std::vector<int32_t>(S, 0)};
    if (kind == 1) {
        int p = S / 4, s = (S - p) / 4;
        for (int i = 0; i < 4; i++)
            for (int x = p + i * s; x < p + (i + 1) * s; x++) t.seg[x] = i + 1;
    } else if (kind == 2) {
        int tl = S / 4;
        for (int turn = 0; turn < 4; turn++) {
            int b = turn * tl;
            for (int x = b; x < b + tl; x++) t.turn[x] = turn;
            for (int x = b + tl / 8; x < b + tl / 8 + 5 * tl / 8; x++) t.role[x] = 1;
            for (int x = b + 6 * tl / 8; x < b + tl; x++) t.role[x] = 2;
        }
    }
    return t;
}

bool visible(int kind, const Tags &t, int q, int k) {
    if (q < k) return false;
    if (kind == 1) return t.seg[k] == 0 || t.seg[k] == t.seg[q];
    if (kind == 2) return !(t.role[k] == 1 && t.turn[k] < t.turn[q]);
    return true;
}

// lo[k] = k, hi[k] = first query past k that does not see k; then every pair is
// checked, so a mask that is not one interval per key fails loudly.
void mask_intervals(int kind, int S, int32_t *lo, int32_t *hi) {
    Tags t = make_tags(kind, S);
    for (int k = 0; k < S; k++) {
        lo[k] = k;
        hi[k] = S;
        for (int q = k; q < S; q++)
            if (!visible(kind, t, q, k)) {
                hi[k] = q;
                break;
            }
        for (int q = 0; q < S; q++)
            CHECK(visible(kind, t, q, k) == (lo[k] <= q && q < hi[k]),
                  "mask %s is not one interval for key %d", MASKS[kind], k);
    }
}

__global__ void fill_random(attn_bf16 *x, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
        x[i] = __float2bfloat16((float)h * (2.0f / 4294967296.0f) - 1.0f);  // uniform [-1, 1)
    }
}

double now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// Median over REPS of the event-timed body, after WARMUP untimed runs.
template <typename F>
float median_ms(F body) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < WARMUP; i++) body();
    std::vector<float> ms(REPS);
    for (int i = 0; i < REPS; i++) {
        cudaCheck(cudaEventRecord(start));
        body();
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[i], start, stop));
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[REPS / 2];
}

}  // namespace

int main(int argc, char **argv) {
    // Arguments: sequence lengths and/or mask names (default: all of both).
    std::vector<int> sizes;
    bool mask_on[3] = {true, true, true}, mask_named = false;
    for (int i = 1; i < argc; i++) {
        int kind = -1;
        for (int m = 0; m < 3; m++)
            if (!strcmp(argv[i], MASKS[m])) kind = m;
        if (kind >= 0) {
            if (!mask_named) mask_on[0] = mask_on[1] = mask_on[2] = false;
            mask_named = mask_on[kind] = true;
        } else if (atoi(argv[i]) > 0) {
            sizes.push_back(atoi(argv[i]));
        } else {
            fatal("bench_attention: argument '%s' is neither a sequence length nor a mask "
                  "(causal, shared_prefix, strip_thinking)", argv[i]);
        }
    }
    if (sizes.empty()) sizes = {4096, 16384};
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, B=1 H=%d KV=%d D=%d bf16, median of %d after %d warm-up\n", prop.name, H, H, D,
           REPS, WARMUP);
    printf("%6s %-15s %7s %8s %7s %9s %7s %9s %7s %10s %9s\n", "S", "mask", "density", "fwd_ms",
           "TFLOP/s", "fwdbwd_ms", "TFLOP/s", "det_ms", "TFLOP/s", "meta_cpu_ms", "meta_gpu_ms");
    for (int S : sizes) {
        const size_t n = (size_t)S * H * D;
        attn_bf16 *q, *k, *v, *out, *dout, *dq, *dk, *dv;  // [1, S, H, D] each
        float *lse;                                         // [1, H, S]
        int32_t *d_lo, *d_hi;                               // [1, S]
        attn_bf16 **tensors[] = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
        for (int i = 0; i < 8; i++) {
            cudaCheck(cudaMalloc(tensors[i], n * sizeof(attn_bf16)));
            fill_random<<<1024, 256>>>(*tensors[i], (int64_t)n, 1234u + 77u * i);
            cudaCheckLaunch();
        }
        cudaCheck(cudaMalloc(&lse, (size_t)H * S * sizeof(float)));
        const AttnShape shape = {1, S, H, H, D, 1.0f / sqrtf((float)D)};
        void *workspace;  // backward scratch for either mode
        cudaCheck(cudaMalloc(&workspace, std::max(attention_backward_workspace_bytes(&shape, false),
                                                  attention_backward_workspace_bytes(&shape, true))));
        cudaCheck(cudaMalloc(&d_lo, S * sizeof(int32_t)));
        cudaCheck(cudaMalloc(&d_hi, S * sizeof(int32_t)));
        std::vector<int32_t> lo(S), hi(S);
        for (int kind = 0; kind < 3; kind++) {
            if (!mask_on[kind]) continue;
            mask_intervals(kind, S, lo.data(), hi.data());
            double visible_pairs = 0;
            for (int x = 0; x < S; x++) visible_pairs += hi[x] - lo[x];
            const double density = visible_pairs / ((double)S * S);
            cudaCheck(cudaMemcpy(d_lo, lo.data(), S * sizeof(int32_t), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(d_hi, hi.data(), S * sizeof(int32_t), cudaMemcpyHostToDevice));

            // Metadata: CPU build + upload vs GPU build (medians of wall-clock time).
            std::vector<double> cpu_ms, gpu_ms;
            AttnMask mask;
            for (int rep = 0; rep < 11; rep++) {
                double t0 = now_ms();
                AttnMask host;
                attn_mask_build(lo.data(), hi.data(), 1, S, ATTN_TILE, ATTN_TILE, &host);
                AttnMask dev = attn_mask_upload(&host, d_lo, d_hi);
                cudaCheck(cudaDeviceSynchronize());
                cpu_ms.push_back(now_ms() - t0);
                attn_mask_free(&host);
                attn_mask_free_device(&dev);
                t0 = now_ms();
                attn_mask_build_cuda(d_lo, d_hi, 1, S, ATTN_TILE, ATTN_TILE, &mask, 0);
                cudaCheck(cudaDeviceSynchronize());
                gpu_ms.push_back(now_ms() - t0);
                if (rep < 10) attn_mask_free_device(&mask);  // keep the last one for the runs
            }
            std::sort(cpu_ms.begin(), cpu_ms.end());
            std::sort(gpu_ms.begin(), gpu_ms.end());

            auto fwd = [&] { attention_forward_cuda(&shape, &mask, q, k, v, out, lse, 0); };
            auto fwdbwd = [&](bool deterministic) {
                fwd();
                attention_backward_cuda(&shape, &mask, q, k, v, out, lse, dout, dq, dk, dv,
                                        deterministic, workspace, 0);
            };
            const float t_fwd = median_ms(fwd);
            const float t_fb = median_ms([&] { fwdbwd(false); });
            const float t_det = median_ms([&] { fwdbwd(true); });
            const double flop_fwd = 4.0 * S * (double)S * D * H * density;
            printf("%6d %-15s %7.4f %8.3f %7.1f %9.3f %7.1f %9.3f %7.1f %10.3f %9.3f\n", S, MASKS[kind],
                   density, t_fwd, flop_fwd / (t_fwd * 1e9), t_fb, 3.5 * flop_fwd / (t_fb * 1e9), t_det,
                   3.5 * flop_fwd / (t_det * 1e9), cpu_ms[5], gpu_ms[5]);
            fflush(stdout);
            attn_mask_free_device(&mask);
        }
        for (int i = 0; i < 8; i++) cudaCheck(cudaFree(*tensors[i]));
        cudaCheck(cudaFree(lse));
        cudaCheck(cudaFree(workspace));
        cudaCheck(cudaFree(d_lo));
        cudaCheck(cudaFree(d_hi));
    }
    return 0;
}
