/* test_ops.c: unit tests of the CPU reference backend (src/cpu/) against backend.h.
 *
 * What is checked:
 *  - every backward op against central finite differences of the scalar L = sum(y * r) for a
 *    fixed random r (float32 forward, eps 1e-2, error normalised by the largest analytic
 *    gradient component, tolerance 2e-2); outputs are filled with NaN before every call so an
 *    element an op forgets to write shows up;
 *  - forward values against independent naive references computed in double;
 *  - convolution chunking (small scratch, no scratch) against one big chunk (Winograd's own
 *    chunking and its choice by the op table: test_winograd.c);
 *  - n == 0 backward writing zeros; BatchNorm statistics; dropout's mask rule and its
 *    independence from how the batch is split; optimizer steps against hand-computed values;
 *    cross-entropy on small hand examples;
 *  - the lanes (src/cpu/cpu_lanes.c): a split range visits every item exactly once in parts
 *    cut at multiples of 16, BLAS runs single-threaded inside the lanes (one lane too) and gets
 *    its thread count back after, and every op that splits its work across lanes (activations,
 *    dropout, BatchNorm, column sums, pooling, the direct convolution's gradients) gives bit for
 *    bit the same result on 1 to 4 threads, on shapes large enough to be split; the split
 *    column sums equal mgt_cpu_colsum's; GEMMs split across the lanes (mgt_cpu_gemm), every
 *    transpose, within gamma(K + 2) of a double reference and bit for bit the same on 1 to 4
 *    lanes.
 * Each failing check prints its numbers; main returns non-zero if any check failed. */
#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_internal.h"
#include "util.h"

#define OPCHECK_KEY 0x7e57ULL
#include "convref.h"
#include "fdcheck.h"
#include "opcheck.h"

/* Uniform in [lo, hi] but at least `gap` away from 0 (keeps FD clear of the ReLU kink). */
static void fill_away_from_zero(float *a, size_t n, float lo, float hi, float gap) {
    for (size_t i = 0; i < n; i++) {
        float v;
        do
            v = frand(lo, hi);
        while (fabsf(v) < gap);
        a[i] = v;
    }
}

/* =============================== dense =============================== */

typedef struct {
    mgt_backend *be;
    int n, in, out;
    float *x, *w, *b, *y, *r;
} dense_ctx;

static double dense_obj(void *p) {
    dense_ctx *c = p;
    poison(c->y, (size_t)c->n * c->out);
    c->be->ops->dense_fwd(c->be, c->n, c->in, c->out, c->x, c->w, c->b, c->y);
    return dot(c->y, c->r, (size_t)c->n * c->out);
}

/* y = x W^T + b in double, and the same over absolute values (the rounding bound's scale). */
static void ref_dense(int n, int in, int out, const float *x, const float *w, const float *b,
                      double *y, double *ya) {
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double acc = b ? b[o] : 0.0, abs_acc = b ? fabs(b[o]) : 0.0;
            for (int k = 0; k < in; k++) {
                acc += (double)x[i * in + k] * w[o * in + k];
                abs_acc += fabs((double)x[i * in + k] * w[o * in + k]);
            }
            y[i * out + o] = acc;
            ya[i * out + o] = abs_acc;
        }
}

static void test_dense(mgt_backend *be) {
    /* forward against the naive reference, with and without bias */
    {
        const int n = 33, in = 65, out = 17;
        float *x = fbuf(n * in), *w = fbuf(out * in), *b = fbuf(out), *y = fbuf(n * out);
        double *ref = dbuf(n * out), *refa = dbuf(n * out);
        fill(x, n * in, -1, 1);
        fill(w, out * in, -1, 1);
        fill(b, out, -1, 1);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *bb = with_bias ? b : NULL;
            poison(y, n * out);
            be->ops->dense_fwd(be, n, in, out, x, w, bb, y);
            ref_dense(n, in, out, x, w, bb, ref, refa);
            /* a dot product of `in` terms plus the bias: at most in + 1 roundings */
            const double r = bound_ratio(y, ref, refa, n * out, in + 1.0);
            CHECK(r <= 1.0, "dense_fwd (bias %d) vs naive: error %.3g of its rounding bound",
                  with_bias, r);
        }
        tmp_free_all();
    }
    /* gradients */
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        dense_ctx c = {.be = be, .n = 5, .in = 7, .out = 4};
        const size_t nx = c.n * c.in, nw = c.out * c.in, ny = c.n * c.out;
        c.x = fbuf(nx), c.w = fbuf(nw), c.b = with_bias ? fbuf(c.out) : NULL, c.y = fbuf(ny),
        c.r = fbuf(ny);
        fill(c.x, nx, -1, 1);
        fill(c.w, nw, -1, 1);
        if (c.b)
            fill(c.b, c.out, -1, 1);
        fill(c.r, ny, -1, 1);
        float *dx = fbuf(nx), *dw = fbuf(nw), *db = fbuf(c.out);
        poison(dx, nx);
        poison(dw, nw);
        poison(db, c.out);
        be->ops->dense_bwd(be, c.n, c.in, c.out, c.x, c.w, c.r, dx, dw, c.b ? db : NULL);
        fd_check(with_bias ? "dense dx (bias)" : "dense dx", dense_obj, &c, c.x, nx, dx);
        fd_check(with_bias ? "dense dW (bias)" : "dense dW", dense_obj, &c, c.w, nw, dw);
        if (c.b)
            fd_check("dense db", dense_obj, &c, c.b, c.out, db);
        /* dx == NULL is allowed and must leave the parameter gradients right */
        float *dw2 = fbuf(nw);
        poison(dw2, nw);
        be->ops->dense_bwd(be, c.n, c.in, c.out, c.x, c.w, c.r, NULL, dw2, NULL);
        CHECK(rel_err(dw2, dw, nw, 1e-30) == 0.0, "dense_bwd with dx NULL: dW differs (rel %.3g)",
              rel_err(dw2, dw, nw, 1e-30));
        tmp_free_all();
    }
    /* dense_bwd_rows (optional): rows r0 .. r1 - 1 of dW = dy^T x against the exact sums, each
     * a dot product of n terms (gamma_n bound), the other rows untouched; n == 0 zeroes them */
    if (be->ops->dense_bwd_rows) {
        const int n = 37, in = 70, out = 50, r0 = 16, r1 = 48;
        float *x = fbuf(n * in), *dy = fbuf(n * out), *dw = fbuf(out * in);
        double *ref = dbuf((r1 - r0) * in), *refa = dbuf((r1 - r0) * in);
        fill(x, n * in, -1, 1);
        fill(dy, n * out, -1, 1);
        for (int r = r0; r < r1; r++)
            for (int k = 0; k < in; k++) {
                double acc = 0, abs_acc = 0;
                for (int i = 0; i < n; i++) {
                    acc += (double)dy[i * out + r] * x[i * in + k];
                    abs_acc += fabs((double)dy[i * out + r] * x[i * in + k]);
                }
                ref[(r - r0) * in + k] = acc;
                refa[(r - r0) * in + k] = abs_acc;
            }
        poison(dw, out * in);
        be->ops->dense_bwd_rows(be, n, in, out, r0, r1, x, dy, dw);
        const double r = bound_ratio(dw + r0 * in, ref, refa, (size_t)(r1 - r0) * in, n);
        CHECK(r <= 1.0, "dense_bwd_rows vs exact: error %.3g of its rounding bound", r);
        int untouched = 1;
        for (int i = 0; i < out * in; i++)
            untouched &= (i >= r0 * in && i < r1 * in) || isnan(dw[i]);
        CHECK(untouched, "dense_bwd_rows wrote outside rows %d..%d", r0, r1 - 1);
        poison(dw, out * in);
        be->ops->dense_bwd_rows(be, 0, in, out, r0, r1, x, dy, dw);
        CHECK(all_zero(dw + r0 * in, (size_t)(r1 - r0) * in) && isnan(dw[r0 * in - 1]) &&
                  isnan(dw[r1 * in]),
              "dense_bwd_rows n=0: the rows not zero, or others written");
        tmp_free_all();
    }
    /* n == 0: dW and db overwritten with zeros */
    {
        const int in = 6, out = 3;
        float *dw = fbuf(in * out), *db = fbuf(out), dummy[1] = {0};
        poison(dw, in * out);
        poison(db, out);
        be->ops->dense_bwd(be, 0, in, out, dummy, dummy, dummy, NULL, dw, db);
        CHECK(all_zero(dw, in * out), "dense_bwd n=0: dW not all zero (dW[0]=%g)", dw[0]);
        CHECK(all_zero(db, out), "dense_bwd n=0: db not all zero (db[0]=%g)", db[0]);
        tmp_free_all();
    }
}

/* =============================== convolution =============================== */

typedef struct {
    int n, h, w, c, oc, kh, kw, stride, pt, pb, pl, pr, bias;
} conv_cfg;

static mgt_conv_shape conv_shape_of(const conv_cfg *k) {
    return opcheck_conv_shape(k->n, k->h, k->w, k->c, k->oc, k->kh, k->kw, k->stride, k->pt, k->pb,
                              k->pl, k->pr);
}

typedef struct {
    mgt_backend *be;
    mgt_conv_shape s;
    float *x, *w, *b, *y, *r;
} conv_ctx;

static double conv_obj(void *p) {
    conv_ctx *c = p;
    poison(c->y, conv_ny(&c->s));
    c->be->ops->conv2d_fwd(c->be, &c->s, c->x, c->w, c->b, c->y);
    return dot(c->y, c->r, conv_ny(&c->s));
}

static void test_conv_cfg(const conv_cfg *k) {
    mgt_backend be = opcheck_cpu_backend("test_ops");
    conv_ctx c = {.be = &be, .s = conv_shape_of(k)};
    const mgt_conv_shape *s = &c.s;
    char name[160];
    snprintf(name, sizeof name, "conv n%d %dx%dx%d oc%d k%dx%d s%d pad(%d,%d,%d,%d) bias%d", k->n,
             k->h, k->w, k->c, k->oc, k->kh, k->kw, k->stride, k->pt, k->pb, k->pl, k->pr, k->bias);
    CHECK(be.ops->reserve(&be, be.ops->conv2d_scratch(s)) == 0, "%s: reserve failed", name);
    const size_t nx = conv_nx(s), nw = conv_nw(s), ny = conv_ny(s);
    c.x = fbuf(nx), c.w = fbuf(nw), c.b = k->bias ? fbuf(s->oc) : NULL, c.y = fbuf(ny),
    c.r = fbuf(ny);
    fill(c.x, nx, -1, 1);
    fill(c.w, nw, -1, 1);
    if (c.b)
        fill(c.b, s->oc, -1, 1);
    fill(c.r, ny, -1, 1);

    conv_obj(&c);
    {
        float *dy0 = fbuf(ny); /* the forward pass is all this reference is used for */
        const conv_ref ref = conv_ref_make(s, c.x, c.w, c.b, dy0);
        const double r = conv_ratio_any(&ref, CONV_Y, c.y);
        CHECK(r <= 1.0, "%s: forward vs naive: error %.3g of its rounding bound", name, r);
    }

    float *dx = fbuf(nx), *dw = fbuf(nw), *db = fbuf(s->oc);
    poison(dx, nx);
    poison(dw, nw);
    poison(db, s->oc);
    be.ops->conv2d_bwd(&be, s, c.x, c.w, c.r, dx, dw, c.b ? db : NULL);
    char what[200];
    snprintf(what, sizeof what, "%s dx", name);
    fd_check(what, conv_obj, &c, c.x, nx, dx);
    snprintf(what, sizeof what, "%s dW", name);
    fd_check(what, conv_obj, &c, c.w, nw, dw);
    if (c.b) {
        snprintf(what, sizeof what, "%s db", name);
        fd_check(what, conv_obj, &c, c.b, s->oc, db);
    }
    mgt_backend_destroy(&be);
    CHECK(be.ops == NULL && be.impl == NULL, "mgt_backend_destroy did not clear the backend");
    tmp_free_all();
}

