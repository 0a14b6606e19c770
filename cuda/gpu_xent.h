/* gpu_xent.h: fused softmax + cross-entropy on the GPU (gpu_xent.cu), the op table's entries. */
#ifndef MGT_GPU_XENT_H
#define MGT_GPU_XENT_H

#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_xent_sparse(mgt_backend *be, int n, int k, const float *logits, const int32_t *labels,
                         float *probs, float *dlogits, float scale, float smoothing, float *sums);
void mgt_gpu_xent_dense(mgt_backend *be, int n, int k, const float *logits, const float *targets,
                        float *probs, float *dlogits, float scale, float smoothing, float *sums);

#ifdef __cplusplus
}
#endif

#endif
