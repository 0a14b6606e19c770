/* gpu_vec.h: for the kernel files (.cu, C++ only): the element types an activation is stored in
 * (float, or bfloat16 with --precision bf16) and 16-byte vector loads and stores of them, so
 * that a memory-bound kernel is written once for both types and moves 16 bytes per access:
 *
 *   bf16               a bfloat16 value as stored (its 16 bits); arithmetic is always in float
 *   to_bf16, from_bf16 rounding to nearest even (a NaN stays a quiet NaN) and exact widening
 *   vec<T>::V          the elements of T in 16 bytes (float 4, bf16 8)
 *   load_v<T, N>(p, f) N consecutive elements at p widened into f[0 .. N), in one access of
 *                      N * sizeof(T) bytes (16, 8 or one element), p aligned to that size
 *   store_v<T, N>(p, f) the reverse, each value rounded once to T
 *   aligned_to(p, b)   whether a pointer allows b-byte accesses
 *   with_act_type(bf, f) f(T{}) for the activation type T (bf16 where bf, else float)
 *
 * The emulation (tests/gpu/emu) compiles these as plain C++, where a 16-byte access through a
 * cast pointer would break the aliasing rules: there they are memcpy calls. */
#ifndef MGT_GPU_VEC_H
#define MGT_GPU_VEC_H

#include <cstdint>
#include <cstring>

struct bf16 {
    uint16_t bits;
};

/* A bfloat16 is the top 16 bits of a float32: the same sign and 8-bit exponent, 7 stored
 * significand bits. Rounding to nearest even adds 0x7fff plus the lowest kept bit and truncates;
 * a carry out of the significand moves into the exponent, which is the correctly rounded result
 * (the largest finite floats round to infinity). A NaN is kept a quiet NaN of the same sign
 * instead (adding could carry it into an infinity). Widening appends 16 zero bits: exact. */
__host__ __device__ inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__host__ __device__ inline float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

__device__ inline float widen(float v) {
    return v;
}
__device__ inline float widen(bf16 v) {
    return from_bf16(v.bits);
}
/* A float as type T (rounded to nearest even for bf16). */
template <class T> __device__ inline T narrow(float v);
template <> __device__ inline float narrow<float>(float v) {
    return v;
}
template <> __device__ inline bf16 narrow<bf16>(float v) {
    return bf16{to_bf16(v)};
}

/* Calls f with a value of the backend's activation type: bf16 with --precision bf16, else
 * float (host code: a launcher written once for both). */
template <class F> inline void with_act_type(bool bf16_act, F &&f) {
    if (bf16_act)
        f(bf16{});
    else
        f(0.0f);
}

template <class T> struct vec { static constexpr int V = 16 / (int)sizeof(T); };

__host__ __device__ inline bool aligned_to(const void *p, unsigned bytes) {
    return ((uintptr_t)p & (uintptr_t)(bytes - 1)) == 0;
}

/* B bytes (16 or 8) from / to memory. */
template <int B> struct raw;
template <> struct raw<16> { using type = uint4; };
template <> struct raw<8> { using type = uint2; };

template <int B> __device__ inline typename raw<B>::type ld_raw(const void *p) {
#ifdef MGT_EMU
    typename raw<B>::type v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    return *static_cast<const typename raw<B>::type *>(p);
#endif
}

template <int B> __device__ inline void st_raw(void *p, typename raw<B>::type v) {
#ifdef MGT_EMU
    memcpy(p, &v, sizeof v);
#else
    *static_cast<typename raw<B>::type *>(p) = v;
#endif
}

template <class T, int N> __device__ inline void load_v(const T *p, float *f) {
    if constexpr (N == 1) {
        f[0] = widen(*p);
    } else {
        constexpr int B = N * (int)sizeof(T);
        static_assert(B == 16 || B == 8, "a vector access is 8 or 16 bytes");
        const auto u = ld_raw<B>(p);
        T e[N];
        memcpy(e, &u, sizeof u);
#pragma unroll
        for (int i = 0; i < N; i++)
            f[i] = widen(e[i]);
    }
}

template <class T, int N> __device__ inline void store_v(T *p, const float *f) {
    if constexpr (N == 1) {
        *p = narrow<T>(f[0]);
    } else {
        constexpr int B = N * (int)sizeof(T);
        static_assert(B == 16 || B == 8, "a vector access is 8 or 16 bytes");
        T e[N];
#pragma unroll
        for (int i = 0; i < N; i++)
            e[i] = narrow<T>(f[i]);
        typename raw<B>::type u;
        memcpy(&u, e, sizeof u);
        st_raw<B>(p, u);
    }
}

/* N elements copied as they are (no widening), e.g. into shared memory. */
template <class T, int N> __device__ inline void copy_v(T *dst, const T *src) {
    if constexpr (N == 1)
        *dst = *src;
    else
        st_raw<N *(int)sizeof(T)>(dst, ld_raw<N *(int)sizeof(T)>(src));
}

template <class T, int N> __device__ inline void zero_v(T *dst) {
    if constexpr (N == 1) {
        *dst = narrow<T>(0.0f);
    } else {
        typename raw<N *(int)sizeof(T)>::type z{};
        st_raw<N *(int)sizeof(T)>(dst, z);
    }
}

#endif
