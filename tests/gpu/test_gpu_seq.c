/* test_gpu_seq.c: the GPU backend's sequence-model ops (dense layers with [in][out] weights, the
 * GELUs, token and position embeddings, layer normalisation, causal attention and its generation
 * op) against the exact result in double or against the CPU reference backend.
 *
 * As in test_gpu_ops.c, outputs are NaN-filled first (an element left unwritten shows up), and a
 * sum whose order is the GPU's own (cuBLAS, a warp's butterfly) is checked against the exact
 * result within gamma(K) times the sum of its terms' magnitudes (opcheck.h), K the longest chain
 * of roundings an output can take, stated at each check. Where the GPU's kernel adds the same
 * float terms in the CPU's order (the embedding's rows, its table's gradient), the result must be
 * the CPU's bit for bit. On a --precision bf16 backend (bfloat16 activations) each op is held to
 * the float backend's result on the same values (test_bf16 says how). The shapes are small (the
 * emulated GPU runs every thread on the host): the whole test takes a few seconds there. Needs a
 * GPU (real or emulated): without one it prints SKIPPED and exits 77. */
#include "gpu_internal.h"
#include "gpu_test.h"

static const double U = 0x1p-24; /* float's unit roundoff */

/* |got - ref| <= bound element by element (a bound the caller derived); NaN fails. */
static void expect_host_within(const char *what, const float *a, const double *ref,
                               const double *bound, size_t n) {
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - ref[i]);
        const double r = !isfinite(a[i]) ? INFINITY : d == 0.0 ? 0.0 : d / bound[i];
        if (r > worst)
            worst = r, at = i;
    }
    CHECK(worst <= 1.0, "%s: error %.3g times its bound at %zu (got %.9g, exact %.9g; %zu values)",
          what, worst, at, (double)a[at], ref[at], n);
}

static void expect_within(const char *what, mgt_backend *g, const float *dev, const double *ref,
                          const double *bound, size_t n) {
    expect_host_within(what, dget(g, dev, n), ref, bound, n);
}

static void expect_bound(const char *what, mgt_backend *g, const float *dev, const double *ref,
                         const double *absref, size_t n, double k) {
    const double q = bound_ratio(dget(g, dev, n), ref, absref, n, k);
    CHECK(q <= 1.0, "%s: error %.3g times the bound gamma(%.0f) sum|terms| (%zu values)", what, q,
          k, n);
}

static double *dzero(size_t n) {
    return tmp_alloc(n * sizeof(double), 0);
}

/* ---- dense with [in][out] weights, and the GELUs after it ---- */

/* y = x W + b against the exact product (in products and the bias: K = in + 1), dx (out
 * products), dW (n products), db (n terms); then dx == NULL and n == 0 (zeros written). */
static void test_dense_io(pair *p, int n, int in, int out, int bias) {
    mgt_backend *g = &p->gpu;
    float *x = hrand((size_t)n * in, -1, 1), *w = hrand((size_t)in * out, -1, 1);
    float *b = bias ? hrand((size_t)out, -1, 1) : NULL, *dy = hrand((size_t)n * out, -1, 1);
    double *y = dzero((size_t)n * out), *ya = dzero((size_t)n * out);
    double *dx = dzero((size_t)n * in), *dxa = dzero((size_t)n * in);
    double *dw = dzero((size_t)in * out), *dwa = dzero((size_t)in * out);
    double *db = dzero((size_t)out), *dba = dzero((size_t)out);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            const double gy = dy[(size_t)i * out + o];
            double acc = b ? b[o] : 0.0, aa = b ? fabs(b[o]) : 0.0;
            for (int j = 0; j < in; j++) {
                const double xv = x[(size_t)i * in + j], wv = w[(size_t)j * out + o];
                acc += xv * wv;
                aa += fabs(xv * wv);
                dx[(size_t)i * in + j] += gy * wv;
                dxa[(size_t)i * in + j] += fabs(gy * wv);
                dw[(size_t)j * out + o] += xv * gy;
                dwa[(size_t)j * out + o] += fabs(xv * gy);
            }
            y[(size_t)i * out + o] = acc;
            ya[(size_t)i * out + o] = aa;
            db[o] += gy;
            dba[o] += fabs(gy);
        }
    float *gx = dput(g, x, (size_t)n * in), *gw = dput(g, w, (size_t)in * out);
    float *gb = b ? dput(g, b, (size_t)out) : NULL, *gdy = dput(g, dy, (size_t)n * out);
    float *gy = dnan(g, (size_t)n * out), *gdx = dnan(g, (size_t)n * in);
    float *gdw = dnan(g, (size_t)in * out), *gdb = dnan(g, (size_t)out);
    g->ops->dense_io_fwd(g, n, in, out, MGT_ACT_NONE, gx, gw, gb, gy, gy);
    g->ops->dense_io_bwd(g, n, in, out, gx, gw, gdy, gdx, gdw, gdb);
    char what[96];
    snprintf(what, sizeof what, "dense_io n=%d in=%d out=%d bias=%d: y", n, in, out, bias);
    expect_bound(what, g, gy, y, ya, (size_t)n * out, in + 1.0);
    expect_bound("dense_io dx", g, gdx, dx, dxa, (size_t)n * in, out);
    expect_bound("dense_io dW", g, gdw, dw, dwa, (size_t)in * out, n);
    expect_bound("dense_io db", g, gdb, db, dba, (size_t)out, n);
    float *gdw2 = dnan(g, (size_t)in * out), *gdb2 = dnan(g, (size_t)out);
    g->ops->dense_io_bwd(g, n, in, out, gx, gw, gdy, NULL, gdw2, gdb2);
    expect_bound("dense_io dW (dx NULL)", g, gdw2, dw, dwa, (size_t)in * out, n);
    g->ops->dense_io_bwd(g, 0, in, out, gx, gw, gdy, NULL, gdw2, gdb2);
    expect_same("dense_io n=0 dW zeros", g, gdw2, hf((size_t)in * out),
                sizeof(float) * (size_t)in * out);
    expect_same("dense_io n=0 db zeros", g, gdb2, hf((size_t)out), sizeof(float) * (size_t)out);

    /* with the GELU (tanh form): pre is the same product, and y the activation of it, which the
     * GELU test checks; here y must be act_fwd of the GPU's own pre, bit for bit */
    float *gpre = dnan(g, (size_t)n * out), *gy2 = dnan(g, (size_t)n * out);
    g->ops->dense_io_fwd(g, n, in, out, MGT_ACT_GELU_TANH, gx, gw, gb, gpre, gy2);
    expect_bound("dense_io pre (GELU)", g, gpre, y, ya, (size_t)n * out, in + 1.0);
    float *gy3 = dnan(g, (size_t)n * out);
    g->ops->act_fwd(g, MGT_ACT_GELU_TANH, n, out, gpre, gy3);
    expect_same("dense_io GELU y = act_fwd(pre)", g, gy2, dget(g, gy3, (size_t)n * out),
                sizeof(float) * (size_t)n * out);
    dfree_all();
    hfree_all();
}

