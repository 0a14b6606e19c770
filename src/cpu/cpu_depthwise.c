/* cpu_depthwise.c: depthwise convolution (depth multiplier 1: each channel convolved with its own
 * kh x kw filter), NHWC activations, weights [c][1][kh][kw] as PyTorch's Conv2d(groups = c).
 *
 * Depthwise convolution does kh*kw multiply-adds per value it reads, so it is bound by memory,
 * not arithmetic, and a GEMM formulation would only add copies. Every loop here keeps the channel
 * index innermost: an output pixel is a c-vector, each filter tap adds a c-vector product of one
 * input pixel and that tap's c weights, and the compiler vectorises the c loop (MGT_SIMD adds
 * an AVX2 copy). For that the weights are first transposed into the scratch buffer as [tap][c]
 * (kh*kw*c floats, a few KB), so each tap's weights are contiguous too.
 *
 *   forward        y[p][ch] = b[ch] + sum over taps of w[tap][ch] * x[p + tap][ch]
 *   backward data  gathered per input pixel (each dx pixel written once, no zeroing pass, and
 *                  any split of the rows over the lanes is free of write conflicts)
 *   backward filt. per output row, the row's products summed in float per (tap, ch), then added
 *                  into the lane's double accumulators; the lanes' sums are added in lane order
 *   bias           column sums of dy in double (mgt_cpu_colsum)
 *
 * The rows are split over the backend's lanes (cpu_lanes.c, one per BLAS thread). Without the
 * scratch mgt_cpu_dwconv_scratch asks for (reserve() never called), the passes run on one lane
 * and read the weights in place, strided: slower, never wrong. */
#include <string.h>

#include "cpu_internal.h"

static size_t align64(size_t bytes) {
    return (bytes + 63) & ~(size_t)63;
}

static size_t taps_of(const mgt_conv_shape *s) {
    return (size_t)s->kh * (size_t)s->kw;
}

/* Scratch: the transposed weights, then per lane the backward filter's float row sums and
 * double accumulators. */
static size_t lane_bytes(const mgt_conv_shape *s) {
    const size_t tc = taps_of(s) * (size_t)s->c;
    return align64(tc * sizeof(float)) + align64(tc * sizeof(double));
}

size_t mgt_cpu_dwconv_scratch(mgt_backend *be, const mgt_conv_shape *s) {
    const int lanes = mgt_cpu_lanes_count(mgt_cpu_impl_of(be)->lanes);
    return align64(taps_of(s) * (size_t)s->c * sizeof(float)) + (size_t)lanes * lane_bytes(s);
}

/* What every pass shares: the shape, the weights as w(tap, ch) = w[tap * ts + ch * cs] (the
 * transposed copy: ts = c, cs = 1; in place: ts = 1, cs = taps), the tensors, and the lanes'
 * split of `rows` rows. */
typedef struct dw_ctx {
    const mgt_conv_shape *s;
    const float *w;
    size_t ts, cs;
    const float *x, *b, *dy;
    float *y, *dx;
    size_t rows;
    int lanes;
    char *lane_mem; /* backward filter: lane_bytes(s) per lane */
} dw_ctx;

static void lane_range(const dw_ctx *d, int lane, size_t *r0, size_t *r1) {
    *r0 = d->rows * (size_t)lane / (size_t)d->lanes;
    *r1 = d->rows * (size_t)(lane + 1) / (size_t)d->lanes;
}

/* acc[ch] += w(tap, ch) * v[ch] for ch < c: contiguous weights vectorise, strided ones do not. */
MGT_SIMD
static void tap_madd(float *restrict acc, const float *restrict v, const float *restrict w,
                     size_t cs, int c) {
    if (cs == 1)
        for (int ch = 0; ch < c; ch++)
            acc[ch] += w[ch] * v[ch];
    else
        for (int ch = 0; ch < c; ch++)
            acc[ch] += w[(size_t)ch * cs] * v[ch];
}

MGT_SIMD
static void prod_add(float *restrict acc, const float *restrict a, const float *restrict b, int c) {
    for (int ch = 0; ch < c; ch++)
        acc[ch] += a[ch] * b[ch];
}

/* The window of output (smp, oy, ox), tap by tap over the input pixels inside the image:
 * forward (g == NULL) adds w(tap) .* x(pixel) to dst; backward filter adds x(pixel) .* g to
 * dst's row for the tap ([tap][c]). */
