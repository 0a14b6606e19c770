/* gpu_seq.h: the row-wise ops of sequence models on the GPU (gpu_seq.cu): dense layers with
 * [in][out] weights, token and position embeddings, layer normalisation. */
#ifndef MGT_GPU_SEQ_H
#define MGT_GPU_SEQ_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op table's dense_io_fwd / dense_io_bwd, embed_fwd / embed_bwd, layernorm_fwd /
 * layernorm_bwd (backend.h). */
void mgt_gpu_dense_io_fwd(mgt_backend *be, int n, int in, int out, mgt_act act, const float *x,
                          const float *w, const float *b, float *pre, float *y);
void mgt_gpu_dense_io_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *db);
void mgt_gpu_embed_fwd(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                       const float *wte, const float *wpe, float *y);
void mgt_gpu_embed_bwd(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                       const float *dy, float *dwte, int accumulate, float *dwpe);
void mgt_gpu_layernorm_fwd(mgt_backend *be, int rows, int c, float eps, const float *x,
                           const float *gamma, const float *beta, float *y, float *mean,
                           float *rstd);
void mgt_gpu_layernorm_bwd(mgt_backend *be, int rows, int c, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta);

#ifdef __cplusplus
}
#endif

#endif
