/* test_winograd.c: the CPU backend's Winograd convolution (src/cpu/cpu_winograd.c) against a
 * naive reference in double, and the op table's use of it (src/cpu/cpu_conv.c).
 *
 * What is checked:
 *  - F(2x2,3x3) and F(4x4,3x3), called directly, for the forward pass (with and without bias),
 *    backward data and backward filter, on shapes with odd and even sizes, valid, same and
 *    asymmetric padding, outputs smaller than one tile, channel counts that are not multiples
 *    of the vector width or of the transform's channel block, n = 1, n >= 2 and n = 0; inputs
 *    like a network's (ReLU outputs, Glorot weights) and signed ones; every element within its
 *    own rounding bound (opcheck.h; the Winograd bounds below), derived from the algorithm and
 *    the data, so the test means the same on every CPU and BLAS kernel;
 *  - chunking and threads: the same pass run with scratch for its largest chunks, for a few
 *    tiles (chunks that straddle samples) and for one tile, on 1 to 4 threads, stays within the
 *    bound, is bit for bit the same across thread counts, and for the forward and
 *    backward-data passes across chunkings too; too little scratch makes the pass decline
 *    (return -1) without writing anything;
 *  - the GEMM kernel of the passes, every variant this CPU runs (base, x86-64-v3, x86-64-v4),
 *    against a double reference within gamma(K + 1) of each element's absolute sum, for both
 *    operand layouts the passes use, overwriting and accumulating, writing nothing outside its
 *    block; the x86-64-v3 and -v4 variants bit for bit alike;
 *  - the op table: 3x3 stride-1 layers go through Winograd (bit-identical to a direct call
 *    with the same scratch), F(2x2) or F(4x4) as chosen, dW/db are overwritten, dx may be
 *    NULL, n == 0 writes zeros, the backend's thread count changes no bit, and too little
 *    reserved scratch falls back to im2col or the direct loop with the same result;
 *  - conv2d_scratch stays bounded (64 MB) and covers Winograd's need, for the seed ConvNet's
 *    layers at batch 128 and for layers too wide for F(4x4) (F(2x2), then im2col).
 * Finite-difference gradient checks of Winograd layers are in test_ops.c (test_conv_grads).
 * Each failing check prints its numbers; main returns non-zero if any check failed. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_internal.h"
#include "util.h"

#define OPCHECK_KEY 0x3a3a5eedULL
#include "convref.h"
#include "opcheck.h"

/* max |a - ref| / max |ref| (NaN anywhere gives +inf; all-zero ref: the absolute error). */
static double rel_err_d(const float *a, const double *ref, size_t n) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        const double d = fabs((double)a[i] - ref[i]);
        err = d > err ? d : err;
        scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
    }
    return err / (scale > 1e-30 ? scale : 1.0);
}

static int all_nan(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isnan(a[i]))
            return 0;
    return 1;
}

/* The passes' worker lanes, as the CPU backend starts them, one set per lane count (made once,
 * ended at exit). */
enum { LANES_MAX_TEST = 64 };
static mgt_cpu_lanes *g_lanes[LANES_MAX_TEST + 1];

static mgt_cpu_lanes *lanes_of(int n) {
    n = n < 1 ? 1 : n > LANES_MAX_TEST ? LANES_MAX_TEST : n;
    if (!g_lanes[n] && !(g_lanes[n] = mgt_cpu_lanes_create(n))) {
        fprintf(stderr, "test_winograd: cannot start %d lanes\n", n);
        exit(2);
    }
    return g_lanes[n];
}

/* ---- shapes and the reference ---- */

typedef struct {
    int n, h, w, c, oc, pt, pb, pl, pr;
} wcfg;

/* 3x3, stride 1 */
static mgt_conv_shape shape_of(const wcfg *k) {
    return opcheck_conv_shape(k->n, k->h, k->w, k->c, k->oc, 3, 3, 1, k->pt, k->pb, k->pl, k->pr);
}

/* Tensors of one test case: inputs, and the exact results with their rounding bounds
 * (convref.h). */
typedef struct {
    mgt_conv_shape s;
    float *x, *w, *b, *dy;
    conv_ref r;
} wcase;

