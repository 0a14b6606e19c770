/* cpu_optim.c: one optimizer step over the whole flat parameter arena (Keras' formulas).
 *
 * g holds the SUM of per-sample gradients over the global batch, so the gradient each rule
 * uses is gt = g * scale + wd * w (scale = 1 / global batch, wd = L2 coefficient, w taken before
 * the update). Each loop is a single streaming pass the compiler vectorises. */
#include <math.h>

#include "cpu_internal.h"

/* Plain:     w -= lr * gt                                  (momentum == 0; vel unused)
 * Momentum:  v = momentum * v - lr * gt;  w += v
 * Nesterov:  v as above;  w += momentum * v - lr * gt      (with the new v) */
void mgt_cpu_sgd_step(mgt_backend *be, size_t count, float *w, const float *g, float *vel, float lr,
                      float momentum, int nesterov, float wd, float scale) {
    (void)be;
    float *restrict wp = w;
    const float *restrict gp = g;
    if (momentum == 0.0f || !vel) {
        for (size_t i = 0; i < count; i++) {
            const float gt = gp[i] * scale + wd * wp[i];
            wp[i] -= lr * gt;
        }
        return;
    }
    float *restrict vp = vel;
    if (nesterov) {
        for (size_t i = 0; i < count; i++) {
            const float gt = gp[i] * scale + wd * wp[i];
            const float v = momentum * vp[i] - lr * gt;
            vp[i] = v;
            wp[i] += momentum * v - lr * gt;
        }
    } else {
        for (size_t i = 0; i < count; i++) {
            const float gt = gp[i] * scale + wd * wp[i];
            const float v = momentum * vp[i] - lr * gt;
            vp[i] = v;
            wp[i] += v;
        }
    }
}

/* ms = rho * ms + (1 - rho) * gt^2;  w -= lr * gt / sqrt(ms + eps)  (Keras: epsilon inside the
 * root; PyTorch puts it outside) */
void mgt_cpu_rmsprop_step(mgt_backend *be, size_t count, float *w, const float *g, float *ms,
                          float lr, float rho, float eps, float wd, float scale) {
    (void)be;
    float *restrict wp = w, *restrict mp = ms;
    const float *restrict gp = g;
    for (size_t i = 0; i < count; i++) {
        const float gt = gp[i] * scale + wd * wp[i];
        const float m = rho * mp[i] + (1.0f - rho) * gt * gt;
        mp[i] = m;
        wp[i] -= lr * gt / sqrtf(m + eps);
    }
}

/* m = b1 * m + (1 - b1) * gt;  v = b2 * v + (1 - b2) * gt^2;  w -= lr_t * m / (sqrt(v) + eps),
 * lr_t carrying the bias correction (computed by the caller). */
void mgt_cpu_adam_step(mgt_backend *be, size_t count, float *w, const float *g, float *m, float *v,
                       float lr_t, float beta1, float beta2, float eps, float wd, float scale) {
    (void)be;
    float *restrict wp = w, *restrict mp = m, *restrict vp = v;
    const float *restrict gp = g;
    for (size_t i = 0; i < count; i++) {
        const float gt = gp[i] * scale + wd * wp[i];
        const float mi = beta1 * mp[i] + (1.0f - beta1) * gt;
        const float vi = beta2 * vp[i] + (1.0f - beta2) * gt * gt;
        mp[i] = mi;
        vp[i] = vi;
        wp[i] -= lr_t * mi / (sqrtf(vi) + eps);
    }
}
