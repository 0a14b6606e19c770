/* gpu_norm.cu: batch normalisation (gpu_norm.h), with what a fusion group (model.h) adds after
 * it in the same pass: the residual sum and the ReLU, forward and backward, as NVIDIA's NHWC
 * batchnorm-add-relu kernels of the MLPerf ResNet-50 do.
 *
 * Memory-bound passes, each tensor read or written once per pass:
 *   statistics  gpu_colsum.h's column sums of x and x^2 (16-byte loads, double partials, a
 *               fixed tree);
 *   apply       y = act((x - mean) * (invstd * gamma) + beta + r): x, r read, y written;
 *   reduce      dbeta = sum dz, dgamma = invstd * sum dz (x - mean), where dz is dy masked by the
 *               group's ReLU: its input recomputed from x (and r) exactly as apply computes it,
 *               or read from the group's output (y > 0) where the model keeps that (no mask is
 *               ever stored);
 *   apply bwd   dx from x, dy (and r), and the residual's gradient dr = dz (or += dz) in the
 *               same pass.
 * The element-wise kernels take a 2-D block (channel vectors by rows) so that a thread's channels
 * stay fixed: their statistics and parameters are loaded once into registers, and no index is
 * divided per element. The normalisation is one fused multiply-add, (x - mean) * scale + beta,
 * written once (bn_z) for apply and the masks. The per-channel finalize is bn_math.h's, shared
 * with the CPU. */
#include <initializer_list>

#include "cpu/bn_math.h"
#include "gpu_colsum.h"

