/* gpu_norm.h: batch normalisation on the GPU (gpu_norm.cu), with the residual sum and the ReLU of
 * a fusion group in the same passes; the op table's entries. */
#ifndef MGT_GPU_NORM_H
#define MGT_GPU_NORM_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_bn_stats(mgt_backend *be, int rows, int c, const float *x, float *sum, float *sumsq);
void mgt_gpu_bn_apply(mgt_backend *be, const mgt_bn_pass *p, float *y);
void mgt_gpu_bn_finalize(mgt_backend *be, int c, float count, const float *sum, const float *sumsq,
                         float eps, float momentum, const float *shift, float *mean, float *invstd,
                         float *running_mean, float *running_var);
void mgt_gpu_bn_running(mgt_backend *be, int c, float eps, const float *running_mean,
                        const float *running_var, float *mean, float *invstd);
void mgt_gpu_bn_bwd_reduce(mgt_backend *be, const mgt_bn_pass *p, const float *dy, float *dgamma,
                           float *dbeta);
void mgt_gpu_bn_bwd_apply(mgt_backend *be, const mgt_bn_pass *p, float count, const float *dy,
                          const float *dgamma, const float *dbeta, float *dx, float *dr,
                          int accumulate);

#ifdef __cplusplus
}
#endif

#endif
