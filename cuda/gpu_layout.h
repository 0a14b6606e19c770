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
/* Zero-padded copy of NHWC x [n][h][w][c] into xp [n][hp][wp][cp] (x at offset pt, pl; rows and
 * columns beyond hp, wp are dropped; channels c .. cp - 1 are zeros), and its adjoint:
 * dx[n][h][w][c] from dxp (positions outside get 0). */
void mgt_k_pad_nhwc(cudaStream_t st, size_t esize, int n, int h, int w, int c, int cp, int hp,
                    int wp, int pt, int pl, const void *x, void *xp);
void mgt_k_crop_nhwc(cudaStream_t st, size_t esize, int n, int h, int w, int c, int cp, int hp,
                     int wp, int pt, int pl, const void *dxp, void *dx);

/* One filter's copy in cuDNN's NHWC filter layout (KRSC): dst [oc][khkw][cp] from the OIHW float
 * weights src [oc][c][khkw], channels c .. cp - 1 zero, in bfloat16 (rounded to nearest even)
 * where bf16, else float. first: where its elements start in a batch of jobs laid end to end. */
typedef struct mgt_gpu_krsc_job {
    const float *src;
    void *dst;
    int oc, c, cp, khkw, bf16;
    size_t first;
} mgt_gpu_krsc_job;
/* The elements [base, base + count) of the njobs jobs at jobs (device memory, ordered by first),
 * in one launch. */
void mgt_k_weights_krsc(cudaStream_t st, const mgt_gpu_krsc_job *jobs, int njobs, size_t base,
                        size_t count);
/* The filter gradient back: dw[oc][c][khkw] (OIHW, float) from cuDNN's dk [oc][khkw][cp] (KRSC,
 * esize 4: float, 2: bfloat16, widened exactly), its padded channels left out. */
void mgt_k_filter_from_krsc(cudaStream_t st, size_t esize, int oc, int c, int cp, int khkw,
                            const void *dk, float *dw);

#ifdef __cplusplus
}
#endif

#endif
