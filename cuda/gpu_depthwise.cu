/* gpu_depthwise.cu: depthwise convolution, depth multiplier 1 (gpu_graph.h), NHWC activations and
 * [c][1][kh][kw] weights as src/cpu/cpu_depthwise.c.
 *
 * Memory-bound like its CPU twin, so plain kernels with the channel index fastest (consecutive
 * threads read consecutive channels of one pixel):
 *   forward        one thread per output value: the bias, then the window's taps in row order;
 *   backward data  one thread per input value, gathering the outputs whose windows hold it (no
 *                  atomics, each dx written once);
 *   backward filt. deterministic two-pass sums, as gpu_reduce.cu's: the output pixels in chunks,
 *                  per chunk a double partial for each (tap, channel), then the chunks added in
 *                  order; the partials live in the workspace that dwconv_scratch asks for;
 *   bias           gpu_reduce.cu's column sums of dy.
 * No float atomics anywhere, so results never depend on scheduling. */
#include "gpu_launch.h"

namespace {

struct dw_dims {
    int h, w, c, kh, kw, stride, pt, pl, oh, ow;
};

dw_dims dims_of(const mgt_conv_shape *s) {
    return dw_dims{s->h,      s->w,       s->c,        s->kh, s->kw,
                   s->stride, s->pad_top, s->pad_left, s->oh, s->ow};
}

__global__ void k_dw_fwd(size_t total, dw_dims d, const float *__restrict__ x,
                         const float *__restrict__ w, const float *__restrict__ b,
                         float *__restrict__ y) {
    GRID_STRIDE(o, total) {
        const int ch = (int)(o % d.c);
        size_t t = o / d.c;
        const int ox = (int)(t % d.ow);
        t /= d.ow;
        const int oy = (int)(t % d.oh);
        const size_t smp = t / d.oh;
        const int iy0 = oy * d.stride - d.pt, ix0 = ox * d.stride - d.pl;
        const float *wc = w + (size_t)ch * d.kh * d.kw;
        float acc = b ? b[ch] : 0.0f;
        for (int ki = 0; ki < d.kh; ki++) {
            const int iy = iy0 + ki;
            if (iy < 0 || iy >= d.h)
                continue;
            for (int kj = 0; kj < d.kw; kj++) {
                const int ix = ix0 + kj;
                if (ix >= 0 && ix < d.w)
                    acc += wc[ki * d.kw + kj] * x[((smp * d.h + iy) * (size_t)d.w + ix) * d.c + ch];
            }
        }
        y[o] = acc;
    }
}

/* The output index whose tap k covers input index i, or -1 (cpu_depthwise.c's covering_out). */
__device__ inline int covering_out(int i, int k, int pad, int stride, int out) {
    const int t = i + pad - k;
    if (t < 0 || t % stride)
        return -1;
    return t / stride < out ? t / stride : -1;
}

__global__ void k_dw_bwd_data(size_t total, dw_dims d, const float *__restrict__ w,
                              const float *__restrict__ dy, float *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % d.c);
        size_t t = i / d.c;
        const int ix = (int)(t % d.w);
        t /= d.w;
        const int iy = (int)(t % d.h);
        const size_t smp = t / d.h;
        const float *wc = w + (size_t)ch * d.kh * d.kw;
        float acc = 0.0f;
        for (int ki = 0; ki < d.kh; ki++) {
            const int oy = covering_out(iy, ki, d.pt, d.stride, d.oh);
            if (oy < 0)
                continue;
            for (int kj = 0; kj < d.kw; kj++) {
                const int ox = covering_out(ix, kj, d.pl, d.stride, d.ow);
                if (ox >= 0)
                    acc +=
                        wc[ki * d.kw + kj] * dy[((smp * d.oh + oy) * (size_t)d.ow + ox) * d.c + ch];
            }
        }
        dx[i] = acc;
    }
}

constexpr int kCols = 32, kLanes = 8;
/* Output pixels per chunk of the filter gradient's first pass, and the most chunks. */
constexpr size_t kChunkRows = 1024, kMaxChunks = 4096;

size_t dw_chunks(const mgt_conv_shape *s) {
    const size_t rows = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    size_t ch = (rows + kChunkRows - 1) / kChunkRows;
    return ch < 1 ? 1 : ch > kMaxChunks ? kMaxChunks : ch;
}

