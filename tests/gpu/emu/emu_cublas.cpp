/* emu_cublas.cpp: the cuBLAS functions the GPU backend calls, emulated on the host (see emu.h).
 *
 * Semantics follow NVIDIA's cuBLAS documentation, not its implementation:
 *   - column-major storage; op(A) is m x k, op(B) is k x n, C is m x n;
 *   - argument checks return CUBLAS_STATUS_INVALID_VALUE as documented (m, n, k < 0, a leading
 *     dimension below max(1, rows as stored), NULL alpha/beta/C);
 *   - alpha and beta are host pointers (the default pointer mode) read at the call, so the caller
 *     may reuse them as soon as the call returns;
 *   - beta == 0 means C is not read (NaN in C must not propagate); alpha == 0 or k == 0 means A
 *     and B are not read (the BLAS convention);
 *   - the work is queued on the handle's stream and runs when the stream does;
 *   - CUBLAS_TF32_TENSOR_OP_MATH rounds the inputs to TF32 (10-bit mantissa), so results differ
 *     from float32 as they do on tensor cores; the default math is exact float32.
 * The arithmetic itself is OpenBLAS's (cblas_sgemm, column-major).
 *
 * Misuse that a real GPU punishes with a crash or garbage (a host pointer where device memory is
 * needed, a matrix that runs past its allocation, a freed workspace) ends the process through
 * emu::fail with a message that names the argument. */
#include <cblas.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "emu.h"
#include "emu_util.h"

struct cublasContext {
    cudaStream_t stream;
    void *ws; /* user workspace (cublasSetWorkspace); NULL: the library's own pool */
    size_t ws_bytes;
    cublasMath_t math;
};

namespace {

emu::LiveSet live;

/* NULL is a status (documented); any other pointer that is not a live handle is a use after
 * cublasDestroy or garbage, which real cuBLAS would dereference. */
cublasStatus_t check_handle(const cublasContext *h, const char *fn) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!live.contains(h))
        emu::fail("%s: handle %p is not a live cublasHandle_t (destroyed, or never created)", fn,
                  (const void *)h);
    return CUBLAS_STATUS_SUCCESS;
}

/* Elements spanned by a column-major rows x cols matrix with leading dimension ld. */
size_t extent(int rows, int cols, int ld) {
    if (rows <= 0 || cols <= 0)
        return 0;
    return (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
}

bool valid_op(cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

bool tf32_math(cublasMath_t m) {
    const int base = (int)m & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    /* CUBLAS_TENSOR_OP_MATH (deprecated) rounds even further on hardware; TF32 is the closer of
     * the roundings emulated here. */
    return base == CUBLAS_TF32_TENSOR_OP_MATH || base == CUBLAS_TENSOR_OP_MATH;
}

/* A copy of a column-major matrix rounded to TF32, packed (ld = rows). */
std::vector<float> tf32_copy(const float *a, int rows, int cols, int ld) {
    std::vector<float> out((size_t)rows * (size_t)cols);
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++)
            out[(size_t)j * rows + i] = emu::to_tf32(a[(size_t)j * ld + i]);
    return out;
}

/* cublasGetStatusName's and cublasGetStatusString's answers, one row a status. */
struct StatusText {
    cublasStatus_t status;
    const char *name, *text;
};

#define STATUS(s, text) {s, #s, text}
const StatusText status_texts[] = {
    STATUS(CUBLAS_STATUS_SUCCESS, "success"),
    STATUS(CUBLAS_STATUS_NOT_INITIALIZED, "the library was not initialized"),
    STATUS(CUBLAS_STATUS_ALLOC_FAILED, "the resource allocation failed"),
    STATUS(CUBLAS_STATUS_INVALID_VALUE, "an invalid numeric value was used as an argument"),
    STATUS(CUBLAS_STATUS_ARCH_MISMATCH, "an absent device architectural feature is required"),
    STATUS(CUBLAS_STATUS_MAPPING_ERROR, "an access to GPU memory space failed"),
    STATUS(CUBLAS_STATUS_EXECUTION_FAILED, "the GPU program failed to execute"),
    STATUS(CUBLAS_STATUS_INTERNAL_ERROR, "an internal operation failed"),
    STATUS(CUBLAS_STATUS_NOT_SUPPORTED, "the functionality requested is not supported"),
    STATUS(CUBLAS_STATUS_LICENSE_ERROR,
           "an error was detected when checking the current licensing"),
};
#undef STATUS

const StatusText *status_text(cublasStatus_t s) {
    for (const StatusText &t : status_texts)
        if (t.status == s)
            return &t;
    return nullptr;
}

/* Bytes of the user workspace overwritten by every GEMM: cuBLAS owns the workspace while its
 * work runs, so a caller that keeps data there loses it, here as on the GPU. */
constexpr size_t WS_SCRIBBLE = (size_t)1 << 20;

} // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasContext *h = new cublasContext{};
    h->stream = 0;
    h->ws = nullptr;
    h->ws_bytes = 0;
    h->math = CUBLAS_DEFAULT_MATH;
    live.add(h);
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    const cublasStatus_t st = check_handle(handle, "cublasDestroy");
    if (st == CUBLAS_STATUS_SUCCESS)
        emu::destroy_handle(live, handle);
    return st;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    cublasStatus_t st = check_handle(handle, "cublasSetStream");
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    handle->stream = streamId;
    /* Documented: setting the stream resets the workspace to the library's default pool, so a
     * cublasSetWorkspace made before cublasSetStream is lost. */
    handle->ws = nullptr;
    handle->ws_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace,
                                     size_t workspaceSizeInBytes) {
    cublasStatus_t st = check_handle(handle, "cublasSetWorkspace");
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (workspaceSizeInBytes > 0) {
        if (!workspace || ((uintptr_t)workspace & 255u) != 0)
            return CUBLAS_STATUS_INVALID_VALUE; /* documented: at least 256-byte aligned */
        if (!emu::is_device(workspace, workspaceSizeInBytes))
            emu::fail("cublasSetWorkspace: workspace [%p, +%zu bytes) is not device memory "
                      "(cudaMalloc it)",
                      workspace, workspaceSizeInBytes);
    }
    handle->ws = workspaceSizeInBytes ? workspace : nullptr;
    handle->ws_bytes = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    cublasStatus_t st = check_handle(handle, "cublasSetMathMode");
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    const int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    switch (base) {
    case CUBLAS_DEFAULT_MATH:
    case CUBLAS_TENSOR_OP_MATH:
    case CUBLAS_PEDANTIC_MATH:
    case CUBLAS_TF32_TENSOR_OP_MATH:
    case CUBLAS_FP32_EMULATED_BF16X9_MATH:
    case CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH:
        break;
    default:
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status) {
    const StatusText *t = status_text(status);
    return t ? t->name : "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status) {
    const StatusText *t = status_text(status);
    return t ? t->text : "unknown error";
}

} // extern "C"

