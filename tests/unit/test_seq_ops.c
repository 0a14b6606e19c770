/* test_seq_ops.c: the CPU backend's sequence ops against independent references in double
 * precision, with tolerances from rounding-error analysis (opcheck.h: bound_ratio, gamma(k) times
 * the expression on absolute values), their backward passes also against central finite
 * differences (fdcheck.h), and each op on two lanes against one lane bit for bit (the results
 * must not depend on the number of threads).
 *
 *   dense_io_fwd / dense_io_bwd   [in][out] weights: y = x W + b, dx, dW, db, and with a GELU
 *   act_fwd / act_bwd GELU        exact and tanh forms
 *   embed_fwd / embed_bwd         token + position embeddings, dwte written or added to
 *   layernorm_fwd / layernorm_bwd mean and 1/std saved, dx, dgamma, dbeta
 *   attn_fwd / attn_bwd           causal and full, several heads, t not a multiple of the
 *                                 64-position blocks, with and without dropout
 *   xent_sparse's scale           the gradient and the sums of a sequence's mean loss
 *   xent_sparse over a vocabulary rows in blocks on the lanes, k not a multiple of 8 */
#define OPCHECK_KEY 0x5345514f5053ULL /* "SEQOPS" */
#include "fdcheck.h"
#include "opcheck.h"

#include <string.h>

#include "optim.h"

static mgt_backend be1, be2; /* one lane, two lanes */

/* The largest scratch the ops below ask for. */
static void reserve_both(size_t bytes) {
    be1.ops->reserve(&be1, bytes);
    be2.ops->reserve(&be2, bytes);
}

static double *dbuf(size_t n) {
    return tmp_alloc(n * sizeof(double), 0);
}

static int same_bits(const float *a, const float *b, size_t n) {
    return !memcmp(a, b, n * sizeof(float));
}

/* ---- dense with [in][out] weights ---- */

static void test_dense_io(int n, int in, int out, mgt_act act) {
    float *x = fbuf((size_t)n * in), *w = fbuf((size_t)in * out), *b = fbuf((size_t)out);
    float *pre = fbuf((size_t)n * out), *y = fbuf((size_t)n * out), *y2 = fbuf((size_t)n * out);
    float *pre2 = fbuf((size_t)n * out);
    fill(x, (size_t)n * in, -1, 1);
    fill(w, (size_t)in * out, -1, 1);
    fill(b, (size_t)out, -1, 1);
    be1.ops->dense_io_fwd(&be1, n, in, out, act, x, w, b, pre, y);
    be2.ops->dense_io_fwd(&be2, n, in, out, act, x, w, b, pre2, y2);
    CHECK(same_bits(y, y2, (size_t)n * out), "dense_io_fwd %dx%dx%d: 2 lanes differ from 1", n, in,
          out);
    /* pre: a sum of in products and the bias, at most in + 1 roundings */
    double *ref = dbuf((size_t)n * out), *abs_ = dbuf((size_t)n * out);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = b[o], a = fabs(b[o]);
            for (int k = 0; k < in; k++) {
                s += (double)x[i * in + k] * w[k * out + o];
                a += fabs((double)x[i * in + k] * w[k * out + o]);
            }
            ref[i * out + o] = s;
            abs_[i * out + o] = a;
        }
    const float *z = act == MGT_ACT_NONE ? y : pre;
    double r = bound_ratio(z, ref, abs_, (size_t)n * out, in + 1);
    CHECK(r <= 1, "dense_io_fwd %dx%dx%d: product off by %.3g of its rounding bound", n, in, out,
          r);
    if (act != MGT_ACT_NONE) { /* the GELU of the product as act_fwd gives it */
        float *g = fbuf((size_t)n * out);
        be1.ops->act_fwd(&be1, act, n, out, pre, g);
        CHECK(same_bits(g, y, (size_t)n * out), "dense_io_fwd: its GELU is not act_fwd's");
    }
    /* backward: dx = dy W^T (out terms), dW = x^T dy (n terms), db = column sums (double) */
    float *dy = fbuf((size_t)n * out), *dx = fbuf((size_t)n * in), *dw = fbuf((size_t)in * out);
    float *db = fbuf((size_t)out), *dx2 = fbuf((size_t)n * in), *dw2 = fbuf((size_t)in * out);
    float *db2 = fbuf((size_t)out);
    fill(dy, (size_t)n * out, -1, 1);
    be1.ops->dense_io_bwd(&be1, n, in, out, x, w, dy, dx, dw, db);
    be2.ops->dense_io_bwd(&be2, n, in, out, x, w, dy, dx2, dw2, db2);
    CHECK(same_bits(dx, dx2, (size_t)n * in) && same_bits(dw, dw2, (size_t)in * out) &&
              same_bits(db, db2, (size_t)out),
          "dense_io_bwd %dx%dx%d: 2 lanes differ from 1", n, in, out);
    double *rx = dbuf((size_t)n * in), *ax = dbuf((size_t)n * in);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < in; k++) {
            double s = 0, a = 0;
            for (int o = 0; o < out; o++) {
                s += (double)dy[i * out + o] * w[k * out + o];
                a += fabs((double)dy[i * out + o] * w[k * out + o]);
            }
            rx[i * in + k] = s;
            ax[i * in + k] = a;
        }
    r = bound_ratio(dx, rx, ax, (size_t)n * in, out);
    CHECK(r <= 1, "dense_io_bwd dx: off by %.3g of its rounding bound", r);
    double *rw = dbuf((size_t)in * out), *aw = dbuf((size_t)in * out);
    for (int k = 0; k < in; k++)
        for (int o = 0; o < out; o++) {
            double s = 0, a = 0;
            for (int i = 0; i < n; i++) {
                s += (double)x[i * in + k] * dy[i * out + o];
                a += fabs((double)x[i * in + k] * dy[i * out + o]);
            }
            rw[k * out + o] = s;
            aw[k * out + o] = a;
        }
    r = bound_ratio(dw, rw, aw, (size_t)in * out, n);
    CHECK(r <= 1, "dense_io_bwd dW: off by %.3g of its rounding bound", r);
    double *rb = dbuf((size_t)out), *ab = dbuf((size_t)out);
    for (int o = 0; o < out; o++) {
        rb[o] = ab[o] = 0;
        for (int i = 0; i < n; i++)
            rb[o] += dy[i * out + o], ab[o] += fabs(dy[i * out + o]);
    }
    r = bound_ratio(db, rb, ab, (size_t)out, 1); /* summed in double, rounded once */
    CHECK(r <= 1, "dense_io_bwd db: off by %.3g of its rounding bound", r);
}

