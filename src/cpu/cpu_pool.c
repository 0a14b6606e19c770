/* cpu_pool.c: max and average pooling over NHWC activations. Output (oy, ox) sees input rows
 * oy*stride - pad_top .. + size - 1 and the same for columns; window positions outside the input
 * are left out (with no padding every window is whole: Keras' "valid"; with TensorFlow's "same"
 * padding the border windows are smaller: the maximum of the values there, their average over
 * their count).
 *
 * Every loop keeps the channel index innermost, so each window position is one contiguous
 * c-vector read and the per-channel work vectorises. Max pooling stores, for each output, the
 * flat index into the whole x tensor of the value it picked; windows are scanned row by row,
 * left to right, and only a strictly larger value replaces the current one, so ties go to the
 * first position in that order. The backward passes zero dx and scatter-add into it, which is
 * also right for overlapping windows (stride < size). */
#include <string.h>

#include "cpu_internal.h"

static size_t pool_in_count(const mgt_pool_shape *s) {
    return (size_t)(s->n > 0 ? s->n : 0) * s->h * s->w * s->c;
}

/* The part of output (oy, ox)'s window inside the input: rows y0..y1-1, columns x0..x1-1. */
typedef struct {
    int y0, y1, x0, x1;
} pool_win;

static pool_win window_of(const mgt_pool_shape *s, int oy, int ox) {
    const int iy = oy * s->stride - s->pad_top, ix = ox * s->stride - s->pad_left;
    pool_win w = {iy < 0 ? 0 : iy, iy + s->size, ix < 0 ? 0 : ix, ix + s->size};
    w.y1 = w.y1 > s->h ? s->h : w.y1;
    w.x1 = w.x1 > s->w ? s->w : w.x1;
    return w;
}

MGT_SIMD
void mgt_cpu_maxpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y,
                         int32_t *argmax) {
    (void)be;
    const int c = s->c;
    for (int smp = 0; smp < s->n; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                const size_t o = (((size_t)smp * s->oh + oy) * s->ow + ox) * c;
                float *restrict yo = y + o;
                int32_t *restrict ao = argmax + o;
                const pool_win win = window_of(s, oy, ox);
                for (int iy = win.y0; iy < win.y1; iy++)
                    for (int ix = win.x0; ix < win.x1; ix++) {
                        const size_t in = (((size_t)smp * s->h + iy) * s->w + ix) * c;
                        const float *restrict xp = x + in;
                        if (iy == win.y0 && ix == win.x0) {
                            for (int ch = 0; ch < c; ch++) {
                                yo[ch] = xp[ch];
                                ao[ch] = (int32_t)(in + ch);
                            }
                        } else {
                            for (int ch = 0; ch < c; ch++)
                                if (xp[ch] > yo[ch]) {
                                    yo[ch] = xp[ch];
                                    ao[ch] = (int32_t)(in + ch);
                                }
                        }
                    }
            }
}

MGT_SIMD
void mgt_cpu_maxpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy,
                         const int32_t *argmax, float *dx) {
    (void)be;
    if (!dx)
        return;
    const size_t nin = pool_in_count(s);
    if (nin)
        memset(dx, 0, sizeof(float) * nin);
    const size_t nout = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow * s->c;
    for (size_t o = 0; o < nout; o++)
        dx[argmax[o]] += dy[o];
}

/* The divisor is the window's count of input positions: size * size for a whole window, so
 * valid pooling multiplies by the same 1 / (size * size) it always did. */
MGT_SIMD
void mgt_cpu_avgpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y) {
    (void)be;
    const int c = s->c;
    for (int smp = 0; smp < s->n; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                float *restrict yo = y + (((size_t)smp * s->oh + oy) * s->ow + ox) * c;
                const pool_win win = window_of(s, oy, ox);
                const float inv = 1.0f / (float)((win.y1 - win.y0) * (win.x1 - win.x0));
                for (int ch = 0; ch < c; ch++)
                    yo[ch] = 0.0f;
                for (int iy = win.y0; iy < win.y1; iy++)
                    for (int ix = win.x0; ix < win.x1; ix++) {
                        const float *restrict xp = x + (((size_t)smp * s->h + iy) * s->w + ix) * c;
                        for (int ch = 0; ch < c; ch++)
                            yo[ch] += xp[ch];
                    }
                for (int ch = 0; ch < c; ch++)
                    yo[ch] *= inv;
            }
}

MGT_SIMD
void mgt_cpu_avgpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy, float *dx) {
    (void)be;
    if (!dx)
        return;
    const int c = s->c;
    const size_t nin = pool_in_count(s);
    if (nin)
        memset(dx, 0, sizeof(float) * nin);
    for (int smp = 0; smp < s->n; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                const float *restrict go = dy + (((size_t)smp * s->oh + oy) * s->ow + ox) * c;
                const pool_win win = window_of(s, oy, ox);
                const float inv = 1.0f / (float)((win.y1 - win.y0) * (win.x1 - win.x0));
                for (int iy = win.y0; iy < win.y1; iy++)
                    for (int ix = win.x0; ix < win.x1; ix++) {
                        float *restrict xp = dx + (((size_t)smp * s->h + iy) * s->w + ix) * c;
                        for (int ch = 0; ch < c; ch++)
                            xp[ch] += go[ch] * inv;
                    }
            }
}
