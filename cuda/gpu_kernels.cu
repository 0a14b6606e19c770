/* gpu_kernels.cu: every CUDA kernel of the GPU backend, each behind an extern "C" launcher
 * (declared in gpu_internal.h) that sizes the grid, launches on the backend's stream and checks
 * the launch.
 *
 * Each kernel follows its CPU twin in src/cpu/ (the reference): same formulas, same order of
 * evaluation where it is cheap to keep (pool windows, the float/double split of every sum), the
 * same NaN behaviour of comparisons. Sums are deterministic: no float atomics anywhere; column and
 * row reductions go through fixed-shape partials summed in a fixed order, and the pooling
 * backward passes GATHER into each input element (in the CPU's order) instead of scattering.
 *
 * Index arithmetic is 64-bit wherever a tensor can exceed 2^31 elements (activations, arenas);
 * grid sizes are capped and kernels stride over the rest. */
#include <cmath>
#include <cstdint>

#include "cpu/bn_math.h"
#include "cpu/optim_math.h"
#include "gpu_internal.h"
#include "util.h"

/* MGT_LAUNCH(k, grid, block, smem, stream)(args...) is k<<<grid, block, smem, stream>>>(args...).
 * MGT_EMU builds this file with g++ for the host emulation of the tests (tests/gpu/emu/simt.h,
 * force-included), which has no <<<>>>. */
#ifdef MGT_EMU
#define MGT_LAUNCH(k, grid, block, smem, stream) MGT_EMU_LAUNCH(k, grid, block, smem, stream)
#else
#define MGT_LAUNCH(k, grid, block, smem, stream) k<<<grid, block, smem, stream>>>
#endif

namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

/* Blocks for n elements at kThreads per block, capped (kernels use grid-stride loops). */
unsigned blocks_for(size_t n) {
    size_t b = (n + kThreads - 1) / kThreads;
    const size_t cap = 16384;
    return (unsigned)(b < 1 ? 1 : (b > cap ? cap : b));
}

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- small elementwise kernels ---- */

__global__ void k_fill_rows(size_t total, int cols, const float *__restrict__ b,
                            float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        y[i] = b[i % (size_t)cols];
    }
}

__global__ void k_add(size_t n, const float *__restrict__ x, float *__restrict__ y) {
    GRID_STRIDE(i, n) {
        y[i] += x[i];
    }
}

/* ---- column reductions ----
 * Block (32, 8): 32 consecutive columns (coalesced reads of each row) by 8 row lanes. Block
 * (bx, by) covers columns bx*32.. and the rows of chunk by; its 8 lanes' double sums are added in
 * lane order and stored as the chunk's partial. k_colreduce_final adds the chunks in order. */
constexpr int kRedCols = 32, kRedLanes = 8;

template <int MODE>
__global__ void k_colreduce_part(size_t rows, int cols, int ld, size_t rows_per_chunk,
                                 const float *__restrict__ a, const float *__restrict__ b,
                                 const float *__restrict__ mean, double *__restrict__ p1,
                                 double *__restrict__ p2) {
    __shared__ double s1[kRedLanes][kRedCols], s2[kRedLanes][kRedCols];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col = blockIdx.x * kRedCols + tx;
    const size_t r0 = (size_t)blockIdx.y * rows_per_chunk;
    size_t r1 = r0 + rows_per_chunk;
    if (r1 > rows)
        r1 = rows;
    double acc1 = 0.0, acc2 = 0.0;
    if (col < cols) {
        const float m = MODE == MGT_RED_BN_BWD ? mean[col] : 0.0f;
        for (size_t r = r0 + ty; r < r1; r += kRedLanes) {
            const size_t at = r * (size_t)ld + col;
            if (MODE == MGT_RED_SUM) {
                acc1 += a[at];
            } else if (MODE == MGT_RED_SUMSQ) {
                const double v = a[at];
                acc1 += v;
                acc2 += v * v;
            } else { /* BN_BWD: acc1 = sum dy, acc2 = sum dy * (x - mean), (x - mean) in float */
                const float g = b[at];
                acc1 += g;
                acc2 += (double)g * (a[at] - m);
            }
        }
    }
    s1[ty][tx] = acc1;
    s2[ty][tx] = acc2;
    __syncthreads();
    if (ty == 0 && col < cols) {
        double t1 = 0.0, t2 = 0.0;
        for (int l = 0; l < kRedLanes; l++) {
            t1 += s1[l][tx];
            t2 += s2[l][tx];
        }
        const size_t at = (size_t)blockIdx.y * cols + col;
        p1[at] = t1;
        if (MODE != MGT_RED_SUM)
            p2[at] = t2;
    }
}