namespace {

bool bf16_type(cudaDataType t) {
    return t == CUDA_R_16BF;
}

size_t type_bytes(cudaDataType t) {
    return bf16_type(t) ? 2 : 4;
}

/* A column-major operand as the multiplication reads it, packed (ld = rows) into floats: float
 * data as it is (or rounded to TF32), bfloat16 data widened exactly. */
std::vector<float> operand(const void *a, cudaDataType t, bool tf32, int rows, int cols, int ld) {
    std::vector<float> out((size_t)rows * (size_t)cols);
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++) {
            const size_t at = (size_t)j * ld + i;
            const float v = bf16_type(t) ? emu::bf16_to_float(((const uint16_t *)a)[at])
                                         : ((const float *)a)[at];
            out[(size_t)j * rows + i] = tf32 ? emu::to_tf32(v) : v;
        }
    return out;
}

/* C = alpha op(A) op(B) + beta C for float or bfloat16 A and B and a float or bfloat16 C, with
 * float accumulation (cublasSgemm, cublasGemmEx with CUBLAS_COMPUTE_32F): the checks of the
 * documentation, then the work queued on the handle's stream. `fn` names the call in messages. */
cublasStatus_t gemm(const char *fn, cublasHandle_t handle, cublasOperation_t transa,
                    cublasOperation_t transb, int m, int n, int k, const float *alpha,
                    const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                    int ldb, const float *beta, void *C, cudaDataType ct, int ldc, bool tf32) {
    cublasStatus_t st = check_handle(handle, fn);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    /* A is stored rows_a x cols_a (m x k, or k x m transposed); B likewise. */
    const int rows_a = ta ? k : m, cols_a = ta ? m : k;
    const int rows_b = tb ? n : k, cols_b = tb ? k : n;
    if (lda < std::max(1, rows_a) || ldb < std::max(1, rows_b) || ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS; /* nothing to compute or scale */
    if (!C)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* Host pointer mode: the scalars are host memory, read now. */
    if (emu::is_device(alpha, sizeof *alpha) || emu::is_device(beta, sizeof *beta))
        emu::fail("%s: alpha (%p) or beta (%p) is device memory, but the handle is in the "
                  "default host pointer mode",
                  fn, (const void *)alpha, (const void *)beta);
    const float a = *alpha, b = *beta;
    const bool reads_ab = k > 0 && a != 0.0f;
    const size_t ea = extent(rows_a, cols_a, lda), eb = extent(rows_b, cols_b, ldb),
                 ec = extent(m, n, ldc);
    if (!emu::is_device(C, ec * type_bytes(ct)))
        emu::fail("%s: C = %p with m = %d, n = %d, ldc = %d spans %zu bytes that are not all "
                  "inside one device allocation",
                  fn, C, m, n, ldc, ec * type_bytes(ct));
    if (reads_ab) {
        if (!A || !emu::is_device(A, ea * type_bytes(at)))
            emu::fail("%s: A = %p (%s, %d x %d as stored, lda = %d) spans %zu bytes that are not "
                      "all inside one device allocation",
                      fn, A, ta ? "transposed" : "not transposed", rows_a, cols_a, lda,
                      ea * type_bytes(at));
        if (!B || !emu::is_device(B, eb * type_bytes(bt)))
            emu::fail("%s: B = %p (%s, %d x %d as stored, ldb = %d) spans %zu bytes that are not "
                      "all inside one device allocation",
                      fn, B, tb ? "transposed" : "not transposed", rows_b, cols_b, ldb,
                      eb * type_bytes(bt));
    }
    void *ws = handle->ws;
    const size_t ws_bytes = handle->ws_bytes;
    if (ws && !emu::is_device(ws, ws_bytes))
        emu::fail("%s: the workspace given to cublasSetWorkspace ([%p, +%zu bytes)) is no longer "
                  "device memory (freed before the handle was destroyed?)",
                  fn, ws, ws_bytes);
    emu::library_call_in_capture("cublas", handle->stream);
    const cudaError_t queued = emu::enqueue(
        handle->stream,
        [=]() {
            if (ws)
                std::memset(ws, 0xff, std::min(ws_bytes, WS_SCRIBBLE));
            const int lc = std::max(1, m);
            /* C as floats (beta == 0: not read, so NaN there cannot propagate) */
            std::vector<float> cf((size_t)lc * n, 0.0f);
            if (b != 0.0f)
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < m; i++) {
                        const size_t o = (size_t)j * ldc + i;
                        cf[(size_t)j * lc + i] = bf16_type(ct)
                                                     ? emu::bf16_to_float(((uint16_t *)C)[o])
                                                     : ((float *)C)[o];
                    }
            if (reads_ab) {
                const std::vector<float> fa = operand(A, at, tf32, rows_a, cols_a, lda),
                                         fb = operand(B, bt, tf32, rows_b, cols_b, ldb);
                cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, m, n, k, a, fa.data(),
                            std::max(1, rows_a), fb.data(), std::max(1, rows_b), b, cf.data(), lc);
            } else if (b != 1.0f) {
                for (float &v : cf)
                    v *= b;
            }
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    const size_t o = (size_t)j * ldc + i;
                    const float v = cf[(size_t)j * lc + i];
                    if (bf16_type(ct))
                        ((uint16_t *)C)[o] = emu::bf16_from_float(v);
                    else
                        ((float *)C)[o] = v;
                }
        },
        fn);
    /* its kernel refused (a stream capture CUDA invalidated): cuBLAS's word for a launch that
     * failed */
    return queued == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // namespace

