/* opcheck.h: what the op tests share: the CHECK counter, a buffer arena freed all at once
 * (LeakSanitizer-clean), seeded random fills through the library's own RNG, and NaN poison.
 * A test defines OPCHECK_KEY (its RNG key) before including this. */
#ifndef MGT_TEST_OPCHECK_H
#define MGT_TEST_OPCHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
