/* exactsum.c: the fixed-point long accumulator (see exactsum.h). */
#include "exactsum.h"

#include <math.h>
#include <string.h>

#define DIGIT_MASK ((((int64_t)1) << MGT_XS_DIGIT) - 1)

void mgt_xs_add(size_t n, const float *x, int64_t *words, int64_t *bad) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        const int e = (int)((u >> 23) & 0xff);
        if (e == 0) /* zero or subnormal: flushed */
            continue;
        /* e == 255 is inf or NaN; 127 + 64 is 2^64 */
        if (e >= 127 + MGT_XS_MAX_EXP) {
            (*bad)++;
            continue;
        }
        /* value = sig * 2^(e - 150); its last bit sits at bit e - 150 - MGT_XS_LSB = e - 1 */
        const uint64_t sig = (u & 0x7fffffu) | 0x800000u;
        const int p = e - 1, k = p / MGT_XS_DIGIT, s = p % MGT_XS_DIGIT;
        /* the low 48 bits of sig << s are right even where the 64-bit shift drops high bits */
        const int64_t lo = (int64_t)((sig << s) & (uint64_t)DIGIT_MASK);
        const int64_t hi = (int64_t)(sig >> (MGT_XS_DIGIT - s));
        int64_t *w = words + i * MGT_XS_WORDS;
        if (u >> 31) {
            w[k] -= lo;
            w[k + 1] -= hi;
        } else {
            w[k] += lo;
            w[k + 1] += hi;
        }
    }
}

/* Carries every word's excess into the next: digits 0 .. K-2 end in [0, 2^48), the last word
 * keeps the sign. Returns the last word. */
static int64_t normalise(int64_t *w) {
    for (int k = 0; k + 1 < MGT_XS_WORDS; k++) {
        const int64_t c = w[k] >> MGT_XS_DIGIT; /* arithmetic shift: floor division */
        w[k] -= c * ((int64_t)1 << MGT_XS_DIGIT);
        w[k + 1] += c;
    }
    return w[MGT_XS_WORDS - 1];
}

/* Bits [lo, lo + n) of the non-negative number held by 48-bit digits d[0 .. nd), lo >= 0 and
 * n <= 48: they span at most two digits. */
static uint64_t bits(const uint64_t *d, int nd, int lo, int n) {
    const int k = lo / MGT_XS_DIGIT, s = lo % MGT_XS_DIGIT;
    uint64_t v = k < nd ? d[k] >> s : 0;
    if (s + n > MGT_XS_DIGIT && k + 1 < nd)
        v |= d[k + 1] << (MGT_XS_DIGIT - s);
    return v & (((uint64_t)1 << n) - 1);
}

/* Whether any of bits [0, below) is set. */
static int any_below(const uint64_t *d, int below) {
    for (int k = 0; k * MGT_XS_DIGIT < below; k++) {
        const int n = below - k * MGT_XS_DIGIT;
        const uint64_t mask = n >= MGT_XS_DIGIT ? (uint64_t)DIGIT_MASK : ((uint64_t)1 << n) - 1;
        if (d[k] & mask)
            return 1;
    }
    return 0;
}

static float round_one(int64_t *w) {
    int neg = normalise(w) < 0;
    if (neg) { /* the magnitude: negate every word and carry again */
        for (int k = 0; k < MGT_XS_WORDS; k++)
            w[k] = -w[k];
        normalise(w);
    }
    /* Digits of the magnitude, the last word split so that every digit has 48 bits. */
    enum { ND = MGT_XS_WORDS + 1 };
    uint64_t d[ND];
    for (int k = 0; k < MGT_XS_WORDS; k++)
        d[k] = (uint64_t)w[k];
    d[ND - 1] = d[ND - 2] >> MGT_XS_DIGIT;
    d[ND - 2] &= (uint64_t)DIGIT_MASK;
    if (neg) /* leave the words as the value they held */
        for (int k = 0; k < MGT_XS_WORDS; k++)
            w[k] = -w[k];
    int top = ND - 1;
    while (top >= 0 && d[top] == 0)
        top--;
    if (top < 0)
        return 0.0f;
    const int msb = top * MGT_XS_DIGIT + 63 - __builtin_clzll(d[top]);
    float r;
    if (msb < 24) { /* below 2^-125: a float (normal or subnormal) holds it exactly */
        r = ldexpf((float)bits(d, ND, 0, 24), MGT_XS_LSB);
    } else {
        /* the 24 leading bits, then round to nearest, ties to even, on the bits below them */
        uint64_t sig = bits(d, ND, msb - 23, 24);
        const int half = (int)bits(d, ND, msb - 24, 1);
        const int rest = any_below(d, msb - 24);
        if (half && (rest || (sig & 1)))
            sig++; /* 2^24 when it carries out: still exact in a float, one exponent up */
        r = ldexpf((float)sig, msb - 23 + MGT_XS_LSB);
    }
    return neg ? -r : r;
}

void mgt_xs_round(size_t n, int64_t *words, float *out) {
    for (size_t i = 0; i < n; i++)
        out[i] = round_one(words + i * MGT_XS_WORDS);
}