/* Block (32, 8): columns col = tap * c + ch (32 consecutive ones), 8 lanes over the rows of
 * chunk blockIdx.y; their double sums added in lane order make the chunk's partial. */
__global__ void k_dw_filter_part(size_t rows, size_t rows_per_chunk, dw_dims d,
                                 const float *__restrict__ x, const float *__restrict__ dy,
                                 double *__restrict__ part) {
    __shared__ double sh[kLanes][kCols];
    const int taps = d.kh * d.kw, cols = taps * d.c;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col = blockIdx.x * kCols + tx;
    const size_t r0 = (size_t)blockIdx.y * rows_per_chunk;
    const size_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    double acc = 0.0;
    if (col < cols) {
        const int tap = col / d.c, ch = col % d.c, ki = tap / d.kw, kj = tap % d.kw;
        for (size_t r = r0 + ty; r < r1; r += kLanes) {
            const int ox = (int)(r % d.ow), oy = (int)(r / d.ow % d.oh);
            const size_t smp = r / ((size_t)d.ow * d.oh);
            const int iy = oy * d.stride - d.pt + ki, ix = ox * d.stride - d.pl + kj;
            if (iy >= 0 && iy < d.h && ix >= 0 && ix < d.w)
                acc +=
                    (double)x[((smp * d.h + iy) * (size_t)d.w + ix) * d.c + ch] * dy[r * d.c + ch];
        }
    }
    sh[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && col < cols) {
        double s = 0.0;
        for (int l = 0; l < kLanes; l++)
            s += sh[l][tx];
        part[(size_t)blockIdx.y * cols + col] = s;
    }
}

/* dw[ch][tap] = the chunks' partials of column tap * c + ch, added in chunk order. */
__global__ void k_dw_filter_final(int cols, int c, int taps, size_t chunks,
                                  const double *__restrict__ part, float *__restrict__ dw) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols)
        return;
    double s = 0.0;
    for (size_t k = 0; k < chunks; k++)
        s += part[k * cols + col];
    dw[(size_t)(col % c) * taps + col / c] = (float)s;
}

} /* namespace */

extern "C" {

size_t mgt_gpu_dwconv_scratch(mgt_backend *be, const mgt_conv_shape *s) {
    (void)be;
    return dw_chunks(s) * (size_t)s->kh * s->kw * s->c * sizeof(double);
}

void mgt_gpu_dwconv_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y) {
    const size_t total = s->n > 0 ? (size_t)s->n * s->oh * s->ow * s->c : 0;
    if (!total)
        return;
    MGT_LAUNCH(k_dw_fwd, blocks_for(total), kThreads, mgt_gpu_stream(be), total, dims_of(s), x, w,
               b, y);
}

void mgt_gpu_dwconv_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    cudaStream_t st = mgt_gpu_stream(be);
    const size_t rows = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    if (db)
        mgt_k_colreduce(st, &im->part, MGT_RED_SUM, rows, s->c, dy, NULL, NULL, NULL, db, NULL);
    const size_t nx = (size_t)(s->n > 0 ? s->n : 0) * s->h * s->w * s->c;
    if (dx && nx)
        MGT_LAUNCH(k_dw_bwd_data, blocks_for(nx), kThreads, st, nx, dims_of(s), w, dy, dx);
    if (!dw || s->c <= 0)
        return;
    const int cols = s->kh * s->kw * s->c;
    const size_t chunks = dw_chunks(s), per = (rows + chunks - 1) / chunks;
    double *part = (double *)mgt_gpu_workspace(be, mgt_gpu_dwconv_scratch(be, s));
    MGT_LAUNCH(k_dw_filter_part, dim3((unsigned)((cols + kCols - 1) / kCols), (unsigned)chunks),
               dim3(kCols, kLanes), st, rows, per ? per : 1, dims_of(s), x, dy, part);
    MGT_LAUNCH(k_dw_filter_final, (unsigned)((cols + kThreads - 1) / kThreads), kThreads, st, cols,
               s->c, s->kh * s->kw, chunks, part, dw);
}

} /* extern "C" */
