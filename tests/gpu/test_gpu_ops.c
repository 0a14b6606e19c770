/* test_gpu_ops.c: every op of the GPU backend against the CPU reference backend.
 *
 * Each op gets the same fresh random inputs on both backends; the GPU's outputs are filled with
 * NaN before the call so that an element it forgets to write shows up. Floating-point results
 * must agree within a relative error of 1e-4 (TF32 off; error over the largest reference value);
 * results that involve no rounding differences by construction (pool forward and max-pool
 * backward, dropout masks, layout changes, copies, the accuracy count) must be identical bits.
 * Backward ops are also run with n == 0 (parameter gradients must become zeros) and with
 * dx == NULL. Needs a GPU: without one it prints SKIPPED and exits 77. */
#include "data/dataset.h"
#include "gpu_test.h"
#include "model.h"

static const double TOL = 1e-4;

/* ---- memory ---- */

static void test_memory(pair *p) {
    mgt_backend *g = &p->gpu;
    const size_t n = 1000;
    float *d = dbuf(g, n * sizeof(float));
    float *z = hf(n);
    expect_same("alloc returns zeroed memory", g, d, z, n * sizeof(float));
    float *h = hrand(n, -1, 1);
    g->ops->to_device(g, d, h, n * sizeof(float));
    expect_same("to_device/to_host round trip", g, d, h, n * sizeof(float));
    float *d2 = dnan(g, n);
    g->ops->copy(g, d2, d, n * sizeof(float));
    expect_same("copy", g, d2, h, n * sizeof(float));
    float *y = hrand(n, -1, 1), *yc = hcopy(y, n);
    float *dy = dput(g, y, n);
    g->ops->add(g, n, d, dy);
    p->cpu.ops->add(&p->cpu, n, h, yc);
    expect_same("add", g, dy, yc, n * sizeof(float));
    g->ops->zero(g, d2, n * sizeof(float));
    expect_same("zero", g, d2, z, n * sizeof(float));
    g->ops->sync(g);
    CHECK(g->ops->reserve(g, (size_t)3 << 20) == 0, "reserve(3 MiB) failed");
    CHECK(g->ops->reserve(g, 1024) == 0, "reserve of less than held failed");
    CHECK(!strcmp(g->ops->name, "gpu"), "the op table is named %s", g->ops->name);
    dfree_all();
    hfree_all();
}

/* ---- dense ---- */

static void test_dense(pair *p, int n, int in, int out, int bias) {
    mgt_backend *c = &p->cpu, *g = &p->gpu;
    char what[128];
    float *x = hrand((size_t)n * in, -1, 1), *w = hrand((size_t)out * in, -1, 1);
    float *b = bias ? hrand((size_t)out, -1, 1) : NULL;
    float *dy = hrand((size_t)n * out, -1, 1);
    float *y = hf((size_t)n * out), *dx = hf((size_t)n * in), *dw = hf((size_t)out * in);
    float *db = hf((size_t)out);
    c->ops->dense_fwd(c, n, in, out, x, w, b, y);
    c->ops->dense_bwd(c, n, in, out, x, w, dy, dx, dw, db);

    float *gx = dput(g, x, (size_t)n * in), *gw = dput(g, w, (size_t)out * in);
    float *gb = bias ? dput(g, b, (size_t)out) : NULL, *gdy = dput(g, dy, (size_t)n * out);
    float *gy = dnan(g, (size_t)n * out), *gdx = dnan(g, (size_t)n * in);
    float *gdw = dnan(g, (size_t)out * in), *gdb = dnan(g, (size_t)out);
    g->ops->dense_fwd(g, n, in, out, gx, gw, gb, gy);
    g->ops->dense_bwd(g, n, in, out, gx, gw, gdy, gdx, gdw, gdb);
    snprintf(what, sizeof what, "dense n=%d in=%d out=%d bias=%d", n, in, out, bias);
    expect_close(what, g, gy, y, (size_t)n * out, TOL);
    expect_close("dense_bwd dx", g, gdx, dx, (size_t)n * in, TOL);
    expect_close("dense_bwd dW", g, gdw, dw, (size_t)out * in, TOL);
    expect_close("dense_bwd db", g, gdb, db, (size_t)out, TOL);

    /* dx == NULL, and n == 0 (gradients overwritten with zeros) */
    float *gdw2 = dnan(g, (size_t)out * in), *gdb2 = dnan(g, (size_t)out);
    g->ops->dense_bwd(g, n, in, out, gx, gw, gdy, NULL, gdw2, gdb2);
    expect_close("dense_bwd dW (dx NULL)", g, gdw2, dw, (size_t)out * in, TOL);
    g->ops->dense_bwd(g, 0, in, out, gx, gw, gdy, NULL, gdw2, gdb2);
    expect_same("dense_bwd n=0 dW zeros", g, gdw2, hf((size_t)out * in),
                sizeof(float) * (size_t)out * in);
    expect_same("dense_bwd n=0 db zeros", g, gdb2, hf((size_t)out), sizeof(float) * (size_t)out);
    dfree_all();
    hfree_all();
}

/* ---- convolution ---- */

typedef struct conv_case {
    int n, h, w, c, oc, kh, kw, stride, same, bias;
} conv_case;

