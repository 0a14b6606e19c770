/* test_smooth_clip.c: label smoothing in the CPU cross-entropy ops and the gradient clipping ops
 * (src/cpu/cpu_elem.c, src/cpu/cpu_clip.c) against double references, with bounds from rounding
 * analysis (opcheck.h: gamma(k) = k u / (1 - k u), u = 2^-24).
 *
 * Label smoothing s: the target t becomes t' = (1 - s) t + s / K (sparse: t the label's one-hot),
 * the loss of a row is sum(t') lse - sum t'_j l_j and its gradient p_j sum(t') - t'_j (Keras'
 * label_smoothing). The reference evaluates that in double on the same float logits.
 *   - loss: the op's lse rests on float exps, exp(l_j - mx) with l_j - mx rounded in float (an
 *     error u |l_j - mx| in the argument) and expf's own 2 ulp (4u): each term of se is within
 *     (4 + |l_j - mx|) u relative, so se is, and lse within that absolutely (d lse = dse / se);
 *     with the logits in [-2, 2], |l - mx| <= 4: 8u per row, times sum(t') <= 2 (dense) or 1.
 *     The rest is double (2^-50 relative) but for the total, rounded to float and added to the
 *     float sum: 2 roundings of |total|.
 *   - gradient: p_j = expf(l_j - mx) * (float)(1 / se): (4 + 4) u from the exp, one rounding
 *     of 1 / se and one of the product: 10u on p; sum(t') to float and the product p sum(t'):
 *     2 more; t'_j = t_on t_j + t_off: t_on, t_off and the product and sum are 4 roundings of
 *     t'; the subtraction 1 more of |d_j| <= p_j sum(t') + t'_j. In all
 *     |d_j - ref_j| <= gamma(13) p_j sum(t') + gamma(5) t'_j <= gamma(13) (p_j sum(t') + t'_j).
 * Clipping: clip_value is a comparison per element (exact); clip_norm's sum of squares adds n
 * exact products in double (Higham: within gamma_double(n) relative, positive terms), then the
 * scale f = (float)(limit / sqrt(S)) (one float rounding after double arithmetic) multiplies
 * each element (one more): every clipped element is within gamma(2) of g_i limit / ||g|| in
 * exact arithmetic, and so is the clipped norm of the limit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "util.h"

#define OPCHECK_KEY 0x5c11bULL
#include "opcheck.h"

/* The row's loss and gradient in double for target t' (k classes). */
static double ref_row(int k, const float *l, const double *tp, double *grad) {
    double mx = l[0], se = 0, st = 0, stl = 0;
    for (int j = 1; j < k; j++)
        mx = fmax(mx, l[j]);
    for (int j = 0; j < k; j++) {
        se += exp(l[j] - mx);
        st += tp[j];
        stl += tp[j] * l[j];
    }
    const double lse = mx + log(se);
    for (int j = 0; j < k; j++)
        grad[j] = exp(l[j] - mx) / se * st - tp[j];
    return st * lse - stl;
}

