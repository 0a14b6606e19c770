/* convref.h: exact convolution results and their rounding bounds, for the op tests.
 *
 * conv_ref_make() computes, in double from the layouts' definitions (NHWC x/y, OIHW w), the
 * exact y = x (*) w + b, dx, dW and db of one convolution for a given dy, together with the
 * bounds opcheck.h's bound_ratio() needs: the same sums over absolute values for a direct
 * convolution (im2col + GEMM or the direct loops) and, for 3x3 stride-1 shapes, the absolute
 * transforms that bound Winograd F(2x2,3x3) and F(4x4,3x3). conv_ratio() then says how far a
 * backend's result is from the exact one in units of its bound (<= 1 passes) for the algorithm
 * that produced it. Buffers come from opcheck.h's arena. */
#ifndef MGT_TEST_CONVREF_H
#define MGT_TEST_CONVREF_H

#include <string.h>

#include "opcheck.h"

static inline double *dbuf(size_t n) {
    return tmp_alloc(n * sizeof(double), 0);
}

/* ---- Winograd's rounding bounds ----
 * Winograd computes the same bilinear form through transforms whose constants are not powers of
 * two, and its intermediate values carry terms that cancel only in exact arithmetic, so its
 * error is relative to a larger quantity than the direct convolution's sum of |w||x| - the
 * "growth" that makes F(4x4) less accurate than F(2x2). The bound below follows the algorithm:
 * for each output tile,
 *     |Y - y| <= gamma(k) * |A^T| [ sum_c |U_c| .* (|B^T| |d_c| |B|) ] |A| + gamma(k) |b|,
 * with U = G g G^T (computed in double, rounded once), d_c the tile's input, and k the roundings
 * on the longest path: two passes of the input transform (at most 3 each: a product by a
 * non-power-of-two constant and two additions), the rounding of U, the channel sum of the GEMMs
 * (C + 1 with the product), two passes of the output transform (at most 4 each, bias included):
 * k = C + 16. Backward filter, dg = G^T [ sum_tiles (A dY A^T) .* (B^T d B) ] G: its transforms
 * (at most 3 roundings per pass, four passes), the sum over all T tiles of the batch (T + 1)
 * and the final rounding of G^T S G (done in double): k = T + 14. Backward data is the forward
 * pass of dy with the rotated kernel and swapped channels. The matrices are Lavin & Gray's
 * (2016), the same points as src/cpu/cpu_winograd.c. */
typedef struct {
    int m, nt;
    double at[4][6], bt[6][6], g[6][3];
} wmat;

static inline const wmat *wmat_of(int m) {
    static const wmat f2 = {2,
                            4,
                            {{1, 1, 1, 0}, {0, 1, -1, -1}},
                            {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}},
                            {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}}};
    static const wmat f4 = {
        4,
        6,
        {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}},
        {{4, 0, -5, 0, 1, 0},
         {0, -4, -4, 1, 1, 0},
         {0, 4, -4, -1, 1, 0},
         {0, -2, -1, 2, 1, 0},
         {0, 2, -1, -2, 1, 0},
         {0, 4, 0, -5, 0, 1}},
        {{1.0 / 4, 0, 0},
         {-1.0 / 6, -1.0 / 6, -1.0 / 6},
         {-1.0 / 6, 1.0 / 6, -1.0 / 6},
         {1.0 / 24, 1.0 / 12, 1.0 / 6},
         {1.0 / 24, -1.0 / 12, 1.0 / 6},
         {0, 0, 1}}};
    return m == 2 ? &f2 : &f4;
}

/* |M| d |M|^T for an r x c matrix M (rows of length c) and a c x c tile d. */
static inline void abs_sandwich(int r, int c, const double (*mt)[6], const double *d, double *out) {
    double t[6][6];
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) {
            double acc = 0.0;
            for (int k = 0; k < c; k++)
                acc += fabs(mt[i][k]) * d[k * c + j];
            t[i][j] = acc;
        }
    for (int i = 0; i < r; i++)
        for (int j = 0; j < r; j++) {
            double acc = 0.0;
            for (int k = 0; k < c; k++)
                acc += t[i][k] * fabs(mt[j][k]);
            out[i * r + j] = acc;
        }
}

/* The absolute sum above for a correlation `in` (n, ih, iw, ic) -> `out` (n, oh, ow, oc), output
 * (oy, ox) reading input rows oy - pt .. oy - pt + 2: the 3x3 filter of output channel o and
 * input channel c is filt(o, c) (9 floats, row-major); bias may be NULL. */
typedef const float *(*filt_fn)(const float *w, int nin, int nout, int o, int c, float *tmp);

