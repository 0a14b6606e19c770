/* gpu_layout.cu: transposes (32x32 tiles through shared memory), explicit zero padding and its
 * adjoint, and Flatten's layout changes built on the transpose (gpu_layout.h). */
#include "gpu_launch.h"

namespace {

constexpr int kTile = 32, kTileRows = 8;

__global__ void k_transpose(size_t batch, size_t rows, size_t cols, const float *__restrict__ src,
                            float *__restrict__ dst) {
    __shared__ float tile[kTile][kTile + 1];
    const size_t per = rows * cols;
    for (size_t k = blockIdx.z; k < batch; k += gridDim.z) {
        const float *s = src + k * per;
        float *d = dst + k * per;
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

__global__ void k_pad_nhwc(size_t total, int h, int w, int c, int hp, int wp, int pt, int pl,
                           const float *__restrict__ x, float *__restrict__ xp) {
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
                    : 0.0f;
    }
}

__global__ void k_crop_nhwc(size_t total, int h, int w, int c, int hp, int wp, int pt, int pl,
                            const float *__restrict__ dxp, float *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        size_t t = i / c;
        const int ix = (int)(t % w);
        t /= w;
        const int iy = (int)(t % h);
        const size_t smp = t / h;
        const int py = iy + pt, px = ix + pl;
        dx[i] = (py < hp && px < wp) ? dxp[((smp * hp + py) * (size_t)wp + px) * c + ch] : 0.0f;
    }
}

} /* namespace */

extern "C" {

void mgt_k_transpose(cudaStream_t st, size_t batch, size_t rows, size_t cols, const float *src,
                     float *dst) {
    if (!batch || !rows || !cols)
        return;
    const size_t gz = batch < 65535 ? batch : 65535, gy = (rows + kTile - 1) / kTile;
    const dim3 grid((unsigned)((cols + kTile - 1) / kTile), (unsigned)gy, (unsigned)gz);
    if (gy > 65535) /* checked before the narrowing to unsigned */
        mgt_gpu_fail(MGT_GPU_CUDA, (int)cudaErrorInvalidConfiguration,
                     "k_transpose (more than 2M rows)", __FILE__, __LINE__);
    MGT_LAUNCH(k_transpose, grid, dim3(kTile, kTileRows), st, batch, rows, cols, src, dst);
}

void mgt_k_pad_nhwc(cudaStream_t st, int n, int h, int w, int c, int hp, int wp, int pt, int pl,
                    const float *x, float *xp) {
    const size_t total = (size_t)n * hp * wp * c;
    if (n <= 0 || !total)
        return;
    MGT_LAUNCH(k_pad_nhwc, blocks_for(total), kThreads, st, total, h, w, c, hp, wp, pt, pl, x, xp);
}

void mgt_k_crop_nhwc(cudaStream_t st, int n, int h, int w, int c, int hp, int wp, int pt, int pl,
                     const float *dxp, float *dx) {
    const size_t total = (size_t)n * h * w * c;
    if (n <= 0 || !total)
        return;
    MGT_LAUNCH(k_crop_nhwc, blocks_for(total), kThreads, st, total, h, w, c, hp, wp, pt, pl, dxp,
               dx);
}

/* One sample is a [hw][c] matrix in NHWC and its transpose [c][hw] in CHW. */
void mgt_gpu_nhwc_to_chw(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y) {
    if (n > 0)
        mgt_k_transpose(mgt_gpu_stream(be), (size_t)n, (size_t)h * w, (size_t)c, x, y);
}

void mgt_gpu_chw_to_nhwc(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y) {
    if (n > 0)
        mgt_k_transpose(mgt_gpu_stream(be), (size_t)n, (size_t)c, (size_t)h * w, x, y);
}

} /* extern "C" */