/* ---- GELU ---- */

static void test_gelu(mgt_act act) {
    enum { N = 4099 };
    float *x = fbuf(N), *y = fbuf(N), *dy = fbuf(N), *dx = fbuf(N), *y2 = fbuf(N);
    fill(x, N, -6, 6);
    fill(dy, N, -1, 1);
    be1.ops->act_fwd(&be1, act, 1, N, x, y);
    be2.ops->act_fwd(&be2, act, 1, N, x, y2);
    CHECK(same_bits(y, y2, N), "gelu %d: 2 lanes differ from 1", act);
    be1.ops->act_bwd(&be1, act, 1, N, x, dy, dx, 0);
    double *ry = dbuf(N), *ay = dbuf(N), *rg = dbuf(N), *ag = dbuf(N);
    const double k = 0.7978845608028654, a = 0.044715;
    for (int i = 0; i < N; i++) {
        const double v = x[i];
        double f, d, af, ad;
        if (act == MGT_ACT_GELU) {
            const double phi = 0.5 * (1 + erf(v / sqrt(2.0)));
            const double dens = exp(-0.5 * v * v) / sqrt(6.283185307179586);
            f = v * phi;
            d = phi + v * dens;
            af = fabs(v) * (phi + 1);      /* 0.5 |x| (1 + |erf|) + erff's error on 0.5 |x| */
            ad = phi + 1 + fabs(v) * dens; /* the same on the derivative's terms */
        } else {
            const double u = k * (v + a * v * v * v), t = tanh(u);
            f = 0.5 * v * (1 + t);
            d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * a * v * v);
            /* tanhf's error enters scaled by 0.5 |x| (forward) and by the derivative's terms,
             * and the argument's rounding by |x| (1 - t^2) k |x + a x^3| */
            af = fabs(v) * (1 + fabs(t)) + fabs(v) * (1 - t * t) * fabs(u);
            ad = 1 + fabs(t) + fabs(v) * (1 + t * t) * k * (1 + 3 * a * v * v) * (1 + fabs(u));
        }
        ry[i] = f;
        ay[i] = af;
        rg[i] = d * dy[i];
        ag[i] = ad * fabs(dy[i]);
    }
    /* a handful of roundings per element, erff and expf within 2 ulp (glibc's bounds), and
     * the tanh form's exponential within 2 ulp too (mgt_cpu_exp8, cpu_internal.h): k = 12 covers
     * them */
    double r = bound_ratio(y, ry, ay, N, 12);
    CHECK(r <= 1, "gelu %d forward: off by %.3g of its rounding bound", act, r);
    r = bound_ratio(dx, rg, ag, N, 16);
    CHECK(r <= 1, "gelu %d backward: off by %.3g of its rounding bound", act, r);
    /* accumulate adds the same values */
    float *acc = fbuf(N);
    fill(acc, N, -1, 1);
    float *acc0 = fbuf(N);
    memcpy(acc0, acc, N * sizeof(float));
    be1.ops->act_bwd(&be1, act, 1, N, x, dy, acc, 1);
    int ok = 1; /* one addition more, which may fuse with g's product (FMA): 2 roundings */
    for (int i = 0; i < N; i++)
        ok &= near(acc[i], (double)acc0[i] + dx[i], 2, fabs(acc0[i]) + fabs(dx[i]));
    CHECK(ok, "gelu %d backward with accumulate is not dx + g", act);
}

