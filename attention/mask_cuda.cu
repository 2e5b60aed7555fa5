// AttnMask on the GPU (mask_cuda.h): a device copy of a host-built mask's lists, or the
// same lists built on the device from lo/hi (same classification as tile_classify in
// mask.c: full iff every key of the tile sees every query of it, empty iff no pair is
// visible; slots past seq_len are ignored).
#include "attention/mask_cuda.h"

#include <string.h>
#include "common/cuda_check.h"

namespace {

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
__global__ void lists_kernel(const uint8_t *kinds, int n_rows, bool key_major, TileLists l) {
    const int n_lines = l.n_lines, n_len = l.line_len;
    const int n_k_tiles = key_major ? n_lines : n_len;
    const size_t slot = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // row * n_lines + line
    if (slot >= (size_t)n_rows * n_lines) return;
    const size_t row = slot / n_lines, line = slot % n_lines;
    const uint8_t *row_kinds = kinds + row * n_lines * n_len;
    int n_partial = 0, n_full = 0;
    for (int t = 0; t < n_len; t++) {
        const uint8_t kind = key_major ? row_kinds[(size_t)t * n_k_tiles + line]
                                       : row_kinds[line * n_k_tiles + t];
        if (kind == TILE_PARTIAL) l.partial_idx[slot * n_len + n_partial++] = t;
        else if (kind == TILE_FULL) l.full_idx[slot * n_len + n_full++] = t;
    }
    l.partial_count[slot] = n_partial;
    l.full_count[slot] = n_full;
}

}  // namespace

extern "C" AttnMask attn_mask_upload(const AttnMask *host, const int32_t *lo_dev,
                                     const int32_t *hi_dev) {
    const size_t bytes = attn_mask_storage_count(host->n_rows, host->seq_len, host->block_m,
                                                 host->block_n) * sizeof(int32_t);
    int32_t *storage;
    cudaCheck(cudaMalloc(&storage, bytes));
    cudaCheck(cudaMemcpy(storage, host->storage, bytes, cudaMemcpyHostToDevice));
    return attn_mask_view(host->n_rows, host->seq_len, host->block_m, host->block_n, lo_dev, hi_dev,
                          storage);
}

extern "C" void attn_mask_build_cuda(const int32_t *lo, const int32_t *hi, int n_rows, int seq_len,
                                     int block_m, int block_n, AttnMask *out, cudaStream_t stream) {
    CHECK(n_rows > 0 && seq_len > 0 && block_m > 0 && block_n > 0,
          "attn_mask_build_cuda: n_rows %d, seq_len %d, block_m %d, block_n %d must be positive",
          n_rows, seq_len, block_m, block_n);
    int32_t *storage;
    cudaCheck(cudaMalloc(&storage, attn_mask_storage_count(n_rows, seq_len, block_m, block_n) *
                                       sizeof(int32_t)));
    AttnMask m = attn_mask_view(n_rows, seq_len, block_m, block_n, lo, hi, storage);
    const int n_q_tiles = m.by_query.n_lines, n_k_tiles = m.by_key.n_lines;

    uint8_t *kinds;  // [n_rows, n_q_tiles, n_k_tiles]
    const size_t n_kinds = (size_t)n_rows * n_q_tiles * n_k_tiles;
    cudaCheck(cudaMallocAsync(&kinds, n_kinds, stream));
    classify_kernel<<<dim3(n_k_tiles, n_rows), 256, 2 * block_n * sizeof(int32_t), stream>>>(
        lo, hi, seq_len, block_m, block_n, n_q_tiles, n_k_tiles, kinds);
    cudaCheckLaunch();
    const int threads = 128;
    lists_kernel<<<(n_rows * n_q_tiles + threads - 1) / threads, threads, 0, stream>>>(
        kinds, n_rows, false, m.by_query);
    cudaCheckLaunch();
    lists_kernel<<<(n_rows * n_k_tiles + threads - 1) / threads, threads, 0, stream>>>(
        kinds, n_rows, true, m.by_key);
    cudaCheckLaunch();
    cudaCheck(cudaFreeAsync(kinds, stream));
    *out = m;
}

extern "C" void attn_mask_free_device(AttnMask *m) {
    cudaCheck(cudaFree(m->storage));
    memset(m, 0, sizeof(*m));
}