static void window_madd(const dw_ctx *d, size_t smp, int oy, int ox, float *dst, const float *g) {
    const mgt_conv_shape *s = d->s;
    const int c = s->c, iy0 = oy * s->stride - s->pad_top, ix0 = ox * s->stride - s->pad_left;
    const int ki0 = iy0 < 0 ? -iy0 : 0, ki1 = s->h - iy0 < s->kh ? s->h - iy0 : s->kh;
    const int kj0 = ix0 < 0 ? -ix0 : 0, kj1 = s->w - ix0 < s->kw ? s->w - ix0 : s->kw;
    for (int ki = ki0; ki < ki1; ki++) {
        const float *xr =
            d->x + ((smp * (size_t)s->h + (size_t)(iy0 + ki)) * (size_t)s->w) * (size_t)c;
        for (int kj = kj0; kj < kj1; kj++) {
            const float *xp = xr + (size_t)(ix0 + kj) * (size_t)c;
            const size_t tap = (size_t)(ki * s->kw + kj);
            if (g)
                prod_add(dst + tap * (size_t)c, xp, g, c);
            else
                tap_madd(dst, xp, d->w + tap * d->ts, d->cs, c);
        }
    }
}

/* Forward: output rows (sample, oy) of this lane. */
static void fwd_lane(void *p, int lane) {
    const dw_ctx *d = p;
    const mgt_conv_shape *s = d->s;
    const int c = s->c;
    size_t r0, r1;
    lane_range(d, lane, &r0, &r1);
    for (size_t r = r0; r < r1; r++)
        for (int ox = 0; ox < s->ow; ox++) {
            float *yp = d->y + ((r * (size_t)s->ow) + (size_t)ox) * (size_t)c;
            if (d->b)
                memcpy(yp, d->b, sizeof(float) * (size_t)c);
            else
                memset(yp, 0, sizeof(float) * (size_t)c);
            window_madd(d, r / (size_t)s->oh, (int)(r % (size_t)s->oh), ox, yp, NULL);
        }
}

/* The output index o (row or column) whose tap k covers input index i, or -1. */
static int covering_out(int i, int k, int pad, int stride, int out) {
    const int t = i + pad - k;
    if (t < 0 || t % stride)
        return -1;
    return t / stride < out ? t / stride : -1;
}

/* Backward data: input rows (sample, iy) of this lane, each pixel gathered from the outputs
 * whose windows hold it. */
static void bwd_data_lane(void *p, int lane) {
    const dw_ctx *d = p;
    const mgt_conv_shape *s = d->s;
    const int c = s->c;
    size_t r0, r1;
    lane_range(d, lane, &r0, &r1);
    for (size_t r = r0; r < r1; r++) {
        const size_t smp = r / (size_t)s->h;
        const int iy = (int)(r % (size_t)s->h);
        for (int ix = 0; ix < s->w; ix++) {
            float *dxp = d->dx + (r * (size_t)s->w + (size_t)ix) * (size_t)c;
            memset(dxp, 0, sizeof(float) * (size_t)c);
            for (int ki = 0; ki < s->kh; ki++) {
                const int oy = covering_out(iy, ki, s->pad_top, s->stride, s->oh);
                if (oy < 0)
                    continue;
                for (int kj = 0; kj < s->kw; kj++) {
                    const int ox = covering_out(ix, kj, s->pad_left, s->stride, s->ow);
                    if (ox < 0)
                        continue;
                    const float *g =
                        d->dy + ((smp * (size_t)s->oh + (size_t)oy) * (size_t)s->ow + (size_t)ox) *
                                    (size_t)c;
                    tap_madd(dxp, g, d->w + (size_t)(ki * s->kw + kj) * d->ts, d->cs, c);
                }
            }
        }
    }
}

MGT_SIMD
static void widen_add(double *restrict acc, const float *restrict v, size_t count) {
    for (size_t i = 0; i < count; i++)
        acc[i] += v[i];
}

/* Backward filter: output rows (sample, oy) of this lane into the lane's double sums [tap][ch]. */
static void bwd_filter_lane(void *p, int lane) {
    const dw_ctx *d = p;
    const mgt_conv_shape *s = d->s;
    const int c = s->c;
    const size_t tc = taps_of(s) * (size_t)c;
    char *mem = d->lane_mem + (size_t)lane * lane_bytes(s);
    float *row = (float *)mem;
    double *acc = (double *)(mem + align64(tc * sizeof(float)));
    memset(acc, 0, tc * sizeof(double));
    size_t r0, r1;
    lane_range(d, lane, &r0, &r1);
    for (size_t r = r0; r < r1; r++) {
        memset(row, 0, tc * sizeof(float));
        for (int ox = 0; ox < s->ow; ox++)
            window_madd(d, r / (size_t)s->oh, (int)(r % (size_t)s->oh), ox, row,
                        d->dy + (r * (size_t)s->ow + (size_t)ox) * (size_t)c);
        widen_add(acc, row, tc);
    }
}

