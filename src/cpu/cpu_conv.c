/* cpu_conv.c: 2-D convolution (cross-correlation) on NHWC activations with OIHW weights, by
 * im2col + OpenBLAS GEMM. This is the CPU backend's hot path.
 *
 * The output positions of the whole batch are n*oh*ow rows; row r of the column matrix holds
 * the K = kh*kw*c input values its window sees, ordered (kh, kw, c): NHWC's order, so that a
 * window's row of kw pixels is one contiguous copy (of kw*c floats) both ways, in im2col and in
 * col2im (the (c, kh, kw) order this file used before read a window a float at a time; at
 * batch 128 on a 2-core Xeon the seed ConvNet's direct step took 985 instead of 1097 ms, medians
 * of four interleaved runs each, with im2col and col2im 8% of the CPU time instead of 15%). The
 * OIHW weight is copied into that order first, Wt[oc][kh][kw][c] (oc*K floats, at the front of
 * the scratch buffer), and multiplies the column matrix as a [oc][K] matrix:
 *     forward    y[rows][oc]  = col * Wt^T (+ b)
 *     backward   dWt[oc][K]   = dy^T * col     (summed over chunks in dW, then reordered there
 *                                              to OIHW one filter at a time)
 *                dcol[rows][K] = dy * Wt,  scattered back into dx (col2im)
 *                db[oc]       = column sums of dy
 * With one channel, or a 1x1 window, the two orders are the same and W is used as it is.
 * Zero padding is done in im2col: a window position outside the input reads 0 (pad_top and
 * pad_left are given, the bottom/right padding is whatever makes oh/ow fit).
 *
 * The column matrix of a whole batch is large (n*oh*ow*K floats), so rows are processed in
 * chunks that fit the backend's scratch buffer. conv2d_scratch() asks for the reordered weights
 * plus enough whole samples to fill about MGT_CPU_CONV_CHUNK_BYTES (at least one sample). If
 * less scratch is there, the chunks just get smaller (any number of rows, not necessarily whole
 * samples); the backward pass reuses the same buffer for col and then dcol, so one buffer is all
 * either pass needs.
 * Two special cases:
 *   - a 1x1, stride 1, unpadded convolution is a plain matrix product on x: no im2col, no
 *     scratch;
 *   - if the scratch cannot hold even one row (reserve() was never called, say), a direct
 *     loop computes the same result without any buffer: slow, but it never fails.
 *
 * 3x3 stride-1 layers go through Winograd instead (cpu_winograd.c), for each of the three
 * products (forward, backward data, backward filter); mgt_cpu_conv_wino_tile() below says which
 * variant, and why. Every other stride-1 product (all of them with algo DIRECT) is computed from
 * NHWC in place by cpu_convk.c, without columns; im2col is left with the strided layers, the
 * backward filter of output channels that are not a multiple of 32, and whatever the reserved
 * scratch is too small for: it always can run. The scratch is sized for the paths a shape
 * takes. */
#include <cblas.h>
#include <string.h>

#include "cpu_internal.h"

/* Target size of one chunk's column buffer: big enough that each GEMM has thousands of rows,
 * small enough to stay bounded whatever the batch size. */
#define MGT_CPU_CONV_CHUNK_BYTES ((size_t)16 << 20)
/* Most scratch a layer may ask for on Winograd's behalf. */
#define MGT_CPU_CONV_MAX_SCRATCH ((size_t)64 << 20)

static size_t conv_k(const mgt_conv_shape *s) {
    return (size_t)s->c * (size_t)s->kh * (size_t)s->kw;
}

static int conv_is_pointwise(const mgt_conv_shape *s) {
    return s->kh == 1 && s->kw == 1 && s->stride == 1 && s->pad_top == 0 && s->pad_left == 0 &&
           s->oh == s->h && s->ow == s->w;
}

