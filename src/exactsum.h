/* exactsum.h: exact, order-independent sums of float32 values, for --reproducible.
 *
 * A float sum rounds after every addition, so its bits depend on the order of the additions,
 * and a data-parallel step adds its gradients in an order set by the rank count. Here every
 * value is instead added, without rounding, into a fixed-point long accumulator: integer
 * addition is associative, so the result is the same for any order, any grouping into chunks
 * and any split over ranks (an all-reduce of the words with MPI_SUM on int64 is exact too).
 * The exact sum is rounded to float32 once, at the end, correctly (to nearest, ties to even).
 *
 * One accumulator is MGT_XS_WORDS int64 words, word k holding a signed 48-bit digit of weight
 * 2^(48k - 149): 240 bits with the least significant one worth 2^-149, the last bit of the
 * smallest normal float32. So every float32 of magnitude in [2^-126, 2^64) is held exactly;
 * smaller ones (subnormals) are flushed to zero, and larger ones, infinities and NaNs are not
 * added but counted in a separate "bad" counter, which the caller turns into an error. A value
 * touches at most two words (its 24-bit significand shifted into place) and changes each by
 * less than 2^48, so a word can take MGT_XS_MAX_TERMS additions (15 bits of headroom) before it
 * could overflow, words of different accumulators added together included. The words are
 * brought back to digits in [0, 2^48) (carry-normalised) only when the sum is rounded, which
 * does not change the value. */
#ifndef MGT_EXACTSUM_H
#define MGT_EXACTSUM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "util.h" /* MGT_HD */

enum {
    MGT_XS_WORDS = 5,         /* int64 words per accumulator */
    MGT_XS_DIGIT = 48,        /* bits per word's digit */
    MGT_XS_LSB = -149,        /* exponent of the least significant bit */
    MGT_XS_MAX_EXP = 64,      /* values of magnitude >= 2^64 do not fit */
    MGT_XS_MAX_TERMS = 32767, /* additions per element before a word could overflow */
};

/* Adds n floats into n accumulators: words[i*MGT_XS_WORDS ...] += x[i] exactly. Each value
 * that cannot be held (|x| >= 2^64, inf, NaN) adds 1 to *bad instead. */
void mgt_xs_add(size_t n, const float *x, int64_t *words, int64_t *bad);

/* The float32 nearest to each accumulator's exact value (ties to even), into out[i]. The
 * words may be left carry-normalised (the same value). A sum beyond float32's range gives +-inf,
 * which cannot happen for fewer than 2^64 terms. */
void mgt_xs_round(size_t n, int64_t *words, float *out);

/* ---- one accumulator, as the host loops above and the GPU's kernels use it (one source, so
 * the two give the same words and the same floats) ---- */

#define MGT_XS_DIGIT_MASK ((((int64_t)1) << MGT_XS_DIGIT) - 1)

/* w[0 .. MGT_XS_WORDS) += x exactly; returns 1 (nothing added) when x cannot be held. */
MGT_HD static inline int mgt_xs_add_one(float x, int64_t *w) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const int e = (int)((u >> 23) & 0xff);
    if (e == 0) /* zero or subnormal: flushed */
        return 0;
    /* e == 255 is inf or NaN; 127 + 64 is 2^64 */
    if (e >= 127 + MGT_XS_MAX_EXP)
        return 1;
    /* value = sig * 2^(e - 150); its last bit sits at bit e - 150 - MGT_XS_LSB = e - 1 */
    const uint64_t sig = (u & 0x7fffffu) | 0x800000u;
    const int p = e - 1, k = p / MGT_XS_DIGIT, s = p % MGT_XS_DIGIT;
    /* the low 48 bits of sig << s are right even where the 64-bit shift drops high bits */
    const int64_t lo = (int64_t)((sig << s) & (uint64_t)MGT_XS_DIGIT_MASK);
    const int64_t hi = (int64_t)(sig >> (MGT_XS_DIGIT - s));
    if (u >> 31) {
        w[k] -= lo;
        w[k + 1] -= hi;
    } else {
        w[k] += lo;
        w[k + 1] += hi;
    }
    return 0;
}

