// The attention backward's host side (attention_cuda.h): the workspace carved from the
// caller's buffer, the params of one call, and the launches at the call's head dim: in
// deterministic mode the K/V bound, the pre-pass (bwd_passes.cuh), the dK/dV kernel with
// dQ's reductions (bwd_dkdv.cuh, bwd_dq.cuh), dQ's conversion, and with GQA the sum of
// the dK/dV partials.
#include "attention/bwd_dkdv.cuh"
#include "attention/bwd_dq.cuh"
#include "attention/bwd_params.cuh"
#include "attention/bwd_passes.cuh"

namespace {

constexpr size_t WORKSPACE_ALIGNMENT = 256;

// Bump allocation of n floats at offset *used of base (nullptr: sizing only).
float *take_floats(void *base, size_t *used, int64_t n) {
    float *at = base ? reinterpret_cast<float *>(static_cast<char *>(base) + *used) : nullptr;
    *used += ((size_t)n * sizeof(float) + WORKSPACE_ALIGNMENT - 1) / WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT;
    return at;
}

BwdWorkspace bwd_workspace(const AttnDims &d, bool deterministic, void *base) {
    const int64_t n_pad = (int64_t)d.batch * d.n_heads * d.s_pad;
    BwdWorkspace w;
    w.bytes = 0;
    w.dsum = take_floats(base, &w.bytes, n_pad);
    w.lse2 = take_floats(base, &w.bytes, n_pad);
    w.dq_accum = take_floats(base, &w.bytes, n_pad * d.head_dim);
    w.dq_scale = deterministic ? take_floats(base, &w.bytes, n_pad) : nullptr;
    w.kv_bound = deterministic ? reinterpret_cast<unsigned long long *>(
                                     take_floats(base, &w.bytes, 4 * (int64_t)d.batch * d.n_kv_heads))
                               : nullptr;
    w.dkv_part = d.group > 1 ? take_floats(base, &w.bytes, 2 * d.group * d.n_kv) : nullptr;
    return w;
}

// Heads per L2 section of a backward kernel's blocks (l2_section_heads), or one section of
// every head where they fit twice the budget together: LPT holds only inside a section, so
// the last section's longest blocks start late, which costs small problems more than their
// L2 misses (H=12 KV=4 D=64 S=8192 shared_prefix / strip_thinking: +9 / +12% in sections;
// docs/KERNELS.md).
int bwd_l2_heads(int64_t group_bytes, int n_groups, int group) {
    return n_groups * group_bytes <= 2 * L2_SECTION_BYTES ? n_groups * group
                                                          : l2_section_heads(group_bytes, n_groups, group);
}

BwdParams bwd_params(const AttnShape *shape, const AttnMask *mask, const bf16 *q, const bf16 *k,
                     const bf16 *v, const bf16 *out, const float *lse, const bf16 *dout, bf16 *dq,
                     bf16 *dk, bf16 *dv, bool deterministic, void *workspace) {
    BwdParams p;
    static_cast<AttnInputs &>(p) = attn_inputs(shape, mask, q, k, v);
    p.out = out;
    p.dout = dout;
    p.lse = lse;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    CHECK(workspace && (uintptr_t)workspace % WORKSPACE_ALIGNMENT == 0,
          "attention_backward_cuda: workspace %p must be non-null and %zu-byte aligned", workspace,
          WORKSPACE_ALIGNMENT);
    p.ws = bwd_workspace(p.dims, deterministic, workspace);
    const AttnDims &d = p.dims;
    p.map_q = tensor_map_bf16(q, d.q_row_stride, d.seq_len, d.batch, d.q_row_stride, d.q_batch_stride);
    p.map_dout = tensor_map_bf16(dout, d.q_row_stride, d.seq_len, d.batch, d.q_row_stride, d.q_batch_stride);
    p.map_k = tensor_map_bf16(k, d.kv_row_stride, d.seq_len, d.batch, d.kv_row_stride, d.kv_batch_stride);
    p.map_v = tensor_map_bf16(v, d.kv_row_stride, d.seq_len, d.batch, d.kv_row_stride, d.kv_batch_stride);
    const int64_t n_pad = (int64_t)d.batch * d.n_heads * d.s_pad;
    p.map_lse2 = tensor_map_f32(p.ws.lse2, n_pad, BM, 1);
    p.map_dsum = tensor_map_f32(p.ws.dsum, n_pad, BM, 1);
    // What a head's blocks read and add into: Q, dO and dq_accum.
    const int64_t head_elems = (int64_t)d.seq_len * d.head_dim;
    p.dkdv_l2_heads = bwd_l2_heads(head_elems * (2 * (int64_t)sizeof(bf16) + (int64_t)sizeof(float)),
                                   d.batch * d.n_heads, 1);
    return p;
}

template <int D>
void backward(const BwdParams &p, bool deterministic, cudaStream_t stream) {
    const AttnDims &d = p.dims;
    const int64_t n_pad = (int64_t)d.batch * d.n_heads * d.s_pad;
    constexpr int prep_rows = PREP_THREADS / (D / 8);
    if (deterministic) {
        cudaCheck(cudaMemsetAsync(p.ws.kv_bound, 0, 2 * sizeof(unsigned long long) * d.batch * d.n_kv_heads, stream));
        const dim3 grid((unsigned)d.n_kv_heads, (unsigned)n_tiles(d.seq_len, kv_bound_keys<D>()), (unsigned)d.batch);
        kv_bound_kernel<D><<<grid, KV_BOUND_THREADS, 0, stream>>>(p);
        cudaCheckLaunch();
    }
    attn_bwd_prep_kernel<D><<<(unsigned)((n_pad + prep_rows - 1) / prep_rows), PREP_THREADS, 0, stream>>>(p);
    cudaCheckLaunch();
    if (deterministic) {
        launch(attn_bwd_dkdv_kernel<D, true>, dkdv_grid(d), DKDV_THREADS, sizeof(DkdvSmem<D>), stream, p);
    } else {
        launch(attn_bwd_dkdv_kernel<D, false>, dkdv_grid(d), DKDV_THREADS, sizeof(DkdvSmem<D>), stream, p);
    }
    dq_convert_kernel<<<(unsigned)(n_pad / BM), CONVERT_THREADS, 0, stream>>>(p);
    cudaCheckLaunch();
    if (d.group > 1) {
        dkv_reduce_kernel<<<1024, 256, 0, stream>>>(p);
        cudaCheckLaunch();
    }
}

}  // namespace

extern "C" size_t attention_backward_workspace_bytes(const AttnShape *shape, bool deterministic) {
    return bwd_workspace(attn_dims(shape), deterministic, nullptr).bytes;
}

extern "C" void attention_backward_cuda(const AttnShape *shape, const AttnMask *mask, const attn_bf16 *q,
                                        const attn_bf16 *k, const attn_bf16 *v,
                                        const attn_bf16 *out, const float *lse,
                                        const attn_bf16 *dout, attn_bf16 *dq, attn_bf16 *dk,
                                        attn_bf16 *dv, bool deterministic, void *workspace,
                                        cudaStream_t stream) {
    const BwdParams p = bwd_params(shape, mask, q, k, v, out, lse, dout, dq, dk, dv, deterministic, workspace);
    if (p.dims.head_dim == 64) backward<64>(p, deterministic, stream);
    else backward<128>(p, deterministic, stream);
}
