/* resample.c: Pillow's bilinear resize of 8-bit images (see resample.h).
 *
 * For an axis of `in` pixels resized to `out`, output pixel i (of the whole axis) is centred at
 * (i + 0.5) * scale in the input, scale = in / out, and takes the input pixels whose centres lie
 * within `support` = max(scale, 1) of it, weighted by the triangle 1 - |d| / max(scale, 1) and
 * normalised to sum 1. The window and the weights are computed in double exactly as Pillow
 * computes them (its rounding of the window's ends included), then rounded to integers of 22
 * fractional bits (half away from zero); a pass sums bytes times weights in int32 from 2^21 (one
 * half) and keeps bits 22 and up, clamped to 0..255. Weights are non-negative and sum to 2^22
 * within ksize / 2, so the sum stays below 2^31 (255 * 2^22 * (1 + 2^-21) + 2^21).
 *
 * The horizontal pass runs first, over only the input rows the window's output rows read, into
 * bytes; the vertical pass then reads those. */
#include "resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS 22 /* Pillow's: 32 - 8 bits of the value - 2 bits of headroom */

/* One axis: for each of n output pixels, its first input pixel, its count, and ksize weights. */
typedef struct axis {
    int ksize;
    int *first, *count;
    int32_t *k; /* [n][ksize] */
} axis;