/* Carries every word's excess into the next: digits 0 .. K-2 end in [0, 2^48), the last word
 * keeps the sign. Returns the last word. */
MGT_HD static inline int64_t mgt_xs_normalise(int64_t *w) {
    for (int k = 0; k + 1 < MGT_XS_WORDS; k++) {
        const int64_t c = w[k] >> MGT_XS_DIGIT; /* arithmetic shift: floor division */
        w[k] -= c * ((int64_t)1 << MGT_XS_DIGIT);
        w[k + 1] += c;
    }
    return w[MGT_XS_WORDS - 1];
}

/* Bits [lo, lo + n) of the non-negative number held by 48-bit digits d[0 .. nd), lo >= 0 and
 * n <= 48: they span at most two digits. */
MGT_HD static inline uint64_t mgt_xs_bits(const uint64_t *d, int nd, int lo, int n) {
    const int k = lo / MGT_XS_DIGIT, s = lo % MGT_XS_DIGIT;
    uint64_t v = k < nd ? d[k] >> s : 0;
    if (s + n > MGT_XS_DIGIT && k + 1 < nd)
        v |= d[k + 1] << (MGT_XS_DIGIT - s);
    return v & (((uint64_t)1 << n) - 1);
}

/* Whether any of bits [0, below) is set. */
MGT_HD static inline int mgt_xs_any_below(const uint64_t *d, int below) {
    for (int k = 0; k * MGT_XS_DIGIT < below; k++) {
        const int n = below - k * MGT_XS_DIGIT;
        const uint64_t mask =
            n >= MGT_XS_DIGIT ? (uint64_t)MGT_XS_DIGIT_MASK : ((uint64_t)1 << n) - 1;
        if (d[k] & mask)
            return 1;
    }
    return 0;
}

/* Leading zero bits of v != 0. */
MGT_HD static inline int mgt_xs_clz64(uint64_t v) {
#ifdef __CUDA_ARCH__
    return __clzll((long long)v);
#else
    return __builtin_clzll(v);
#endif
}

/* The float32 nearest to the accumulator's value (ties to even); leaves w carry-normalised. */
MGT_HD static inline float mgt_xs_round_one(int64_t *w) {
    int neg = mgt_xs_normalise(w) < 0;
    if (neg) { /* the magnitude: negate every word and carry again */
        for (int k = 0; k < MGT_XS_WORDS; k++)
            w[k] = -w[k];
        mgt_xs_normalise(w);
    }
    /* Digits of the magnitude, the last word split so that every digit has 48 bits. */
    enum { ND = MGT_XS_WORDS + 1 };
    uint64_t d[ND];
    for (int k = 0; k < MGT_XS_WORDS; k++)
        d[k] = (uint64_t)w[k];
    d[ND - 1] = d[ND - 2] >> MGT_XS_DIGIT;
    d[ND - 2] &= (uint64_t)MGT_XS_DIGIT_MASK;
    if (neg) /* leave the words as the value they held */
        for (int k = 0; k < MGT_XS_WORDS; k++)
            w[k] = -w[k];
    int top = ND - 1;
    while (top >= 0 && d[top] == 0)
        top--;
    if (top < 0)
        return 0.0f;
    const int msb = top * MGT_XS_DIGIT + 63 - mgt_xs_clz64(d[top]);
    float r;
    if (msb < 24) { /* below 2^-125: a float (normal or subnormal) holds it exactly */
        r = ldexpf((float)mgt_xs_bits(d, ND, 0, 24), MGT_XS_LSB);
    } else {
        /* the 24 leading bits, then round to nearest, ties to even, on the bits below them */
        uint64_t sig = mgt_xs_bits(d, ND, msb - 23, 24);
        const int half = (int)mgt_xs_bits(d, ND, msb - 24, 1);
        const int rest = mgt_xs_any_below(d, msb - 24);
        if (half && (rest || (sig & 1)))
            sig++; /* 2^24 when it carries out: still exact in a float, one exponent up */
        r = ldexpf((float)sig, msb - 23 + MGT_XS_LSB);
    }
    return neg ? -r : r;
}

#endif
