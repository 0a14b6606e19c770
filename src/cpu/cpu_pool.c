/* cpu_pool.c: max and average pooling over NHWC activations, valid windows only (no padding):
 * output (oy, ox) sees input rows oy*stride .. oy*stride+size-1 and the same for columns.
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

MGT_SIMD
void mgt_cpu_maxpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y,
                         int32_t *argmax) {
    (void)be;
    const int c = s->c, size = s->size;
    for (int smp = 0; smp < s->n; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                const size_t o = (((size_t)smp * s->oh + oy) * s->ow + ox) * c;
                float *restrict yo = y + o;
                int32_t *restrict ao = argmax + o;
                const int iy0 = oy * s->stride, ix0 = ox * s->stride;
                for (int i = 0; i < size; i++)
                    for (int j = 0; j < size; j++) {
                        const size_t in = (((size_t)smp * s->h + iy0 + i) * s->w + ix0 + j) * c;
                        const float *restrict xp = x + in;
                        if (i == 0 && j == 0) {
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

MGT_SIMD
void mgt_cpu_avgpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y) {
    (void)be;
    const int c = s->c, size = s->size;
    const float inv = 1.0f / (float)(size * size);
    for (int smp = 0; smp < s->n; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                float *restrict yo = y + (((size_t)smp * s->oh + oy) * s->ow + ox) * c;
                const int iy0 = oy * s->stride, ix0 = ox * s->stride;
                for (int ch = 0; ch < c; ch++)
                    yo[ch] = 0.0f;
                for (int i = 0; i < size; i++)
                    for (int j = 0; j < size; j++) {
                        const float *restrict xp =
                            x + (((size_t)smp * s->h + iy0 + i) * s->w + ix0 + j) * c;
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
    const int c = s->c, size = s->size;
    const float inv = 1.0f / (float)(size * size);
    const size_t nin = pool_in_count(s);
    if (nin)
        memset(dx, 0, sizeof(float) * nin);
    for (int smp = 0; smp < s->n; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                const float *restrict go = dy + (((size_t)smp * s->oh + oy) * s->ow + ox) * c;
                const int iy0 = oy * s->stride, ix0 = ox * s->stride;
                for (int i = 0; i < size; i++)
                    for (int j = 0; j < size; j++) {
                        float *restrict xp =
                            dx + (((size_t)smp * s->h + iy0 + i) * s->w + ix0 + j) * c;
                        for (int ch = 0; ch < c; ch++)
                            xp[ch] += go[ch] * inv;
                    }
            }
}
