/* gpu_check.c: what GPU_CHECK (gpu_internal.h) prints when a CUDA, cuBLAS, cuDNN or NCCL call
 * fails, before the whole job ends.
 *
 * mgt_die (runtime.c) prefixes "rank R:" and ends every rank (MPI_Abort) when there are others;
 * the message names the call as written in the source, its file:line, the library's own words
 * for the status, and, where one helps, what to do. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>

#include "gpu_internal.h"
#include "runtime.h"

/* GPU_CHECK's one test of success holds for every library it checks. */
_Static_assert(cudaSuccess == 0 && CUBLAS_STATUS_SUCCESS == 0 && CUDNN_STATUS_SUCCESS == 0 &&
                   ncclSuccess == 0,
               "a library's success status is not 0");
_Static_assert((int)ncclInProgress == (int)MGT_GPU_NCCL_IN_PROGRESS, "ncclInProgress changed");

int mgt_gpu_rank(void) {
    int init = 0, fin = 0, rank = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

/* The CUDA device this thread is bound to, for messages (-1 if even that fails). */
static int current_device(void) {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess)
        d = -1;
    return d;
}

void mgt_gpu_fail_oom(size_t bytes, const char *what, const char *file, int line) {
    size_t free_b = 0, total_b = 0;
    (void)cudaGetLastError(); /* clear the allocation error so cudaMemGetInfo can answer */
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        free_b = total_b = 0;
    char asked[64] = "";
    if (bytes)
        snprintf(asked, sizeof asked, "asked for %.1f MiB, ", (double)bytes / 1048576.0);
    mgt_die("out of GPU memory on device %d (%s at %s:%d): %s%.1f MiB free of %.1f MiB; use a "
            "smaller per-GPU batch (a smaller --batch-size, or more ranks)",
            current_device(), what, file, line, asked, (double)free_b / 1048576.0,
            (double)total_b / 1048576.0);
}

const char *mgt_gpu_status_text(mgt_gpu_lib lib, int status, char *buf, size_t n) {
    switch (lib) {
    case MGT_GPU_CUDA:
        snprintf(buf, n, "%s (%s)", cudaGetErrorString((cudaError_t)status),
                 cudaGetErrorName((cudaError_t)status));
        break;
    case MGT_GPU_CUBLAS:
        snprintf(buf, n, "%s (%s)", cublasGetStatusString((cublasStatus_t)status),
                 cublasGetStatusName((cublasStatus_t)status));
        break;
    case MGT_GPU_CUDNN: {
        char last[512] = "";
        cudnnGetLastErrorString(last, sizeof last);
        snprintf(buf, n, "%s%s%s", cudnnGetErrorString((cudnnStatus_t)status), last[0] ? " - " : "",
                 last);
        break;
    }
    case MGT_GPU_NCCL:
        snprintf(buf, n, "%s", ncclGetErrorString((ncclResult_t)status));
        break;
    }
    return buf;
}

/* What to do, where the status says more than the library's words. */
static const char *advice(mgt_gpu_lib lib, int status) {
    if (lib == MGT_GPU_CUDA) {
        /* Errors of kernels that ran earlier surface at the next synchronising call: say so. */
        const cudaError_t e = (cudaError_t)status;
        if (e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure ||
            e == cudaErrorMisalignedAddress || e == cudaErrorIllegalInstruction ||
            e == cudaErrorHardwareStackError || e == cudaErrorAssert)
            return "; the fault may come from any kernel queued before this call (rerun with "
                   "CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer to find it)";
    }
    if (lib == MGT_GPU_CUBLAS && status == CUBLAS_STATUS_ALLOC_FAILED)
        return "; use a smaller per-GPU batch";
    if (lib == MGT_GPU_NCCL && (status == ncclSystemError || status == ncclRemoteError))
        return " (another rank may have died or its network failed; see its messages; "
               "NCCL_DEBUG=WARN tells more)";
    return "";
}

void mgt_gpu_fail(mgt_gpu_lib lib, int status, const char *call, const char *file, int line) {
    if (lib == MGT_GPU_CUDA && status == cudaErrorMemoryAllocation)
        mgt_gpu_fail_oom(0, call, file, line);
    char text[768];
    mgt_die("%s failed at %s:%d on GPU %d: %s%s", call, file, line, current_device(),
            mgt_gpu_status_text(lib, status, text, sizeof text), advice(lib, status));
}

int mgt_gpu_capture_lost(cudaStream_t st) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusInvalidated)
        return 0;
    (void)cudaGetLastError(); /* the capture's failure, which capture_end reports */
    return 1;
}

void mgt_gpu_fail_on(cudaStream_t st, mgt_gpu_lib lib, int status, const char *call,
                     const char *file, int line) {
    if (!mgt_gpu_capture_lost(st))
        mgt_gpu_fail(lib, status, call, file, line);
}
