/* opcheck.h: what the op tests share: the CHECK counter, a buffer arena freed all at once
 * (LeakSanitizer-clean), seeded random fills through the library's own RNG, NaN poison, the
 * relative-error measure, the CPU reference backend and convolution shapes with explicit padding.
 * A test defines OPCHECK_KEY (its RNG key) before including this. */
#ifndef MGT_TEST_OPCHECK_H
#define MGT_TEST_OPCHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "util.h"

#ifndef OPCHECK_KEY
#error "define OPCHECK_KEY before including opcheck.h"
#endif

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            g_pass++;                                                                              \
        } else {                                                                                   \
            g_fail++;                                                                              \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            fflush(stdout);                                                                        \
        }                                                                                          \
    } while (0)

/* Prints the tally; the process exit status. */
static inline int opcheck_finish(const char *name) {
    if (g_fail) {
        printf("%s: %d checks FAILED, %d passed\n", name, g_fail, g_pass);
        return 1;
    }
    printf("%s: %d checks passed\n", name, g_pass);
    return 0;
}

enum { MAX_TMP = 512 };
static void *g_tmp[MAX_TMP];
static int g_ntmp;

/* Zeroed memory (aligned = 1: 64-byte aligned, contents undefined) freed by tmp_free_all(). */
static inline void *tmp_alloc(size_t bytes, int aligned) {
    if (g_ntmp == MAX_TMP) {
        fprintf(stderr, "too many temporary test buffers\n");
        exit(2);
    }
    bytes = bytes ? bytes : 1;
    void *p = aligned ? aligned_alloc(64, (bytes + 63) & ~(size_t)63) : calloc(1, bytes);
    if (!p) {
        fprintf(stderr, "out of memory for a test buffer\n");
        exit(2);
    }
    g_tmp[g_ntmp++] = p;
    return p;
}

static inline float *fbuf(size_t n) { return tmp_alloc(n * sizeof(float), 0); }

static inline void tmp_free_all(void) {
    for (int i = 0; i < g_ntmp; i++)
        free(g_tmp[i]);
    g_ntmp = 0;
}

static uint64_t g_ctr;

static inline float frand(float lo, float hi) {
    return lo + (hi - lo) * mgt_uniform(OPCHECK_KEY, g_ctr++);
}

static inline void fill(float *a, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++)
        a[i] = frand(lo, hi);
}

static inline void poison(float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        a[i] = NAN;
}

static inline int all_zero(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != 0.0f)
            return 0;
    return 1;
}

/* max |a - ref| / max(max |ref|, floor); +inf if any value is not finite (NaN poison left). */
static inline double rel_err(const float *a, const float *ref, size_t n, double floor) {
    double err = 0.0, scale = floor;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(ref[i]))
            return INFINITY;
        const double d = fabs((double)a[i] - ref[i]);
        if (d > err)
            err = d;
        if (fabs(ref[i]) > scale)
            scale = fabs(ref[i]);
    }
    return err / scale;
}

/* ---- tolerances from rounding-error analysis ----
 * Float32 rounds to nearest with unit roundoff u = 2^-24. When every result of an expression
 * passes through at most k roundings on its way from the inputs (a sum of K terms in any order,
 * blocked or with FMA: k <= K; each scaling by a constant that is not a power of two: one more),
 *     |computed - exact| <= gamma(k) * |the same expression|, gamma(k) = k u / (1 - k u),
 * where |the same expression| is evaluated exactly on the absolute values of every input and
 * constant (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., 2002, Lemma 3.1
 * and eq. 3.4; no underflow, which the tests' O(1) data rule out). The op tests compute the
 * exact result and this absolute bound in double, element by element, so a tolerance follows
 * from the algorithm (its summation lengths, its transform constants) and from the data, never
 * from what one machine's BLAS kernel happened to give. */
static inline double opcheck_gamma(double k) {
    const double u = 0x1p-24;
    return k * u / (1.0 - k * u);
}

/* The worst ratio |a - ref| / (gamma(k) * absref) over n elements: <= 1 passes. absref[i] is the
 * exact expression on absolute values; where it is 0 the result must be exactly ref (0). The
 * double reference's own error (k * 2^-53 * absref) is far below the float bound and covered by
 * a 2^-40 relative allowance. +inf when a value is not finite (NaN poison left). */
static inline double bound_ratio(const float *a, const double *ref, const double *absref,
                                 size_t n, double k) {
    const double g = opcheck_gamma(k);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        const double d = fabs((double)a[i] - ref[i]);
        const double b = g * absref[i] + 0x1p-40 * absref[i];
        const double r = d == 0.0 ? 0.0 : b > 0.0 ? d / b : INFINITY;
        worst = r > worst ? r : worst;
    }
    return worst;
}

/* For hand-worked examples: |got - want| <= gamma(k) * scale, where k counts the float
 * roundings between the exact inputs and `got` and scale is the size of the largest term they
 * act on (each caller states both). */
static inline int near(double got, double want, double k, double scale) {
    return isfinite(got) && fabs(got - want) <= opcheck_gamma(k) * scale;
}

/* The CPU reference backend, BLAS threads left as they are; exits 2 if it cannot start. */
static inline mgt_backend opcheck_cpu_backend(const char *test_name) {
    mgt_backend be = {0};
    if (mgt_cpu_backend_init(&be, 0) != 0) {
        fprintf(stderr, "%s: mgt_cpu_backend_init failed\n", test_name);
        exit(2);
    }
    return be;
}

/* A convolution with explicit zero padding (top, bottom, left, right); the output size follows. */
static inline mgt_conv_shape opcheck_conv_shape(int n, int h, int w, int c, int oc, int kh, int kw,
                                                int stride, int pt, int pb, int pl, int pr) {
    return (mgt_conv_shape){.n = n,
                            .h = h,
                            .w = w,
                            .c = c,
                            .oc = oc,
                            .kh = kh,
                            .kw = kw,
                            .stride = stride,
                            .pad_top = pt,
                            .pad_left = pl,
                            .oh = (h + pt + pb - kh) / stride + 1,
                            .ow = (w + pl + pr - kw) / stride + 1};
}

/* Element counts of a convolution's input (NHWC), weights (OIHW) and output (NHWC). */
static inline size_t conv_nx(const mgt_conv_shape *s) {
    return (size_t)s->n * s->h * s->w * s->c;
}
static inline size_t conv_nw(const mgt_conv_shape *s) {
    return (size_t)s->oc * s->c * s->kh * s->kw;
}
static inline size_t conv_ny(const mgt_conv_shape *s) {
    return (size_t)s->n * s->oh * s->ow * s->oc;
}

#endif
