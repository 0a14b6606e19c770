/* gpu_graph.cu: residual sums, concatenation's column copies, zero padding and global average
 * pooling (gpu_graph.h). Memory-bound kernels, one thread per element written, consecutive
 * threads on consecutive addresses. Global average pooling sums in double in the CPU's order (one
 * thread per sample and channel, positions in order), so its result is the CPU's to the bit.
 * Activations of either type (backend.h), computed in float, stored rounded once. */
#include "gpu_launch.h"
#include "gpu_vec.h"

namespace {

/* No __restrict__: y may be a or b. */
template <class T> __global__ void k_add2(size_t n, const T *a, const T *b, T *y) {
    GRID_STRIDE(i, n) {
        y[i] = narrow<T>(widen(a[i]) + widen(b[i]));
    }
}

template <class T>
__global__ void k_copy_cols(size_t total, int width, const T *__restrict__ src, int src_ld,
                            T *__restrict__ dst, int dst_ld, int accumulate) {
    GRID_STRIDE(i, total) {
        const size_t r = i / (size_t)width, j = i % (size_t)width;
        const T v = src[r * (size_t)src_ld + j];
        T *d = dst + r * (size_t)dst_ld + j;
        *d = accumulate ? narrow<T>(widen(*d) + widen(v)) : v;
    }
}

template <class T>
__global__ void k_gap_fwd(size_t total, int hw, int c, float inv, const T *__restrict__ x,
                          T *__restrict__ y) {
    GRID_STRIDE(i, total) {
        const size_t smp = i / (size_t)c, ch = i % (size_t)c;
        const T *xs = x + smp * (size_t)hw * c + ch;
        double acc = 0.0;
        for (int p = 0; p < hw; p++)
            acc += widen(xs[(size_t)p * c]);
        y[i] = narrow<T>((float)acc * inv); /* the CPU's: the sum rounded, then scaled in float */
    }
}

template <class T>
__global__ void k_gap_bwd(size_t total, int hw, int c, float inv, const T *__restrict__ dy,
                          T *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        const size_t ch = i % (size_t)c, smp = i / ((size_t)c * hw);
        dx[i] = narrow<T>(widen(dy[smp * c + ch]) * inv);
    }
}

} /* namespace */

extern "C" {

void mgt_gpu_add2(mgt_backend *be, size_t count, const float *a, const float *b, float *y) {
    if (!count)
        return;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_add2<T>, blocks_for(count), kThreads, mgt_gpu_stream(be), count, (const T *)a,
                   (const T *)b, (T *)y);
    });
}

void mgt_gpu_copy_cols(mgt_backend *be, size_t rows, int width, const float *src, int src_ld,
                       float *dst, int dst_ld, int accumulate) {
    const size_t total = rows * (size_t)(width > 0 ? width : 0);
    if (!total)
        return;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_copy_cols<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total, width,
                   (const T *)src, src_ld, (T *)dst, dst_ld, accumulate);
    });
}

/* The convolutions' explicit padding kernels (gpu_layout.cu) do exactly this. */
void mgt_gpu_pad_fwd(mgt_backend *be, const mgt_pad_shape *s, const float *x, float *y) {
    mgt_k_pad_nhwc(mgt_gpu_stream(be), mgt_dtype_size(be->act), s->n, s->h, s->w, s->c, s->c,
                   s->h + s->top + s->bottom, s->w + s->left + s->right, s->top, s->left, x, y);
}

void mgt_gpu_pad_bwd(mgt_backend *be, const mgt_pad_shape *s, const float *dy, float *dx) {
    if (!dx)
        return;
    mgt_k_crop_nhwc(mgt_gpu_stream(be), mgt_dtype_size(be->act), s->n, s->h, s->w, s->c, s->c,
                    s->h + s->top + s->bottom, s->w + s->left + s->right, s->top, s->left, dy, dx);
}

void mgt_gpu_gap_fwd(mgt_backend *be, int n, int hw, int c, const float *x, float *y) {
    const size_t total = n > 0 && c > 0 ? (size_t)n * c : 0;
    if (!total)
        return;
    const float inv = 1.0f / (float)(hw > 0 ? hw : 1);
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_gap_fwd<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total, hw, c, inv,
                   (const T *)x, (T *)y);
    });
}

void mgt_gpu_gap_bwd(mgt_backend *be, int n, int hw, int c, const float *dy, float *dx) {
    const size_t total = n > 0 && c > 0 && hw > 0 ? (size_t)n * hw * c : 0;
    if (!total || !dx)
        return;
    const float inv = 1.0f / (float)hw;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_gap_bwd<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total, hw, c, inv,
                   (const T *)dy, (T *)dx);
    });
}

} /* extern "C" */
