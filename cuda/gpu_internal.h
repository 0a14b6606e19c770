/* gpu_internal.h: private to cuda/. The GPU backend's state, the one check macro, and the headers
 * of the op families, through which the files of cuda/ call each other.
 *
 * Files, by op family as src/cpu/ is; each family's .cu holds its kernels, their launchers and
 * the op-table entry points it defines, declared in its .h:
 *   gpu_backend.c   life cycle (count, describe, init, destroy), memory, staging, timing, the
 *                   convolution workspace, and the "gpu" op table, which points straight at the
 *                   families' entry points;
 *   gpu_dense.cu    dense layers on cuBLAS, and bias rows (also the convolutions');
 *   gpu_conv.c      convolution on cuDNN (NHWC activations, per-shape plans and algorithms);
 *   gpu_layout.cu   batched transposes (flatten, filters), explicit padding and its adjoint;
 *   gpu_reduce.cu   deterministic column sums (biases, batchnorm statistics and gradients);
 *   gpu_pool.cu     max and average pooling;
 *   gpu_graph.cu    what graph models add: residual sums, concatenation, zero padding, global
 *                   average pooling; gpu_depthwise.cu: depthwise convolution (own kernels);
 *   gpu_norm.cu     batch normalisation;
 *   gpu_elem.cu     activations (softmax included), dropout, y += x, the device RNG's twins;
 *   gpu_xent.cu     fused softmax + cross-entropy;
 *   gpu_optim.cu    optimizer steps;
 *   gpu_bf16.cu     float <-> bfloat16 for --precision bf16 (the dense and convolution families
 *                   round their inputs with it);
 *   gpu_exact.cu    the exact sums of --reproducible (exactsum.h's arithmetic per accumulator);
 *   gpu_clip.cu     gradient clipping by value and by global norm (a deterministic reduction);
 *   gpu_data.cu     batches made on the device: synthetic samples, gathers from kept bytes;
 *   gpu_launch.h    (kernel files only) block size, grids, warp reductions, the launch helper;
 *   gpu_check.c     what a failed CUDA / cuBLAS / cuDNN / NCCL call prints before the job ends;
 *   nccl_comm.c     the NCCL transport (mgt_comm_init_nccl);
 *   staged_comm.c   the MPI transport through pinned host memory (mgt_comm_init_mpi_staged).
 *
 * Host files are C (compiled by the project's C compiler with its warnings); the .cu files go
 * through nvcc, so this header and the families' are read both as C and as CUDA C++.
 *
 * Streams: the compute stream (im->stream) carries kernels, cuBLAS, cuDNN and the copies of
 * to_device/to_host; a copy stream carries the staged batches (stage()), and the NCCL transport
 * has its own stream; events order them. The host waits only in to_host(), sync(),
 * stage_wait() and time_read(), always by polling an event (mgt_gpu_wait_event), so that a wait
 * behind a collective that never completes can end the job instead of hanging.
 *
 * No file holds mutable globals: everything per instance lives in mgt_gpu_impl (be->impl). */
#ifndef MGT_GPU_INTERNAL_H
#define MGT_GPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "gpu_reduce.h" /* mgt_gpu_part, part of the backend's state */