/* Whether the (kh, kw, c) column order differs from OIHW's (c, kh, kw). */
static int conv_reorders(const mgt_conv_shape *s) {
    return s->c > 1 && (size_t)s->kh * s->kw > 1;
}

/* Floats at the front of the scratch for the reordered weights (rounded up to 64 bytes, so that
 * the column matrix after them stays aligned). */
static size_t conv_w_floats(const mgt_conv_shape *s) {
    return conv_reorders(s) ? ((size_t)s->oc * conv_k(s) + 15) / 16 * 16 : 0;
}

/* One filter's K values: OIHW's [c][kh][kw] -> [kh][kw][c], or back (to_oihw). */
static void conv_w_reorder_row(const mgt_conv_shape *s, const float *restrict src,
                               float *restrict dst, int to_oihw) {
    const size_t c = (size_t)s->c, khw = (size_t)s->kh * s->kw;
    for (size_t ch = 0; ch < c; ch++)
        for (size_t q = 0; q < khw; q++) {
            if (to_oihw)
                dst[ch * khw + q] = src[q * c + ch];
            else
                dst[q * c + ch] = src[ch * khw + q];
        }
}

/* The weights in the columns' order, at the front of the scratch. */
static const float *conv_w_cols(const mgt_cpu_impl *im, const mgt_conv_shape *s, const float *w) {
    if (!conv_reorders(s))
        return w;
    for (size_t o = 0; o < (size_t)s->oc; o++)
        conv_w_reorder_row(s, w + o * conv_k(s), im->scratch + o * conv_k(s), 0);
    return im->scratch;
}

/* Rows per chunk conv2d_scratch() sizes for: whole samples, as many as fit the target. */
static size_t conv_target_rows(const mgt_conv_shape *s) {
    const size_t ohw = (size_t)s->oh * (size_t)s->ow;
    const size_t per_sample = ohw * conv_k(s) * sizeof(float);
    const size_t n = s->n > 0 ? (size_t)s->n : 1;
    size_t ns = per_sample ? MGT_CPU_CONV_CHUNK_BYTES / per_sample : n;
    if (ns < 1)
        ns = 1;
    if (ns > n)
        ns = n;
    return ns * ohw;
}

/* Winograd's output tile side for this layer (2 or 4), or 0 for im2col.
 * Every 3x3 stride-1 convolution goes through Winograd unless its algorithm is DIRECT (AUTO and
 * WINOGRAD take it alike: it is the faster wherever it applies). Measured at batch 128 on this
 * 2-core Xeon (OpenBLAS 0.3.21, 2 threads; ms fwd / bwd data / bwd filter, best of 5 to 9
 * interleaved runs), it beats im2col by a wide margin wherever the channel counts are not tiny and
 * is no slower with one input channel (im2col's GEMMs are thin there, Winograd's lanes run the
 * transforms in parallel):
 *                                   im2col         F(2x2)         F(4x4)
 *   28x28x1 -> 32 valid (conv1)     4.0/4.7/7.3    3.2/4.2/3.3    5.2/4.7/3.9
 *   28x28x1 -> 16 same              3.6/3.7/4.7    3.9/5.5/4.1    3.1/3.3/2.4
 *   14x14x16 -> 32 same             9.5/6.7/8.2    3.4/2.7/2.7    2.3/2.7/2.4
 *   7x7x64 -> 64 same               6.2/4.1/5.7    1.9/2.0/1.9    1.3/1.9/1.5
 *   26x26x32 -> 256 valid (conv2)   91/67/92       50/41/42       37/31/27
 *   24x24x256 -> 128 valid (conv3)  322/225/353    107/105/102    69/71/73
 * F(4x4) needs fewer multiplications unless its larger tiles overhang the output much (a 2x2
 * or 6x6 output: F(2x2) tiles it exactly), so the choice is the variant with fewer
 * multiplications per channel pair, F(2x2) on a tie since it is the more accurate: relative to
 * the largest output, F(2x2) stays around 1e-7..1e-6 and F(4x4) around 1e-6..1.3e-5 of the
 * direct convolution in float32, both within 1e-4 (tests/unit/test_winograd.c). */