/* relu_like: x in [0, 1] as after a ReLU; otherwise in [-1, 1]. Glorot-uniform weights. */
static wcase make_case(const wcfg *k, int relu_like) {
    wcase t = {.s = shape_of(k)};
    const mgt_conv_shape *s = &t.s;
    const size_t nx = conv_nx(s), nw = conv_nw(s), ny = conv_ny(s);
    t.x = fbuf(nx), t.w = fbuf(nw), t.b = fbuf((size_t)s->oc), t.dy = fbuf(ny);
    fill(t.x, nx, relu_like ? 0.0f : -1.0f, 1.0f);
    const float lim = sqrtf(6.0f / (9.0f * (float)(s->c + s->oc)));
    fill(t.w, nw, -lim, lim);
    fill(t.b, (size_t)s->oc, -0.1f, 0.1f);
    fill(t.dy, ny, -1.0f, 1.0f);
    t.r = conv_ref_make(s, t.x, t.w, t.b, t.dy);
    return t;
}

/* How far a Winograd F(m) result is from the exact one, in units of its bound (<= 1 passes). */
static double wino_ratio_y(const wcase *t, int m, const float *y, int with_bias) {
    return conv_ratio(&t->r, m, with_bias ? CONV_Y : CONV_Y_NOB, y);
}
static double wino_ratio_dx(const wcase *t, int m, const float *dx) {
    return conv_ratio(&t->r, m, CONV_DX, dx);
}
static double wino_ratio_dw(const wcase *t, int m, const float *dw) {
    return conv_ratio(&t->r, m, CONV_DW, dw);
}

static void shape_name(char *buf, size_t len, const wcfg *k) {
    snprintf(buf, len, "n%d %dx%dx%d oc%d pad(%d,%d,%d,%d)", k->n, k->h, k->w, k->c, k->oc, k->pt,
             k->pb, k->pl, k->pr);
}

/* ---- direct calls: accuracy ---- */

