/* test_graph_ops.c: the CPU backend's ops for graph models (backend.h: add2, copy_cols, pad_fwd /
 * pad_bwd, gap_fwd / gap_bwd, dwconv_*, and pooling with TensorFlow's "same" padding).
 *
 * What is checked:
 *  - forward values against references computed in double from the definitions, within the
 *    rounding bound of the op's own summation (opcheck.h: bound_ratio, near, opcheck_gamma),
 *    or bit for bit where the op does no arithmetic (copies, padding, a maximum) or exactly one
 *    rounding (a sum of two floats);
 *  - every backward op against central finite differences of L = sum(y * r) (fdcheck.h), and
 *    the depthwise gradients also against their double references and bounds;
 *  - the adjoint identities of padding and concatenation, exactly;
 *  - depthwise convolution with and without the scratch it asks for (the transposed weights and
 *    the lanes' accumulators, or the strided fallback), n == 0 writing zero gradients, dx NULL;
 *  - TensorFlow's "same" pooling on a hand-worked 4x4 example whose windows differ from
 *    PyTorch's symmetric padding=1.
 * Outputs are filled with NaN before every call so an element an op forgets shows up. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h" /* mgt_conv2d_geometry: Keras' output size and padding */
#include "util.h"

#define OPCHECK_KEY 0x67726170ULL
#include "convref.h"
#include "fdcheck.h"
#include "opcheck.h"

/* ---- add2, copy_cols, padding: no arithmetic but one rounding at most ---- */

static void test_add2(mgt_backend *be) {
    const size_t n = 1027; /* not a multiple of any vector width */
    float *a = fbuf(n), *b = fbuf(n), *y = fbuf(n), *want = fbuf(n);
    fill(a, n, -3, 3);
    fill(b, n, -3, 3);
    for (size_t i = 0; i < n; i++)
        want[i] = a[i] + b[i]; /* one correctly rounded addition: exact agreement */
    poison(y, n);
    be->ops->add2(be, n, a, b, y);
    CHECK(!memcmp(y, want, n * sizeof(float)), "add2 differs from a + b");
    be->ops->add2(be, n, a, b, a); /* y may be an input */
    CHECK(!memcmp(a, want, n * sizeof(float)), "add2 in place (y = a) differs");
    tmp_free_all();
}

static void test_copy_cols(mgt_backend *be) {
    /* concat of inputs with 3, 5 and 1 channels into 9, and back: a permutation of values */
    const size_t rows = 37;
    const int cs[3] = {3, 5, 1}, C = 9;
    float *x[3], *y = fbuf(rows * C), *back = fbuf(rows * 5), *acc = fbuf(rows * 5);
    poison(y, rows * C);
    for (int k = 0, at = 0; k < 3; at += cs[k], k++) {
        x[k] = fbuf(rows * (size_t)cs[k]);
        fill(x[k], rows * (size_t)cs[k], -1, 1);
        be->ops->copy_cols(be, rows, cs[k], x[k], cs[k], y + at, C, 0);
    }
    int ok = 1;
    for (size_t r = 0; r < rows; r++)
        for (int k = 0, at = 0; k < 3; at += cs[k], k++)
            for (int j = 0; j < cs[k]; j++)
                ok &= y[r * C + at + j] == x[k][r * cs[k] + j];
    CHECK(ok, "copy_cols: the concatenation is not the inputs side by side");
    poison(back, rows * 5);
    be->ops->copy_cols(be, rows, 5, y + 3, C, back, 5, 0);
    CHECK(!memcmp(back, x[1], rows * 5 * sizeof(float)), "copy_cols: the slice back differs");
    fill(acc, rows * 5, -1, 1);
    float *want = fbuf(rows * 5);
    for (size_t i = 0; i < rows * 5; i++)
        want[i] = acc[i] + x[1][i];
    be->ops->copy_cols(be, rows, 5, y + 3, C, acc, 5, 1);
    CHECK(!memcmp(acc, want, rows * 5 * sizeof(float)), "copy_cols: accumulate is not +=");
    tmp_free_all();
}