/* The GELUs against their exact values in double. Bounds: the tanh form takes tanh as
 * 1 - 2 / (e^2u + 1) from expf (at most 2 units in the last place on CUDA, 1 on glibc), whose
 * absolute error is then at most 8u (the relative errors of e, e + 1, the quotient and the
 * difference, with |2 / (e + 1)| <= 2); 0.5 x (1 + th) adds 3 roundings: |dy| <= 0.5 |x| 8u +
 * 3u |y| + the argument's 5 roundings through tanh' <= 1 (|du| <= 5u |u|, u <= 0.8 |x| (1 +
 * 0.045 x^2)). The exact form: erff within 2 units in the last place, and 3 roundings. The
 * backward expressions take a few more products of the same values: their errors are at most
 * 16u |dy| (1 + |x| + |x|^3) (twice the sum of the terms' roundings). */
static void test_gelu(pair *p, mgt_act act, int n, int row) {
    mgt_backend *g = &p->gpu;
    const size_t nx = (size_t)n * row;
    float *x = hrand(nx, -6, 6), *dy = hrand(nx, -1, 1);
    double *y = dzero(nx), *yb = dzero(nx), *d = dzero(nx), *db = dzero(nx);
    const double k = sqrt(2.0 / M_PI);
    for (size_t i = 0; i < nx; i++) {
        const double v = x[i], u = k * (v + 0.044715 * v * v * v), th = tanh(u);
        const double cdf = 0.5 * (1.0 + erf(v / sqrt(2.0)));
        if (act == MGT_ACT_GELU_TANH) {
            y[i] = 0.5 * v * (1.0 + th);
            d[i] = dy[i] * (0.5 * (1.0 + th) +
                            0.5 * v * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * v * v));
        } else {
            y[i] = v * cdf;
            d[i] = dy[i] * (cdf + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI));
        }
        yb[i] = 8.0 * U * fabs(v) * (1.0 + 0.8 * (1.0 + 0.045 * v * v)) + 4.0 * U * fabs(y[i]) +
                0x1p-40;
        db[i] = 16.0 * U * fabs((double)dy[i]) * (1.0 + fabs(v) + fabs(v * v * v)) + 0x1p-40;
    }
    float *gx = dput(g, x, nx), *gy = dnan(g, nx), *gdy = dput(g, dy, nx), *gd = dnan(g, nx);
    g->ops->act_fwd(g, act, n, row, gx, gy);
    g->ops->act_bwd(g, act, n, row, gx, gdy, gd, 0); /* the GELUs' backward reads x */
    char what[64];
    snprintf(what, sizeof what, "GELU %s fwd", act == MGT_ACT_GELU ? "exact" : "tanh");
    expect_within(what, g, gy, y, yb, nx);
    snprintf(what, sizeof what, "GELU %s bwd", act == MGT_ACT_GELU ? "exact" : "tanh");
    expect_within(what, g, gd, d, db, nx);
    /* accumulate: dx += dy GELU'(x), one more rounding of the sum */
    float *old = hrand(nx, -1, 1), *gacc = dput(g, old, nx);
    g->ops->act_bwd(g, act, n, row, gx, gdy, gacc, 1);
    for (size_t i = 0; i < nx; i++) {
        d[i] += old[i];
        db[i] += U * (fabs(d[i]) + fabs((double)old[i])) * 2.0;
    }
    expect_within("GELU bwd accumulated", g, gacc, d, db, nx);
    dfree_all();
    hfree_all();
}

/* ---- embeddings: the CPU's float additions in the CPU's order, so its bits ---- */

static void test_embed(pair *p, int n, int t, int c, int v, int with_pos) {
    mgt_backend *cb = &p->cpu, *g = &p->gpu;
    const size_t rows = (size_t)n * t;
    float *ids = hf(rows);
    for (size_t r = 0; r < rows; r++) /* few distinct tokens: many rows per table row */
        ids[r] = (float)(mgt_rand64(OPCHECK_KEY + 7, r) % (uint64_t)(v < 5 ? v : 5) * (v / 5 + 1) %
                         (uint64_t)v);
    float *wte = hrand((size_t)v * c, -1, 1), *wpe = with_pos ? hrand((size_t)t * c, -1, 1) : NULL;
    float *dy = hrand(rows * c, -1, 1), *y = hf(rows * c);
    cb->ops->embed_fwd(cb, n, t, c, v, ids, wte, wpe, y);
    float *gids = dput(g, ids, rows), *gwte = dput(g, wte, (size_t)v * c);
    float *gwpe = wpe ? dput(g, wpe, (size_t)t * c) : NULL, *gy = dnan(g, rows * c);
    g->ops->embed_fwd(g, n, t, c, v, gids, gwte, gwpe, gy);
    expect_same("embed_fwd", g, gy, y, sizeof(float) * rows * c);

    float *dwte = hf((size_t)v * c), *dwpe = hf((size_t)t * c), *gdy = dput(g, dy, rows * c);
    float *gdwte = dnan(g, (size_t)v * c), *gdwpe = wpe ? dnan(g, (size_t)t * c) : NULL;
    cb->ops->embed_bwd(cb, n, t, c, v, ids, dy, dwte, 0, wpe ? dwpe : NULL);
    g->ops->embed_bwd(g, n, t, c, v, gids, gdy, gdwte, 0, gdwpe);
    expect_same("embed_bwd dwte (rows in order, as the CPU)", g, gdwte, dwte,
                sizeof(float) * (size_t)v * c);
    if (wpe) {
        /* sums over the sequences in double, rounded once (K = 1) */
        double *e = dzero((size_t)t * c), *a = dzero((size_t)t * c);
        for (size_t r = 0; r < rows; r++)
            for (int k = 0; k < c; k++) {
                e[(r % (size_t)t) * c + k] += dy[r * c + k];
                a[(r % (size_t)t) * c + k] += fabs((double)dy[r * c + k]);
            }
        expect_bound("embed_bwd dwpe", g, gdwpe, e, a, (size_t)t * c, 1);
    }
    /* accumulate onto what the table's gradient holds (a tied head's part) */
    float *old = hrand((size_t)v * c, -1, 1), *acc = hcopy(old, (size_t)v * c);
    float *gacc = dput(g, old, (size_t)v * c);
    cb->ops->embed_bwd(cb, n, t, c, v, ids, dy, acc, 1, NULL);
    g->ops->embed_bwd(g, n, t, c, v, gids, gdy, gacc, 1, NULL);
    expect_same("embed_bwd dwte accumulated", g, gacc, acc, sizeof(float) * (size_t)v * c);
    /* n == 0: zeros */
    g->ops->embed_bwd(g, 0, t, c, v, gids, gdy, gdwte, 0, gdwpe);
    expect_same("embed_bwd n=0 dwte zeros", g, gdwte, hf((size_t)v * c),
                sizeof(float) * (size_t)v * c);
    if (wpe)
        expect_same("embed_bwd n=0 dwpe zeros", g, gdwpe, hf((size_t)t * c),
                    sizeof(float) * (size_t)t * c);
    dfree_all();
    hfree_all();
}