template <int MODE>
__global__ void k_colreduce_final(int cols, int chunks, const double *__restrict__ p1,
                                  const double *__restrict__ p2, const float *__restrict__ invstd,
                                  float *__restrict__ out1, float *__restrict__ out2) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols)
        return;
    double t1 = 0.0, t2 = 0.0;
    for (int k = 0; k < chunks; k++) {
        t1 += p1[(size_t)k * cols + col];
        if (MODE != MGT_RED_SUM)
            t2 += p2[(size_t)k * cols + col];
    }
    if (MODE == MGT_RED_SUM) {
        out1[col] = (float)t1;
    } else if (MODE == MGT_RED_SUMSQ) {
        out1[col] = (float)t1;
        out2[col] = (float)t2;
    } else { /* dgamma = invstd * sum dy (x - mean); dbeta = sum dy (CPU: (float)(sg * invstd)) */
        if (out1)
            out1[col] = (float)(t2 * invstd[col]);
        if (out2)
            out2[col] = (float)t1;
    }
}

/* ---- batched transpose, 32x32 tiles through shared memory ---- */

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

/* ---- pooling (NHWC, valid windows) ---- */

struct pool_dims {
    int h, w, c, size, stride, oh, ow;
};

__device__ inline void pool_out_pos(size_t o, const pool_dims &d, size_t &smp, int &oy, int &ox,
                                    int &ch) {
    ch = (int)(o % d.c);
    size_t t = o / d.c;
    ox = (int)(t % d.ow);
    t /= d.ow;
    oy = (int)(t % d.oh);
    smp = t / d.oh;
}

/* Window scanned row by row, left to right; only a strictly larger value replaces the current
 * one (ties go to the first, NaN never replaces): the CPU's rule. */
__global__ void k_maxpool_fwd(size_t total, pool_dims d, const float *__restrict__ x,
                              float *__restrict__ y, int32_t *__restrict__ argmax) {
    GRID_STRIDE(o, total) {
        size_t smp;
        int oy, ox, ch;
        pool_out_pos(o, d, smp, oy, ox, ch);
        const int iy0 = oy * d.stride, ix0 = ox * d.stride;
        float best = 0.0f;
        size_t best_at = 0;
        for (int i = 0; i < d.size; i++)
            for (int j = 0; j < d.size; j++) {
                const size_t in = ((smp * d.h + iy0 + i) * (size_t)d.w + ix0 + j) * d.c + ch;
                const float v = x[in];
                if ((i == 0 && j == 0) || v > best) {
                    best = v;
                    best_at = in;
                }
            }
        y[o] = best;
        argmax[o] = (int32_t)best_at;
    }
}

/* Outputs whose window covers input row iy: oy in [lo, hi]. */
__device__ inline void covering(int iy, int size, int stride, int oh, int &lo, int &hi) {
    lo = iy < size ? 0 : (iy - size) / stride + 1;
    hi = iy / stride;
    if (hi > oh - 1)
        hi = oh - 1;
}

/* Input element i (NHWC): its sample, channel, and the window of outputs that cover it. */
__device__ __forceinline__ void pool_in_window(size_t i, const pool_dims &d, size_t &smp, int &ch,
                                               int &ylo, int &yhi, int &xlo, int &xhi) {
    ch = (int)(i % d.c);
    size_t t = i / d.c;
    const int ix = (int)(t % d.w);
    t /= d.w;
    const int iy = (int)(t % d.h);
    smp = t / d.h;
    covering(iy, d.size, d.stride, d.oh, ylo, yhi);
    covering(ix, d.size, d.stride, d.ow, xlo, xhi);
}

/* Gather form of the CPU's scatter-add: each input element sums the dy of the outputs that
 * picked it, in ascending output order (the CPU's order), so the result is the same bits. */
__global__ void k_maxpool_bwd(size_t total, pool_dims d, const float *__restrict__ dy,
                              const int32_t *__restrict__ argmax, float *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        size_t smp;
        int ch, ylo, yhi, xlo, xhi;
        pool_in_window(i, d, smp, ch, ylo, yhi, xlo, xhi);
        float acc = 0.0f;
        for (int oy = ylo; oy <= yhi; oy++)
            for (int ox = xlo; ox <= xhi; ox++) {
                const size_t o = ((smp * d.oh + oy) * (size_t)d.ow + ox) * d.c + ch;
                if ((size_t)(uint32_t)argmax[o] == i)
                    acc += dy[o];
            }
        dx[i] = acc;
    }
}

__global__ void k_avgpool_fwd(size_t total, pool_dims d, float inv, const float *__restrict__ x,
                              float *__restrict__ y) {
    GRID_STRIDE(o, total) {
        size_t smp;
        int oy, ox, ch;
        pool_out_pos(o, d, smp, oy, ox, ch);
        const int iy0 = oy * d.stride, ix0 = ox * d.stride;
        float acc = 0.0f;
        for (int i = 0; i < d.size; i++)
            for (int j = 0; j < d.size; j++)
                acc += x[((smp * d.h + iy0 + i) * (size_t)d.w + ix0 + j) * d.c + ch];
        y[o] = acc * inv;
    }
}

