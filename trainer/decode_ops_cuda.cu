// DecodeOps over model/decode_cuda.h. The weights arrive as the fp32 host copy generation
// is given (a checkpoint, or the trainer's state at an eval step); they go to the device
// once per create, as the bf16 the decoder runs on.
#include "trainer/decode_ops_cuda.h"

#include <stdlib.h>

#include "common/check.h"
#include "common/cuda_check.h"
#include "model/decode_cuda.h"
#include "model/ops_cuda.h"

typedef struct {
    CudaDecoder *decoder;
    __nv_bfloat16 *weights;  // [param table total] device bf16
    bool owns_ops;           // ops_cuda_init was ours (no CUDA trainer is live)
} CudaDecodeState;

static void *cuda_create(const ModelConfig *cfg, const float *params, int max_seqs, int max_len) {
    CudaDecodeState *s = (CudaDecodeState *)xcalloc(1, sizeof *s);
    ParamTable table;
    param_table_build(cfg, &table);
    const size_t n = table.total;
    param_table_free(&table);
    // The decoder runs forward ops only: any scratch sizes do (model/decode_cuda.h).
    s->owns_ops = !ops_cuda_ready();
    if (s->owns_ops) ops_cuda_init(1, 1);
    float *staging;  // [n] fp32, freed once converted
    cudaCheck(cudaMalloc(&staging, n * sizeof(float)));
    cudaCheck(cudaMalloc(&s->weights, n * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemcpy(staging, params, n * sizeof(float), cudaMemcpyHostToDevice));
    float_to_bf16_cuda(s->weights, staging, (int64_t)n, 0);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaFree(staging));
    s->decoder = cuda_decoder_create(cfg, max_seqs, max_len);
    return s;
}

static void cuda_destroy(void *state) {
    CudaDecodeState *s = (CudaDecodeState *)state;
    cuda_decoder_free(s->decoder);
    cudaCheck(cudaFree(s->weights));
    if (s->owns_ops) ops_cuda_destroy();
    free(s);
}

static void cuda_reset(void *state, int slot) {
    cuda_decoder_reset(((CudaDecodeState *)state)->decoder, slot);
}

static void cuda_forward(void *state, int n, const int32_t *slot, const int32_t *token,
                         const int32_t *pos, float *logits) {
    CudaDecodeState *s = (CudaDecodeState *)state;
    cuda_decoder_forward(s->decoder, s->weights, n, slot, token, pos, logits);
}

static const DecodeOps CUDA_DECODE = {"cuda", cuda_create, cuda_destroy, cuda_reset, cuda_forward};

const DecodeOps *cuda_decode_ops(void) { return &CUDA_DECODE; }
