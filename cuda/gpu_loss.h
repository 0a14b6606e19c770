/* gpu_loss.h: the losses of float targets on the GPU (gpu_loss.cu), the op table's entry. */
#ifndef MGT_GPU_LOSS_H
#define MGT_GPU_LOSS_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_elem_loss(mgt_backend *be, const mgt_elem_loss *L, int n, int k, const float *y,
                       const float *t, float *probs, float *dy, float scale, float *sums);

#ifdef __cplusplus
}
#endif

#endif
