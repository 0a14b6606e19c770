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

#include <stddef.h>
#include <stdint.h>

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

#endif
