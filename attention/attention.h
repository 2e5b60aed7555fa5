// Block-sparse attention over interval masks. The CPU fp32 version is the oracle;
// the CUDA bf16 version (attention_cuda.h) takes the same arguments in the same order.
//
// Layouts (row-major, as the projections produce them, no transposes):
//   q, out, dq, dout: [batch, seq_len, n_heads, head_dim]
//   k, v, dk, dv:     [batch, seq_len, n_kv_heads, head_dim]   (GQA: n_heads % n_kv_heads == 0)
//   lse:              [batch, n_heads, seq_len]  natural-log sum-exp of scaled scores;
//                      -INFINITY for a query that sees no key (its output is 0)
//   mask:             the batch's AttnMask (attention/mask.h): intervals lo/hi
//                      [batch, seq_len] and tile lists of any block sizes
#pragma once
#include <stdint.h>
#include "attention/mask.h"

typedef struct {
    int batch, seq_len, n_heads, n_kv_heads, head_dim;
    float scale;  // softmax scale, usually 1/sqrt(head_dim)
} AttnShape;

// Visits only the non-empty tiles of `mask`; per-element tests of the intervals only
// on partial tiles.
void attention_forward_cpu(const AttnShape *shape, const AttnMask *mask, const float *q,
                           const float *k, const float *v, float *out, float *lse);

// Overwrites dq, dk, dv (not accumulated). GQA gradients summed over shared heads.
void attention_backward_cpu(const AttnShape *shape, const AttnMask *mask, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv);