static void test_direct(void) {
    static const wcfg cfgs[] = {
        /* n  h   w   c  oc  pt pb pl pr */
        {2, 7, 6, 3, 4, 0, 0, 0, 0},     /* valid, odd x even, tiny channels */
        {3, 6, 7, 5, 2, 1, 1, 1, 1},     /* same */
        {1, 9, 11, 19, 21, 1, 1, 1, 1},  /* n = 1, channels not multiples of 8 */
        {2, 10, 8, 67, 13, 0, 0, 0, 0},  /* c crosses the 64-channel transform block */
        {2, 8, 9, 13, 70, 1, 1, 1, 1},   /* oc crosses it */
        {2, 5, 5, 4, 3, 0, 2, 2, 0},     /* asymmetric padding: bottom and left only */
        {2, 3, 4, 6, 5, 0, 0, 0, 0},     /* 1 x 2 output: less than one tile */
        {2, 14, 13, 32, 40, 0, 0, 0, 0}, /* the seed's conv2 in miniature */
        {2, 12, 11, 72, 36, 0, 0, 0, 0}, /* and its conv3 */
    };
    double worst[2][3] = {{0}}, ratio[2][3] = {{0}};
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++)
        for (int relu_like = 0; relu_like < 2; relu_like++) {
            const wcfg *k = &cfgs[ci];
            wcase t = make_case(k, relu_like);
            const mgt_conv_shape *s = &t.s;
            char name[96];
            shape_name(name, sizeof name, k);
            const size_t nx = conv_nx(s), nw = conv_nw(s), ny = conv_ny(s);
            float *y = fbuf(ny), *dx = fbuf(nx), *dw = fbuf(nw);
            for (int m = 2; m <= 4; m += 2) {
                const size_t bytes = mgt_cpu_wino_scratch(s, m);
                const int lanes = 1 + (int)(ci % 3); /* 1, 2 or 3 threads */
                float *scr = tmp_alloc(bytes, 1);
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                    poison(y, ny);
                    const int rc = mgt_cpu_wino_fwd(scr, bytes, lanes_of(lanes), m, s, t.x, t.w,
                                                    with_bias ? t.b : NULL, y);
                    const double e = rel_err_d(y, with_bias ? t.r.y : t.r.y_nob, ny);
                    const double r = wino_ratio_y(&t, m, y, with_bias);
                    CHECK(rc == 0 && r <= 1.0,
                          "F(%d) fwd %s bias %d x%s: rc %d, error %.3g of its bound (rel %.3g)", m,
                          name, with_bias, relu_like ? ">=0" : "+-", rc, r, e);
                    worst[m / 4][0] = e > worst[m / 4][0] ? e : worst[m / 4][0];
                    ratio[m / 4][0] = r > ratio[m / 4][0] ? r : ratio[m / 4][0];
                }
                poison(dx, nx);
                int rc = mgt_cpu_wino_bwd_data(scr, bytes, lanes_of(lanes), m, s, t.w, t.dy, dx);
                double e = rel_err_d(dx, t.r.dx, nx), r = wino_ratio_dx(&t, m, dx);
                CHECK(rc == 0 && r <= 1.0,
                      "F(%d) bwd data %s: rc %d, error %.3g of its bound "
                      "(rel %.3g)",
                      m, name, rc, r, e);
                worst[m / 4][1] = e > worst[m / 4][1] ? e : worst[m / 4][1];
                ratio[m / 4][1] = r > ratio[m / 4][1] ? r : ratio[m / 4][1];
                poison(dw, nw);
                rc = mgt_cpu_wino_bwd_filter(scr, bytes, lanes_of(lanes), m, s, t.x, t.dy, dw);
                e = rel_err_d(dw, t.r.dw, nw);
                r = wino_ratio_dw(&t, m, dw);
                CHECK(rc == 0 && r <= 1.0,
                      "F(%d) bwd filter %s: rc %d, error %.3g of its bound "
                      "(rel %.3g)",
                      m, name, rc, r, e);
                worst[m / 4][2] = e > worst[m / 4][2] ? e : worst[m / 4][2];
                ratio[m / 4][2] = r > ratio[m / 4][2] ? r : ratio[m / 4][2];
            }
            tmp_free_all();
        }
    printf("test_winograd: worst rel err vs double: F(2x2) fwd %.2g dx %.2g dW %.2g; "
           "F(4x4) fwd %.2g dx %.2g dW %.2g\n",
           worst[0][0], worst[0][1], worst[0][2], worst[1][0], worst[1][1], worst[1][2]);
    printf("test_winograd: worst error as a fraction of its rounding bound: F(2x2) fwd %.2g dx "
           "%.2g dW %.2g; F(4x4) fwd %.2g dx %.2g dW %.2g\n",
           ratio[0][0], ratio[0][1], ratio[0][2], ratio[1][0], ratio[1][1], ratio[1][2]);

    /* n == 0: nothing to write for y and dx, zeros for dW */
    {
        const wcfg k = {0, 6, 6, 8, 8, 1, 1, 1, 1};
        const mgt_conv_shape s = shape_of(&k);
        float dummy[1] = {0}, *dw = fbuf(conv_nw(&s));
        for (int m = 2; m <= 4; m += 2) {
            const size_t bytes = mgt_cpu_wino_scratch(&s, m);
            float *scr = tmp_alloc(bytes, 1);
            poison(dw, conv_nw(&s));
            CHECK(
                mgt_cpu_wino_fwd(scr, bytes, lanes_of(2), m, &s, dummy, dummy, dummy, dummy) == 0 &&
                    mgt_cpu_wino_bwd_data(scr, bytes, lanes_of(2), m, &s, dummy, dummy, dummy) ==
                        0 &&
                    mgt_cpu_wino_bwd_filter(scr, bytes, lanes_of(2), m, &s, dummy, dummy, dw) == 0,
                "F(%d) n = 0 should succeed", m);
            CHECK(all_zero(dw, conv_nw(&s)), "F(%d) n = 0: dW not all zero", m);
        }
        tmp_free_all();
    }
    /* shapes Winograd does not do are declined */
    {
        mgt_conv_shape s = shape_of(&(wcfg){1, 6, 6, 4, 4, 0, 0, 0, 0});
        CHECK(mgt_cpu_wino_fits(&s), "3x3 stride 1 should fit");
        s.stride = 2;
        CHECK(!mgt_cpu_wino_fits(&s) && mgt_cpu_wino_scratch(&s, 2) == 0, "stride 2 should not");
        s.stride = 1;
        s.kw = 5;
        CHECK(!mgt_cpu_wino_fits(&s), "3x5 should not fit");
    }
}

/* ---- direct calls: chunking and threads ---- */

