/* gpu_check.c: what the CHECK_* macros of gpu_internal.h print when a CUDA, cuBLAS, cuDNN or NCCL
 * call fails, before the whole job ends.
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

void mgt_gpu_fail_cuda(int status, const char *call, const char *file, int line) {
    cudaError_t e = (cudaError_t)status;
    if (e == cudaErrorMemoryAllocation)
        mgt_gpu_fail_oom(0, call, file, line);
    /* Errors of kernels that ran earlier surface at the next synchronising call: say so. */
    const int sticky = e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure ||
                       e == cudaErrorMisalignedAddress || e == cudaErrorIllegalInstruction ||
                       e == cudaErrorHardwareStackError || e == cudaErrorAssert;
    mgt_die("%s failed at %s:%d on GPU %d: %s (%s)%s", call, file, line, current_device(),
            cudaGetErrorString(e), cudaGetErrorName(e),
            sticky ? "; the fault may come from any kernel queued before this call (rerun with "
                     "CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer to find it)"
                   : "");
}

void mgt_gpu_fail_cublas(int status, const char *call, const char *file, int line) {
    cublasStatus_t s = (cublasStatus_t)status;
    mgt_die("%s failed at %s:%d on GPU %d: %s (%s)%s", call, file, line, current_device(),
            cublasGetStatusString(s), cublasGetStatusName(s),
            s == CUBLAS_STATUS_ALLOC_FAILED ? "; use a smaller per-GPU batch" : "");
}

void mgt_gpu_fail_cudnn(int status, const char *call, const char *file, int line) {
    cudnnStatus_t s = (cudnnStatus_t)status;
    char last[512] = "";
    cudnnGetLastErrorString(last, sizeof last);
    mgt_die("%s failed at %s:%d on GPU %d: %s%s%s", call, file, line, current_device(),
            cudnnGetErrorString(s), last[0] ? " - " : "", last);
}

void mgt_gpu_fail_nccl(int status, const char *call, const char *file, int line) {
    ncclResult_t s = (ncclResult_t)status;
    mgt_die("%s failed at %s:%d on GPU %d: %s%s", call, file, line, current_device(),
            ncclGetErrorString(s),
            s == ncclSystemError || s == ncclRemoteError
                ? " (another rank may have died or its network failed; see its messages; "
                  "NCCL_DEBUG=WARN tells more)"
                : "");
}
