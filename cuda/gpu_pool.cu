/* gpu_pool.cu: max and average pooling over NHWC activations, valid windows (gpu_pool.h).
 *
 * As cpu_pool.c: windows scanned row by row, left to right, and the same NaN behaviour of the
 * comparisons. The backward passes GATHER into each input element, in the CPU's order, instead of
 * scattering: no atomics, and the same bits as the CPU's scatter-add. */
#include "gpu_launch.h"

namespace {

struct pool_dims {
    int h, w, c, size, stride, oh, ow;
};

__device__ inline void pool_out_pos(size_t o, const pool_dims &d, size_t &smp, int &oy, int &ox,
                                    int &ch) {
    ch = (int)(o % d.c);
    size_t t = o / d.c;
    ox = (int)(t % d.ow);
    t /= d.ow;
    oy = (int)(t % d.oh);
    smp = t / d.oh;
}

/* Window scanned row by row, left to right; only a strictly larger value replaces the current
 * one (ties go to the first, NaN never replaces): the CPU's rule. */
__global__ void k_maxpool_fwd(size_t total, pool_dims d, const float *__restrict__ x,
                              float *__restrict__ y, int32_t *__restrict__ argmax) {
    GRID_STRIDE(o, total) {
        size_t smp;
        int oy, ox, ch;
        pool_out_pos(o, d, smp, oy, ox, ch);
        const int iy0 = oy * d.stride, ix0 = ox * d.stride;
        float best = 0.0f;
        size_t best_at = 0;
        for (int i = 0; i < d.size; i++)
            for (int j = 0; j < d.size; j++) {
                const size_t in = ((smp * d.h + iy0 + i) * (size_t)d.w + ix0 + j) * d.c + ch;
                const float v = x[in];
                if ((i == 0 && j == 0) || v > best) {
                    best = v;
                    best_at = in;
                }
            }
        y[o] = best;
        argmax[o] = (int32_t)best_at;
    }
}

/* Outputs whose window covers input row iy: oy in [lo, hi]. */
__device__ inline void covering(int iy, int size, int stride, int oh, int &lo, int &hi) {
    lo = iy < size ? 0 : (iy - size) / stride + 1;
    hi = iy / stride;
    if (hi > oh - 1)
        hi = oh - 1;
}

/* Input element i (NHWC): its sample, channel, and the window of outputs that cover it. */
__device__ __forceinline__ void pool_in_window(size_t i, const pool_dims &d, size_t &smp, int &ch,
                                               int &ylo, int &yhi, int &xlo, int &xhi) {
    ch = (int)(i % d.c);
    size_t t = i / d.c;
    const int ix = (int)(t % d.w);
    t /= d.w;
    const int iy = (int)(t % d.h);
    smp = t / d.h;
    covering(iy, d.size, d.stride, d.oh, ylo, yhi);
    covering(ix, d.size, d.stride, d.ow, xlo, xhi);
}

/* Gather form of the CPU's scatter-add: each input element sums the dy of the outputs that
 * picked it, in ascending output order (the CPU's order), so the result is the same bits. */
__global__ void k_maxpool_bwd(size_t total, pool_dims d, const float *__restrict__ dy,
                              const int32_t *__restrict__ argmax, float *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        size_t smp;
        int ch, ylo, yhi, xlo, xhi;
        pool_in_window(i, d, smp, ch, ylo, yhi, xlo, xhi);
        float acc = 0.0f;
        for (int oy = ylo; oy <= yhi; oy++)
            for (int ox = xlo; ox <= xhi; ox++) {
                const size_t o = ((smp * d.oh + oy) * (size_t)d.ow + ox) * d.c + ch;
                if ((size_t)(uint32_t)argmax[o] == i)
                    acc += dy[o];
            }
        dx[i] = acc;
    }
}

__global__ void k_avgpool_fwd(size_t total, pool_dims d, float inv, const float *__restrict__ x,
                              float *__restrict__ y) {
    GRID_STRIDE(o, total) {
        size_t smp;
        int oy, ox, ch;
        pool_out_pos(o, d, smp, oy, ox, ch);
        const int iy0 = oy * d.stride, ix0 = ox * d.stride;
        float acc = 0.0f;
        for (int i = 0; i < d.size; i++)
            for (int j = 0; j < d.size; j++)
                acc += x[((smp * d.h + iy0 + i) * (size_t)d.w + ix0 + j) * d.c + ch];
        y[o] = acc * inv;
    }
}

__global__ void k_avgpool_bwd(size_t total, pool_dims d, float inv, const float *__restrict__ dy,
                              float *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        size_t smp;
        int ch, ylo, yhi, xlo, xhi;
        pool_in_window(i, d, smp, ch, ylo, yhi, xlo, xhi);
        float acc = 0.0f;
        for (int oy = ylo; oy <= yhi; oy++)
            for (int ox = xlo; ox <= xhi; ox++)
                acc += dy[((smp * d.oh + oy) * (size_t)d.ow + ox) * d.c + ch] * inv;
        dx[i] = acc;
    }
}

pool_dims dims_of(const mgt_pool_shape *s) {
    return pool_dims{s->h, s->w, s->c, s->size, s->stride, s->oh, s->ow};
}

size_t pool_in_count(const mgt_pool_shape *s) {
    return s->n > 0 ? (size_t)s->n * s->h * s->w * s->c : 0;
}

size_t pool_out_count(const mgt_pool_shape *s) {
    return s->n > 0 ? (size_t)s->n * s->oh * s->ow * s->c : 0;
}

} /* namespace */

extern "C" {

void mgt_gpu_maxpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y,
                         int32_t *argmax) {
    const size_t total = pool_out_count(s);
    if (!total)
        return;
    MGT_LAUNCH(k_maxpool_fwd, blocks_for(total), kThreads, mgt_gpu_stream(be), total, dims_of(s), x,
               y, argmax);
}

void mgt_gpu_maxpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy,
                         const int32_t *argmax, float *dx) {
    const size_t total = pool_in_count(s);
    if (!total || !dx)
        return;
    MGT_LAUNCH(k_maxpool_bwd, blocks_for(total), kThreads, mgt_gpu_stream(be), total, dims_of(s),
               dy, argmax, dx);
}

void mgt_gpu_avgpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y) {
    const size_t total = pool_out_count(s);
    if (!total)
        return;
    const float inv = 1.0f / (float)(s->size * s->size);
    MGT_LAUNCH(k_avgpool_fwd, blocks_for(total), kThreads, mgt_gpu_stream(be), total, dims_of(s),
               inv, x, y);
}

void mgt_gpu_avgpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy, float *dx) {
    const size_t total = pool_in_count(s);
    if (!total || !dx)
        return;
    const float inv = 1.0f / (float)(s->size * s->size);
    MGT_LAUNCH(k_avgpool_bwd, blocks_for(total), kThreads, mgt_gpu_stream(be), total, dims_of(s),
               inv, dy, dx);
}

} /* extern "C" */
