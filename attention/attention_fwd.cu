// The attention forward's host side (attention_cuda.h): the params of one call and the
// launch of the forward kernel (fwd_kernel.cuh) at the call's head dim.
#include "attention/fwd_kernel.cuh"

namespace {

FwdParams fwd_params(const AttnShape *shape, const AttnMask *mask, const bf16 *q, const bf16 *k,
                     const bf16 *v, bf16 *out, float *lse) {
    FwdParams p;
    static_cast<AttnInputs &>(p) = attn_inputs(shape, mask, q, k, v);
    p.out = out;
    p.lse = lse;
    const AttnDims &d = p.dims;
    p.map_q = tensor_map_bf16(q, d.q_row_stride, d.seq_len, d.batch, d.q_row_stride, d.q_batch_stride);
    p.map_k = tensor_map_bf16(k, d.kv_row_stride, d.seq_len, d.batch, d.kv_row_stride, d.kv_batch_stride);
    p.map_v = tensor_map_bf16(v, d.kv_row_stride, d.seq_len, d.batch, d.kv_row_stride, d.kv_batch_stride);
    p.l2_heads = l2_section_heads((int64_t)d.seq_len * d.head_dim * 2 * (int64_t)sizeof(bf16),  // K and V
                                  d.batch * d.n_kv_heads, d.group);
    return p;
}

template <int D>
void forward(const FwdParams &p, cudaStream_t stream) {
    launch(attn_fwd_kernel<D>, fwd_grid<D>(p.dims), fwd_threads<D>(), sizeof(FwdSmem<D>), stream, p);
}

}  // namespace

extern "C" void attention_forward_cuda(const AttnShape *shape, const AttnMask *mask, const attn_bf16 *q,
                                       const attn_bf16 *k, const attn_bf16 *v, attn_bf16 *out,
                                       float *lse, cudaStream_t stream) {
    const FwdParams p = fwd_params(shape, mask, q, k, v, out, lse);
    if (p.dims.head_dim == 64) forward<64>(p, stream);
    else forward<128>(p, stream);
}
