/* gpu_clip.cu: gradient clipping (gpu_clip.h), the twins of cpu_clip.c.
 *
 * The norm is three launches on the compute stream and no host wait: per-block sums of squares
 * in double into the backend's reduction partials (a grid whose size depends on n alone, each
 * thread's elements in a fixed order, a fixed tree in each block), one block adding the
 * partials in a fixed order and storing S and the scale limit / sqrt(S) (or 1) in work, and a
 * pass that scales the gradient by the scale read from device memory, skipping the writes when
 * it is 1. No float atomics: the same bits on every run. A float times a float is exact in
 * double, so a fused multiply-add changes nothing. The order differs from the CPU's 8 lanes, so
 * S agrees with the CPU's to double rounding, not bit for bit. */
#include "gpu_launch.h"

namespace {

constexpr int kMaxBlocks = 1024;

/* Blocks of kThreads that stride over n floats, 8 or more each: a function of n alone. */
unsigned norm_blocks(size_t n) {
    const size_t b = (n + (size_t)kThreads * 8 - 1) / ((size_t)kThreads * 8);
    return (unsigned)(b < 1 ? 1 : b > (size_t)kMaxBlocks ? kMaxBlocks : b);
}

/* The fixed-order tree over a block's kThreads values in shared memory; thread 0 gets the sum. */
__device__ double block_sum(double *sh, double v) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

__global__ void k_sumsq_part(size_t n, const float *__restrict__ g, double *__restrict__ part) {
    __shared__ double sh[kThreads];
    double acc = 0.0;
    GRID_STRIDE(i, n) {
        const double v = g[i];
        acc += v * v;
    }
    const double s = block_sum(sh, acc);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

__global__ void k_sumsq_final(int nparts, const double *__restrict__ part, double limit,
                              double *__restrict__ work) {
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += kThreads)
        acc += part[i];
    const double s = block_sum(sh, acc);
    if (threadIdx.x == 0) {
        const double norm = sqrt(s);
        work[0] = s;
        /* false for NaN: a broken gradient reaches the loss check unchanged (as on the CPU) */
        work[1] = norm > limit ? (double)(float)(limit / norm) : 1.0;
    }
}

__global__ void k_scale(size_t n, float *__restrict__ g, const double *__restrict__ work) {
    const double f = work[1];
    if (f == 1.0)
        return;
    const float ff = (float)f;
    GRID_STRIDE(i, n) {
        g[i] *= ff;
    }
}

/* Comparisons, not fminf/fmaxf, which would turn a NaN into the limit. */
__global__ void k_clip_value(size_t n, float *__restrict__ g, float limit) {
    GRID_STRIDE(i, n) {
        const float v = g[i];
        g[i] = v > limit ? limit : v < -limit ? -limit : v;
    }
}

} /* namespace */

extern "C" {

void mgt_gpu_clip_value(mgt_backend *be, size_t n, float *g, float limit) {
    if (!n)
        return;
    MGT_LAUNCH(k_clip_value, blocks_for(n), kThreads, mgt_gpu_stream(be), n, g, limit);
}

void mgt_gpu_clip_norm(mgt_backend *be, size_t n, float *g, double limit, double *work) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const unsigned blocks = norm_blocks(n);
    MGT_LAUNCH(k_sumsq_part, blocks, kThreads, im->stream, n, g, im->part.a);
    MGT_LAUNCH(k_sumsq_final, 1, kThreads, im->stream, (int)blocks, im->part.a, limit, work);
    if (n)
        MGT_LAUNCH(k_scale, blocks_for(n), kThreads, im->stream, n, g, work);
}

} /* extern "C" */