static void test_conv(pair *p, const conv_case *k) {
    mgt_backend *c = &p->cpu, *g = &p->gpu;
    mgt_conv_shape s =
        mgt_conv2d_geometry(k->n, k->h, k->w, k->c, k->oc, k->kh, k->kw, k->stride, k->same);
    char what[160];
    snprintf(what, sizeof what, "conv n=%d %dx%dx%d->%dx%dx%d k=%dx%d s=%d pad=%d,%d bias=%d", s.n,
             s.h, s.w, s.c, s.oh, s.ow, s.oc, s.kh, s.kw, s.stride, s.pad_top, s.pad_left, k->bias);
    const size_t nx = conv_nx(&s), ny = conv_ny(&s), nw = conv_nw(&s);
    CHECK(c->ops->reserve(c, c->ops->conv2d_scratch(&s)) == 0, "%s: CPU reserve", what);
    CHECK(g->ops->reserve(g, g->ops->conv2d_scratch(&s)) == 0, "%s: GPU reserve", what);
    float *x = hrand(nx, -1, 1), *w = hrand(nw, -0.5f, 0.5f);
    float *b = k->bias ? hrand((size_t)s.oc, -1, 1) : NULL, *dy = hrand(ny, -1, 1);
    float *y = hf(ny), *dx = hf(nx), *dw = hf(nw), *db = hf((size_t)s.oc);
    c->ops->conv2d_fwd(c, &s, x, w, b, y);
    c->ops->conv2d_bwd(c, &s, x, w, dy, dx, dw, db);

    float *gx = dput(g, x, nx), *gw = dput(g, w, nw), *gb = b ? dput(g, b, (size_t)s.oc) : NULL;
    float *gdy = dput(g, dy, ny), *gy = dnan(g, ny), *gdx = dnan(g, nx), *gdw = dnan(g, nw);
    float *gdb = dnan(g, (size_t)s.oc);
    g->ops->conv2d_fwd(g, &s, gx, gw, gb, gy);
    expect_close(what, g, gy, y, ny, TOL);
    float *first = dget(g, gy, ny);
    g->ops->conv2d_fwd(g, &s, gx, gw, gb, gy); /* the cached plan: the same bits again */
    expect_same("conv forward repeated (cached plan, deterministic)", g, gy, first,
                ny * sizeof(float));
    g->ops->conv2d_bwd(g, &s, gx, gw, gdy, gdx, gdw, gdb);
    expect_close("conv_bwd dx", g, gdx, dx, nx, TOL);
    expect_close("conv_bwd dW", g, gdw, dw, nw, TOL);
    expect_close("conv_bwd db", g, gdb, db, (size_t)s.oc, TOL);

    float *gdw2 = dnan(g, nw);
    g->ops->conv2d_bwd(g, &s, gx, gw, gdy, NULL, gdw2, NULL);
    expect_close("conv_bwd dW (dx NULL, db NULL)", g, gdw2, dw, nw, TOL);
    mgt_conv_shape s0 = s;
    s0.n = 0;
    float *gdb2 = dnan(g, (size_t)s.oc);
    g->ops->conv2d_bwd(g, &s0, gx, gw, gdy, NULL, gdw2, gdb2);
    expect_same("conv_bwd n=0 dW zeros", g, gdw2, hf(nw), nw * sizeof(float));
    expect_same("conv_bwd n=0 db zeros", g, gdb2, hf((size_t)s.oc), (size_t)s.oc * sizeof(float));
    dfree_all();
    hfree_all();
}

/* ---- pooling ---- */

/* same: TensorFlow's "same" padding (border windows leave out what is outside the input). */
static void test_pool(pair *p, int n, int h, int w, int c, int size, int stride, int same) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    mgt_pool_shape s = {.n = n,
                        .h = h,
                        .w = w,
                        .c = c,
                        .size = size,
                        .stride = stride,
                        .oh = (h - size) / stride + 1,
                        .ow = (w - size) / stride + 1};
    if (same) {
        const mgt_conv_shape q = mgt_conv2d_geometry(n, h, w, c, c, size, size, stride, 1);
        s.oh = q.oh, s.ow = q.ow, s.pad_top = q.pad_top, s.pad_left = q.pad_left;
    }
    const size_t nx = (size_t)n * h * w * c, ny = (size_t)n * s.oh * s.ow * c;
    char what[128];
    snprintf(what, sizeof what, "pool n=%d %dx%dx%d size %d stride %d%s", n, h, w, c, size, stride,
             same ? " same" : "");
    float *x = hrand(nx, -1, 1), *dy = hrand(ny, -1, 1);
    float *y = hf(ny), *dx = hf(nx), *ya = hf(ny), *dxa = hf(nx);
    int32_t *am = hbuf(ny * sizeof(int32_t));
    cb->ops->maxpool_fwd(cb, &s, x, y, am);
    cb->ops->maxpool_bwd(cb, &s, dy, am, dx);
    cb->ops->avgpool_fwd(cb, &s, x, ya);
    cb->ops->avgpool_bwd(cb, &s, dy, dxa);

    float *gx = dput(g, x, nx), *gdy = dput(g, dy, ny), *gy = dnan(g, ny), *gdx = dnan(g, nx);
    int32_t *gam = (int32_t *)dnan(g, ny);
    g->ops->maxpool_fwd(g, &s, gx, gy, gam);
    g->ops->maxpool_bwd(g, &s, gdy, gam, gdx);
    printf("  %s\n", what);
    expect_same("maxpool_fwd y", g, gy, y, ny * sizeof(float));
    expect_same("maxpool_fwd argmax", g, gam, am, ny * sizeof(int32_t));
    expect_same("maxpool_bwd dx", g, gdx, dx, nx * sizeof(float));
    float *gya = dnan(g, ny), *gdxa = dnan(g, nx);
    g->ops->avgpool_fwd(g, &s, gx, gya);
    g->ops->avgpool_bwd(g, &s, gdy, gdxa);
    expect_close("avgpool_fwd", g, gya, ya, ny, TOL);
    expect_close("avgpool_bwd", g, gdxa, dxa, nx, TOL);
    dfree_all();
    hfree_all();
}

