/* gpu_pool.cu: max and average pooling over NHWC activations (gpu_pool.h): valid windows, or
 * TensorFlow's "same" padding, whose border windows leave out the positions outside the input.
 *
 * As cpu_pool.c: windows scanned row by row, left to right, the same NaN behaviour of the
 * comparisons, and an average's divisor the count of its window's input positions. The backward
 * passes GATHER into each input element, in the CPU's order, instead of scattering: no atomics, and
 * the same bits as the CPU's scatter-add. Activations of either type (backend.h: float, or
 * bfloat16 with --precision bf16), read widened, computed in float, stored rounded once. */
#include "gpu_launch.h"
#include "gpu_vec.h"

namespace {

struct pool_dims {
    int h, w, c, size, stride, oh, ow, pt, pl;
};

/* The part of output (oy, ox)'s window inside the input: rows y0..y1-1, columns x0..x1-1. */
struct pool_win {
    int y0, y1, x0, x1;
};

__device__ inline pool_win window_of(const pool_dims &d, int oy, int ox) {
    const int iy = oy * d.stride - d.pt, ix = ox * d.stride - d.pl;
    pool_win w{iy < 0 ? 0 : iy, iy + d.size, ix < 0 ? 0 : ix, ix + d.size};
    w.y1 = w.y1 > d.h ? d.h : w.y1;
    w.x1 = w.x1 > d.w ? d.w : w.x1;
    return w;
}

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
template <class T>
__global__ void k_maxpool_fwd(size_t total, pool_dims d, const T *__restrict__ x, T *__restrict__ y,
                              int32_t *__restrict__ argmax) {
    GRID_STRIDE(o, total) {
        size_t smp;
        int oy, ox, ch;
        pool_out_pos(o, d, smp, oy, ox, ch);
        const pool_win win = window_of(d, oy, ox);
        float best = 0.0f;
        size_t best_at = 0;
        for (int iy = win.y0; iy < win.y1; iy++)
            for (int ix = win.x0; ix < win.x1; ix++) {
                const size_t in = ((smp * d.h + iy) * (size_t)d.w + ix) * d.c + ch;
                const float v = widen(x[in]);
                if ((iy == win.y0 && ix == win.x0) || v > best) {
                    best = v;
                    best_at = in;
                }
            }
        y[o] = narrow<T>(best);
        argmax[o] = (int32_t)best_at;
    }
}

/* Outputs whose window covers input row iy (padded row iy + pad): oy in [lo, hi]. */
__device__ inline void covering(int iy, int pad, int size, int stride, int oh, int &lo, int &hi) {
    const int py = iy + pad;
    lo = py < size ? 0 : (py - size) / stride + 1;
    hi = py / stride;
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
    covering(iy, d.pt, d.size, d.stride, d.oh, ylo, yhi);
    covering(ix, d.pl, d.size, d.stride, d.ow, xlo, xhi);
}

/* Gather form of the CPU's scatter-add: each input element sums the dy of the outputs that
 * picked it, in ascending output order (the CPU's order), so the result is the same bits. */
template <class T>
__global__ void k_maxpool_bwd(size_t total, pool_dims d, const T *__restrict__ dy,
                              const int32_t *__restrict__ argmax, T *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        size_t smp;
        int ch, ylo, yhi, xlo, xhi;
        pool_in_window(i, d, smp, ch, ylo, yhi, xlo, xhi);
        float acc = 0.0f;
        for (int oy = ylo; oy <= yhi; oy++)
            for (int ox = xlo; ox <= xhi; ox++) {
                const size_t o = ((smp * d.oh + oy) * (size_t)d.ow + ox) * d.c + ch;
                if ((size_t)(uint32_t)argmax[o] == i)
                    acc += widen(dy[o]);
            }
        dx[i] = narrow<T>(acc);
    }
}

/* 1 / the count of the window's input positions, computed as the CPU does. */
__device__ inline float window_inv(const pool_win &w) {
    return 1.0f / (float)((w.y1 - w.y0) * (w.x1 - w.x0));
}

template <class T>
__global__ void k_avgpool_fwd(size_t total, pool_dims d, const T *__restrict__ x,
                              T *__restrict__ y) {
    GRID_STRIDE(o, total) {
        size_t smp;
        int oy, ox, ch;
        pool_out_pos(o, d, smp, oy, ox, ch);
        const pool_win win = window_of(d, oy, ox);
        float acc = 0.0f;
        for (int iy = win.y0; iy < win.y1; iy++)
            for (int ix = win.x0; ix < win.x1; ix++)
                acc += widen(x[((smp * d.h + iy) * (size_t)d.w + ix) * d.c + ch]);
        y[o] = narrow<T>(acc * window_inv(win));
    }
}

template <class T>
__global__ void k_avgpool_bwd(size_t total, pool_dims d, const T *__restrict__ dy,
                              T *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        size_t smp;
        int ch, ylo, yhi, xlo, xhi;
        pool_in_window(i, d, smp, ch, ylo, yhi, xlo, xhi);
        float acc = 0.0f;
        for (int oy = ylo; oy <= yhi; oy++)
            for (int ox = xlo; ox <= xhi; ox++)
                acc += widen(dy[((smp * d.oh + oy) * (size_t)d.ow + ox) * d.c + ch]) *
                       window_inv(window_of(d, oy, ox));
        dx[i] = narrow<T>(acc);
    }
}

pool_dims dims_of(const mgt_pool_shape *s) {
    return pool_dims{s->h, s->w, s->c, s->size, s->stride, s->oh, s->ow, s->pad_top, s->pad_left};
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
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_maxpool_fwd<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total,
                   dims_of(s), (const T *)x, (T *)y, argmax);
    });
}

void mgt_gpu_maxpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy,
                         const int32_t *argmax, float *dx) {
    const size_t total = pool_in_count(s);
    if (!total || !dx)
        return;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_maxpool_bwd<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total,
                   dims_of(s), (const T *)dy, argmax, (T *)dx);
    });
}

void mgt_gpu_avgpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y) {
    const size_t total = pool_out_count(s);
    if (!total)
        return;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_avgpool_fwd<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total,
                   dims_of(s), (const T *)x, (T *)y);
    });
}

void mgt_gpu_avgpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy, float *dx) {
    const size_t total = pool_in_count(s);
    if (!total || !dx)
        return;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_avgpool_bwd<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total,
                   dims_of(s), (const T *)dy, (T *)dx);
    });
}

} /* extern "C" */
