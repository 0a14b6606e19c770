/* gpu_elem.cu: element- and row-wise kernels (gpu_elem.h), each following its twin in
 * cpu_elem.c: the same formulas, the same NaN behaviour of the comparisons, sums in double. */
#include "gpu_launch.h"
#include "gpu_vec.h"
#include "util.h"

namespace {

__global__ void k_add(size_t n, const float *__restrict__ x, float *__restrict__ y) {
    GRID_STRIDE(i, n) {
        y[i] += x[i];
    }
}

/* ---- dropout: element j of sample i uses counter (first_sample + i) * row + j, which is
 * first_sample * row + (flat index) in 64-bit arithmetic, exactly as on the CPU. ---- */

template <class T>
__global__ void k_dropout(size_t total, uint64_t base, float rate, float keep_scale, uint64_t key,
                          T *__restrict__ x) {
    GRID_STRIDE(i, total) {
        x[i] = narrow<T>(mgt_uniform(key, base + (uint64_t)i) >= rate ? widen(x[i]) * keep_scale
                                                                      : 0.0f);
    }
}

/* ---- activations ---- */

__device__ inline float sigmoid_f(float v) {
    if (v >= 0.0f)
        return 1.0f / (1.0f + expf(-v));
    const float e = expf(v);
    return e / (1.0f + e);
}

/* The GELUs as cpu_elem.c forms them: the exact one with erf, the tanh one with
 * tanh(u) = 1 - 2 / (e^2u + 1) (its vectorised form there), and their derivatives from x. */
constexpr float kGeluK = 0.7978845608028654f; /* sqrt(2 / pi) */
constexpr float kGeluA = 0.044715f;

__device__ inline float gelu_th(float x) {
    const float e = expf(2.0f * (kGeluK * (x + kGeluA * x * x * x)));
    return 1.0f - 2.0f / (e + 1.0f);
}

__device__ inline float gelu_f(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

__device__ inline float gelu_grad(float x) {
    return 0.5f * (1.0f + erff(x * 0.7071067811865476f)) +
           x * 0.3989422804014327f * expf(-0.5f * x * x);
}

/* f(v) for the element-wise activations (MGT_ACT_NONE: v). */
__device__ inline float act_f(int act, float v) {
    if (act == MGT_ACT_GELU)
        return gelu_f(v);
    if (act == MGT_ACT_GELU_TANH)
        return 0.5f * v * (1.0f + gelu_th(v));
    if (act == MGT_ACT_RELU)
        return v < 0.0f ? 0.0f : v; /* NaN stays NaN, as on the CPU */
    if (act == MGT_ACT_SIGMOID)
        return sigmoid_f(v);
    if (act == MGT_ACT_TANH)
        return tanhf(v);
    return v;
}

/* dy * f'(x) written with y = f(x), the CPU's expressions; for the GELUs y is x itself
 * (mgt_act_bwd_reads_x). */
__device__ inline float act_g(int act, float y, float dy) {
    if (act == MGT_ACT_GELU)
        return dy * gelu_grad(y);
    if (act == MGT_ACT_GELU_TANH) {
        const float th = gelu_th(y);
        return dy * (0.5f * (1.0f + th) +
                     0.5f * y * (1.0f - th * th) * kGeluK * (1.0f + 3.0f * kGeluA * y * y));
    }
    if (act == MGT_ACT_RELU)
        return y > 0.0f ? dy : 0.0f;
    if (act == MGT_ACT_SIGMOID)
        return dy * (y * (1.0f - y));
    if (act == MGT_ACT_TANH)
        return dy * (1.0f - y * y);
    return dy;
}

/* y = f(x) over `vecs` vectors of N elements (y may be x). */
template <class T, int N> __global__ void k_act_fwd(unsigned vecs, int act, const T *x, T *y) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < vecs;
         i += gridDim.x * blockDim.x) {
        float v[N];
        load_v<T, N>(x + i * N, v);
        for (int k = 0; k < N; k++)
            v[k] = act_f(act, v[k]);
        store_v<T, N>(y + i * N, v);
    }
}

/* dx = dy * f'(y), or dx += it (dx may be dy without ACC; y unread and may be NULL without an
 * activation). */
template <class T, int N, bool ACC>
__global__ void k_act_bwd(unsigned vecs, int act, const T *__restrict__ y, const T *dy, T *dx) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < vecs;
         i += gridDim.x * blockDim.x) {
        float yv[N] = {}, g[N], d[N];
        if (act != MGT_ACT_NONE) /* y: NULL without an activation */
            load_v<T, N>(y + i * N, yv);
        load_v<T, N>(dy + i * N, g);
        if (ACC)
            load_v<T, N>(dx + i * N, d);
        for (int k = 0; k < N; k++) {
            g[k] = act_g(act, yv[k], g[k]);
            if (ACC)
                g[k] = d[k] + g[k];
        }
        store_v<T, N>(dx + i * N, g);
    }
}

