/* gpu_test.h: what the GPU tests share: the skip rule, a CPU and a GPU backend side by side,
 * host<->device helpers that poison outputs, and comparisons that print what they find.
 *
 * The skip rule: a test that needs a GPU first asks mgt_gpu_count; without a usable GPU it prints
 * "SKIPPED: no usable GPU (<reason>)" and exits 77, which CTest (SKIP_RETURN_CODE 77) reports as
 * skipped, not passed. */
#ifndef MGT_GPU_TEST_H
#define MGT_GPU_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpu.h"
#include "util.h"

#define OPCHECK_KEY 0x6a7e57ULL
#include "../unit/opcheck.h"

static inline int finish(const char *name) {
    return opcheck_finish(name);
}

/* Exits 77 (skipped) when no GPU can be used here. */
static inline void require_gpu(void) {
    char why[256] = "";
    int n = mgt_gpu_count(why, sizeof why);
    if (n <= 0) {
        printf("SKIPPED: no usable GPU (%s)\n", n == 0 ? "no CUDA device is visible" : why);
        exit(77);
    }
    char desc[160];
    mgt_gpu_describe(0, desc, sizeof desc);
    printf("GPU 0: %s\n", desc);
}

typedef struct pair {
    mgt_backend cpu, gpu;
} pair;

/* math: mgt_gpu_backend_init's (MGT_GPU_TF32, MGT_GPU_BF16 or 0). */
static inline void pair_init(pair *p, int math) {
    mgt_err e;
    memset(p, 0, sizeof *p);
    if (mgt_cpu_backend_init(&p->cpu, 0) != 0) {
        fprintf(stderr, "cannot start the CPU backend\n");
        exit(2);
    }
    if (mgt_gpu_backend_init(&p->gpu, 0, math, &e) != 0) {
        fprintf(stderr, "cannot start the GPU backend: %s\n", e.msg);
        exit(2);
    }
}

static inline void pair_free(pair *p) {
    mgt_backend_destroy(&p->cpu);
    mgt_backend_destroy(&p->gpu);
}

/* ---- host memory, freed all at once (opcheck.h's arena) ---- */

static inline void *hbuf(size_t bytes) {
    return tmp_alloc(bytes, 0);
}
static inline float *hf(size_t n) {
    return fbuf(n);
}
static inline void hfree_all(void) {
    tmp_free_all();
}

/* ---- device memory, freed all at once ---- */

static void *g_dev[MAX_TMP];
static mgt_backend *g_dev_be;
static int g_ndev;

static inline void *dmem(mgt_backend *be, size_t bytes) {
    void *p = be->ops->alloc(be, bytes ? bytes : 4);
    if (!p || g_ndev == MAX_TMP) {
        fprintf(stderr, "out of device memory (or too many buffers)\n");
        exit(2);
    }
    g_dev_be = be;
    g_dev[g_ndev++] = p;
    return p;
}

static inline void dfree_all(void) {
    for (int i = 0; i < g_ndev; i++)
        g_dev_be->ops->free(g_dev_be, g_dev[i]);
    g_ndev = 0;
}

/* Device copy of n host floats. */
static inline float *dput(mgt_backend *be, const float *h, size_t n) {
    float *d = dmem(be, n * sizeof(float));
    be->ops->to_device(be, d, h, n * sizeof(float));
    return d;
}

/* n host NaNs; dnan: a device buffer of n floats filled with them, so an element an op forgets
 * to write shows up. */
static inline float *hnan(size_t n) {
    float *h = hf(n);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    return h;
}

static inline float *dnan(mgt_backend *be, size_t n) {
    return dput(be, hnan(n), n);
}

/* Host copy of n device floats. */
static inline float *dget(mgt_backend *be, const float *d, size_t n) {
    float *h = hf(n);
    be->ops->to_host(be, h, d, n * sizeof(float));
    return h;
}