/* ---- embeddings ---- */

static void test_embed(int n, int t, int c, int v) {
    const size_t rows = (size_t)n * t;
    float *ids = fbuf(rows), *wte = fbuf((size_t)v * c), *wpe = fbuf((size_t)t * c);
    float *y = fbuf(rows * c), *y2 = fbuf(rows * c);
    for (size_t r = 0; r < rows; r++) /* a skewed draw: some tokens often, some never */
        ids[r] = (float)(int)(v * frand(0, 1) * frand(0, 1));
    fill(wte, (size_t)v * c, -1, 1);
    fill(wpe, (size_t)t * c, -1, 1);
    be1.ops->embed_fwd(&be1, n, t, c, v, ids, wte, wpe, y);
    be2.ops->embed_fwd(&be2, n, t, c, v, ids, wte, wpe, y2);
    CHECK(same_bits(y, y2, rows * c), "embed_fwd: 2 lanes differ from 1");
    int ok = 1;
    for (size_t r = 0; r < rows; r++)
        for (int k = 0; k < c; k++)
            ok &= y[r * c + k] == wte[(size_t)ids[r] * c + k] + wpe[(r % t) * c + k];
    CHECK(ok, "embed_fwd: y != wte[id] + wpe[p] (one float addition, exact to compare)");
    float *dy = fbuf(rows * c), *dwte = fbuf((size_t)v * c), *dwpe = fbuf((size_t)t * c);
    float *dwte2 = fbuf((size_t)v * c), *dwpe2 = fbuf((size_t)t * c);
    fill(dy, rows * c, -1, 1);
    poison(dwte, (size_t)v * c);
    be1.ops->embed_bwd(&be1, n, t, c, v, ids, dy, dwte, 0, dwpe);
    be2.ops->embed_bwd(&be2, n, t, c, v, ids, dy, dwte2, 0, dwpe2);
    CHECK(same_bits(dwte, dwte2, (size_t)v * c) && same_bits(dwpe, dwpe2, (size_t)t * c),
          "embed_bwd: 2 lanes differ from 1");
    double *rt = dbuf((size_t)v * c), *at = dbuf((size_t)v * c), *rp = dbuf((size_t)t * c);
    double *ap = dbuf((size_t)t * c);
    int most = 1; /* the most positions holding one token: the longest float sum */
    int *count = tmp_alloc(sizeof(int) * (size_t)v, 0);
    for (size_t r = 0; r < rows; r++) {
        const int id = (int)ids[r];
        most = ++count[id] > most ? count[id] : most;
        for (int k = 0; k < c; k++) {
            rt[(size_t)id * c + k] += dy[r * c + k];
            at[(size_t)id * c + k] += fabs(dy[r * c + k]);
            rp[(r % t) * c + k] += dy[r * c + k];
            ap[(r % t) * c + k] += fabs(dy[r * c + k]);
        }
    }
    double r = bound_ratio(dwte, rt, at, (size_t)v * c, most);
    CHECK(r <= 1, "embed_bwd dwte: off by %.3g of its rounding bound", r);
    r = bound_ratio(dwpe, rp, ap, (size_t)t * c, 1);
    CHECK(r <= 1, "embed_bwd dwpe: off by %.3g of its rounding bound", r);
    /* accumulate: added to what dwte holds (a tied output layer's part) */
    float *base = fbuf((size_t)v * c), *acc = fbuf((size_t)v * c);
    fill(base, (size_t)v * c, -1, 1);
    memcpy(acc, base, sizeof(float) * (size_t)v * c);
    be1.ops->embed_bwd(&be1, n, t, c, v, ids, dy, acc, 1, NULL);
    for (size_t i = 0; i < (size_t)v * c; i++) {
        rt[i] += base[i];
        at[i] += fabs(base[i]);
    }
    r = bound_ratio(acc, rt, at, (size_t)v * c, most + 1);
    CHECK(r <= 1, "embed_bwd accumulate: off by %.3g of its rounding bound", r);
}