/* ---- layer normalisation ---- */

/* Against the exact result: the statistics are sums in double rounded once (K = 1 of |mean|,
 * and of rstd, whose double square root and quotient err far below a float's rounding); y =
 * (x - m) rs gamma + beta from them takes 4 roundings, and the rounded m and rs enter it with one
 * each: K = 6 of |x - mean| rs |gamma| + |mean| rs |gamma| + |beta|. dx: g = dy gamma, the two
 * means (double, rounded once), then rs (g - mg - xhat rs mgx) in float: K = c + 10 of rs (|g| +
 * |mg| + |xhat| |mgx|) + the statistics' own rounding through xhat (covered by the same K).
 * dgamma, dbeta: sums in double of terms formed with 3 (xhat, times dy) roundings: K = 4. */
static void test_layernorm(pair *p, int rows, int c) {
    mgt_backend *g = &p->gpu;
    const size_t n = (size_t)rows * c;
    float *x = hrand(n, -2, 3), *gm = hrand((size_t)c, 0.5f, 1.5f), *bt = hrand((size_t)c, -1, 1);
    float *dy = hrand(n, -1, 1);
    double *y = dzero(n), *ya = dzero(n), *mean = dzero((size_t)rows), *rstd = dzero((size_t)rows);
    double *ma = dzero((size_t)rows), *ra = dzero((size_t)rows);
    double *dx = dzero(n), *dxa = dzero(n), *dg = dzero((size_t)c), *dga = dzero((size_t)c);
    double *dbt = dzero((size_t)c), *dba = dzero((size_t)c);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * c, *gr = dy + (size_t)r * c;
        double s = 0, ss = 0;
        for (int k = 0; k < c; k++)
            s += xr[k];
        const double m = s / c;
        for (int k = 0; k < c; k++)
            ss += (xr[k] - m) * (xr[k] - m);
        const double rs = 1.0 / sqrt(ss / c + 1e-5);
        mean[r] = m, ma[r] = fabs(m), rstd[r] = rs, ra[r] = rs;
        double sg = 0, sgx = 0, sga = 0, sgxa = 0;
        for (int k = 0; k < c; k++) {
            const double xh = (xr[k] - m) * rs, gv = (double)gr[k] * gm[k];
            y[(size_t)r * c + k] = xh * gm[k] + bt[k];
            ya[(size_t)r * c + k] = fabs(xh * gm[k]) + fabs(m) * rs * gm[k] + fabs((double)bt[k]);
            sg += gv, sgx += gv * xh, sga += fabs(gv), sgxa += fabs(gv * xh);
            dg[k] += gr[k] * xh, dga[k] += fabs(gr[k] * xh);
            dbt[k] += gr[k], dba[k] += fabs((double)gr[k]);
        }
        for (int k = 0; k < c; k++) {
            const double xh = (xr[k] - m) * rs, gv = (double)gr[k] * gm[k];
            dx[(size_t)r * c + k] = rs * (gv - sg / c - xh * sgx / c);
            dxa[(size_t)r * c + k] =
                rs * (fabs(gv) + sga / c + (fabs(xh) + fabs(m) * rs + 1.0) * sgxa / c) +
                rs * fabs(xh) * fabs(dx[(size_t)r * c + k]);
        }
    }
    float *gx = dput(g, x, n), *ggm = dput(g, gm, (size_t)c), *gbt = dput(g, bt, (size_t)c);
    float *gy = dnan(g, n), *gmean = dnan(g, (size_t)rows), *grstd = dnan(g, (size_t)rows);
    g->ops->layernorm_fwd(g, rows, c, 1e-5f, gx, ggm, gbt, gy, gmean, grstd);
    char what[80];
    snprintf(what, sizeof what, "layernorm rows=%d c=%d: y", rows, c);
    expect_bound(what, g, gy, y, ya, n, 6);
    expect_bound("layernorm mean", g, gmean, mean, ma, (size_t)rows, 1);
    expect_bound("layernorm rstd", g, grstd, rstd, ra, (size_t)rows, 2);
    /* backward from the exact statistics rounded to float (the op reads what forward saved) */
    float *mf = hf((size_t)rows), *rf = hf((size_t)rows);
    for (int r = 0; r < rows; r++)
        mf[r] = (float)mean[r], rf[r] = (float)rstd[r];
    float *gdy = dput(g, dy, n), *gdx = dnan(g, n), *gdg = dnan(g, (size_t)c);
    float *gdb = dnan(g, (size_t)c);
    g->ops->layernorm_bwd(g, rows, c, gx, ggm, dput(g, mf, (size_t)rows), dput(g, rf, (size_t)rows),
                          gdy, gdx, gdg, gdb);
    expect_bound("layernorm dx", g, gdx, dx, dxa, n, c + 10.0);
    expect_bound("layernorm dgamma", g, gdg, dg, dga, (size_t)c, 4);
    expect_bound("layernorm dbeta", g, gdb, dbt, dba, (size_t)c, 1);
    /* dbeta alone (dgamma NULL), and n == 0 (zeros) */
    float *gdb2 = dnan(g, (size_t)c);
    g->ops->layernorm_bwd(g, rows, c, gx, ggm, dput(g, mf, (size_t)rows), dput(g, rf, (size_t)rows),
                          gdy, NULL, NULL, gdb2);
    expect_bound("layernorm dbeta (dgamma NULL)", g, gdb2, dbt, dba, (size_t)c, 1);
    g->ops->layernorm_bwd(g, 0, c, gx, ggm, gmean, grstd, gdy, NULL, gdg, gdb);
    expect_same("layernorm n=0 dgamma zeros", g, gdg, hf((size_t)c), sizeof(float) * (size_t)c);
    expect_same("layernorm n=0 dbeta zeros", g, gdb, hf((size_t)c), sizeof(float) * (size_t)c);
    dfree_all();
    hfree_all();
}

/* ---- attention ---- */

