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
 * CUBLAS_TF32_TENSOR_OP_MATH (set at init, gpu_backend.c). */
#include <cublas_v2.h>

#include "gpu_launch.h"

namespace {

__global__ void k_fill_rows(size_t total, int cols, const float *__restrict__ b,
                            float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        y[i] = b[i % (size_t)cols];
    }
}

} /* namespace */

extern "C" {

void mgt_k_fill_rows(cudaStream_t st, size_t rows, int cols, const float *b, float *y) {
    const size_t total = rows * (size_t)(cols > 0 ? cols : 0);
    if (!total)
        return;
    MGT_LAUNCH(k_fill_rows, blocks_for(total), kThreads, st, total, cols, b, y);
}

void mgt_gpu_dense_fwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *b, float *y) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (n <= 0 || out <= 0)
        return;
    float beta = 0.0f;
    const float one = 1.0f;
    if (b) {
        mgt_k_fill_rows(im->stream, (size_t)n, out, b, y);
        beta = 1.0f;
    }
    if (in <= 0) {
        if (!b)
            GPU_CHECK(CUDA, cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n * out, im->stream));
        return;
    }
    GPU_CHECK(CUBLAS, cublasSgemm((cublasHandle_t)im->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in,
                                  &one, w, in, x, in, &beta, y, out));
}

void mgt_gpu_dense_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *dy, float *dx, float *dw, float *db) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    cublasHandle_t h = (cublasHandle_t)im->cublas;
    const float one = 1.0f, zero = 0.0f;
    if (n < 0)
        n = 0;
    if (db)
        mgt_k_colreduce(im->stream, &im->part, MGT_RED_SUM, (size_t)n, out, dy, nullptr, nullptr,
                        nullptr, db, nullptr);
    if (in <= 0 || out <= 0) {
        if (dx && n > 0 && in > 0)
            GPU_CHECK(CUDA, cudaMemsetAsync(dx, 0, sizeof(float) * (size_t)n * in, im->stream));
        return;
    }
    if (dw) {
        if (n == 0) /* an empty inner dimension: write the zeros ourselves */
            GPU_CHECK(CUDA, cudaMemsetAsync(dw, 0, sizeof(float) * (size_t)out * in, im->stream));
        else
            GPU_CHECK(CUBLAS, cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x, in, dy,
                                          out, &zero, dw, in));
    }
    if (dx && n > 0)
        GPU_CHECK(CUBLAS, cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, w, in, dy, out,
                                      &zero, dx, in));
}

} /* extern "C" */
