/* gpu_bf16.h: bfloat16 conversions for --precision bf16 (gpu_bf16.cu). The dense layers and the
 * convolutions round their GEMM / convolution inputs to bfloat16 with these, and widen what cuDNN
 * writes in bfloat16 back to float; every other op stays float. */
#ifndef MGT_GPU_BF16_H
#define MGT_GPU_BF16_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] = x[i] rounded to the nearest bfloat16 (ties to even; a NaN stays a NaN, infinities and
 * values beyond bfloat16's range become infinities), for i < n, on stream st. */
void mgt_k_to_bf16(cudaStream_t st, size_t n, const float *x, uint16_t *y);
/* y[r][j] = x[r][j] widened to float (exact), plus b[j] when b is not NULL (one float addition),
 * for r < rows, j < cols, on stream st. */
void mgt_k_from_bf16(cudaStream_t st, size_t rows, int cols, const uint16_t *x, const float *b,
                     float *y);

/* The op table's act_from_f32 (y = x rounded to bfloat16, n values) and act_to_f32 (y = x
 * widened, n rows of `row`, then the softmax of each row with act MGT_ACT_SOFTMAX). */
void mgt_gpu_act_from_f32(mgt_backend *be, size_t n, const float *x, float *y);
void mgt_gpu_act_to_f32(mgt_backend *be, mgt_act act, int n, int row, const float *x, float *y);

/* The bfloat16 of a float as the kernels round it, compiled for the host, so that tests can check
 * what the device computes against it bit for bit. */
uint16_t mgt_gpu_bf16_twin(float x);

#ifdef __cplusplus
}
#endif

#endif