static void test_conv_grads(void) {
    static const conv_cfg cfgs[] = {
        /* n  h  w  c oc kh kw st pt pb pl pr bias */
        {2, 7, 6, 3, 4, 3, 3, 1, 0, 0, 0, 0, 1}, /* valid, stride 1 */
        {3, 6, 7, 2, 5, 3, 3, 1, 1, 1, 1, 1, 0}, /* same, stride 1, no bias */
        {2, 6, 7, 4, 3, 3, 3, 1, 1, 1, 1, 1, 1}, /* same, stride 1 */
        {2, 7, 7, 3, 2, 3, 3, 2, 0, 0, 0, 0, 1}, /* valid, stride 2 */
        {2, 8, 8, 4, 3, 3, 3, 2, 0, 1, 0, 1, 1}, /* same, stride 2, even size: pad after only */
        {2, 7, 9, 3, 3, 3, 3, 2, 1, 1, 1, 1, 0}, /* same, stride 2, odd size */
        {2, 6, 7, 3, 4, 2, 3, 1, 0, 1, 1, 1, 1}, /* non-square kernel, asymmetric padding */
        {2, 9, 8, 2, 3, 5, 5, 2, 2, 2, 2, 2, 1}, /* 5x5 same, stride 2 */
        {2, 4, 5, 6, 3, 1, 1, 1, 0, 0, 0, 0, 1}, /* 1x1 pointwise (no im2col) */
        {2, 5, 5, 3, 4, 1, 1, 2, 0, 0, 0, 0, 0}, /* 1x1, stride 2 */
        /* 3x3 stride 1 goes through Winograd (cpu_winograd.c), F(4x4) above; more channels: */
        {2, 6, 6, 16, 17, 3, 3, 1, 1, 1, 1, 1, 1}, /* same, 6x6: F(2x2) */
        {2, 7, 6, 20, 18, 3, 3, 1, 0, 0, 0, 0, 0}, /* valid, F(4x4), no bias */
        {2, 7, 6, 64, 65, 3, 3, 1, 0, 0, 0, 0, 1}, /* valid, F(4x4) */
        {1, 5, 6, 70, 64, 3, 3, 1, 1, 1, 1, 1, 1}, /* same, F(2x2), n = 1 */
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        test_conv_cfg(&cfgs[i]);
}

/* What im2col's scratch holds besides the columns: the weights in the columns' (kh, kw, c)
 * order, oc*K floats rounded up to 16, unless that order is OIHW's (one channel, or a 1x1
 * window). */
static size_t conv_w_bytes(const mgt_conv_shape *s) {
    const size_t K = (size_t)s->c * s->kh * s->kw;
    if (s->c == 1 || s->kh * s->kw == 1)
        return 0;
    return ((size_t)s->oc * K + 15) / 16 * 16 * sizeof(float);
}

/* The same convolution with one big chunk, small chunks that split samples, one-sample chunks
 * and no scratch at all (direct fallback) must each be right. `im2col`: the shape takes the im2col
 * path, whose scratch sizes are checked exactly; otherwise it takes Winograd (3x3, stride 1), which
 * asks for at least as much, and falls back to im2col chunks, then the direct loop, as the
 * reserved scratch shrinks. */
static void test_conv_chunking_cfg(const conv_cfg *k, int im2col) {
    const mgt_conv_shape s = conv_shape_of(k);
    const size_t nx = conv_nx(&s), nw = conv_nw(&s), ny = conv_ny(&s);
    const size_t K = (size_t)s.c * s.kh * s.kw;
    float *x = fbuf(nx), *w = fbuf(nw), *b = fbuf(s.oc), *dy = fbuf(ny);
    fill(x, nx, -1, 1);
    fill(w, nw, -1, 1);
    fill(b, s.oc, -1, 1);
    fill(dy, ny, -1, 1);

    mgt_conv_shape one = s;
    one.n = 1;
    const size_t wb = conv_w_bytes(&s);
    const size_t full = wb + (size_t)s.n * s.oh * s.ow * K * sizeof(float);
    size_t sizes[] = {full, wb + 7 * K * sizeof(float), wb + K * sizeof(float), 0, 0};
    /* sizes: whole batch, 7 rows (chunks straddle samples), 1 row, then one sample
     * (conv2d_scratch of n = 1), then none at all */
    const char *label[] = {"whole batch", "7 rows", "1 row", "one sample", "no scratch"};
    float *y[5], *dx[5], *dw[5], *db[5];
    CHECK(s.n > 1 && one.n == 1, "chunking test setup");
    for (int v = 0; v < 5; v++) {
        mgt_backend be = opcheck_cpu_backend("test_ops");
        if (v == 0 && !im2col)
            sizes[0] = be.ops->conv2d_scratch(&s);
        size_t bytes = v == 3 ? be.ops->conv2d_scratch(&one) : sizes[v];
        if (v == 0)
            CHECK(im2col ? be.ops->conv2d_scratch(&s) == full : be.ops->conv2d_scratch(&s) >= full,
                  "conv2d_scratch of a small batch should cover the whole batch: %zu vs %zu",
                  be.ops->conv2d_scratch(&s), full);
        if (v == 3)
            CHECK(im2col ? bytes == wb + (size_t)s.oh * s.ow * K * sizeof(float)
                         : bytes >= (size_t)s.oh * s.ow * K * sizeof(float),
                  "conv2d_scratch(n=1) = %zu, expected the weights' %zu and one sample's columns "
                  "%zu",
                  bytes, wb, (size_t)s.oh * s.ow * K * sizeof(float));
        if (bytes)
            CHECK(be.ops->reserve(&be, bytes) == 0, "reserve(%zu) failed", bytes);
        y[v] = fbuf(ny), dx[v] = fbuf(nx), dw[v] = fbuf(nw), db[v] = fbuf(s.oc);
        poison(y[v], ny);
        poison(dx[v], nx);
        poison(dw[v], nw);
        poison(db[v], s.oc);
        be.ops->conv2d_fwd(&be, &s, x, w, b, y[v]);
        be.ops->conv2d_bwd(&be, &s, x, w, dy, dx[v], dw[v], db[v]);
        mgt_backend_destroy(&be);
    }
    /* Every chunking, and the fallbacks as the scratch shrinks, stays within the rounding bound
     * of the algorithm it ran (convref.h) - so the variants agree with each other to within two
     * bounds, whatever the BLAS kernel, and dW in particular is right in absolute terms. */
    const conv_ref ref = conv_ref_make(&s, x, w, b, dy);
    for (int v = 0; v < 5; v++) {
        const double ry = conv_ratio_any(&ref, CONV_Y, y[v]),
                     rx = conv_ratio_any(&ref, CONV_DX, dx[v]),
                     rw = conv_ratio_any(&ref, CONV_DW, dw[v]),
                     rb = conv_ratio_any(&ref, CONV_DB, db[v]);
        CHECK(ry <= 1.0 && rx <= 1.0 && rw <= 1.0 && rb <= 1.0,
              "conv chunking (%s): error y %.3g dx %.3g dW %.3g db %.3g of the bounds", label[v],
              ry, rx, rw, rb);
    }

    tmp_free_all();
}

static void test_conv_chunking(void) {
    /* n  h  w  c oc kh kw st pt pb pl pr bias */
    const conv_cfg cols = {5, 9, 8, 3, 6, 3, 2, 2, 1, 1, 1, 0, 1};  /* 3x2 stride 2: im2col */
    const conv_cfg cols2 = {5, 9, 8, 3, 6, 3, 3, 2, 1, 1, 1, 1, 1}; /* stride 2: im2col */
    const conv_cfg wino = {5, 9, 8, 3, 6, 3, 3, 1, 1, 1, 1, 1, 1};  /* 3x3 stride 1: Winograd */
    test_conv_chunking_cfg(&cols, 1);
    test_conv_chunking_cfg(&cols2, 1);
    test_conv_chunking_cfg(&wino, 0);

    /* The size conv2d_scratch asks for a big layer: bounded (16 MB of columns; Winograd's
     * buffers, for layers that use it, stay under 64 MB) but at least one sample. */
    {
        mgt_backend be = opcheck_cpu_backend("test_ops");
        const conv_cfg big = {128, 26, 26, 32, 256, 3, 3, 1, 0, 0, 0, 0, 1};
        const mgt_conv_shape bs = conv_shape_of(&big);
        const size_t per_sample = (size_t)bs.oh * bs.ow * bs.c * 9 * sizeof(float);
        const size_t sz = be.ops->conv2d_scratch(&bs);
        CHECK(sz >= per_sample && sz <= ((size_t)64 << 20),
              "conv2d_scratch(big) = %zu: want at least one sample's %zu bytes, at most 64 MB", sz,
              per_sample);
        /* stride 2: neither Winograd nor cpu_convk.c */
        const conv_cfg big5 = {128, 26, 26, 32, 256, 5, 5, 2, 0, 0, 0, 0, 1};
        const mgt_conv_shape b5 = conv_shape_of(&big5);
        const size_t per5 = (size_t)b5.oh * b5.ow * b5.c * 25 * sizeof(float);
        const size_t sz5 = be.ops->conv2d_scratch(&b5) - conv_w_bytes(&b5);
        CHECK(sz5 >= per5 && sz5 <= ((size_t)16 << 20) && sz5 % per5 == 0,
              "conv2d_scratch(big 5x5) = %zu + the weights: want whole samples of %zu bytes, at "
              "most 16 MB",
              sz5, per5);
        const conv_cfg huge = {4, 200, 200, 64, 8, 3, 3, 1, 1, 1, 1, 1, 0};
        const mgt_conv_shape hs = conv_shape_of(&huge);
        const size_t per_h = (size_t)hs.oh * hs.ow * hs.c * 9 * sizeof(float);
        CHECK(be.ops->conv2d_scratch(&hs) == conv_w_bytes(&hs) + per_h,
              "conv2d_scratch with one sample over 16 MB = %zu, expected the weights' %zu and "
              "one sample %zu",
              be.ops->conv2d_scratch(&hs), conv_w_bytes(&hs), per_h);
        mgt_backend_destroy(&be);
    }
    tmp_free_all();
}

/* cpu_convk.c, the stride-1 passes that read NHWC in place (what --conv-algo direct and the
 * shapes Winograd does not take run): every kernel variant this CPU has, within the rounding
 * bound of a direct convolution, the same bits on 1, 2 and 3 lanes, the same bits as the op
 * table's conv2d (which must have taken this path), the backward filter's bits the same read in
 * place (scratch for its sums only) as from its copies of each sample, and nothing written when
 * the scratch is too small. Shapes: valid and padded, channel counts that leave partial register
 * blocks (of 6 or 12 rows, of 32 columns), rows narrower than a block, padding wider than the
 * window, non-square windows. */
static void test_convk_cfg(const conv_cfg *k) {
    mgt_conv_shape s = conv_shape_of(k);
    s.algo = MGT_CONV_DIRECT;
    char name[160];
    snprintf(name, sizeof name, "convk n%d %dx%dx%d oc%d k%dx%d pad(%d,%d,%d,%d) bias%d", k->n,
             k->h, k->w, k->c, k->oc, k->kh, k->kw, k->pt, k->pb, k->pl, k->pr, k->bias);
    const size_t nx = conv_nx(&s), nw = conv_nw(&s), ny = conv_ny(&s);
    float *x = fbuf(nx), *w = fbuf(nw), *b = k->bias ? fbuf(s.oc) : NULL, *dy = fbuf(ny);
    fill(x, nx, -1, 1);
    fill(w, nw, -1, 1);
    if (b)
        fill(b, s.oc, -1, 1);
    fill(dy, ny, -1, 1);
    const conv_ref ref = conv_ref_make(&s, x, w, b, dy);
    const int filter = mgt_cpu_convk_fits(&s, MGT_CPU_CONVK_FILTER);
    CHECK(mgt_cpu_convk_fits(&s, MGT_CPU_CONVK_FORWARD) &&
              mgt_cpu_convk_fits(&s, MGT_CPU_CONVK_DATA),
          "%s: stride 1 should fit forward and backward data", name);
    CHECK(filter == (s.oc % 32 == 0), "%s: backward filter fits only whole blocks of 32", name);
    const size_t bytes = mgt_cpu_convk_scratch(&s);
    float *scratch = fbuf(bytes / sizeof(float) + 1);
    float *y[3], *dx[3], *dw[3];
    for (int v = 0; v < mgt_cpu_convk_variants(); v++) {
        const char *vname = mgt_cpu_convk_use(v);
        CHECK(vname != NULL, "%s: variant %d has no name", name, v);
        for (int t = 0; t < 3; t++) {
            mgt_cpu_lanes *lanes = t ? mgt_cpu_lanes_create(t + 1) : NULL;
            y[t] = fbuf(ny), dx[t] = fbuf(nx), dw[t] = fbuf(nw);
            poison(y[t], ny);
            poison(dx[t], nx);
            poison(dw[t], nw);
            CHECK(mgt_cpu_convk_fwd(scratch, bytes, lanes, &s, x, w, b, y[t]) == 0 &&
                      mgt_cpu_convk_bwd_data(scratch, bytes, lanes, &s, w, dy, dx[t]) == 0 &&
                      (mgt_cpu_convk_bwd_filter(scratch, bytes, lanes, &s, x, dy, dw[t]) == 0) ==
                          filter,
                  "%s %s: a pass refused its shape or scratch", name, vname);
            mgt_cpu_lanes_destroy(lanes);
            const double ry = conv_ratio(&ref, 0, CONV_Y, y[t]);
            const double rx = conv_ratio(&ref, 0, CONV_DX, dx[t]);
            const double rw = filter ? conv_ratio(&ref, 0, CONV_DW, dw[t]) : 0.0;
            CHECK(ry <= 1.0 && rx <= 1.0 && rw <= 1.0,
                  "%s %s on %d lane(s): error y %.3g dx %.3g dW %.3g of the direct bound", name,
                  vname, t + 1, ry, rx, rw);
            CHECK(memcmp(y[t], y[0], ny * sizeof(float)) == 0 &&
                      memcmp(dx[t], dx[0], nx * sizeof(float)) == 0 &&
                      (!filter || memcmp(dw[t], dw[0], nw * sizeof(float)) == 0),
                  "%s %s: %d lanes differ from one", name, vname, t + 1);
        }
        /* backward filter with room for its sums only: read in place, not from copies of each
         * sample, and the same bits */
        if (filter) {
            const size_t acc_bytes = (nw + 15) / 16 * 16 * sizeof(float);
            float *dwu = fbuf(nw);
            poison(dwu, nw);
            mgt_cpu_lanes *lanes = mgt_cpu_lanes_create(2);
            CHECK(mgt_cpu_convk_bwd_filter(scratch, acc_bytes, lanes, &s, x, dy, dwu) == 0 &&
                      memcmp(dwu, dw[0], nw * sizeof(float)) == 0,
                  "%s %s: backward filter in place differs from the one from copies", name,
                  vname);
            mgt_cpu_lanes_destroy(lanes);
        }
        /* too little scratch: refused, nothing written */
        float *yz = fbuf(ny), *dxz = fbuf(nx), *dwz = fbuf(nw);
        poison(yz, ny);
        poison(dxz, nx);
        poison(dwz, nw);
        CHECK(mgt_cpu_convk_fwd(scratch, 64, NULL, &s, x, w, b, yz) == -1 &&
                  mgt_cpu_convk_bwd_data(scratch, 64, NULL, &s, w, dy, dxz) == -1 &&
                  mgt_cpu_convk_bwd_filter(scratch, 64, NULL, &s, x, dy, dwz) == -1 &&
                  isnan(yz[0]) && isnan(yz[ny - 1]) && isnan(dxz[0]) && isnan(dxz[nx - 1]) &&
                  isnan(dwz[0]) && isnan(dwz[nw - 1]),
              "%s %s: a pass ran, or wrote, without its scratch", name, vname);
    }
    mgt_cpu_convk_use(-1);
    /* the op table takes this path for a direct convolution of stride 1 */
    mgt_backend be = opcheck_cpu_backend("test_ops");
    CHECK(be.ops->reserve(&be, be.ops->conv2d_scratch(&s)) == 0, "%s: reserve failed", name);
    float *yo = fbuf(ny), *dxo = fbuf(nx), *dwo = fbuf(nw), *dbo = fbuf(s.oc);
    be.ops->conv2d_fwd(&be, &s, x, w, b, yo);
    be.ops->conv2d_bwd(&be, &s, x, w, dy, dxo, dwo, dbo);
    mgt_backend_destroy(&be);
    CHECK(memcmp(yo, y[0], ny * sizeof(float)) == 0 &&
              memcmp(dxo, dx[0], nx * sizeof(float)) == 0 &&
              (!filter || memcmp(dwo, dw[0], nw * sizeof(float)) == 0),
          "%s: conv2d (algo direct) did not give cpu_convk.c's bits", name);
    CHECK(conv_ratio(&ref, 0, CONV_DB, dbo) <= 1.0 &&
              (filter || conv_ratio(&ref, 0, CONV_DW, dwo) <= 1.0),
          "%s: conv2d's db or im2col dW outside the bound", name);
    tmp_free_all();
}

static void test_convk(void) {
    static const conv_cfg cfgs[] = {
        /* n  h   w   c  oc kh kw st pt pb pl pr bias */
        {2, 9, 10, 5, 32, 3, 3, 1, 0, 0, 0, 0, 1}, /* valid; 5 channels: one short block */
        {2, 8, 9, 13, 64, 3, 3, 1, 1, 1, 1, 1,
         0}, /* same, no bias; 13 channels: 6 + 7, 4 + 4 + 5 */
        {3, 7, 7, 20, 40, 3, 3, 1, 1, 1, 1, 1, 1},  /* oc 40: a partial block; dW by im2col */
        {2, 5, 4, 33, 32, 2, 3, 1, 0, 1, 1, 1, 1},  /* 2x3, asymmetric padding, rows of 4 */
        {1, 11, 13, 7, 96, 5, 5, 1, 2, 2, 2, 2, 1}, /* 5x5 same */
        {2, 6, 8, 64, 32, 3, 1, 1, 1, 1, 0, 0, 1},  /* 3x1 */
        {1, 4, 4, 3, 32, 3, 3, 1, 3, 3, 3, 3, 1},   /* padding past the window: rows of zeros */
        {1, 3, 17, 9, 35, 1, 3, 1, 0, 0, 2, 0, 0},  /* 1x3, left padding only */
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        test_convk_cfg(&cfgs[i]);
}

static void test_conv_n0(void) {
    mgt_backend be = opcheck_cpu_backend("test_ops");
    const conv_cfg k = {0, 5, 5, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1};
    const mgt_conv_shape s = conv_shape_of(&k);
    const size_t nw = conv_nw(&s);
    float *dw = fbuf(nw), *db = fbuf(s.oc), dummy[1] = {0};
    be.ops->reserve(&be, be.ops->conv2d_scratch(&s));
    poison(dw, nw);
    poison(db, s.oc);
    be.ops->conv2d_bwd(&be, &s, dummy, dummy, dummy, NULL, dw, db);
    CHECK(all_zero(dw, nw), "conv2d_bwd n=0: dW not all zero (dW[0]=%g)", dw[0]);
    CHECK(all_zero(db, s.oc), "conv2d_bwd n=0: db not all zero (db[0]=%g)", db[0]);
    /* pointwise path too */
    const conv_cfg k1 = {0, 5, 5, 3, 4, 1, 1, 1, 0, 0, 0, 0, 1};
    const mgt_conv_shape s1 = conv_shape_of(&k1);
    poison(dw, conv_nw(&s1));
    poison(db, s1.oc);
    be.ops->conv2d_bwd(&be, &s1, dummy, dummy, dummy, NULL, dw, db);
    CHECK(all_zero(dw, conv_nw(&s1)) && all_zero(db, s1.oc),
          "conv2d_bwd 1x1 n=0: gradients not all zero");
    mgt_backend_destroy(&be);
    tmp_free_all();
}

/* =============================== pooling =============================== */

static size_t pool_nx(const mgt_pool_shape *s) {
    return (size_t)s->n * s->h * s->w * s->c;
}
static size_t pool_ny(const mgt_pool_shape *s) {
    return (size_t)s->n * s->oh * s->ow * s->c;
}

static mgt_pool_shape pool_shape(int n, int h, int w, int c, int size, int stride) {
    mgt_pool_shape s = {.n = n, .h = h, .w = w, .c = c, .size = size, .stride = stride};
    s.oh = (h - size) / stride + 1;
    s.ow = (w - size) / stride + 1;
    return s;
}

/* Naive pooling; for max also the flat index of the first maximum in row-major window order. */
static void ref_pool(const mgt_pool_shape *s, const float *x, float *ymax, int32_t *amax,
                     float *yavg, double *yavg_abs) {
    for (int n = 0; n < s->n; n++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++)
                for (int ch = 0; ch < s->c; ch++) {
                    double sum = 0.0, sum_abs = 0.0;
                    float best = -INFINITY;
                    int32_t bi = -1;
                    for (int i = 0; i < s->size; i++)
                        for (int j = 0; j < s->size; j++) {
                            const int idx =
                                ((n * s->h + oy * s->stride + i) * s->w + ox * s->stride + j) *
                                    s->c +
                                ch;
                            sum += x[idx];
                            sum_abs += fabs(x[idx]);
                            if (bi < 0 || x[idx] > best) {
                                best = x[idx];
                                bi = idx;
                            }
                        }
                    const int o = ((n * s->oh + oy) * s->ow + ox) * s->c + ch;
                    ymax[o] = best;
                    amax[o] = bi;
                    yavg[o] = (float)(sum / (s->size * s->size));
                    yavg_abs[o] = sum_abs / (s->size * s->size);
                }
}

typedef struct {
    mgt_backend *be;
    mgt_pool_shape s;
    int is_max;
    float *x, *y, *r;
    int32_t *am;
} pool_ctx;

static double pool_obj(void *p) {
    pool_ctx *c = p;
    poison(c->y, pool_ny(&c->s));
    if (c->is_max)
        c->be->ops->maxpool_fwd(c->be, &c->s, c->x, c->y, c->am);
    else
        c->be->ops->avgpool_fwd(c->be, &c->s, c->x, c->y);
    return dot(c->y, c->r, pool_ny(&c->s));
}

static void test_pool(mgt_backend *be) {
    const int cfg[][6] = {
        {2, 6, 7, 3, 2, 2}, {2, 7, 7, 2, 3, 2}, {3, 5, 6, 4, 2, 1}, {1, 4, 4, 2, 4, 4}};
    for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++) {
        const int *q = cfg[t];
        pool_ctx c = {.be = be, .s = pool_shape(q[0], q[1], q[2], q[3], q[4], q[5])};
        const size_t nx = pool_nx(&c.s), ny = pool_ny(&c.s);
        c.x = fbuf(nx), c.y = fbuf(ny), c.r = fbuf(ny);
        c.am = tmp_alloc(ny * sizeof(int32_t), 0);
        fill_distinct(c.x, nx);
        fill(c.r, ny, -1, 1);
        float *rmax = fbuf(ny), *ravg = fbuf(ny), *dx = fbuf(nx);
        double *ravg_abs = dbuf(ny);
        int32_t *ram = tmp_alloc(ny * sizeof(int32_t), 0);
        ref_pool(&c.s, c.x, rmax, ram, ravg, ravg_abs);
        char name[128];
        snprintf(name, sizeof name, "pool n%d %dx%dx%d size%d stride%d", q[0], q[1], q[2], q[3],
                 q[4], q[5]);

        c.is_max = 1;
        for (size_t i = 0; i < ny; i++)
            c.am[i] = -7;
        pool_obj(&c);
        /* a maximum selects one input: exact */
        CHECK(memcmp(c.y, rmax, ny * sizeof(float)) == 0, "%s: maxpool forward vs naive %.3g", name,
              rel_err(c.y, rmax, ny, 1e-30));
        CHECK(memcmp(c.am, ram, ny * sizeof(int32_t)) == 0, "%s: maxpool argmax differs", name);
        poison(dx, nx);
        be->ops->maxpool_bwd(be, &c.s, c.r, c.am, dx);
        char what[160];
        snprintf(what, sizeof what, "%s maxpool dx", name);
        fd_check(what, pool_obj, &c, c.x, nx, dx);

        c.is_max = 0;
        pool_obj(&c);
        /* a mean of size^2 inputs: size^2 roundings for the sum, one for the scaling, one
         * more for the reference, which is rounded to float */
        {
            const int k2 = c.s.size * c.s.size;
            int ok = 1;
            for (size_t i = 0; i < ny && ok; i++)
                ok = near(c.y[i], ravg[i], k2 + 2.0, ravg_abs[i]);
            CHECK(ok, "%s: avgpool forward vs naive %.3g", name, rel_err(c.y, ravg, ny, 1e-30));
        }
        poison(dx, nx);
        be->ops->avgpool_bwd(be, &c.s, c.r, dx);
        snprintf(what, sizeof what, "%s avgpool dx", name);
        fd_check(what, pool_obj, &c, c.x, nx, dx);
        tmp_free_all();
    }
    /* ties go to the first position of the window (row-major) */
    {
        const mgt_pool_shape s = pool_shape(1, 4, 4, 2, 2, 2);
        float x[32], y[8];
        int32_t am[8];
        for (int i = 0; i < 32; i++)
            x[i] = 1.5f;
        be->ops->maxpool_fwd(be, &s, x, y, am);
        /* window (oy, ox) starts at pixel (2oy, 2ox): flat index ((2oy)*4 + 2ox)*2 + ch */
        int ok = 1;
        for (int oy = 0; oy < 2; oy++)
            for (int ox = 0; ox < 2; ox++)
                for (int ch = 0; ch < 2; ch++)
                    ok &= am[(oy * 2 + ox) * 2 + ch] == ((2 * oy) * 4 + 2 * ox) * 2 + ch;
        CHECK(ok,
              "maxpool ties: argmax should be the window's first element (got am[0..3] = "
              "%d %d %d %d)",
              am[0], am[1], am[2], am[3]);
    }
}

/* =============================== batch norm =============================== */

typedef struct {
    mgt_backend *be;
    int rows, c;
    float eps;
    float *x, *gamma, *beta, *y, *r;
    float *sum, *sumsq, *mean, *invstd;
} bn_ctx;

static double bn_obj(void *p) {
    bn_ctx *b = p;
    const mgt_ops *o = b->be->ops;
    poison(b->y, (size_t)b->rows * b->c);
    poison(b->sum, b->c);
    poison(b->sumsq, b->c);
    poison(b->mean, b->c);
    poison(b->invstd, b->c);
    o->bn_stats(b->be, b->rows, b->c, b->x, b->sum, b->sumsq);
    o->bn_finalize(b->be, b->c, (float)b->rows, b->sum, b->sumsq, b->eps, 0.9f, NULL, b->mean,
                   b->invstd, NULL, NULL);
    const mgt_bn_pass bp = {b->rows,  b->c,    b->x, b->mean,      b->invstd,
                            b->gamma, b->beta, NULL, MGT_ACT_NONE, NULL, 0};
    o->bn_apply(b->be, &bp, b->y);
    return dot(b->y, b->r, (size_t)b->rows * b->c);
}

static void test_bn(mgt_backend *be) {
    const mgt_ops *o = be->ops;
    /* train-mode gradients through stats -> finalize -> apply */
    {
        bn_ctx b = {.be = be, .rows = 2 * 3 * 4, .c = 5, .eps = 1e-3f};
        const size_t nx = (size_t)b.rows * b.c;
        b.x = fbuf(nx), b.y = fbuf(nx), b.r = fbuf(nx), b.gamma = fbuf(b.c), b.beta = fbuf(b.c);
        b.sum = fbuf(b.c), b.sumsq = fbuf(b.c), b.mean = fbuf(b.c), b.invstd = fbuf(b.c);
        for (int r = 0; r < b.rows; r++)
            for (int j = 0; j < b.c; j++)
                b.x[r * b.c + j] = frand(-1, 1) * (1.0f + j) + 0.5f * j;
        fill(b.gamma, b.c, 0.5f, 1.5f);
        fill(b.beta, b.c, -1, 1);
        fill(b.r, nx, -1, 1);
        bn_obj(&b);
        /* forward check against the definition in double. The bound follows the CPU's
         * arithmetic: the sums are taken in double and rounded to float (u each), mean and
         * var = E[x^2] - mean^2 in double from them, so |d var| <= u (E[x^2] + 2 mean^2) and
         * invstd = 1/sqrt(var + eps), rounded to float, is off by at most e_inv = |d var| /
         * (2 (var + eps)) + u relative; then y = (x - mean) * (invstd * gamma) + beta takes four
         * float roundings, with mean itself off by 2u |mean|:
         *   |dy| <= |gamma| (|xhat| (e_inv + 4u) + invstd 2u |mean|) + 2u (|y| + |beta|). */
        int bn_ok = 1;
        double worst = 0.0;
        const double u = 0x1p-24;
        for (int j = 0; j < b.c; j++) {
            double m = 0, m2 = 0, ex2 = 0;
            for (int r = 0; r < b.rows; r++) {
                m += b.x[r * b.c + j];
                ex2 += (double)b.x[r * b.c + j] * b.x[r * b.c + j];
            }
            m /= b.rows;
            ex2 /= b.rows;
            for (int r = 0; r < b.rows; r++) {
                const double d = b.x[r * b.c + j] - m;
                m2 += d * d;
            }
            m2 /= b.rows;
            const double inv = 1.0 / sqrt(m2 + b.eps);
            const double e_inv = u * (ex2 + 2 * m * m) / (2 * (m2 + b.eps)) + u;
            for (int r = 0; r < b.rows; r++) {
                const double xhat = (b.x[r * b.c + j] - m) * inv;
                const double want = xhat * b.gamma[j] + b.beta[j];
                const double bound =
                    fabs(b.gamma[j]) * (fabs(xhat) * (e_inv + 4 * u) + inv * 2 * u * fabs(m)) +
                    2 * u * (fabs(want) + fabs(b.beta[j]));
                const double d = fabs(b.y[r * b.c + j] - want);
                bn_ok &= d <= bound;
                if (!(d <= worst))
                    worst = d;
            }
        }
        CHECK(bn_ok, "bn forward vs double reference: max abs err %.3g over its bound", worst);

        float *dgamma = fbuf(b.c), *dbeta = fbuf(b.c), *dx = fbuf(nx);
        poison(dgamma, b.c);
        poison(dbeta, b.c);
        poison(dx, nx);
        const mgt_bn_pass p = {b.rows,  b.c,    b.x,  b.mean,       b.invstd,
                               b.gamma, b.beta, NULL, MGT_ACT_NONE, NULL, 0};
        o->bn_bwd_reduce(be, &p, b.r, dgamma, dbeta);
        o->bn_bwd_apply(be, &p, (float)b.rows, b.r, dgamma, dbeta, dx, NULL, 0);
        fd_check("bn dx", bn_obj, &b, b.x, nx, dx);
        fd_check("bn dgamma", bn_obj, &b, b.gamma, b.c, dgamma);
        fd_check("bn dbeta", bn_obj, &b, b.beta, b.c, dbeta);
        tmp_free_all();
    }
    /* stats against a double reference over many rows (sums, not means) */
    {
        const int rows = 1000, c = 300; /* more channels than one accumulator block */
        float *x = fbuf((size_t)rows * c), *sum = fbuf(c), *sumsq = fbuf(c);
        fill(x, (size_t)rows * c, -2, 3);
        poison(sum, c);
        poison(sumsq, c);
        o->bn_stats(be, rows, c, x, sum, sumsq);
        double worst = 0.0;
        for (int j = 0; j < c; j++) {
            double s = 0, s2 = 0;
            for (int r = 0; r < rows; r++) {
                s += x[(size_t)r * c + j];
                s2 += (double)x[(size_t)r * c + j] * x[(size_t)r * c + j];
            }
            /* summed in double (rows roundings of 2^-53 on the sum of |x|, resp. x^2) and
             * rounded to float once (u) */
            double sa = 0;
            for (int r = 0; r < rows; r++)
                sa += fabs(x[(size_t)r * c + j]);
            const double b1 = 0x1p-24 * fabs(s) + rows * 0x1p-53 * sa,
                         b2 = 0x1p-24 * s2 * (1 + 1e-9);
            const double e1 = fabs(sum[j] - s) / b1, e2 = fabs(sumsq[j] - s2) / b2;
            if (!(e1 <= worst))
                worst = e1;
            if (!(e2 <= worst))
                worst = e2;
        }
        CHECK(worst <= 1.0, "bn_stats vs double sums: error %.3g of the bound", worst);
        tmp_free_all();
    }
    /* finalize: hand values, Keras running update, count == 0, running statistics */
    {
        const float sum[2] = {6.0f, 0.0f}, sumsq[2] = {14.0f, 8.0f};
        float mean[2], invstd[2], rm[2] = {1.0f, -1.0f}, rv[2] = {2.0f, 0.5f};
        const float eps = 1e-3f, mom = 0.9f;
        o->bn_finalize(be, 2, 3.0f, sum, sumsq, eps, mom, NULL, mean, invstd, rm, rv);
        /* finalize works in double from float inputs and rounds each result once: k = 1 on the
         * value itself (expected values use the same float eps and momentum) */
        const double var0 = 14.0 / 3 - 4.0, var1 = 8.0 / 3, md = (double)mom;
        CHECK(mean[0] == 2.0f && mean[1] == 0.0f, "bn_finalize mean %g %g", mean[0], mean[1]);
        CHECK(near(invstd[0], 1 / sqrt(var0 + eps), 1, 1 / sqrt(var0 + eps)) &&
                  near(invstd[1], 1 / sqrt(var1 + eps), 1, 1 / sqrt(var1 + eps)),
              "bn_finalize invstd %g %g, expected %g %g", invstd[0], invstd[1],
              1 / sqrt(var0 + eps), 1 / sqrt(var1 + eps));
        CHECK(near(rm[0], md * 1.0 + (1 - md) * 2.0, 1, 1.1) && near(rm[1], md * -1.0, 1, 0.9),
              "bn_finalize running mean %g %g, expected 1.1 -0.9", rm[0], rm[1]);
        CHECK(near(rv[0], md * 2.0 + (1 - md) * var0, 1, 2.0) &&
                  near(rv[1], md * 0.5 + (1 - md) * var1, 1, 0.8),
              "bn_finalize running var %g %g, expected %g %g (biased batch variance)", rv[0], rv[1],
              0.9 * 2.0 + 0.1 * var0, 0.9 * 0.5 + 0.1 * var1);
        /* count == 0 */
        float rm0[2] = {rm[0], rm[1]}, rv0[2] = {rv[0], rv[1]};
        const float zeros[2] = {0, 0};
        mean[0] = mean[1] = invstd[0] = invstd[1] = NAN;
        o->bn_finalize(be, 2, 0.0f, zeros, zeros, eps, mom, NULL, mean, invstd, rm, rv);
        CHECK(mean[0] == 0.0f && mean[1] == 0.0f && near(invstd[0], 1 / sqrt(eps), 1, 32) &&
                  near(invstd[1], 1 / sqrt(eps), 1, 32),
              "bn_finalize count=0: mean %g %g invstd %g %g (want 0, 1/sqrt(eps)=%g)", mean[0],
              mean[1], invstd[0], invstd[1], 1 / sqrt(eps));
        CHECK(rm[0] == rm0[0] && rm[1] == rm0[1] && rv[0] == rv0[0] && rv[1] == rv0[1],
              "bn_finalize count=0 changed the running statistics");
        /* running_mean NULL: no update and no crash */
        o->bn_finalize(be, 2, 3.0f, sum, sumsq, eps, mom, NULL, mean, invstd, NULL, NULL);
        CHECK(mean[0] == 2.0f, "bn_finalize without running stats: mean %g", mean[0]);
        /* inference statistics */
        o->bn_running(be, 2, eps, rm, rv, mean, invstd);
        CHECK(
            mean[0] == rm[0] && mean[1] == rm[1] &&
                near(invstd[0], 1 / sqrt((double)rv[0] + eps), 1, 1 / sqrt((double)rv[0] + eps)) &&
                near(invstd[1], 1 / sqrt((double)rv[1] + eps), 1, 1 / sqrt((double)rv[1] + eps)),
            "bn_running: mean %g %g invstd %g %g", mean[0], mean[1], invstd[0], invstd[1]);
    }
    /* rows == 0: sums and parameter gradients are zeros */
    {
        float sum[3], sumsq[3], dg[3], dbt[3], one[3] = {0, 1, 1}, dummy[1] = {0};
        poison(sum, 3);
        poison(sumsq, 3);
        poison(dg, 3);
        poison(dbt, 3);
        o->bn_stats(be, 0, 3, dummy, sum, sumsq);
        const mgt_bn_pass p0 = {0, 3, dummy, one, one, NULL, NULL, NULL, MGT_ACT_NONE, NULL, 0};
        o->bn_bwd_reduce(be, &p0, dummy, dg, dbt);
        CHECK(all_zero(sum, 3) && all_zero(sumsq, 3), "bn_stats rows=0: sums not zero");
        CHECK(all_zero(dg, 3) && all_zero(dbt, 3), "bn_bwd_reduce rows=0: dgamma/dbeta not zero");
    }
}

/* =============================== dropout =============================== */

typedef struct {
    mgt_backend *be;
    int n, row;
    float rate;
    uint64_t key, first;
    float *x, *y, *r;
} drop_ctx;

static double drop_obj(void *p) {
    drop_ctx *d = p;
    const size_t cnt = (size_t)d->n * d->row;
    memcpy(d->y, d->x, cnt * sizeof(float));
    d->be->ops->dropout_fwd(d->be, d->n, d->row, d->rate, d->key, d->first, d->y);
    return dot(d->y, d->r, cnt);
}

static void test_dropout(mgt_backend *be) {
    const mgt_ops *o = be->ops;
    /* the rule of backend.h, element by element */
    {
        const int n = 64, row = 1001; /* large enough that a slightly wrong threshold shows */
        const float rate = 0.3f;
        const uint64_t key = 1234, first = 17;
        float *x = fbuf(n * row), *y = fbuf(n * row);
        fill(x, n * row, -2, 2);
        memcpy(y, x, sizeof(float) * n * row);
        o->dropout_fwd(be, n, row, rate, key, first, y);
        int bad = 0, first_bad = -1;
        const float sc = 1.0f / (1.0f - rate);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < row; j++) {
                const int keep = mgt_uniform(key, (first + i) * row + j) >= rate;
                const float want = keep ? x[i * row + j] * sc : 0.0f;
                if (y[i * row + j] != want) {
                    if (first_bad < 0)
                        first_bad = i * row + j;
                    bad++;
                }
            }
        CHECK(bad == 0, "dropout_fwd: %d elements differ from the mgt_uniform rule (first at %d)",
              bad, first_bad);
        /* backward applies the same mask and scale */
        float *g = fbuf(n * row);
        memcpy(g, x, sizeof(float) * n * row);
        o->dropout_bwd(be, n, row, rate, key, first, g);
        CHECK(memcmp(g, y, sizeof(float) * n * row) == 0,
              "dropout_bwd differs from the forward map");
        /* FD: the mask is fixed by the key */
        drop_ctx d = {.be = be,
                      .n = n,
                      .row = row,
                      .rate = rate,
                      .key = key,
                      .first = first,
                      .x = x,
                      .y = fbuf(n * row),
                      .r = fbuf(n * row)};
        fill(d.r, n * row, -1, 1);
        float *dx = fbuf(n * row);
        memcpy(dx, d.r, sizeof(float) * n * row);
        o->dropout_bwd(be, n, row, rate, key, first, dx);
        fd_check("dropout dx", drop_obj, &d, d.x, (size_t)n * row, dx);
        /* rate 0: nothing changes */
        memcpy(y, x, sizeof(float) * n * row);
        o->dropout_fwd(be, n, row, 0.0f, key, first, y);
        CHECK(memcmp(y, x, sizeof(float) * n * row) == 0, "dropout rate 0 changed the input");
        tmp_free_all();
    }
    /* fraction dropped over a large tensor */
    {
        const int n = 1000, row = 1000;
        const float rate = 0.37f;
        float *x = fbuf((size_t)n * row);
        for (size_t i = 0; i < (size_t)n * row; i++)
            x[i] = 1.0f;
        o->dropout_fwd(be, n, row, rate, 99, 0, x);
        size_t dropped = 0, badkept = 0;
        const float sc = 1.0f / (1.0f - rate);
        for (size_t i = 0; i < (size_t)n * row; i++) {
            if (x[i] == 0.0f)
                dropped++;
            else if (x[i] != sc)
                badkept++;
        }
        const double frac = (double)dropped / ((double)n * row);
        CHECK(fabs(frac - rate) <= 0.01, "dropout: fraction dropped %.4f, rate %.2f", frac, rate);
        CHECK(badkept == 0, "dropout: %zu kept values not scaled by 1/(1-rate)", badkept);
        tmp_free_all();
    }
    /* the same key gives the same mask however the batch is split across calls / ranks */
    {
        const int n = 8, row = 53;
        const float rate = 0.5f;
        float *x = fbuf(n * row), *a = fbuf(n * row), *b = fbuf(n * row);
        fill(x, n * row, -1, 1);
        memcpy(a, x, sizeof(float) * n * row);
        memcpy(b, x, sizeof(float) * n * row);
        o->dropout_fwd(be, 8, row, rate, 42, 0, a);
        o->dropout_fwd(be, 3, row, rate, 42, 0, b);
        o->dropout_fwd(be, 5, row, rate, 42, 3, b + 3 * row);
        CHECK(memcmp(a, b, sizeof(float) * n * row) == 0,
              "dropout: [0,8) at once differs from [0,3) + [3,8)");
        memcpy(b, x, sizeof(float) * n * row);
        o->dropout_fwd(be, 8, row, rate, 43, 0, b);
        CHECK(memcmp(a, b, sizeof(float) * n * row) != 0,
              "dropout: a different key gave the same mask");
        tmp_free_all();
    }
}

