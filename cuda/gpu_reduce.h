/* gpu_reduce.h: deterministic column sums on the GPU (gpu_reduce.cu), for the biases' gradients
 * and batchnorm's statistics and gradients.
 *
 * Column sums over many rows are done in two passes: per-chunk partial sums in double, then a
 * fixed tree over the partials (gpu_colsum.h), so a result never depends on thread scheduling
 * (no float atomics). The partials live in two device arrays allocated once at init. */
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

/* Column reductions over a row-major [rows][cols] matrix of esize-byte values (4: float, 2:
 * bfloat16), accumulated in double:
 *   SUM:    out1[j] = sum_r a[r][j]                                    (bias gradients)
 *   SUMSQ:  out1[j] = sum_r a[r][j], out2[j] = sum_r a[r][j]^2          (bn_stats)
 * rows == 0 writes zeros. On stream st. (Batchnorm's parameter gradients, whose terms need its
 * statistics, are gpu_norm.cu's, on the same two passes: gpu_colsum.h.) */
enum { MGT_RED_SUM = 0, MGT_RED_SUMSQ = 1 };
void mgt_k_colreduce(cudaStream_t st, const mgt_gpu_part *part, int mode, size_t esize, size_t rows,
                     int cols, const void *a, float *out1, float *out2);

#ifdef __cplusplus
}
#endif

#endif