__global__ void k_avgpool_bwd(size_t total, pool_dims d, float inv, const float *__restrict__ dy,
                              float *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        size_t smp;
        int ch, ylo, yhi, xlo, xhi;
        pool_in_window(i, d, smp, ch, ylo, yhi, xlo, xhi);
        float acc = 0.0f;
        for (int oy = ylo; oy <= yhi; oy++)
            for (int ox = xlo; ox <= xhi; ox++)
                acc += dy[((smp * d.oh + oy) * (size_t)d.ow + ox) * d.c + ch] * inv;
        dx[i] = acc;
    }
}

/* ---- batch normalisation (the reductions are k_colreduce_*) ---- */

__global__ void k_bn_apply(size_t total, int c, const float *__restrict__ x,
                           const float *__restrict__ mean, const float *__restrict__ invstd,
                           const float *__restrict__ gamma, const float *__restrict__ beta,
                           float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        const int j = (int)(i % c);
        const float g = gamma ? gamma[j] : 1.0f, b = beta ? beta[j] : 0.0f;
        y[i] = (x[i] - mean[j]) * (invstd[j] * g) + b;
    }
}

__global__ void k_bn_finalize(int c, float count, const float *__restrict__ sum,
                              const float *__restrict__ sumsq, float eps, float momentum,
                              float *__restrict__ mean, float *__restrict__ invstd,
                              float *__restrict__ running_mean, float *__restrict__ running_var) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < c)
        mgt_bn_finalize_channel(count, sum[j], sumsq[j], eps, momentum, &mean[j], &invstd[j],
                                running_mean ? &running_mean[j] : nullptr,
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

__global__ void k_bn_bwd_apply(size_t total, int c, float inv_count, const float *__restrict__ x,
                               const float *__restrict__ dy, const float *__restrict__ mean,
                               const float *__restrict__ invstd, const float *__restrict__ gamma,
                               const float *__restrict__ dgamma, const float *__restrict__ dbeta,
                               float *__restrict__ dx) {
    GRID_STRIDE(i, total) {
        const int j = (int)(i % c);
        const float is = invstd[j], g = gamma ? gamma[j] : 1.0f;
        const float xhat = (x[i] - mean[j]) * is;
        dx[i] = g * is * (dy[i] - (dbeta[j] + xhat * dgamma[j]) * inv_count);
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

/* Row kernels: one warp per row (8 rows per 256-thread block), lanes stride over the row. */
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(kFull, v, o);
        v = u > v ? u : v;
    }
    return v;
}

__device__ inline double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    return v;
}

/* Row maximum with the CPU's comparison (mx = l[j] > mx ? l[j] : mx from l[0]). */
__device__ inline float row_max(const float *l, int k, int lane) {
    float mx = -INFINITY;
    bool any = false;
    for (int j = lane; j < k; j += 32) {
        const float v = l[j];
        if (!any || v > mx)
            mx = v;
        any = true;
    }
    mx = warp_max(mx);
    return mx;
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

/* ---- fused softmax + cross-entropy ----
 * As cpu_elem.c: mx, se = sum exp(l - mx) (double), lse = mx + log(se), p = exp(l - mx) / se,
 * loss = lse - l[label] (dense: sum(t) * lse - sum t*l). probs/dlogits may alias logits: every
 * value of the row that another lane may overwrite is read before a __syncwarp, and in the final
 * pass a lane writes only the indices it has just read. Argmax: first maximum (ties to the lower
 * index), as the CPU's sequential scan. */

/* The better of two (value, index) candidates under "strictly larger wins, first on ties". */
__device__ inline void warp_argmax(float &v, int &j) {
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(kFull, v, o);
        const int j2 = __shfl_xor_sync(kFull, j, o);
        if (v2 > v || (v2 == v && j2 < j)) {
            v = v2;
            j = j2;
        }
    }
}

