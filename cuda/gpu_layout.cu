/* gpu_layout.cu: transposes (32x32 tiles through shared memory), explicit zero padding and its
 * adjoint, and Flatten's layout changes built on the transpose (gpu_layout.h). They move values
 * without computing, so they take them as 4- or 2-byte words: float32 or bfloat16 alike. */
#include "gpu_launch.h"

namespace {

constexpr int kTile = 32, kTileRows = 8;

template <class E>
__global__ void k_transpose(size_t batch, size_t rows, size_t cols, const E *__restrict__ src,
                            E *__restrict__ dst) {
    __shared__ E tile[kTile][kTile + 1];
    const size_t per = rows * cols;
    for (size_t k = blockIdx.z; k < batch; k += gridDim.z) {
        const E *s = src + k * per;
        E *d = dst + k * per;
        const size_t c0 = (size_t)blockIdx.x * kTile, r0 = (size_t)blockIdx.y * kTile;
        for (int i = threadIdx.y; i < kTile; i += kTileRows) {
            const size_t r = r0 + i, c = c0 + threadIdx.x;
            if (r < rows && c < cols)
                tile[i][threadIdx.x] = s[r * cols + c];
        }
        __syncthreads();
        for (int i = threadIdx.y; i < kTile; i += kTileRows) {
            const size_t c = c0 + i, r = r0 + threadIdx.x; /* dst is [cols][rows] */
            if (r < rows && c < cols)
                d[c * rows + r] = tile[threadIdx.x][i];
        }
        __syncthreads();
    }
}

/* ---- explicit padding for convolutions cuDNN cannot pad (asymmetric "same") ---- */

template <class E>
__global__ void k_pad_nhwc(size_t total, int h, int w, int c, int hp, int wp, int pt, int pl,
                           const E *__restrict__ x, E *__restrict__ xp) {
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        size_t t = i / c;
        const int px = (int)(t % wp);
        t /= wp;
        const int py = (int)(t % hp);
        const size_t smp = t / hp;
        const int iy = py - pt, ix = px - pl;
        xp[i] = (iy >= 0 && iy < h && ix >= 0 && ix < w)
                    ? x[((smp * h + iy) * (size_t)w + ix) * c + ch]
                    : E(0); /* +0 in either type */
    }
}

template <class E>
__global__ void k_crop_nhwc(size_t total, int h, int w, int c, int hp, int wp, int pt, int pl,
                            const E *__restrict__ dxp, E *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        size_t t = i / c;
        const int ix = (int)(t % w);
        t /= w;
        const int iy = (int)(t % h);
        const size_t smp = t / h;
        const int py = iy + pt, px = ix + pl;
        dx[i] = (py < hp && px < wp) ? dxp[((smp * hp + py) * (size_t)wp + px) * c + ch] : E(0);
    }
}

/* The word type of an element of esize bytes. */
template <class F> void by_size(size_t esize, F f) {
    if (esize == 2)
        f(uint16_t{});
    else
        f(uint32_t{});
}

} /* namespace */

extern "C" {

void mgt_k_transpose(cudaStream_t st, size_t esize, size_t batch, size_t rows, size_t cols,
                     const void *src, void *dst) {
    if (!batch || !rows || !cols)
        return;
    const size_t gz = batch < 65535 ? batch : 65535, gy = (rows + kTile - 1) / kTile;
    const dim3 grid((unsigned)((cols + kTile - 1) / kTile), (unsigned)gy, (unsigned)gz);
    if (gy > 65535) /* checked before the narrowing to unsigned */
        mgt_gpu_fail(MGT_GPU_CUDA, (int)cudaErrorInvalidConfiguration,
                     "k_transpose (more than 2M rows)", __FILE__, __LINE__);
    by_size(esize, [&](auto e) {
        using E = decltype(e);
        MGT_LAUNCH(k_transpose<E>, grid, dim3(kTile, kTileRows), st, batch, rows, cols,
                   (const E *)src, (E *)dst);
    });
}

void mgt_k_pad_nhwc(cudaStream_t st, size_t esize, int n, int h, int w, int c, int hp, int wp,
                    int pt, int pl, const void *x, void *xp) {
    const size_t total = (size_t)n * hp * wp * c;
    if (n <= 0 || !total)
        return;
    by_size(esize, [&](auto e) {
        using E = decltype(e);
        MGT_LAUNCH(k_pad_nhwc<E>, blocks_for(total), kThreads, st, total, h, w, c, hp, wp, pt, pl,
                   (const E *)x, (E *)xp);
    });
}

void mgt_k_crop_nhwc(cudaStream_t st, size_t esize, int n, int h, int w, int c, int hp, int wp,
                     int pt, int pl, const void *dxp, void *dx) {
    const size_t total = (size_t)n * h * w * c;
    if (n <= 0 || !total)
        return;
    by_size(esize, [&](auto e) {
        using E = decltype(e);
        MGT_LAUNCH(k_crop_nhwc<E>, blocks_for(total), kThreads, st, total, h, w, c, hp, wp, pt, pl,
                   (const E *)dxp, (E *)dx);
    });
}

/* One sample is a [hw][c] matrix in NHWC and its transpose [c][hw] in CHW. */
void mgt_gpu_nhwc_to_chw(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y) {
    if (n > 0)
        mgt_k_transpose(mgt_gpu_stream(be), mgt_dtype_size(be->act), (size_t)n, (size_t)h * w,
                        (size_t)c, x, y);
}

void mgt_gpu_chw_to_nhwc(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y) {
    if (n > 0)
        mgt_k_transpose(mgt_gpu_stream(be), mgt_dtype_size(be->act), (size_t)n, (size_t)c,
                        (size_t)h * w, x, y);
}

} /* extern "C" */
