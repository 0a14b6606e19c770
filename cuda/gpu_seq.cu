/* gpu_seq.cu: the row-wise ops of sequence models on the GPU (gpu_seq.h): dense layers with
 * [in][out] weights (GPT-2's Conv1D) on cuBLAS, token and position embeddings, layer
 * normalisation. Activations are (n, t, c) row-major, one row of c values a position, so each is
 * a plain matrix of n t rows; each kernel follows its twin in cpu_seq.c (the same formulas and
 * the same float expressions) and every sum has an order fixed by the shapes alone (no float
 * atomics), so two runs give the same bits.
 *
 * Dense [in][out]: y = x W with W row-major [in][out], which cuBLAS (column-major) sees as the
 * out x in matrix W^T with leading dimension out:
 *     fwd:  Sgemm(N, N, m=out, n=rows, k=in,   W (ld out), x (ld in),   y (ld out))
 *     dx:   Sgemm(T, N, m=in,  n=rows, k=out,  W (ld out), dy (ld out), dx (ld in))
 *     dW:   Sgemm(N, T, m=out, n=in,   k=rows, dy (ld out), x (ld in),  dW (ld out))
 * the bias as in gpu_dense.cu (rows filled first, the GEMM adds onto them), bfloat16 the same way
 * (a bfloat16 copy of W kept by gpu_weights.c, float accumulation), the GELU after it by
 * gpu_elem.cu's activation kernel.
 *
 * Embedding backward, dwte[v][c] (the scatter-add of dy's rows into the rows of their tokens):
 * every (token, column) entry is owned by one thread, which adds the rows holding its token in
 * row order, as the CPU does; a thread takes the tokens of one residue class modulo kTokGroups
 * and one column, and walks all rows (their ids are read by a whole warp at once, one address),
 * so no two threads write one entry and the sums are the CPU's bit for bit. dwpe (sums over the
 * sequences) and layer norm's dgamma and dbeta (sums over the rows) are gpu_colsum.h's
 * deterministic column sums in double.
 *
 * Layer norm: one warp a row; mean and variance in double (lane sums, then a fixed butterfly),
 * rounded once to float as the CPU rounds its sequential double sums, so the statistics agree
 * with it to the last bit nearly always and the rest of the row is the same float expression. */
#include <cublas_v2.h>

#include "gpu_colsum.h"
#include "gpu_launch.h"
#include "gpu_vec.h"

namespace {

/* ---- embeddings ---- */

/* A token id as the op reads it: clamped into [0, v) (cpu_seq.c's token_of). */
__device__ inline size_t token_of(float id, int v) {
    const long k = (long)id;
    return (size_t)(k < 0 ? 0 : k >= v ? v - 1 : k);
}

template <class T>
__global__ void k_embed_fwd(size_t total, int t, int c, int v, const float *__restrict__ ids,
                            const float *__restrict__ wte, const float *__restrict__ wpe,
                            T *__restrict__ y) {
    GRID_STRIDE(i, total) {
        const size_t r = i / (size_t)c, k = i % (size_t)c;
        const float e = wte[token_of(ids[r], v) * (size_t)c + k];
        y[i] = narrow<T>(wpe ? e + wpe[(r % (size_t)t) * (size_t)c + k] : e);
    }
}

/* Tokens of one residue class a thread (see the top). */
constexpr int kTokGroups = 64;

/* Thread (column k, group g): for every token tok = g (mod kTokGroups), dwte[tok][k] zeroed
 * unless accumulating; then every row r in order whose token is in the group adds dy[r][k]. */
template <class T>
__global__ void k_embed_bwd_wte(size_t rows, int c, int v, int groups,
                                const float *__restrict__ ids, const T *__restrict__ dy,
                                float *__restrict__ dwte, int accumulate) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    const int g = blockIdx.y;
    if (k >= c)
        return;
    if (!accumulate)
        for (int tok = g; tok < v; tok += groups)
            dwte[(size_t)tok * c + k] = 0.0f;
    for (size_t r = 0; r < rows; r++) {
        const size_t tok = token_of(ids[r], v);
        if ((int)(tok % (size_t)groups) != g)
            continue;
        float *d = dwte + tok * (size_t)c + k;
        *d = *d + widen(dy[r * (size_t)c + k]);
    }
}

/* ---- layer normalisation ---- */

__device__ inline double warp_sum_d(double v) {
    return warp_sum(v);
}