/* Softmax of each row of k values: x and y in the types Tx and Ty (y may be x). */
template <class Tx, class Ty> __global__ void k_softmax_fwd(int n, int k, const Tx *x, Ty *y) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)n)
        return;
    const Tx *xr = x + row * (size_t)k;
    Ty *r = y + row * (size_t)k;
    float mx = -INFINITY;
    bool any = false;
    for (int j = lane; j < k; j += 32) { /* row_max's rule */
        const float v = widen(xr[j]);
        if (!any || v > mx)
            mx = v;
        any = true;
    }
    mx = warp_max(mx);
    double sum = 0.0;
    for (int j = lane; j < k; j += 32) {
        const float e = expf(widen(xr[j]) - mx);
        sum += e;
    }
    sum = warp_sum(sum);
    const float inv = (float)(1.0 / sum);
    __syncwarp();
    for (int j = lane; j < k; j += 32)
        r[j] = narrow<Ty>(expf(widen(xr[j]) - mx) * inv);
}

template <class T>
__global__ void k_softmax_bwd(int n, int k, const T *__restrict__ y, const T *dy, T *dx,
                              int accumulate) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)n)
        return;
    const T *yr = y + row * (size_t)k, *gr = dy + row * (size_t)k;
    T *xr = dx + row * (size_t)k;
    double dot = 0.0;
    for (int j = lane; j < k; j += 32)
        dot += (double)widen(gr[j]) * widen(yr[j]);
    const float d = (float)warp_sum(dot);
    __syncwarp();
    for (int j = lane; j < k; j += 32) {
        const float g = widen(yr[j]) * (widen(gr[j]) - d);
        xr[j] = narrow<T>(accumulate ? widen(xr[j]) + g : g);
    }
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
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        MGT_LAUNCH(k_dropout<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total,
                   first_sample * (uint64_t)row, rate, keep_scale, key, (T *)x);
    });
}

void mgt_k_softmax_f32(cudaStream_t st, int n, int row, const float *x, float *y) {
    if (n > 0 && row > 0)
        MGT_LAUNCH((k_softmax_fwd<float, float>), (unsigned)((n + 7) / 8), kThreads, st, n, row, x,
                   y);
}

void mgt_gpu_act_fwd(mgt_backend *be, mgt_act act, int n, int row, const float *x, float *y) {
    if (n <= 0 || row <= 0 || (act == MGT_ACT_NONE && x == y))
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        const T *xt = (const T *)x;
        T *yt = (T *)y;
        if (act == MGT_ACT_SOFTMAX) {
            MGT_LAUNCH((k_softmax_fwd<T, T>), (unsigned)((n + 7) / 8), kThreads, st, n, row, xt,
                       yt);
            return;
        }
        const size_t total = (size_t)n * row;
        constexpr int V = vec<T>::V;
        if (total % V == 0 && aligned_to(x, 16) && aligned_to(y, 16))
            MGT_LAUNCH((k_act_fwd<T, V>), blocks_for(total / V), kThreads, st,
                       (unsigned)(total / V), (int)act, xt, yt);
        else
            MGT_LAUNCH((k_act_fwd<T, 1>), blocks_for(total), kThreads, st, (unsigned)total,
                       (int)act, xt, yt);
    });
}

void mgt_gpu_act_bwd(mgt_backend *be, mgt_act act, int n, int row, const float *y, const float *dy,
                     float *dx, int accumulate) {
    if (n <= 0 || row <= 0 || (act == MGT_ACT_NONE && dx == dy && !accumulate))
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        const T *yt = (const T *)y, *dyt = (const T *)dy;
        T *dxt = (T *)dx;
        if (act == MGT_ACT_SOFTMAX) {
            MGT_LAUNCH(k_softmax_bwd<T>, (unsigned)((n + 7) / 8), kThreads, st, n, row, yt, dyt,
                       dxt, accumulate);
            return;
        }
        const size_t total = (size_t)n * row;
        constexpr int V = vec<T>::V;
        const bool v = total % V == 0 && aligned_to(y ? (const void *)y : dy, 16) &&
                       aligned_to(dy, 16) && aligned_to(dx, 16);
        const unsigned vecs = (unsigned)(v ? total / V : total);
        if (v && accumulate)
            MGT_LAUNCH((k_act_bwd<T, V, true>), blocks_for(vecs), kThreads, st, vecs, (int)act, yt,
                       dyt, dxt);
        else if (v)
            MGT_LAUNCH((k_act_bwd<T, V, false>), blocks_for(vecs), kThreads, st, vecs, (int)act, yt,
                       dyt, dxt);
        else if (accumulate)
            MGT_LAUNCH((k_act_bwd<T, 1, true>), blocks_for(vecs), kThreads, st, vecs, (int)act, yt,
                       dyt, dxt);
        else
            MGT_LAUNCH((k_act_bwd<T, 1, false>), blocks_for(vecs), kThreads, st, vecs, (int)act, yt,
                       dyt, dxt);
    });
}

uint64_t mgt_gpu_rand64_twin(uint64_t key, uint64_t counter) {
    return mgt_rand64(key, counter);
}

float mgt_gpu_uniform_twin(uint64_t key, uint64_t counter) {
    return mgt_uniform(key, counter);
}

} /* extern "C" */