__global__ void k_xent(int n, int k, const float *logits, const int32_t *__restrict__ labels,
                       const float *__restrict__ targets, float *probs, float *dlogits, float scale,
                       double *__restrict__ loss_out, double *__restrict__ correct_out) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)n)
        return;
    const size_t off = row * (size_t)k;
    const float *l = logits + off;
    const float mx = row_max(l, k, lane);
    double se = 0.0;
    for (int j = lane; j < k; j += 32)
        se += expf(l[j] - mx);
    /* everything else read from l before the writes below */
    int lab = -1, valid = 0, tbest = 0;
    double st = 0.0, stl = 0.0, l_lab = 0.0;
    const float *t = targets ? targets + off : nullptr;
    if (t) {
        float tb = -INFINITY;
        int tj = INT32_MAX;
        for (int j = lane; j < k; j += 32) {
            st += t[j];
            stl += (double)t[j] * l[j];
            if (tj == INT32_MAX || t[j] > tb) {
                tb = t[j];
                tj = j;
            }
        }
        warp_argmax(tb, tj);
        tbest = tj == INT32_MAX ? 0 : tj;
        st = warp_sum(st);
        stl = warp_sum(stl);
    } else {
        lab = labels[row];
        valid = lab >= 0 && lab < k;
        if (valid)
            l_lab = l[lab];
    }
    se = warp_sum(se);
    __syncwarp(); /* orders every lane's reads of l above before any lane's writes below */
    const double lse = (double)mx + log(se);
    const float inv_se = (float)(1.0 / se);
    const float stf = (float)st;
    float *p = probs ? probs + off : nullptr;
    float *d = dlogits ? dlogits + off : nullptr;
    float best_p = -1.0f;
    int best = INT32_MAX;
    for (int j = lane; j < k; j += 32) {
        const float pj = expf(l[j] - mx) * inv_se;
        if (pj > best_p) { /* the CPU's rule, from -1: a NaN never wins */
            best_p = pj;
            best = j;
        }
        if (p)
            p[j] = pj;
        if (d) {
            if (t)
                d[j] = (pj * stf - t[j]) * scale;
            else
                d[j] = valid ? (pj - (j == lab ? 1.0f : 0.0f)) * scale : 0.0f;
        }
    }
    warp_argmax(best_p, best);
    if (best == INT32_MAX)
        best = 0; /* nothing beat -1 (all NaN): index 0, as on the CPU */
    if (lane == 0) {
        if (t) {
            loss_out[row] = st * lse - stl;
            correct_out[row] = best == tbest ? 1.0 : 0.0;
        } else {
            loss_out[row] = valid ? lse - l_lab : 0.0;
            correct_out[row] = valid && best == lab ? 1.0 : 0.0;
        }
    }
}

/* Fixed-order tree sum of n partials into sums[0..1] (one block). */
constexpr int kSumThreads = 256;

__global__ void k_sum2(int n, const double *__restrict__ a, const double *__restrict__ b,
                       float *__restrict__ sums) {
    __shared__ double sa[kSumThreads], sb[kSumThreads];
    double ta = 0.0, tb = 0.0;
    for (int i = threadIdx.x; i < n; i += kSumThreads) {
        ta += a[i];
        tb += b[i];
    }
    sa[threadIdx.x] = ta;
    sb[threadIdx.x] = tb;
    __syncthreads();
    for (int s = kSumThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            sa[threadIdx.x] += sa[threadIdx.x + s];
            sb[threadIdx.x] += sb[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        sums[0] += (float)sa[0];
        sums[1] += (float)sb[0];
    }
}

/* ---- optimizers: one fused pass over the arena each (Keras' formulas, cpu_optim.c) ---- */

/* The optimizers: one element each per thread, cpu/optim_math.h's formulas. */
__global__ void k_sgd(size_t count, float *__restrict__ w, const float *__restrict__ g,
                      float *__restrict__ vel, float lr, float momentum, int nesterov, float wd,
                      float scale) {
    GRID_STRIDE(i, count) {
        mgt_sgd_elem(&w[i], vel ? &vel[i] : nullptr, g[i], lr, momentum, nesterov, wd, scale);
    }
}

__global__ void k_rmsprop(size_t count, float *__restrict__ w, const float *__restrict__ g,
                          float *__restrict__ ms, float lr, float rho, float eps, float wd,
                          float scale) {
    GRID_STRIDE(i, count) {
        mgt_rmsprop_elem(&w[i], &ms[i], g[i], lr, rho, eps, wd, scale);
    }
}

__global__ void k_adam(size_t count, float *__restrict__ w, const float *__restrict__ g,
                       float *__restrict__ m, float *__restrict__ v, float lr_t, float beta1,
                       float beta2, float eps, float wd, float scale) {
    GRID_STRIDE(i, count) {
        mgt_adam_elem(&w[i], &m[i], &v[i], g[i], lr_t, beta1, beta2, eps, wd, scale);
    }
}

pool_dims dims_of(const mgt_pool_shape *s) {
    return pool_dims{s->h, s->w, s->c, s->size, s->stride, s->oh, s->ow};
}

size_t pool_in_count(const mgt_pool_shape *s) {
    return s->n > 0 ? (size_t)s->n * s->h * s->w * s->c : 0;
}

size_t pool_out_count(const mgt_pool_shape *s) {
    return s->n > 0 ? (size_t)s->n * s->oh * s->ow * s->c : 0;
}

/* ---- synthetic samples (dataset.h's definition, bit for bit) ----
 * One block per sample. Value j is byte j % 8 of draw row * words + j / 8; the label is the
 * class whose template has the largest dot product with the sample, both centred as
 * 2 * byte - 255. The dot products are exact integer sums, so the block's reduction order cannot
 * change them; classes are scanned in increasing order with a strict >, so ties go to the lowest
 * class, as on the host. Classes are taken kSynClasses at a time (the pixels are regenerated per
 * pass, which is cheaper than keeping them). Launched with kThreads threads per block. */
constexpr int kSynClasses = 16;

__global__ void k_synthetic(int n, int64_t elems, int classes, uint64_t pkey, uint64_t tkey,
                            int64_t first, const int64_t *__restrict__ ids, float *__restrict__ x,
                            int32_t *__restrict__ labels, float *__restrict__ targets) {
    __shared__ long long part[kThreads / 32][kSynClasses];
    __shared__ long long best_v;
    __shared__ int best_c;
    const uint64_t words = (uint64_t)((elems + 7) / 8);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int s = blockIdx.x; s < n; s += gridDim.x) {
        const uint64_t row = (uint64_t)(first + ids[s]);
        float *xs = x + (int64_t)s * elems;
        for (int c0 = 0; c0 < classes; c0 += kSynClasses) {
            const int nc = classes - c0 < kSynClasses ? classes - c0 : kSynClasses;
            long long acc[kSynClasses];
#pragma unroll
            for (int c = 0; c < kSynClasses; c++)
                acc[c] = 0;
            for (int64_t j = threadIdx.x; j < elems; j += blockDim.x) {
                const int shift = (int)(j % 8) * 8;
                const uint64_t word = (uint64_t)(j / 8);
                const int b = (int)((mgt_rand64(pkey, row * words + word) >> shift) & 255);
                if (c0 == 0)
                    xs[j] = ((float)b + 0.5f) * (1.0f / 256.0f);
                const int pc = 2 * b - 255;
#pragma unroll
                for (int c = 0; c < kSynClasses; c++)
                    if (c < nc) {
                        const uint64_t t = mgt_rand64(tkey, (uint64_t)(c0 + c) * words + word);
                        acc[c] += (long long)(pc * (2 * (int)((t >> shift) & 255) - 255));
                    }
            }
#pragma unroll
            for (int c = 0; c < kSynClasses; c++) {
                long long v = acc[c];
                for (int o = 16; o > 0; o >>= 1)
                    v += __shfl_xor_sync(kFull, v, o);
                if (lane == 0)
                    part[warp][c] = v;
            }
            __syncthreads();
            if (threadIdx.x == 0)
                for (int c = 0; c < nc; c++) {
                    long long t = 0;
                    for (int w = 0; w < (int)blockDim.x / 32; w++)
                        t += part[w][c];
                    if ((c0 == 0 && c == 0) || t > best_v) {
                        best_v = t;
                        best_c = c0 + c;
                    }
                }
            __syncthreads();
        }
        if (threadIdx.x == 0)
            labels[s] = best_c;
        if (targets)
            for (int c = threadIdx.x; c < classes; c += blockDim.x)
                targets[(int64_t)s * classes + c] = c == best_c ? 1.0f : 0.0f;
        __syncthreads(); /* best_c and part are reused by the next sample */
    }
}