/* ---- layer normalisation ---- */

typedef struct {
    int rows, c;
    float *x, *g, *b, *y, *mean, *rstd, *w; /* w: the objective's weights */
} ln_ctx;

static double ln_objective(void *p) {
    ln_ctx *q = p;
    be1.ops->layernorm_fwd(&be1, q->rows, q->c, 1e-5f, q->x, q->g, q->b, q->y, q->mean, q->rstd);
    return dot(q->y, q->w, (size_t)q->rows * q->c);
}

static void test_layernorm(int rows, int c) {
    const size_t nn = (size_t)rows * c;
    ln_ctx q = {rows, c, fbuf(nn), fbuf(c), fbuf(c), fbuf(nn), fbuf(rows), fbuf(rows), fbuf(nn)};
    fill(q.x, nn, -2, 3); /* a mean away from 0 */
    fill(q.g, c, 0.5, 1.5);
    fill(q.b, c, -1, 1);
    fill(q.w, nn, -1, 1);
    ln_objective(&q);
    float *y2 = fbuf(nn), *m2 = fbuf(rows), *s2 = fbuf(rows);
    be2.ops->layernorm_fwd(&be2, rows, c, 1e-5f, q.x, q.g, q.b, y2, m2, s2);
    CHECK(same_bits(q.y, y2, nn) && same_bits(q.mean, m2, rows) && same_bits(q.rstd, s2, rows),
          "layernorm_fwd: 2 lanes differ from 1");
    double *ry = dbuf(nn), *ay = dbuf(nn), *rm = dbuf(rows), *am = dbuf(rows), *rs = dbuf(rows);
    double *as = dbuf(rows);
    for (int r = 0; r < rows; r++) {
        double s = 0, ss = 0;
        for (int k = 0; k < c; k++)
            s += q.x[r * c + k];
        const double mean = s / c;
        for (int k = 0; k < c; k++)
            ss += (q.x[r * c + k] - mean) * (q.x[r * c + k] - mean);
        const double rstd = 1 / sqrt(ss / c + 1e-5);
        rm[r] = mean, am[r] = fabs(mean), rs[r] = rstd, as[r] = rstd;
        for (int k = 0; k < c; k++) {
            ry[r * c + k] = (q.x[r * c + k] - mean) * rstd * q.g[k] + q.b[k];
            /* x - mean (the mean rounded once, then the subtraction), * rstd (rounded once, and
             * the product), * gamma, + beta: 6 roundings on these terms */
            ay[r * c + k] = (fabs(q.x[r * c + k]) + fabs(mean)) * rstd * q.g[k] + fabs(q.b[k]);
        }
    }
    CHECK(bound_ratio(q.mean, rm, am, rows, 1) <= 1 && bound_ratio(q.rstd, rs, as, rows, 1) <= 1,
          "layernorm_fwd: the saved statistics are not the rounded exact ones");
    double r = bound_ratio(q.y, ry, ay, nn, 6);
    CHECK(r <= 1, "layernorm_fwd: off by %.3g of its rounding bound", r);
    /* backward of L = sum w y: dy = w */
    float *dx = fbuf(nn), *dg = fbuf(c), *db = fbuf(c), *dx2 = fbuf(nn), *dg2 = fbuf(c);
    float *db2 = fbuf(c);
    be1.ops->layernorm_bwd(&be1, rows, c, q.x, q.g, q.mean, q.rstd, q.w, dx, dg, db);
    be2.ops->layernorm_bwd(&be2, rows, c, q.x, q.g, q.mean, q.rstd, q.w, dx2, dg2, db2);
    CHECK(same_bits(dx, dx2, nn) && same_bits(dg, dg2, c) && same_bits(db, db2, c),
          "layernorm_bwd: 2 lanes differ from 1");
    double *rx = dbuf(nn), *ax = dbuf(nn), *rg = dbuf(c), *ag = dbuf(c), *rb = dbuf(c);
    double *ab = dbuf(c);
    for (int rr = 0; rr < rows; rr++) {
        const double mean = rm[rr], rstd = rs[rr];
        double sg = 0, sgx = 0, asg = 0, asgx = 0;
        for (int k = 0; k < c; k++) {
            const double xh = (q.x[rr * c + k] - mean) * rstd, g = q.w[rr * c + k] * q.g[k];
            sg += g, sgx += g * xh, asg += fabs(g), asgx += fabs(g * xh);
            rg[k] += q.w[rr * c + k] * xh, ag[k] += fabs(q.w[rr * c + k] * xh);
            rb[k] += q.w[rr * c + k], ab[k] += fabs(q.w[rr * c + k]);
        }
        for (int k = 0; k < c; k++) {
            const double xh = (q.x[rr * c + k] - mean) * rstd, g = q.w[rr * c + k] * q.g[k];
            const double axh = (fabs(q.x[rr * c + k]) + fabs(mean)) * rstd;
            rx[rr * c + k] = rstd * (g - sg / c - xh * sgx / c);
            /* the same expression on absolute values, with x - mean's */
            ax[rr * c + k] = rstd * (fabs(g) + asg / c + axh * asgx / c);
        }
    }
    /* dx: xhat's 3 roundings, g's 1, the two means' 1 each (summed in double), then 4 for the
     * combination: 10 */
    r = bound_ratio(dx, rx, ax, nn, 10);
    CHECK(r <= 1, "layernorm_bwd dx: off by %.3g of its rounding bound", r);
    /* dgamma: xhat's 3 roundings and the product's 1 per term, the sum in double: 5 */
    for (int k = 0; k < c; k++) /* the terms' |x - mean| part, as in ay */
        ag[k] = 0;
    for (int rr = 0; rr < rows; rr++)
        for (int k = 0; k < c; k++)
            ag[k] += fabs(q.w[rr * c + k]) * (fabs(q.x[rr * c + k]) + fabs(rm[rr])) * rs[rr];
    r = bound_ratio(dg, rg, ag, c, 5);
    CHECK(r <= 1, "layernorm_bwd dgamma: off by %.3g of its rounding bound", r);
    r = bound_ratio(db, rb, ab, c, 1);
    CHECK(r <= 1, "layernorm_bwd dbeta: off by %.3g of its rounding bound", r);
    /* and the formulas against finite differences of the forward */
    fd_check("layernorm dx", ln_objective, &q, q.x, nn, dx);
    fd_check("layernorm dgamma", ln_objective, &q, q.g, c, dg);
}