static void test_smoothing(mgt_backend *be, int dense, float s) {
    const int n = 24, k = 7;
    const size_t cnt = (size_t)n * k;
    float *l = fbuf(cnt), *t = fbuf(cnt), *p = fbuf(cnt), *d = fbuf(cnt);
    int32_t *lab = tmp_alloc(n * sizeof(int32_t), 0);
    fill(l, cnt, -2, 2);
    fill(t, cnt, 0, 1); /* soft targets, sums not 1: the op's sum(t') path */
    for (int i = 0; i < n; i++)
        lab[i] = (int32_t)(mgt_rand64(OPCHECK_KEY, g_ctr++) % k);
    lab[5] = k; /* out of range: no loss, no gradient, smoothed or not */
    poison(d, cnt);
    float sums[3] = {0.5f, 0.0f, 0.0f};
    if (dense)
        be->ops->xent_dense(be, n, k, l, t, p, d, 1.0f, s, sums);
    else
        be->ops->xent_sparse(be, n, k, l, lab, p, d, 1.0f, s, sums);

    double loss = 0.5, worst = 0;
    int grad_ok = 1;
    for (int i = 0; i < n; i++) {
        double tp[16], grad[16], st = 0;
        const int valid = dense || (lab[i] >= 0 && lab[i] < k);
        for (int j = 0; j < k; j++) {
            const double tj = dense ? t[(size_t)i * k + j] : j == lab[i] ? 1.0 : 0.0;
            tp[j] = valid ? (1.0 - s) * tj + (double)s / k : 0.0;
            st += tp[j];
        }
        loss += ref_row(k, l + (size_t)i * k, tp, grad);
        for (int j = 0; j < k; j++) {
            const double got = d[(size_t)i * k + j];
            /* grad + t' = p_j sum(t') >= 0 */
            const double bound = opcheck_gamma(13) * (fabs(grad[j] + tp[j]) + tp[j]);
            const double err = fabs(got - grad[j]);
            grad_ok &= isfinite(got) && err <= bound;
            if (bound > 0)
                worst = fmax(worst, err / bound);
            else
                grad_ok &= got == 0.0f;
        }
    }
    CHECK(grad_ok, "xent_%s smoothing %g: gradient off by %.3g of its bound",
          dense ? "dense" : "sparse", s, worst);
    /* 8u per row on sum(t') lse (sum(t') <= 2 dense, 1 sparse), then 2 roundings of the total */
    const double row_scale = dense ? 2.0 : 1.0;
    const double tol = opcheck_gamma(8) * row_scale * n + opcheck_gamma(2) * fabs(loss);
    CHECK(fabs(sums[0] - loss) <= tol, "xent_%s smoothing %g: loss %.9g, reference %.9g (tol %.3g)",
          dense ? "dense" : "sparse", s, sums[0], loss, tol);
    /* out-of-range label: all-zero target, smoothed or not */
    if (!dense) {
        int zero = 1;
        for (int j = 0; j < k; j++)
            zero &= d[5 * k + j] == 0.0f;
        CHECK(zero, "xent_sparse smoothing %g: an out-of-range label has a gradient", s);
    }
    /* smoothing leaves the accuracy count alone */
    float plain[3] = {0, 0, 0}; /* loss, correct, top-5 correct */
    if (dense)
        be->ops->xent_dense(be, n, k, l, t, p, NULL, 1.0f, 0.0f, plain);
    else
        be->ops->xent_sparse(be, n, k, l, lab, p, NULL, 1.0f, 0.0f, plain);
    CHECK(plain[1] == sums[1], "xent_%s smoothing %g: correct count %g, unsmoothed %g",
          dense ? "dense" : "sparse", s, sums[1], plain[1]);
    tmp_free_all();
}

/* A hand example: logits [0, ln 2, ln 4] (p = 1/7, 2/7, 4/7), label 0, s = 0.3, K = 3: the
 * target is [0.8, 0.1, 0.1]; loss = lse - 0.8 * 0 - 0.1 (ln 2 + ln 4) = ln 7 - 0.3 ln 2;
 * gradient p - t = [1/7 - 0.8, 2/7 - 0.1, 4/7 - 0.1]. Bounds: as above, 8 and 13 roundings. */
static void test_hand(mgt_backend *be) {
    const float l[3] = {0.0f, (float)log(2.0), (float)log(4.0)};
    const int32_t lab = 0;
    float p[3], d[3], sums[3] = {0, 0, 0};
    be->ops->xent_sparse(be, 1, 3, l, &lab, p, d, 1.0f, 0.3f, sums);
    /* the float logits are within u of ln 2, ln 4 (they move the loss by < 2u): 10 on 2 */
    CHECK(near(sums[0], log(7.0) - 0.3 * log(2.0), 10, 2), "hand example: loss %.8f, want %.8f",
          sums[0], log(7.0) - 0.3 * log(2.0));
    CHECK(near(d[0], 1.0 / 7 - 0.8, 13, 1) && near(d[1], 2.0 / 7 - 0.1, 13, 1) &&
              near(d[2], 4.0 / 7 - 0.1, 13, 1),
          "hand example: gradient %.8f %.8f %.8f", d[0], d[1], d[2]);
    /* s = 1: the uniform target, whatever the label: gradient p - 1/3 */
    be->ops->xent_sparse(be, 1, 3, l, &lab, p, d, 1.0f, 1.0f, sums);
    CHECK(near(d[0], 1.0 / 7 - 1.0 / 3, 13, 1) && near(d[2], 4.0 / 7 - 1.0 / 3, 13, 1),
          "s = 1: gradient %.8f %.8f %.8f", d[0], d[1], d[2]);
}

