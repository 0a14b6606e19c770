/* util.h: the error record every module fills, and the counter-based RNG.
 *
 * Library code never prints and never exits: a function that can fail on bad input returns -1
 * and writes one sentence into an mgt_err (what is wrong, where, what to do). The caller that
 * owns the process (trainer, CLI) decides how the job ends. Tests assert on the sentence.
 *
 * The RNG is a pure function of (key, counter): no state, so a dropout mask or a shuffle is the
 * same whatever the thread count, the rank count or the backend (the GPU kernels use the same
 * integer arithmetic). */
#ifndef MGT_UTIL_H
#define MGT_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* The RNG below is compiled for the device too (cuda/), so both backends share one source. */
#ifdef __CUDACC__
#define MGT_HD __host__ __device__
#else
#define MGT_HD
#endif

typedef struct mgt_err {
    char msg[1024];
} mgt_err;

/* Formats into e->msg (if e is not NULL) and returns -1, so callers can `return mgt_errf(...)`. */
int mgt_errf(mgt_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* SplitMix64 finalizer: a bijective 64-bit mixer. */
MGT_HD static inline uint64_t mgt_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Derives a stream key from up to three integers (seed, purpose, index...). */
MGT_HD static inline uint64_t mgt_key3(uint64_t a, uint64_t b, uint64_t c) {
    return mgt_mix64(mgt_mix64(mgt_mix64(a) ^ b) ^ c);
}

/* The counter-th 64-bit draw of stream `key`. */
MGT_HD static inline uint64_t mgt_rand64(uint64_t key, uint64_t counter) {
    return mgt_mix64(key ^ mgt_mix64(counter));
}

/* Uniform float in [0, 1) with 24 random bits: exact in float32 on every backend. */
MGT_HD static inline float mgt_uniform(uint64_t key, uint64_t counter) {
    return (float)(mgt_rand64(key, counter) >> 40) * (1.0f / 16777216.0f);
}

/* Monotonic wall clock in seconds. */
double mgt_now(void);

#endif