/* ---- graph models: residual sums, concatenation, padding, global average pooling ---- */

static void test_graph_ops(pair *p) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    printf("  graph ops\n");
    const size_t n = 10007;
    float *a = hrand(n, -1, 1), *b = hrand(n, -1, 1), *y = hf(n);
    cb->ops->add2(cb, n, a, b, y);
    float *ga = dput(g, a, n), *gb = dput(g, b, n), *gy = dnan(g, n);
    g->ops->add2(g, n, ga, gb, gy);
    expect_same("add2 (one rounding: the same bits)", g, gy, y, n * sizeof(float));
    g->ops->add2(g, n, ga, gb, ga);
    expect_same("add2 into its input", g, ga, y, n * sizeof(float));

    /* concatenation of 3 and 5 channels into 8, and a slice back with accumulation */
    const size_t rows = 333;
    float *x0 = hrand(rows * 3, -1, 1), *x1 = hrand(rows * 5, -1, 1), *cat = hf(rows * 8);
    cb->ops->copy_cols(cb, rows, 3, x0, 3, cat, 8, 0);
    cb->ops->copy_cols(cb, rows, 5, x1, 5, cat + 3, 8, 0);
    float *gx0 = dput(g, x0, rows * 3), *gx1 = dput(g, x1, rows * 5), *gcat = dnan(g, rows * 8);
    g->ops->copy_cols(g, rows, 3, gx0, 3, gcat, 8, 0);
    g->ops->copy_cols(g, rows, 5, gx1, 5, gcat + 3, 8, 0);
    expect_same("copy_cols (concat)", g, gcat, cat, rows * 8 * sizeof(float));
    float *acc = hrand(rows * 5, -1, 1), *gacc = dput(g, acc, rows * 5);
    cb->ops->copy_cols(cb, rows, 5, cat + 3, 8, acc, 5, 1);
    g->ops->copy_cols(g, rows, 5, gcat + 3, 8, gacc, 5, 1);
    expect_same("copy_cols accumulate", g, gacc, acc, rows * 5 * sizeof(float));

    /* zero padding and its adjoint */
    const mgt_pad_shape ps = {3, 5, 7, 4, 3, 0, 1, 2};
    const size_t nx = 3 * 5 * 7 * 4, ny = 3 * (5 + 3) * (7 + 3) * 4;
    float *px = hrand(nx, -1, 1), *py = hf(ny), *pdy = hrand(ny, -1, 1), *pdx = hf(nx);
    cb->ops->pad_fwd(cb, &ps, px, py);
    cb->ops->pad_bwd(cb, &ps, pdy, pdx);
    float *gpx = dput(g, px, nx), *gpy = dnan(g, ny), *gpdy = dput(g, pdy, ny);
    float *gpdx = dnan(g, nx);
    g->ops->pad_fwd(g, &ps, gpx, gpy);
    g->ops->pad_bwd(g, &ps, gpdy, gpdx);
    expect_same("pad_fwd", g, gpy, py, ny * sizeof(float));
    expect_same("pad_bwd", g, gpdx, pdx, nx * sizeof(float));

    /* global average pooling: double sums in the CPU's order, the same bits */
    const int gn = 5, hw = 49, gc = 300;
    float *gx = hrand((size_t)gn * hw * gc, -1, 1), *gout = hf((size_t)gn * gc);
    float *gdy = hrand((size_t)gn * gc, -1, 1), *gdx = hf((size_t)gn * hw * gc);
    cb->ops->gap_fwd(cb, gn, hw, gc, gx, gout);
    cb->ops->gap_bwd(cb, gn, hw, gc, gdy, gdx);
    float *dgx = dput(g, gx, (size_t)gn * hw * gc), *dgout = dnan(g, (size_t)gn * gc);
    float *dgdy = dput(g, gdy, (size_t)gn * gc), *dgdx = dnan(g, (size_t)gn * hw * gc);
    g->ops->gap_fwd(g, gn, hw, gc, dgx, dgout);
    g->ops->gap_bwd(g, gn, hw, gc, dgdy, dgdx);
    expect_same("gap_fwd", g, dgout, gout, (size_t)gn * gc * sizeof(float));
    expect_same("gap_bwd", g, dgdx, gdx, (size_t)gn * hw * gc * sizeof(float));
    dfree_all();
    hfree_all();
}

/* ---- depthwise convolution: q = n, h, w, c, kh, kw, stride, same ---- */

