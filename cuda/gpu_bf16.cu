/* gpu_bf16.cu: float <-> bfloat16 for --precision bf16 (see gpu_bf16.h).
 *
 * A bfloat16 is the top 16 bits of a float32: the same sign and 8-bit exponent, 7 stored
 * significand bits. Rounding to nearest even adds 0x7fff plus the lowest kept bit and truncates;
 * a carry out of the significand moves into the exponent, which is the correctly rounded result
 * (the largest finite floats round to infinity). A NaN is kept a quiet NaN of the same sign
 * instead (adding could carry it into an infinity). Widening appends 16 zero bits: exact. */
#include "gpu_launch.h"

namespace {

__host__ __device__ inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ inline float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

__global__ void k_to_bf16(size_t n, const float *__restrict__ x, uint16_t *__restrict__ y) {
    GRID_STRIDE(i, n) {
        y[i] = to_bf16(x[i]);
    }
}

__global__ void k_from_bf16(size_t total, int cols, const uint16_t *__restrict__ x,
                            const float *__restrict__ b, float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        const float v = from_bf16(x[i]);
        y[i] = b ? v + b[i % (size_t)cols] : v;
    }
}

} /* namespace */

extern "C" {

void mgt_k_to_bf16(cudaStream_t st, size_t n, const float *x, uint16_t *y) {
    if (!n)
        return;
    MGT_LAUNCH(k_to_bf16, blocks_for(n), kThreads, st, n, x, y);
}

void mgt_k_from_bf16(cudaStream_t st, size_t rows, int cols, const uint16_t *x, const float *b,
                     float *y) {
    const size_t total = rows * (size_t)(cols > 0 ? cols : 0);
    if (!total)
        return;
    MGT_LAUNCH(k_from_bf16, blocks_for(total), kThreads, st, total, cols, x, b, y);
}

uint16_t mgt_gpu_bf16_twin(float x) {
    return to_bf16(x);
}

} /* extern "C" */
