/* cpu_graph.c: the ops graph models add to a layer list: the residual sum, concatenation along
 * the channels (a strided column copy, both ways), zero padding and its adjoint, and global
 * average pooling.
 *
 * All of them are memory-bound: each loop streams its rows once with the channel index innermost
 * (NHWC), so the compiler vectorises it (MGT_SIMD builds an AVX2 copy too). Global average pooling
 * sums in double, as the other reductions of this backend do. */
#include <string.h>

#include "cpu_internal.h"

MGT_SIMD
void mgt_cpu_add2(mgt_backend *be, size_t count, const float *a, const float *b, float *y) {
    (void)be;
    /* No restrict: y may be a or b, and element i reads only a[i] and b[i] before writing y[i]. */
    for (size_t i = 0; i < count; i++)
        y[i] = a[i] + b[i];
}

MGT_SIMD
void mgt_cpu_copy_cols(mgt_backend *be, size_t rows, int width, const float *src, int src_ld,
                       float *dst, int dst_ld, int accumulate) {
    (void)be;
    if (width <= 0)
        return;
    for (size_t r = 0; r < rows; r++) {
        const float *restrict s = src + r * (size_t)src_ld;
        float *restrict d = dst + r * (size_t)dst_ld;
        if (accumulate)
            for (int j = 0; j < width; j++)
                d[j] += s[j];
        else
            memcpy(d, s, sizeof(float) * (size_t)width);
    }
}

/* One padded row of y: zeros, or the row of x between `left` and `right` zeros. */
void mgt_cpu_pad_fwd(mgt_backend *be, const mgt_pad_shape *s, const float *x, float *y) {
    (void)be;
    const int hp = s->h + s->top + s->bottom, wp = s->w + s->left + s->right;
    const size_t c = (size_t)s->c, row_in = (size_t)s->w * c, row_out = (size_t)wp * c;
    for (int i = 0; i < s->n; i++)
        for (int py = 0; py < hp; py++) {
            float *yr = y + ((size_t)i * hp + py) * row_out;
            const int iy = py - s->top;
            if (iy < 0 || iy >= s->h) {
                memset(yr, 0, sizeof(float) * row_out);
                continue;
            }
            memset(yr, 0, sizeof(float) * (size_t)s->left * c);
            memcpy(yr + (size_t)s->left * c, x + ((size_t)i * s->h + iy) * row_in,
                   sizeof(float) * row_in);
            memset(yr + (size_t)(s->left + s->w) * c, 0, sizeof(float) * (size_t)s->right * c);
        }
}

void mgt_cpu_pad_bwd(mgt_backend *be, const mgt_pad_shape *s, const float *dy, float *dx) {
    (void)be;
    if (!dx)
        return;
    const int hp = s->h + s->top + s->bottom, wp = s->w + s->left + s->right;
    const size_t c = (size_t)s->c, row_in = (size_t)s->w * c, row_out = (size_t)wp * c;
    for (int i = 0; i < s->n; i++)
        for (int iy = 0; iy < s->h; iy++)
            memcpy(dx + ((size_t)i * s->h + iy) * row_in,
                   dy + ((size_t)i * hp + iy + s->top) * row_out + (size_t)s->left * c,
                   sizeof(float) * row_in);
}

/* Per sample: the hw rows of c channels summed in double (mgt_cpu_colsum), rounded once, then
 * scaled by 1/hw in float: three roundings in all, whatever hw is. */
MGT_SIMD
void mgt_cpu_gap_fwd(mgt_backend *be, int n, int hw, int c, const float *x, float *y) {
    (void)be;
    const float inv = 1.0f / (float)(hw > 0 ? hw : 1);
    for (int i = 0; i < n; i++) {
        float *restrict yr = y + (size_t)i * c;
        mgt_cpu_colsum((size_t)hw, c, x + (size_t)i * hw * c, yr);
        for (int j = 0; j < c; j++)
            yr[j] *= inv;
    }
}

MGT_SIMD
void mgt_cpu_gap_bwd(mgt_backend *be, int n, int hw, int c, const float *dy, float *dx) {
    (void)be;
    if (!dx)
        return;
    const float inv = 1.0f / (float)(hw > 0 ? hw : 1);
    for (int i = 0; i < n; i++) {
        const float *restrict g = dy + (size_t)i * c;
        for (int p = 0; p < hw; p++) {
            float *restrict d = dx + ((size_t)i * hw + p) * c;
            for (int j = 0; j < c; j++)
                d[j] = g[j] * inv;
        }
    }
}