static void test_clip(mgt_backend *be, size_t n) {
    float *g = fbuf(n + 1), *h = fbuf(n + 1);
    fill(g, n, -3, 3);
    memcpy(h, g, n * sizeof(float));
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)g[i] * g[i];
    const double norm = sqrt(ss);

    /* by value: exactly the clamp */
    be->ops->clip_value(be, n, h, 1.25f);
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= h[i] == (g[i] > 1.25f ? 1.25f : g[i] < -1.25f ? -1.25f : g[i]);
    CHECK(ok, "clip_value n=%zu: not the clamp", n);

    /* by norm, above the limit: the direction kept, the norm the limit */
    double work[2] = {-1, -1};
    const double limit = norm / 3;
    memcpy(h, g, n * sizeof(float));
    be->ops->clip_norm(be, n, h, limit, work);
    CHECK(fabs(work[0] - ss) <= (double)n * 0x1p-53 * ss * 1.01,
          "clip_norm n=%zu: sum of squares %.17g, reference %.17g", n, work[0], ss);
    double worst = 0, hn = 0;
    for (size_t i = 0; i < n; i++) {
        const double want = g[i] * (limit / norm);
        worst = fmax(worst, fabs(h[i] - want) / (opcheck_gamma(2) * fabs(want)));
        hn += (double)h[i] * h[i];
    }
    CHECK(worst <= 1.0, "clip_norm n=%zu: elements off by %.3g of their bound", n, worst);
    CHECK(fabs(sqrt(hn) - limit) <= opcheck_gamma(2) * limit,
          "clip_norm n=%zu: clipped norm %.9g, limit %.9g", n, sqrt(hn), limit);

    /* below the limit: the very same bits */
    memcpy(h, g, n * sizeof(float));
    be->ops->clip_norm(be, n, h, norm * 1.001, work);
    CHECK(!memcmp(h, g, n * sizeof(float)), "clip_norm n=%zu below the limit changed g", n);

    /* a NaN anywhere: nothing scaled, the NaN kept for the loss check to find */
    memcpy(h, g, n * sizeof(float));
    h[n / 2] = NAN;
    be->ops->clip_norm(be, n, h, limit, work);
    ok = isnan(h[n / 2]) && isnan(work[0]);
    for (size_t i = 0; i < n; i++)
        ok &= i == n / 2 || h[i] == g[i];
    be->ops->clip_value(be, n, h, 0.5f);
    CHECK(ok && isnan(h[n / 2]), "clip n=%zu: a NaN was hidden or the rest scaled", n);
    tmp_free_all();
}

int main(void) {
    mgt_backend be = opcheck_cpu_backend("test_smooth_clip");
    const float smooth[] = {0.0f, 0.1f, 0.5f, 1.0f};
    for (int dense = 0; dense < 2; dense++)
        for (size_t i = 0; i < sizeof smooth / sizeof smooth[0]; i++)
            test_smoothing(&be, dense, smooth[i]);
    test_hand(&be);
    const size_t sizes[] = {1, 7, 8, 9, 1000, 269322};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        test_clip(&be, sizes[i]);
    /* n = 0: the sum is 0 and nothing is touched */
    double work[2] = {-1, -1};
    be.ops->clip_norm(&be, 0, NULL, 1.0, work);
    CHECK(work[0] == 0.0, "clip_norm n=0: sum of squares %g", work[0]);
    mgt_backend_destroy(&be);
    tmp_free_all();
    return opcheck_finish("test_smooth_clip");
}
