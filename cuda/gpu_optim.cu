/* gpu_optim.cu: one optimizer step over the whole flat parameter arena per launch, one element
 * per thread. The kernel is made from each rule of cpu/optim_math.h (Keras' formulas), which the
 * CPU loops share, so adding an optimizer there adds its kernel here. After it, the weights'
 * copies for cuDNN and cuBLAS (gpu_weights.c) are made up to date, all in one launch. */
#include "cpu/optim_math.h"
#include "gpu_launch.h"

namespace {

typedef void (*rule_fn)(float *w, float *s0, float *s1, float g, const mgt_opt_hyper *h);

template <rule_fn RULE>
__global__ void k_optim(size_t count, float *__restrict__ w, const float *__restrict__ g,
                        float *__restrict__ s0, float *__restrict__ s1, mgt_opt_hyper h) {
    GRID_STRIDE(i, count) {
        RULE(&w[i], s0 ? &s0[i] : nullptr, s1 ? &s1[i] : nullptr, g[i], &h);
    }
}

} /* namespace */

extern "C" {

void mgt_gpu_optim_step(mgt_backend *be, mgt_opt_kind kind, size_t count, float *w, const float *g,
                        float *const *slots, const mgt_opt_hyper *h) {
    if (!count)
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    switch (kind) {
#define GPU_OPT_CASE(id, rule)                                                                     \
    case MGT_OPT_##id:                                                                             \
        MGT_LAUNCH(k_optim<rule>, blocks_for(count), kThreads, st, count, w, g, slots[0],          \
                   slots[1], *h);                                                                  \
        /* the weights' copies cuDNN and cuBLAS read, made up to date once, here */                \
        mgt_gpu_weights_written(im, w, count * sizeof(float));                                     \
        mgt_gpu_weights_refresh(im);                                                               \
        return;
        MGT_OPTIMIZERS(GPU_OPT_CASE)
#undef GPU_OPT_CASE
    case MGT_OPT_COUNT:
        break;
    }
    mgt_gpu_fail(MGT_GPU_CUDA, (int)cudaErrorInvalidValue, "optimizer step of an unknown kind",
                 __FILE__, __LINE__);
}

} /* extern "C" */
