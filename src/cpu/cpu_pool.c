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

/* Each pass splits the batch by samples across the lanes: a sample's outputs depend only on
 * its own input (and its gradient scatters only into its own input), so the results do not
 * depend on the number of threads. */
typedef struct {
    const mgt_pool_shape *s;
    const float *x; /* forward input, or backward dy */
    float *y;       /* forward output, or backward dx */
    const int32_t *argmax_in;
    int32_t *argmax_out;
    const float *relu_x; /* backward: the pooled input, its ReLU's mask (NULL: none) */
} pool_job;

/* Samples per part: enough that a part is worth a lane (see cpu_elem.c's ELEM_PART). */
static size_t pool_part(const mgt_pool_shape *s) {
    const size_t per = (size_t)s->h * s->w * (s->c > 0 ? s->c : 1);
    return ((size_t)1 << 16) / (per ? per : 1) + 1;
}

static void pool_split(mgt_backend *be, const mgt_pool_shape *s, pool_job *j,
                       void (*fn)(void *, size_t, size_t)) {
    if (s->n <= 0)
        return;
    j->s = s;
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)s->n, pool_part(s), fn, j);
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
static void maxpool_fwd_samples(void *p, size_t n0, size_t n1) {
    const pool_job *jb = p;
    const mgt_pool_shape *s = jb->s;
    const float *x = jb->x;
    const int c = s->c;
    for (size_t smp = n0; smp < n1; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                const size_t o = ((smp * s->oh + oy) * s->ow + ox) * c;
                float *restrict yo = jb->y + o;
                int32_t *restrict ao = jb->argmax_out + o;
                const pool_win win = window_of(s, oy, ox);
                for (int iy = win.y0; iy < win.y1; iy++)
                    for (int ix = win.x0; ix < win.x1; ix++) {
                        const size_t in = ((smp * s->h + iy) * s->w + ix) * c;
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

void mgt_cpu_maxpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y,
                         int32_t *argmax) {
    pool_job j = {.x = x, .y = y, .argmax_out = argmax};
    pool_split(be, s, &j, maxpool_fwd_samples);
}

/* Zeroes the samples' part of dx and adds each output's gradient at its argmax (which lies in
 * the same sample). */
MGT_SIMD
static void maxpool_bwd_samples(void *p, size_t n0, size_t n1) {
    const pool_job *jb = p;
    const mgt_pool_shape *s = jb->s;
    const size_t in = (size_t)s->h * s->w * s->c, out = (size_t)s->oh * s->ow * s->c;
    float *dx = jb->y;
    const float *rx = jb->relu_x;
    memset(dx + n0 * in, 0, sizeof(float) * (n1 - n0) * in);
    if (rx) /* act_bwd's y > 0 ? g : 0 at each maximum; the rest stays 0 either way */
        for (size_t o = n0 * out; o < n1 * out; o++) {
            const int32_t a = jb->argmax_in[o];
            dx[a] += mgt_cpu_keep_if(jb->x[o], rx[a] > 0.0f);
        }
    else
        for (size_t o = n0 * out; o < n1 * out; o++)
            dx[jb->argmax_in[o]] += jb->x[o];
}

void mgt_cpu_maxpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy,
                         const int32_t *argmax, float *dx) {
    if (!dx)
        return;
    pool_job j = {.x = dy, .y = dx, .argmax_in = argmax};
    pool_split(be, s, &j, maxpool_bwd_samples);
}

void mgt_cpu_maxpool_bwd_relu(mgt_backend *be, const mgt_pool_shape *s, const float *x,
                              const float *dy, const int32_t *argmax, float *dx) {
    if (!dx)
        return;
    pool_job j = {.x = dy, .y = dx, .argmax_in = argmax, .relu_x = x};
    pool_split(be, s, &j, maxpool_bwd_samples);
}

/* The divisor is the window's count of input positions: size * size for a whole window, so
 * valid pooling multiplies by the same 1 / (size * size) it always did. */
MGT_SIMD
static void avgpool_fwd_samples(void *p, size_t n0, size_t n1) {
    const pool_job *jb = p;
    const mgt_pool_shape *s = jb->s;
    const int c = s->c;
    for (size_t smp = n0; smp < n1; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                float *restrict yo = jb->y + ((smp * s->oh + oy) * s->ow + ox) * c;
                const pool_win win = window_of(s, oy, ox);
                const float inv = 1.0f / (float)((win.y1 - win.y0) * (win.x1 - win.x0));
                for (int ch = 0; ch < c; ch++)
                    yo[ch] = 0.0f;
                for (int iy = win.y0; iy < win.y1; iy++)
                    for (int ix = win.x0; ix < win.x1; ix++) {
                        const float *restrict xp = jb->x + ((smp * s->h + iy) * s->w + ix) * c;
                        for (int ch = 0; ch < c; ch++)
                            yo[ch] += xp[ch];
                    }
                for (int ch = 0; ch < c; ch++)
                    yo[ch] *= inv;
            }
}

void mgt_cpu_avgpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y) {
    pool_job j = {.x = x, .y = y};
    pool_split(be, s, &j, avgpool_fwd_samples);
}

MGT_SIMD
static void avgpool_bwd_samples(void *p, size_t n0, size_t n1) {
    const pool_job *jb = p;
    const mgt_pool_shape *s = jb->s;
    const int c = s->c;
    const size_t in = (size_t)s->h * s->w * c;
    memset(jb->y + n0 * in, 0, sizeof(float) * (n1 - n0) * in);
    for (size_t smp = n0; smp < n1; smp++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++) {
                const float *restrict go = jb->x + ((smp * s->oh + oy) * s->ow + ox) * c;
                const pool_win win = window_of(s, oy, ox);
                const float inv = 1.0f / (float)((win.y1 - win.y0) * (win.x1 - win.x0));
                for (int iy = win.y0; iy < win.y1; iy++)
                    for (int ix = win.x0; ix < win.x1; ix++) {
                        float *restrict xp = jb->y + ((smp * s->h + iy) * s->w + ix) * c;
                        for (int ch = 0; ch < c; ch++)
                            xp[ch] += go[ch] * inv;
                    }
            }
}

void mgt_cpu_avgpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy, float *dx) {
    if (!dx)
        return;
    pool_job j = {.x = dy, .y = dx};
    pool_split(be, s, &j, avgpool_bwd_samples);
}