/* ---- batches gathered from a byte dataset on the device (dataset.h's scaling) ---- */

__global__ void k_gather_u8(size_t total, int64_t elems, const uint8_t *__restrict__ pixels,
                            const int64_t *__restrict__ ids, float *__restrict__ x) {
    GRID_STRIDE(i, total) {
        const size_t s = i / (size_t)elems, j = i % (size_t)elems;
        x[i] = (float)pixels[(size_t)ids[s] * (size_t)elems + j] / 255.0f;
    }
}

__global__ void k_gather_labels(int n, int classes, const uint8_t *__restrict__ labels,
                                const int64_t *__restrict__ ids, int32_t *__restrict__ out,
                                float *__restrict__ targets) {
    GRID_STRIDE(s, (size_t)n) {
        const int label = labels[ids[s]];
        out[s] = label;
        if (targets)
            for (int c = 0; c < classes; c++)
                targets[s * (size_t)classes + c] = c == label ? 1.0f : 0.0f;
    }
}

/* One column-reduction slice (mgt_k_colreduce): the partials pass, then the fixed-order sum. */
struct colreduce_args {
    size_t rows;
    int width, ld;
    size_t chunks, rows_per_chunk;
    const float *a, *b, *mean, *invstd;
    float *out1, *out2;
};

template <int MODE>
void colreduce_launch(cudaStream_t st, const mgt_gpu_part *part, dim3 grid,
                      const colreduce_args &r) {
    MGT_LAUNCH(k_colreduce_part<MODE>, grid, dim3(kRedCols, kRedLanes), 0, st)
    (r.rows, r.width, r.ld, r.rows_per_chunk, r.a, r.b, r.mean, part->a, part->b);
    CHECK_LAUNCH("k_colreduce_part");
    MGT_LAUNCH(k_colreduce_final<MODE>, (unsigned)((r.width + kThreads - 1) / kThreads), kThreads,
               0, st)
    (r.width, (int)r.chunks, part->a, part->b, r.invstd, r.out1, r.out2);
    CHECK_LAUNCH("k_colreduce_final");
}

} /* namespace */

/* ================================ launchers ================================ */

