/* gpu_elem.h: element- and row-wise ops on the GPU (gpu_elem.cu): activations (softmax
 * included), dropout, y += x; and the device RNG compiled for the host. */
#ifndef MGT_GPU_ELEM_H
#define MGT_GPU_ELEM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op table's add, dropout_fwd / dropout_bwd (the same map), act_fwd and act_bwd. */
void mgt_gpu_add(mgt_backend *be, size_t n, const float *x, float *y);
void mgt_gpu_dropout(mgt_backend *be, int n, int row, float rate, uint64_t key,
                     uint64_t first_sample, float *x);
void mgt_gpu_act_fwd(mgt_backend *be, mgt_act act, int n, int row, float *x);
void mgt_gpu_act_bwd(mgt_backend *be, mgt_act act, int n, int row, const float *y, float *dy);

/* The device RNG compiled for the host (the same source as the kernels use), so that a test on
 * any machine can check it against util.h bit for bit. */
uint64_t mgt_gpu_rand64_twin(uint64_t key, uint64_t counter);
float mgt_gpu_uniform_twin(uint64_t key, uint64_t counter);

#ifdef __cplusplus
}
#endif

#endif