static double triangle(double x) {
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Weights per output pixel for a scale of `scale` input pixels per output pixel (Pillow's
 * ksize). */
static int axis_ksize(double scale) {
    const double support = scale < 1.0 ? 1.0 : scale;
    return (int)ceil(support) * 2 + 1;
}

/* Bytes an axis of n outputs needs. */
static size_t axis_bytes(int n, int ksize) {
    return sizeof(int) * 2 * (size_t)n + sizeof(int32_t) * (size_t)n * (size_t)ksize + 16;
}

/* The weights of outputs [o0, o0 + n) of an axis of `in` input pixels, output pixel i centred at
 * a + (i + 0.5) * scale (Pillow's precompute_coeffs: a is its box's start, 0 for a plain resize;
 * scale = in / out for a whole axis), at mem. */
static axis axis_make(int in, double a0, double scale, int o0, int n, void *mem) {
    axis a;
    a.ksize = axis_ksize(scale);
    a.first = mem;
    a.count = a.first + n;
    a.k = (int32_t *)(a.count + n);
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = filterscale; /* the triangle's support, 1, times the scale */
    const double ss = 1.0 / filterscale;
    for (int i = 0; i < n; i++) {
        const double center = a0 + (o0 + i + 0.5) * scale;
        int lo = (int)(center - support + 0.5);
        if (lo < 0)
            lo = 0;
        int hi = (int)(center + support + 0.5);
        if (hi > in)
            hi = in;
        const int cnt = hi - lo;
        double sum = 0.0;
        for (int x = 0; x < cnt; x++)
            sum += triangle((x + lo - center + 0.5) * ss);
        int32_t *k = a.k + (size_t)i * (size_t)a.ksize;
        for (int x = 0; x < a.ksize; x++) {
            double v = x < cnt ? triangle((x + lo - center + 0.5) * ss) : 0.0;
            if (sum != 0.0)
                v /= sum;
            v *= (double)(1 << PRECISION_BITS);
            k[x] = (int32_t)(v < 0 ? v - 0.5 : v + 0.5);
        }
        a.first[i] = lo;
        a.count[i] = cnt;
    }
    return a;
}

static inline uint8_t clip8(int32_t v) {
    v >>= PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Rows [r0, r1) of src (c channels) through the horizontal weights into dst (rows of a.n * c). */
static void pass_h(const uint8_t *src, size_t stride, int c, const axis *a, int n, int r0, int r1,
                   uint8_t *dst) {
    const size_t row = (size_t)n * (size_t)c;
    for (int y = r0; y < r1; y++) {
        const uint8_t *in = src + (size_t)y * stride;
        uint8_t *out = dst + (size_t)(y - r0) * row;
        for (int i = 0; i < n; i++) {
            const int32_t *k = a->k + (size_t)i * (size_t)a->ksize;
            const uint8_t *p = in + (size_t)a->first[i] * (size_t)c;
            const int cnt = a->count[i];
            if (c == 3) {
                int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
                for (int x = 0; x < cnt; x++) {
                    s0 += p[3 * x] * k[x];
                    s1 += p[3 * x + 1] * k[x];
                    s2 += p[3 * x + 2] * k[x];
                }
                out[3 * i] = clip8(s0);
                out[3 * i + 1] = clip8(s1);
                out[3 * i + 2] = clip8(s2);
                continue;
            }
            for (int ch = 0; ch < c; ch++) {
                int32_t s = 1 << (PRECISION_BITS - 1);
                for (int x = 0; x < cnt; x++)
                    s += p[(size_t)x * (size_t)c + (size_t)ch] * k[x];
                out[(size_t)i * (size_t)c + (size_t)ch] = clip8(s);
            }
        }
    }
}

/* Output rows through the vertical weights: row i reads rows first[i] - r0 ... of src (rows of
 * `len` bytes, `stride` apart). acc holds len int32. */
static void pass_v(const uint8_t *src, size_t stride, int r0, size_t len, const axis *a, int n,
                   int32_t *acc, uint8_t *dst) {
    for (int i = 0; i < n; i++) {
        const int32_t *k = a->k + (size_t)i * (size_t)a->ksize;
        for (size_t j = 0; j < len; j++)
            acc[j] = 1 << (PRECISION_BITS - 1);
        for (int y = 0; y < a->count[i]; y++) {
            const uint8_t *in = src + (size_t)(a->first[i] + y - r0) * stride;
            const int32_t ky = k[y];
            for (size_t j = 0; j < len; j++)
                acc[j] += in[j] * ky;
        }
        uint8_t *out = dst + (size_t)i * len;
        for (size_t j = 0; j < len; j++)
            out[j] = clip8(acc[j]);
    }
}

static void *work(mgt_resample_work *w, size_t bytes) {
    if (bytes <= w->cap)
        return w->buf;
    void *p = realloc(w->buf, bytes);
    if (!p)
        return NULL;
    w->buf = p;
    w->cap = bytes;
    return p;
}

/* One axis of a resize: output pixel i (of the window's n) centred at a + (o0 + i + 0.5) * scale
 * in input pixels; `need` 0 when it is the identity (the pass is skipped, as Pillow skips it). */
typedef struct axis_map {
    double a, scale;
    int o0, need;
} axis_map;

/* The resize of sw x sh src to ow x oh by the two axes' maps (the shared body of the public
 * functions). */
static int resample(const uint8_t *src, int sw, int sh, size_t stride, int c, axis_map mx,
                    axis_map my, int ow, int oh, uint8_t *dst, mgt_resample_work *w) {
    const int need_h = mx.need, need_v = my.need;
    const size_t row = (size_t)ow * (size_t)c;
    const int kh = need_h ? axis_ksize(mx.scale) : 0, kv = need_v ? axis_ksize(my.scale) : 0;
    const size_t hbytes = need_h ? axis_bytes(ow, kh) : 0, vbytes = need_v ? axis_bytes(oh, kv) : 0;
    /* The input rows the window's output rows read: all of [o0, o0 + oh) without a vertical
     * pass, else at most oh * (scale + 2) + 2 (each output reads its centre's support). */
    const size_t rows = need_v ? (size_t)oh * (size_t)(kv + 1) : (size_t)oh;
    const size_t rows_cap = rows < (size_t)sh ? rows : (size_t)sh;
    const size_t mid = need_h && need_v ? rows_cap * row : 0;
    const size_t accb = need_v ? sizeof(int32_t) * row : 0;
    char *mem = work(w, hbytes + vbytes + mid + accb + 64);
    if (!mem)
        return -1;
    const axis ah = need_h ? axis_make(sw, mx.a, mx.scale, mx.o0, ow, mem) : (axis){0};
    const axis av = need_v ? axis_make(sh, my.a, my.scale, my.o0, oh, mem + hbytes) : (axis){0};
    uint8_t *inter = (uint8_t *)mem + hbytes + vbytes;
    int32_t *acc = (int32_t *)(void *)(((uintptr_t)(inter + mid) + 15) & ~(uintptr_t)15);
    const int x0 = mx.o0, y0 = my.o0;

    /* The input rows the vertical pass reads (or the window's rows where there is none). */
    int r0 = y0, r1 = y0 + oh;
    if (need_v) {
        r0 = av.first[0];
        r1 = av.first[oh - 1] + av.count[oh - 1];
        for (int i = 0; i < oh; i++) { /* the first and last rows bound them all */
            if (av.first[i] < r0)
                r0 = av.first[i];
            if (av.first[i] + av.count[i] > r1)
                r1 = av.first[i] + av.count[i];
        }
    }
    if (!need_h && !need_v) {
        for (int y = 0; y < oh; y++)
            memcpy(dst + (size_t)y * row, src + (size_t)(y0 + y) * stride + (size_t)x0 * (size_t)c,
                   row);
        return 0;
    }
    if (!need_v) { /* the horizontal pass alone, straight into dst */
        pass_h(src, stride, c, &ah, ow, r0, r1, dst);
        return 0;
    }
    if (!need_h) { /* the vertical pass alone, over the window's columns of src */
        pass_v(src + (size_t)x0 * (size_t)c, stride, 0, row, &av, oh, acc, dst);
        return 0;
    }
    if ((size_t)(r1 - r0) > rows_cap) /* cannot happen: the bound above holds */
        return -1;
    pass_h(src, stride, c, &ah, ow, r0, r1, inter);
    pass_v(inter, row, r0, row, &av, oh, acc, dst);
    return 0;
}

int mgt_resample_u8(const uint8_t *src, int sw, int sh, size_t stride, int c, int fw, int fh,
                    int x0, int y0, int ow, int oh, uint8_t *dst, mgt_resample_work *w) {
    const axis_map mx = {0.0, (double)sw / fw, x0, fw != sw};
    const axis_map my = {0.0, (double)sh / fh, y0, fh != sh};
    return resample(src, sw, sh, stride, c, mx, my, ow, oh, dst, w);
}

int mgt_resample_box(const uint8_t *src, int sw, int sh, size_t stride, int c, const double box[4],
                     int ow, int oh, uint8_t *dst, mgt_resample_work *w) {
    /* The pixels the box covers, whole: the crop the filter is clamped to. */
    int cx0 = (int)floor(box[0]), cy0 = (int)floor(box[1]);
    int cx1 = (int)ceil(box[2]), cy1 = (int)ceil(box[3]);
    cx0 = cx0 < 0 ? 0 : cx0, cy0 = cy0 < 0 ? 0 : cy0;
    cx1 = cx1 > sw ? sw : cx1, cy1 = cy1 > sh ? sh : cy1;
    if (cx1 <= cx0 || cy1 <= cy0)
        return -1;
    /* Pillow takes the box as single-precision floats (ImagingResample's float box[4]) and its
     * scale as (double)(in1 - in0) / out, the subtraction in float: the same roundings here. */
    const float ax0 = (float)(box[0] - cx0), ax1 = (float)(box[2] - cx0);
    const float ay0 = (float)(box[1] - cy0), ay1 = (float)(box[3] - cy0);
    const float dx = ax1 - ax0, dy = ay1 - ay0;
    const int cw = cx1 - cx0, ch = cy1 - cy0;
    /* Pillow's test: a pass is needed unless the box is the whole (cropped) axis at its size */
    const axis_map mx = {ax0, (double)dx / ow, 0, !(ax0 == 0.0f && cw == ow && ax1 == (float)cw)};
    const axis_map my = {ay0, (double)dy / oh, 0, !(ay0 == 0.0f && ch == oh && ay1 == (float)ch)};
    return resample(src + (size_t)cy0 * stride + (size_t)cx0 * (size_t)c, cw, ch, stride, c, mx, my,
                    ow, oh, dst, w);
}

void mgt_resample_work_free(mgt_resample_work *w) {
    free(w->buf);
    w->buf = NULL;
    w->cap = 0;
}