int mgt_cpu_conv_wino_tile(const mgt_conv_shape *s) {
    if (s->algo == MGT_CONV_DIRECT || !mgt_cpu_wino_fits(s))
        return 0;
    /* backward data tiles dx (h x w), the other passes y (oh x ow): count both */
    const long long t2 = (long long)((s->oh + 1) / 2) * ((s->ow + 1) / 2) +
                         (long long)((s->h + 1) / 2) * ((s->w + 1) / 2);
    const long long t4 = (long long)((s->oh + 3) / 4) * ((s->ow + 3) / 4) +
                         (long long)((s->h + 3) / 4) * ((s->w + 3) / 4);
    int m = 36 * t4 < 16 * t2 ? 4 : 2;
    /* Winograd keeps the transformed filters whole (P x c x oc floats, twice): for very wide
     * layers that would pass the scratch bound, F(2x2)'s 16 positions, or else im2col. */
    if (m == 4 && mgt_cpu_wino_scratch(s, 4) > MGT_CPU_CONV_MAX_SCRATCH)
        m = 2;
    return mgt_cpu_wino_scratch(s, m) <= MGT_CPU_CONV_MAX_SCRATCH ? m : 0;
}

size_t mgt_cpu_conv2d_scratch(const mgt_conv_shape *s) {
    if (conv_is_pointwise(s))
        return 0;
    const size_t cols = (conv_w_floats(s) + conv_target_rows(s) * conv_k(s)) * sizeof(float);
    const int m = mgt_cpu_conv_wino_tile(s);
    if (m) {
        const size_t wino = mgt_cpu_wino_scratch(s, m);
        return wino > cols ? wino : cols;
    }
    /* cpu_convk.c's passes; the columns only for a pass it does not take */
    const size_t direct = mgt_cpu_convk_scratch(s);
    if (mgt_cpu_convk_fits(s, MGT_CPU_CONVK_FORWARD) && mgt_cpu_convk_fits(s, MGT_CPU_CONVK_DATA) &&
        mgt_cpu_convk_fits(s, MGT_CPU_CONVK_FILTER))
        return direct;
    return direct > cols ? direct : cols;
}

/* Rows per chunk the reserved scratch allows: the target, or fewer; 0 if not even one fits. */
static size_t conv_chunk_rows(const mgt_cpu_impl *im, const mgt_conv_shape *s) {
    const size_t wf = conv_w_floats(s) * sizeof(float);
    const size_t fit = im->scratch && im->scratch_bytes > wf
                           ? (im->scratch_bytes - wf) / (conv_k(s) * sizeof(float))
                           : 0;
    const size_t want = conv_target_rows(s);
    return fit < want ? fit : want;
}

/* Walks output rows in order, keeping (sample, oy, ox) without a division per row. */
typedef struct {
    size_t smp;
    int oy, ox;
} conv_pos;

static conv_pos conv_pos_at(const mgt_conv_shape *s, size_t r) {
    const size_t ohw = (size_t)s->oh * s->ow;
    const size_t p = r % ohw;
    return (conv_pos){r / ohw, (int)(p / (size_t)s->ow), (int)(p % (size_t)s->ow)};
}

static void conv_pos_next(const mgt_conv_shape *s, conv_pos *p) {
    if (++p->ox == s->ow) {
        p->ox = 0;
        if (++p->oy == s->oh) {
            p->oy = 0;
            p->smp++;
        }
    }
}

/* Fills col[r - r0][K] for output rows [r0, r1): for each of the window's kh rows, the kw
 * pixels it sees (kw*c contiguous floats of NHWC x), zeros where the window leaves the input. */
