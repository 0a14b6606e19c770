/* gpu_exact.cu: xs_add and xs_round for --reproducible (see gpu_exact.h). Accumulator i belongs
 * to thread i alone; the only shared word is the counter of values that cannot be held, which
 * takes integer atomic additions (their order cannot change an integer sum). */
#include "exactsum.h"
#include "gpu_launch.h"

namespace {

__global__ void k_xs_add(size_t n, const float *__restrict__ x, int64_t *__restrict__ words,
                         unsigned long long *bad) {
    GRID_STRIDE(i, n) {
        if (mgt_xs_add_one(x[i], words + i * MGT_XS_WORDS))
            atomicAdd(bad, 1ull);
    }
}

__global__ void k_xs_round(size_t n, int64_t *__restrict__ words, float *__restrict__ out) {
    GRID_STRIDE(i, n) {
        out[i] = mgt_xs_round_one(words + i * MGT_XS_WORDS);
    }
}

} /* namespace */

extern "C" {

void mgt_gpu_xs_add(mgt_backend *be, size_t n, const float *x, int64_t *words, int64_t *bad) {
    if (!n)
        return;
    static_assert(sizeof(int64_t) == sizeof(unsigned long long), "the counter's atomics");
    MGT_LAUNCH(k_xs_add, blocks_for(n), kThreads, mgt_gpu_stream(be), n, x, words,
               (unsigned long long *)bad);
}

void mgt_gpu_xs_round(mgt_backend *be, size_t n, int64_t *words, float *out) {
    if (!n)
        return;
    MGT_LAUNCH(k_xs_round, blocks_for(n), kThreads, mgt_gpu_stream(be), n, words, out);
    mgt_gpu_weights_written(mgt_gpu_impl_of(be), out, n * sizeof(float));
}

} /* extern "C" */
