// The CUDA twins of model/lora.h's lora_forward_cpu and lora_backward_cpu (model/
// matmul_cuda.cu): the same parameters in the same order, bf16 activations and adapter
// weights (u, du bf16 scratch), fp32 adapter gradients, device pointers (the group is a
// host struct), a trailing stream.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {  // model/lora.h is a plain C header without guards of its own
#endif
#include "model/lora.h"

void lora_forward_cuda(__nv_bfloat16 *out, int ld_out, __nv_bfloat16 *u, const __nv_bfloat16 *x,
                       const __nv_bfloat16 *adapter, const LoraGroup *g, int T,
                       cudaStream_t stream);
void lora_backward_cuda(__nv_bfloat16 *dx, float *adapter_grads, __nv_bfloat16 *u,
                        __nv_bfloat16 *du, const __nv_bfloat16 *dout, int ld_dout,
                        const __nv_bfloat16 *x, const __nv_bfloat16 *adapter, const LoraGroup *g,
                        int T, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