/* =============================== activations =============================== */

typedef struct {
    mgt_backend *be;
    mgt_act act;
    int n, row;
    float *x, *y, *r;
} act_ctx;

static double act_obj(void *p) {
    act_ctx *a = p;
    const size_t cnt = (size_t)a->n * a->row;
    a->be->ops->act_fwd(a->be, a->act, a->n, a->row, a->x, a->y);
    return dot(a->y, a->r, cnt);
}

static double ref_act1(mgt_act act, double v) {
    switch (act) {
    case MGT_ACT_RELU:
        return v > 0 ? v : 0;
    case MGT_ACT_SIGMOID:
        return 1.0 / (1.0 + exp(-v));
    case MGT_ACT_TANH:
        return tanh(v);
    default:
        return v;
    }
}

static void test_act(mgt_backend *be) {
    const mgt_act acts[] = {MGT_ACT_RELU, MGT_ACT_SIGMOID, MGT_ACT_TANH, MGT_ACT_SOFTMAX,
                            MGT_ACT_NONE};
    const char *names[] = {"relu", "sigmoid", "tanh", "softmax", "none"};
    for (int t = 0; t < 5; t++) {
        act_ctx a = {.be = be, .act = acts[t], .n = 4, .row = 7};
        const size_t cnt = (size_t)a.n * a.row;
        a.x = fbuf(cnt), a.y = fbuf(cnt), a.r = fbuf(cnt);
        fill_away_from_zero(a.x, cnt, -3, 3, 0.05f);
        fill(a.r, cnt, -1, 1);
        act_obj(&a);
        /* forward vs double reference, element by element. ReLU and identity are exact;
         * glibc's expf and tanhf are within 2 ulp (4u relative); sigmoid adds the 1 + e and the
         * division (k = 6); softmax's exp(x - max) carries the rounding of x - max into its
         * argument (u |x - max| relative), then the sum (double), 1 / sum and the product
         * (k = |x - max| + 6). */
        int act_ok = 1;
        double act_worst = 0.0;
        for (int i = 0; i < a.n; i++) {
            double mx = -INFINITY, se = 0;
            for (int j = 0; j < a.row; j++)
                mx = fmax(mx, a.x[i * a.row + j]);
            for (int j = 0; j < a.row; j++)
                se += exp(a.x[i * a.row + j] - mx);
            for (int j = 0; j < a.row; j++) {
                const double v = a.x[i * a.row + j];
                double want, k;
                if (acts[t] == MGT_ACT_SOFTMAX) {
                    want = exp(v - mx) / se;
                    k = fabs(v - mx) + 6;
                } else {
                    want = ref_act1(acts[t], (float)v);
                    k = acts[t] == MGT_ACT_SIGMOID ? 6 : acts[t] == MGT_ACT_TANH ? 4 : 0;
                }
                const double got = a.y[i * a.row + j];
                act_ok &= k == 0 ? got == want : near(got, want, k, fabs(want));
                act_worst = fmax(act_worst, fabs(got - want) / fmax(fabs(want), 1e-30));
            }
        }
        CHECK(act_ok, "%s forward vs reference: rel err %.3g", names[t], act_worst);
        /* backward from y */
        float *dx = fbuf(cnt);
        be->ops->act_bwd(be, acts[t], a.n, a.row, a.y, a.r, dx, 0);
        char what[64];
        snprintf(what, sizeof what, "%s dx", names[t]);
        fd_check(what, act_obj, &a, a.x, cnt, dx);
        tmp_free_all();
    }
    /* stability at extreme inputs */
    {
        float s[4] = {-200.0f, -90.0f, 90.0f, 200.0f},
              sm[6] = {1000.0f, 0.0f, -1000.0f, -1000.0f, -1000.0f, -999.0f};
        be->ops->act_fwd(be, MGT_ACT_SIGMOID, 1, 4, s, s);
        CHECK(all_finite(s, 4) && s[0] >= 0.0f && s[0] < 1e-30f && s[3] == 1.0f,
              "sigmoid extremes: %g %g %g %g", s[0], s[1], s[2], s[3]);
        be->ops->act_fwd(be, MGT_ACT_SOFTMAX, 2, 3, sm, sm);
        /* e / (e + 2) with e = exp(1) after the shift by the row maximum (k = 7, as above) */
        CHECK(all_finite(sm, 6) && sm[0] == 1.0f && near(sm[5], exp(1.0) / (exp(1.0) + 2), 7, 1),
              "softmax extremes: %g %g %g | %g %g %g", sm[0], sm[1], sm[2], sm[3], sm[4], sm[5]);
    }
}