/* The weights as [tap][c] in the scratch when it holds them (ts = c, cs = 1), else in place. */
static void weights_view(mgt_cpu_impl *im, const mgt_conv_shape *s, const float *w, dw_ctx *d) {
    const size_t taps = taps_of(s), c = (size_t)s->c;
    if (im->scratch && im->scratch_bytes >= taps * c * sizeof(float)) {
        float *wt = im->scratch;
        for (size_t ch = 0; ch < c; ch++)
            for (size_t t = 0; t < taps; t++)
                wt[t * c + ch] = w[ch * taps + t];
        d->w = wt;
        d->ts = c;
        d->cs = 1;
    } else {
        d->w = w;
        d->ts = 1;
        d->cs = taps;
    }
}

static int lanes_for(const mgt_cpu_impl *im, size_t rows) {
    const int n = mgt_cpu_lanes_count(im->lanes);
    return rows < (size_t)n ? (rows ? (int)rows : 1) : n;
}

void mgt_cpu_dwconv_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y) {
    if (s->n <= 0 || s->oh <= 0 || s->ow <= 0 || s->c <= 0)
        return;
    mgt_cpu_impl *im = mgt_cpu_impl_of(be);
    dw_ctx d = {.s = s, .x = x, .b = b, .y = y, .rows = (size_t)s->n * (size_t)s->oh};
    weights_view(im, s, w, &d);
    d.lanes = lanes_for(im, d.rows);
    mgt_cpu_lanes_run(im->lanes, d.lanes, fwd_lane, &d);
}

void mgt_cpu_dwconv_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db) {
    const int n = s->n > 0 ? s->n : 0, c = s->c > 0 ? s->c : 0;
    const size_t taps = taps_of(s), out_rows = (size_t)n * (size_t)s->oh;
    mgt_cpu_impl *im = mgt_cpu_impl_of(be);
    if (db)
        mgt_cpu_colsum(out_rows * (size_t)s->ow, c, dy, db); /* zeros when n == 0 */
    if (!c)
        return;
    dw_ctx d = {.s = s, .x = x, .dy = dy, .dx = dx};
    weights_view(im, s, w, &d);
    if (dx && n > 0) {
        d.rows = (size_t)n * (size_t)s->h;
        d.lanes = lanes_for(im, d.rows);
        mgt_cpu_lanes_run(im->lanes, d.lanes, bwd_data_lane, &d);
    }
    if (!dw)
        return;
    /* The lanes' accumulators follow the transposed weights (their place is the same whether
     * or not the weights were copied there); as many lanes as the scratch holds. */
    const size_t wt_bytes = align64(taps * (size_t)c * sizeof(float));
    const size_t avail =
        im->scratch && im->scratch_bytes > wt_bytes ? im->scratch_bytes - wt_bytes : 0;
    d.rows = out_rows;
    d.lanes = lanes_for(im, d.rows);
    if ((size_t)d.lanes > avail / lane_bytes(s))
        d.lanes = (int)(avail / lane_bytes(s));
    const size_t tc = taps * (size_t)c;
    if (d.lanes == 0) { /* no scratch: one double at a time, straight into dw */
        for (size_t t = 0; t < taps; t++)
            for (int ch = 0; ch < c; ch++) {
                double acc = 0.0;
                const int ki = (int)(t / (size_t)s->kw), kj = (int)(t % (size_t)s->kw);
                for (size_t r = 0; r < out_rows; r++) {
                    const size_t smp = r / (size_t)s->oh;
                    const int iy = (int)(r % (size_t)s->oh) * s->stride - s->pad_top + ki;
                    if (iy < 0 || iy >= s->h)
                        continue;
                    for (int ox = 0; ox < s->ow; ox++) {
                        const int ix = ox * s->stride - s->pad_left + kj;
                        if (ix < 0 || ix >= s->w)
                            continue;
                        acc +=
                            (double)
                                x[((smp * (size_t)s->h + (size_t)iy) * (size_t)s->w + (size_t)ix) *
                                      (size_t)c +
                                  (size_t)ch] *
                            dy[(r * (size_t)s->ow + (size_t)ox) * (size_t)c + (size_t)ch];
                    }
                }
                dw[(size_t)ch * taps + t] = (float)acc;
            }
        return;
    }
    d.lane_mem = (char *)im->scratch + wt_bytes;
    mgt_cpu_lanes_run(im->lanes, d.lanes, bwd_filter_lane, &d);
    const double *acc0 = (const double *)(d.lane_mem + align64(tc * sizeof(float)));
    for (size_t t = 0; t < taps; t++)
        for (int ch = 0; ch < c; ch++) {
            double v = 0.0;
            for (int l = 0; l < d.lanes; l++)
                v += *(const double *)((const char *)(acc0 + t * (size_t)c + (size_t)ch) +
                                       (size_t)l * lane_bytes(s));
            dw[(size_t)ch * taps + t] = (float)v;
        }
}