/* The bounds (each element's own, from the data): a score s = (q . k) / sqrt(d) is a float sum
 * of d products and one more product: |ds| <= gamma(d + 1) a, a = sum |q_e k_e| / sqrt(d); let
 * ds* be its largest value over the head. A weight p = e^(s - m) / l then errs by at most 2 ds*
 * (its score and the maximum's), the exponential's few units in the last place, and the sum l's
 * t roundings: relative theta = 2 ds* + gamma(t + 6). The output's sum of t weighted values adds
 * gamma(t + 1) of M = sum_j p_j |v_j|: |dy| <= (theta + gamma(t + 1)) M, doubled for margin;
 * lse = m + log l: |dlse| <= ds* + gamma(t + 4) + u |lse|, doubled.
 * Backward, from the float y and lse given (the reference uses the same): p = e^(s - lse) errs
 * by ds* + 4u relative; dP = dO . v by gamma(d) A, A = sum |dO_e v_e|; D = dO . O by gamma(d) B
 * at most (double, in fact far less); dS = p (dP keep - D) by those and 2 roundings, and the
 * sums of t terms of dS k (or dS q, p keep dO) add gamma(t + 2): each gradient element within
 * 2 (ds* + gamma(t + d + 8)) of the sum of its terms' magnitudes, formed with |dP| + A for dP
 * and |D| + B for D. */
typedef struct attn_ref {
    double *y, *yb, *lse, *lseb, *dqkv, *dqkvb;
    double *ym, *dqkvm; /* each element's sum of its terms' magnitudes (the bounds' M) */
} attn_ref;

static double attn_keep(const mgt_attn_shape *s, int b, int h, int i, int j) {
    if (!(s->rate > 0.0f))
        return 1.0;
    const uint64_t ctr =
        (((s->first_sample + (uint64_t)b) * (uint64_t)s->heads + (uint64_t)h) * (uint64_t)s->t +
         (uint64_t)i) *
            (uint64_t)s->t +
        (uint64_t)j;
    return mgt_uniform(s->key, ctr) >= s->rate ? (double)(1.0f / (1.0f - s->rate)) : 0.0;
}

/* The exact forward of qkv, then the exact backward from the float yf and lsef. */
static attn_ref attn_reference(const mgt_attn_shape *s, const float *qkv, const float *yf,
                               const float *lsef, const float *dy, int backward) {
    const int t = s->t, c = s->c, H = s->heads, d = c / H, ld = 3 * c;
    const double sc = 1.0 / sqrt((double)d);
    attn_ref r = {dzero((size_t)s->n * t * c),     dzero((size_t)s->n * t * c),
                  dzero((size_t)s->n * H * t),     dzero((size_t)s->n * H * t),
                  dzero((size_t)s->n * t * 3 * c), dzero((size_t)s->n * t * 3 * c),
                  dzero((size_t)s->n * t * c),     dzero((size_t)s->n * t * 3 * c)};
    double *S = dzero((size_t)t * t), *A = dzero((size_t)t * t), *P = dzero((size_t)t * t);
    double *dP = dzero((size_t)t * t), *Am = dzero((size_t)t * t), *dS = dzero((size_t)t * t);
    double *dSm = dzero((size_t)t * t), *Dd = dzero((size_t)t), *Bd = dzero((size_t)t);
    for (int b = 0; b < s->n; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * t * ld + (size_t)h * d, *k = q + c, *v = q + 2 * c;
            double dsmax = 0;
            for (int i = 0; i < t; i++)
                for (int j = 0; j < t; j++) {
                    double acc = 0, aa = 0;
                    for (int e = 0; e < d; e++) {
                        acc += (double)q[(size_t)i * ld + e] * k[(size_t)j * ld + e];
                        aa += fabs((double)q[(size_t)i * ld + e] * k[(size_t)j * ld + e]);
                    }
                    S[(size_t)i * t + j] = acc * sc;
                    A[(size_t)i * t + j] = aa * sc;
                    if (!s->causal || j <= i)
                        dsmax = fmax(dsmax, opcheck_gamma(d + 1) * aa * sc);
                }
            const double theta = 2 * dsmax + opcheck_gamma(t + 6);
            for (int i = 0; i < t; i++) {
                const int nk = s->causal ? i + 1 : t;
                double m = -INFINITY, l = 0;
                for (int j = 0; j < nk; j++)
                    m = fmax(m, S[(size_t)i * t + j]);
                for (int j = 0; j < nk; j++)
                    l += exp(S[(size_t)i * t + j] - m);
                const double lse = m + log(l);
                const size_t li = ((size_t)b * H + h) * t + i;
                r.lse[li] = lse;
                r.lseb[li] = 2 * (dsmax + opcheck_gamma(t + 4) + U * fabs(lse)) + 0x1p-40;
                for (int e = 0; e < d; e++) {
                    double acc = 0, mag = 0;
                    for (int j = 0; j < nk; j++) {
                        const double w = exp(S[(size_t)i * t + j] - lse) * attn_keep(s, b, h, i, j);
                        acc += w * v[(size_t)j * ld + e];
                        mag += fabs(w * v[(size_t)j * ld + e]);
                    }
                    const size_t at = ((size_t)b * t + i) * c + (size_t)h * d + e;
                    r.y[at] = acc;
                    r.ym[at] = mag;
                    r.yb[at] = 2 * (theta + opcheck_gamma(t + 1)) * mag + 0x1p-40;
                }
            }
            if (!backward)
                continue;
            const float *O = yf + (size_t)b * t * c + (size_t)h * d;
            const float *G = dy + (size_t)b * t * c + (size_t)h * d;
            const double kb = 2 * (dsmax + opcheck_gamma(t + d + 8));
            for (int i = 0; i < t; i++) {
                double D = 0, B = 0;
                for (int e = 0; e < d; e++) {
                    D += (double)G[(size_t)i * c + e] * O[(size_t)i * c + e];
                    B += fabs((double)G[(size_t)i * c + e] * O[(size_t)i * c + e]);
                }
                Dd[i] = D, Bd[i] = B;
                const double L = lsef[((size_t)b * H + h) * t + i];
                for (int j = 0; j < t; j++) {
                    const size_t ij = (size_t)i * t + j;
                    if (s->causal && j > i) {
                        P[ij] = dP[ij] = dS[ij] = dSm[ij] = Am[ij] = 0;
                        continue;
                    }
                    double g = 0, ga = 0;
                    for (int e = 0; e < d; e++) {
                        g += (double)G[(size_t)i * c + e] * v[(size_t)j * ld + e];
                        ga += fabs((double)G[(size_t)i * c + e] * v[(size_t)j * ld + e]);
                    }
                    const double keep = attn_keep(s, b, h, i, j);
                    P[ij] = exp(S[ij] - L);
                    dP[ij] = g;
                    Am[ij] = ga;
                    dS[ij] = P[ij] * (g * keep - D);
                    dSm[ij] = P[ij] * ((fabs(g) + ga) * keep + fabs(D) + B);
                    P[ij] *= keep;
                }
            }
            double *dq = r.dqkv + (size_t)b * t * ld + (size_t)h * d, *dk = dq + c,
                   *dv = dq + 2 * c;
            double *bq = r.dqkvb + (size_t)b * t * ld + (size_t)h * d, *bk = bq + c,
                   *bv = bq + 2 * c;
            double *Mq = r.dqkvm + (size_t)b * t * ld + (size_t)h * d, *Mk = Mq + c,
                   *Mv = Mq + 2 * c;
            for (int i = 0; i < t; i++)
                for (int e = 0; e < d; e++) {
                    double aq = 0, mq = 0, ak = 0, mk = 0, av = 0, mv = 0;
                    for (int j = 0; j < t; j++) {
                        const size_t ij = (size_t)i * t + j, ji = (size_t)j * t + i;
                        aq += dS[ij] * k[(size_t)j * ld + e];
                        mq += dSm[ij] * fabs((double)k[(size_t)j * ld + e]);
                        ak += dS[ji] * q[(size_t)j * ld + e];
                        mk += dSm[ji] * fabs((double)q[(size_t)j * ld + e]);
                        av += P[ji] * G[(size_t)j * c + e];
                        mv += fabs(P[ji] * G[(size_t)j * c + e]);
                    }
                    const size_t at = (size_t)i * ld + e;
                    dq[at] = aq * sc, bq[at] = kb * mq * sc + 0x1p-40;
                    dk[at] = ak * sc, bk[at] = kb * mk * sc + 0x1p-40;
                    dv[at] = av, bv[at] = kb * mv + 0x1p-40;
                    Mq[at] = mq * sc, Mk[at] = mk * sc, Mv[at] = mv;
                }
        }
    return r;
}