static void test_pad(mgt_backend *be) {
    const mgt_pad_shape s = {2, 5, 4, 3, 1, 2, 3, 0};
    const int hp = s.h + s.top + s.bottom, wp = s.w + s.left + s.right;
    const size_t nx = (size_t)s.n * s.h * s.w * s.c, ny = (size_t)s.n * hp * wp * s.c;
    float *x = fbuf(nx), *y = fbuf(ny), *r = fbuf(ny), *dx = fbuf(nx);
    fill(x, nx, -1, 1);
    fill(r, ny, -1, 1);
    poison(y, ny);
    be->ops->pad_fwd(be, &s, x, y);
    int ok = 1;
    for (int i = 0; i < s.n; i++)
        for (int py = 0; py < hp; py++)
            for (int px = 0; px < wp; px++)
                for (int ch = 0; ch < s.c; ch++) {
                    const int iy = py - s.top, ix = px - s.left;
                    const int inside = iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
                    const float want = inside ? x[((i * s.h + iy) * s.w + ix) * s.c + ch] : 0.0f;
                    ok &= y[((i * hp + py) * wp + px) * s.c + ch] == want;
                }
    CHECK(ok, "pad_fwd: not x surrounded by zeros");
    poison(dx, nx);
    be->ops->pad_bwd(be, &s, r, dx);
    /* the adjoint: <pad(x), r> == <x, pad_bwd(r)>, both exact sums of the same products */
    CHECK(dot(y, r, ny) == dot(x, dx, nx), "pad_bwd is not the adjoint of pad_fwd");
    be->ops->pad_bwd(be, &s, r, NULL); /* dx NULL: nothing to do, no crash */
    tmp_free_all();
}

/* ---- global average pooling ---- */

typedef struct {
    mgt_backend *be;
    int n, hw, c;
    float *x, *y, *r;
} gap_ctx;

static double gap_obj(void *p) {
    gap_ctx *g = p;
    poison(g->y, (size_t)g->n * g->c);
    g->be->ops->gap_fwd(g->be, g->n, g->hw, g->c, g->x, g->y);
    return dot(g->y, g->r, (size_t)g->n * g->c);
}

static void test_gap(mgt_backend *be) {
    const int shapes[][3] = {{3, 49, 5}, {2, 1, 300}, {1, 361, 17}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        gap_ctx g = {be, shapes[t][0], shapes[t][1], shapes[t][2], NULL, NULL, NULL};
        const size_t nx = (size_t)g.n * g.hw * g.c, ny = (size_t)g.n * g.c;
        g.x = fbuf(nx), g.y = fbuf(ny), g.r = fbuf(ny);
        fill(g.x, nx, -2, 2);
        fill(g.r, ny, -1, 1);
        double *ref = dbuf(ny), *abs_ref = dbuf(ny);
        for (int i = 0; i < g.n; i++)
            for (int ch = 0; ch < g.c; ch++) {
                double s = 0, a = 0;
                for (int q = 0; q < g.hw; q++) {
                    s += g.x[((size_t)i * g.hw + q) * g.c + ch];
                    a += fabs(g.x[((size_t)i * g.hw + q) * g.c + ch]);
                }
                ref[(size_t)i * g.c + ch] = s / g.hw;
                abs_ref[(size_t)i * g.c + ch] = a / g.hw;
            }
        gap_obj(&g);
        /* the sum in double rounded once to float, 1/hw rounded, the product rounded: the
         * double sum's own error is below the 2^-40 allowance of bound_ratio: k = 3 */
        const double ratio = bound_ratio(g.y, ref, abs_ref, ny, 3);
        CHECK(ratio <= 1, "gap_fwd %dx%dx%d: %.3g of its rounding bound", g.n, g.hw, g.c, ratio);
        float *dx = fbuf(nx);
        poison(dx, nx);
        be->ops->gap_bwd(be, g.n, g.hw, g.c, g.r, dx);
        char what[64];
        snprintf(what, sizeof what, "gap_bwd %dx%dx%d", g.n, g.hw, g.c);
        fd_check(what, gap_obj, &g, g.x, nx, dx);
        tmp_free_all();
    }
}

/* ---- depthwise convolution ---- */

/* Exact results in double and the sums of |terms| that bound their rounding. */
typedef struct {
    double *y, *ya, *dx, *dxa, *dw, *dwa, *db, *dba;
} dw_ref;

