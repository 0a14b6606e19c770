/* gpu_norm.cu: batch normalisation (gpu_norm.h). The per-channel sums (statistics, dgamma and
 * dbeta) are gpu_reduce.cu's deterministic column sums; the per-channel finalize is bn_math.h's,
 * shared with the CPU. */
#include "cpu/bn_math.h"
#include "gpu_launch.h"

namespace {

__global__ void k_bn_apply(size_t total, int c, const float *__restrict__ x,
                           const float *__restrict__ mean, const float *__restrict__ invstd,
                           const float *__restrict__ gamma, const float *__restrict__ beta,
                           float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        const int j = (int)(i % c);
        const float g = gamma ? gamma[j] : 1.0f, b = beta ? beta[j] : 0.0f;
        y[i] = (x[i] - mean[j]) * (invstd[j] * g) + b;
    }
}

__global__ void k_bn_finalize(int c, float count, const float *__restrict__ sum,
                              const float *__restrict__ sumsq, float eps, float momentum,
                              float *__restrict__ mean, float *__restrict__ invstd,
                              float *__restrict__ running_mean, float *__restrict__ running_var) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < c)
        mgt_bn_finalize_channel(count, sum[j], sumsq[j], eps, momentum, &mean[j], &invstd[j],
                                running_mean ? &running_mean[j] : nullptr,
                                running_var ? &running_var[j] : nullptr);
}

__global__ void k_bn_running(int c, float eps, const float *__restrict__ running_mean,
                             const float *__restrict__ running_var, float *__restrict__ mean,
                             float *__restrict__ invstd) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    mean[j] = running_mean[j];
    invstd[j] = (float)(1.0 / sqrt((double)running_var[j] + (double)eps));
}

__global__ void k_bn_bwd_apply(size_t total, int c, float inv_count, const float *__restrict__ x,
                               const float *__restrict__ dy, const float *__restrict__ mean,
                               const float *__restrict__ invstd, const float *__restrict__ gamma,
                               const float *__restrict__ dgamma, const float *__restrict__ dbeta,
                               float *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        const int j = (int)(i % c);
        const float is = invstd[j], g = gamma ? gamma[j] : 1.0f;
        const float xhat = (x[i] - mean[j]) * is;
        dx[i] = g * is * (dy[i] - (dbeta[j] + xhat * dgamma[j]) * inv_count);
    }
}

} /* namespace */

extern "C" {

void mgt_gpu_bn_stats(mgt_backend *be, int rows, int c, const float *x, float *sum, float *sumsq) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    mgt_k_colreduce(im->stream, &im->part, MGT_RED_SUMSQ, (size_t)(rows > 0 ? rows : 0), c, x,
                    nullptr, nullptr, nullptr, sum, sumsq);
}

void mgt_gpu_bn_apply(mgt_backend *be, int rows, int c, const float *x, const float *mean,
                      const float *invstd, const float *gamma, const float *beta, float *y) {
    if (rows <= 0 || c <= 0)
        return;
    const size_t total = (size_t)rows * c;
    MGT_LAUNCH(k_bn_apply, blocks_for(total), kThreads, mgt_gpu_stream(be), total, c, x, mean,
               invstd, gamma, beta, y);
}

void mgt_gpu_bn_finalize(mgt_backend *be, int c, float count, const float *sum, const float *sumsq,
                         float eps, float momentum, float *mean, float *invstd, float *running_mean,
                         float *running_var) {
    if (c <= 0)
        return;
    MGT_LAUNCH(k_bn_finalize, (c + kThreads - 1) / kThreads, kThreads, mgt_gpu_stream(be), c, count,
               sum, sumsq, eps, momentum, mean, invstd, running_mean, running_var);
}

void mgt_gpu_bn_running(mgt_backend *be, int c, float eps, const float *running_mean,
                        const float *running_var, float *mean, float *invstd) {
    if (c <= 0)
        return;
    MGT_LAUNCH(k_bn_running, (c + kThreads - 1) / kThreads, kThreads, mgt_gpu_stream(be), c, eps,
               running_mean, running_var, mean, invstd);
}

void mgt_gpu_bn_bwd_reduce(mgt_backend *be, int rows, int c, const float *x, const float *dy,
                           const float *mean, const float *invstd, float *dgamma, float *dbeta) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!dgamma && !dbeta)
        return;
    mgt_k_colreduce(im->stream, &im->part, MGT_RED_BN_BWD, (size_t)(rows > 0 ? rows : 0), c, x, dy,
                    mean, invstd, dgamma, dbeta);
}

void mgt_gpu_bn_bwd_apply(mgt_backend *be, int rows, int c, float count, const float *x,
                          const float *dy, const float *mean, const float *invstd,
                          const float *gamma, const float *dgamma, const float *dbeta, float *dx) {
    if (rows <= 0 || c <= 0 || !dx)
        return;
    const float inv_count = count > 0.0f ? 1.0f / count : 0.0f;
    const size_t total = (size_t)rows * c;
    MGT_LAUNCH(k_bn_bwd_apply, blocks_for(total), kThreads, mgt_gpu_stream(be), total, c, inv_count,
               x, dy, mean, invstd, gamma, dgamma, dbeta, dx);
}

} /* extern "C" */
