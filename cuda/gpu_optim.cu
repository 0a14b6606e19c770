/* gpu_optim.cu: one optimizer step over the whole flat parameter arena per launch, one element
 * per thread, with cpu/optim_math.h's formulas (Keras'), which the CPU loops share. */
#include "cpu/optim_math.h"
#include "gpu_launch.h"

namespace {

__global__ void k_sgd(size_t count, float *__restrict__ w, const float *__restrict__ g,
                      float *__restrict__ vel, float lr, float momentum, int nesterov, float wd,
                      float scale) {
    GRID_STRIDE(i, count) {
        mgt_sgd_elem(&w[i], vel ? &vel[i] : nullptr, g[i], lr, momentum, nesterov, wd, scale);
    }
}

__global__ void k_rmsprop(size_t count, float *__restrict__ w, const float *__restrict__ g,
                          float *__restrict__ ms, float lr, float rho, float eps, float wd,
                          float scale) {
    GRID_STRIDE(i, count) {
        mgt_rmsprop_elem(&w[i], &ms[i], g[i], lr, rho, eps, wd, scale);
    }
}

__global__ void k_adam(size_t count, float *__restrict__ w, const float *__restrict__ g,
                       float *__restrict__ m, float *__restrict__ v, float lr_t, float beta1,
                       float beta2, float eps, float wd, float scale) {
    GRID_STRIDE(i, count) {
        mgt_adam_elem(&w[i], &m[i], &v[i], g[i], lr_t, beta1, beta2, eps, wd, scale);
    }
}

} /* namespace */

extern "C" {

void mgt_gpu_sgd_step(mgt_backend *be, size_t count, float *w, const float *g, float *vel, float lr,
                      float momentum, int nesterov, float wd, float scale) {
    if (!count)
        return;
    if (momentum == 0.0f)
        vel = nullptr; /* plain SGD: the velocity is not used (nor touched), as on the CPU */
    MGT_LAUNCH(k_sgd, blocks_for(count), kThreads, mgt_gpu_stream(be), count, w, g, vel, lr,
               momentum, nesterov, wd, scale);
}

void mgt_gpu_rmsprop_step(mgt_backend *be, size_t count, float *w, const float *g, float *ms,
                          float lr, float rho, float eps, float wd, float scale) {
    if (!count)
        return;
    MGT_LAUNCH(k_rmsprop, blocks_for(count), kThreads, mgt_gpu_stream(be), count, w, g, ms, lr, rho,
               eps, wd, scale);
}

void mgt_gpu_adam_step(mgt_backend *be, size_t count, float *w, const float *g, float *m, float *v,
                       float lr_t, float beta1, float beta2, float eps, float wd, float scale) {
    if (!count)
        return;
    MGT_LAUNCH(k_adam, blocks_for(count), kThreads, mgt_gpu_stream(be), count, w, g, m, v, lr_t,
               beta1, beta2, eps, wd, scale);
}

} /* extern "C" */
