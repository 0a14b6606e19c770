/* optim_math.h: one element of each optimizer step (Keras' formulas), shared by the CPU backend's
 * loops and the GPU kernels (compiled for the device under nvcc) so both update alike.
 *
 * g is the element's SUM of per-sample gradients over the global batch; the rule uses
 * gt = g * scale + wd * w (scale = 1 / global batch, wd = L2 coefficient, w before the update). */
#ifndef MGT_OPTIM_MATH_H
#define MGT_OPTIM_MATH_H

#include <math.h>

#include "../util.h"

/* Plain:     w -= lr * gt                                  (vel == NULL)
 * Momentum:  v = momentum * v - lr * gt;  w += v
 * Nesterov:  v as above;  w += momentum * v - lr * gt      (with the new v) */
MGT_HD static inline void mgt_sgd_elem(float *w, float *vel, float g, float lr, float momentum,
                                       int nesterov, float wd, float scale) {
    const float gt = g * scale + wd * *w;
    if (!vel) {
        *w -= lr * gt;
        return;
    }
    const float v = momentum * *vel - lr * gt;
    *vel = v;
    *w += nesterov ? momentum * v - lr * gt : v;
}

/* ms = rho * ms + (1 - rho) * gt^2;  w -= lr * gt / sqrt(ms + eps)  (Keras: epsilon inside the
 * root; PyTorch puts it outside) */
MGT_HD static inline void mgt_rmsprop_elem(float *w, float *ms, float g, float lr, float rho,
                                           float eps, float wd, float scale) {
    const float gt = g * scale + wd * *w;
    const float m = rho * *ms + (1.0f - rho) * gt * gt;
    *ms = m;
    *w -= lr * gt / sqrtf(m + eps);
}

/* m = b1 * m + (1 - b1) * gt;  v = b2 * v + (1 - b2) * gt^2;  w -= lr_t * m / (sqrt(v) + eps),
 * lr_t carrying the bias correction (computed by the caller). */
MGT_HD static inline void mgt_adam_elem(float *w, float *m, float *v, float g, float lr_t,
                                        float beta1, float beta2, float eps, float wd,
                                        float scale) {
    const float gt = g * scale + wd * *w;
    const float mi = beta1 * *m + (1.0f - beta1) * gt;
    const float vi = beta2 * *v + (1.0f - beta2) * gt * gt;
    *m = mi;
    *v = vi;
    *w -= lr_t * mi / (sqrtf(vi) + eps);
}

#endif