static dw_ref dw_reference(const mgt_conv_shape *s, const float *x, const float *w, const float *b,
                           const float *dy) {
    const size_t nx = conv_nx(s), ny = conv_ny(s), nw = (size_t)s->c * s->kh * s->kw;
    dw_ref r = {dbuf(ny), dbuf(ny), dbuf(nx), dbuf(nx), dbuf(nw), dbuf(nw), dbuf(s->c), dbuf(s->c)};
    for (int i = 0; i < s->n; i++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++)
                for (int ch = 0; ch < s->c; ch++) {
                    const size_t o = (((size_t)i * s->oh + oy) * s->ow + ox) * s->c + ch;
                    r.y[o] = b ? b[ch] : 0.0;
                    r.ya[o] = b ? fabs(b[ch]) : 0.0;
                    r.db[ch] += dy[o];
                    r.dba[ch] += fabs(dy[o]);
                    for (int ki = 0; ki < s->kh; ki++)
                        for (int kj = 0; kj < s->kw; kj++) {
                            const int iy = oy * s->stride - s->pad_top + ki;
                            const int ix = ox * s->stride - s->pad_left + kj;
                            if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w)
                                continue;
                            const size_t xi = (((size_t)i * s->h + iy) * s->w + ix) * s->c + ch;
                            const size_t wi = ((size_t)ch * s->kh + ki) * s->kw + kj;
                            r.y[o] += (double)w[wi] * x[xi];
                            r.ya[o] += fabs((double)w[wi] * x[xi]);
                            r.dx[xi] += (double)w[wi] * dy[o];
                            r.dxa[xi] += fabs((double)w[wi] * dy[o]);
                            r.dw[wi] += (double)x[xi] * dy[o];
                            r.dwa[wi] += fabs((double)x[xi] * dy[o]);
                        }
                }
    return r;
}

typedef struct {
    mgt_backend *be;
    mgt_conv_shape s;
    float *x, *w, *b, *y, *r;
} dw_ctx;

static double dw_obj(void *p) {
    dw_ctx *d = p;
    poison(d->y, conv_ny(&d->s));
    d->be->ops->dwconv_fwd(d->be, &d->s, d->x, d->w, d->b, d->y);
    return dot(d->y, d->r, conv_ny(&d->s));
}

/* One shape on one backend (`scratch`: whether the backend holds what dwconv_scratch asks). */
static void dw_case(mgt_backend *be, const mgt_conv_shape *shape, int bias, int scratch) {
    dw_ctx d = {.be = be, .s = *shape};
    const mgt_conv_shape *s = &d.s;
    const size_t nx = conv_nx(s), ny = conv_ny(s), nw = (size_t)s->c * s->kh * s->kw;
    const size_t taps = (size_t)s->kh * s->kw;
    d.x = fbuf(nx), d.w = fbuf(nw), d.b = bias ? fbuf(s->c) : NULL;
    d.y = fbuf(ny), d.r = fbuf(ny);
    fill(d.x, nx, -1, 1);
    fill(d.w, nw, -1, 1);
    if (d.b)
        fill(d.b, s->c, -1, 1);
    fill(d.r, ny, -1, 1);
    char name[160];
    snprintf(name, sizeof name, "dwconv n%d %dx%dx%d k%dx%d s%d pad %d,%d -> %dx%d bias %d%s", s->n,
             s->h, s->w, s->c, s->kh, s->kw, s->stride, s->pad_top, s->pad_left, s->oh, s->ow, bias,
             scratch ? "" : " (no scratch)");
    const dw_ref ref = dw_reference(s, d.x, d.w, d.b, d.r);
    dw_obj(&d);
    /* forward: the bias and up to kh*kw products summed in float, each a rounding: k = taps + 1 */
    double ratio = bound_ratio(d.y, ref.y, ref.ya, ny, (double)taps + 1);
    CHECK(ratio <= 1, "%s: forward at %.3g of its bound", name, ratio);

    float *dx = fbuf(nx), *dw = fbuf(nw), *db = fbuf(s->c);
    poison(dx, nx), poison(dw, nw), poison(db, s->c);
    be->ops->dwconv_bwd(be, s, d.x, d.w, d.r, dx, dw, db);
    /* dx: up to kh*kw products per input pixel, summed in float: k = taps */
    ratio = bound_ratio(dx, ref.dx, ref.dxa, nx, (double)taps);
    CHECK(ratio <= 1, "%s: dx at %.3g of its bound", name, ratio);
    /* dW: per output row the ow products summed in float (k = ow), the rows in double, then one
     * rounding to float: k = ow + 1. Without scratch the whole sum is in double: k = 1 is
     * covered by the same bound. db: a double column sum rounded once: k = 1. */
    ratio = bound_ratio(dw, ref.dw, ref.dwa, nw, (double)s->ow + 1);
    CHECK(ratio <= 1, "%s: dW at %.3g of its bound", name, ratio);
    ratio = bound_ratio(db, ref.db, ref.dba, (size_t)s->c, 1);
    CHECK(ratio <= 1, "%s: db at %.3g of its bound", name, ratio);
    char what[200];
    snprintf(what, sizeof what, "%s dx", name);
    fd_check(what, dw_obj, &d, d.x, nx, dx);
    snprintf(what, sizeof what, "%s dW", name);
    fd_check(what, dw_obj, &d, d.w, nw, dw);

    /* dx NULL gives the same parameter gradients; n == 0 writes zeros */
    float *dw2 = fbuf(nw);
    poison(dw2, nw);
    be->ops->dwconv_bwd(be, s, d.x, d.w, d.r, NULL, dw2, NULL);
    CHECK(!memcmp(dw, dw2, nw * sizeof(float)), "%s: dW with dx NULL differs", name);
    mgt_conv_shape empty = *s;
    empty.n = 0;
    poison(dw2, nw), poison(db, s->c);
    be->ops->dwconv_bwd(be, &empty, d.x, d.w, d.r, NULL, dw2, db);
    CHECK(all_zero(dw2, nw) && all_zero(db, s->c), "%s: n = 0 must write zero gradients", name);
    tmp_free_all();
}