/* ---- attention ---- */

typedef struct {
    mgt_attn_shape s;
    float *qkv, *y, *lse, *w;
} att_ctx;

static double att_objective(void *p) {
    att_ctx *q = p;
    be1.ops->attn_fwd(&be1, &q->s, q->qkv, q->y, q->lse);
    return dot(q->y, q->w, (size_t)q->s.n * q->s.t * q->s.c);
}

/* The weights p[i][j] of (sequence b, head h), in double, dropout's mask applied (the softmax
 * itself taken without it, as forward does), into P [t][t]; each row's max |score| into amax. */
static void att_ref_weights(const att_ctx *q, int b, int h, double *P, double *amax) {
    const mgt_attn_shape *s = &q->s;
    const int t = s->t, c = s->c, d = c / s->heads;
    const double scale = 1 / sqrt((double)d);
    for (int i = 0; i < t; i++) {
        const int jn = s->causal ? i + 1 : t;
        double mx = -INFINITY, sum = 0, am = 0;
        for (int j = 0; j < jn; j++) {
            double sc = 0, asc = 0;
            for (int e = 0; e < d; e++) {
                const double a = q->qkv[((size_t)b * t + i) * 3 * c + h * d + e];
                const double k = q->qkv[((size_t)b * t + j) * 3 * c + c + h * d + e];
                sc += a * k, asc += fabs(a * k);
            }
            P[i * t + j] = sc * scale;
            am = asc * scale > am ? asc * scale : am;
            mx = P[i * t + j] > mx ? P[i * t + j] : mx;
        }
        for (int j = 0; j < jn; j++)
            sum += P[i * t + j] = exp(P[i * t + j] - mx);
        for (int j = 0; j < t; j++) {
            P[i * t + j] = j < jn ? P[i * t + j] / sum : 0;
            if (j < jn && s->rate > 0) {
                const uint64_t ctr =
                    (((s->first_sample + b) * s->heads + h) * (uint64_t)t + i) * t + j;
                P[i * t + j] *= mgt_uniform(s->key, ctr) >= s->rate ? 1 / (1 - (double)s->rate) : 0;
            }
        }
        amax[i] = am;
    }
}

