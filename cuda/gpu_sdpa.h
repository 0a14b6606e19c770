/* gpu_sdpa.h: causal multi-head self-attention through cuDNN's fused flash attention
 * (gpu_sdpa.c), where it can run; gpu_attn.cu's own kernels otherwise. */
#ifndef MGT_GPU_SDPA_H
#define MGT_GPU_SDPA_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mgt_gpu_impl;

/* The scratch bytes the fused path needs for shape s (its plans built now), 0 where it does not
 * run s. */
size_t mgt_gpu_sdpa_scratch(mgt_backend *be, const mgt_attn_shape *s);
/* The op table's attn_fwd and attn_bwd through cuDNN: 1 when done, 0 when the own kernels must
 * run the call (a shape or a setting the fused path does not take, or one cuDNN refused). */
int mgt_gpu_sdpa_fwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, float *y,
                     float *lse);
int mgt_gpu_sdpa_bwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, const float *y,
                     const float *lse, const float *dy, float *dqkv);
/* Frees the plans (backend destroy). */
void mgt_gpu_sdpa_free(struct mgt_gpu_impl *im);

#ifdef __cplusplus
}
#endif

#endif