extern "C" {

void mgt_k_fill_rows(cudaStream_t st, size_t rows, int cols, const float *b, float *y) {
    const size_t total = rows * (size_t)(cols > 0 ? cols : 0);
    if (!total)
        return;
    MGT_LAUNCH(k_fill_rows, blocks_for(total), kThreads, 0, st)(total, cols, b, y);
    CHECK_LAUNCH("k_fill_rows");
}

void mgt_k_add(cudaStream_t st, size_t n, const float *x, float *y) {
    if (!n)
        return;
    MGT_LAUNCH(k_add, blocks_for(n), kThreads, 0, st)(n, x, y);
    CHECK_LAUNCH("k_add");
}

/* Slices of at most MGT_GPU_PART_CAP columns; per slice, chunks of rows such that there are
 * about 2048 blocks in all (enough to fill any current GPU) and chunks * width partials fit. */
void mgt_k_colreduce(cudaStream_t st, const mgt_gpu_part *part, int mode, size_t rows, int cols,
                     const float *a, const float *b, const float *mean, const float *invstd,
                     float *out1, float *out2) {
    if (cols <= 0)
        return;
    for (int c0 = 0; c0 < cols; c0 += MGT_GPU_PART_CAP) {
        const int width = cols - c0 < MGT_GPU_PART_CAP ? cols - c0 : MGT_GPU_PART_CAP;
        const int colblocks = (width + kRedCols - 1) / kRedCols;
        size_t chunks = (rows + 63) / 64; /* at least 64 rows (8 per lane) per chunk */
        size_t most = 2048 / (size_t)colblocks;
        if (most < 1)
            most = 1;
        if (chunks > most)
            chunks = most;
        if (chunks > (size_t)(MGT_GPU_PART_CAP / width))
            chunks = (size_t)(MGT_GPU_PART_CAP / width);
        if (chunks < 1)
            chunks = 1;
        const size_t per = (rows + chunks - 1) / chunks;
        const dim3 grid((unsigned)colblocks, (unsigned)chunks);
        const float *ac = a ? a + c0 : nullptr, *bc = b ? b + c0 : nullptr;
        const float *mc = mean ? mean + c0 : nullptr, *ic = invstd ? invstd + c0 : nullptr;
        float *o1 = out1 ? out1 + c0 : nullptr, *o2 = out2 ? out2 + c0 : nullptr;
        const colreduce_args r = {rows, width, cols, chunks, per, ac, bc, mc, ic, o1, o2};
        if (mode == MGT_RED_SUM)
            colreduce_launch<MGT_RED_SUM>(st, part, grid, r);
        else if (mode == MGT_RED_SUMSQ)
            colreduce_launch<MGT_RED_SUMSQ>(st, part, grid, r);
        else
            colreduce_launch<MGT_RED_BN_BWD>(st, part, grid, r);
    }
}

void mgt_k_transpose(cudaStream_t st, size_t batch, size_t rows, size_t cols, const float *src,
                     float *dst) {
    if (!batch || !rows || !cols)
        return;
    const size_t gz = batch < 65535 ? batch : 65535, gy = (rows + kTile - 1) / kTile;
    const dim3 grid((unsigned)((cols + kTile - 1) / kTile), (unsigned)gy, (unsigned)gz);
    if (gy > 65535) /* checked before the narrowing to unsigned */
        mgt_gpu_fail_cuda((int)cudaErrorInvalidConfiguration, "k_transpose (more than 2M rows)",
                          __FILE__, __LINE__);
    MGT_LAUNCH(k_transpose, grid, dim3(kTile, kTileRows), 0, st)(batch, rows, cols, src, dst);
    CHECK_LAUNCH("k_transpose");
}

void mgt_k_pad_nhwc(cudaStream_t st, int n, int h, int w, int c, int hp, int wp, int pt, int pl,
                    const float *x, float *xp) {
    const size_t total = (size_t)n * hp * wp * c;
    if (n <= 0 || !total)
        return;
    MGT_LAUNCH(k_pad_nhwc, blocks_for(total), kThreads, 0, st)
    (total, h, w, c, hp, wp, pt, pl, x, xp);
    CHECK_LAUNCH("k_pad_nhwc");
}

void mgt_k_crop_nhwc(cudaStream_t st, int n, int h, int w, int c, int hp, int wp, int pt, int pl,
                     const float *dxp, float *dx) {
    const size_t total = (size_t)n * h * w * c;
    if (n <= 0 || !total)
        return;
    MGT_LAUNCH(k_crop_nhwc, blocks_for(total), kThreads, 0, st)
    (total, h, w, c, hp, wp, pt, pl, dxp, dx);
    CHECK_LAUNCH("k_crop_nhwc");
}

void mgt_k_maxpool_fwd(cudaStream_t st, const mgt_pool_shape *s, const float *x, float *y,
                       int32_t *argmax) {
    const size_t total = pool_out_count(s);
    if (!total)
        return;
    MGT_LAUNCH(k_maxpool_fwd, blocks_for(total), kThreads, 0, st)(total, dims_of(s), x, y, argmax);
    CHECK_LAUNCH("k_maxpool_fwd");
}

void mgt_k_maxpool_bwd(cudaStream_t st, const mgt_pool_shape *s, const float *dy,
                       const int32_t *argmax, float *dx) {
    const size_t total = pool_in_count(s);
    if (!total || !dx)
        return;
    MGT_LAUNCH(k_maxpool_bwd, blocks_for(total), kThreads, 0, st)
    (total, dims_of(s), dy, argmax, dx);
    CHECK_LAUNCH("k_maxpool_bwd");
}

void mgt_k_avgpool_fwd(cudaStream_t st, const mgt_pool_shape *s, const float *x, float *y) {
    const size_t total = pool_out_count(s);
    if (!total)
        return;
    const float inv = 1.0f / (float)(s->size * s->size);
    MGT_LAUNCH(k_avgpool_fwd, blocks_for(total), kThreads, 0, st)(total, dims_of(s), inv, x, y);
    CHECK_LAUNCH("k_avgpool_fwd");
}

void mgt_k_avgpool_bwd(cudaStream_t st, const mgt_pool_shape *s, const float *dy, float *dx) {
    const size_t total = pool_in_count(s);
    if (!total || !dx)
        return;
    const float inv = 1.0f / (float)(s->size * s->size);
    MGT_LAUNCH(k_avgpool_bwd, blocks_for(total), kThreads, 0, st)(total, dims_of(s), inv, dy, dx);
    CHECK_LAUNCH("k_avgpool_bwd");
}

void mgt_k_bn_apply(cudaStream_t st, int rows, int c, const float *x, const float *mean,
                    const float *invstd, const float *gamma, const float *beta, float *y) {
    if (rows <= 0 || c <= 0)
        return;
    const size_t total = (size_t)rows * c;
    MGT_LAUNCH(k_bn_apply, blocks_for(total), kThreads, 0, st)
    (total, c, x, mean, invstd, gamma, beta, y);
    CHECK_LAUNCH("k_bn_apply");
}

void mgt_k_bn_finalize(cudaStream_t st, int c, float count, const float *sum, const float *sumsq,
                       float eps, float momentum, float *mean, float *invstd, float *running_mean,
                       float *running_var) {
    if (c <= 0)
        return;
    MGT_LAUNCH(k_bn_finalize, (c + kThreads - 1) / kThreads, kThreads, 0, st)
    (c, count, sum, sumsq, eps, momentum, mean, invstd, running_mean, running_var);
    CHECK_LAUNCH("k_bn_finalize");
}

void mgt_k_bn_running(cudaStream_t st, int c, float eps, const float *running_mean,
                      const float *running_var, float *mean, float *invstd) {
    if (c <= 0)
        return;
    MGT_LAUNCH(k_bn_running, (c + kThreads - 1) / kThreads, kThreads, 0, st)
    (c, eps, running_mean, running_var, mean, invstd);
    CHECK_LAUNCH("k_bn_running");
}

void mgt_k_bn_bwd_apply(cudaStream_t st, int rows, int c, float inv_count, const float *x,
                        const float *dy, const float *mean, const float *invstd, const float *gamma,
                        const float *dgamma, const float *dbeta, float *dx) {
    if (rows <= 0 || c <= 0 || !dx)
        return;
    const size_t total = (size_t)rows * c;
    MGT_LAUNCH(k_bn_bwd_apply, blocks_for(total), kThreads, 0, st)
    (total, c, inv_count, x, dy, mean, invstd, gamma, dgamma, dbeta, dx);
    CHECK_LAUNCH("k_bn_bwd_apply");
}

void mgt_k_dropout(cudaStream_t st, int n, int row, float rate, float keep_scale, uint64_t key,
                   uint64_t first_sample, float *x) {
    if (!(rate > 0.0f) || n <= 0 || row <= 0)
        return;
    const size_t total = (size_t)n * row;
    MGT_LAUNCH(k_dropout, blocks_for(total), kThreads, 0, st)
    (total, first_sample * (uint64_t)row, rate, keep_scale, key, x);
    CHECK_LAUNCH("k_dropout");
}

void mgt_k_act_fwd(cudaStream_t st, mgt_act act, int n, int row, float *x) {
    if (n <= 0 || row <= 0 || act == MGT_ACT_NONE)
        return;
    if (act == MGT_ACT_SOFTMAX) {
        MGT_LAUNCH(k_softmax_fwd, (unsigned)((n + 7) / 8), kThreads, 0, st)(n, row, x);
        CHECK_LAUNCH("k_softmax_fwd");
        return;
    }
    if (act != MGT_ACT_RELU && act != MGT_ACT_SIGMOID && act != MGT_ACT_TANH)
        return;
    const size_t total = (size_t)n * row;
    MGT_LAUNCH(k_act_fwd, blocks_for(total), kThreads, 0, st)(total, (int)act, x);
    CHECK_LAUNCH("k_act_fwd");
}

void mgt_k_act_bwd(cudaStream_t st, mgt_act act, int n, int row, const float *y, float *dy) {
    if (n <= 0 || row <= 0 || act == MGT_ACT_NONE)
        return;
    if (act == MGT_ACT_SOFTMAX) {
        MGT_LAUNCH(k_softmax_bwd, (unsigned)((n + 7) / 8), kThreads, 0, st)(n, row, y, dy);
        CHECK_LAUNCH("k_softmax_bwd");
        return;
    }
    if (act != MGT_ACT_RELU && act != MGT_ACT_SIGMOID && act != MGT_ACT_TANH)
        return;
    const size_t total = (size_t)n * row;
    MGT_LAUNCH(k_act_bwd, blocks_for(total), kThreads, 0, st)(total, (int)act, y, dy);
    CHECK_LAUNCH("k_act_bwd");
}

/* Rows in chunks of MGT_GPU_PART_CAP (one chunk in practice): per-row results to the partials,
 * then their fixed-order sum onto sums. */
void mgt_k_xent(cudaStream_t st, const mgt_gpu_part *part, int n, int k, const float *logits,
                const int32_t *labels, const float *targets, float *probs, float *dlogits,
                float scale, float *sums) {
    if (n <= 0 || k <= 0)
        return;
    for (int r0 = 0; r0 < n; r0 += MGT_GPU_PART_CAP) {
        const int m = n - r0 < MGT_GPU_PART_CAP ? n - r0 : MGT_GPU_PART_CAP;
        const size_t off = (size_t)r0 * k;
        MGT_LAUNCH(k_xent, (unsigned)((m + 7) / 8), kThreads, 0, st)
        (m, k, logits + off, labels ? labels + r0 : nullptr, targets ? targets + off : nullptr,
         probs ? probs + off : nullptr, dlogits ? dlogits + off : nullptr, scale, part->a, part->b);
        CHECK_LAUNCH("k_xent");
        MGT_LAUNCH(k_sum2, 1, kSumThreads, 0, st)(m, part->a, part->b, sums);
        CHECK_LAUNCH("k_sum2");
    }
}

void mgt_k_sgd(cudaStream_t st, size_t count, float *w, const float *g, float *vel, float lr,
               float momentum, int nesterov, float wd, float scale) {
    if (!count)
        return;
    if (momentum == 0.0f)
        vel = nullptr; /* plain SGD: the velocity is not used (nor touched), as on the CPU */
    MGT_LAUNCH(k_sgd, blocks_for(count), kThreads, 0, st)
    (count, w, g, vel, lr, momentum, nesterov, wd, scale);
    CHECK_LAUNCH("k_sgd");
}

void mgt_k_rmsprop(cudaStream_t st, size_t count, float *w, const float *g, float *ms, float lr,
                   float rho, float eps, float wd, float scale) {
    if (!count)
        return;
    MGT_LAUNCH(k_rmsprop, blocks_for(count), kThreads, 0, st)
    (count, w, g, ms, lr, rho, eps, wd, scale);
    CHECK_LAUNCH("k_rmsprop");
}

void mgt_k_adam(cudaStream_t st, size_t count, float *w, const float *g, float *m, float *v,
                float lr_t, float beta1, float beta2, float eps, float wd, float scale) {
    if (!count)
        return;
    MGT_LAUNCH(k_adam, blocks_for(count), kThreads, 0, st)
    (count, w, g, m, v, lr_t, beta1, beta2, eps, wd, scale);
    CHECK_LAUNCH("k_adam");
}

void mgt_k_synthetic(cudaStream_t st, int n, int64_t elems, int classes, uint64_t pixel_key,
                     uint64_t template_key, int64_t first, const int64_t *ids, float *x,
                     int32_t *labels, float *targets) {
    if (n <= 0 || classes <= 0)
        return;
    const unsigned grid = (unsigned)(n < 65535 ? n : 65535);
    MGT_LAUNCH(k_synthetic, grid, kThreads, 0, st)
    (n, elems, classes, pixel_key, template_key, first, ids, x, labels, targets);
    CHECK_LAUNCH("k_synthetic");
}

void mgt_k_gather_u8(cudaStream_t st, int n, int64_t elems, int classes, const uint8_t *pixels,
                     const uint8_t *labels, const int64_t *ids, float *x, int32_t *labels_out,
                     float *targets) {
    if (n <= 0)
        return;
    const size_t total = (size_t)n * (size_t)elems;
    if (total) {
        MGT_LAUNCH(k_gather_u8, blocks_for(total), kThreads, 0, st)(total, elems, pixels, ids, x);
        CHECK_LAUNCH("k_gather_u8");
    }
    MGT_LAUNCH(k_gather_labels, blocks_for((size_t)n), kThreads, 0, st)
    (n, classes, labels, ids, labels_out, targets);
    CHECK_LAUNCH("k_gather_labels");
}

uint64_t mgt_gpu_rand64_twin(uint64_t key, uint64_t counter) {
    return mgt_rand64(key, counter);
}

float mgt_gpu_uniform_twin(uint64_t key, uint64_t counter) {
    return mgt_uniform(key, counter);
}

} /* extern "C" */