/* =============================== cross-entropy =============================== */

typedef struct {
    mgt_backend *be;
    int n, k, dense;
    float *logits, *probs, *targets;
    int32_t *labels;
} xent_ctx;

static double xent_obj(void *p) {
    xent_ctx *c = p;
    float sums[3] = {0, 0, 0};
    poison(c->probs, (size_t)c->n * c->k);
    if (c->dense)
        c->be->ops->xent_dense(c->be, c->n, c->k, c->logits, c->targets, c->probs, NULL, 1.0f, 0.0f,
                               sums);
    else
        c->be->ops->xent_sparse(c->be, c->n, c->k, c->logits, c->labels, c->probs, NULL, 1.0f, 0.0f,
                                sums);
    return sums[0];
}

static void test_xent(mgt_backend *be) {
    const mgt_ops *o = be->ops;
    /* gradient of the summed loss (scale 1) */
    for (int dense = 0; dense < 2; dense++) {
        xent_ctx c = {.be = be, .n = 6, .k = 5, .dense = dense};
        const size_t cnt = (size_t)c.n * c.k;
        c.logits = fbuf(cnt), c.probs = fbuf(cnt), c.targets = fbuf(cnt);
        c.labels = tmp_alloc(c.n * sizeof(int32_t), 0);
        fill(c.logits, cnt, -2, 2);
        fill(c.targets, cnt, 0, 1); /* soft targets whose sum is not 1: tests p*sum(t) - t */
        for (int i = 0; i < c.n; i++)
            c.labels[i] = (int32_t)(mgt_rand64(OPCHECK_KEY, g_ctr++) % c.k);
        float *d = fbuf(cnt), sums[3] = {0, 0, 0};
        poison(d, cnt);
        if (dense)
            o->xent_dense(be, c.n, c.k, c.logits, c.targets, c.probs, d, 1.0f, 0.0f, sums);
        else
            o->xent_sparse(be, c.n, c.k, c.logits, c.labels, c.probs, d, 1.0f, 0.0f, sums);
        fd_check(dense ? "xent_dense dlogits" : "xent_sparse dlogits", xent_obj, &c, c.logits, cnt,
                 d);
        /* scale multiplies the gradient, and the sums (a sequence's mean over positions) */
        float *d2 = fbuf(cnt), sums2[3] = {0, 0, 0};
        if (dense)
            o->xent_dense(be, c.n, c.k, c.logits, c.targets, c.probs, d2, 0.25f, 0.0f, sums2);
        else
            o->xent_sparse(be, c.n, c.k, c.logits, c.labels, c.probs, d2, 0.25f, 0.0f, sums2);
        /* scaling by a power of two is exact in float, before or after the subtraction */
        double worst = 0;
        for (size_t i = 0; i < cnt; i++)
            worst = fmax(worst, fabs(d2[i] - 0.25 * d[i]));
        CHECK(worst == 0.0, "xent (dense %d): scale 0.25 gradient off by %.3g", dense, worst);
        CHECK(sums2[1] == 0.25f * sums[1] && sums2[2] == 0.25f * sums[2] &&
                  near(sums2[0], 0.25 * sums[0], 2, fabs(sums[0])),
              "xent (dense %d): scale 0.25 sums %g %g, unscaled %g %g", dense, sums2[0],
              sums2[1], sums[0], sums[1]);
        /* probs aliasing logits gives the same probabilities, loss and gradient */
        float *alias = fbuf(cnt), *d3 = fbuf(cnt), sums3[3] = {0, 0, 0};
        memcpy(alias, c.logits, cnt * sizeof(float));
        if (dense)
            o->xent_dense(be, c.n, c.k, alias, c.targets, alias, d3, 1.0f, 0.0f, sums3);
        else
            o->xent_sparse(be, c.n, c.k, alias, c.labels, alias, d3, 1.0f, 0.0f, sums3);
        CHECK(memcmp(alias, c.probs, cnt * sizeof(float)) == 0 &&
                  memcmp(d3, d, cnt * sizeof(float)) == 0 && sums3[0] == sums[0] &&
                  sums3[1] == sums[1],
              "xent (dense %d) with probs aliasing logits differs", dense);
        tmp_free_all();
    }
    /* hand example: logits [1 2 3]; softmax = [0.0900306 0.2447285 0.6652410]. The loss of a
     * row is lse - l (lse in double from float exps: 2 ulp each, relative to lse's scale ~3.4),
     * summed in double and added to the float sums (two more roundings on values up to 4.8): k = 8
     * on 5; probabilities and gradients: expf (4u), 1 / sum, product, subtraction and scale,
     * k = 8 on 1. */
    {
        const double pr[3] = {exp(-2.0) / (exp(-2.0) + exp(-1.0) + 1), 0,
                              1 / (exp(-2.0) + exp(-1.0) + 1)};
        const float logits[6] = {1, 2, 3, 1, 2, 3};
        const int32_t labels[2] = {2, 0};
        float probs[6], d[6], sums[3] = {1.0f, 2.0f, 0.0f}; /* sums accumulate (+=) */
        o->xent_sparse(be, 2, 3, logits, labels, probs, d, 0.5f, 0.0f, sums);
        const double l2 = 0.40760596444438, l0 = 2.40760596444438;
        CHECK(near(sums[0], 1.0 + 0.5 * (l2 + l0), 8, 5),
              "xent_sparse loss sum %.7f, expected %.7f", sums[0], 1.0 + 0.5 * (l2 + l0));
        CHECK(sums[1] == 2.5f, "xent_sparse correct count %g, expected 2 + 0.5 x 1", sums[1]);
        CHECK(near(probs[0], pr[0], 8, 1) && near(probs[2], pr[2], 8, 1),
              "xent_sparse probs %g %g %g", probs[0], probs[1], probs[2]);
        CHECK(near(d[2], 0.5 * (pr[2] - 1.0), 8, 1) && near(d[3], 0.5 * (pr[0] - 1.0), 8, 1) &&
                  near(d[4], 0.5 * (1 - pr[0] - pr[2]), 8, 1),
              "xent_sparse dlogits %g %g %g", d[2], d[3], d[4]);
        /* the same rows one-hot through the dense op, dlogits NULL */
        const float t[6] = {0, 0, 1, 1, 0, 0};
        float sd[3] = {0, 0, 0};
        o->xent_dense(be, 2, 3, logits, t, probs, NULL, 1.0f, 0.0f, sd);
        CHECK(near(sd[0], l2 + l0, 8, 5) && sd[1] == 1.0f,
              "xent_dense one-hot: loss %.7f (want %.7f), correct %g (want 1)", sd[0], l2 + l0,
              sd[1]);
        /* soft target: loss = sum t * lse - sum t*l, t = [0.5 0.5 0] */
        const float ts[3] = {0.5f, 0.5f, 0.0f};
        float ss[3] = {0, 0, 0};
        o->xent_dense(be, 1, 3, logits, ts, probs, NULL, 1.0f, 0.0f, ss);
        CHECK(near(ss[0], 3.40760596444438 - 1.5, 8, 5) && ss[1] == 0.0f,
              "xent_dense soft: loss %.7f (want %.7f), correct %g", ss[0], 3.40760596444438 - 1.5,
              ss[1]);
    }
    /* accuracy ties: the first maximum wins */
    {
        const float logits[9] = {2, 2, 1, 2, 2, 1, 2, 2, 1};
        const int32_t labels[3] = {0, 0, 1};
        float probs[9], sums[3] = {0, 0, 0};
        o->xent_sparse(be, 3, 3, logits, labels, probs, NULL, 1.0f, 0.0f, sums);
        CHECK(sums[1] == 2.0f, "xent_sparse tie: correct %g, expected 2 (first max wins)", sums[1]);
        /* target argmax ties too: rows 0, 1 -> class 0 (correct), row 2 -> class 1 (wrong) */
        const float t[9] = {0.4f, 0.4f, 0.2f, 0.4f, 0.4f, 0.2f, 0.2f, 0.4f, 0.4f};
        float sd[3] = {0, 0, 0};
        o->xent_dense(be, 3, 3, logits, t, probs, NULL, 1.0f, 0.0f, sd);
        CHECK(sd[1] == 2.0f, "xent_dense tie: correct %g, expected 2 (first max wins)", sd[1]);
    }
    /* top-5: the label counts when fewer than 5 classes are ahead of it (larger probability, or
     * equal probability at a lower index: the argmax's tie rule) */
    {
        float logits[5 * 8];
        for (int j = 0; j < 8; j++) {
            logits[j] = logits[8 + j] = (float)j; /* rows 0, 1: rising */
            logits[16 + j] = logits[24 + j] = logits[32 + j] = 1.0f; /* rows 2-4: all tied */
        }
        /* row 0: 4 classes ahead of 3 (in); row 1: 5 ahead of 2 (out); row 2: 4 tied classes
         * below index 4 (in); row 3: 5 below index 5 (out); row 4: an out-of-range label */
        const int32_t labels[5] = {3, 2, 4, 5, -1};
        float probs[40], sums[3] = {0, 0, 0};
        o->xent_sparse(be, 5, 8, logits, labels, probs, NULL, 1.0f, 0.0f, sums);
        CHECK(sums[2] == 2.0f && sums[1] == 0.0f,
              "xent_sparse top-5: %g in the top 5 (want 2), %g correct (want 0)", sums[2], sums[1]);
        float t[32] = {0}, sd[3] = {0, 0, 0};
        for (int i = 0; i < 4; i++)
            t[i * 8 + labels[i]] = 1.0f;
        o->xent_dense(be, 4, 8, logits, t, probs, NULL, 1.0f, 0.0f, sd);
        CHECK(sd[2] == 2.0f, "xent_dense top-5: %g in the top 5 (want 2)", sd[2]);
        /* the argmax is always in the top 5: a correct row counts in both (row 1: the largest
         * logit; row 2: the first of the tied ones; row 3: 5 tied classes ahead, in neither) */
        const int32_t top[3] = {7, 0, 5};
        float st[3] = {0, 0, 0};
        o->xent_sparse(be, 3, 8, logits + 8, top, probs, NULL, 1.0f, 0.0f, st);
        CHECK(st[1] == 2.0f && st[2] == 2.0f,
              "xent top-5 of the argmax: correct %g (want 2), top-5 %g (want 2)", st[1], st[2]);
    }
    /* extreme logits stay finite */
    {
        const float logits[3] = {1000.0f, 0.0f, -1000.0f};
        const int32_t lab = 1;
        float probs[3], d[3], sums[3] = {0, 0, 0};
        o->xent_sparse(be, 1, 3, logits, &lab, probs, d, 1.0f, 0.0f, sums);
        /* lse = 1000 + log(1 + e^-1000 + e^-2000) is 1000 in float; two roundings of 1000 */
        CHECK(near(sums[0], 1000.0, 2, 1000) && all_finite(probs, 3) && all_finite(d, 3),
              "xent extreme logits: loss %g (want 1000), probs %g %g %g", sums[0], probs[0],
              probs[1], probs[2]);
    }
}