static void test_dwconv(void) {
    /* n, h, w, c, kh, kw, stride, padding (0 valid, 1 same: Keras' split, odd at the bottom) */
    const int cases[][8] = {
        {2, 7, 6, 3, 3, 3, 1, 1},  {2, 9, 9, 17, 3, 3, 2, 1}, /* 17: a vector and a tail */
        {1, 8, 8, 64, 3, 3, 2, 1}, /* even input, stride 2, same: pads bottom/right only */
        {3, 6, 7, 5, 3, 3, 1, 0},  {2, 5, 8, 2, 5, 3, 1, 1}, /* non-square kernel */
        {1, 4, 4, 1, 3, 3, 1, 1},  {2, 10, 10, 8, 3, 3, 3, 0},
    };
    for (int scratch = 1; scratch >= 0; scratch--)
        for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
            const int *q = cases[t];
            const mgt_conv_shape g =
                mgt_conv2d_geometry(q[0], q[1], q[2], q[3], q[3], q[4], q[5], q[6], q[7]);
            /* a fresh backend: with or without the scratch the layer would reserve */
            mgt_backend be = opcheck_cpu_backend("test_graph_ops");
            if (scratch)
                CHECK(be.ops->reserve(&be, be.ops->dwconv_scratch(&be, &g)) == 0, "reserve failed");
            dw_case(&be, &g, (int)(t % 2), scratch);
            mgt_backend_destroy(&be);
        }
}

/* ---- pooling with TensorFlow's "same" padding ---- */

static mgt_pool_shape same_pool(int n, int h, int w, int c, int size, int stride) {
    const mgt_conv_shape g = mgt_conv2d_geometry(n, h, w, c, c, size, size, stride, 1);
    return (mgt_pool_shape){.n = n,
                            .h = h,
                            .w = w,
                            .c = c,
                            .size = size,
                            .stride = stride,
                            .oh = g.oh,
                            .ow = g.ow,
                            .pad_top = g.pad_top,
                            .pad_left = g.pad_left};
}

typedef struct {
    mgt_backend *be;
    mgt_pool_shape s;
    float *x, *y, *r;
    int32_t *am;
    int is_max;
} pool_ctx;

static size_t pool_ny(const mgt_pool_shape *s) {
    return (size_t)s->n * s->oh * s->ow * s->c;
}
static size_t pool_nx(const mgt_pool_shape *s) {
    return (size_t)s->n * s->h * s->w * s->c;
}

static double pool_obj(void *p) {
    pool_ctx *c = p;
    poison(c->y, pool_ny(&c->s));
    if (c->is_max)
        c->be->ops->maxpool_fwd(c->be, &c->s, c->x, c->y, c->am);
    else
        c->be->ops->avgpool_fwd(c->be, &c->s, c->x, c->y);
    return dot(c->y, c->r, pool_ny(&c->s));
}

