/* gpu_dense.cu: dense layers on cuBLAS, and the bias-row kernel.
 *
 * cuBLAS works in column-major terms: a row-major [r][c] matrix is the column-major c x r
 * matrix, its transpose. So y[n][out] = x W^T is, column-major, y^T = W^T(op T) * x^T:
 *     fwd:  Sgemm(T, N, m=out, n=n, k=in,  W (ld in), x (ld in),   y (ld out))
 *     dx:   Sgemm(N, N, m=in,  n=n, k=out, W (ld in), dy (ld out), dx (ld in))
 *     dW:   Sgemm(N, T, m=in,  n=out, k=n, x (ld in), dy (ld out), dW (ld in))
 * Bias: y is filled with the bias rows first and the GEMM adds onto it (beta = 1), as on the CPU.
 * Column sums (db) use the deterministic reduction (gpu_reduce.cu). Without --tf32, cuBLAS runs
 * in CUBLAS_DEFAULT_MATH, which for float32 never uses TF32; with it,
 * CUBLAS_TF32_TENSOR_OP_MATH (set at init, gpu_backend.c).
 *
 * --precision bf16: the activations x, y, dy and dx are bfloat16 (backend.h); the same three
 * products through cublasGemmEx on them and a bfloat16 copy of W (kept, rounded once after each
 * update: gpu_weights.c), with CUBLAS_COMPUTE_32F: each product of two bfloat16 values is exact in
 * float, the sums are float sums, y and dx are rounded to bfloat16 once as cuBLAS stores them (the
 * bias rows written first, in bfloat16), dW is stored in float. */
#include <cublas_v2.h>

#include "gpu_launch.h"
#include "gpu_vec.h"

namespace {

template <class T>
__global__ void k_fill_rows(size_t total, int cols, const float *__restrict__ b,
                            T *__restrict__ y) {
    GRID_STRIDE(i, total) {
        y[i] = narrow<T>(b[i % (size_t)cols]);
    }
}

__global__ void k_add_rows(size_t total, int cols, const float *__restrict__ b,
                           float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        y[i] += b[i % (size_t)cols];
    }
}

/* The bfloat16 copy of W ([out][in] floats), kept and made up to date once after each update
 * (gpu_weights.c: [out][1][in] in its KRSC terms, the same order). */
const uint16_t *bf16_weights(mgt_backend *be, int out, int in, const float *w) {
    return (const uint16_t *)mgt_gpu_weights_copy(be, w, out, in, in, 1, 1);
}

/* C = alpha op(A) op(B) + beta C with bfloat16 A and B, float accumulation, C in Ctype. */
cublasStatus_t gemm_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, const void *a, int lda, const void *b, int ldb, float beta, void *c,
                         cudaDataType ctype, int ldc) {
    const float one = 1.0f;
    return cublasGemmEx(h, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &beta,
                        c, ctype, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

} /* namespace */

extern "C" {

void mgt_k_fill_rows(cudaStream_t st, size_t esize, size_t rows, int cols, const float *b,
                     void *y) {
    const size_t total = rows * (size_t)(cols > 0 ? cols : 0);
    if (!total)
        return;
    if (esize == 2)
        MGT_LAUNCH(k_fill_rows<bf16>, blocks_for(total), kThreads, st, total, cols, b, (bf16 *)y);
    else
        MGT_LAUNCH(k_fill_rows<float>, blocks_for(total), kThreads, st, total, cols, b, (float *)y);
}

void mgt_k_add_rows(cudaStream_t st, size_t rows, int cols, const float *b, float *y) {
    const size_t total = rows * (size_t)(cols > 0 ? cols : 0);
    if (!total)
        return;
    MGT_LAUNCH(k_add_rows, blocks_for(total), kThreads, st, total, cols, b, y);
}

void mgt_gpu_dense_fwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *b, float *y) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (n <= 0 || out <= 0)
        return;
    const size_t esize = im->bf16 ? 2 : 4; /* the activations' */
    float beta = 0.0f;
    const float one = 1.0f;
    if (b) {
        mgt_k_fill_rows(im->stream, esize, (size_t)n, out, b, y);
        beta = 1.0f;
    }
    if (in <= 0) {
        if (!b)
            GPU_CHECK_ON(im->stream, CUDA,
                         cudaMemsetAsync(y, 0, esize * (size_t)n * out, im->stream));
        return;
    }
    if (im->bf16) { /* x and y bfloat16, W rounded to it */
        const uint16_t *wb = bf16_weights(be, out, in, w);
        GPU_CHECK_ON(im->stream, CUBLAS,
                     gemm_bf16((cublasHandle_t)im->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, wb,
                               in, x, in, beta, y, CUDA_R_16BF, out));
        return;
    }
    GPU_CHECK_ON(im->stream, CUBLAS,
                 cublasSgemm((cublasHandle_t)im->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one,
                             w, in, x, in, &beta, y, out));
}

int mgt_gpu_dense_bwd_edges(mgt_backend *be, int n, int in, int out, const float *dy, float *dx,
                            float *dw, float *db) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const size_t esize = im->bf16 ? 2 : 4;
    if (n < 0)
        n = 0;
    if (db)
        mgt_k_colreduce(im->stream, &im->part, MGT_RED_SUM, esize, (size_t)n, out, dy, db, nullptr);
    if (in <= 0 || out <= 0) {
        if (dx && n > 0 && in > 0)
            GPU_CHECK_ON(im->stream, CUDA,
                         cudaMemsetAsync(dx, 0, esize * (size_t)n * in, im->stream));
        return 1;
    }
    if (n == 0) { /* an empty inner dimension: write dW's zeros ourselves; dx has no rows */
        if (dw)
            GPU_CHECK_ON(im->stream, CUDA,
                         cudaMemsetAsync(dw, 0, sizeof(float) * (size_t)out * in, im->stream));
        return 1;
    }
    return 0;
}

void mgt_gpu_dense_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *dy, float *dx, float *dw, float *db) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    cublasHandle_t h = (cublasHandle_t)im->cublas;
    const float one = 1.0f, zero = 0.0f;
    if (mgt_gpu_dense_bwd_edges(be, n, in, out, dy, dx, dw, db))
        return;
    if (im->bf16) { /* x, dy and dx bfloat16; dW float */
        if (dw)
            GPU_CHECK_ON(im->stream, CUBLAS,
                         gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, x, in, dy, out, 0.0f,
                                   dw, CUDA_R_32F, in));
        if (dx) {
            const uint16_t *wb = bf16_weights(be, out, in, w);
            GPU_CHECK_ON(im->stream, CUBLAS,
                         gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, wb, in, dy, out, 0.0f,
                                   dx, CUDA_R_16BF, in));
        }
        return;
    }
    if (dw)
        GPU_CHECK_ON(im->stream, CUBLAS,
                     cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x, in, dy, out,
                                 &zero, dw, in));
    if (dx)
        GPU_CHECK_ON(im->stream, CUBLAS,
                     cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, w, in, dy, out,
                                 &zero, dx, in));
}

} /* extern "C" */
