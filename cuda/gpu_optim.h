/* gpu_optim.h: optimizer steps on the GPU (gpu_optim.cu), the op table's entries. */
#ifndef MGT_GPU_OPTIM_H
#define MGT_GPU_OPTIM_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_sgd_step(mgt_backend *be, size_t count, float *w, const float *g, float *vel, float lr,
                      float momentum, int nesterov, float wd, float scale);
void mgt_gpu_rmsprop_step(mgt_backend *be, size_t count, float *w, const float *g, float *ms,
                          float lr, float rho, float eps, float wd, float scale);
void mgt_gpu_adam_step(mgt_backend *be, size_t count, float *w, const float *g, float *m, float *v,
                       float lr_t, float beta1, float beta2, float eps, float wd, float scale);

#ifdef __cplusplus
}
#endif

#endif