/* One warp a row (8 rows a block). */
template <class T>
__global__ void k_ln_fwd(int rows, int c, float eps, const T *__restrict__ x,
                         const float *__restrict__ gamma, const float *__restrict__ beta,
                         T *__restrict__ y, float *__restrict__ mean_out,
                         float *__restrict__ rstd_out) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)rows)
        return;
    const T *xr = x + row * (size_t)c;
    T *yr = y + row * (size_t)c;
    double s = 0.0;
    for (int k = lane; k < c; k += 32)
        s += widen(xr[k]);
    const double mean = warp_sum_d(s) / (double)c;
    double ss = 0.0;
    for (int k = lane; k < c; k += 32) {
        const double d = widen(xr[k]) - mean;
        ss += d * d;
    }
    ss = warp_sum_d(ss);
    const float m = (float)mean, rs = (float)(1.0 / sqrt(ss / (double)c + (double)eps));
    for (int k = lane; k < c; k += 32) {
        const float xh = (widen(xr[k]) - m) * rs;
        yr[k] = narrow<T>(xh * (gamma ? gamma[k] : 1.0f) + (beta ? beta[k] : 0.0f));
    }
    if (lane == 0) {
        mean_out[row] = m;
        rstd_out[row] = rs;
    }
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma, the means in double. */
template <class T>
__global__ void k_ln_bwd_dx(int rows, int c, const T *__restrict__ x,
                            const float *__restrict__ gamma, const float *__restrict__ mean,
                            const float *__restrict__ rstd, const T *__restrict__ dy,
                            T *__restrict__ dx) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)rows)
        return;
    const T *xr = x + row * (size_t)c, *gr = dy + row * (size_t)c;
    T *dr = dx + row * (size_t)c;
    const float m = mean[row], rs = rstd[row];
    double sg = 0.0, sgx = 0.0;
    for (int k = lane; k < c; k += 32) {
        const float g = widen(gr[k]) * (gamma ? gamma[k] : 1.0f);
        sg += g;
        sgx += (double)g * ((widen(xr[k]) - m) * rs);
    }
    sg = warp_sum_d(sg);
    sgx = warp_sum_d(sgx);
    const float mg = (float)(sg / (double)c), mgx = (float)(sgx / (double)c);
    for (int k = lane; k < c; k += 32) {
        const float g = widen(gr[k]) * (gamma ? gamma[k] : 1.0f);
        dr[k] = narrow<T>(rs * (g - mg - (widen(xr[k]) - m) * rs * mgx));
    }
}

/* dgamma and dbeta's terms (gpu_colsum.h): s1 += dy xhat, s2 += dy, xhat as forward forms it. */
template <class T_> struct ln_terms {
    using T = T_;
    static constexpr int N = 1;
    const T *x, *dy;
    const float *mean, *rstd;
    int c;
    __device__ void load(int) {}
    __device__ void add(unsigned r, int col0, double *s1, double *s2) const {
        const size_t at = (size_t)r * (unsigned)c + (unsigned)col0;
        const float g = widen(dy[at]);
        s1[0] += (double)g * ((widen(x[at]) - mean[r]) * rstd[r]);
        s2[0] += g;
    }
};

/* dgamma[col] = t1, dbeta[col] = t2, each unless NULL. */
struct store_ln {
    float *dgamma, *dbeta;
    __device__ void store(int col, double t1, double t2) const {
        if (dgamma)
            dgamma[col] = (float)t1;
        if (dbeta)
            dbeta[col] = (float)t2;
    }
};

} /* namespace */

