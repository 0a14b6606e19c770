/* gpu_dense.h: dense layers on cuBLAS (gpu_dense.cu), and bias rows. */
#ifndef MGT_GPU_DENSE_H
#define MGT_GPU_DENSE_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op table's dense_fwd and dense_bwd (backend.h). */
void mgt_gpu_dense_fwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *b, float *y);
void mgt_gpu_dense_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *dy, float *dx, float *dw, float *db);
/* The backward's cases without a product, on be's stream: db from dy (n rows of out, n < 0 taken
 * as 0), then zeros where a side is empty (dx for in > 0 with out <= 0; dW for n == 0). 1: they
 * were all there was to do; 0: the GEMMs for dW and dx remain (n, in and out all positive). */
int mgt_gpu_dense_bwd_edges(mgt_backend *be, int n, int in, int out, const float *dy, float *dx,
                            float *dw, float *db);

/* y[r][j] = b[j] for r < rows, j < cols, on stream st (a bias before a GEMM adds onto it); y of
 * esize-byte values: 4 float, 2 bfloat16 (b rounded to it). */
void mgt_k_fill_rows(cudaStream_t st, size_t esize, size_t rows, int cols, const float *b, void *y);
/* y[r][j] += b[j] (a bias after a convolution computed in another layout). */
void mgt_k_add_rows(cudaStream_t st, size_t rows, int cols, const float *b, float *y);

#ifdef __cplusplus
}
#endif

#endif
