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
 * --precision bf16: the same three products through cublasGemmEx on bfloat16 copies of x, W and
 * dy (rounded into the workspace, gpu_bf16.cu) with CUBLAS_COMPUTE_32F, writing float y, dx and
 * dW: each product of two bfloat16 values is exact in float, the sums are float sums, and the
 * outputs are not rounded to bfloat16 (the GEMM writes its float accumulator). */
#include <cublas_v2.h>

#include "gpu_launch.h"

namespace {

__global__ void k_fill_rows(size_t total, int cols, const float *__restrict__ b,
                            float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        y[i] = b[i % (size_t)cols];
    }
}

__global__ void k_add_rows(size_t total, int cols, const float *__restrict__ b,
                           float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        y[i] += b[i % (size_t)cols];
    }
}

size_t align256(size_t b) {
    return (b + 255) & ~(size_t)255;
}

/* The bfloat16 copies of up to three float matrices (counts a, b, c; 0: none) in the workspace,
 * each rounded from its source (NULL: not filled). */
struct bf16_copies {
    uint16_t *p[3];
};

bf16_copies bf16_inputs(mgt_backend *be, const size_t count[3], const float *const src[3]) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    size_t off[3], total = 0;
    for (int i = 0; i < 3; i++) {
        off[i] = total;
        total += align256(count[i] * sizeof(uint16_t));
    }
    char *ws = (char *)mgt_gpu_workspace(be, total);
    bf16_copies c;
    for (int i = 0; i < 3; i++) {
        c.p[i] = count[i] ? (uint16_t *)(ws + off[i]) : nullptr;
        if (count[i] && src[i])
            mgt_k_to_bf16(im->stream, count[i], src[i], c.p[i]);
    }
    return c;
}

cublasStatus_t gemm_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                         float *c, int ldc) {
    const float one = 1.0f;
    return cublasGemmEx(h, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &beta,
                        c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

} /* namespace */

extern "C" {

void mgt_k_fill_rows(cudaStream_t st, size_t rows, int cols, const float *b, float *y) {
    const size_t total = rows * (size_t)(cols > 0 ? cols : 0);
    if (!total)
        return;
    MGT_LAUNCH(k_fill_rows, blocks_for(total), kThreads, st, total, cols, b, y);
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
    if (im->bf16) {
        const size_t count[3] = {(size_t)out * in, (size_t)n * in, 0};
        const float *const src[3] = {w, x, nullptr};
        const bf16_copies c = bf16_inputs(be, count, src);
        GPU_CHECK(CUBLAS, gemm_bf16((cublasHandle_t)im->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n,
                                    in, c.p[0], in, c.p[1], in, beta, y, out));
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
    if (im->bf16 && n > 0 && (dw || dx)) {
        const size_t count[3] = {(size_t)n * out, dw ? (size_t)n * in : 0,
                                 dx ? (size_t)out * in : 0};
        const float *const src[3] = {dy, x, w};
        const bf16_copies c = bf16_inputs(be, count, src);
        if (dw)
            GPU_CHECK(CUBLAS, gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, c.p[1], in, c.p[0],
                                        out, 0.0f, dw, in));
        if (dx)
            GPU_CHECK(CUBLAS, gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, c.p[2], in, c.p[0],
                                        out, 0.0f, dx, in));
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
