/* gpu_conv.h: 2-D convolution on cuDNN (gpu_conv.c), the op table's entries. */
#ifndef MGT_GPU_CONV_H
#define MGT_GPU_CONV_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mgt_gpu_impl;

size_t mgt_gpu_conv2d_scratch(const mgt_conv_shape *s);
void mgt_gpu_conv2d_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y);
void mgt_gpu_conv2d_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db);
/* Frees the per-shape plans (the backend's destroy), saving the --algo-cache file first when
 * this run measured something new (rank 0). */
void mgt_gpu_conv_cache_free(struct mgt_gpu_impl *im);
/* The algorithm log for --profile: one line per shape and direction chosen so far (the algorithm,
 * its math type, workspace and determinism, and the candidates cuDNN refused before it).
 * snprintf's rule: at most n bytes (buf may be NULL when n == 0), returns the whole length. */
size_t mgt_gpu_conv_describe(struct mgt_gpu_impl *im, char *buf, size_t n);
/* The op table's describe_conv: one shape's algorithms, briefly (backend.h). */
size_t mgt_gpu_conv_describe_shape(mgt_backend *be, const mgt_conv_shape *s, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
