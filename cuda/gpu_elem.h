/* gpu_elem.h: element- and row-wise ops on the GPU (gpu_elem.cu): activations (softmax
 * included), dropout, y += x; and the device RNG compiled for the host. */
#ifndef MGT_GPU_ELEM_H
#define MGT_GPU_ELEM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op table's add (float: metric sums), dropout_fwd / dropout_bwd (the same map), act_fwd and
 * act_bwd (activations of the backend's type). */
void mgt_gpu_add(mgt_backend *be, size_t n, const float *x, float *y);
void mgt_gpu_dropout(mgt_backend *be, int n, int row, float rate, uint64_t key,
                     uint64_t first_sample, float *x);
void mgt_gpu_act_fwd(mgt_backend *be, mgt_act act, int n, int row, const float *x, float *y);
void mgt_gpu_act_bwd(mgt_backend *be, mgt_act act, int n, int row, const float *y, const float *dy,
                     float *dx, int accumulate);

/* Softmax of each of n rows of `row` float32 values (y may be x), on stream st: act_fwd's, for
 * float data on a backend whose activations are bfloat16 (the model's float output). */
void mgt_k_softmax_f32(cudaStream_t st, int n, int row, const float *x, float *y);

/* The device RNG compiled for the host (the same source as the kernels use), so that a test on
 * any machine can check it against util.h bit for bit. */
uint64_t mgt_gpu_rand64_twin(uint64_t key, uint64_t counter);
float mgt_gpu_uniform_twin(uint64_t key, uint64_t counter);

#ifdef __cplusplus
}
#endif

#endif