static void test_attn(pair *p, int n, int t, int c, int heads, int causal, float rate) {
    mgt_backend *g = &p->gpu;
    mgt_attn_shape s = {.n = n, .t = t, .c = c, .heads = heads, .causal = causal, .rate = rate};
    if (rate > 0) {
        s.key = 0x5eed1234ULL;
        s.first_sample = 7;
    }
    const size_t nq = (size_t)n * t * 3 * c, ny = (size_t)n * t * c, nl = (size_t)n * heads * t;
    float *qkv = hrand(nq, -1.5f, 1.5f), *dy = hrand(ny, -1, 1);
    const attn_ref f = attn_reference(&s, qkv, NULL, NULL, NULL, 0);
    float *gq = dput(g, qkv, nq), *gy = dnan(g, ny), *gl = dnan(g, nl);
    g->ops->attn_fwd(g, &s, gq, gy, gl);
    char what[128];
    snprintf(what, sizeof what, "attention n=%d t=%d c=%d heads=%d causal=%d dropout=%g: y", n, t,
             c, heads, causal, (double)rate);
    expect_within(what, g, gy, f.y, f.yb, ny);
    expect_within("attention lse", g, gl, f.lse, f.lseb, nl);
    /* backward from the exact y and lse rounded to float */
    float *yf = hf(ny), *lf = hf(nl);
    for (size_t i = 0; i < ny; i++)
        yf[i] = (float)f.y[i];
    for (size_t i = 0; i < nl; i++)
        lf[i] = (float)f.lse[i];
    const attn_ref r = attn_reference(&s, qkv, yf, lf, dy, 1);
    float *gd = dnan(g, nq);
    g->ops->attn_bwd(g, &s, gq, dput(g, yf, ny), dput(g, lf, nl), dput(g, dy, ny), gd);
    expect_within("attention dqkv", g, gd, r.dqkv, r.dqkvb, nq);
    dfree_all();
    hfree_all();
}

/* Attention through cuDNN's fused graph (gpu_sdpa.c): bfloat16 activations, no dropout, forced
 * with MGT_GPU_ATTENTION=cudnn (a shape it refuses would end the test). Against the exact result
 * of the same bfloat16 inputs (the backward from the bfloat16 y the forward stored, and its lse),
 * within the float bounds of attn_reference plus what bfloat16 adds: each output rounded once
 * (u = 2^-8 of |exact|), and each of its terms through one bfloat16 operand more than the own
 * kernels' (P before P V and P^T dO, dS before dS^T Q: u of the sum of the terms' magnitudes M),
 * doubled for margin. Then the same call on the own kernels (MGT_GPU_ATTENTION=own) must meet
 * the float bound plus one rounding of the output. */
static void bf16_bounds(double *bound, const double *fb, const double *ref, const double *mag,
                        size_t n, int fused) {
    for (size_t i = 0; i < n; i++)
        bound[i] = fb[i] + 0x1p-7 * fabs(ref[i]) + (fused ? 0x1p-7 * mag[i] : 0.0);
}

static void test_sdpa(int n, int t, int c, int heads, int causal, const char *mode, int fused) {
    setenv("MGT_GPU_ATTENTION", mode, 1);
    pair p;
    pair_init(&p, MGT_GPU_BF16);
    mgt_backend *g = &p.gpu;
    mgt_attn_shape s = {.n = n, .t = t, .c = c, .heads = heads, .causal = causal};
    const size_t nq = (size_t)n * t * 3 * c, ny = (size_t)n * t * c, nl = (size_t)n * heads * t;
    /* the scratch the layer reserves (the plans are built here): some for cuDNN's path exactly
     * when it runs the shape */
    CHECK((mgt_gpu_sdpa_scratch(g, &s) > 0) == fused, "MGT_GPU_ATTENTION=%s: cuDNN's path %s", mode,
          fused ? "runs" : "does not run");
    CHECK(g->ops->reserve(g, g->ops->attn_scratch(g, &s)) == 0, "attention scratch reserved");
    float *qkv = bf16_copy(hrand(nq, -1.5f, 1.5f), nq), *dy = bf16_copy(hrand(ny, -1, 1), ny);
    const attn_ref f = attn_reference(&s, qkv, NULL, NULL, NULL, 0);
    float *gq = act_put(g, qkv, nq), *gy = act_nan(g, ny), *gl = dnan(g, nl);
    g->ops->attn_fwd(g, &s, gq, gy, gl);
    char what[160];
    snprintf(what, sizeof what, "attention (%s) n=%d t=%d c=%d heads=%d causal=%d: y", mode, n, t,
             c, heads, causal);
    double *yb = dzero(ny), *db = dzero(nq);
    bf16_bounds(yb, f.yb, f.y, f.ym, ny, fused);
    float *y16 = act_get(g, gy, ny), *l = dget(g, gl, nl);
    expect_host_within(what, y16, f.y, yb, ny);
    expect_host_within("attention lse", l, f.lse, f.lseb, nl);
    const attn_ref r = attn_reference(&s, qkv, y16, l, dy, 1);
    float *gd = act_nan(g, nq);
    g->ops->attn_bwd(g, &s, gq, gy, gl, act_put(g, dy, ny), gd);
    bf16_bounds(db, r.dqkvb, r.dqkv, r.dqkvm, nq, fused);
    snprintf(what, sizeof what, "attention (%s) n=%d t=%d c=%d heads=%d causal=%d: dqkv", mode, n,
             t, c, heads, causal);
    expect_host_within(what, act_get(g, gd, nq), r.dqkv, db, nq);
    dfree_all();
    hfree_all();
    pair_free(&p);
    unsetenv("MGT_GPU_ATTENTION");
}