static void test_chunking(void) {
    /* 8 samples of 24 x 23 outputs (same padding): 288 tiles for F(4), 1152 for F(2), enough
     * work for Winograd to use up to 4 threads */
    const wcfg k = {8, 24, 23, 48, 40, 1, 1, 1, 1};
    wcase t = make_case(&k, 1);
    const mgt_conv_shape *s = &t.s;
    const size_t nx = conv_nx(s), nw = conv_nw(s), ny = conv_ny(s);
    for (int m = 2; m <= 4; m += 2) {
        /* the largest chunks Winograd takes, chunks of 7 tiles (straddling samples) on 1, 2
         * and 3 threads, chunks of 1 tile on 1 and 4 threads */
        const size_t dx_tiles = (size_t)s->n * ((s->h + m - 1) / m) * ((s->w + m - 1) / m);
        enum { NV = 6 };
        const size_t tiles[NV] = {dx_tiles, 7, 7, 7, 1, 1};
        const int lanes[NV] = {1, 1, 2, 3, 1, 4};
        float *y[NV], *dx[NV], *dw[NV];
        for (int v = 0; v < NV; v++) {
            const size_t bytes = mgt_cpu_wino_scratch_tiles(m, s->c, s->oc, tiles[v], lanes[v]);
            float *scr = tmp_alloc(bytes, 1);
            y[v] = fbuf(ny), dx[v] = fbuf(nx), dw[v] = fbuf(nw);
            poison(y[v], ny);
            poison(dx[v], nx);
            poison(dw[v], nw);
            const int rc =
                mgt_cpu_wino_fwd(scr, bytes, lanes_of(lanes[v]), m, s, t.x, t.w, t.b, y[v]) |
                mgt_cpu_wino_bwd_data(scr, bytes, lanes_of(lanes[v]), m, s, t.w, t.dy, dx[v]) |
                mgt_cpu_wino_bwd_filter(scr, bytes, lanes_of(lanes[v]), m, s, t.x, t.dy, dw[v]);
            CHECK(rc == 0, "F(%d) with scratch for %zu tiles x %d threads: rc %d", m, tiles[v],
                  lanes[v], rc);
        }
        /* Every chunking is within the algorithm's bound of the exact result. */
        for (int v = 0; v < NV; v++) {
            const double ry = wino_ratio_y(&t, m, y[v], 1), rx = wino_ratio_dx(&t, m, dx[v]),
                         rw = wino_ratio_dw(&t, m, dw[v]);
            CHECK(ry <= 1.0 && rx <= 1.0 && rw <= 1.0,
                  "F(%d) chunks of %zu tiles on %d threads: error y %.3g dx %.3g dW %.3g of the "
                  "bound",
                  m, tiles[v], lanes[v], ry, rx, rw);
        }
        /* The GEMM kernel sums each element in the same order whatever the chunk, so forward
         * and backward data do not change a bit with the chunking; backward filter sums its
         * tiles in two halves, which meet where the chunking puts them. */
        for (int v = 1; v < NV; v++)
            CHECK(memcmp(y[v], y[0], ny * sizeof(float)) == 0 &&
                      memcmp(dx[v], dx[0], nx * sizeof(float)) == 0,
                  "F(%d) chunks of %zu tiles on %d threads: y or dx differs from chunks of %zu", m,
                  tiles[v], lanes[v], tiles[0]);
        /* the thread count does not change a bit of any result, whatever the chunking */
        for (int v = 2; v < NV; v++) {
            const int u = v < 4 ? 1 : 4;
            if (v == u)
                continue;
            CHECK(memcmp(y[v], y[u], ny * sizeof(float)) == 0 &&
                      memcmp(dx[v], dx[u], nx * sizeof(float)) == 0 &&
                      memcmp(dw[v], dw[u], nw * sizeof(float)) == 0,
                  "F(%d) chunks of %zu tiles: %d threads differ from 1 thread", m, tiles[v],
                  lanes[v]);
        }
        /* less than one tile's worth: declined, nothing written */
        const size_t small = mgt_cpu_wino_scratch_tiles(m, s->c, s->oc, 1, 1) - sizeof(float);
        float *scr = tmp_alloc(small, 1), *yy = fbuf(ny), *dd = fbuf(nx), *ww = fbuf(nw);
        poison(yy, ny);
        poison(dd, nx);
        poison(ww, nw);
        CHECK(mgt_cpu_wino_fwd(scr, small, lanes_of(2), m, s, t.x, t.w, t.b, yy) == -1 &&
                  mgt_cpu_wino_bwd_data(scr, small, lanes_of(2), m, s, t.w, t.dy, dd) == -1 &&
                  mgt_cpu_wino_bwd_filter(scr, small, lanes_of(2), m, s, t.x, t.dy, ww) == -1 &&
                  mgt_cpu_wino_fwd(NULL, 0, lanes_of(1), m, s, t.x, t.w, t.b, yy) == -1,
              "F(%d) with too little scratch should decline", m);
        CHECK(all_nan(yy, ny) && all_nan(dd, nx) && all_nan(ww, nw),
              "F(%d) declined but wrote its outputs", m);
    }
    tmp_free_all();
}

/* ---- through the op table ---- */

/* A layer that qualifies: results right, the pass goes through Winograd (bit-identical to a
 * direct call given the same scratch), gradients overwritten, dx NULL allowed, and reserving too
 * little scratch falls back to im2col / the direct loop with the same results. */