/* =============================== flatten layout =============================== */

static void test_layout(mgt_backend *be) {
    const int n = 3, h = 5, w = 7, c = 34; /* c and h*w not multiples of the 32 tile */
    const size_t cnt = (size_t)n * h * w * c;
    float *x = fbuf(cnt), *y = fbuf(cnt), *back = fbuf(cnt), *u = fbuf(cnt), *v = fbuf(cnt);
    fill(x, cnt, -1, 1);
    poison(y, cnt);
    be->ops->nhwc_to_chw(be, n, h, w, c, x, y);
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int yy = 0; yy < h; yy++)
            for (int xx = 0; xx < w; xx++)
                for (int ch = 0; ch < c; ch++)
                    bad += y[(((size_t)i * c + ch) * h + yy) * w + xx] !=
                           x[(((size_t)i * h + yy) * w + xx) * c + ch];
    CHECK(bad == 0, "nhwc_to_chw: %d elements at the wrong place", bad);
    poison(back, cnt);
    be->ops->chw_to_nhwc(be, n, h, w, c, y, back);
    CHECK(memcmp(back, x, cnt * sizeof(float)) == 0, "chw_to_nhwc(nhwc_to_chw(x)) != x");
    /* adjoint: <A x, r> == <x, A^T r> with A^T = chw_to_nhwc (the backward of Flatten) */
    fill(u, cnt, -1, 1);
    poison(v, cnt);
    be->ops->chw_to_nhwc(be, n, h, w, c, u, v);
    /* the same products (exact in double) summed in two orders: each sum is within
     * cnt * 2^-53 of the sum of their absolute values */
    const double lhs = dot(y, u, cnt), rhs = dot(x, v, cnt);
    double sabs = 0.0;
    for (size_t i = 0; i < cnt; i++)
        sabs += fabs((double)y[i] * u[i]);
    CHECK(fabs(lhs - rhs) <= 2.0 * (double)cnt * 0x1p-53 * sabs, "flatten adjoint: %.12g vs %.12g",
          lhs, rhs);
    tmp_free_all();
}

/* =============================== optimizers =============================== */

/* Expected values computed by hand (in double) for w0 = [0.5 -1 2], g = [0.2 0.4 -0.6],
 * scale 0.5, lr 0.1, same g both steps; wd 0.01 where noted. Rows: step 1, step 2;
 * columns w[3] then state (vel / ms / m then v). The ops run in float: per element and step
 * at most 15 roundings (Adam's: the scaled gradient with decay 3, m 3, v 4, sqrt, + eps,
 * division, the rate, the update), the float constants 0.1f, 0.9f, 0.999f differ from the
 * decimals by less than u each, and two steps compound: gamma(40) relative to the size of the
 * values involved, max(1, |value|). */
static void check_vec(const char *what, int step, const float *got, const double *want, int n) {
    double worst = 0.0;
    int wi = 0;
    for (int i = 0; i < n; i++) {
        const double e = fabs(got[i] - want[i]) / fmax(1.0, fabs(want[i]));
        if (!(e <= worst)) {
            worst = e;
            wi = i;
        }
    }
    CHECK(worst <= opcheck_gamma(40), "%s step %d: element %d is %.9f, expected %.9f", what, step,
          wi, got[wi], want[wi]);
}