static void test_attention(int n, int t, int c, int heads, int causal, float rate) {
    const int d = c / heads;
    const size_t nq = (size_t)n * t * 3 * c, ny = (size_t)n * t * c;
    att_ctx q = {{n, t, c, heads, causal, rate, 0x1234, 5},
                 fbuf(nq),
                 fbuf(ny),
                 fbuf((size_t)n * heads * t),
                 fbuf(ny)};
    fill(q.qkv, nq, -1, 1);
    fill(q.w, ny, -1, 1);
    reserve_both(be1.ops->attn_scratch(&be2, &q.s)); /* be2's: the larger */
    att_objective(&q);
    float *y2 = fbuf(ny), *l2 = fbuf((size_t)n * heads * t);
    be2.ops->attn_fwd(&be2, &q.s, q.qkv, y2, l2);
    CHECK(same_bits(q.y, y2, ny), "attn_fwd n%d t%d: 2 lanes differ from 1", n, t);
    /* y_i = sum_j p_ij v_j. A score's error, gamma(d + 1) times the sum of |q k| / sqrt(d)
     * (A_i, its largest over the row), moves p_ij by that relative amount twice over (its own
     * exponential and the row's sum); the online softmax's rescaling, the exponentials and the
     * normalisation add at most t + 16 roundings on sum_j p_ij |v_j|. So |y - ref| <=
     * gamma(d + t + 16) (1 + 2 A_i) sum_j p_ij |v_j|. */
    double *P = dbuf((size_t)t * t), *amax = dbuf(t), *ry = dbuf(ny), *ay = dbuf(ny);
    double *dref = dbuf(nq);
    for (int b = 0; b < n; b++)
        for (int h = 0; h < heads; h++) {
            att_ref_weights(&q, b, h, P, amax);
            for (int i = 0; i < t; i++)
                for (int e = 0; e < d; e++) {
                    double s = 0, a = 0;
                    for (int j = 0; j < t; j++) {
                        const double v = q.qkv[((size_t)b * t + j) * 3 * c + 2 * c + h * d + e];
                        s += P[i * t + j] * v, a += fabs(P[i * t + j] * v);
                    }
                    ry[((size_t)b * t + i) * c + h * d + e] = s;
                    ay[((size_t)b * t + i) * c + h * d + e] = a * (1 + 2 * amax[i]);
                }
        }
    double r = bound_ratio(q.y, ry, ay, ny, d + t + 16);
    CHECK(r <= 1, "attn_fwd n%d t%d c%d h%d causal %d rate %g: off by %.3g of its rounding bound",
          n, t, c, heads, causal, rate, r);
    /* backward of L = sum w y, against finite differences and against two lanes */
    float *dq = fbuf(nq), *dq2 = fbuf(nq);
    poison(dq, nq);
    be1.ops->attn_bwd(&be1, &q.s, q.qkv, q.y, q.lse, q.w, dq);
    be2.ops->attn_bwd(&be2, &q.s, q.qkv, q.y, q.lse, q.w, dq2);
    CHECK(same_bits(dq, dq2, nq), "attn_bwd n%d t%d: 2 lanes differ from 1", n, t);
    fd_check("attention dqkv", att_objective, &q, q.qkv, nq, dq);
    (void)dref;
}

/* ---- the loss's scale: a sequence's mean over its positions ---- */

static void test_xent_scale(void) {
    enum { N = 6, K = 5 };
    float l[N * K], d1[N * K], d2[N * K], s1[4] = {0}, s2[4] = {0};
    int32_t lab[N];
    fill(l, N * K, -2, 2);
    for (int i = 0; i < N; i++)
        lab[i] = i % K;
    be1.ops->xent_sparse(&be1, N, K, l, lab, NULL, d1, 1.0f, 0.0f, s1);
    be1.ops->xent_sparse(&be1, N, K, l, lab, NULL, d2, 0.25f, 0.0f, s2);
    int ok = 1;
    for (int i = 0; i < N * K; i++)
        ok &= d2[i] == d1[i] * 0.25f;
    CHECK(ok, "xent_sparse scale: the gradient is not scaled");
    CHECK(fabs(s2[0] - 0.25 * s1[0]) <= 2 * 0x1p-24 * s1[0] && s2[1] == 0.25f * s1[1] &&
              s2[2] == 0.25f * s1[2],
          "xent_sparse scale: sums %g %g %g, unscaled %g %g %g", s2[0], s2[1], s2[2], s1[0], s1[1],
          s1[2]);
}