extern "C" {

/* ---- dense with [in][out] weights ---- */

void mgt_gpu_dense_io_fwd(mgt_backend *be, int n, int in, int out, mgt_act act, const float *x,
                          const float *w, const float *b, float *pre, float *y) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (n <= 0 || out <= 0)
        return;
    const size_t esize = im->bf16 ? 2 : 4;
    float *dst = act == MGT_ACT_NONE ? y : pre;
    float beta = 0.0f;
    const float one = 1.0f;
    if (b) {
        mgt_k_fill_rows(im->stream, esize, (size_t)n, out, b, dst);
        beta = 1.0f;
    }
    if (in <= 0) {
        if (!b)
            GPU_CHECK_ON(im->stream, CUDA,
                         cudaMemsetAsync(dst, 0, esize * (size_t)n * out, im->stream));
    } else if (im->bf16) { /* W [in][out] rounded to bfloat16: [in][1][out] in its terms */
        const void *wb = mgt_gpu_weights_copy(be, w, in, out, out, 1, 1);
        GPU_CHECK_ON(im->stream, CUBLAS,
                     cublasGemmEx((cublasHandle_t)im->cublas, CUBLAS_OP_N, CUBLAS_OP_N, out, n, in,
                                  &one, wb, CUDA_R_16BF, out, x, CUDA_R_16BF, in, &beta, dst,
                                  CUDA_R_16BF, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        GPU_CHECK_ON(im->stream, CUBLAS,
                     cublasSgemm((cublasHandle_t)im->cublas, CUBLAS_OP_N, CUBLAS_OP_N, out, n, in,
                                 &one, w, out, x, in, &beta, dst, out));
    }
    if (act != MGT_ACT_NONE)
        mgt_gpu_act_fwd(be, act, n, out, pre, y);
}

void mgt_gpu_dense_io_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *db) {
    if (mgt_gpu_dense_bwd_edges(be, n, in, out, dy, dx, dw, db))
        return; /* what remains are the products, transposed against dense_bwd's */
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    cublasHandle_t h = (cublasHandle_t)im->cublas;
    const float one = 1.0f, zero = 0.0f;
    if (im->bf16) {
        if (dw)
            GPU_CHECK_ON(im->stream, CUBLAS,
                         cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &one, dy,
                                      CUDA_R_16BF, out, x, CUDA_R_16BF, in, &zero, dw, CUDA_R_32F,
                                      out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (dx) {
            const void *wb = mgt_gpu_weights_copy(be, w, in, out, out, 1, 1);
            GPU_CHECK_ON(im->stream, CUBLAS,
                         cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, &one, wb,
                                      CUDA_R_16BF, out, dy, CUDA_R_16BF, out, &zero, dx,
                                      CUDA_R_16BF, in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        return;
    }
    if (dw)
        GPU_CHECK_ON(im->stream, CUBLAS,
                     cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &one, dy, out, x, in,
                                 &zero, dw, out));
    if (dx)
        GPU_CHECK_ON(im->stream, CUBLAS,
                     cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, &one, w, out, dy, out,
                                 &zero, dx, in));
}

/* ---- embeddings ---- */

void mgt_gpu_embed_fwd(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                       const float *wte, const float *wpe, float *y) {
    if (n <= 0 || t <= 0 || c <= 0 || v <= 0)
        return;
    const size_t total = (size_t)n * t * c;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto e) {
        using T = decltype(e);
        MGT_LAUNCH(k_embed_fwd<T>, blocks_for(total), kThreads, mgt_gpu_stream(be), total, t, c, v,
                   ids, wte, wpe, (T *)y);
    });
}

void mgt_gpu_embed_bwd(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                       const float *dy, float *dwte, int accumulate, float *dwpe) {
    if (t <= 0 || c <= 0)
        return;
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const size_t rows = (size_t)(n > 0 ? n : 0) * (size_t)t;
    with_act_type(im->bf16, [&](auto e) {
        using T = decltype(e);
        if (dwte && v > 0) {
            const int groups = v < kTokGroups ? v : kTokGroups;
            const unsigned threads = c < 128 ? 32u * (unsigned)((c + 31) / 32) : 128u;
            MGT_LAUNCH(k_embed_bwd_wte<T>,
                       dim3((unsigned)((c + threads - 1) / threads), (unsigned)groups), threads,
                       im->stream, rows, c, v, groups, ids, (const T *)dy, dwte, accumulate);
        }
        /* dwpe: the column sums of dy seen as [n][t c] */
        if (dwpe)
            colsum(im->stream, &im->part, (size_t)(n > 0 ? n : 0), t * c,
                   sum_terms<T, 1, false>{(const T *)dy, t * c}, store_sums{dwpe, nullptr});
    });
}

/* ---- layer normalisation ---- */

void mgt_gpu_layernorm_fwd(mgt_backend *be, int rows, int c, float eps, const float *x,
                           const float *gamma, const float *beta, float *y, float *mean,
                           float *rstd) {
    if (rows <= 0 || c <= 0)
        return;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto e) {
        using T = decltype(e);
        MGT_LAUNCH(k_ln_fwd<T>, (unsigned)((rows + 7) / 8), kThreads, mgt_gpu_stream(be), rows, c,
                   eps, (const T *)x, gamma, beta, (T *)y, mean, rstd);
    });
}

void mgt_gpu_layernorm_bwd(mgt_backend *be, int rows, int c, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta) {
    if (c <= 0)
        return;
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const size_t r = (size_t)(rows > 0 ? rows : 0);
    with_act_type(im->bf16, [&](auto e) {
        using T = decltype(e);
        if (dgamma || dbeta)
            colsum(im->stream, &im->part, r, c,
                   ln_terms<T>{(const T *)x, (const T *)dy, mean, rstd, c},
                   store_ln{dgamma, dbeta});
        if (dx && rows > 0)
            MGT_LAUNCH(k_ln_bwd_dx<T>, (unsigned)((rows + 7) / 8), kThreads, im->stream, rows, c,
                       (const T *)x, gamma, mean, rstd, (const T *)dy, (T *)dx);
    });
}

} /* extern "C" */
