// SwiGLU on the GPU (twin of swiglu_*_cpu), on separate gate and up tensors or on
// the stacked gate|up projection.
#include "model/ops_cuda.h"
#include "model/ops_cuda_internal.cuh"

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// rows x width elements; gate and up rows are ld apart (ld = width for separate
// tensors, 2 * width for a stacked gate|up row with up = gate + width); out and the
// gradients of the backward use the same ld as their inputs, out is tight.
// One thread per pack of VEC elements of one row.
template <int VEC>
__global__ void swiglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up, int64_t rows,
                                      int64_t width, int64_t ld) {
    const int64_t packs = width / VEC, total = rows * packs;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = idx / packs, col = (idx % packs) * VEC;
        const Pack<bf16, VEC> g = load_bf16s<VEC>(gate + row * ld + col),
                              u = load_bf16s<VEC>(up + row * ld + col);
        Pack<bf16, VEC> y;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float gf = __bfloat162float(g.x[j]);
            y.x[j] = __float2bfloat16_rn(gf * sigmoid(gf) * __bfloat162float(u.x[j]));
        }
        store_bf16s<VEC>(out + row * width + col, y);
    }
}

// d silu(g)/dg = s * (1 + g * (1 - s)), s = sigmoid(g). Reads all inputs of a pack
// before writing it, which makes the documented aliasing safe. dout is tight.
template <int VEC>
__global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout,
                                       const bf16 *gate, const bf16 *up, int64_t rows,
                                       int64_t width, int64_t ld) {
    const int64_t packs = width / VEC, total = rows * packs;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = idx / packs, col = (idx % packs) * VEC, at = row * ld + col;
        const Pack<bf16, VEC> g = load_bf16s<VEC>(gate + at), u = load_bf16s<VEC>(up + at),
                              d = load_bf16s<VEC>(dout + row * width + col);
        Pack<bf16, VEC> dg, du;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float gf = __bfloat162float(g.x[j]), uf = __bfloat162float(u.x[j]);
            const float df = __bfloat162float(d.x[j]), s = sigmoid(gf);
            dg.x[j] = __float2bfloat16_rn(df * uf * s * (1.0f + gf * (1.0f - s)));
            du.x[j] = __float2bfloat16_rn(df * gf * s);
        }
        store_bf16s<VEC>(dgate + at, dg);
        store_bf16s<VEC>(dup + at, du);
    }
}

// Packs of 8 when widths, strides and addresses allow it.
static bool swiglu_packed(int64_t width, int64_t ld, const void *const *pointers, int n) {
    if (width % 8 != 0 || ld % 8 != 0) return false;
    for (int i = 0; i < n; i++)
        if (!pack_aligned(pointers[i], 16)) return false;
    return true;
}

static void swiglu_forward_launch(bf16 *out, const bf16 *gate, const bf16 *up, int64_t rows,
                                  int64_t width, int64_t ld, cudaStream_t stream) {
    if (rows <= 0 || width <= 0) return;
    const void *pointers[] = {out, gate, up};
    if (swiglu_packed(width, ld, pointers, 3))
        swiglu_forward_kernel<8><<<grid_for(rows * width / 8, ELEMENTWISE_THREADS),
                                   ELEMENTWISE_THREADS, 0, stream>>>(out, gate, up, rows, width,
                                                                     ld);
    else
        swiglu_forward_kernel<1><<<grid_for(rows * width, ELEMENTWISE_THREADS),
                                   ELEMENTWISE_THREADS, 0, stream>>>(out, gate, up, rows, width,
                                                                     ld);
    cudaCheckLaunch();
}

static void swiglu_backward_launch(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                                   const bf16 *up, int64_t rows, int64_t width, int64_t ld,
                                   cudaStream_t stream) {
    if (rows <= 0 || width <= 0) return;
    const void *pointers[] = {dgate, dup, dout, gate, up};
    if (swiglu_packed(width, ld, pointers, 5))
        swiglu_backward_kernel<8><<<grid_for(rows * width / 8, ELEMENTWISE_THREADS),
                                    ELEMENTWISE_THREADS, 0, stream>>>(dgate, dup, dout, gate, up,
                                                                      rows, width, ld);
    else
        swiglu_backward_kernel<1><<<grid_for(rows * width, ELEMENTWISE_THREADS),
                                    ELEMENTWISE_THREADS, 0, stream>>>(dgate, dup, dout, gate, up,
                                                                      rows, width, ld);
    cudaCheckLaunch();
}

void swiglu_forward_cuda(bf16 *out, const bf16 *gate, const bf16 *up, int64_t n,
                         cudaStream_t stream) {
    swiglu_forward_launch(out, gate, up, 1, n, n, stream);
}

void swiglu_backward_cuda(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                          const bf16 *up, int64_t n, cudaStream_t stream) {
    swiglu_backward_launch(dgate, dup, dout, gate, up, 1, n, n, stream);
}

void swiglu_stacked_forward_cuda(bf16 *out, const bf16 *gate_up, int N, int F,
                                 cudaStream_t stream) {
    CHECK(N >= 0 && F > 0, "swiglu_stacked_forward_cuda: bad shape N=%d F=%d", N, F);
    swiglu_forward_launch(out, gate_up, gate_up + F, N, F, 2 * (int64_t)F, stream);
}

void swiglu_stacked_backward_cuda(bf16 *d_gate_up, const bf16 *dout, const bf16 *gate_up, int N,
                                  int F, cudaStream_t stream) {
    CHECK(N >= 0 && F > 0, "swiglu_stacked_backward_cuda: bad shape N=%d F=%d", N, F);
    swiglu_backward_launch(d_gate_up, d_gate_up + F, dout, gate_up, gate_up + F, N, F,
                           2 * (int64_t)F, stream);
}