static void test_op_table_case(const wcfg *k, int m) {
    wcase t = make_case(k, 1);
    CHECK(mgt_cpu_conv_wino_tile(&t.s) == m, "op table should choose F(%dx%d), chooses %d", m, m,
          mgt_cpu_conv_wino_tile(&t.s));
    const mgt_conv_shape *s = &t.s;
    char name[96];
    shape_name(name, sizeof name, k);
    const size_t nx = conv_nx(s), nw = conv_nw(s), ny = conv_ny(s);
    mgt_backend be = opcheck_cpu_backend("test_winograd");
    const size_t bytes = be.ops->conv2d_scratch(s);
    CHECK(bytes >= mgt_cpu_wino_scratch(s, m), "%s: conv2d_scratch %zu below Winograd's %zu", name,
          bytes, mgt_cpu_wino_scratch(s, m));
    CHECK(be.ops->reserve(&be, bytes) == 0, "%s: reserve failed", name);
    float *y = fbuf(ny), *dx = fbuf(nx), *dw = fbuf(nw), *db = fbuf((size_t)s->oc);
    poison(y, ny);
    poison(dx, nx);
    poison(dw, nw);
    poison(db, (size_t)s->oc);
    be.ops->conv2d_fwd(&be, s, t.x, t.w, t.b, y);
    be.ops->conv2d_bwd(&be, s, t.x, t.w, t.dy, dx, dw, db);
    {
        const double ry = wino_ratio_y(&t, m, y, 1), rx = wino_ratio_dx(&t, m, dx),
                     rw = wino_ratio_dw(&t, m, dw), rb = conv_ratio(&t.r, 0, CONV_DB, db);
        CHECK(ry <= 1.0 && rx <= 1.0 && rw <= 1.0 && rb <= 1.0,
              "op table %s: error y %.3g dx %.3g dW %.3g db %.3g of the bounds", name, ry, rx, rw,
              rb);
    }

    /* the same passes called directly with a scratch of the same size */
    {
        float *scr = tmp_alloc(bytes, 1), *y2 = fbuf(ny), *dx2 = fbuf(nx), *dw2 = fbuf(nw);
        const int lanes = openblas_get_num_threads(); /* what the op table uses */
        mgt_cpu_wino_fwd(scr, bytes, lanes_of(lanes), m, s, t.x, t.w, t.b, y2);
        mgt_cpu_wino_bwd_data(scr, bytes, lanes_of(lanes), m, s, t.w, t.dy, dx2);
        mgt_cpu_wino_bwd_filter(scr, bytes, lanes_of(lanes), m, s, t.x, t.dy, dw2);
        CHECK(memcmp(y, y2, ny * sizeof(float)) == 0 && memcmp(dx, dx2, nx * sizeof(float)) == 0 &&
                  memcmp(dw, dw2, nw * sizeof(float)) == 0,
              "op table %s did not go through Winograd F(%dx%d)", name, m, m);
    }
    /* dx NULL: the same dW and db; overwritten again (not accumulated) */
    {
        float *dw2 = fbuf(nw), *db2 = fbuf((size_t)s->oc);
        poison(dw2, nw);
        poison(db2, (size_t)s->oc);
        be.ops->conv2d_bwd(&be, s, t.x, t.w, t.dy, NULL, dw2, db2);
        be.ops->conv2d_bwd(&be, s, t.x, t.w, t.dy, NULL, dw2, db2);
        CHECK(memcmp(dw, dw2, nw * sizeof(float)) == 0 &&
                  memcmp(db, db2, (size_t)s->oc * sizeof(float)) == 0,
              "op table %s: dx NULL changed dW/db, or a second call accumulated", name);
    }
    mgt_backend_destroy(&be);

    /* reserved scratch too small for one Winograd tile: im2col; none at all: the direct loop */
    const size_t fallback[2] = {mgt_cpu_wino_scratch_tiles(m, s->c, s->oc, 1, 1) / 2, 0};
    for (int v = 0; v < 2; v++) {
        mgt_backend b2 = opcheck_cpu_backend("test_winograd");
        if (fallback[v])
            CHECK(b2.ops->reserve(&b2, fallback[v]) == 0, "reserve(%zu) failed", fallback[v]);
        float *y2 = fbuf(ny), *dx2 = fbuf(nx), *dw2 = fbuf(nw), *db2 = fbuf((size_t)s->oc);
        poison(y2, ny);
        poison(dx2, nx);
        poison(dw2, nw);
        b2.ops->conv2d_fwd(&b2, s, t.x, t.w, t.b, y2);
        b2.ops->conv2d_bwd(&b2, s, t.x, t.w, t.dy, dx2, dw2, db2);
        double r = conv_ratio(&t.r, 0, CONV_Y, y2), q;
        r = (q = conv_ratio(&t.r, 0, CONV_DX, dx2)) > r ? q : r;
        r = (q = conv_ratio(&t.r, 0, CONV_DW, dw2)) > r ? q : r;
        r = (q = conv_ratio(&t.r, 0, CONV_DB, db2)) > r ? q : r;
        CHECK(r <= 1.0,
              "op table %s with %zu bytes of scratch (fallback): error %.3g of the "
              "direct convolution's bound",
              name, fallback[v], r);
        mgt_backend_destroy(&b2);
    }
    tmp_free_all();
}

