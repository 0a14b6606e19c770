/* gpu_pool.h: max and average pooling on the GPU (gpu_pool.cu), the op table's entries. */
#ifndef MGT_GPU_POOL_H
#define MGT_GPU_POOL_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_maxpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y,
                         int32_t *argmax);
void mgt_gpu_maxpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy,
                         const int32_t *argmax, float *dx);
void mgt_gpu_avgpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y);
void mgt_gpu_avgpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy, float *dx);

#ifdef __cplusplus
}
#endif

#endif