MGT_SIMD
static void im2col(const mgt_conv_shape *s, const float *restrict x, size_t r0, size_t r1,
                   float *restrict col) {
    const int c = s->c, kh = s->kh, kw = s->kw, h = s->h, w = s->w;
    const size_t K = conv_k(s), sample = (size_t)h * w * c, pix = (size_t)c;
    conv_pos p = conv_pos_at(s, r0);
    for (size_t r = r0; r < r1; r++, conv_pos_next(s, &p)) {
        float *restrict row = col + (r - r0) * K;
        const float *restrict xs = x + p.smp * sample;
        const int iy0 = p.oy * s->stride - s->pad_top, ix0 = p.ox * s->stride - s->pad_left;
        /* the window's columns inside the input: j in [j0, j1) */
        const int j0 = ix0 < 0 ? -ix0 : 0, j1 = ix0 + kw > w ? w - ix0 : kw;
        for (int i = 0; i < kh; i++, row += (size_t)kw * pix) {
            const int iy = iy0 + i;
            if (iy < 0 || iy >= h || j0 >= j1) {
                memset(row, 0, sizeof(float) * (size_t)kw * pix);
                continue;
            }
            if (j0 > 0)
                memset(row, 0, sizeof(float) * (size_t)j0 * pix);
            memcpy(row + (size_t)j0 * pix, xs + ((size_t)iy * w + (size_t)(ix0 + j0)) * pix,
                   sizeof(float) * (size_t)(j1 - j0) * pix);
            if (j1 < kw)
                memset(row + (size_t)j1 * pix, 0, sizeof(float) * (size_t)(kw - j1) * pix);
        }
    }
}

/* The adjoint of im2col: adds dcol's rows [r0, r1) into dx at the pixels they were read from
 * (padding positions are dropped). dx must have been zeroed before the first chunk. */
MGT_SIMD
static void col2im(const mgt_conv_shape *s, const float *restrict dcol, size_t r0, size_t r1,
                   float *restrict dx) {
    const int c = s->c, kh = s->kh, kw = s->kw, h = s->h, w = s->w;
    const size_t K = conv_k(s), sample = (size_t)h * w * c, pix = (size_t)c;
    conv_pos p = conv_pos_at(s, r0);
    for (size_t r = r0; r < r1; r++, conv_pos_next(s, &p)) {
        const float *restrict row = dcol + (r - r0) * K;
        float *restrict xs = dx + p.smp * sample;
        const int iy0 = p.oy * s->stride - s->pad_top, ix0 = p.ox * s->stride - s->pad_left;
        const int j0 = ix0 < 0 ? -ix0 : 0, j1 = ix0 + kw > w ? w - ix0 : kw;
        if (j0 >= j1)
            continue;
        const size_t n = (size_t)(j1 - j0) * pix;
        for (int i = 0; i < kh; i++) {
            const int iy = iy0 + i;
            if (iy < 0 || iy >= h)
                continue;
            const float *restrict sc = row + ((size_t)i * kw + (size_t)j0) * pix;
            float *restrict dst = xs + ((size_t)iy * w + (size_t)(ix0 + j0)) * pix;
            for (size_t q = 0; q < n; q++)
                dst[q] += sc[q];
        }
    }
}

/* y[rows][oc] = col[rows][K] * W^T + b; the bias is copied in first and the GEMM adds to it. */
static void conv_gemm_fwd(mgt_cpu_lanes *lanes, size_t rows, size_t K, int oc, const float *col,
                          const float *w, const float *b, float *y) {
    float beta = 0.0f;
    if (b) {
        for (size_t r = 0; r < rows; r++)
            memcpy(y + r * oc, b, sizeof(float) * (size_t)oc);
        beta = 1.0f;
    }
    mgt_cpu_gemm(lanes, CblasNoTrans, CblasTrans, (int)rows, oc, (int)K, 1.0f, col, (int)K, w,
                 (int)K, beta, y, oc);
}

/* im2col over the lanes: rows [r0, r1) of the column matrix, cut by rows (each row is written
 * alone). */