static void test_optim(mgt_backend *be) {
    const mgt_ops *o = be->ops;
    const float w0[3] = {0.5f, -1.0f, 2.0f}, g[3] = {0.2f, 0.4f, -0.6f};
    const float lr = 0.1f, scale = 0.5f;
    struct {
        const char *name;
        int kind; /* 0 sgd, 1 rmsprop, 2 adam */
        float momentum;
        int nesterov;
        float wd;
        double want[2][9];
    } cases[] = {
        {"sgd plain", 0, 0.0f, 0, 0.0f, {{0.49, -1.02, 2.03}, {0.48, -1.04, 2.06}}},
        {"sgd plain wd",
         0,
         0.0f,
         0,
         0.01f,
         {{0.4895, -1.019, 2.028}, {0.4790105, -1.037981, 2.055972}}},
        {"sgd momentum",
         0,
         0.9f,
         0,
         0.0f,
         {{0.49, -1.02, 2.03, -0.01, -0.02, 0.03}, {0.471, -1.058, 2.087, -0.019, -0.038, 0.057}}},
        {"sgd nesterov",
         0,
         0.9f,
         1,
         0.0f,
         {{0.481, -1.038, 2.057, -0.01, -0.02, 0.03},
          {0.4539, -1.0922, 2.1383, -0.019, -0.038, 0.057}}},
        {"sgd nesterov wd",
         0,
         0.9f,
         1,
         0.01f,
         {{0.48005, -1.0361, 2.0532, -0.0105, -0.019, 0.028},
          {0.451632905, -1.087521410, 2.128978920, -0.019930050, -0.036063900, 0.053146800}}},
        {"rmsprop",
         1,
         0,
         0,
         0.0f,
         {{0.183788044, -1.316223813, 2.316226009, 0.001, 0.004, 0.009},
          {-0.045621653, -1.545638038, 2.545641072, 0.0019, 0.0076, 0.0171}}},
        {"rmsprop wd",
         1,
         0,
         0,
         0.01f,
         {{0.183786574, -1.316223386, 2.316225749, 0.0011025, 0.00361, 0.00784},
          {-0.042271819, -1.543804810, 2.544402396, 0.002029345, 0.006739835, 0.014719914}}},
        {"adam",
         2,
         0,
         0,
         0.0f,
         {{0.400003162, -1.099998419, 2.099998946, 0.01, 0.02, -0.03, 0.00001, 0.00004, 0.00009},
          {0.300005399, -1.199997301, 2.199998200, 0.019, 0.038, -0.057, 0.00001999, 0.00007996,
           0.00017991}}},
        {"adam wd",
         2,
         0,
         0,
         0.01f,
         {{0.400003012, -1.099998336, 2.099998871, 0.0105, 0.019, -0.028, 0.000011025, 0.0000361,
           0.0000784},
          {0.300031238, -1.199983053, 2.199988585, 0.019850003, 0.036000002, -0.053100001,
           0.00002183, 0.000071785, 0.000156163}}},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        float st[9] = {0}; /* w[3], s1[3], s2[3] */
        memcpy(st, w0, sizeof w0);
        const int has_state = cases[t].kind != 0 || cases[t].momentum != 0.0f;
        const int nvals = 3 + (has_state ? 3 : 0) + (cases[t].kind == 2 ? 3 : 0);
        for (int step = 1; step <= 2; step++) {
            mgt_opt_hyper h = {.s = {.momentum = cases[t].momentum,
                                     .nesterov = cases[t].nesterov,
                                     .rho = 0.9f,
                                     .beta1 = 0.9f,
                                     .beta2 = 0.999f,
                                     .epsilon = 1e-7f,
                                     .weight_decay = cases[t].wd},
                               .lr = lr,
                               .scale = scale};
            float *slots[MGT_OPT_MAX_SLOTS] = {has_state ? st + 3 : NULL,
                                               cases[t].kind == 2 ? st + 6 : NULL};
            if (cases[t].kind == 2) /* Adam's bias correction */
                h.lr = lr * sqrtf(1.0f - powf(h.s.beta2, (float)step)) /
                       (1.0f - powf(h.s.beta1, (float)step));
            const mgt_opt_kind k[] = {MGT_OPT_SGD, MGT_OPT_RMSPROP, MGT_OPT_ADAM};
            o->optim_step(be, k[cases[t].kind], 3, st, g, slots, &h);
            check_vec(cases[t].name, step, st, cases[t].want[step - 1], nvals);
        }
    }
}

/* Optimizer state below 2^-126 is stored as zero (optim_math.h), and a step whose lr * m would be
 * below 2^-126 leaves w as it is, where epsilon >= MGT_OPT_FLUSH_EPS; with a smaller epsilon both
 * are kept as computed. Each case is one element with a zero gradient, so every value follows
 * from the rule's formula in single precision. */
static void test_optim_flush(mgt_backend *be) {
    const mgt_ops *o = be->ops;
    const float tiny = 0x1p-126f, zero_g = 0.0f;
    for (int small_eps = 0; small_eps <= 1; small_eps++) {
        const float eps = small_eps ? 1e-12f : 1e-7f;
        mgt_opt_hyper h = {.s = {.momentum = 0.9f, .rho = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f,
                                 .epsilon = eps},
                           .lr = 1e-3f,
                           .scale = 1.0f};
        /* Adam: m and v just above 2^-126 decay below it */
        float w = 0.5f, m = 1.05f * tiny, v = 1.0005f * tiny;
        float *slots[MGT_OPT_MAX_SLOTS] = {&m, &v};
        volatile float m_want = 0.9f * (1.05f * tiny), v_want = 0.999f * (1.0005f * tiny);
        o->optim_step(be, MGT_OPT_ADAM, 1, &w, &zero_g, slots, &h);
        CHECK(small_eps ? m == m_want && v == v_want && m != 0.0f : m == 0.0f && v == 0.0f,
              "adam, epsilon %g: m %a, v %a after decaying below 2^-126 (want %s)", eps, m, v,
              small_eps ? "kept" : "0");
        CHECK(w == 0.5f, "adam, epsilon %g: w %a moved by a subnormal moment", eps, w);
        /* Adam: m normal but lr * m subnormal; w 0, so any step would show */
        w = 0.0f, m = 0x1p-120f, v = 0.0f;
        o->optim_step(be, MGT_OPT_ADAM, 1, &w, &zero_g, slots, &h);
        volatile float lm = h.lr * (0.9f * 0x1p-120f);
        volatile float w_want = -(lm / (0.0f + eps));
        CHECK(m == 0.9f * 0x1p-120f, "adam: a normal m %a changed", m);
        CHECK(small_eps ? w == w_want && w != 0.0f : w == 0.0f,
              "adam, epsilon %g: w %a after a step of lr * m = %a (want %a)", eps, w, lm,
              small_eps ? w_want : 0.0f);
        /* RMSprop: ms decays below 2^-126 */
        float ms = 1.05f * tiny;
        float *rs[MGT_OPT_MAX_SLOTS] = {&ms, NULL};
        w = 0.5f;
        o->optim_step(be, MGT_OPT_RMSPROP, 1, &w, &zero_g, rs, &h);
        volatile float ms_want = 0.9f * (1.05f * tiny);
        CHECK(small_eps ? ms == ms_want && ms != 0.0f : ms == 0.0f,
              "rmsprop, epsilon %g: ms %a after decaying below 2^-126", eps, ms);
        /* SGD's velocity is flushed whatever epsilon (it is added to w) */
        float vel = 1.05f * tiny;
        float *ss[MGT_OPT_MAX_SLOTS] = {&vel, NULL};
        w = 0.5f;
        o->optim_step(be, MGT_OPT_SGD, 1, &w, &zero_g, ss, &h);
        CHECK(vel == 0.0f && w == 0.5f, "sgd momentum, epsilon %g: velocity %a, w %a", eps, vel,
              w);
    }
}

/* =============================== memory ops =============================== */

static void test_memory(mgt_backend *be) {
    const mgt_ops *o = be->ops;
    CHECK(strcmp(o->name, "cpu") == 0, "backend name is '%s', expected 'cpu'", o->name);
    float *a = o->alloc(be, 64 * sizeof(float));
    CHECK(a != NULL && all_zero(a, 64), "alloc: not zeroed memory");
    float host[64], back[64];
    for (int i = 0; i < 64; i++)
        host[i] = (float)i;
    o->to_device(be, a, host, sizeof host);
    float *b = o->alloc(be, sizeof host);
    o->copy(be, b, a, sizeof host);
    o->to_host(be, back, b, sizeof back);
    CHECK(memcmp(back, host, sizeof host) == 0, "to_device/copy/to_host round trip differs");
    o->zero(be, b, sizeof host);
    o->sync(be);
    CHECK(all_zero(b, 64), "zero left non-zero values");
    void *z = o->alloc(be, 0);
    CHECK(z != NULL, "alloc(0) returned NULL");
    o->free(be, z);
    o->free(be, a);
    o->free(be, b);
    CHECK(o->reserve(be, 1000) == 0 && o->reserve(be, 10) == 0, "reserve failed");
    CHECK(o->reserve(be, SIZE_MAX) == -1, "reserve(SIZE_MAX) should fail with -1");
}

/* ---- lanes: split ranges, BLAS threads, ops bit for bit on any thread count ---- */

typedef struct {
    atomic_int *seen;
    atomic_int misaligned, parts;
} split_ctx;

static void split_count(void *p, size_t lo, size_t hi) {
    split_ctx *c = p;
    if (lo % 16)
        atomic_fetch_add(&c->misaligned, 1);
    atomic_fetch_add(&c->parts, 1);
    for (size_t i = lo; i < hi; i++)
        atomic_fetch_add(&c->seen[i], 1);
}

static void lane_blas_threads(void *p, int lane) {
    atomic_int *threads = p;
    atomic_store(&threads[lane], openblas_get_num_threads());
}

/* Every op that splits its work, on a backend with `threads` lanes; outputs into out[]. The
 * shapes are past the ops' thresholds for splitting (2^16 elements). */
enum { LANE_OUTS = 28 }; /* outputs lane_outs() writes, at most */
typedef struct {
    int n, h, w, c; /* activation shape; pooling 2x2 stride 2 and 3x3 stride 2 on it */
    const float *x, *dy, *gamma, *beta;
} lane_case;

/* Runs them all, output i into out[i] (len[i] elements written); returns how many. */
static size_t lane_outs(const lane_case *k, mgt_backend *be, float **out, size_t *len) {
    const mgt_ops *o = be->ops;
    const size_t cnt = (size_t)k->n * k->h * k->w * k->c;
    const int rows = k->n * k->h * k->w, row = k->h * k->w * k->c;
    size_t m = 0;
    const mgt_act acts[] = {MGT_ACT_RELU, MGT_ACT_SIGMOID, MGT_ACT_TANH, MGT_ACT_SOFTMAX};
    for (int a = 0; a < 4; a++) { /* forward on a copy, then backward with that output */
        float *y = out[m], *g = out[m + 1];
        len[m] = len[m + 1] = cnt;
        m += 2;
        o->act_fwd(be, acts[a], k->n, row, k->x, y);
        o->act_bwd(be, acts[a], k->n, row, y, k->dy, g, 0);
    }
    float *d = out[m], *e = out[m + 1];
    len[m] = len[m + 1] = cnt;
    m += 2;
    memcpy(d, k->x, sizeof(float) * cnt);
    o->dropout_fwd(be, k->n, row, 0.3f, 99, 5, d);
    memcpy(e, k->dy, sizeof(float) * cnt);
    o->dropout_bwd(be, k->n, row, 0.6f, 7, 0, e);
    /* BatchNorm: sums, mean/invstd from them, apply, and both backward passes (the six
     * per-channel vectors side by side in one output) */
    /* column sums alone (a convolution's bias gradient): mgt_cpu_colsum's values, bit for bit */
    float *cs = out[m], *want = out[m + 1];
    len[m] = len[m + 1] = (size_t)k->c;
    m += 2;
    mgt_cpu_channel_sums(be, (size_t)rows, k->c, k->dy, cs, NULL);
    mgt_cpu_colsum((size_t)rows, k->c, k->dy, want);
    CHECK(memcmp(cs, want, sizeof(float) * (size_t)k->c) == 0,
          "mgt_cpu_channel_sums differs from mgt_cpu_colsum");
    float *v = out[m], *y = out[m + 1], *dx = out[m + 2];
    len[m++] = 6 * (size_t)k->c;
    len[m] = len[m + 1] = cnt;
    m += 2;
    float *sum = v, *sumsq = v + k->c, *mean = v + 2 * k->c, *invstd = v + 3 * k->c;
    float *dgamma = v + 4 * k->c, *dbeta = v + 5 * k->c;
    o->bn_stats(be, rows, k->c, k->x, sum, sumsq);
    o->bn_finalize(be, k->c, (float)rows, sum, sumsq, 1e-3f, 0.9f, NULL, mean, invstd, NULL, NULL);
    const mgt_bn_pass bp = {rows,     k->c,    k->x, mean,         invstd,
                            k->gamma, k->beta, NULL, MGT_ACT_NONE, NULL, 0};
    o->bn_apply(be, &bp, y);
    o->bn_bwd_reduce(be, &bp, k->dy, dgamma, dbeta);
    o->bn_bwd_apply(be, &bp, (float)rows, k->dy, dgamma, dbeta, dx, NULL, 0);
    /* pooling: 2x2 stride 2 and overlapping 3x3 stride 2 windows; the argmax indices are
     * compared too */
    for (int pz = 2; pz <= 3; pz++) {
        const mgt_pool_shape ps = {.n = k->n,
                                   .h = k->h,
                                   .w = k->w,
                                   .c = k->c,
                                   .size = pz,
                                   .stride = 2,
                                   .oh = (k->h - pz) / 2 + 1,
                                   .ow = (k->w - pz) / 2 + 1};
        const size_t ny = (size_t)ps.n * ps.oh * ps.ow * ps.c;
        float *py = out[m], *pdx = out[m + 1], *ay = out[m + 2], *adx = out[m + 3];
        int32_t *am = (int32_t *)out[m + 4];
        len[m++] = ny, len[m++] = cnt, len[m++] = ny, len[m++] = cnt, len[m++] = ny;
        o->maxpool_fwd(be, &ps, k->x, py, am);
        o->maxpool_bwd(be, &ps, k->dy, am, pdx);
        o->avgpool_fwd(be, &ps, k->x, ay);
        o->avgpool_bwd(be, &ps, k->dy, adx);
    }
    /* the direct convolution's gradients (im2col, GEMMs, col2im by whole samples), 3x3 "same"
     * with 8 filters, through scratch for 5.5 samples' rows: chunks that end inside a sample */
    const mgt_conv_shape cs3 = {.n = k->n, .h = k->h, .w = k->w, .c = k->c, .oc = 8, .kh = 3,
                                .kw = 3, .stride = 1, .pad_top = 1, .pad_left = 1, .oh = k->h,
                                .ow = k->w, .algo = MGT_CONV_DIRECT};
    const size_t ckk = (size_t)k->c * 9, crow = (size_t)k->h * k->w;
    CHECK(o->reserve(be, (crow * 5 + crow / 2) * ckk * sizeof(float)) == 0, "conv scratch");
    float *cdx = out[m], *cdw = out[m + 1];
    len[m++] = cnt, len[m++] = 8 * ckk;
    o->conv2d_bwd(be, &cs3, k->x, k->dy + 8 * ckk, k->dy, cdx, cdw, NULL);
    return m;
}