/* x rounded to bfloat16 (8 significant bits, float's exponent range) to nearest, ties to even,
 * computed in double from the value rather than the bits: a multiple of q = 2^(e - 8) for
 * |x| = m 2^e, m in [0.5, 1), and never finer than bfloat16's subnormal spacing 2^-133. Values
 * that round beyond the largest bfloat16 (float's largest exponent) become infinities. NaN:
 * NaN. */
static inline float bf16_round(float x) {
    if (isnan(x) || isinf(x) || x == 0.0f)
        return x;
    int e;
    (void)frexp((double)x, &e);
    const double q = ldexp(1.0, e - 8 > -133 ? e - 8 : -133);
    const double r = nearbyint((double)x / q) * q; /* to even: the default rounding mode */
    return fabs(r) >= 0x1p128 ? (r > 0 ? INFINITY : -INFINITY) : (float)r;
}

static inline float *bf16_copy(const float *x, size_t n) {
    float *r = hf(n);
    for (size_t i = 0; i < n; i++)
        r[i] = bf16_round(x[i]);
    return r;
}

/* ---- activations of the backend's type (backend.h: bfloat16 on a --precision bf16 backend) ----
 * act_put: a device copy of n host values as the backend holds activations (rounded to bfloat16
 * by the test's own rounding there: the host values the reference must then use are
 * bf16_copy's); act_get: n device activations widened to float; act_nan: n NaN activations. */
static inline float *act_put(mgt_backend *g, const float *h, size_t n) {
    if (g->act != MGT_BF16)
        return dput(g, h, n);
    uint16_t *b = hbuf(n * sizeof(uint16_t) + 2);
    for (size_t i = 0; i < n; i++) {
        const float r = bf16_round(h[i]);
        uint32_t u;
        memcpy(&u, &r, sizeof u);
        b[i] = (uint16_t)(u >> 16); /* exact: r is a bfloat16 value */
    }
    float *d = dmem(g, n * sizeof(uint16_t));
    g->ops->to_device(g, d, b, n * sizeof(uint16_t));
    return d;
}

static inline float *act_get(mgt_backend *g, const float *d, size_t n) {
    if (g->act != MGT_BF16)
        return dget(g, d, n);
    uint16_t *b = hbuf(n * sizeof(uint16_t) + 2);
    g->ops->to_host(g, b, d, n * sizeof(uint16_t));
    float *h = hf(n);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)b[i] << 16;
        memcpy(&h[i], &u, sizeof u);
    }
    return h;
}

static inline float *act_nan(mgt_backend *g, size_t n) {
    return act_put(g, hnan(n), n);
}

/* ---- random inputs: the library's RNG under a test key ---- */

static inline float *hrand(size_t n, float lo, float hi) {
    float *h = hf(n);
    for (size_t i = 0; i < n; i++)
        h[i] = frand(lo, hi);
    return h;
}

static inline float *hcopy(const float *src, size_t n) {
    float *h = hf(n);
    if (n)
        memcpy(h, src, n * sizeof(float));
    return h;
}

/* ---- comparisons (rel_err: opcheck.h) ---- */

/* The GPU result (device) against the CPU one (host): relative error at most tol. */
static inline void expect_close(const char *what, mgt_backend *gpu, const float *dev,
                                const float *ref, size_t n, double tol) {
    float *got = dget(gpu, dev, n);
    double e = rel_err(got, ref, n, 1e-30);
    CHECK(e <= tol, "%s: relative error %.3g > %.1g (%zu values)", what, e, tol, n);
}

/* Bit-for-bit equality (dropout masks, pooling, copies). */
static inline void expect_same(const char *what, mgt_backend *gpu, const void *dev, const void *ref,
                               size_t bytes) {
    void *got = hbuf(bytes);
    gpu->ops->to_host(gpu, got, dev, bytes);
    size_t first = bytes;
    for (size_t i = 0; i < bytes && first == bytes; i++)
        if (((const unsigned char *)got)[i] != ((const unsigned char *)ref)[i])
            first = i;
    CHECK(first == bytes, "%s: differs from the CPU from byte %zu of %zu", what, first, bytes);
}

#endif
