/* gpu_weights.h: the weights as cuDNN and cuBLAS take them (gpu_weights.c): each convolution's
 * filter in KRSC (cuDNN's NHWC filter layout), in bfloat16 under --precision bf16, its input
 * channels padded with zeros to the tensor cores' multiple; each dense layer's W in bfloat16.
 * Kept beside the float weights and refreshed once after each update, not made again by every
 * convolution or product that reads them. */
#ifndef MGT_GPU_WEIGHTS_H
#define MGT_GPU_WEIGHTS_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mgt_gpu_impl;

/* The copy of the OIHW float weights w [oc][c][khkw] as [oc][khkw][cp] (channels c .. cp - 1
 * zero), bfloat16 where bf16, else float: made at its first use (its memory then allocated: never
 * during a stream capture, which instead fails, see gpu_weights.c) and brought up to date, on the
 * compute stream, where w has been written since it was last made. */
const void *mgt_gpu_weights_copy(mgt_backend *be, const float *w, int oc, int c, int cp, int khkw,
                                 int bf16);
/* [p, p + bytes) of device memory has been (or is being, in stream order) written: the copies of
 * weights there are out of date. */
void mgt_gpu_weights_written(struct mgt_gpu_impl *im, const void *p, size_t bytes);
/* Every copy out of date made again now, in one launch on the compute stream: after an
 * optimizer's update, and before a graph that reads them is replayed. */
void mgt_gpu_weights_refresh(struct mgt_gpu_impl *im);
/* [p, p + bytes) is freed: its copies go with it. */
void mgt_gpu_weights_forget(struct mgt_gpu_impl *im, const void *p, size_t bytes);
/* Every copy freed (the backend's destroy). */
void mgt_gpu_weights_free(struct mgt_gpu_impl *im);
/* The copies' count, and how many times they were brought up to date (for the tests). */
void mgt_gpu_weights_stats(const struct mgt_gpu_impl *im, int *copies, long long *refreshes);

#ifdef __cplusplus
}
#endif

#endif
