/* bn_math.h: one channel of batchnorm's finalize step, shared by the CPU backend and the GPU
 * kernel (compiled for the device under nvcc) so both compute the same statistics.
 *
 * Biased variance from the sums (var = E[x^2] - mean^2, clamped at 0 against rounding), and
 * Keras' running update running = momentum * running + (1 - momentum) * batch. With no rows
 * anywhere (count 0) the statistics are neutral and the running ones are left alone. shift: a
 * constant the sums left out (a cancelled convolution bias, backend.h's bn_finalize), added to
 * the batch mean that enters the running mean only (0: none, the same bits as without). */
#ifndef MGT_BN_MATH_H
#define MGT_BN_MATH_H

#include <math.h>

#include "../util.h"

MGT_HD static inline void mgt_bn_finalize_channel(float count, float sum, float sumsq, float eps,
                                                  float momentum, float shift, float *mean,
                                                  float *invstd, float *running_mean,
                                                  float *running_var) {
    if (!(count > 0.0f)) {
        *mean = 0.0f;
        *invstd = (float)(1.0 / sqrt((double)eps));
        return;
    }
    const double m = (double)sum / count;
    double var = (double)sumsq / count - m * m;
    if (var < 0.0)
        var = 0.0;
    *mean = (float)m;
    *invstd = (float)(1.0 / sqrt(var + (double)eps));
    if (running_mean)
        *running_mean = (float)(momentum * (double)*running_mean +
                                (1.0 - momentum) * (shift != 0.0f ? m + (double)shift : m));
    if (running_var)
        *running_var = (float)(momentum * (double)*running_var + (1.0 - momentum) * var);
}

#endif