typedef struct {
    const mgt_conv_shape *s;
    const float *x;
    size_t r0;
    float *col;
} im2col_job;

static void im2col_part(void *p, size_t lo, size_t hi) {
    const im2col_job *j = p;
    im2col(j->s, j->x, j->r0 + lo, j->r0 + hi, j->col + lo * conv_k(j->s));
}

static void im2col_lanes(mgt_cpu_lanes *lanes, const mgt_conv_shape *s, const float *x, size_t r0,
                         size_t r1, float *col) {
    im2col_job j = {s, x, r0, col};
    mgt_cpu_lanes_for(lanes, r1 - r0, ((size_t)1 << 14) / conv_k(s) + 1, im2col_part, &j);
}

/* col2im over the lanes: the chunk's rows [r0, r1) cut at sample boundaries, each lane a run of
 * whole samples (a window adds into its own sample's dx only). Every pixel of dx still receives
 * its rows' values in the order of the rows, so the bits are those of one thread. */
typedef struct {
    const mgt_conv_shape *s;
    const float *dcol;
    size_t r0, r1, first, samples;
    int lanes;
    float *dx;
} col2im_job;

static void col2im_lane(void *p, int lane) {
    const col2im_job *j = p;
    const size_t ohw = (size_t)j->s->oh * j->s->ow;
    const size_t s0 = j->first + j->samples * (size_t)lane / (size_t)j->lanes;
    const size_t s1 = j->first + j->samples * (size_t)(lane + 1) / (size_t)j->lanes;
    const size_t lo = s0 * ohw > j->r0 ? s0 * ohw : j->r0;
    const size_t hi = s1 * ohw < j->r1 ? s1 * ohw : j->r1;
    if (lo < hi)
        col2im(j->s, j->dcol + (lo - j->r0) * conv_k(j->s), lo, hi, j->dx);
}

static void col2im_lanes(mgt_cpu_lanes *lanes, const mgt_conv_shape *s, const float *dcol,
                         size_t r0, size_t r1, float *dx) {
    const size_t ohw = (size_t)s->oh * s->ow;
    col2im_job j = {.s = s, .dcol = dcol, .r0 = r0, .r1 = r1, .first = r0 / ohw, .dx = dx};
    j.samples = (r1 - 1) / ohw - j.first + 1;
    const int n = mgt_cpu_lanes_count(lanes);
    j.lanes = (size_t)n < j.samples ? n : (int)j.samples;
    mgt_cpu_lanes_run(lanes, j.lanes, col2im_lane, &j);
}

/* ---- direct fallback (no scratch at all) ---- */

MGT_SIMD
static void conv_direct_fwd(const mgt_conv_shape *s, const float *x, const float *w, const float *b,
                            float *y) {
    const int c = s->c, kh = s->kh, kw = s->kw, oc = s->oc;
    const size_t khw = (size_t)kh * kw, K = conv_k(s), sample = (size_t)s->h * s->w * c;
    const size_t rows = (size_t)s->n * s->oh * s->ow;
    conv_pos p = conv_pos_at(s, 0);
    for (size_t r = 0; r < rows; r++, conv_pos_next(s, &p)) {
        const float *xs = x + p.smp * sample;
        const int iy0 = p.oy * s->stride - s->pad_top, ix0 = p.ox * s->stride - s->pad_left;
        for (int o = 0; o < oc; o++) {
            double acc = b ? b[o] : 0.0;
            for (int i = 0; i < kh; i++) {
                const int iy = iy0 + i;
                if (iy < 0 || iy >= s->h)
                    continue;
                for (int j = 0; j < kw; j++) {
                    const int ix = ix0 + j;
                    if (ix < 0 || ix >= s->w)
                        continue;
                    const float *xp = xs + ((size_t)iy * s->w + ix) * c;
                    const float *wp = w + o * K + (size_t)i * kw + j;
                    for (int ch = 0; ch < c; ch++)
                        acc += (double)wp[ch * khw] * xp[ch];
                }
            }
            y[r * oc + o] = (float)acc;
        }
    }
}