static void test_op_table(void) {
    /* n  h   w   c  oc  pt pb pl pr */
    const wcfg f4 = {3, 14, 13, 32, 48, 0, 0, 0, 0};     /* conv2-like: F(4x4) */
    const wcfg f4same = {2, 11, 10, 96, 64, 1, 1, 1, 1}; /* F(4x4) */
    const wcfg f2same = {3, 6, 6, 24, 17, 1, 1, 1, 1};   /* 6x6 output: F(2x2) tiles it exactly */
    const wcfg f1 = {4, 10, 9, 1, 8, 0, 0, 0, 0};        /* one input channel, like conv1 */
    test_op_table_case(&f4, 4);
    test_op_table_case(&f4same, 4);
    test_op_table_case(&f2same, 2);
    test_op_table_case(&f1, 4);

    /* algo DIRECT (the layer's algo = direct, --conv-algo direct): never Winograd. On an image
     * with a zero background (Fashion-MNIST's), every output whose 3x3 window is all zero is
     * exactly the bias through a direct convolution, as in PyTorch, while Winograd's transforms
     * leave rounding residue there (its tiles also cover non-zero pixels): after a ReLU with a
     * zero bias that residue opens gates PyTorch keeps closed. */
    {
        const wcfg k = {2, 12, 12, 1, 8, 0, 0, 0, 0};
        wcase t = make_case(&k, 1);
        mgt_conv_shape *s = &t.s;
        const size_t nx = conv_nx(s), ny = conv_ny(s);
        for (size_t i = 0; i < nx; i++) { /* a 4x4 blob on a zero background */
            const size_t px = i / (size_t)s->c, yy = px / (size_t)s->w % (size_t)s->h,
                         xx = px % (size_t)s->w;
            if (yy < 4 || yy >= 8 || xx < 4 || xx >= 8)
                t.x[i] = 0.0f;
        }
        float *zb = fbuf((size_t)s->oc), *yw = fbuf(ny), *yd = fbuf(ny);
        mgt_backend be = opcheck_cpu_backend("test_winograd");
        s->algo = MGT_CONV_AUTO;
        be.ops->reserve(&be, be.ops->conv2d_scratch(s));
        be.ops->conv2d_fwd(&be, s, t.x, t.w, zb, yw);
        s->algo = MGT_CONV_DIRECT;
        CHECK(mgt_cpu_conv_wino_tile(s) == 0, "algo DIRECT still chooses Winograd F(%d)",
              mgt_cpu_conv_wino_tile(s));
        be.ops->conv2d_fwd(&be, s, t.x, t.w, zb, yd);
        int zero_windows = 0, exact = 0, residue = 0;
        for (int n = 0; n < s->n; n++)
            for (int oy = 0; oy < s->oh; oy++)
                for (int ox = 0; ox < s->ow; ox++) {
                    if (!(oy + 2 < 4 || oy >= 8 || ox + 2 < 4 || ox >= 8))
                        continue; /* the window touches the blob */
                    zero_windows++;
                    for (int o = 0; o < s->oc; o++) {
                        const size_t i = (((size_t)n * s->oh + oy) * s->ow + ox) * s->oc + o;
                        exact += yd[i] == 0.0f;
                        residue += yw[i] != 0.0f;
                    }
                }
        CHECK(zero_windows > 0 && exact == zero_windows * s->oc,
              "algo DIRECT: %d of %d outputs over all-zero windows are exactly 0", exact,
              zero_windows * s->oc);
        printf("test_winograd: outputs over all-zero windows: Winograd leaves %d of %d non-zero, "
               "direct none\n",
               residue, zero_windows * s->oc);
        mgt_backend_destroy(&be);
        tmp_free_all();
    }

    /* the backend's thread count (Winograd's lanes) changes no bit of any result */
    {
        const wcfg k = {8, 24, 23, 48, 40, 1, 1, 1, 1}; /* enough work for 3 threads */
        wcase t = make_case(&k, 1);
        const mgt_conv_shape *s = &t.s;
        const size_t nx = conv_nx(s), nw = conv_nw(s), ny = conv_ny(s);
        const int before = openblas_get_num_threads();
        float *y[3], *dx[3], *dw[3];
        for (int v = 0; v < 3; v++) {
            mgt_backend be = {0};
            CHECK(mgt_cpu_backend_init(&be, v + 1) == 0, "backend with %d threads", v + 1);
            be.ops->reserve(&be, be.ops->conv2d_scratch(s));
            y[v] = fbuf(ny), dx[v] = fbuf(nx), dw[v] = fbuf(nw);
            be.ops->conv2d_fwd(&be, s, t.x, t.w, t.b, y[v]);
            be.ops->conv2d_bwd(&be, s, t.x, t.w, t.dy, dx[v], dw[v], NULL);
            mgt_backend_destroy(&be);
        }
        openblas_set_num_threads(before);
        for (int v = 1; v < 3; v++)
            CHECK(memcmp(y[v], y[0], ny * sizeof(float)) == 0 &&
                      memcmp(dx[v], dx[0], nx * sizeof(float)) == 0 &&
                      memcmp(dw[v], dw[0], nw * sizeof(float)) == 0,
                  "op table: %d threads differ from 1 thread", v + 1);
        const int m = mgt_cpu_conv_wino_tile(s);
        CHECK(m && wino_ratio_y(&t, m, y[0], 1) <= 1.0 && wino_ratio_dw(&t, m, dw[0]) <= 1.0,
              "op table thread test: F(%d) error y %.3g dW %.3g of the bounds", m,
              m ? wino_ratio_y(&t, m, y[0], 1) : 0.0, m ? wino_ratio_dw(&t, m, dw[0]) : 0.0);
        tmp_free_all();
    }
    /* n == 0 through the op table: dW and db zeros, nothing else touched */
    {
        mgt_backend be = opcheck_cpu_backend("test_winograd");
        const mgt_conv_shape s = shape_of(&(wcfg){0, 6, 6, 32, 64, 1, 1, 1, 1});
        be.ops->reserve(&be, be.ops->conv2d_scratch(&s));
        float *dw = fbuf(conv_nw(&s)), *db = fbuf((size_t)s.oc), dummy[1] = {0};
        poison(dw, conv_nw(&s));
        poison(db, (size_t)s.oc);
        be.ops->conv2d_fwd(&be, &s, dummy, dummy, dummy, dummy);
        be.ops->conv2d_bwd(&be, &s, dummy, dummy, dummy, NULL, dw, db);
        CHECK(all_zero(dw, conv_nw(&s)) && all_zero(db, (size_t)s.oc),
              "op table n = 0: dW/db not all zero");
        mgt_backend_destroy(&be);
        tmp_free_all();
    }
    /* the seed ConvNet's layers at batch 128: F(4x4), bounded scratch that holds its chunks */
    {
        mgt_backend be = opcheck_cpu_backend("test_winograd");
        /* ... and wider layers: F(2x2) once F(4x4)'s filters would not fit 64 MB, then im2col */
        const wcfg layers[] = {
            {128, 28, 28, 1, 32, 0, 0, 0, 0},    {128, 26, 26, 32, 256, 0, 0, 0, 0},
            {128, 24, 24, 256, 128, 0, 0, 0, 0}, {4096, 24, 24, 256, 128, 1, 1, 1, 1},
            {2, 8, 8, 512, 512, 1, 1, 1, 1},     {2, 8, 8, 1024, 1024, 1, 1, 1, 1}};
        const int expect[] = {4, 4, 4, 4, 2, 0};
        for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
            const mgt_conv_shape s = shape_of(&layers[i]);
            const size_t sz = be.ops->conv2d_scratch(&s);
            CHECK(sz <= ((size_t)64 << 20), "conv2d_scratch(layer %zu) = %zu: over 64 MB", i, sz);
            const int m = mgt_cpu_conv_wino_tile(&s);
            CHECK(m == expect[i], "layer %zu: Winograd F(%d) chosen, expected %d", i, m, expect[i]);
            if (m)
                CHECK(sz >= mgt_cpu_wino_scratch(&s, m),
                      "conv2d_scratch(layer %zu) = %zu: less than Winograd's %zu", i, sz,
                      mgt_cpu_wino_scratch(&s, m));
        }
        mgt_backend_destroy(&be);
    }
}