static inline const float *filt_fwd(const float *w, int nin, int nout, int o, int c, float *tmp) {
    (void)nout;
    (void)tmp;
    return w + ((size_t)o * nin + c) * 9;
}

/* Backward data: output channel o of the correlation is the layer's input channel, c its
 * output channel; the kernel turned by 180 degrees. */
static inline const float *filt_rot(const float *w, int nin, int nout, int o, int c, float *tmp) {
    (void)nin;
    const float *f = w + ((size_t)c * nout + o) * 9;
    for (int k = 0; k < 9; k++)
        tmp[k] = f[8 - k];
    return tmp;
}

static inline void wino_abs_corr(int m, int n, int ih, int iw, int ic, int oh, int ow, int oc,
                                 int pt, int pl, const float *in, const float *w, filt_fn filt,
                                 const float *bias, double *out) {
    const wmat *M = wmat_of(m);
    const int nt = M->nt, P = nt * nt, th = (oh + m - 1) / m, tw = (ow + m - 1) / m;
    double *U = dbuf((size_t)oc * ic * P), *V = dbuf((size_t)ic * P), *acc = dbuf((size_t)P);
    for (int o = 0; o < oc; o++) /* |U| = |G g G^T|, exact in double */
        for (int c = 0; c < ic; c++) {
            float tmp[9];
            const float *f = filt(w, ic, oc, o, c, tmp);
            double t[6][3];
            for (int i = 0; i < nt; i++)
                for (int j = 0; j < 3; j++)
                    t[i][j] = M->g[i][0] * f[j] + M->g[i][1] * f[3 + j] + M->g[i][2] * f[6 + j];
            for (int i = 0; i < nt; i++)
                for (int j = 0; j < nt; j++)
                    U[((size_t)o * ic + c) * P + i * nt + j] =
                        fabs(t[i][0] * M->g[j][0] + t[i][1] * M->g[j][1] + t[i][2] * M->g[j][2]);
        }
    double bt[6][6], at[4][6];
    memcpy(bt, M->bt, sizeof bt);
    memcpy(at, M->at, sizeof at);
    for (int s = 0; s < n; s++)
        for (int ty = 0; ty < th; ty++)
            for (int tx = 0; tx < tw; tx++) {
                for (int c = 0; c < ic; c++) { /* |B^T| |d| |B| */
                    double d[36];
                    for (int i = 0; i < nt; i++)
                        for (int j = 0; j < nt; j++) {
                            const int y = ty * m - pt + i, x = tx * m - pl + j;
                            d[i * nt + j] =
                                y < 0 || y >= ih || x < 0 || x >= iw
                                    ? 0.0
                                    : fabs(in[(((size_t)s * ih + y) * iw + x) * ic + c]);
                        }
                    abs_sandwich(nt, nt, (const double(*)[6])bt, d, V + (size_t)c * P);
                }
                for (int o = 0; o < oc; o++) {
                    for (int k = 0; k < P; k++)
                        acc[k] = 0.0;
                    for (int c = 0; c < ic; c++)
                        for (int k = 0; k < P; k++)
                            acc[k] += U[((size_t)o * ic + c) * P + k] * V[(size_t)c * P + k];
                    double yt[16];
                    abs_sandwich(m, nt, (const double(*)[6])at, acc, yt);
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < m; j++) {
                            const int y = ty * m + i, x = tx * m + j;
                            if (y < oh && x < ow)
                                out[(((size_t)s * oh + y) * ow + x) * oc + o] =
                                    yt[i * m + j] + (bias ? fabs(bias[o]) : 0.0);
                        }
                }
            }
}