static void test_dwconv(pair *p, const int *q) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    const mgt_conv_shape s =
        mgt_conv2d_geometry(q[0], q[1], q[2], q[3], q[3], q[4], q[5], q[6], q[7]);
    char what[128];
    snprintf(what, sizeof what, "depthwise n=%d %dx%dx%d k=%dx%d s=%d pad=%d,%d", s.n, s.h, s.w,
             s.c, s.kh, s.kw, s.stride, s.pad_top, s.pad_left);
    printf("  %s\n", what);
    const size_t nx = conv_nx(&s), ny = conv_ny(&s), nw = (size_t)s.c * s.kh * s.kw;
    CHECK(cb->ops->reserve(cb, cb->ops->dwconv_scratch(cb, &s)) == 0, "%s: CPU reserve", what);
    CHECK(g->ops->reserve(g, g->ops->dwconv_scratch(g, &s)) == 0, "%s: GPU reserve", what);
    float *x = hrand(nx, -1, 1), *w = hrand(nw, -1, 1), *b = hrand((size_t)s.c, -1, 1);
    float *dy = hrand(ny, -1, 1), *y = hf(ny), *dx = hf(nx), *dw = hf(nw), *db = hf((size_t)s.c);
    cb->ops->dwconv_fwd(cb, &s, x, w, b, y);
    cb->ops->dwconv_bwd(cb, &s, x, w, dy, dx, dw, db);
    float *gx = dput(g, x, nx), *gw = dput(g, w, nw), *gb = dput(g, b, (size_t)s.c);
    float *gdy = dput(g, dy, ny), *gy = dnan(g, ny), *gdx = dnan(g, nx), *gdw = dnan(g, nw);
    float *gdb = dnan(g, (size_t)s.c);
    g->ops->dwconv_fwd(g, &s, gx, gw, gb, gy);
    g->ops->dwconv_bwd(g, &s, gx, gw, gdy, gdx, gdw, gdb);
    expect_close(what, g, gy, y, ny, TOL);
    expect_close("dwconv_bwd dx", g, gdx, dx, nx, TOL);
    expect_close("dwconv_bwd dW", g, gdw, dw, nw, TOL);
    expect_close("dwconv_bwd db", g, gdb, db, (size_t)s.c, TOL);
    g->ops->dwconv_fwd(g, &s, gx, gw, NULL, gy); /* no bias */
    cb->ops->dwconv_fwd(cb, &s, x, w, NULL, y);
    expect_close("dwconv_fwd without bias", g, gy, y, ny, TOL);
    float *first = dget(g, gdw, nw);
    g->ops->dwconv_bwd(g, &s, gx, gw, gdy, NULL, gdw, NULL); /* dx, db NULL; deterministic */
    expect_same("dwconv_bwd dW again (dx NULL): the same bits", g, gdw, first, nw * sizeof(float));
    mgt_conv_shape s0 = s;
    s0.n = 0;
    g->ops->dwconv_bwd(g, &s0, gx, gw, gdy, NULL, gdw, gdb);
    expect_same("dwconv_bwd n=0 dW zeros", g, gdw, hf(nw), nw * sizeof(float));
    expect_same("dwconv_bwd n=0 db zeros", g, gdb, hf((size_t)s.c), (size_t)s.c * sizeof(float));
    dfree_all();
    hfree_all();
}

/* ---- batch normalisation: each op on the same inputs on both sides ---- */