namespace {

/* z before the residual: the normalisation as one rounding of (x - mean) * scale + beta. */
__device__ inline float bn_z(float x, float mean, float scale, float beta) {
    return __fmaf_rn(x - mean, scale, beta);
}

/* A thread's channels' constants for the element-wise passes. */
template <int N> struct chan {
    float mean[N], is[N], g[N], b[N];
    __device__ void load(const mgt_bn_pass &p, int ch0) {
        for (int v = 0; v < N; v++) {
            const int ch = ch0 + v;
            mean[v] = p.mean[ch];
            is[v] = p.invstd[ch];
            g[v] = p.gamma ? p.gamma[ch] : 1.0f;
            b[v] = p.beta ? p.beta[ch] : 0.0f;
        }
    }
    /* z of channel v: the normalisation plus r (one float addition) */
    __device__ float z(int v, float x, const float *r) const {
        const float y = bn_z(x, mean[v], is[v] * g[v], b[v]);
        return r ? y + r[v] : y;
    }
};

/* The 2-D grid of the element-wise kernels: block (bx channel vectors, 256 / bx rows). */
struct grid2 {
    dim3 grid, block;
};
grid2 grid_of(int rows, int cv) {
    const int bx = cv < 32 ? cv : 32, by = kThreads / bx;
    const unsigned gy = (unsigned)((cv + bx - 1) / bx);
    unsigned gx = (unsigned)((rows + by - 1) / by);
    const unsigned most = 4096 / gy > 0 ? 4096 / gy : 1; /* then the rows loop */
    gx = gx > most ? most : gx;
    return grid2{dim3(gx ? gx : 1, gy), dim3((unsigned)bx, (unsigned)by)};
}

/* y = act(z): the pass's residual where RES, its ReLU where RELU. */
template <class T, int N, bool RES, bool RELU>
__global__ void k_bn_apply(mgt_bn_pass p, const T *__restrict__ x, const T *__restrict__ r,
                           T *__restrict__ y) {
    const int ch0 = (blockIdx.y * blockDim.x + threadIdx.x) * N;
    if (ch0 >= p.c)
        return;
    chan<N> k;
    k.load(p, ch0);
    for (unsigned row = blockIdx.x * blockDim.y + threadIdx.y; row < (unsigned)p.rows;
         row += gridDim.x * blockDim.y) {
        const unsigned at = row * (unsigned)p.c + (unsigned)ch0;
        float xv[N], rv[N], out[N];
        load_v<T, N>(x + at, xv);
        if (RES)
            load_v<T, N>(r + at, rv);
        for (int v = 0; v < N; v++) {
            const float z = k.z(v, xv[v], RES ? rv : nullptr);
            out[v] = RELU ? (z < 0.0f ? 0.0f : z) : z; /* a NaN stays NaN, as act_fwd's */
        }
        store_v<T, N>(y + at, out);
    }
}

/* Where the backward passes take the ReLU's mask from: none (no ReLU), z recomputed from x,
 * from x and the residual, or the group's output read (y > 0). */
enum { MASK_NONE = 0, MASK_X = 1, MASK_XR = 2, MASK_Y = 3 };

int mask_of(const mgt_bn_pass &p) {
    if (p.act != MGT_ACT_RELU)
        return MASK_NONE;
    return p.y ? MASK_Y : p.r ? MASK_XR : MASK_X;
}

/* dz of row `at`'s channels: dy masked by the ReLU. */
template <class T, int N, int MASK>
__device__ inline void masked(const chan<N> &k, const mgt_bn_pass &p, const T *x, const T *dy,
                              unsigned at, float *xv, float *dz) {
    load_v<T, N>(x + at, xv);
    load_v<T, N>(dy + at, dz);
    if (MASK == MASK_Y) {
        float yv[N];
        load_v<T, N>(reinterpret_cast<const T *>(p.y) + at, yv);
        for (int v = 0; v < N; v++)
            dz[v] = yv[v] > 0.0f ? dz[v] : 0.0f;
    } else if (MASK != MASK_NONE) {
        float rv[N];
        if (MASK == MASK_XR)
            load_v<T, N>(reinterpret_cast<const T *>(p.r) + at, rv);
        for (int v = 0; v < N; v++)
            dz[v] = k.z(v, xv[v], MASK == MASK_XR ? rv : nullptr) > 0.0f ? dz[v] : 0.0f;
    }
}

/* The reduce pass's terms (gpu_colsum.h): s1 += dz, s2 += dz * (x - mean) (the difference in
 * float, the product in double, as the CPU). */
template <class T_, int N_, int MASK> struct bn_terms {
    using T = T_;
    static constexpr int N = N_;
    mgt_bn_pass p;
    const T *x, *dy;
    chan<N> k;
    __device__ void load(int col0) { k.load(p, col0); }
    __device__ void add(unsigned row, int col0, double *s1, double *s2) const {
        const unsigned at = row * (unsigned)p.c + (unsigned)col0;
        float xv[N], dz[N];
        masked<T, N, MASK>(k, p, x, dy, at, xv, dz);
        for (int v = 0; v < N; v++) {
            s1[v] += dz[v];
            s2[v] += (double)dz[v] * (xv[v] - k.mean[v]);
        }
    }
};

/* dgamma = invstd * sum dz (x - mean), dbeta = sum dz (the CPU's (float)(sum * invstd)). */
struct store_bn {
    const float *invstd;
    float *dgamma, *dbeta;
    __device__ void store(int col, double t1, double t2) const {
        if (dgamma)
            dgamma[col] = (float)(t2 * invstd[col]);
        if (dbeta)
            dbeta[col] = (float)t1;
    }
};

/* dx (where dx is not NULL) and the residual's gradient (dr: 0 none, 1 written, 2 added to). */
template <class T, int N, int MASK>
__global__ void k_bn_bwd_apply(mgt_bn_pass p, float inv_count, const T *__restrict__ x,
                               const T *__restrict__ dy, const float *__restrict__ dgamma,
                               const float *__restrict__ dbeta, T *__restrict__ dx,
                               T *__restrict__ dr, int dr_mode) {
    const int ch0 = (blockIdx.y * blockDim.x + threadIdx.x) * N;
    if (ch0 >= p.c)
        return;
    chan<N> k;
    k.load(p, ch0);
    float dg[N], db[N];
    for (int v = 0; v < N; v++) {
        dg[v] = dgamma[ch0 + v];
        db[v] = dbeta[ch0 + v];
    }
    for (unsigned row = blockIdx.x * blockDim.y + threadIdx.y; row < (unsigned)p.rows;
         row += gridDim.x * blockDim.y) {
        const unsigned at = row * (unsigned)p.c + (unsigned)ch0;
        float xv[N], dz[N];
        masked<T, N, MASK>(k, p, x, dy, at, xv, dz);
        if (dx) {
            float out[N];
            for (int v = 0; v < N; v++) {
                const float xhat = (xv[v] - k.mean[v]) * k.is[v];
                out[v] = k.g[v] * k.is[v] * (dz[v] - (db[v] + xhat * dg[v]) * inv_count);
            }
            store_v<T, N>(dx + at, out);
        }
        if (dr_mode == 2) {
            float old[N];
            load_v<T, N>(dr + at, old);
            for (int v = 0; v < N; v++)
                old[v] += dz[v];
            store_v<T, N>(dr + at, old);
        } else if (dr_mode == 1) {
            store_v<T, N>(dr + at, dz);
        }
    }
}

__global__ void k_bn_finalize(int c, float count, const float *__restrict__ sum,
                              const float *__restrict__ sumsq, float eps, float momentum,
                              const float *__restrict__ shift, float *__restrict__ mean,
                              float *__restrict__ invstd, float *__restrict__ running_mean,
                              float *__restrict__ running_var) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < c)
        mgt_bn_finalize_channel(count, sum[j], sumsq[j], eps, momentum, shift ? shift[j] : 0.0f,
                                &mean[j], &invstd[j], running_mean ? &running_mean[j] : nullptr,
                                running_var ? &running_var[j] : nullptr);
}