/* Backward filter: |G|^T [ sum_tiles (|A| |dY| |A|^T) .* (|B^T| |d| |B|) ] |G| per (o, c). */
static inline void wino_abs_filter(int m, const mgt_conv_shape *s, const float *x, const float *dy,
                                   double *out) {
    const wmat *M = wmat_of(m);
    const int nt = M->nt, P = nt * nt, th = (s->oh + m - 1) / m, tw = (s->ow + m - 1) / m;
    double *S = dbuf((size_t)s->oc * s->c * P), *V = dbuf((size_t)s->c * P),
           *D = dbuf((size_t)s->oc * P);
    double bt[6][6], a[6][6] = {{0}}; /* |A| |dY| |A|^T = |A^T|^T |dY| |A^T|: a holds A (nt x m) */
    memcpy(bt, M->bt, sizeof bt);
    for (int i = 0; i < nt; i++)
        for (int j = 0; j < m; j++)
            a[i][j] = M->at[j][i];
    for (int n = 0; n < s->n; n++)
        for (int ty = 0; ty < th; ty++)
            for (int tx = 0; tx < tw; tx++) {
                for (int c = 0; c < s->c; c++) {
                    double d[36];
                    for (int i = 0; i < nt; i++)
                        for (int j = 0; j < nt; j++) {
                            const int y = ty * m - s->pad_top + i, xx = tx * m - s->pad_left + j;
                            d[i * nt + j] =
                                y < 0 || y >= s->h || xx < 0 || xx >= s->w
                                    ? 0.0
                                    : fabs(x[(((size_t)n * s->h + y) * s->w + xx) * s->c + c]);
                        }
                    abs_sandwich(nt, nt, (const double(*)[6])bt, d, V + (size_t)c * P);
                }
                for (int o = 0; o < s->oc; o++) {
                    double g[36] = {0}, t[6][6];
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < m; j++) {
                            const int y = ty * m + i, xx = tx * m + j;
                            g[i * m + j] =
                                y < s->oh && xx < s->ow
                                    ? fabs(dy[(((size_t)n * s->oh + y) * s->ow + xx) * s->oc + o])
                                    : 0.0;
                        }
                    for (int i = 0; i < nt; i++) /* t = |A| g (nt x m) */
                        for (int j = 0; j < m; j++) {
                            double acc = 0.0;
                            for (int k = 0; k < m; k++)
                                acc += fabs(a[i][k]) * g[k * m + j];
                            t[i][j] = acc;
                        }
                    for (int i = 0; i < nt; i++) /* (|A| g) |A|^T */
                        for (int j = 0; j < nt; j++) {
                            double acc = 0.0;
                            for (int k = 0; k < m; k++)
                                acc += t[i][k] * fabs(a[j][k]);
                            D[(size_t)o * P + i * nt + j] = acc;
                        }
                }
                for (int o = 0; o < s->oc; o++)
                    for (int c = 0; c < s->c; c++)
                        for (int k = 0; k < P; k++)
                            S[((size_t)o * s->c + c) * P + k] +=
                                D[(size_t)o * P + k] * V[(size_t)c * P + k];
            }
    for (int o = 0; o < s->oc; o++)
        for (int c = 0; c < s->c; c++) {
            const double *sm = S + ((size_t)o * s->c + c) * P;
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++) {
                    double acc = 0.0;
                    for (int k = 0; k < nt; k++)
                        for (int l = 0; l < nt; l++)
                            acc += fabs(M->g[k][i]) * sm[k * nt + l] * fabs(M->g[l][j]);
                    out[((size_t)o * s->c + c) * 9 + i * 3 + j] = acc;
                }
        }
}

/* Roundings on the longest path (see above). */
static inline double wino_k_corr(int channels) {
    return channels + 16.0;
}
static inline double wino_k_filter(int m, const mgt_conv_shape *s) {
    return (double)s->n * ((s->oh + m - 1) / m) * ((s->ow + m - 1) / m) + 14.0;
}

typedef struct {
    mgt_conv_shape s;
    double *y, *y_nob, *dx, *dw, *db;            /* exact */
    double *ya, *ya_nob, *dxa, *dwa, *dba;       /* direct: sums of |terms| */
    double *wy[2], *wy_nob[2], *wdx[2], *wdw[2]; /* F(2x2), F(4x4): absolute transforms */
} conv_ref;