static void test_bn(pair *p, int rows, int c) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    const size_t nx = (size_t)rows * c, nc = (size_t)c;
    printf("  batchnorm rows=%d c=%d\n", rows, c);
    float *x = hrand(nx, -2, 3), *dy = hrand(nx, -1, 1), *gamma = hrand(nc, 0.5f, 1.5f);
    float *beta = hrand(nc, -1, 1);
    float *sum = hf(nc), *sumsq = hf(nc);
    cb->ops->bn_stats(cb, rows, c, x, sum, sumsq);
    float *gx = dput(g, x, nx), *gdy = dput(g, dy, nx), *gsum = dnan(g, nc), *gsq = dnan(g, nc);
    g->ops->bn_stats(g, rows, c, gx, gsum, gsq);
    expect_close("bn_stats sum", g, gsum, sum, nc, TOL);
    expect_close("bn_stats sumsq", g, gsq, sumsq, nc, TOL);

    /* finalize from the CPU's sums on both sides, running stats updated */
    const float count = (float)rows, eps = 1e-3f, mom = 0.9f;
    float *mean = hf(nc), *invstd = hf(nc), *rm = hrand(nc, -1, 1), *rv = hrand(nc, 0.5f, 2);
    float *grm = dput(g, rm, nc), *grv = dput(g, rv, nc);
    float *gsum2 = dput(g, sum, nc), *gsq2 = dput(g, sumsq, nc);
    float *gmean = dnan(g, nc), *ginv = dnan(g, nc);
    cb->ops->bn_finalize(cb, c, count, sum, sumsq, eps, mom, mean, invstd, rm, rv);
    g->ops->bn_finalize(g, c, count, gsum2, gsq2, eps, mom, gmean, ginv, grm, grv);
    expect_close("bn_finalize mean", g, gmean, mean, nc, TOL);
    expect_close("bn_finalize invstd", g, ginv, invstd, nc, TOL);
    expect_close("bn_finalize running_mean", g, grm, rm, nc, TOL);
    expect_close("bn_finalize running_var", g, grv, rv, nc, TOL);
    float *m2 = hf(nc), *i2 = hf(nc), *gm2 = dnan(g, nc), *gi2 = dnan(g, nc);
    cb->ops->bn_running(cb, c, eps, rm, rv, m2, i2);
    g->ops->bn_running(g, c, eps, grm, grv, gm2, gi2);
    expect_close("bn_running mean", g, gm2, m2, nc, TOL);
    expect_close("bn_running invstd", g, gi2, i2, nc, TOL);

    /* apply and backward with the CPU's statistics */
    float *gm = dput(g, mean, nc), *gi = dput(g, invstd, nc), *gg = dput(g, gamma, nc);
    float *gbeta = dput(g, beta, nc);
    float *y = hf(nx), *gy = dnan(g, nx);
    cb->ops->bn_apply(cb, rows, c, x, mean, invstd, gamma, beta, y);
    g->ops->bn_apply(g, rows, c, gx, gm, gi, gg, gbeta, gy);
    expect_close("bn_apply", g, gy, y, nx, TOL);
    cb->ops->bn_apply(cb, rows, c, x, mean, invstd, NULL, NULL, y);
    g->ops->bn_apply(g, rows, c, gx, gm, gi, NULL, NULL, gy);
    expect_close("bn_apply (no gamma, beta)", g, gy, y, nx, TOL);

    float *dgamma = hf(nc), *dbeta = hf(nc), *gdg = dnan(g, nc), *gdb = dnan(g, nc);
    cb->ops->bn_bwd_reduce(cb, rows, c, x, dy, mean, invstd, dgamma, dbeta);
    g->ops->bn_bwd_reduce(g, rows, c, gx, gdy, gm, gi, gdg, gdb);
    expect_close("bn_bwd_reduce dgamma", g, gdg, dgamma, nc, TOL);
    expect_close("bn_bwd_reduce dbeta", g, gdb, dbeta, nc, TOL);
    float *gdb3 = dnan(g, nc);
    g->ops->bn_bwd_reduce(g, rows, c, gx, gdy, gm, gi, NULL, gdb3);
    expect_close("bn_bwd_reduce dbeta (dgamma NULL)", g, gdb3, dbeta, nc, TOL);

    float *dx = hf(nx), *gdx = dnan(g, nx), *gdg2 = dput(g, dgamma, nc);
    float *gdb2 = dput(g, dbeta, nc);
    cb->ops->bn_bwd_apply(cb, rows, c, count, x, dy, mean, invstd, gamma, dgamma, dbeta, dx);
    g->ops->bn_bwd_apply(g, rows, c, count, gx, gdy, gm, gi, gg, gdg2, gdb2, gdx);
    expect_close("bn_bwd_apply", g, gdx, dx, nx, TOL);

    /* rows == 0: sums and parameter gradients are zeros */
    float *gz1 = dnan(g, nc), *gz2 = dnan(g, nc);
    g->ops->bn_stats(g, 0, c, gx, gz1, gz2);
    expect_same("bn_stats rows=0", g, gz1, hf(nc), nc * sizeof(float));
    g->ops->bn_bwd_reduce(g, 0, c, gx, gdy, gm, gi, gz1, gz2);
    expect_same("bn_bwd_reduce rows=0 dgamma", g, gz1, hf(nc), nc * sizeof(float));
    expect_same("bn_bwd_reduce rows=0 dbeta", g, gz2, hf(nc), nc * sizeof(float));
    /* count == 0 in finalize: neutral statistics */
    float *gm3 = dnan(g, nc), *gi3 = dnan(g, nc), *m3 = hf(nc), *i3 = hf(nc);
    cb->ops->bn_finalize(cb, c, 0.0f, sum, sumsq, eps, mom, m3, i3, NULL, NULL);
    g->ops->bn_finalize(g, c, 0.0f, gsum2, gsq2, eps, mom, gm3, gi3, NULL, NULL);
    expect_close("bn_finalize count=0 invstd", g, gi3, i3, nc, TOL);
    dfree_all();
    hfree_all();
}

/* ---- dropout: the masks must be the CPU's, bit for bit ---- */

static void test_dropout(pair *p, int n, int row, float rate, uint64_t first) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    const size_t nx = (size_t)n * row;
    const uint64_t key = mgt_key3(42, 0x44524f50ULL + 3, 17);
    float *x = hrand(nx, -1, 1), *xc = hcopy(x, nx), *dc = hcopy(x, nx);
    float *gx = dput(g, x, nx), *gd = dput(g, x, nx);
    cb->ops->dropout_fwd(cb, n, row, rate, key, first, xc);
    cb->ops->dropout_bwd(cb, n, row, rate, key, first, dc);
    g->ops->dropout_fwd(g, n, row, rate, key, first, gx);
    g->ops->dropout_bwd(g, n, row, rate, key, first, gd);
    char what[96];
    snprintf(what, sizeof what, "dropout fwd n=%d row=%d rate=%g first=%llu", n, row, rate,
             (unsigned long long)first);
    expect_same(what, g, gx, xc, nx * sizeof(float));
    expect_same("dropout bwd (same mask)", g, gd, dc, nx * sizeof(float));
    size_t zeros = 0;
    for (size_t i = 0; i < nx; i++)
        zeros += xc[i] == 0.0f;
    if (rate > 0 && nx > 1000)
        CHECK(fabs((double)zeros / nx - rate) < 0.05, "dropout dropped %zu of %zu at rate %g",
              zeros, nx, rate);
    dfree_all();
    hfree_all();
}

/* ---- activations ---- */