/* Generation: the query of position pos against the cache of positions 0 .. pos, which is
 * forward's causal attention of row pos (its bound). */
static void test_decode(pair *p, int t, int c, int heads, int pos) {
    mgt_backend *g = &p->gpu;
    mgt_attn_shape s = {.n = 1, .t = t, .c = c, .heads = heads, .causal = 1};
    float *qkv = hrand((size_t)t * 3 * c, -1.5f, 1.5f);
    const attn_ref f = attn_reference(&s, qkv, NULL, NULL, NULL, 0);
    float *q = hf((size_t)c), *kc = hf((size_t)t * c), *vc = hf((size_t)t * c);
    memcpy(q, qkv + (size_t)pos * 3 * c, sizeof(float) * (size_t)c);
    for (int j = 0; j < t; j++) {
        memcpy(kc + (size_t)j * c, qkv + (size_t)j * 3 * c + c, sizeof(float) * (size_t)c);
        memcpy(vc + (size_t)j * c, qkv + (size_t)j * 3 * c + 2 * c, sizeof(float) * (size_t)c);
    }
    float *gy = dnan(g, (size_t)c);
    g->ops->attn_decode(g, c, heads, pos, dput(g, q, (size_t)c), dput(g, kc, (size_t)t * c),
                        dput(g, vc, (size_t)t * c), gy);
    char what[80];
    snprintf(what, sizeof what, "attn_decode c=%d heads=%d position %d", c, heads, pos);
    expect_within(what, g, gy, f.y + (size_t)pos * c, f.yb + (size_t)pos * c, (size_t)c);
    dfree_all();
    hfree_all();
}

/* ---- --precision bf16: the activations bfloat16, every op's arithmetic float ----
 * Each op on bfloat16 activations against the float backend's same op on the same values (the
 * inputs rounded to bfloat16 first): the kernels are the same code on widened values (exact), so
 * an activation it stores is the float result rounded once to bfloat16, and a float output
 * (log-sum-exp, statistics, parameter gradients) is the float result itself. The bounds allow
 * for a compiler contracting a product and a sum differently in the two instantiations (one
 * float rounding, 2^-24 of the operands, which can move a value across a bfloat16 rounding
 * boundary): an activation within 2^-8 of the float result relative (one bfloat16 unit, twice
 * the 2^-9 of a rounding), a float output within 2^-20 of the largest float result (a few units
 * of float through the op's sums). The products (cuBLAS on bfloat16, float accumulation in an
 * order of its own) are held to the exact result as test_gpu_ops.c holds dense layers: the
 * tensor cores' gamma(2K) and one rounding to bfloat16. */




/* The bf16 backend's activations (device) against the float backend's results (device). */
static void expect_act16(const char *what, mgt_backend *b, const float *dev, mgt_backend *f,
                         const float *ref_dev, size_t n) {
    const float *a = act_get(b, dev, n), *r = dget(f, ref_dev, n);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - r[i]), bound = 0x1p-7 * fabs((double)r[i]);
        const double q = !isfinite(a[i]) ? INFINITY
                         : d == 0.0      ? 0.0
                         : bound > 0     ? d / bound
                                         : INFINITY;
        worst = q > worst ? q : worst;
    }
    CHECK(worst <= 1.0, "bf16 %s: %.3g times one bfloat16 unit from the float result (%zu values)",
          what, worst, n);
}

/* Float outputs of the bf16 backend against the float backend's. */
static void expect_f32(const char *what, mgt_backend *b, const float *dev, mgt_backend *f,
                       const float *ref_dev, size_t n) {
    const float *a = dget(b, dev, n), *r = dget(f, ref_dev, n);
    double mx = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs((double)r[i]));
    for (size_t i = 0; i < n; i++) {
        const double d = !isfinite(a[i]) ? INFINITY : fabs((double)a[i] - r[i]);
        worst = fmax(worst, d);
    }
    CHECK(worst <= 0x1p-20 * mx, "bf16 %s: differs by %.3g, over 2^-20 of %.3g (%zu values)", what,
          worst, mx, n);
}