/* ---- the GEMM kernel ---- */

/* One product by every variant: A rows x K in the layout given by (ai, ak), B in panels given by
 * (bp, bk), C with a gap of 8 columns after each row that must stay untouched. */
static void gemm_case(int rows, int cols, int K, int a_cols_major, int b_rows, int acc) {
    const ptrdiff_t ai = a_cols_major ? 1 : K + 3, ak = a_cols_major ? rows + 2 : 1;
    const ptrdiff_t bp = b_rows ? 32 : (ptrdiff_t)K * 32, bk = b_rows ? cols + 32 : 32;
    const ptrdiff_t ldc = cols + 8;
    const size_t na = (size_t)(a_cols_major ? (size_t)K * ak : (size_t)rows * ai) + 8;
    const size_t nb = b_rows ? (size_t)K * bk : (size_t)(cols / 32) * bp;
    const size_t nc = (size_t)rows * ldc;
    float *a = fbuf(na), *b = fbuf(nb), *c0 = fbuf(nc), *c = fbuf(nc), *first = fbuf(nc);
    double *ref = tmp_alloc(sizeof(double) * nc, 0), *absref = tmp_alloc(sizeof(double) * nc, 0);
    fill(a, na, -1, 1);
    fill(b, nb, -1, 1);
    fill(c0, nc, -1, 1);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double r = acc ? c0[i * ldc + j] : 0.0, ar = fabs(r);
            for (int k = 0; k < K; k++) {
                const double p = (double)a[i * ai + k * ak] * b[(j / 32) * bp + k * bk + j % 32];
                r += p;
                ar += fabs(p);
            }
            ref[i * ldc + j] = r;
            absref[i * ldc + j] = ar;
        }
    const int nv = mgt_cpu_wino_gemm_count();
    const char *v3 = NULL;
    for (int v = 0; v < nv; v++) {
        memcpy(c, c0, sizeof(float) * nc);
        for (int i = 0; i < rows; i++) /* the gap after each row: NaN, to stay so */
            for (int j = cols; j < ldc; j++)
                c[i * ldc + j] = NAN;
        const char *name = mgt_cpu_wino_gemm(v, rows, cols, K, acc, a, ai, ak, b, bp, bk, c, ldc);
        CHECK(name != NULL, "GEMM variant %d of %d did not run", v, nv);
        if (!name)
            continue;
        /* a sum of K products (and C when accumulating), each rounded at most once, in any
         * order: within gamma(K + 1) of the sum of the absolute terms */
        double worst = 0.0;
        int gap_ok = 1;
        for (int i = 0; i < rows; i++) {
            const double r =
                bound_ratio(c + i * ldc, ref + i * ldc, absref + i * ldc, (size_t)cols, K + 1.0);
            worst = r > worst ? r : worst;
            for (int j = cols; j < ldc; j++)
                gap_ok &= isnan(c[i * ldc + j]);
        }
        CHECK(worst <= 1.0 && gap_ok,
              "GEMM %s %dx%dx%d (A %s, B %s, %s): error %.3g of the bound, gap %s", name, rows,
              cols, K, a_cols_major ? "by columns" : "by rows", b_rows ? "rows" : "panels",
              acc ? "C +=" : "C =", worst, gap_ok ? "untouched" : "written");
        /* the AVX2 and AVX-512 variants do the same FMAs in the same order */
        if (!strcmp(name, "x86-64-v3")) {
            memcpy(first, c, sizeof(float) * nc);
            v3 = name;
        } else if (!strcmp(name, "x86-64-v4") && v3) {
            CHECK(memcmp(first, c, sizeof(float) * nc) == 0,
                  "GEMM %dx%dx%d: x86-64-v4 differs from x86-64-v3", rows, cols, K);
        }
    }
}