/* mgt_cpu_gemm against a double reference and bit for bit on 1 to 4 lanes. Shapes above and
 * below the size it splits at, split by rows (M >= N) and by columns, every transpose, with
 * leading dimensions wider than the matrices. */
static void test_lanes_gemm(void) {
    const int shapes[][3] = {
        {8, 5, 3}, {300, 70, 250}, {70, 301, 260}, {128, 128, 600}, {1000, 40, 130}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            const CBLAS_TRANSPOSE ta = t & 1 ? CblasTrans : CblasNoTrans;
            const CBLAS_TRANSPOSE tb = t & 2 ? CblasTrans : CblasNoTrans;
            /* row-major storage: op(A) is M x K, stored K x M when transposed */
            const int lda = (ta == CblasNoTrans ? K : M) + 3,
                      ldb = (tb == CblasNoTrans ? N : K) + 5;
            const int ldc = N + 7;
            const size_t na = (size_t)(ta == CblasNoTrans ? M : K) * lda;
            const size_t nb = (size_t)(tb == CblasNoTrans ? K : N) * ldb, nc = (size_t)M * ldc;
            float *a = fbuf(na), *b = fbuf(nb), *c0 = fbuf(nc), *ref1 = fbuf(nc), *c = fbuf(nc);
            fill(a, na, -1, 1);
            fill(b, nb, -1, 1);
            fill(c0, nc, -1, 1);
            const float alpha = 0.75f, beta = t == 3 ? 0.0f : 0.5f;
            /* the exact result and the sum of absolute terms, in double */
            double worst = 0.0;
            for (int lanes = 1; lanes <= 4; lanes++) {
                mgt_cpu_lanes *l = mgt_cpu_lanes_create(lanes);
                memcpy(c, c0, sizeof(float) * nc);
                mgt_cpu_gemm(l, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
                mgt_cpu_lanes_destroy(l);
                if (lanes == 1) {
                    memcpy(ref1, c, sizeof(float) * nc);
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) {
                            double r = 0.0, ar = 0.0;
                            for (int k = 0; k < K; k++) {
                                const double p =
                                    (double)a[ta == CblasNoTrans ? i * lda + k : k * lda + i] *
                                    b[tb == CblasNoTrans ? k * ldb + j : j * ldb + k];
                                r += p;
                                ar += fabs(p);
                            }
                            const double cij = c0[i * ldc + j];
                            const double want = alpha * r + beta * cij;
                            /* K products summed in any order (gamma(K)), times alpha, plus
                             * beta C: gamma(K + 2) of the absolute terms */
                            const double bound =
                                opcheck_gamma(K + 2.0) * (fabs(alpha) * ar + fabs(beta * cij));
                            const double e = fabs(c[i * ldc + j] - want) / (bound > 0 ? bound : 1);
                            worst = e > worst ? e : worst;
                        }
                    int gaps = 1; /* columns past N are not written */
                    for (int i = 0; i < M; i++)
                        for (int j = N; j < ldc; j++)
                            gaps &= c[i * ldc + j] == c0[i * ldc + j];
                    CHECK(worst <= 1.0 && gaps,
                          "mgt_cpu_gemm %dx%dx%d (%c%c): error %.3g of the bound, gap %s", M, N, K,
                          ta == CblasNoTrans ? 'N' : 'T', tb == CblasNoTrans ? 'N' : 'T', worst,
                          gaps ? "untouched" : "written");
                } else {
                    CHECK(memcmp(c, ref1, sizeof(float) * nc) == 0,
                          "mgt_cpu_gemm %dx%dx%d (%c%c) on %d lanes differs from 1 lane", M, N, K,
                          ta == CblasNoTrans ? 'N' : 'T', tb == CblasNoTrans ? 'N' : 'T', lanes);
                }
            }
        }
    tmp_free_all();
}

/* mgt_cpu_gemm_pair: a backward's two products, whole (each one cblas_sgemm call) where neither
 * would be cut in more than two parts, else each as mgt_cpu_gemm splits it; bit for bit the same
 * on 1 to 4 lanes, and the gaps of C untouched. */
static void test_lanes_gemm_pair(void) {
    /* {M, N, K} of the weight gradient (TN) and of the input gradient (NN); whole: 1 */
    const int pairs[][7] = {{256, 256, 256, 256, 256, 256, 1}, /* the MLP's 256 -> 256 layer */
                            {10, 256, 256, 256, 256, 10, 1},   /* small: one call each anyway */
                            {256, 784, 256, 256, 784, 256, 0}, /* 784 columns: 4 parts */
                            {300, 70, 250, 1000, 40, 130, 0}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        mgt_cpu_gemm_args g[2];
        float *c0[2], *ref[2], *c[2];
        size_t nc[2];
        for (int k = 0; k < 2; k++) {
            const int M = pairs[p][3 * k], N = pairs[p][3 * k + 1], K = pairs[p][3 * k + 2];
            const CBLAS_TRANSPOSE ta = k == 0 ? CblasTrans : CblasNoTrans;
            const int lda = (ta == CblasNoTrans ? K : M) + 3, ldb = N + 5, ldc = N + 7;
            const size_t na = (size_t)(ta == CblasNoTrans ? M : K) * lda, nb = (size_t)K * ldb;
            nc[k] = (size_t)M * ldc;
            float *a = fbuf(na), *b = fbuf(nb);
            c0[k] = fbuf(nc[k]), ref[k] = fbuf(nc[k]), c[k] = fbuf(nc[k]);
            fill(a, na, -1, 1);
            fill(b, nb, -1, 1);
            fill(c0[k], nc[k], -1, 1);
            g[k] = (mgt_cpu_gemm_args){ta, CblasNoTrans, M, N, K, 1.0f, a, lda, b, ldb, 0.0f,
                                       ref[k], ldc};
            memcpy(ref[k], c0[k], sizeof(float) * nc[k]);
            if (pairs[p][6])
                cblas_sgemm(CblasRowMajor, g[k].ta, g[k].tb, M, N, K, g[k].alpha, a, lda, b, ldb,
                            g[k].beta, ref[k], ldc);
            else
                mgt_cpu_gemm(NULL, g[k].ta, g[k].tb, M, N, K, g[k].alpha, a, lda, b, ldb,
                             g[k].beta, ref[k], ldc);
            g[k].C = c[k];
        }
        for (int lanes = 1; lanes <= 4; lanes++) {
            mgt_cpu_lanes *l = mgt_cpu_lanes_create(lanes);
            for (int k = 0; k < 2; k++)
                memcpy(c[k], c0[k], sizeof(float) * nc[k]);
            mgt_cpu_gemm_pair(l, &g[0], &g[1], NULL);
            mgt_cpu_lanes_destroy(l);
            for (int k = 0; k < 2; k++)
                CHECK(memcmp(c[k], ref[k], sizeof(float) * nc[k]) == 0,
                      "mgt_cpu_gemm_pair %zu, product %d on %d lanes: not the bits of %s", p, k,
                      lanes, pairs[p][6] ? "one call" : "mgt_cpu_gemm");
        }
    }
    tmp_free_all();
}

static void test_lanes(void) {
    /* split ranges: each item once, parts cut at multiples of 16 */
    const size_t ns[] = {0, 1, 15, 16, 17, 100, 1000, 100003};
    const size_t mins[] = {1, 7, 1000};
    atomic_int *seen = tmp_alloc(sizeof(atomic_int) * 100003, 0);
    for (int lanes = 1; lanes <= 4; lanes++) {
        mgt_cpu_lanes *l = mgt_cpu_lanes_create(lanes);
        CHECK(l != NULL, "mgt_cpu_lanes_create(%d) failed", lanes);
        if (!l)
            continue;
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t b = 0; b < sizeof mins / sizeof mins[0]; b++) {
                for (size_t i = 0; i < ns[a]; i++)
                    atomic_init(&seen[i], 0);
                split_ctx c = {.seen = seen};
                atomic_init(&c.misaligned, 0);
                atomic_init(&c.parts, 0);
                mgt_cpu_lanes_for(l, ns[a], mins[b], split_count, &c);
                size_t wrong = 0;
                for (size_t i = 0; i < ns[a]; i++)
                    wrong += atomic_load(&seen[i]) != 1;
                const int parts = atomic_load(&c.parts);
                CHECK(wrong == 0 && atomic_load(&c.misaligned) == 0 &&
                          (ns[a] == 0 ? parts == 0 : parts >= 1) &&
                          (size_t)parts <= (ns[a] + mins[b] - 1) / mins[b],
                      "lanes_for(%zu items, parts >= %zu) on %d lanes: %zu items not visited "
                      "exactly once, %d parts, %d not at a multiple of 16",
                      ns[a], mins[b], lanes, wrong, parts, atomic_load(&c.misaligned));
            }
        /* BLAS inside the lanes, one lane too: one thread (the lanes are the parallelism, and
         * results must not depend on their number); restored after */
        openblas_set_num_threads(3);
        atomic_int threads[4];
        for (int i = 0; i < 4; i++)
            atomic_init(&threads[i], -1);
        mgt_cpu_lanes_run(l, lanes, lane_blas_threads, threads);
        int inside_ok = 1;
        for (int i = 0; i < lanes; i++)
            inside_ok &= atomic_load(&threads[i]) == 1;
        CHECK(inside_ok && openblas_get_num_threads() == 3,
              "%d lanes: BLAS threads inside the lanes %d %d %d %d (want 1), after %d (want 3)",
              lanes, atomic_load(&threads[0]), atomic_load(&threads[1]), atomic_load(&threads[2]),
              atomic_load(&threads[3]), openblas_get_num_threads());
        mgt_cpu_lanes_destroy(l);
    }
    openblas_set_num_threads(1); /* as the backend holds it */

    /* the split ops, bit for bit on 1 to 4 threads */
    lane_case k = {.n = 24, .h = 13, .w = 11, .c = 40};
    const size_t cnt = (size_t)k.n * k.h * k.w * k.c;
    float *x = fbuf(cnt), *dy = fbuf(cnt), *gamma = fbuf(k.c), *beta = fbuf(k.c);
    fill(x, cnt, -2, 2);
    fill(dy, cnt, -1, 1);
    fill(gamma, k.c, 0.5f, 1.5f);
    fill(beta, k.c, -1, 1);
    k.x = x, k.dy = dy, k.gamma = gamma, k.beta = beta;
    float *ref[LANE_OUTS], *got[LANE_OUTS];
    for (int i = 0; i < LANE_OUTS; i++) {
        ref[i] = fbuf(cnt);
        got[i] = fbuf(cnt);
    }
    mgt_backend one = {0};
    CHECK(mgt_cpu_backend_init(&one, 1) == 0, "cpu backend with 1 thread failed to start");
    size_t len[LANE_OUTS], len2[LANE_OUTS];
    const size_t m = lane_outs(&k, &one, ref, len);
    CHECK(m <= LANE_OUTS, "lane_outs wrote %zu outputs, more than %d", m, LANE_OUTS);
    mgt_backend_destroy(&one);
    for (int threads = 2; threads <= 4; threads++) {
        mgt_backend be = {0};
        CHECK(mgt_cpu_backend_init(&be, threads) == 0, "cpu backend with %d threads", threads);
        for (size_t i = 0; i < m; i++)
            poison(got[i], cnt);
        lane_outs(&k, &be, got, len2);
        for (size_t i = 0; i < m; i++) {
            size_t first = len[i];
            for (size_t e = 0; e < len[i] && first == len[i]; e++)
                if (memcmp(&got[i][e], &ref[i][e], sizeof(float)) != 0)
                    first = e;
            CHECK(first == len[i],
                  "split op output %zu on %d threads differs from 1 thread at "
                  "element %zu: %g vs %g",
                  i, threads, first, first < len[i] ? got[i][first] : 0.0,
                  first < len[i] ? ref[i][first] : 0.0);
        }
        mgt_backend_destroy(&be);
    }
}

/* =============== a ReLU taken over by the op before or after it =============== */

/* x with about a third of its values at exactly 0 (as a ReLU's output has them), one -0, one
 * negative and one NaN: what the ReLU's mask must read as act_bwd does (y > 0). */
static void fill_relu_like(float *x, size_t n) {
    fill(x, n, -1, 2);
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] < 0.0f ? 0.0f : x[i];
    x[n / 2] = -0.0f;
    x[n / 3] = -0.5f;
    x[n - 1] = NAN;
}

/* conv2d_fwd with mgt_conv_shape.act = MGT_ACT_RELU writes act_fwd's ReLU of the output, bit for
 * bit (-0 and NaN kept): on each path, the direct kernels' stores (stride 1), Winograd and im2col
 * (the pass after them), pointwise. batchnorm's backward with x_relu and maxpool_bwd_relu give
 * the bits of their op followed by act_bwd's ReLU gradient with y = x, including where x is 0, -0
 * or NaN and, for pooling, where windows overlap. */