static void test_bf16(pair *p, pair *pb) {
    mgt_backend *f = &p->gpu, *b = &pb->gpu;
    CHECK(b->act == MGT_BF16, "the second backend's activations are bfloat16");
    /* embeddings and their gradients */
    {
        const int n = 3, t = 11, c = 24, v = 50;
        const size_t rows = (size_t)n * t;
        float *ids = hf(rows);
        for (size_t r = 0; r < rows; r++)
            ids[r] = (float)(mgt_rand64(OPCHECK_KEY + 9, r) % 7 * 7 % (uint64_t)v);
        float *wte = hrand((size_t)v * c, -1, 1), *wpe = hrand((size_t)t * c, -1, 1);
        float *dy = bf16_copy(hrand(rows * c, -1, 1), rows * c);
        float *fi = dput(f, ids, rows), *bi = dput(b, ids, rows);
        float *fy = dnan(f, rows * c), *by = act_nan(b, rows * c);
        f->ops->embed_fwd(f, n, t, c, v, fi, dput(f, wte, (size_t)v * c),
                          dput(f, wpe, (size_t)t * c), fy);
        b->ops->embed_fwd(b, n, t, c, v, bi, dput(b, wte, (size_t)v * c),
                          dput(b, wpe, (size_t)t * c), by);
        expect_act16("embed_fwd", b, by, f, fy, rows * c);
        float *fw = dnan(f, (size_t)v * c), *bw = dnan(b, (size_t)v * c);
        float *fp = dnan(f, (size_t)t * c), *bp = dnan(b, (size_t)t * c);
        f->ops->embed_bwd(f, n, t, c, v, fi, dput(f, dy, rows * c), fw, 0, fp);
        b->ops->embed_bwd(b, n, t, c, v, bi, act_put(b, dy, rows * c), bw, 0, bp);
        expect_f32("embed_bwd dwte", b, bw, f, fw, (size_t)v * c);
        expect_f32("embed_bwd dwpe", b, bp, f, fp, (size_t)t * c);
    }
    /* layer norm */
    {
        const int rows = 19, c = 48;
        const size_t nn = (size_t)rows * c;
        float *x = bf16_copy(hrand(nn, -2, 3), nn), *dy = bf16_copy(hrand(nn, -1, 1), nn);
        float *gm = hrand((size_t)c, 0.5f, 1.5f), *bt = hrand((size_t)c, -1, 1);
        float *fx = dput(f, x, nn), *bx = act_put(b, x, nn);
        float *fg = dput(f, gm, (size_t)c), *bg = dput(b, gm, (size_t)c);
        float *fb = dput(f, bt, (size_t)c), *bb = dput(b, bt, (size_t)c);
        float *fy = dnan(f, nn), *by = act_nan(b, nn);
        float *fm = dnan(f, (size_t)rows), *bm = dnan(b, (size_t)rows);
        float *fr = dnan(f, (size_t)rows), *br = dnan(b, (size_t)rows);
        f->ops->layernorm_fwd(f, rows, c, 1e-5f, fx, fg, fb, fy, fm, fr);
        b->ops->layernorm_fwd(b, rows, c, 1e-5f, bx, bg, bb, by, bm, br);
        expect_act16("layernorm y", b, by, f, fy, nn);
        expect_f32("layernorm mean", b, bm, f, fm, (size_t)rows);
        expect_f32("layernorm rstd", b, br, f, fr, (size_t)rows);
        float *fdx = dnan(f, nn), *bdx = act_nan(b, nn);
        float *fdg = dnan(f, (size_t)c), *bdg = dnan(b, (size_t)c);
        float *fdb = dnan(f, (size_t)c), *bdb = dnan(b, (size_t)c);
        /* from the same statistics: the float backend's */
        float *m = dget(f, fm, (size_t)rows), *r = dget(f, fr, (size_t)rows);
        f->ops->layernorm_bwd(f, rows, c, fx, fg, fm, fr, dput(f, dy, nn), fdx, fdg, fdb);
        b->ops->layernorm_bwd(b, rows, c, bx, bg, dput(b, m, (size_t)rows),
                              dput(b, r, (size_t)rows), act_put(b, dy, nn), bdx, bdg, bdb);
        expect_act16("layernorm dx", b, bdx, f, fdx, nn);
        expect_f32("layernorm dgamma", b, bdg, f, fdg, (size_t)c);
        expect_f32("layernorm dbeta", b, bdb, f, fdb, (size_t)c);
    }
    /* the GELU */
    {
        const size_t nn = 7 * 129;
        float *x = bf16_copy(hrand(nn, -6, 6), nn), *dy = bf16_copy(hrand(nn, -1, 1), nn);
        float *fy = dnan(f, nn), *by = act_nan(b, nn), *fd = dnan(f, nn), *bd = act_nan(b, nn);
        float *fx = dput(f, x, nn), *bx = act_put(b, x, nn);
        f->ops->act_fwd(f, MGT_ACT_GELU_TANH, 7, 129, fx, fy);
        b->ops->act_fwd(b, MGT_ACT_GELU_TANH, 7, 129, bx, by);
        expect_act16("GELU tanh fwd", b, by, f, fy, nn);
        f->ops->act_bwd(f, MGT_ACT_GELU_TANH, 7, 129, fx, dput(f, dy, nn), fd, 0);
        b->ops->act_bwd(b, MGT_ACT_GELU_TANH, 7, 129, bx, act_put(b, dy, nn), bd, 0);
        expect_act16("GELU tanh bwd", b, bd, f, fd, nn);
    }
    /* attention, with dropout, and generation */
    {
        mgt_attn_shape s = {.n = 2,
                            .t = 37,
                            .c = 80,
                            .heads = 2,
                            .causal = 1,
                            .rate = 0.2f,
                            .key = 77,
                            .first_sample = 3};
        const size_t nq = (size_t)s.n * s.t * 3 * s.c, ny = (size_t)s.n * s.t * s.c;
        const size_t nl = (size_t)s.n * s.heads * s.t;
        float *qkv = bf16_copy(hrand(nq, -1.5f, 1.5f), nq), *dy = bf16_copy(hrand(ny, -1, 1), ny);
        float *fq = dput(f, qkv, nq), *bq = act_put(b, qkv, nq);
        float *fy = dnan(f, ny), *by = act_nan(b, ny), *fl = dnan(f, nl), *bl = dnan(b, nl);
        f->ops->attn_fwd(f, &s, fq, fy, fl);
        b->ops->attn_fwd(b, &s, bq, by, bl);
        expect_act16("attention y", b, by, f, fy, ny);
        expect_f32("attention lse", b, bl, f, fl, nl);
        /* backward from the bf16 forward's y (as the bf16 model keeps it) and its lse */
        float *y16 = act_get(b, by, ny), *l = dget(b, bl, nl);
        float *fd = dnan(f, nq), *bd = act_nan(b, nq);
        f->ops->attn_bwd(f, &s, fq, dput(f, y16, ny), dput(f, l, nl), dput(f, dy, ny), fd);
        b->ops->attn_bwd(b, &s, bq, by, bl, act_put(b, dy, ny), bd);
        expect_act16("attention dqkv", b, bd, f, fd, nq);
        /* generation: position 20's query against the cache of positions 0 .. 20 */
        const int pos = 20, c = s.c;
        float *q = hcopy(qkv + (size_t)pos * 3 * c, (size_t)c);
        float *kc = hf((size_t)s.t * c), *vc = hf((size_t)s.t * c);
        for (int j = 0; j < s.t; j++) {
            memcpy(kc + (size_t)j * c, qkv + ((size_t)j * 3 + 1) * c, sizeof(float) * (size_t)c);
            memcpy(vc + (size_t)j * c, qkv + ((size_t)j * 3 + 2) * c, sizeof(float) * (size_t)c);
        }
        float *fo = dnan(f, (size_t)c), *bo = act_nan(b, (size_t)c);
        f->ops->attn_decode(f, c, s.heads, pos, dput(f, q, (size_t)c), dput(f, kc, (size_t)s.t * c),
                            dput(f, vc, (size_t)s.t * c), fo);
        b->ops->attn_decode(b, c, s.heads, pos, act_put(b, q, (size_t)c),
                            act_put(b, kc, (size_t)s.t * c), act_put(b, vc, (size_t)s.t * c), bo);
        expect_act16("attn_decode", b, bo, f, fo, (size_t)c);
    }
    /* dense with [in][out] weights: against the exact product of the rounded inputs */
    {
        const int n = 37, in = 24, out = 29;
        float *x = bf16_copy(hrand((size_t)n * in, -1, 1), (size_t)n * in);
        float *w = hrand((size_t)in * out, -1, 1), *wr = bf16_copy(w, (size_t)in * out);
        float *bias = hrand((size_t)out, -1, 1);
        float *dy = bf16_copy(hrand((size_t)n * out, -1, 1), (size_t)n * out);
        double *y = dzero((size_t)n * out), *ya = dzero((size_t)n * out);
        double *dx = dzero((size_t)n * in), *dxa = dzero((size_t)n * in);
        double *dw = dzero((size_t)in * out), *dwa = dzero((size_t)in * out);
        for (int i = 0; i < n; i++)
            for (int o = 0; o < out; o++) {
                /* the bias enters as written into the bfloat16 rows before the product */
                const double bo = bf16_round(bias[o]), gy = dy[(size_t)i * out + o];
                double acc = bo, aa = fabs(bo);
                for (int j = 0; j < in; j++) {
                    const double xv = x[(size_t)i * in + j], wv = wr[(size_t)j * out + o];
                    acc += xv * wv, aa += fabs(xv * wv);
                    dx[(size_t)i * in + j] += gy * wv, dxa[(size_t)i * in + j] += fabs(gy * wv);
                    dw[(size_t)j * out + o] += xv * gy, dwa[(size_t)j * out + o] += fabs(xv * gy);
                }
                y[(size_t)i * out + o] = acc, ya[(size_t)i * out + o] = aa;
            }
        float *by = act_nan(b, (size_t)n * out), *bdx = act_nan(b, (size_t)n * in);
        float *bdw = dnan(b, (size_t)in * out), *bx = act_put(b, x, (size_t)n * in);
        float *bw = dput(b, w, (size_t)in * out);
        b->ops->dense_io_fwd(b, n, in, out, MGT_ACT_NONE, bx, bw, dput(b, bias, (size_t)out), by,
                             by);
        b->ops->dense_io_bwd(b, n, in, out, bx, bw, act_put(b, dy, (size_t)n * out), bdx, bdw,
                             NULL);
        const struct {
            const char *what;
            const float *got;
            const double *ref, *abs;
            size_t n;
            double k;
            int act;
        } cases[] = {{"dense_io y", by, y, ya, (size_t)n * out, 2.0 * (in + 1), 1},
                     {"dense_io dx", bdx, dx, dxa, (size_t)n * in, 2.0 * out, 1},
                     {"dense_io dW", bdw, dw, dwa, (size_t)in * out, 2.0 * n, 0}};
        for (int k = 0; k < 3; k++) {
            const float *a = cases[k].act ? act_get(b, cases[k].got, cases[k].n)
                                          : dget(b, cases[k].got, cases[k].n);
            const double gk = opcheck_gamma(cases[k].k);
            double worst = 0;
            for (size_t i = 0; i < cases[k].n; i++) {
                const double d = fabs((double)a[i] - cases[k].ref[i]);
                const double bd =
                    (gk + (cases[k].act ? 0x1p-7 * (1.0 + gk) : 0.0)) * cases[k].abs[i] + 0x1p-40;
                worst = fmax(worst, !isfinite(a[i]) ? INFINITY : d / bd);
            }
            CHECK(worst <= 1.0, "bf16 %s: error %.3g times its bound (%zu values)", cases[k].what,
                  worst, cases[k].n);
        }
    }
    dfree_all();
    hfree_all();
}