static void test_gemm(void) {
    const int shapes[][3] = {{6, 32, 1}, {12, 64, 7}, {18, 32, 33}, {6, 96, 256}, {30, 128, 40}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int layout = 0; layout < 4; layout++)
            gemm_case(shapes[i][0], shapes[i][1], shapes[i][2], layout & 1, layout >> 1 & 1,
                      (int)(i + layout) % 2);
    float one = 1.0f;
    CHECK(mgt_cpu_wino_gemm(0, 5, 32, 1, 0, &one, 1, 1, &one, 32, 32, &one, 32) == NULL &&
              mgt_cpu_wino_gemm(0, 6, 30, 1, 0, &one, 1, 1, &one, 32, 32, &one, 32) == NULL &&
              mgt_cpu_wino_gemm(mgt_cpu_wino_gemm_count(), 6, 32, 1, 0, &one, 1, 1, &one, 32, 32,
                                &one, 32) == NULL,
          "the GEMM should refuse rows not a multiple of 6, columns not of 32, and a variant "
          "the CPU does not run");
    tmp_free_all();
}

int main(void) {
    test_gemm();
    test_direct();
    test_chunking();
    test_op_table();
    tmp_free_all();
    for (int i = 0; i <= LANES_MAX_TEST; i++)
        mgt_cpu_lanes_destroy(g_lanes[i]);
    return opcheck_finish("test_winograd");
}
