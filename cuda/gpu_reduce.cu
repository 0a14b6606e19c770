/* gpu_reduce.cu: deterministic column sums (gpu_reduce.h), gpu_colsum.h's two passes on a
 * matrix's columns: 16-byte loads where the width and the pointer allow, a double partial per
 * chunk of rows added in a fixed tree. */
#include "gpu_colsum.h"

extern "C" {

void mgt_k_colreduce(cudaStream_t st, const mgt_gpu_part *part, int mode, size_t esize, size_t rows,
                     int cols, const void *a, float *out1, float *out2) {
    if (cols <= 0)
        return;
    const bool sq = mode == MGT_RED_SUMSQ;
    if (esize == 2 && sq)
        colsum_matrix<bf16, true>(st, part, rows, cols, (const bf16 *)a, out1, out2);
    else if (esize == 2)
        colsum_matrix<bf16, false>(st, part, rows, cols, (const bf16 *)a, out1, nullptr);
    else if (sq)
        colsum_matrix<float, true>(st, part, rows, cols, (const float *)a, out1, out2);
    else
        colsum_matrix<float, false>(st, part, rows, cols, (const float *)a, out1, nullptr);
}

} /* extern "C" */