__global__ void k_bn_running(int c, float eps, const float *__restrict__ running_mean,
                             const float *__restrict__ running_var, float *__restrict__ mean,
                             float *__restrict__ invstd) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    mean[j] = running_mean[j];
    invstd[j] = (float)(1.0 / sqrt((double)running_var[j] + (double)eps));
}

/* ---- dispatch: the vector path where the channel count and every tensor allow 16 bytes ---- */

template <class T> bool vector_ok(int c, std::initializer_list<const void *> ptrs) {
    if (c % vec<T>::V)
        return false;
    for (const void *q : ptrs)
        if (q && !aligned_to(q, 16))
            return false;
    return true;
}

template <class T, int N, bool RES, bool RELU>
void apply_n(cudaStream_t st, const mgt_bn_pass &p, const T *x, const T *r, T *y) {
    const grid2 g = grid_of(p.rows, p.c / N);
    MGT_LAUNCH((k_bn_apply<T, N, RES, RELU>), g.grid, g.block, st, p, x, r, y);
}

template <class T, int N>
void apply_t(cudaStream_t st, const mgt_bn_pass &p, const T *x, const T *r, T *y) {
    const bool relu = p.act == MGT_ACT_RELU;
    if (r && relu)
        apply_n<T, N, true, true>(st, p, x, r, y);
    else if (r)
        apply_n<T, N, true, false>(st, p, x, r, y);
    else if (relu)
        apply_n<T, N, false, true>(st, p, x, r, y);
    else
        apply_n<T, N, false, false>(st, p, x, r, y);
}

template <class T> void apply(cudaStream_t st, const mgt_bn_pass &p, const T *x, const T *r, T *y) {
    if (p.rows <= 0 || p.c <= 0)
        return;
    if (vector_ok<T>(p.c, {x, y, r}))
        apply_t<T, vec<T>::V>(st, p, x, r, y);
    else
        apply_t<T, 1>(st, p, x, r, y);
}

template <class T, int N, int MASK>
void reduce_n(mgt_gpu_impl *im, const mgt_bn_pass &p, const T *x, const T *dy, float *dgamma,
              float *dbeta) {
    bn_terms<T, N, MASK> f{};
    f.p = p;
    f.x = x;
    f.dy = dy;
    colsum(im->stream, &im->part, (size_t)(p.rows > 0 ? p.rows : 0), p.c, f,
           store_bn{p.invstd, dgamma, dbeta});
}

template <class T, int N>
void reduce_t(mgt_gpu_impl *im, const mgt_bn_pass &p, const T *x, const T *dy, float *dgamma,
              float *dbeta) {
    switch (mask_of(p)) {
    case MASK_Y:
        reduce_n<T, N, MASK_Y>(im, p, x, dy, dgamma, dbeta);
        break;
    case MASK_XR:
        reduce_n<T, N, MASK_XR>(im, p, x, dy, dgamma, dbeta);
        break;
    case MASK_X:
        reduce_n<T, N, MASK_X>(im, p, x, dy, dgamma, dbeta);
        break;
    default:
        reduce_n<T, N, MASK_NONE>(im, p, x, dy, dgamma, dbeta);
        break;
    }
}

template <class T>
void reduce(mgt_gpu_impl *im, const mgt_bn_pass &p, const T *x, const T *dy, float *dgamma,
            float *dbeta) {
    if (p.c <= 0 || (!dgamma && !dbeta))
        return;
    if (vector_ok<T>(p.c, {x, dy, p.r, p.y}))
        reduce_t<T, vec<T>::V>(im, p, x, dy, dgamma, dbeta);
    else
        reduce_t<T, 1>(im, p, x, dy, dgamma, dbeta);
}