MGT_SIMD
static void conv_direct_bwd(const mgt_conv_shape *s, const float *x, const float *w,
                            const float *dy, float *dx, float *dw) {
    const int c = s->c, kh = s->kh, kw = s->kw, oc = s->oc;
    const size_t khw = (size_t)kh * kw, K = conv_k(s), sample = (size_t)s->h * s->w * c;
    const size_t rows = (size_t)s->n * s->oh * s->ow;
    if (dw)
        memset(dw, 0, sizeof(float) * (size_t)oc * K);
    if (dx)
        memset(dx, 0, sizeof(float) * (size_t)s->n * sample);
    conv_pos p = conv_pos_at(s, 0);
    for (size_t r = 0; r < rows; r++, conv_pos_next(s, &p)) {
        const size_t xoff = p.smp * sample;
        const int iy0 = p.oy * s->stride - s->pad_top, ix0 = p.ox * s->stride - s->pad_left;
        for (int o = 0; o < oc; o++) {
            const float g = dy[r * oc + o];
            for (int i = 0; i < kh; i++) {
                const int iy = iy0 + i;
                if (iy < 0 || iy >= s->h)
                    continue;
                for (int j = 0; j < kw; j++) {
                    const int ix = ix0 + j;
                    if (ix < 0 || ix >= s->w)
                        continue;
                    const size_t pix = xoff + ((size_t)iy * s->w + ix) * c;
                    const size_t wo = o * K + (size_t)i * kw + j;
                    for (int ch = 0; ch < c; ch++) {
                        if (dw)
                            dw[wo + ch * khw] += g * x[pix + ch];
                        if (dx)
                            dx[pix + ch] += g * w[wo + ch * khw];
                    }
                }
            }
        }
    }
}

/* ---- ops ---- */

/* The convolution into y; 1 where s->act is still to be applied, 0 where the kernel did. */
static int conv_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                    const float *b, float *y) {
    const size_t rows = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    const size_t K = conv_k(s);
    const int oc = s->oc;
    if (rows == 0 || oc <= 0)
        return 0;
    if (K == 0) { /* no input channels: only the bias */
        for (size_t r = 0; r < rows; r++)
            for (int o = 0; o < oc; o++)
                y[r * oc + o] = b ? b[o] : 0.0f;
        return 1;
    }
    mgt_cpu_impl *im = mgt_cpu_impl_of(be);
    if (conv_is_pointwise(s)) {
        conv_gemm_fwd(im->lanes, rows, K, oc, x, w, b, y);
        return 1;
    }
    const int m = mgt_cpu_conv_wino_tile(s);
    if (m && mgt_cpu_wino_fwd(im->scratch, im->scratch_bytes, im->lanes, m, s, x, w, b, y) == 0)
        return 1;
    if (mgt_cpu_convk_fwd(im->scratch, im->scratch_bytes, im->lanes, s, x, w, b, y) == 0)
        return 0; /* the ReLU in its stores */
    const size_t chunk = conv_chunk_rows(im, s);
    if (chunk == 0) {
        conv_direct_fwd(s, x, w, b, y);
        return 1;
    }
    const float *wt = conv_w_cols(im, s, w);
    float *col = im->scratch + conv_w_floats(s);
    for (size_t r0 = 0; r0 < rows; r0 += chunk) {
        const size_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
        im2col_lanes(im->lanes, s, x, r0, r1, col);
        conv_gemm_fwd(im->lanes, r1 - r0, K, oc, col, wt, b, y + r0 * oc);
    }
    return 1;
}

void mgt_cpu_conv2d_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y) {
    if (conv_fwd(be, s, x, w, b, y) && s->act != MGT_ACT_NONE)
        mgt_cpu_act_fwd(be, s->act, s->n * s->oh, s->ow * s->oc, y, y);
}