static void test_act(pair *p, mgt_act act, int n, int row) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    const size_t nx = (size_t)n * row;
    float *x = hrand(nx, -4, 4), *dy = hrand(nx, -1, 1);
    float *y = hcopy(x, nx), *gyy = dput(g, x, nx);
    cb->ops->act_fwd(cb, act, n, row, y);
    g->ops->act_fwd(g, act, n, row, gyy);
    char what[64];
    snprintf(what, sizeof what, "act %d fwd n=%d row=%d", (int)act, n, row);
    expect_close(what, g, gyy, y, nx, TOL);
    float *d = hcopy(dy, nx), *gy = dput(g, y, nx), *gd = dput(g, dy, nx);
    cb->ops->act_bwd(cb, act, n, row, y, d);
    g->ops->act_bwd(g, act, n, row, gy, gd);
    snprintf(what, sizeof what, "act %d bwd n=%d row=%d", (int)act, n, row);
    expect_close(what, g, gd, d, nx, TOL);
    dfree_all();
    hfree_all();
}

/* ---- softmax + cross-entropy ---- */

static void test_xent(pair *p, int n, int k, int dense, int alias, int with_d) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    const size_t nl = (size_t)n * k;
    float *l = hrand(nl, -6, 6), *t = NULL;
    int32_t *lab = hbuf((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        lab[i] = (int32_t)(mgt_rand64(5, (uint64_t)i) % (uint64_t)k);
    if (n > 3) { /* out-of-range labels count as nothing */
        lab[1] = -1;
        lab[3] = k;
    }
    if (dense) {
        t = hrand(nl, 0, 1);
        for (int i = 0; i < n; i++)
            t[(size_t)i * k + (size_t)lab[i < 4 ? 0 : i]] += 2.0f; /* a clear argmax per row */
    }
    const float scale = 0.5f;
    float sums0[2] = {1.5f, 2.0f};
    float *lc = hcopy(l, nl), *pc = alias ? lc : hf(nl), *dc = with_d ? hf(nl) : NULL;
    float sums[2] = {sums0[0], sums0[1]};
    if (dense)
        cb->ops->xent_dense(cb, n, k, lc, t, pc, dc, scale, sums);
    else
        cb->ops->xent_sparse(cb, n, k, lc, lab, pc, dc, scale, sums);

    float *gl = dput(g, l, nl), *gp = alias ? gl : dnan(g, nl), *gd = with_d ? dnan(g, nl) : NULL;
    float *gs = dput(g, sums0, 2);
    if (dense) {
        float *gt = dput(g, t, nl);
        g->ops->xent_dense(g, n, k, gl, gt, gp, gd, scale, gs);
    } else {
        int32_t *glab = dbuf(g, (size_t)n * sizeof(int32_t));
        g->ops->to_device(g, glab, lab, (size_t)n * sizeof(int32_t));
        g->ops->xent_sparse(g, n, k, gl, glab, gp, gd, scale, gs);
    }
    char what[96];
    snprintf(what, sizeof what, "xent %s n=%d k=%d alias=%d probs", dense ? "dense" : "sparse", n,
             k, alias);
    expect_close(what, g, gp, pc, nl, TOL);
    if (with_d)
        expect_close("xent dlogits", g, gd, dc, nl, TOL);
    float *hs = dget(g, gs, 2);
    CHECK(fabs(hs[0] - sums[0]) <= TOL * fabs(sums[0]), "xent loss sum %.7g, CPU %.7g", hs[0],
          sums[0]);
    CHECK(hs[1] == sums[1], "xent correct count %g, CPU %g", hs[1], sums[1]);
    dfree_all();
    hfree_all();
}

/* ---- layout changes ---- */

static void test_layout(pair *p, int n, int h, int w, int c) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    const size_t nx = (size_t)n * h * w * c;
    float *x = hrand(nx, -1, 1), *y = hf(nx), *z = hf(nx);
    cb->ops->nhwc_to_chw(cb, n, h, w, c, x, y);
    cb->ops->chw_to_nhwc(cb, n, h, w, c, x, z);
    float *gx = dput(g, x, nx), *gy = dnan(g, nx), *gz = dnan(g, nx);
    g->ops->nhwc_to_chw(g, n, h, w, c, gx, gy);
    g->ops->chw_to_nhwc(g, n, h, w, c, gx, gz);
    char what[80];
    snprintf(what, sizeof what, "nhwc_to_chw n=%d %dx%dx%d", n, h, w, c);
    expect_same(what, g, gy, y, nx * sizeof(float));
    expect_same("chw_to_nhwc", g, gz, z, nx * sizeof(float));
    dfree_all();
    hfree_all();
}

/* ---- optimizers ---- */

/* One step of optimizer `kind` (0 to 4) on backend be; returns its name. */
static const char *optim_step(mgt_backend *be, int kind, size_t count, float *w, const float *gr,
                              float *a, float *b) {
    mgt_opt_hyper h = {.s = {.weight_decay = 1e-3f}, .lr = 0.1f, .scale = 1.0f / 64};
    float *slots[MGT_OPT_MAX_SLOTS] = {kind == 0 ? NULL : a, NULL}; /* plain SGD: no velocity */
    mgt_opt_kind k = MGT_OPT_SGD;
    const char *name = "sgd";
    switch (kind) {
    case 0:
        break;
    case 1:
        h.s.momentum = 0.9f;
        name = "sgd momentum";
        break;
    case 2:
        h.s.momentum = 0.9f;
        h.s.nesterov = 1;
        name = "sgd nesterov";
        break;
    case 3:
        h.lr = 1e-3f;
        h.s.rho = 0.9f;
        h.s.epsilon = 1e-7f;
        k = MGT_OPT_RMSPROP;
        name = "rmsprop";
        break;
    default:
        h.lr = 1e-3f;
        h.s.beta1 = 0.9f;
        h.s.beta2 = 0.999f;
        h.s.epsilon = 1e-7f;
        slots[1] = b;
        k = MGT_OPT_ADAM;
        name = "adam";
    }
    be->ops->optim_step(be, k, count, w, gr, slots, &h);
    return name;
}

