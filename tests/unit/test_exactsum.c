/* test_exactsum.c: the exact accumulator of --reproducible (src/exactsum.c).
 *
 * 1. Random float32 values of widely varying magnitude (2^-140 .. 2^63, both signs, subnormals,
 *    zeros and cancelling pairs among them), summed in many random orders and random partitions
 *    into "ranks" (each rank its own accumulator, their words added together as the integer
 *    all-reduce adds them, in random rank order), give the same bits every time, and those bits
 *    are the correctly rounded exact sum. The reference is independent of the code under test:
 *    a two's-complement big integer of 32-bit limbs, rounded through long double with the bits
 *    below its 62 leading ones folded into a sticky bit (round to odd: with 38 bits to spare,
 *    the hardware's rounding to float32 is then the correct rounding of the exact value).
 * 2. The documented boundaries: 2^-126 is held exactly, the float below it flushed to zero;
 *    the float below 2^64 is held exactly, 2^64, infinities and NaN are counted as bad and not
 *    added; ties round to even; MGT_XS_MAX_TERMS of the largest value fit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exactsum.h"

#include "tally.h"

/* ---- the reference: a big integer in units of 2^-149 ---- */
enum { NL = 12 }; /* 384 bits: 2^64 * 2^15 terms needs 228 */
typedef struct big {
    uint32_t l[NL];
} big;

static int flushed(float x) {
    return fpclassify(x) == FP_ZERO || fpclassify(x) == FP_SUBNORMAL;
}

/* b += x (x finite, |x| < 2^64, not flushed): its value in units of 2^-149 is an integer. */
static void big_add(big *b, float x) {
    int e2;
    const float f = frexpf(fabsf(x), &e2);        /* |x| = f * 2^e2, f in [0.5, 1) */
    const uint64_t sig = (uint64_t)ldexpf(f, 24); /* 24-bit integer */
    const int p = e2 - 24 + 149;                  /* its last bit's position */
    big t = {{0}};
    for (int b2 = 0; b2 < 24; b2++)
        if ((sig >> b2) & 1)
            t.l[(p + b2) / 32] |= (uint32_t)1 << ((p + b2) % 32);
    if (x < 0) { /* two's complement of t */
        uint64_t c = 1;
        for (int i = 0; i < NL; i++) {
            c += (uint32_t)~t.l[i];
            t.l[i] = (uint32_t)c;
            c >>= 32;
        }
    }
    uint64_t c = 0;
    for (int i = 0; i < NL; i++) {
        c += (uint64_t)b->l[i] + t.l[i];
        b->l[i] = (uint32_t)c;
        c >>= 32;
    }
}

static float big_round(big b) {
    const int neg = (int)(b.l[NL - 1] >> 31);
    if (neg) {
        uint64_t c = 1;
        for (int i = 0; i < NL; i++) {
            c += (uint32_t)~b.l[i];
            b.l[i] = (uint32_t)c;
            c >>= 32;
        }
    }
    int msb = -1;
    for (int i = NL * 32 - 1; i >= 0 && msb < 0; i--)
        if ((b.l[i / 32] >> (i % 32)) & 1)
            msb = i;
    if (msb < 0)
        return 0.0f;
    const int lo = msb >= 61 ? msb - 61 : 0;
    uint64_t m = 0;
    for (int i = msb; i >= lo; i--)
        m = (m << 1) | ((b.l[i / 32] >> (i % 32)) & 1);
    for (int i = 0; i < lo; i++)
        if ((b.l[i / 32] >> (i % 32)) & 1)
            m |= 1; /* sticky */
    const float r = (float)ldexpl((long double)m, lo - 149);
    return neg ? -r : r;
}

