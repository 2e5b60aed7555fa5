// Host side of the attention kernels: the shape checks and strides (AttnDims), the one
// function that reads the caller's mask (mask_view), what both kernel families take as
// input (AttnInputs), the TMA descriptors, and the launch helper.
#pragma once
#include <cuda.h>  // CUtensorMap (the encoder is fetched from the driver at run time)
#include <cudaTypedefs.h>
#include "attention/kernel_config.cuh"
#include "attention/tile_walk.cuh"
#include "common/cuda_check.h"

namespace {

// Shape and strides of the tensors (attention_cuda.h's layouts, elements), shared by the
// forward and backward params.
struct AttnDims {
    int batch, seq_len, n_heads, n_kv_heads, head_dim;
    int group;                     // query heads per KV head
    int n_q_tiles, n_k_tiles;
    int s_pad;                     // seq_len padded to whole query tiles
    int64_t n_kv;                  // elements of K (of V, dK, dV)
    int q_row_stride, kv_row_stride;  // one token: n_heads * head_dim, n_kv_heads * head_dim
    int64_t q_batch_stride, kv_batch_stride;
    float scale, scale_log2;  // softmax scale, and times log2(e) for the base-2 exponent
};

inline AttnDims attn_dims(const AttnShape *s) {
    CHECK(s->batch > 0 && s->seq_len > 0 && s->n_heads > 0 && s->n_kv_heads > 0,
          "attention_cuda: batch %d, seq_len %d, n_heads %d, n_kv_heads %d must be positive",
          s->batch, s->seq_len, s->n_heads, s->n_kv_heads);
    CHECK(s->n_heads % s->n_kv_heads == 0,
          "attention_cuda: n_heads %d is not a multiple of n_kv_heads %d", s->n_heads, s->n_kv_heads);
    CHECK(s->head_dim == 64 || s->head_dim == 128,
          "attention_cuda: head_dim %d (supported: 64, 128)", s->head_dim);
    CHECK(s->scale > 0.0f, "attention_cuda: scale %g must be positive", s->scale);
    AttnDims d;
    d.batch = s->batch;
    d.seq_len = s->seq_len;
    d.n_heads = s->n_heads;
    d.n_kv_heads = s->n_kv_heads;
    d.head_dim = s->head_dim;
    d.group = s->n_heads / s->n_kv_heads;
    d.n_q_tiles = n_tiles(s->seq_len, BM);
    d.n_k_tiles = n_tiles(s->seq_len, BN);
    d.s_pad = d.n_q_tiles * BM;
    d.n_kv = (int64_t)s->batch * s->seq_len * s->n_kv_heads * s->head_dim;
    d.q_row_stride = s->n_heads * s->head_dim;
    d.kv_row_stride = s->n_kv_heads * s->head_dim;
    d.q_batch_stride = (int64_t)s->seq_len * d.q_row_stride;
    d.kv_batch_stride = (int64_t)s->seq_len * d.kv_row_stride;
    d.scale = s->scale;
    d.scale_log2 = s->scale * LOG2E;
    return d;
}

// The one host function that reads the caller's mask and intervals: checks that the mask
// was built for these inputs and the kernels' tiles, and returns the kernels' view of it.
inline TileListsView lists_view(const TileLists &l) {
    return {l.partial_count, l.full_count, l.partial_idx, l.full_idx, l.n_lines, l.line_len};
}

inline MaskView mask_view(const AttnDims &d, const AttnMask *m) {
    CHECK(m->block_m == BM && m->block_n == BN,
          "attention_cuda: mask tiles %dx%d, the kernels need %dx%d (ATTN_TILE)", m->block_m,
          m->block_n, BM, BN);
    CHECK(m->n_rows == d.batch && m->seq_len == d.seq_len,
          "attention_cuda: mask built for %d rows x %d, inputs are %d x %d", m->n_rows, m->seq_len,
          d.batch, d.seq_len);
    return {lists_view(m->by_query), lists_view(m->by_key), m->lo, m->hi};
}

// What both kernel families read: the shape, the mask and the inputs q, k, v.
struct AttnInputs {
    AttnDims dims;
    MaskView mask;
    const bf16 *q, *k, *v;
};

inline AttnInputs attn_inputs(const AttnShape *shape, const AttnMask *mask, const bf16 *q,
                              const bf16 *k, const bf16 *v) {
    AttnInputs in;
    in.dims = attn_dims(shape);
    in.mask = mask_view(in.dims, mask);
    in.q = q;
    in.k = k;
    in.v = v;
    return in;
}

// The driver's tensor-map encoder, fetched once (so nothing links libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                                   cudaEnableDefault, &found));
        CHECK(found == cudaDriverEntryPointSuccess && encode, "attention_cuda: no cuTensorMapEncodeTiled in the driver");
    }
    return encode;
}

// A TMA descriptor of one bf16 tensor [batch][rows][row_stride] (strides in elements), of
// which `cols` columns are read, in boxes of 64 rows x 64 columns (128 bytes: the
// 128-byte swizzle of wgmma.cuh); rows past `rows` read as zeros.
inline CUtensorMap tensor_map_bf16(const bf16 *base, int cols, int rows, int batch, int64_t row_stride,
                                   int64_t batch_stride) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    CUtensorMap map;
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)batch};
    const cuuint64_t strides[2] = {(cuuint64_t)row_stride * sizeof(bf16), (cuuint64_t)batch_stride * sizeof(bf16)};
    const cuuint32_t box[3] = {64, 64, 1}, elem_strides[3] = {1, 1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box,
                              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CHECK(r == CUDA_SUCCESS, "attention_cuda: cuTensorMapEncodeTiled failed (%d)", (int)r);
    return map;
}

// A TMA descriptor of n contiguous floats (16-byte aligned) seen as [n / row][row], in boxes
// of box_rows x row (no swizzle: a box is box_rows * row contiguous floats in shared memory).
inline CUtensorMap tensor_map_f32(const float *base, int64_t n, int row, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    CHECK(n % row == 0, "tensor_map_f32: %lld floats are not whole rows of %d", (long long)n, row);
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)row, (cuuint64_t)(n / row)};
    const cuuint64_t strides[1] = {(cuuint64_t)row * sizeof(float)};
    const cuuint32_t box[2] = {(cuuint32_t)row, (cuuint32_t)box_rows}, elem_strides[2] = {1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)base, dims, strides, box,
                              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CHECK(r == CUDA_SUCCESS, "attention_cuda: cuTensorMapEncodeTiled failed (%d)", (int)r);
    return map;
}

// Launches kernel<<<grid, threads, smem>>>(params) after raising its dynamic shared-memory
// limit.
template <typename Params>
void launch(void (*kernel)(Params), dim3 grid, int threads, size_t smem, cudaStream_t stream, const Params &params) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, threads, smem, stream>>>(params);
    cudaCheckLaunch();
}

}  // namespace