static void test_optim(pair *p, size_t count) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    float *w0 = hrand(count, -1, 1), *gr = hrand(count, -50, 50), *s0 = hrand(count, 0, 0.1f);
    float *s1 = hrand(count, 0, 0.1f);
    for (int kind = 0; kind < 5; kind++) {
        float *w = hcopy(w0, count), *a = hcopy(s0, count), *b = hcopy(s1, count);
        float *gw = dput(g, w0, count), *gg = dput(g, gr, count), *ga = dput(g, s0, count);
        float *gb = dput(g, s1, count);
        const char *name = optim_step(cb, kind, count, w, gr, a, b);
        optim_step(g, kind, count, gw, gg, ga, gb);
        char what[64];
        snprintf(what, sizeof what, "%s weights (%zu)", name, count);
        expect_close(what, g, gw, w, count, TOL);
        snprintf(what, sizeof what, "%s first slot", name);
        expect_close(what, g, ga, a, count, TOL);
        if (kind == 4)
            expect_close("adam second slot", g, gb, b, count, TOL);
        dfree_all();
    }
    hfree_all();
}

/* ---- batches made on the device (synthetic, or gathered from a byte dataset kept there):
 * identical bits to mgt_dataset_gather and the trainer's one-hot targets ---- */

/* A batch made on the device: its samples x, labels and one-hot targets, NaN/garbage-filled. */
typedef struct dev_batch {
    int n, classes;
    size_t elems;
    int64_t *ids; /* device, copied from the host's */
    float *x, *t;
    int32_t *l;
} dev_batch;

static dev_batch dev_batch_new(mgt_backend *g, const int64_t *ids, int n, size_t elems,
                               int classes) {
    dev_batch d = {n, classes, elems, dbuf(g, sizeof(int64_t) * (size_t)n),
                   dnan(g, (size_t)n * elems), dnan(g, (size_t)n * classes),
                   dbuf(g, sizeof(int32_t) * (size_t)n)};
    g->ops->to_device(g, d.ids, ids, sizeof(int64_t) * (size_t)n);
    return d;
}

/* Compares a device batch with the host's gather of the same rows of ds. */
static void expect_batch(const char *what, mgt_backend *g, const dev_batch *d,
                         const mgt_dataset *ds, const int64_t *ids) {
    size_t n = (size_t)d->n, k = (size_t)d->classes;
    float *x = hf(n * d->elems), *t = hf(n * k);
    int32_t *l = hbuf(sizeof(int32_t) * n);
    mgt_dataset_gather(ds, ids, d->n, x, l);
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < k; c++)
            t[i * k + c] = (int32_t)c == l[i] ? 1.0f : 0.0f;
    char name[96];
    snprintf(name, sizeof name, "%s: samples", what);
    expect_same(name, g, d->x, x, sizeof(float) * n * d->elems);
    snprintf(name, sizeof name, "%s: labels", what);
    expect_same(name, g, d->l, l, sizeof(int32_t) * n);
    snprintf(name, sizeof name, "%s: one-hot targets", what);
    expect_same(name, g, d->t, t, sizeof(float) * n * k);
    dfree_all();
    hfree_all();
}