extern "C" {

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
    const bool tf32 = handle && live.contains(handle) && tf32_math(handle->math);
    return gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B,
                CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc, tf32);
}

/* The combinations of cuBLAS's table for cublasGemmEx that float accumulation covers: float
 * A, B and C (TF32 under CUBLAS_COMPUTE_32F_FAST_TF32 or the handle's TF32 math mode), and
 * bfloat16 A and B with a bfloat16 or float C. Others answer NOT_SUPPORTED here. alpha and beta
 * are floats (the scale type of CUBLAS_COMPUTE_32F). */
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
    cublasStatus_t st = check_handle(handle, "cublasGemmEx");
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    const bool f32 = Atype == CUDA_R_32F && Btype == CUDA_R_32F && Ctype == CUDA_R_32F;
    const bool bf = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF &&
                    (Ctype == CUDA_R_16BF || Ctype == CUDA_R_32F);
    const bool c32 = computeType == CUBLAS_COMPUTE_32F ||
                     computeType == CUBLAS_COMPUTE_32F_PEDANTIC ||
                     (f32 && computeType == CUBLAS_COMPUTE_32F_FAST_TF32);
    if (!(f32 || bf) || !c32)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!(algo == CUBLAS_GEMM_DEFAULT || algo == CUBLAS_GEMM_DEFAULT_TENSOR_OP))
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool tf32 = f32 && computeType != CUBLAS_COMPUTE_32F_PEDANTIC &&
                      (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 || tf32_math(handle->math));
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, (const float *)alpha, A, Atype,
                lda, B, Btype, ldb, (const float *)beta, C, Ctype, ldc, tf32);
}

} // extern "C"
