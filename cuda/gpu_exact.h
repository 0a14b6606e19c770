/* gpu_exact.h: the exact sums of --reproducible on the GPU (gpu_exact.cu): the op table's xs_add
 * and xs_round (backend.h), one thread per accumulator, with exactsum.h's arithmetic for one
 * accumulator (the host's source), so the words and the rounded floats are the CPU's bit for
 * bit. */
#ifndef MGT_GPU_EXACT_H
#define MGT_GPU_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void mgt_gpu_xs_add(mgt_backend *be, size_t n, const float *x, int64_t *words, int64_t *bad);
void mgt_gpu_xs_round(mgt_backend *be, size_t n, int64_t *words, float *out);

#ifdef __cplusplus
}
#endif

#endif