int main(void) {
    require_gpu();
    pair p;
    pair_init(&p, 0);
    CHECK(p.gpu.ops->gelu && p.gpu.ops->dense_io_fwd && p.gpu.ops->embed_fwd &&
              p.gpu.ops->layernorm_fwd && p.gpu.ops->attn_fwd && p.gpu.ops->attn_decode,
          "the GPU backend has the sequence ops");

    test_dense_io(&p, 37, 24, 29, 1);
    test_dense_io(&p, 5, 16, 48, 0);
    test_gelu(&p, MGT_ACT_GELU_TANH, 7, 129);
    test_gelu(&p, MGT_ACT_GELU, 7, 129);
    test_embed(&p, 3, 11, 24, 50, 1);
    test_embed(&p, 2, 5, 7, 3, 0);
    test_layernorm(&p, 19, 48);
    test_layernorm(&p, 3, 100);
    /* heads of 8 channels (one accumulator a lane, most lanes idle) and of 40 (two); 37 and 70
     * positions: a partial chunk of 32 keys, and three chunks */
    test_attn(&p, 2, 37, 16, 2, 1, 0.0f);
    test_attn(&p, 1, 70, 80, 2, 1, 0.0f);
    test_attn(&p, 2, 19, 16, 2, 0, 0.0f);
    test_attn(&p, 2, 37, 16, 2, 1, 0.25f);
    test_decode(&p, 40, 80, 2, 0);
    test_decode(&p, 40, 80, 2, 39);
    pair pb;
    pair_init(&pb, MGT_GPU_BF16);
    test_bf16(&p, &pb);
    pair_free(&pb);
    /* cuDNN's fused attention, and the own kernels on the same bfloat16 data: heads of 16 and 32
     * channels, 37 positions (no multiple of a tile), causal and not */
    test_sdpa(2, 37, 32, 2, 1, "own", 0);
    test_sdpa(2, 37, 32, 2, 1, "cudnn", 1);
    test_sdpa(1, 21, 64, 2, 0, "cudnn", 1);
    test_sdpa(1, 21, 64, 2, 1, "auto", 1);
#ifndef MGT_EMU_TEST
    /* a real GPU: GPT-2's heads (64 channels) at 1,024 positions, where cuDNN picks the engines
     * a model trains with (the emulated stack takes 13 s more for these two) */
    test_sdpa(1, 1024, 128, 2, 1, "cudnn", 1);
    test_sdpa(1, 1024, 128, 2, 1, "own", 0);
#else
    /* the emulated stack: a first engine configuration whose plan fails (the next is taken), and
     * a library with no engine for the graph (the own kernels run it, with a notice) */
    setenv("MGT_EMU_CUDNN_STALE", "all", 1);
    test_sdpa(1, 21, 64, 2, 1, "auto", 1);
    unsetenv("MGT_EMU_CUDNN_STALE");
    setenv("MGT_EMU_CUDNN_NO_ENGINE", "1", 1);
    test_sdpa(1, 21, 64, 2, 1, "auto", 0);
    unsetenv("MGT_EMU_CUDNN_NO_ENGINE");
#endif
    pair_free(&p);
    return finish("test_gpu_seq");
}