static void test_synthetic(pair *p, int n, int h, int w, int c, int classes, int64_t first) {
    mgt_backend *g = &p->gpu;
    mgt_dataset ds;
    mgt_dataset_synthetic(&ds, 100000, h, w, c, classes, 42, 1);
    mgt_dataset view = mgt_dataset_slice(&ds, first, 50000);
    int64_t *ids = hbuf(sizeof(int64_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        ids[i] = (int64_t)((i * 7919) % 50000);
    dev_batch d = dev_batch_new(g, ids, n, (size_t)h * w * c, classes);
    uint64_t pk, tk;
    mgt_dataset_synthetic_keys(&view, &pk, &tk);
    g->ops->synthetic(g, n, (int64_t)d.elems, classes, pk, tk, view.first, d.ids, d.x, d.l, d.t);
    printf("  synthetic n=%d %dx%dx%d, %d classes\n", n, h, w, c, classes);
    expect_batch("synthetic", g, &d, &view, ids);
}

static void test_gather_u8(pair *p, int n, int h, int w, int c, int classes) {
    mgt_backend *g = &p->gpu;
    const int64_t rows = 300;
    size_t elems = (size_t)h * w * c;
    mgt_dataset ds = {.n = rows, .h = h, .w = w, .c = c, .classes = classes};
    ds.pixels = hbuf(elems * (size_t)rows);
    ds.labels = hbuf((size_t)rows);
    for (size_t i = 0; i < elems * (size_t)rows; i++)
        ds.pixels[i] = (uint8_t)(mgt_rand64(OPCHECK_KEY, i) & 255);
    for (int64_t i = 0; i < rows; i++)
        ds.labels[i] = (uint8_t)(mgt_rand64(OPCHECK_KEY + 1, (uint64_t)i) % (uint64_t)classes);
    int64_t *ids = hbuf(sizeof(int64_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        ids[i] = (int64_t)(mgt_rand64(OPCHECK_KEY + 2, (uint64_t)i) % (uint64_t)rows);
    dev_batch d = dev_batch_new(g, ids, n, elems, classes);
    uint8_t *gp = dbuf(g, elems * (size_t)rows), *glab = dbuf(g, (size_t)rows);
    g->ops->to_device(g, gp, ds.pixels, elems * (size_t)rows);
    g->ops->to_device(g, glab, ds.labels, (size_t)rows);
    g->ops->gather_u8(g, n, (int64_t)elems, classes, gp, glab, d.ids, d.x, d.l, d.t);
    printf("  gather_u8 n=%d %dx%dx%d, %d classes\n", n, h, w, c, classes);
    expect_batch("gathered", g, &d, &ds, ids);
}

int main(void) {
    require_gpu();
    pair p;
    pair_init(&p, 0);

    test_memory(&p);

    test_dense(&p, 37, 53, 29, 1);
    test_dense(&p, 256, 784, 256, 1);
    test_dense(&p, 5, 300, 10, 0);
    test_dense(&p, 1, 1, 1, 1);

    const conv_case convs[] = {
        {4, 8, 8, 3, 5, 3, 3, 1, 1, 1},      /* "same", symmetric: cuDNN pads */
        {3, 9, 7, 4, 6, 3, 3, 2, 1, 1},      /* stride 2 "same", symmetric */
        {2, 8, 8, 3, 4, 3, 3, 2, 1, 1},      /* stride 2 "same", asymmetric: explicit padding */
        {2, 6, 6, 2, 3, 2, 2, 1, 1, 0},      /* even kernel "same": explicit padding, no bias */
        {2, 6, 5, 3, 2, 3, 2, 1, 1, 1},      /* 3x2 kernel "same" */
        {2, 10, 10, 2, 3, 5, 5, 2, 0, 1},    /* 5x5 stride 2 valid */
        {3, 5, 5, 8, 4, 1, 1, 1, 0, 0},      /* 1x1: no filter transposes */
        {2, 7, 7, 1, 4, 3, 3, 1, 0, 1},      /* one input channel: no filter transposes */
        {16, 28, 28, 16, 32, 3, 3, 1, 1, 1}, /* a realistic layer */
    };
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++)
        test_conv(&p, &convs[i]);

    test_pool(&p, 3, 8, 8, 5, 2, 2, 0);
    test_pool(&p, 2, 7, 7, 3, 3, 2, 0); /* overlapping windows */
    test_pool(&p, 2, 6, 6, 4, 3, 1, 0);
    test_pool(&p, 2, 8, 8, 3, 3, 2, 1); /* same: pads the bottom/right only */
    test_pool(&p, 2, 7, 6, 5, 3, 2, 1); /* same: pads both sides */
    test_pool(&p, 1, 6, 6, 4, 3, 1, 1);

    test_graph_ops(&p);
    const int dws[][8] = {{2, 9, 9, 17, 3, 3, 2, 1},
                          {3, 7, 6, 5, 3, 3, 1, 0},
                          {1, 8, 8, 64, 3, 3, 2, 1},
                          {2, 5, 8, 3, 5, 3, 1, 1},
                          {4, 19, 19, 40, 3, 3, 1, 1}};
    for (size_t i = 0; i < sizeof dws / sizeof dws[0]; i++)
        test_dwconv(&p, dws[i]);

    test_bn(&p, 1000, 7);
    test_bn(&p, 5, 300);
    test_bn(&p, 50000, 32);

    test_dropout(&p, 13, 77, 0.3f, 1234567);
    test_dropout(&p, 64, 1000, 0.5f, (uint64_t)1 << 40);
    test_dropout(&p, 3, 10, 0.0f, 0);

    const mgt_act acts[] = {MGT_ACT_RELU, MGT_ACT_SIGMOID, MGT_ACT_TANH, MGT_ACT_SOFTMAX};
    for (int i = 0; i < 4; i++) {
        test_act(&p, acts[i], 17, 37);
        test_act(&p, acts[i], 3, 1000);
    }

    test_xent(&p, 50, 10, 0, 0, 1);
    test_xent(&p, 50, 10, 0, 1, 1);  /* probs alias the logits */
    test_xent(&p, 7, 1000, 0, 0, 1); /* several values per lane */
    test_xent(&p, 20, 10, 0, 0, 0);  /* no dlogits (evaluation) */
    test_xent(&p, 50, 10, 1, 0, 1);
    test_xent(&p, 9, 333, 1, 1, 1);

    test_layout(&p, 3, 5, 7, 9);
    test_layout(&p, 2, 13, 11, 40);

    test_optim(&p, 10007);

    test_synthetic(&p, 64, 28, 28, 1, 10, 0);
    test_synthetic(&p, 5, 13, 11, 3, 37, 12345); /* several class passes, a partial last draw */
    test_gather_u8(&p, 64, 28, 28, 1, 10);
    test_gather_u8(&p, 7, 5, 3, 2, 3);

    pair_free(&p);
    return finish("test_gpu_ops");
}
