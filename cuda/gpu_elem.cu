/* gpu_elem.cu: element- and row-wise kernels (gpu_elem.h), each following its twin in
 * cpu_elem.c: the same formulas, the same NaN behaviour of the comparisons, sums in double. */
#include "gpu_launch.h"
#include "util.h"

namespace {

__global__ void k_add(size_t n, const float *__restrict__ x, float *__restrict__ y) {
    GRID_STRIDE(i, n) {
        y[i] += x[i];
    }
}

/* ---- dropout: element j of sample i uses counter (first_sample + i) * row + j, which is
 * first_sample * row + (flat index) in 64-bit arithmetic, exactly as on the CPU. ---- */

__global__ void k_dropout(size_t total, uint64_t base, float rate, float keep_scale, uint64_t key,
                          float *__restrict__ x) {
    GRID_STRIDE(i, total) {
        x[i] = mgt_uniform(key, base + (uint64_t)i) >= rate ? x[i] * keep_scale : 0.0f;
    }
}

/* ---- activations ---- */

__device__ inline float sigmoid_f(float v) {
    if (v >= 0.0f)
        return 1.0f / (1.0f + expf(-v));
    const float e = expf(v);
    return e / (1.0f + e);
}

__global__ void k_act_fwd(size_t total, int act, float *__restrict__ x) {
    GRID_STRIDE(i, total) {
        const float v = x[i];
        if (act == MGT_ACT_RELU)
            x[i] = v < 0.0f ? 0.0f : v; /* NaN stays NaN, as on the CPU */
        else if (act == MGT_ACT_SIGMOID)
            x[i] = sigmoid_f(v);
        else if (act == MGT_ACT_TANH)
            x[i] = tanhf(v);
    }
}

__global__ void k_act_bwd(size_t total, int act, const float *__restrict__ y,
                          float *__restrict__ dy) {
    GRID_STRIDE(i, total) {
        const float yi = y[i];
        if (act == MGT_ACT_RELU)
            dy[i] = yi > 0.0f ? dy[i] : 0.0f;
        else if (act == MGT_ACT_SIGMOID)
            dy[i] *= yi * (1.0f - yi);
        else if (act == MGT_ACT_TANH)
            dy[i] *= 1.0f - yi * yi;
    }
}

__global__ void k_softmax_fwd(int n, int k, float *__restrict__ x) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)n)
        return;
    float *r = x + row * (size_t)k;
    const float mx = row_max(r, k, lane);
    double sum = 0.0;
    for (int j = lane; j < k; j += 32) {
        const float e = expf(r[j] - mx);
        r[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    const float inv = (float)(1.0 / sum);
    for (int j = lane; j < k; j += 32)
        r[j] *= inv;
}

__global__ void k_softmax_bwd(int n, int k, const float *__restrict__ y, float *__restrict__ dy) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)n)
        return;
    const float *yr = y + row * (size_t)k;
    float *gr = dy + row * (size_t)k;
    double dot = 0.0;
    for (int j = lane; j < k; j += 32)
        dot += (double)gr[j] * yr[j];
    const float d = (float)warp_sum(dot);
    for (int j = lane; j < k; j += 32)
        gr[j] = yr[j] * (gr[j] - d);
}

} /* namespace */

extern "C" {

void mgt_gpu_add(mgt_backend *be, size_t n, const float *x, float *y) {
    if (!n)
        return;
    MGT_LAUNCH(k_add, blocks_for(n), kThreads, mgt_gpu_stream(be), n, x, y);
}

/* The keep scale is computed here, in float, exactly as cpu_elem.c does. */
void mgt_gpu_dropout(mgt_backend *be, int n, int row, float rate, uint64_t key,
                     uint64_t first_sample, float *x) {
    if (!(rate > 0.0f) || n <= 0 || row <= 0)
        return;
    const float keep_scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f;
    const size_t total = (size_t)n * row;
    MGT_LAUNCH(k_dropout, blocks_for(total), kThreads, mgt_gpu_stream(be), total,
               first_sample * (uint64_t)row, rate, keep_scale, key, x);
}

void mgt_gpu_act_fwd(mgt_backend *be, mgt_act act, int n, int row, float *x) {
    if (n <= 0 || row <= 0 || act == MGT_ACT_NONE)
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    if (act == MGT_ACT_SOFTMAX) {
        MGT_LAUNCH(k_softmax_fwd, (unsigned)((n + 7) / 8), kThreads, st, n, row, x);
        return;
    }
    if (act != MGT_ACT_RELU && act != MGT_ACT_SIGMOID && act != MGT_ACT_TANH)
        return;
    const size_t total = (size_t)n * row;
    MGT_LAUNCH(k_act_fwd, blocks_for(total), kThreads, st, total, (int)act, x);
}

void mgt_gpu_act_bwd(mgt_backend *be, mgt_act act, int n, int row, const float *y, float *dy) {
    if (n <= 0 || row <= 0 || act == MGT_ACT_NONE)
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    if (act == MGT_ACT_SOFTMAX) {
        MGT_LAUNCH(k_softmax_bwd, (unsigned)((n + 7) / 8), kThreads, st, n, row, y, dy);
        return;
    }
    if (act != MGT_ACT_RELU && act != MGT_ACT_SIGMOID && act != MGT_ACT_TANH)
        return;
    const size_t total = (size_t)n * row;
    MGT_LAUNCH(k_act_bwd, blocks_for(total), kThreads, st, total, (int)act, y, dy);
}

uint64_t mgt_gpu_rand64_twin(uint64_t key, uint64_t counter) {
    return mgt_rand64(key, counter);
}

float mgt_gpu_uniform_twin(uint64_t key, uint64_t counter) {
    return mgt_uniform(key, counter);
}

} /* extern "C" */
