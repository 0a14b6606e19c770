/* gpu_attn.h: causal multi-head self-attention on the GPU (gpu_attn.cu): mgtrain's own fused
 * kernels (online softmax, no t x t matrix kept; backward recomputed from each query's
 * log-sum-exp), for heads of up to 256 channels. */
#ifndef MGT_GPU_ATTN_H
#define MGT_GPU_ATTN_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op table's attn_scratch, attn_fwd, attn_bwd and attn_decode (backend.h). */
size_t mgt_gpu_attn_scratch(mgt_backend *be, const mgt_attn_shape *s);
void mgt_gpu_attn_fwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, float *y,
                      float *lse);
void mgt_gpu_attn_bwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, const float *y,
                      const float *lse, const float *dy, float *dqkv);
void mgt_gpu_attn_decode(mgt_backend *be, int c, int heads, int p, const float *q, const float *kc,
                         const float *vc, float *y);

#ifdef __cplusplus
}
#endif

#endif