struct bwd_args {
    float inv_count;
    const float *dgamma, *dbeta;
    int accumulate;
};

template <class T, int N, int MASK>
void bwd_n(cudaStream_t st, const mgt_bn_pass &p, const bwd_args &a, const T *x, const T *dy, T *dx,
           T *dr) {
    const grid2 g = grid_of(p.rows, p.c / N);
    const int dr_mode = !dr ? 0 : a.accumulate ? 2 : 1;
    MGT_LAUNCH((k_bn_bwd_apply<T, N, MASK>), g.grid, g.block, st, p, a.inv_count, x, dy, a.dgamma,
               a.dbeta, dx, dr, dr_mode);
}

/* The mask as a template argument (the outputs are the same for every element: branches). */
template <class T, int N>
void bwd_t(cudaStream_t st, const mgt_bn_pass &p, const bwd_args &a, const T *x, const T *dy, T *dx,
           T *dr) {
    switch (mask_of(p)) {
    case MASK_Y:
        bwd_n<T, N, MASK_Y>(st, p, a, x, dy, dx, dr);
        break;
    case MASK_XR:
        bwd_n<T, N, MASK_XR>(st, p, a, x, dy, dx, dr);
        break;
    case MASK_X:
        bwd_n<T, N, MASK_X>(st, p, a, x, dy, dx, dr);
        break;
    default:
        bwd_n<T, N, MASK_NONE>(st, p, a, x, dy, dx, dr);
        break;
    }
}

template <class T>
void bwd(cudaStream_t st, const mgt_bn_pass &p, const bwd_args &a, const T *x, const T *dy, T *dx,
         T *dr) {
    if (p.rows <= 0 || p.c <= 0 || (!dx && !dr))
        return;
    if (vector_ok<T>(p.c, {x, dy, p.r, p.y, dx, dr}))
        bwd_t<T, vec<T>::V>(st, p, a, x, dy, dx, dr);
    else
        bwd_t<T, 1>(st, p, a, x, dy, dx, dr);
}

} /* namespace */

extern "C" {

void mgt_gpu_bn_stats(mgt_backend *be, int rows, int c, const float *x, float *sum, float *sumsq) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (c > 0)
        mgt_k_colreduce(im->stream, &im->part, MGT_RED_SUMSQ, im->bf16 ? 2 : 4,
                        (size_t)(rows > 0 ? rows : 0), c, x, sum, sumsq);
}

void mgt_gpu_bn_apply(mgt_backend *be, const mgt_bn_pass *p, float *y) {
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        apply<T>(mgt_gpu_stream(be), *p, (const T *)p->x, (const T *)p->r, (T *)y);
    });
}

void mgt_gpu_bn_finalize(mgt_backend *be, int c, float count, const float *sum, const float *sumsq,
                         float eps, float momentum, const float *shift, float *mean, float *invstd,
                         float *running_mean, float *running_var) {
    if (c <= 0)
        return;
    MGT_LAUNCH(k_bn_finalize, (c + kThreads - 1) / kThreads, kThreads, mgt_gpu_stream(be), c, count,
               sum, sumsq, eps, momentum, shift, mean, invstd, running_mean, running_var);
}

void mgt_gpu_bn_running(mgt_backend *be, int c, float eps, const float *running_mean,
                        const float *running_var, float *mean, float *invstd) {
    if (c <= 0)
        return;
    MGT_LAUNCH(k_bn_running, (c + kThreads - 1) / kThreads, kThreads, mgt_gpu_stream(be), c, eps,
               running_mean, running_var, mean, invstd);
}

void mgt_gpu_bn_bwd_reduce(mgt_backend *be, const mgt_bn_pass *p, const float *dy, float *dgamma,
                           float *dbeta) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    with_act_type(im->bf16, [&](auto t) {
        using T = decltype(t);
        reduce<T>(im, *p, (const T *)p->x, (const T *)dy, dgamma, dbeta);
    });
}

void mgt_gpu_bn_bwd_apply(mgt_backend *be, const mgt_bn_pass *p, float count, const float *dy,
                          const float *dgamma, const float *dbeta, float *dx, float *dr,
                          int accumulate) {
    const bwd_args a = {count > 0.0f ? 1.0f / count : 0.0f, dgamma, dbeta, accumulate};
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        bwd<T>(mgt_gpu_stream(be), *p, a, (const T *)p->x, (const T *)dy, (T *)dx, (T *)dr);
    });
}

} /* extern "C" */