static void test_relu_takeover(mgt_backend *be) {
    const mgt_ops *o = be->ops;
    CHECK(o->conv_relu && o->bn_x_relu && o->maxpool_bwd_relu,
          "the CPU backend should take the ReLU over in conv2d_fwd, bn_bwd_apply and maxpool");
    static const struct {
        conv_cfg k;
        mgt_conv_algo algo;
    } cases[] = {
        /* n  h  w  c  oc kh kw st pt pb pl pr bias */
        {{2, 9, 8, 5, 32, 3, 3, 1, 1, 1, 1, 1, 1}, MGT_CONV_DIRECT},
        {{2, 9, 8, 5, 40, 3, 3, 1, 0, 0, 0, 0, 1}, MGT_CONV_DIRECT},
        {{2, 9, 8, 5, 32, 3, 3, 1, 1, 1, 1, 1, 1}, MGT_CONV_WINOGRAD},
        {{2, 9, 8, 5, 16, 3, 3, 2, 1, 1, 1, 1, 1}, MGT_CONV_AUTO},
        {{2, 6, 6, 7, 12, 1, 1, 1, 0, 0, 0, 0, 0}, MGT_CONV_AUTO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mgt_conv_shape s = conv_shape_of(&cases[i].k);
        s.algo = cases[i].algo;
        const size_t nx = conv_nx(&s), nw = conv_nw(&s), ny = conv_ny(&s);
        float *x = fbuf(nx), *w = fbuf(nw), *b = fbuf(s.oc), *y = fbuf(ny), *yr = fbuf(ny);
        fill(x, nx, -1, 1);
        fill(w, nw, -1, 1);
        fill(b, s.oc, -1, 1);
        x[nx / 2] = NAN; /* NaN through every output whose window holds it */
        CHECK(o->reserve(be, o->conv2d_scratch(&s)) == 0, "conv relu case %zu: reserve", i);
        poison(y, ny);
        poison(yr, ny);
        o->conv2d_fwd(be, &s, x, w, cases[i].k.bias ? b : NULL, y);
        o->act_fwd(be, MGT_ACT_RELU, s.n, (int)(ny / (size_t)s.n), y, y);
        s.act = MGT_ACT_RELU;
        o->conv2d_fwd(be, &s, x, w, cases[i].k.bias ? b : NULL, yr);
        size_t zeros = 0, nans = 0;
        for (size_t j = 0; j < ny; j++)
            zeros += yr[j] == 0.0f, nans += isnan(yr[j]);
        CHECK(memcmp(y, yr, ny * sizeof(float)) == 0 && zeros > 0 && nans > 0,
              "conv relu case %zu (stride %d, algo %d): not act_fwd's ReLU bit for bit (%zu "
              "zeros, %zu NaNs)",
              i, s.stride, (int)s.algo, zeros, nans);
    }
    /* batchnorm backward, alone (the vectorised loop) and with a group's ReLU and residual */
    for (int general = 0; general < 2; general++) {
        const int rows = 37, c = 19;
        const size_t n = (size_t)rows * c;
        float *x = fbuf(n), *dy = fbuf(n), *mean = fbuf(c), *invstd = fbuf(c), *gamma = fbuf(c);
        float *beta = fbuf(c), *dg = fbuf(c), *db = fbuf(c), *dx = fbuf(n), *dxr = fbuf(n);
        float *dr = fbuf(n), *drr = fbuf(n);
        fill_relu_like(x, n);
        fill(dy, n, -1, 1);
        fill(mean, c, 0, 1);
        fill(invstd, c, 0.5f, 2);
        fill(gamma, c, 0.5f, 1.5f);
        fill(beta, c, -1, 1);
        fill(dg, c, -1, 1);
        fill(db, c, -1, 1);
        mgt_bn_pass p = {rows, c, x, mean, invstd, gamma, beta, NULL,
                         general ? MGT_ACT_RELU : MGT_ACT_NONE, NULL, 0};
        poison(dx, n);
        poison(dxr, n);
        o->bn_bwd_apply(be, &p, (float)rows, dy, dg, db, dx, general ? dr : NULL, 0);
        o->act_bwd(be, MGT_ACT_RELU, rows, c, x, dx, dx, 0);
        p.x_relu = 1;
        o->bn_bwd_apply(be, &p, (float)rows, dy, dg, db, dxr, general ? drr : NULL, 0);
        CHECK(memcmp(dx, dxr, n * sizeof(float)) == 0 &&
                  (!general || memcmp(dr, drr, n * sizeof(float)) == 0),
              "bn_bwd_apply x_relu (%s): not act_bwd's ReLU gradient bit for bit",
              general ? "with a group's ReLU and residual" : "alone");
    }
    /* max pooling backward: whole windows, and overlapping ones (size 3, stride 2) */
    const int pq[][6] = {{2, 6, 8, 5, 2, 2}, {2, 7, 7, 3, 3, 2}};
    for (size_t t = 0; t < sizeof pq / sizeof pq[0]; t++) {
        const int *q = pq[t];
        const mgt_pool_shape ps = pool_shape(q[0], q[1], q[2], q[3], q[4], q[5]);
        const size_t nx = pool_nx(&ps), ny = pool_ny(&ps);
        float *x = fbuf(nx), *y = fbuf(ny), *dy = fbuf(ny), *dx = fbuf(nx), *dxr = fbuf(nx);
        int32_t *am = tmp_alloc(ny * sizeof(int32_t), 0);
        fill_relu_like(x, nx);
        fill(dy, ny, -1, 1);
        o->maxpool_fwd(be, &ps, x, y, am);
        poison(dx, nx);
        poison(dxr, nx);
        o->maxpool_bwd(be, &ps, dy, am, dx);
        o->act_bwd(be, MGT_ACT_RELU, ps.n, (int)(nx / (size_t)ps.n), x, dx, dx, 0);
        o->maxpool_bwd_relu(be, &ps, x, dy, am, dxr);
        CHECK(memcmp(dx, dxr, nx * sizeof(float)) == 0,
              "maxpool_bwd_relu size %d stride %d: not act_bwd's ReLU gradient bit for bit", q[4],
              q[5]);
    }
    tmp_free_all();
}


/* =========================== losses of float targets =========================== */

typedef struct {
    mgt_backend *be;
    mgt_elem_loss L;
    int n, k;
    float *y, *t;
} elem_ctx;

static double elem_obj(void *p) {
    elem_ctx *c = p;
    float sums[MGT_SUM_TASK + MGT_SUM_LABELS + 3 * 8 + 1] = {0};
    c->be->ops->elem_loss(c->be, &c->L, c->n, c->k, c->y, c->t, NULL, NULL, 1.0f, sums);
    return sums[MGT_SUM_LOSS];
}

/* The loss of one output in double, from the textbook formulas (not loss_math.h's forms). */
static double elem_ref(mgt_elem_kind kind, double y, double t, double delta, double w0, double w1) {
    const double e = y - t;
    switch (kind) {
    case MGT_ELEM_BCE: {
        const double p = 1.0 / (1.0 + exp(-y));
        return -(w1 * t * log(p) + w0 * (1 - t) * log(1 - p));
    }
    case MGT_ELEM_MSE:
        return e * e;
    case MGT_ELEM_MAE:
        return fabs(e);
    default:
        return fabs(e) <= delta ? 0.5 * e * e : delta * (fabs(e) - 0.5 * delta);
    }
}

static void test_elem_loss(mgt_backend *be) {
    const mgt_ops *o = be->ops;
    static const float cw[2] = {0.5f, 3.0f};
    const char *names[4] = {"binary_crossentropy", "mse", "mae", "huber"};
    for (int kind = 0; kind < 4; kind++) {
        elem_ctx c = {.be = be, .n = 5, .k = 4};
        c.L = (mgt_elem_loss){.kind = (mgt_elem_kind)kind, .delta = 0.7f};
        if (kind == MGT_ELEM_BCE)
            c.L.cw = cw, c.L.per_label = 1;
        const size_t cnt = (size_t)c.n * c.k;
        c.y = fbuf(cnt), c.t = fbuf(cnt);
        fill(c.y, cnt, -2, 2);
        fill(c.t, cnt, 0, 1);
        /* errors kept 0.1 away from the kinks of mae (0) and huber (+-delta): the central
         * differences (step 1e-2) then see one smooth piece */
        for (size_t i = 0; i < cnt && kind >= MGT_ELEM_MAE; i++) {
            float e = c.y[i] - c.t[i];
            if (fabsf(e) < 0.1f)
                e = e < 0 ? -0.1f - fabsf(e) : 0.1f + e;
            if (fabsf(fabsf(e) - 0.7f) < 0.1f)
                e = e < 0 ? -0.9f : 0.9f;
            c.y[i] = c.t[i] + e;
        }
        float *d = fbuf(cnt), sums[MGT_SUM_TASK + MGT_SUM_LABELS + 3 * 8 + 1] = {0};
        poison(d, cnt);
        o->elem_loss(be, &c.L, c.n, c.k, c.y, c.t, NULL, d, 1.0f, sums);
        char what[64];
        snprintf(what, sizeof what, "elem_loss %s dy", names[kind]);
        fd_check(what, elem_obj, &c, c.y, cnt, d);
        /* the loss: each sample's mean of the textbook terms, summed; the terms are computed
         * in double, the sum of 20 of them rounded once to float: 2 ulps of the sum */
        double want = 0, abs_sum = 0, sq_sum = 0;
        for (int i = 0; i < c.n; i++) {
            double row = 0;
            for (int j = 0; j < c.k; j++) {
                const size_t at = (size_t)i * c.k + j;
                row += elem_ref((mgt_elem_kind)kind, c.y[at], c.t[at], 0.7, kind ? 1 : 0.5,
                                kind ? 1 : 3);
                abs_sum += fabs((double)c.y[at] - c.t[at]);
                sq_sum += ((double)c.y[at] - c.t[at]) * ((double)c.y[at] - c.t[at]);
            }
            want += row / c.k;
        }
        CHECK(near(sums[MGT_SUM_LOSS], want, 2, fabs(want)), "elem_loss %s: loss %.8g, want %.8g",
              names[kind], sums[MGT_SUM_LOSS], want);
        if (kind != MGT_ELEM_BCE)
            CHECK(near(sums[MGT_SUM_TASK + MGT_SUM_ABS], abs_sum, 2, abs_sum) &&
                      near(sums[MGT_SUM_TASK + MGT_SUM_SQ], sq_sum, 2, sq_sum),
                  "elem_loss %s: |e| sum %.8g (want %.8g), e^2 sum %.8g (want %.8g)", names[kind],
                  sums[MGT_SUM_TASK + MGT_SUM_ABS], abs_sum, sums[MGT_SUM_TASK + MGT_SUM_SQ],
                  sq_sum);
        /* scale and the output count divide the gradient: 0.25 is exact */
        float *d2 = fbuf(cnt), s2[MGT_SUM_TASK + MGT_SUM_LABELS + 3 * 8 + 1] = {0};
        o->elem_loss(be, &c.L, c.n, c.k, c.y, c.t, NULL, d2, 0.25f, s2);
        double worst = 0;
        for (size_t i = 0; i < cnt; i++)
            worst = fmax(worst, fabs(d2[i] - 0.25 * d[i]));
        CHECK(worst == 0.0, "elem_loss %s: scale 0.25 gradient off by %.3g", names[kind], worst);
    }
    { /* binary: probabilities over the logits, the counts, extreme logits */
        float y[6] = {1, -1, 2, -3, -0.5f, 0.1f}, t[6] = {1, 0, 0, 1, 0, 1};
        float p[6], d[6], d2[6], s1[MGT_SUM_TASK + MGT_SUM_LABELS + 6 + 1] = {0},
                                 s2[MGT_SUM_TASK + MGT_SUM_LABELS + 6 + 1] = {0};
        const mgt_elem_loss L = {.kind = MGT_ELEM_BCE, .per_label = 1};
        o->elem_loss(be, &L, 3, 2, y, t, p, d, 1.0f, s1);
        const float *task = s1 + MGT_SUM_TASK, *lab = task + MGT_SUM_LABELS;
        /* predicted (y > 0): 1 0 / 1 0 / 0 1 against 1 0 / 0 1 / 0 1 */
        CHECK(s1[MGT_SUM_CORRECT] == 4 && task[MGT_SUM_TP] == 2 && task[MGT_SUM_FP] == 1 &&
                  task[MGT_SUM_FN] == 1,
              "binary counts: right %g tp %g fp %g fn %g (want 4 2 1 1)", s1[MGT_SUM_CORRECT],
              task[MGT_SUM_TP], task[MGT_SUM_FP], task[MGT_SUM_FN]);
        CHECK(lab[0] == 1 && lab[1] == 1 && lab[2] == 0 && lab[3] == 1 && lab[4] == 0 &&
                  lab[5] == 1,
              "binary per-label counts %g %g %g | %g %g %g (want 1 1 0 | 1 0 1)", lab[0], lab[1],
              lab[2], lab[3], lab[4], lab[5]);
        CHECK(near(p[0], 1 / (1 + exp(-1.0)), 2, 1) && near(d[0], (p[0] - 1) / 2, 2, 1),
              "binary probs %g, dy %g", p[0], d[0]);
        /* probabilities written over the logits: the same loss, gradient and counts */
        float ya[6];
        memcpy(ya, y, sizeof y);
        o->elem_loss(be, &L, 3, 2, ya, t, ya, d2, 1.0f, s2);
        CHECK(!memcmp(ya, p, sizeof p) && !memcmp(d, d2, sizeof d) && !memcmp(s1, s2, sizeof s1),
              "binary with probs over the logits differs");
        /* logits of +-90: softplus(90) = 90 exactly in float; no overflow, no NaN */
        float yx[2] = {90, -90}, tx[2] = {0, 0}, sx[MGT_SUM_TASK + MGT_SUM_LABELS + 1] = {0};
        const mgt_elem_loss L1 = {.kind = MGT_ELEM_BCE};
        o->elem_loss(be, &L1, 2, 1, yx, tx, NULL, d, 1.0f, sx);
        CHECK(sx[MGT_SUM_LOSS] == 90.0f && d[0] == 1.0f && d[1] >= 0.0f && d[1] < 1e-38f,
              "binary at +-90: loss %g (want 90), dy %g %g (want 1, e^-90)", sx[MGT_SUM_LOSS],
              d[0], d[1]);
        /* label smoothing 0.2: the target 1 becomes 0.9 (Keras' t (1 - s) + s / 2) */
        float y0 = 0, t1 = 1, dd, ss[MGT_SUM_TASK + MGT_SUM_LABELS + 1] = {0};
        const mgt_elem_loss Ls = {.kind = MGT_ELEM_BCE, .smoothing = 0.2f};
        o->elem_loss(be, &Ls, 1, 1, &y0, &t1, NULL, &dd, 1.0f, ss);
        CHECK(near(dd, 0.5 - 0.9, 2, 1) && near(ss[MGT_SUM_LOSS], log(2.0), 2, 1),
              "binary smoothing 0.2: dy %g (want -0.4), loss %g (want log 2)", dd,
              ss[MGT_SUM_LOSS]);
    }
}

int main(void) {
    mgt_backend be = opcheck_cpu_backend("test_ops");
    test_memory(&be);
    test_dense(&be);
    test_conv_grads();
    test_conv_chunking();
    test_convk();
    test_conv_n0();
    test_pool(&be);
    test_bn(&be);
    test_relu_takeover(&be);
    test_dropout(&be);
    test_act(&be);
    test_xent(&be);
    test_elem_loss(&be);
    test_layout(&be);
    test_optim(&be);
    test_optim_flush(&be);
    test_lanes();
    test_lanes_gemm();
    test_lanes_gemm_pair();
    mgt_backend_destroy(&be);
    tmp_free_all();
    return opcheck_finish("test_ops");
}
