/* fdcheck.h: central finite differences against an op's analytic gradient, for the op tests
 * (test_ops.c, test_graph_ops.c). Include after opcheck.h. */
#ifndef MGT_TEST_FDCHECK_H
#define MGT_TEST_FDCHECK_H

#include <math.h>

#include "opcheck.h"

static double dot(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static int all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]))
            return 0;
    return 1;
}

/* Distinct values 0.1 apart in random order: a maximum never changes under +-FD_EPS. */
static inline void fill_distinct(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = 0.1f * (float)i - 0.05f * (float)n;
    for (size_t i = n - 1; i > 0 && n; i--) {
        const size_t j = (size_t)(mgt_rand64(OPCHECK_KEY, g_ctr++) % (i + 1));
        const float tmp = x[i];
        x[i] = x[j];
        x[j] = tmp;
    }
}

/* ---- finite differences ---- */

typedef double (*objective_fn)(void *ctx);

/* Central differences with step h have a truncation error of h^2/6 times the third derivative
 * of L (O(1) for the ops on the tests' O(1) data: ~2e-5 at h = 1e-2) and a rounding error of
 * the float32 forward of about gamma(K) * (sum of |terms| of L) / h (K the longest sum: a few
 * 1e-4 at the tests' sizes). 2e-2 of the largest gradient component leaves a wide margin over
 * both, while a wrong formula, index or missing term is off by O(1). */
static const float FD_EPS = 1e-2f;
static const double FD_TOL = 2e-2;
enum { FD_MAX_PROBES = 400 };

/* Compares grad (the op's analytic gradient of L w.r.t. p) with central differences of
 * f(ctx) = L over (up to FD_MAX_PROBES of) p's components. */
static void fd_check(const char *what, objective_fn f, void *ctx, float *p, size_t count,
                     const float *grad) {
    CHECK(all_finite(grad, count), "%s: analytic gradient has non-finite values", what);
    double scale = 0.0;
    for (size_t i = 0; i < count; i++)
        if (fabs(grad[i]) > scale)
            scale = fabs(grad[i]);
    const size_t probes = count < FD_MAX_PROBES ? count : FD_MAX_PROBES;
    double worst = 0.0, worst_num = 0.0, worst_ana = 0.0;
    size_t worst_i = 0;
    for (size_t k = 0; k < probes; k++) {
        const size_t i =
            count <= FD_MAX_PROBES ? k : (size_t)(mgt_rand64(OPCHECK_KEY, g_ctr++) % count);
        const float old = p[i];
        const float up = old + FD_EPS, down = old - FD_EPS;
        p[i] = up;
        const double lp = f(ctx);
        p[i] = down;
        const double lm = f(ctx);
        p[i] = old;
        const double num = (lp - lm) / ((double)up - (double)down);
        double err = fabs(num - grad[i]);
        if (!isfinite(num))
            err = INFINITY;
        if (err > worst) {
            worst = err;
            worst_i = i;
            worst_num = num;
            worst_ana = grad[i];
        }
    }
    f(ctx); /* leave the outputs as they were for the unperturbed parameters */
    const double norm = scale > 1e-6 ? scale : 1e-6;
    CHECK(worst / norm <= FD_TOL,
          "%s: finite-difference mismatch: rel err %.3g at index %zu (numeric %.6g, analytic "
          "%.6g, max |grad| %.3g)",
          what, worst / norm, worst_i, worst_num, worst_ana, scale);
}

#endif