/* ---- the loss over a vocabulary: blocks of rows on the lanes ----
 * n rows of k logits (k not a multiple of 8: the rows' vector part and their last few), one label
 * out of range, against double: lse = mx + log sum e^(l - mx), p_j = e^(l_j - lse), the row's
 * loss lse - l[label]. A probability rounds in the subtraction l_j - mx (relative error up to
 * |l_j - mx| u in e^), in the exponential (2 u, cpu_internal.h), the sum's reciprocal and the
 * product: k = 8 on p_j (1 + |l_j - mx|); the gradient one subtraction more, on p_j + t_j. A
 * row's loss: lse from float exponentials (2 u each, relative to their sum), a logarithm and a
 * subtraction, summed in double and rounded once to float: k = 8 on the sum of |lse| + |l|. The
 * correct and top-5 counts are the reference's exactly (random logits have no ties). Two lanes
 * give the same bits (the sums too: the blocks follow from the row count). */
static void test_xent_vocab(int n, int k) {
    const size_t cnt = (size_t)n * k;
    float *l = fbuf(cnt), *p1 = fbuf(cnt), *d1 = fbuf(cnt), *p2 = fbuf(cnt), *d2 = fbuf(cnt);
    int32_t *lab = tmp_alloc(sizeof(int32_t) * (size_t)n, 0);
    fill(l, cnt, -4, 4);
    for (int i = 0; i < n; i++)
        lab[i] = i == n / 2 ? -1 : (int32_t)(mgt_rand64(OPCHECK_KEY, g_ctr++) % (uint64_t)k);
    float s1[3] = {0}, s2[3] = {0};
    be1.ops->xent_sparse(&be1, n, k, l, lab, p1, d1, 1.0f, 0.0f, s1);
    be2.ops->xent_sparse(&be2, n, k, l, lab, p2, d2, 1.0f, 0.0f, s2);
    CHECK(same_bits(p1, p2, cnt) && same_bits(d1, d2, cnt) && same_bits(s1, s2, 3),
          "xent_sparse %d x %d: 2 lanes differ from 1", n, k);
    double *rp = dbuf(cnt), *ap = dbuf(cnt), *rd = dbuf(cnt), *ad = dbuf(cnt);
    double loss = 0, aloss = 0;
    long correct = 0, top5 = 0;
    for (int i = 0; i < n; i++) {
        const float *r = l + (size_t)i * k;
        double mx = r[0], se = 0;
        int best = 0;
        for (int j = 1; j < k; j++)
            if (r[j] > mx)
                mx = r[j], best = j;
        for (int j = 0; j < k; j++)
            se += exp(r[j] - mx);
        const double lse = mx + log(se);
        int ahead = 0;
        for (int j = 0; j < k; j++) {
            const size_t at = (size_t)i * k + j;
            const double pj = exp(r[j] - lse), t = j == lab[i];
            rp[at] = pj;
            ap[at] = pj * (1 + fabs(r[j] - mx));
            rd[at] = lab[i] < 0 ? 0 : pj - t;
            ad[at] = ap[at] + t;
            ahead += lab[i] >= 0 && r[j] > r[lab[i]];
        }
        if (lab[i] >= 0) {
            loss += lse - r[lab[i]];
            aloss += fabs(lse) + fabs(r[lab[i]]);
            correct += best == lab[i];
            top5 += ahead < 5;
        }
    }
    double q = bound_ratio(p1, rp, ap, cnt, 8);
    CHECK(q <= 1, "xent_sparse %d x %d probabilities: off by %.3g of their rounding bound", n, k,
          q);
    q = bound_ratio(d1, rd, ad, cnt, 9);
    CHECK(q <= 1, "xent_sparse %d x %d gradient: off by %.3g of its rounding bound", n, k, q);
    CHECK(near(s1[0], loss, 8, aloss), "xent_sparse %d x %d: loss sum %.7g, expected %.7g", n, k,
          s1[0], loss);
    CHECK(s1[1] == (float)correct && s1[2] == (float)top5,
          "xent_sparse %d x %d: %g correct and %g in the top 5, expected %ld and %ld", n, k, s1[1],
          s1[2], correct, top5);
}

/* ---- AdamW ---- */

/* Three steps of AdamW against PyTorch's formulas in double (optim_math.h), and its decay
 * skipped on the ranges the optimizer is told of, whatever the update's cut. Each step's update
 * rounds a handful of times (the decay's product, the moments' two products and sum, the square
 * root, the division, the step): k = 12 relative to the terms' magnitudes per step, summed over
 * the three steps. */
