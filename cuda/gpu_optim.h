/* gpu_optim.h: optimizer steps on the GPU (gpu_optim.cu), the op table's optim_step. */
#ifndef MGT_GPU_OPTIM_H
#define MGT_GPU_OPTIM_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_optim_step(mgt_backend *be, mgt_opt_kind kind, size_t count, float *w, const float *g,
                        float *const *slots, const mgt_opt_hyper *h);

#ifdef __cplusplus
}
#endif

#endif