static void test_pool_same(mgt_backend *be) {
    /* Hand-worked: x = 0..15 in a 4x4 image, size 3, stride 2. TensorFlow's "same" gives a 2x2
     * output and pads 1 at the bottom/right only: windows rows/cols {0,1,2} and {2,3}. (PyTorch's
     * padding=1 would centre them: its first maximum would be 5, not 10.) */
    {
        const mgt_pool_shape s = same_pool(1, 4, 4, 1, 3, 2);
        float x[16], y[4];
        int32_t am[4];
        for (int i = 0; i < 16; i++)
            x[i] = (float)i;
        CHECK(s.oh == 2 && s.ow == 2 && s.pad_top == 0 && s.pad_left == 0,
              "same pooling 4x4/3/2: oh %d ow %d pads %d %d", s.oh, s.ow, s.pad_top, s.pad_left);
        be->ops->maxpool_fwd(be, &s, x, y, am);
        CHECK(y[0] == 10 && y[1] == 11 && y[2] == 14 && y[3] == 15,
              "same max pooling: %g %g %g %g, want 10 11 14 15", y[0], y[1], y[2], y[3]);
        CHECK(am[0] == 10 && am[1] == 11 && am[2] == 14 && am[3] == 15, "same max pooling argmax");
        be->ops->avgpool_fwd(be, &s, x, y);
        /* means over the real values only: 45/9, 39/6, 66/6, 50/4; each a sum of at most 9
         * small integers (exact) times 1/count (rounded) and rounded: k = 2 */
        const double want[4] = {5, 6.5, 11, 12.5};
        int ok = 1;
        for (int i = 0; i < 4; i++)
            ok &= near(y[i], want[i], 2, want[i]);
        CHECK(ok, "same average pooling: %g %g %g %g, want 5 6.5 11 12.5", y[0], y[1], y[2], y[3]);
    }
    /* random inputs, several shapes: max exact against a reference, backward by differences */
    const int cfg[][6] = {
        {2, 7, 7, 3, 3, 2}, {1, 8, 6, 4, 3, 2}, {2, 5, 5, 2, 2, 2}, {1, 6, 6, 3, 3, 1}};
    for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++) {
        const int *q = cfg[t];
        pool_ctx c = {.be = be, .s = same_pool(q[0], q[1], q[2], q[3], q[4], q[5])};
        const mgt_pool_shape *s = &c.s;
        const size_t nx = pool_nx(s), ny = pool_ny(s);
        c.x = fbuf(nx), c.y = fbuf(ny), c.r = fbuf(ny);
        c.am = tmp_alloc(ny * sizeof(int32_t), 0);
        fill_distinct(c.x, nx);
        fill(c.r, ny, -1, 1);
        float *ymax = fbuf(ny);
        double *yavg = dbuf(ny), *yabs = dbuf(ny);
        int cnt_max = 0;
        for (int i = 0; i < s->n; i++)
            for (int oy = 0; oy < s->oh; oy++)
                for (int ox = 0; ox < s->ow; ox++)
                    for (int ch = 0; ch < s->c; ch++) {
                        const size_t o = (((size_t)i * s->oh + oy) * s->ow + ox) * s->c + ch;
                        double sum = 0, sa = 0;
                        int cnt = 0;
                        float best = -INFINITY;
                        for (int a = 0; a < s->size; a++)
                            for (int b = 0; b < s->size; b++) {
                                const int iy = oy * s->stride - s->pad_top + a;
                                const int ix = ox * s->stride - s->pad_left + b;
                                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w)
                                    continue;
                                const float v =
                                    c.x[(((size_t)i * s->h + iy) * s->w + ix) * s->c + ch];
                                sum += v, sa += fabs(v), cnt++;
                                best = v > best ? v : best;
                            }
                        ymax[o] = best;
                        yavg[o] = sum / cnt;
                        yabs[o] = sa / cnt;
                        cnt_max = cnt > cnt_max ? cnt : cnt_max;
                    }
        char name[96];
        snprintf(name, sizeof name, "same pool n%d %dx%dx%d size %d stride %d", q[0], q[1], q[2],
                 q[3], q[4], q[5]);
        c.is_max = 1;
        pool_obj(&c);
        CHECK(!memcmp(c.y, ymax, ny * sizeof(float)), "%s: max pooling differs", name);
        float *dx = fbuf(nx);
        poison(dx, nx);
        be->ops->maxpool_bwd(be, s, c.r, c.am, dx);
        char what[128];
        snprintf(what, sizeof what, "%s: max dx", name);
        fd_check(what, pool_obj, &c, c.x, nx, dx);
        c.is_max = 0;
        pool_obj(&c);
        /* at most cnt_max values summed (cnt_max - 1 roundings), 1/count rounded, the product
         * rounded: k = cnt_max + 1 */
        const double ratio = bound_ratio(c.y, yavg, yabs, ny, cnt_max + 1.0);
        CHECK(ratio <= 1, "%s: average pooling at %.3g of its bound", name, ratio);
        poison(dx, nx);
        be->ops->avgpool_bwd(be, s, c.r, dx);
        snprintf(what, sizeof what, "%s: average dx", name);
        fd_check(what, pool_obj, &c, c.x, nx, dx);
        tmp_free_all();
    }
}

int main(void) {
    mgt_backend be = opcheck_cpu_backend("test_graph_ops");
    test_add2(&be);
    test_copy_cols(&be);
    test_pad(&be);
    test_gap(&be);
    test_pool_same(&be);
    mgt_backend_destroy(&be);
    test_dwconv();
    return opcheck_finish("test_graph_ops");
}
