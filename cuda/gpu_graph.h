/* gpu_graph.h: the ops graph models add, on the GPU (gpu_graph.cu, gpu_depthwise.cu): residual
 * sums, concatenation's column copies, zero padding, global average pooling and depthwise
 * convolution. The op table's entries; each follows its twin in src/cpu/cpu_graph.c or
 * cpu_depthwise.c. */
#ifndef MGT_GPU_GRAPH_H
#define MGT_GPU_GRAPH_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gpu_graph.cu */
void mgt_gpu_add2(mgt_backend *be, size_t count, const float *a, const float *b, float *y);
void mgt_gpu_copy_cols(mgt_backend *be, size_t rows, int width, const float *src, int src_ld,
                       float *dst, int dst_ld, int accumulate);
void mgt_gpu_pad_fwd(mgt_backend *be, const mgt_pad_shape *s, const float *x, float *y);
void mgt_gpu_pad_bwd(mgt_backend *be, const mgt_pad_shape *s, const float *dy, float *dx);
void mgt_gpu_gap_fwd(mgt_backend *be, int n, int hw, int c, const float *x, float *y);
void mgt_gpu_gap_bwd(mgt_backend *be, int n, int hw, int c, const float *dy, float *dx);

/* gpu_depthwise.cu */
size_t mgt_gpu_dwconv_scratch(mgt_backend *be, const mgt_conv_shape *s);
void mgt_gpu_dwconv_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y);
void mgt_gpu_dwconv_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db);

#ifdef __cplusplus
}
#endif

#endif