void mgt_cpu_conv2d_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db) {
    const size_t rows = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    const size_t K = conv_k(s);
    const int oc = s->oc > 0 ? s->oc : 0;
    const size_t x_count = (size_t)(s->n > 0 ? s->n : 0) * s->h * s->w * (s->c > 0 ? s->c : 0);

    mgt_cpu_impl *im = mgt_cpu_impl_of(be);
    if (db) /* zeros when rows == 0 */
        mgt_cpu_channel_sums(be, rows, oc, dy, db, NULL);
    if (rows == 0 || oc == 0 || K == 0) {
        /* Nothing flows: parameter gradients are overwritten with zeros, dx too. */
        if (dw)
            memset(dw, 0, sizeof(float) * (size_t)oc * K);
        if (dx && x_count)
            memset(dx, 0, sizeof(float) * x_count);
        return;
    }
    if (conv_is_pointwise(s)) { /* col is x itself and col2im is the identity */
        if (dw)
            mgt_cpu_gemm(im->lanes, CblasTrans, CblasNoTrans, oc, (int)K, (int)rows, 1.0f, dy, oc,
                         x, (int)K, 0.0f, dw, (int)K);
        if (dx)
            mgt_cpu_gemm(im->lanes, CblasNoTrans, CblasNoTrans, (int)rows, (int)K, oc, 1.0f, dy, oc,
                         w, (int)K, 0.0f, dx, (int)K);
        return;
    }
    /* Winograd takes each of the two products it can; whatever is left goes through im2col. */
    const int m = mgt_cpu_conv_wino_tile(s);
    if (m && dw &&
        mgt_cpu_wino_bwd_filter(im->scratch, im->scratch_bytes, im->lanes, m, s, x, dy, dw) == 0)
        dw = NULL;
    if (m && dx &&
        mgt_cpu_wino_bwd_data(im->scratch, im->scratch_bytes, im->lanes, m, s, w, dy, dx) == 0)
        dx = NULL;
    if (dw && mgt_cpu_convk_bwd_filter(im->scratch, im->scratch_bytes, im->lanes, s, x, dy, dw) == 0)
        dw = NULL;
    if (dx && mgt_cpu_convk_bwd_data(im->scratch, im->scratch_bytes, im->lanes, s, w, dy, dx) == 0)
        dx = NULL;
    if (!dw && !dx)
        return;
    const size_t chunk = conv_chunk_rows(im, s);
    if (chunk == 0) {
        conv_direct_bwd(s, x, w, dy, dx, dw);
        return;
    }
    if (dx)
        memset(dx, 0, sizeof(float) * x_count);
    const float *wt = dx ? conv_w_cols(im, s, w) : NULL;
    float *col = im->scratch + conv_w_floats(s); /* col for dW, then overwritten by dcol */
    for (size_t r0 = 0; r0 < rows; r0 += chunk) {
        const size_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
        const int m = (int)(r1 - r0);
        const float *dyc = dy + r0 * oc;
        if (dw) {
            im2col_lanes(im->lanes, s, x, r0, r1, col);
            mgt_cpu_gemm(im->lanes, CblasTrans, CblasNoTrans, oc, (int)K, m, 1.0f, dyc, oc, col,
                         (int)K, r0 == 0 ? 0.0f : 1.0f, dw, (int)K);
        }
        if (dx) {
            mgt_cpu_gemm(im->lanes, CblasNoTrans, CblasNoTrans, m, (int)K, oc, 1.0f, dyc, oc, wt,
                         (int)K, 0.0f, col, (int)K);
            col2im_lanes(im->lanes, s, col, r0, r1, dx);
        }
    }
    if (dw && conv_reorders(s)) /* col, done with, holds each filter's row as it is moved */
        for (size_t o = 0; o < (size_t)oc; o++) {
            memcpy(col, dw + o * K, sizeof(float) * K);
            conv_w_reorder_row(s, col, dw + o * K, 1);
        }
}
