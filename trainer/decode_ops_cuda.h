// The CUDA decoder behind DecodeOps (trainer/decode_ops.h), callable from C without CUDA
// headers. Only in binaries built with CUDA (ONEPASS_HAVE_CUDA).
#pragma once

#ifdef __cplusplus
extern "C" {  // decode_ops.h is a plain C header without guards of its own
#endif
#include "trainer/decode_ops.h"

// model/decode_cuda.h's decoder: create copies the fp32 host weights to the device as
// bf16 once; every forward runs there and returns the logits in host memory.
const DecodeOps *cuda_decode_ops(void);

#ifdef __cplusplus
}
#endif
