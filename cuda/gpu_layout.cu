/* gpu_layout.cu: transposes (32x32 tiles through shared memory), explicit zero padding (of rows
 * and columns, and of channels) and its adjoint, Flatten's layout changes built on the transpose,
 * and the filters' layouts: the weights' copies for cuDNN and cuBLAS (KRSC, bfloat16, padded
 * channels; gpu_weights.c keeps them) and the filter gradient back (gpu_layout.h). The transposes
 * and the padding move values without computing, so they take them as 4- or 2-byte words: float32
 * or bfloat16 alike. */
#include "gpu_launch.h"
#include "gpu_vec.h"

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

/* ---- explicit padding for convolutions cuDNN cannot pad (asymmetric "same"), and channels
 * padded with zeros to the tensor cores' multiple ---- */

template <class E>
__global__ void k_pad_nhwc(size_t total, int h, int w, int c, int cp, int hp, int wp, int pt,
                           int pl, const E *__restrict__ x, E *__restrict__ xp) {
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % cp);
        size_t t = i / cp;
        const int px = (int)(t % wp);
        t /= wp;
        const int py = (int)(t % hp);
        const size_t smp = t / hp;
        const int iy = py - pt, ix = px - pl;
        xp[i] = (iy >= 0 && iy < h && ix >= 0 && ix < w && ch < c)
                    ? x[((smp * h + iy) * (size_t)w + ix) * c + ch]
                    : E(0); /* +0 in either type */
    }
}

template <class E>
__global__ void k_crop_nhwc(size_t total, int h, int w, int c, int cp, int hp, int wp, int pt,
                            int pl, const E *__restrict__ dxp, E *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        size_t t = i / c;
        const int ix = (int)(t % w);
        t /= w;
        const int iy = (int)(t % h);
        const size_t smp = t / h;
        const int py = iy + pt, px = ix + pl;
        dx[i] = (py < hp && px < wp) ? dxp[((smp * hp + py) * (size_t)wp + px) * cp + ch] : E(0);
    }
}

/* ---- filters: OIHW float weights into the layout and type cuDNN and cuBLAS take, and the
 * filter gradient back ---- */

/* Elements [base, base + count) of the jobs' outputs laid end to end (job k's from jobs[k].first
 * on): job j's element e = ((o * khkw) + r) * cp + ch of its [oc][khkw][cp] copy is its source's
 * [o][ch][r], 0 for a padded channel (ch >= c), rounded to bfloat16 where the job says. */
__global__ void k_weights_krsc(const mgt_gpu_krsc_job *__restrict__ jobs, int njobs, size_t base,
                               size_t count) {
    GRID_STRIDE(i, count) {
        const size_t g = base + i;
        int lo = 0, hi = njobs - 1; /* the last job starting at or before g */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (jobs[mid].first <= g)
                lo = mid;
            else
                hi = mid - 1;
        }
        const mgt_gpu_krsc_job &j = jobs[lo];
        const size_t e = g - j.first;
        const int ch = (int)(e % (size_t)j.cp);
        const size_t t = e / (size_t)j.cp;
        const int r = (int)(t % (size_t)j.khkw);
        const size_t o = t / (size_t)j.khkw;
        const float v =
            ch < j.c ? j.src[(o * (size_t)j.c + (size_t)ch) * (size_t)j.khkw + r] : 0.0f;
        if (j.bf16)
            ((uint16_t *)j.dst)[e] = to_bf16(v);
        else
            ((float *)j.dst)[e] = v;
    }
}

/* dw[o][ch][r] = dk[o][r][ch] (dk [oc][khkw][cp], float or bfloat16, widened exactly). */
template <class E>
__global__ void k_filter_from_krsc(size_t total, int c, int cp, int khkw, const E *__restrict__ dk,
                                   float *__restrict__ dw) {
    GRID_STRIDE(i, total) {
        const int r = (int)(i % (size_t)khkw);
        const size_t t = i / (size_t)khkw;
        const int ch = (int)(t % (size_t)c);
        const size_t o = t / (size_t)c;
        dw[i] = widen(dk[(o * (size_t)khkw + r) * (size_t)cp + ch]);
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

void mgt_k_pad_nhwc(cudaStream_t st, size_t esize, int n, int h, int w, int c, int cp, int hp,
                    int wp, int pt, int pl, const void *x, void *xp) {
    const size_t total = (size_t)n * hp * wp * cp;
    if (n <= 0 || !total)
        return;
    by_size(esize, [&](auto e) {
        using E = decltype(e);
        MGT_LAUNCH(k_pad_nhwc<E>, blocks_for(total), kThreads, st, total, h, w, c, cp, hp, wp, pt,
                   pl, (const E *)x, (E *)xp);
    });
}

void mgt_k_crop_nhwc(cudaStream_t st, size_t esize, int n, int h, int w, int c, int cp, int hp,
                     int wp, int pt, int pl, const void *dxp, void *dx) {
    const size_t total = (size_t)n * h * w * c;
    if (n <= 0 || !total)
        return;
    by_size(esize, [&](auto e) {
        using E = decltype(e);
        MGT_LAUNCH(k_crop_nhwc<E>, blocks_for(total), kThreads, st, total, h, w, c, cp, hp, wp, pt,
                   pl, (const E *)dxp, (E *)dx);
    });
}

void mgt_k_weights_krsc(cudaStream_t st, const mgt_gpu_krsc_job *jobs, int njobs, size_t base,
                        size_t count) {
    if (njobs <= 0 || !count)
        return;
    MGT_LAUNCH(k_weights_krsc, blocks_for(count), kThreads, st, jobs, njobs, base, count);
}

void mgt_k_filter_from_krsc(cudaStream_t st, size_t esize, int oc, int c, int cp, int khkw,
                            const void *dk, float *dw) {
    const size_t total = (size_t)oc * (size_t)c * (size_t)khkw;
    if (!total)
        return;
    if (esize == 2)
        MGT_LAUNCH(k_filter_from_krsc<bf16>, blocks_for(total), kThreads, st, total, c, cp, khkw,
                   (const bf16 *)dk, dw);
    else
        MGT_LAUNCH(k_filter_from_krsc<float>, blocks_for(total), kThreads, st, total, c, cp, khkw,
                   (const float *)dk, dw);
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
