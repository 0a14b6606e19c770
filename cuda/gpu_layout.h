/* gpu_layout.h: layout changes on the GPU (gpu_layout.cu): Flatten's NHWC <-> CHW, the batched
 * transposes the convolutions use for their filters, and explicit zero padding and its adjoint
 * for the convolutions cuDNN cannot pad (asymmetric "same"). */
#ifndef MGT_GPU_LAYOUT_H
#define MGT_GPU_LAYOUT_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op table's nhwc_to_chw and chw_to_nhwc (backend.h). */
void mgt_gpu_nhwc_to_chw(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y);
void mgt_gpu_chw_to_nhwc(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y);

/* On stream st, on elements of esize bytes (4: float32, 2: bfloat16), moved as they are:
 * dst[k][c][r] = src[k][r][c] for k < batch (a batch of row-major [rows][cols] matrices). */
void mgt_k_transpose(cudaStream_t st, size_t esize, size_t batch, size_t rows, size_t cols,
                     const void *src, void *dst);
/* Zero-padded copy of NHWC x into xp [n][hp][wp][c] (x at offset pt, pl; rows/columns beyond hp,
 * wp are dropped), and its adjoint: dx[n][h][w][c] from dxp (positions outside get 0). */
void mgt_k_pad_nhwc(cudaStream_t st, size_t esize, int n, int h, int w, int c, int hp, int wp,
                    int pt, int pl, const void *x, void *xp);
void mgt_k_crop_nhwc(cudaStream_t st, size_t esize, int n, int h, int w, int c, int hp, int wp,
                     int pt, int pl, const void *dxp, void *dx);

#ifdef __cplusplus
}
#endif

#endif
