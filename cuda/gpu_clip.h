/* gpu_clip.h: gradient clipping on the GPU (gpu_clip.cu), the op table's clip_value and
 * clip_norm (backend.h). */
#ifndef MGT_GPU_CLIP_H
#define MGT_GPU_CLIP_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_clip_value(mgt_backend *be, size_t n, float *g, float limit);
void mgt_gpu_clip_norm(mgt_backend *be, size_t n, float *g, double limit, double *work);

#ifdef __cplusplus
}
#endif

#endif