/* ---- random values ---- */
static uint64_t rng(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ULL;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float random_value(uint64_t *s) {
    const uint64_t r = rng(s);
    const int kind = (int)(r % 16);
    if (kind == 0)
        return 0.0f;
    if (kind == 1) /* subnormal: flushed */
        return ldexpf((float)(rng(s) % 0x7fffff + 1), -149) * (r & 64 ? -1.0f : 1.0f);
    const int e = (int)(rng(s) % 204) - 140; /* 2^-140 .. 2^63 */
    const float f = 1.0f + (float)(rng(s) >> 41) * (1.0f / 8388608.0f);
    return ldexpf(f, e) * (r & 64 ? -1.0f : 1.0f);
}

static void shuffle(int *a, int n, uint64_t *s) {
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(rng(s) % (uint64_t)(i + 1)), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* The bits of a sum of v[0 .. n) taken in a random order over `ranks` accumulators, combined
 * in a random rank order. */
static uint32_t sum_bits(const float *v, int n, int ranks, uint64_t *s, int64_t *bad) {
    int *ord = malloc(sizeof(int) * (size_t)n), rk[16];
    int64_t w[16][MGT_XS_WORDS], total[MGT_XS_WORDS] = {0};
    memset(w, 0, sizeof w);
    for (int i = 0; i < n; i++)
        ord[i] = i;
    shuffle(ord, n, s);
    for (int i = 0; i < n; i++) /* each value to a random rank, in the shuffled order */
        mgt_xs_add(1, &v[ord[i]], w[rng(s) % (uint64_t)ranks], bad);
    for (int r = 0; r < ranks; r++)
        rk[r] = r;
    shuffle(rk, ranks, s);
    for (int r = 0; r < ranks; r++)
        for (int k = 0; k < MGT_XS_WORDS; k++)
            total[k] += w[rk[r]][k];
    float out;
    mgt_xs_round(1, total, &out);
    free(ord);
    uint32_t u;
    memcpy(&u, &out, sizeof u);
    return u;
}

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* The sum of v[0 .. n) in one accumulator. */
static float xs_sum(const float *v, int n, int64_t *bad) {
    int64_t w[MGT_XS_WORDS] = {0};
    for (int i = 0; i < n; i++)
        mgt_xs_add(1, &v[i], w, bad);
    float out;
    mgt_xs_round(1, w, &out);
    return out;
}

int main(void) {
    tally T = {0}, *t = &T;
    uint64_t s = 12345;

    /* 1. Random sets: order and partition independence, and correct rounding. */
    enum { SETS = 60, N = 1500, TRIALS = 12 };
    float *v = malloc(sizeof(float) * N);
    int same = 1, correct = 1, nonzero = 0;
    for (int set = 0; set < SETS; set++) {
        const int n = set < 10 ? set + 1 : N; /* a few tiny sets too */
        big ref = {{0}};
        for (int i = 0; i < n; i++) {
            v[i] = random_value(&s);
            if (i % 7 == 3 && i > 0)
                v[i] = -v[i - 1]; /* cancelling pairs */
            if (!flushed(v[i]))
                big_add(&ref, v[i]);
        }
        /* a narrow set too, where the exact sum has far more bits than the float sum */
        if (set % 3 == 2)
            for (int i = 0; i < n; i++)
                v[i] = ldexpf(v[i] == 0 ? 0.0f : copysignf(1.0f, v[i]), (int)(rng(&s) % 40));
        if (set % 3 == 2) {
            memset(&ref, 0, sizeof ref);
            for (int i = 0; i < n; i++)
                if (!flushed(v[i]))
                    big_add(&ref, v[i]);
        }
        int64_t bad = 0;
        const uint32_t first = sum_bits(v, n, 1, &s, &bad);
        for (int trial = 0; trial < TRIALS; trial++)
            same &= sum_bits(v, n, 1 + (int)(rng(&s) % 16), &s, &bad) == first;
        const float want = big_round(ref);
        correct &= first == bits_of(want);
        if (first != bits_of(want))
            fprintf(stderr, "set %d: got %a, exact sum rounds to %a\n", set,
                    (double)xs_sum(v, n, &bad), (double)want);
        nonzero += want != 0.0f;
        CHECK(t, bad == 0);
    }
    CHECK(t, same);
    CHECK(t, correct);
    CHECK(t, nonzero > SETS / 2); /* the sets are not trivially zero */

    /* Many elements at once: the vector form gives each element its own sum. */
    {
        enum { M = 257 };
        float a[M], b[M], out[M];
        int64_t w[M * MGT_XS_WORDS] = {0}, bad = 0;
        for (int i = 0; i < M; i++) {
            a[i] = random_value(&s);
            b[i] = random_value(&s);
        }
        mgt_xs_add(M, a, w, &bad);
        mgt_xs_add(M, b, w, &bad);
        mgt_xs_round(M, w, out);
        int ok = 1;
        for (int i = 0; i < M; i++) {
            big r = {{0}};
            if (!flushed(a[i]))
                big_add(&r, a[i]);
            if (!flushed(b[i]))
                big_add(&r, b[i]);
            ok &= bits_of(out[i]) == bits_of(big_round(r));
        }
        CHECK(t, ok);
        CHECK(t, bad == 0);
    }

    /* 2. Boundaries. */
    int64_t bad = 0;
    const float tiny = ldexpf(1.0f, -126), below_tiny = nextafterf(tiny, 0.0f);
    CHECK(t, xs_sum(&tiny, 1, &bad) == tiny);
    CHECK(t, xs_sum(&below_tiny, 1, &bad) == 0.0f); /* flushed */
    const float ntiny = -tiny;
    CHECK(t, xs_sum(&ntiny, 1, &bad) == -tiny);
    const float big64 = ldexpf(1.0f, 64), under64 = nextafterf(big64, 0.0f);
    CHECK(t, xs_sum(&under64, 1, &bad) == under64);
    CHECK(t, bad == 0);
    CHECK(t, xs_sum(&big64, 1, &bad) == 0.0f && bad == 1);
    const float specials[3] = {INFINITY, -INFINITY, NAN};
    bad = 0;
    CHECK(t, xs_sum(specials, 3, &bad) == 0.0f && bad == 3);
    bad = 0;
    /* ties to even, where a float sum in this order would round twice */
    const float tie[2] = {16777216.0f, 1.0f}, over[3] = {16777216.0f, 1.0f, 1.0f};
    CHECK(t, xs_sum(tie, 2, &bad) == 16777216.0f);
    CHECK(t, xs_sum(over, 3, &bad) == 16777218.0f);
    const float sticky[3] = {1.0f, ldexpf(1.0f, -24), ldexpf(1.0f, -60)};
    CHECK(t, xs_sum(sticky, 3, &bad) == 1.0f + ldexpf(1.0f, -23)); /* above the tie */
    CHECK(t, xs_sum(sticky, 2, &bad) == 1.0f);                     /* the tie: even */
    const float cancel[3] = {ldexpf(1.0f, 63), 1.0f, -ldexpf(1.0f, 63)};
    CHECK(t, xs_sum(cancel, 3, &bad) == 1.0f);
    const float zeros[2] = {-0.0f, 0.0f};
    CHECK(t, xs_sum(zeros, 2, &bad) == 0.0f);
    /* The most terms a word may take, each the largest value held: exact, and rounded right. */
    {
        float *many = malloc(sizeof(float) * MGT_XS_MAX_TERMS);
        big r = {{0}};
        for (int i = 0; i < MGT_XS_MAX_TERMS; i++) {
            many[i] = i % 2 ? under64 : -nextafterf(under64, 0.0f);
            big_add(&r, many[i]);
        }
        CHECK(t, bits_of(xs_sum(many, MGT_XS_MAX_TERMS, &bad)) == bits_of(big_round(r)));
        for (int i = 0; i < MGT_XS_MAX_TERMS; i++)
            many[i] = -under64;
        CHECK(t, xs_sum(many, MGT_XS_MAX_TERMS, &bad) == -(float)MGT_XS_MAX_TERMS * under64);
        free(many);
    }
    CHECK(t, bad == 0);
    free(v);

    printf("test_exactsum: %d checks passed", T.pass);
    if (T.fail)
        printf(", %d FAILED", T.fail);
    printf("\n");
    return T.fail ? 1 : 0;
}
