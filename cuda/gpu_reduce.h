/* gpu_reduce.h: deterministic column sums on the GPU (gpu_reduce.cu), for the biases' gradients
 * and batchnorm's statistics and gradients.
 *
 * Column sums over many rows are done in two passes: per-chunk partial sums in double, then a
 * fixed-order sum of the partials, so a result never depends on thread scheduling (no float
 * atomics). The partials live in two device arrays allocated once at init. */
#ifndef MGT_GPU_REDUCE_H
#define MGT_GPU_REDUCE_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reduction partials: two arrays of this many doubles. */
enum { MGT_GPU_PART_CAP = 1 << 16 };

typedef struct mgt_gpu_part {
    double *a, *b, *c; /* device, MGT_GPU_PART_CAP each */
} mgt_gpu_part;

/* Column reductions over a row-major [rows][cols] matrix, accumulated in double:
 *   SUM:    out1[j] = sum_r a[r][j]
 *   SUMSQ:  out1[j] = sum_r a[r][j], out2[j] = sum_r a[r][j]^2                  (bn_stats)
 *   BN_BWD: a = x, b = dy: out2[j] = sum dy (dbeta), out1[j] = invstd[j] * sum dy * (x - mean[j])
 *           (dgamma); either output may be NULL                            (bn_bwd_reduce)
 * rows == 0 writes zeros. On stream st. */
enum { MGT_RED_SUM = 0, MGT_RED_SUMSQ = 1, MGT_RED_BN_BWD = 2 };
void mgt_k_colreduce(cudaStream_t st, const mgt_gpu_part *part, int mode, size_t rows, int cols,
                     const float *a, const float *b, const float *mean, const float *invstd,
                     float *out1, float *out2);

#ifdef __cplusplus
}
#endif

#endif
