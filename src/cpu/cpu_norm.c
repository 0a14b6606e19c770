/* cpu_norm.c: batch normalisation over `rows` rows of c channels (rows = n*h*w for NHWC).
 *
 * Training splits the work so that ranks can combine statistics between the steps:
 *   bn_stats (per-rank sums) -> [allreduce] -> bn_finalize (mean, invstd, running stats)
 *   -> bn_apply;  backward: bn_bwd_reduce (per-rank dgamma, dbeta) -> [allreduce]
 *   -> bn_bwd_apply (dx, with `count` = rows over all ranks).
 * Per-channel sums accumulate in double: a channel may sum hundreds of thousands of rows.
 * The double accumulators live on the stack in blocks of channels (ops do not allocate); each
 * row's block is still read contiguously. gamma == NULL means 1 and beta == NULL means 0
 * (layers without scale / centre). */
#include <math.h>
#include <string.h>

#include "bn_math.h"
#include "cpu_internal.h"

enum { BN_BLOCK = 128 }; /* channels per block of stack accumulators */

MGT_SIMD
void mgt_cpu_bn_stats(mgt_backend *be, int rows, int c, const float *x, float *sum, float *sumsq) {
    (void)be;
    double s1[BN_BLOCK], s2[BN_BLOCK];
    for (int c0 = 0; c0 < c; c0 += BN_BLOCK) {
        const int nc = c - c0 < BN_BLOCK ? c - c0 : BN_BLOCK;
        for (int j = 0; j < nc; j++)
            s1[j] = s2[j] = 0.0;
        for (int r = 0; r < rows; r++) {
            const float *restrict xr = x + (size_t)r * c + c0;
            for (int j = 0; j < nc; j++) {
                const double v = xr[j];
                s1[j] += v;
                s2[j] += v * v;
            }
        }
        for (int j = 0; j < nc; j++) {
            sum[c0 + j] = (float)s1[j];
            sumsq[c0 + j] = (float)s2[j];
        }
    }
}

MGT_SIMD
void mgt_cpu_bn_apply(mgt_backend *be, int rows, int c, const float *x, const float *mean,
                      const float *invstd, const float *gamma, const float *beta, float *y) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * c;
        float *restrict yr = y + (size_t)r * c;
        for (int j = 0; j < c; j++) {
            const float g = gamma ? gamma[j] : 1.0f, b = beta ? beta[j] : 0.0f;
            yr[j] = (xr[j] - mean[j]) * (invstd[j] * g) + b;
        }
    }
}

/* The arithmetic is bn_math.h's, shared with the GPU kernel. */
void mgt_cpu_bn_finalize(mgt_backend *be, int c, float count, const float *sum, const float *sumsq,
                         float eps, float momentum, float *mean, float *invstd, float *running_mean,
                         float *running_var) {
    (void)be;
    for (int j = 0; j < c; j++)
        mgt_bn_finalize_channel(count, sum[j], sumsq[j], eps, momentum, &mean[j], &invstd[j],
                                running_mean ? &running_mean[j] : NULL,
                                running_var ? &running_var[j] : NULL);
}

void mgt_cpu_bn_running(mgt_backend *be, int c, float eps, const float *running_mean,
                        const float *running_var, float *mean, float *invstd) {
    (void)be;
    for (int j = 0; j < c; j++) {
        mean[j] = running_mean[j];
        invstd[j] = (float)(1.0 / sqrt((double)running_var[j] + (double)eps));
    }
}

/* dbeta = sum dy; dgamma = sum dy * (x - mean) * invstd = invstd * sum dy * (x - mean). */
MGT_SIMD
void mgt_cpu_bn_bwd_reduce(mgt_backend *be, int rows, int c, const float *x, const float *dy,
                           const float *mean, const float *invstd, float *dgamma, float *dbeta) {
    (void)be;
    double sg[BN_BLOCK], sb[BN_BLOCK];
    for (int c0 = 0; c0 < c; c0 += BN_BLOCK) {
        const int nc = c - c0 < BN_BLOCK ? c - c0 : BN_BLOCK;
        for (int j = 0; j < nc; j++)
            sg[j] = sb[j] = 0.0;
        for (int r = 0; r < rows; r++) {
            const float *restrict xr = x + (size_t)r * c + c0;
            const float *restrict gr = dy + (size_t)r * c + c0;
            const float *restrict mr = mean + c0;
            for (int j = 0; j < nc; j++) {
                sb[j] += gr[j];
                sg[j] += (double)gr[j] * (xr[j] - mr[j]);
            }
        }
        for (int j = 0; j < nc; j++) {
            if (dgamma)
                dgamma[c0 + j] = (float)(sg[j] * invstd[c0 + j]);
            if (dbeta)
                dbeta[c0 + j] = (float)sb[j];
        }
    }
}

/* dx = gamma * invstd * (dy - (dbeta + xhat * dgamma) / count). */
MGT_SIMD
void mgt_cpu_bn_bwd_apply(mgt_backend *be, int rows, int c, float count, const float *x,
                          const float *dy, const float *mean, const float *invstd,
                          const float *gamma, const float *dgamma, const float *dbeta, float *dx) {
    (void)be;
    if (!dx)
        return;
    const float inv_count = count > 0.0f ? 1.0f / count : 0.0f;
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * c;
        const float *restrict gr = dy + (size_t)r * c;
        float *restrict dr = dx + (size_t)r * c;
        for (int j = 0; j < c; j++) {
            const float is = invstd[j], g = gamma ? gamma[j] : 1.0f;
            const float xhat = (xr[j] - mean[j]) * is;
            dr[j] = g * is * (gr[j] - (dbeta[j] + xhat * dgamma[j]) * inv_count);
        }
    }
}