static void test_adamw(void) {
    enum { N = 300 };
    mgt_optim_cfg cfg = {.optimizer = MGT_OPT_ADAMW, .lr = 0.01f};
    mgt_opt_defaults(&cfg.opt);
    cfg.opt.weight_decay = 0.1f;
    cfg.opt.epsilon = 1e-8f;
    mgt_optim o, p;
    mgt_err e;
    CHECK(mgt_optim_init(&o, &cfg, &be1, N, &e) == 0, "adamw init: %s", e.msg);
    CHECK(mgt_optim_init(&p, &cfg, &be1, N, &e) == 0, "adamw init: %s", e.msg);
    const size_t lo[2] = {10, 100}, cnt[2] = {20, 50};
    CHECK(mgt_optim_skip_decay(&o, lo, cnt, 2, &e) == 0 &&
              mgt_optim_skip_decay(&p, lo, cnt, 2, &e) == 0,
          "skip_decay: %s", e.msg);
    float *w = fbuf(N), *wp = fbuf(N), *g = fbuf(N);
    double *wd = dbuf(N), *m = dbuf(N), *v = dbuf(N), *aw = dbuf(N);
    fill(w, N, -1, 1);
    memcpy(wp, w, sizeof(float) * N);
    for (int i = 0; i < N; i++)
        wd[i] = w[i];
    for (int t = 1; t <= 3; t++) {
        fill(g, N, -3, 3);
        mgt_optim_step(&o, &be1, w, g, 4); /* g sums over 4 samples */
        mgt_optim_begin(&p, 4);            /* the same in cuts that split the skipped ranges */
        mgt_optim_update(&p, &be1, wp, g, 0, 15);
        mgt_optim_update(&p, &be1, wp, g, 15, 120);
        mgt_optim_update(&p, &be1, wp, g, 135, N - 135);
        const double b1 = 0.9, b2 = 0.999, lr = 0.01, bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        for (int i = 0; i < N; i++) {
            const int skip = (i >= 10 && i < 30) || (i >= 100 && i < 150);
            const double gt = g[i] / 4.0;
            wd[i] *= 1 - lr * (skip ? 0 : 0.1);
            m[i] = b1 * m[i] + (1 - b1) * gt;
            v[i] = b2 * v[i] + (1 - b2) * gt * gt;
            const double step = lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + 1e-8);
            wd[i] -= step;
            aw[i] += fabs(wd[i]) + 3 * fabs(step);
        }
    }
    double r = bound_ratio(w, wd, aw, N, 12);
    CHECK(r <= 1, "adamw: 3 steps off by %.3g of their rounding bound", r);
    /* the skipped ranges decay in the reference above; without the skip they would differ by
     * lr * wd * |w| ~ 1e-3, far above the bound */
    CHECK(same_bits(w, wp, N), "adamw: the update's cut changes bits");
    mgt_optim_free(&o, &be1);
    mgt_optim_free(&p, &be1);
}

int main(void) {
    if (mgt_cpu_backend_init(&be1, 1) || mgt_cpu_backend_init(&be2, 2)) {
        fprintf(stderr, "cannot start the CPU backend\n");
        return 2;
    }
    test_dense_io(37, 24, 72, MGT_ACT_NONE);
    test_dense_io(300, 40, 160, MGT_ACT_GELU_TANH); /* large enough to be split */
    test_dense_io(5, 7, 3, MGT_ACT_GELU);
    test_gelu(MGT_ACT_GELU);
    test_gelu(MGT_ACT_GELU_TANH);
    test_embed(3, 17, 40, 50);
    test_embed(2, 130, 8, 7);
    test_layernorm(200, 48);
    test_layernorm(3, 5);
    test_attention(2, 9, 12, 3, 1, 0.0f);
    test_attention(1, 70, 16, 2, 1, 0.0f);  /* two blocks of keys, the second partial */
    test_attention(2, 67, 8, 1, 0, 0.0f);   /* not causal */
    test_attention(1, 66, 16, 4, 1, 0.25f); /* dropout on the weights */
    test_xent_scale();
    test_xent_vocab(200, 1003); /* 13 blocks of 16 rows, split over the lanes */
    test_xent_vocab(37, 250);   /* the exponentials kept for the second pass (k <= 256) */
    test_adamw();
    mgt_backend_destroy(&be1);
    mgt_backend_destroy(&be2);
    tmp_free_all();
    return opcheck_finish("test_seq_ops");
}
