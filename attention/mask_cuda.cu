// TileMask on the GPU: a device copy of a host-built mask, or the same lists built on
// the device from lo/hi (same classification as tile_classify in mask.c: full iff
// every key of the tile sees every query of it, empty iff no pair is visible; slots
// past seq_len are ignored).
#include "attention/attention_cuda.h"

#include <string.h>
#include "common/cuda_check.h"

namespace {

// The eight arrays of a TileMask with their element counts, in one place.
struct MaskArrays {
    int32_t **ptr[8];
    size_t count[8];
};

MaskArrays mask_arrays(TileMask *m) {
    size_t rows = (size_t)m->n_rows, nq = (size_t)m->n_q_tiles, nk = (size_t)m->n_k_tiles;
    return {{&m->q_partial_count, &m->q_full_count, &m->q_partial_idx, &m->q_full_idx,
             &m->k_partial_count, &m->k_full_count, &m->k_partial_idx, &m->k_full_idx},
            {rows * nq, rows * nq, rows * nq * nk, rows * nq * nk, rows * nk, rows * nk,
             rows * nk * nq, rows * nk * nq}};
}

// kinds[row][qt][kt] (TileKind). Block per (key tile, row); the tile's intervals are
// staged in shared memory and the threads walk the query tiles.
__global__ void classify_kernel(const int32_t *lo, const int32_t *hi, int seq_len, int block_m,
                                int block_n, int n_q_tiles, int n_k_tiles, uint8_t *kinds) {
    extern __shared__ int32_t s_interval[];  // [2][block_n]: lo then hi
    const int kt = blockIdx.x, row = blockIdx.y;
    const int k0 = kt * block_n, k1 = min(k0 + block_n, seq_len);
    for (int k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
        s_interval[k - k0] = lo[(size_t)row * seq_len + k];
        s_interval[block_n + k - k0] = hi[(size_t)row * seq_len + k];
    }
    __syncthreads();
    for (int qt = threadIdx.x; qt < n_q_tiles; qt += blockDim.x) {
        const int q0 = qt * block_m, q1 = min(q0 + block_m, seq_len);
        bool full = true, any = false;
        for (int k = 0; k < k1 - k0; k++) {
            const int l = s_interval[k], h = s_interval[block_n + k];
            full = full && l <= q0 && h >= q1;
            any = any || max(l, q0) < min(h, q1);
        }
        kinds[((size_t)row * n_q_tiles + qt) * n_k_tiles + kt] =
            full ? TILE_FULL : any ? TILE_PARTIAL : TILE_EMPTY;
    }
}

// One thread per (row, line): ascending partial and full lists of one tile line.
// Forward lines are query tiles (walk kt); backward lines are key tiles (walk qt).
__global__ void lists_kernel(const uint8_t *kinds, int n_rows, int n_q_tiles, int n_k_tiles,
                             bool key_major, int32_t *partial_count, int32_t *full_count,
                             int32_t *partial_idx, int32_t *full_idx) {
    const int n_lines = key_major ? n_k_tiles : n_q_tiles, n_len = key_major ? n_q_tiles : n_k_tiles;
    const size_t slot = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // row * n_lines + line
    if (slot >= (size_t)n_rows * n_lines) return;
    const size_t row = slot / n_lines, line = slot % n_lines;
    const uint8_t *row_kinds = kinds + row * n_q_tiles * n_k_tiles;
    int n_partial = 0, n_full = 0;
    for (int t = 0; t < n_len; t++) {
        const uint8_t kind = key_major ? row_kinds[(size_t)t * n_k_tiles + line]
                                       : row_kinds[line * n_k_tiles + t];
        if (kind == TILE_PARTIAL) partial_idx[slot * n_len + n_partial++] = t;
        else if (kind == TILE_FULL) full_idx[slot * n_len + n_full++] = t;
    }
    partial_count[slot] = n_partial;
    full_count[slot] = n_full;
}

}  // namespace

extern "C" TileMask tile_mask_upload(const TileMask *host) {
    TileMask dev = *host;
    MaskArrays src = mask_arrays(const_cast<TileMask *>(host)), dst = mask_arrays(&dev);
    for (int i = 0; i < 8; i++) {
        cudaCheck(cudaMalloc(dst.ptr[i], src.count[i] * sizeof(int32_t)));
        cudaCheck(cudaMemcpy(*dst.ptr[i], *src.ptr[i], src.count[i] * sizeof(int32_t),
                             cudaMemcpyHostToDevice));
    }
    return dev;
}

extern "C" void tile_mask_build_cuda(const int32_t *lo, const int32_t *hi, int n_rows, int seq_len,
                                     int block_m, int block_n, TileMask *out, cudaStream_t stream) {
    if (n_rows <= 0 || seq_len <= 0 || block_m <= 0 || block_n <= 0)
        fatal("%s:%d: tile_mask_build_cuda: n_rows %d, seq_len %d, block_m %d, block_n %d must be "
              "positive", __FILE__, __LINE__, n_rows, seq_len, block_m, block_n);
    TileMask m;
    memset(&m, 0, sizeof(m));
    m.n_rows = n_rows;
    m.seq_len = seq_len;
    m.block_m = block_m;
    m.block_n = block_n;
    m.n_q_tiles = (seq_len + block_m - 1) / block_m;
    m.n_k_tiles = (seq_len + block_n - 1) / block_n;
    MaskArrays arrays = mask_arrays(&m);
    for (int i = 0; i < 8; i++) cudaCheck(cudaMalloc(arrays.ptr[i], arrays.count[i] * sizeof(int32_t)));

    uint8_t *kinds;  // [n_rows, n_q_tiles, n_k_tiles]
    const size_t n_kinds = (size_t)n_rows * m.n_q_tiles * m.n_k_tiles;
    cudaCheck(cudaMallocAsync(&kinds, n_kinds, stream));
    classify_kernel<<<dim3(m.n_k_tiles, n_rows), 256, 2 * block_n * sizeof(int32_t), stream>>>(
        lo, hi, seq_len, block_m, block_n, m.n_q_tiles, m.n_k_tiles, kinds);
    cudaCheckLaunch();
    const int threads = 128;
    lists_kernel<<<(n_rows * m.n_q_tiles + threads - 1) / threads, threads, 0, stream>>>(
        kinds, n_rows, m.n_q_tiles, m.n_k_tiles, false, m.q_partial_count, m.q_full_count,
        m.q_partial_idx, m.q_full_idx);
    cudaCheckLaunch();
    lists_kernel<<<(n_rows * m.n_k_tiles + threads - 1) / threads, threads, 0, stream>>>(
        kinds, n_rows, m.n_q_tiles, m.n_k_tiles, true, m.k_partial_count, m.k_full_count,
        m.k_partial_idx, m.k_full_idx);
    cudaCheckLaunch();
    cudaCheck(cudaFreeAsync(kinds, stream));
    *out = m;
}

extern "C" void tile_mask_free_device(TileMask *m) {
    MaskArrays arrays = mask_arrays(m);
    for (int i = 0; i < 8; i++) cudaCheck(cudaFree(*arrays.ptr[i]));
    memset(m, 0, sizeof(*m));
}