/* The exact results and their bounds for x, w, b (may be NULL), dy. */
static inline conv_ref conv_ref_make(const mgt_conv_shape *s, const float *x, const float *w,
                                     const float *b, const float *dy) {
    conv_ref r = {.s = *s};
    const size_t nx = conv_nx(s), nw = conv_nw(s), ny = conv_ny(s);
    r.y = dbuf(ny), r.y_nob = dbuf(ny), r.dx = dbuf(nx), r.dw = dbuf(nw),
    r.db = dbuf((size_t)s->oc);
    r.ya = dbuf(ny), r.ya_nob = dbuf(ny), r.dxa = dbuf(nx), r.dwa = dbuf(nw),
    r.dba = dbuf((size_t)s->oc);
    for (int n = 0; n < s->n; n++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++)
                for (int o = 0; o < s->oc; o++) {
                    const size_t yi = (((size_t)n * s->oh + oy) * s->ow + ox) * s->oc + o;
                    double acc = 0.0, abs_acc = 0.0;
                    const double g = dy[yi], ga = fabs(g);
                    r.db[o] += g;
                    r.dba[o] += ga;
                    for (int ch = 0; ch < s->c; ch++)
                        for (int i = 0; i < s->kh; i++)
                            for (int j = 0; j < s->kw; j++) {
                                const int iy = oy * s->stride - s->pad_top + i;
                                const int ix = ox * s->stride - s->pad_left + j;
                                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w)
                                    continue;
                                const size_t xi = (((size_t)n * s->h + iy) * s->w + ix) * s->c + ch;
                                const size_t wi = (((size_t)o * s->c + ch) * s->kh + i) * s->kw + j;
                                acc += (double)w[wi] * x[xi];
                                abs_acc += fabs((double)w[wi] * x[xi]);
                                r.dx[xi] += g * w[wi];
                                r.dxa[xi] += ga * fabs(w[wi]);
                                r.dw[wi] += g * x[xi];
                                r.dwa[wi] += ga * fabs(x[xi]);
                            }
                    r.y_nob[yi] = acc;
                    r.ya_nob[yi] = abs_acc;
                    r.y[yi] = acc + (b ? b[o] : 0.0); /* the bias enters each output once */
                    r.ya[yi] = abs_acc + (b ? fabs(b[o]) : 0.0);
                }
    if (!(s->kh == 3 && s->kw == 3 && s->stride == 1) || s->n == 0)
        return r;
    for (int v = 0; v < 2; v++) {
        const int m = 2 + 2 * v;
        r.wy[v] = dbuf(ny), r.wy_nob[v] = dbuf(ny), r.wdx[v] = dbuf(nx), r.wdw[v] = dbuf(nw);
        wino_abs_corr(m, s->n, s->h, s->w, s->c, s->oh, s->ow, s->oc, s->pad_top, s->pad_left, x, w,
                      filt_fwd, NULL, r.wy_nob[v]);
        for (size_t i = 0; i < ny; i++)
            r.wy[v][i] = r.wy_nob[v][i] + (b ? fabs(b[i % (size_t)s->oc]) : 0.0);
        wino_abs_corr(m, s->n, s->oh, s->ow, s->oc, s->h, s->w, s->c, 2 - s->pad_top,
                      2 - s->pad_left, dy, w, filt_rot, NULL, r.wdx[v]);
        wino_abs_filter(m, s, x, dy, r.wdw[v]);
    }
    return r;
}

/* Which result: y (with the bias or without), dx, dW, db. */
enum { CONV_Y, CONV_Y_NOB, CONV_DX, CONV_DW, CONV_DB };

/* How far `a` is from the exact result, in units of its rounding bound, for the algorithm that
 * computed it: m = 2 or 4 for Winograd F(m x m), 0 for a direct convolution (im2col + GEMM or the
 * direct loops: dot products of kh kw C terms plus the bias; of up to kh kw OC terms for dx, as
 * col2im adds up the taps' columns after GEMMs of length OC; of the n oh ow rows for dW, the
 * GEMMs of row chunks accumulated in turn, + 1; and of the rows for db). */
static inline double conv_ratio(const conv_ref *r, int m, int which, const float *a) {
    const mgt_conv_shape *s = &r->s;
    const double taps = (double)s->kh * s->kw, rows = (double)s->n * s->oh * s->ow;
    const int v = m / 4;
    switch (which) {
    case CONV_Y:
    case CONV_Y_NOB: {
        const int nob = which == CONV_Y_NOB;
        if (m)
            return bound_ratio(a, nob ? r->y_nob : r->y, nob ? r->wy_nob[v] : r->wy[v], conv_ny(s),
                               wino_k_corr(s->c));
        return bound_ratio(a, nob ? r->y_nob : r->y, nob ? r->ya_nob : r->ya, conv_ny(s),
                           taps * s->c + 1.0);
    }
    case CONV_DX:
        if (m)
            return bound_ratio(a, r->dx, r->wdx[v], conv_nx(s), wino_k_corr(s->oc));
        return bound_ratio(a, r->dx, r->dxa, conv_nx(s), taps * s->oc + taps);
    case CONV_DW:
        if (m)
            return bound_ratio(a, r->dw, r->wdw[v], conv_nw(s), wino_k_filter(m, s));
        return bound_ratio(a, r->dw, r->dwa, conv_nw(s), rows + 1.0);
    default:
        return bound_ratio(a, r->db, r->dba, (size_t)s->oc, rows);
    }
}

/* For a result whose algorithm the caller does not pin down (the op table's choice, or its
 * fallbacks as scratch shrinks): within the bound of a direct convolution or, for 3x3 stride-1
 * shapes, of either Winograd variant. */
static inline double conv_ratio_any(const conv_ref *r, int which, const float *a) {
    double best = conv_ratio(r, 0, which, a);
    if (r->wy[0] && which != CONV_DB)
        for (int m = 2; m <= 4; m += 2) {
            const double q = conv_ratio(r, m, which, a);
            best = q < best ? q : best;
        }
    return best;
}

#endif
