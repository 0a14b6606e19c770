/* cpu_optim.c: one optimizer step over the whole flat parameter arena, each element updated by
 * optim_math.h's formulas (Keras'), which the GPU kernels share. Each loop is a single streaming
 * pass the compiler vectorises. */
#include <math.h>

#include "cpu_internal.h"
#include "optim_math.h"

/* The loops are split by case (no momentum, Nesterov, plain momentum) so each is a branch-free
 * streaming pass. */
void mgt_cpu_sgd_step(mgt_backend *be, size_t count, float *w, const float *g, float *vel, float lr,
                      float momentum, int nesterov, float wd, float scale) {
    (void)be;
    float *restrict wp = w;
    const float *restrict gp = g;
    if (momentum == 0.0f || !vel) {
        for (size_t i = 0; i < count; i++)
            mgt_sgd_elem(&wp[i], NULL, gp[i], lr, momentum, 0, wd, scale);
        return;
    }
    float *restrict vp = vel;
    if (nesterov) {
        for (size_t i = 0; i < count; i++)
            mgt_sgd_elem(&wp[i], &vp[i], gp[i], lr, momentum, 1, wd, scale);
    } else {
        for (size_t i = 0; i < count; i++)
            mgt_sgd_elem(&wp[i], &vp[i], gp[i], lr, momentum, 0, wd, scale);
    }
}

void mgt_cpu_rmsprop_step(mgt_backend *be, size_t count, float *w, const float *g, float *ms,
                          float lr, float rho, float eps, float wd, float scale) {
    (void)be;
    float *restrict wp = w, *restrict mp = ms;
    const float *restrict gp = g;
    for (size_t i = 0; i < count; i++)
        mgt_rmsprop_elem(&wp[i], &mp[i], gp[i], lr, rho, eps, wd, scale);
}

void mgt_cpu_adam_step(mgt_backend *be, size_t count, float *w, const float *g, float *m, float *v,
                       float lr_t, float beta1, float beta2, float eps, float wd, float scale) {
    (void)be;
    float *restrict wp = w, *restrict mp = m, *restrict vp = v;
    const float *restrict gp = g;
    for (size_t i = 0; i < count; i++)
        mgt_adam_elem(&wp[i], &mp[i], &vp[i], gp[i], lr_t, beta1, beta2, eps, wd, scale);
}
