/* gpu_data.h: batches made on the GPU (gpu_data.cu): synthetic samples generated from their ids,
 * and samples gathered from a byte dataset kept in device memory. The op table's synthetic and
 * gather_u8 (backend.h). */
#ifndef MGT_GPU_DATA_H
#define MGT_GPU_DATA_H

#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_synthetic(mgt_backend *be, int n, int64_t elems, int classes, uint64_t pixel_key,
                       uint64_t template_key, int64_t first, const int64_t *ids, float *x,
                       int32_t *labels, float *targets);
void mgt_gpu_gather_u8(mgt_backend *be, int n, int64_t elems, int classes, const uint8_t *pixels,
                       const uint8_t *labels, const int64_t *ids, float *x, int32_t *labels_out,
                       float *targets);

#ifdef __cplusplus
}
#endif

#endif
