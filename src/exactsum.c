/* exactsum.c: the fixed-point long accumulator (see exactsum.h): its loops over the
 * accumulators; one accumulator's arithmetic is in the header, shared with the GPU's kernels. */
#include "exactsum.h"

void mgt_xs_add(size_t n, const float *x, int64_t *words, int64_t *bad) {
    for (size_t i = 0; i < n; i++)
        *bad += mgt_xs_add_one(x[i], words + i * MGT_XS_WORDS);
}

void mgt_xs_round(size_t n, int64_t *words, float *out) {
    for (size_t i = 0; i < n; i++)
        out[i] = mgt_xs_round_one(words + i * MGT_XS_WORDS);
}