#ifdef __cplusplus
extern "C" {
#endif

struct mgt_gpu_conv_cache; /* gpu_conv.c */

typedef struct mgt_gpu_impl {
    int device;
    int tf32;
    /* --precision bf16: the activations are bfloat16 (be->act, backend.h: every op's x, y, dy,
     * dx), each rounded once by the kernel that stores it; dense layers and convolutions take
     * them with bfloat16 copies of the weights and accumulate in float; the weights, their
     * gradients, the statistics, the loss and the optimizer's state stay float. */
    int bf16;
    /* --reproducible: every convolution runs a deterministic cuDNN algorithm chosen by cuDNN's
     * ranking alone (not by what fits the workspace, which depends on the per-rank batch), so a
     * chunk's shape gives the same algorithm, and the same bits, on any rank count. */
    int deterministic;
    cudaStream_t stream;
    void *cublas; /* cublasHandle_t */
    void *cudnn;  /* cudnnHandle_t */
    /* One workspace for the convolutions (cuDNN's algorithm workspace, transposed filters, padded
     * inputs). reserve() grows it while the model is built; a convolution grows it itself only if
     * it was never reserved large enough (then once, at its first call). */
    void *ws;
    size_t ws_bytes;
    void *blas_ws; /* cuBLAS's workspace, set once so that it never allocates in the step loop */
    mgt_gpu_part part;
    struct mgt_gpu_conv_cache *conv;
    /* Host waits poll this event (recorded where the wait must reach) and call watch() between
     * polls with the seconds waited so far; the NCCL transport sets watch to check its
     * communicator and its timeout. */
    cudaEvent_t wait_ev;
    void (*watch)(void *ctx, double waited);
    void *watch_ctx;
    /* Staging (stage()): the copy stream, and per slot the copies' event and the event after the
     * last op that reads the slot's device buffers (recorded yet or not). */
    cudaStream_t copy_stream;
    cudaEvent_t staged[2], released[2];
    int released_set[2];
    /* Device memory mgtrain holds (its cudaMalloc calls: tensors, workspaces, partials), now and
     * at most; live tensors and their sizes for gpu_free. */
    size_t mem_now, mem_peak;
    void **alloc_p;
    size_t *alloc_n;
    int nalloc, alloc_cap;
    /* Timing points (time_mark / time_read). */
    cudaEvent_t timing[MGT_TIME_SETS][MGT_TIME_POINTS];
    /* Marks (marks_reserve / mark / marks_read): per set, nmarks timing events. */
    cudaEvent_t *marks[MGT_MARK_SETS];
    int nmarks;
    /* Replay (capture_begin / capture_end / replay): the graphs made (cudaGraphExec_t), and a
     * capture under way on the compute stream; while one is, the host must not wait for the
     * device, and a wait asked for (a bug: the step's passes never read back) is noted in
     * capture_broken instead, which makes capture_end fail. */
    void *graph[MGT_GRAPHS];
    int capturing;
    const char *capture_broken;
} mgt_gpu_impl;

static inline mgt_gpu_impl *mgt_gpu_impl_of(mgt_backend *be) {
    return (mgt_gpu_impl *)be->impl;
}

/* The compute stream, where every op is queued. */
static inline cudaStream_t mgt_gpu_stream(mgt_backend *be) {
    return mgt_gpu_impl_of(be)->stream;
}

/* ---- gpu_backend.c ---- */
/* Waits until `ev` has completed, polling (see watch above). */
void mgt_gpu_wait_event(mgt_gpu_impl *im, cudaEvent_t ev);
/* The workspace as at least `bytes`, grown (outside the step loop, normally) if needed. */
void *mgt_gpu_workspace(mgt_backend *be, size_t bytes);

/* ---- checks (gpu_check.c) ----
 * Every CUDA, cuBLAS, cuDNN and NCCL call returns a status that is 0 on success; a non-blocking
 * NCCL communicator may also answer "in progress", which is not a failure. GPU_CHECK(LIB, call)
 * checks one call of library LIB (CUDA, CUBLAS, CUDNN or NCCL): on failure it prints "rank R:
 * CALL failed at FILE:LINE on GPU D: <the library's words>" (and what to do, where that helps)
 * and ends the whole job (mgt_die: MPI_Abort when there are other ranks). */
typedef enum { MGT_GPU_CUDA = 0, MGT_GPU_CUBLAS, MGT_GPU_CUDNN, MGT_GPU_NCCL } mgt_gpu_lib;
enum { MGT_GPU_NCCL_IN_PROGRESS = 7 }; /* ncclInProgress (checked in nccl_comm.c) */

static inline int mgt_gpu_ok(mgt_gpu_lib lib, int status) {
    return status == 0 || (lib == MGT_GPU_NCCL && status == MGT_GPU_NCCL_IN_PROGRESS);
}
void mgt_gpu_fail(mgt_gpu_lib lib, int status, const char *call, const char *file, int line)
    __attribute__((noreturn));
/* The library's words for a status ("out of memory (cudaErrorMemoryAllocation)"). */
const char *mgt_gpu_status_text(mgt_gpu_lib lib, int status, char *buf, size_t n);
/* Out of device memory: how much was asked, how much is free, what to do. */
void mgt_gpu_fail_oom(size_t bytes, const char *what, const char *file, int line)
    __attribute__((noreturn));
/* The rank in MPI_COMM_WORLD, or 0 before MPI_Init / after MPI_Finalize. */
int mgt_gpu_rank(void);

#define GPU_CHECK(LIB, call)                                                                       \
    do {                                                                                           \
        const int st_ = (int)(call);                                                               \
        if (!mgt_gpu_ok(MGT_GPU_##LIB, st_))                                                       \
            mgt_gpu_fail(MGT_GPU_##LIB, st_, #call, __FILE__, __LINE__);                           \
    } while (0)

#ifdef __cplusplus
}
#endif

/* The op families (see the list at the top). */
#include "gpu_bf16.h"
#include "gpu_clip.h"
#include "gpu_conv.h"
#include "gpu_data.h"
#include "gpu_dense.h"
#include "gpu_elem.h"
#include "gpu_exact.h"
#include "gpu_graph.h"
#include "gpu_layout.h"
#include "gpu_norm.h"
#include "gpu_optim.h"
#include "gpu_pool.h"
#include "gpu_xent.h"

#endif
