/* cpu_clip.c: gradient clipping over the flat gradient arena (clip.h; backend.h's clip_value and
 * clip_norm).
 *
 * The sum of squares runs in 8 double lanes, element i in lane i % 8, and the lanes are added
 * in a fixed pairwise order: the compiler can keep the 8 lanes in vector registers (no
 * reassociation is needed), and the result depends on n alone. A float times a float is exact
 * in double, so a fused multiply-add (the AVX2 clone of MGT_SIMD) gives the same bits as a
 * multiply then an add: every CPU computes the same sum, hence the same scale, on every rank. */
#include <math.h>

#include "cpu_internal.h"

MGT_SIMD
static double sum_squares(size_t n, const float *restrict g) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += (double)g[i + j] * (double)g[i + j];
    for (int j = 0; i < n; i++, j++)
        lane[j] += (double)g[i] * (double)g[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

MGT_SIMD
static void scale(size_t n, float *restrict g, float f) {
    for (size_t i = 0; i < n; i++)
        g[i] *= f;
}

void mgt_cpu_clip_norm(mgt_backend *be, size_t n, float *g, double limit, double *work) {
    (void)be;
    const double s = sum_squares(n, g);
    work[0] = s;
    const double norm = sqrt(s);
    if (norm > limit) /* false for NaN: a broken gradient reaches the loss check unchanged */
        scale(n, g, (float)(limit / norm));
}

/* Comparisons, not fminf/fmaxf, which would turn a NaN into the limit. */
MGT_SIMD
void mgt_cpu_clip_value(mgt_backend *be, size_t n, float *g, float limit) {
    (void)be;
    for (size_t i = 0; i < n; i++) {
        const float v = g[i];
        g[i] = v > limit ? limit : v < -limit ? -limit : v;
    }
}
