/* gpu_internal.h: private to cuda/. The GPU backend's state, the one check macro, and the headers
 * of the op families, through which the files of cuda/ call each other.
 *
 * Files, by op family as src/cpu/ is; each family's .cu holds its kernels, their launchers and
 * the op-table entry points it defines, declared in its .h:
 *   gpu_backend.c   life cycle (count, describe, init, destroy), memory, staging, timing,
 *                   replay, and the "gpu" op table, which points straight at the families' entry
 *                   points;
 *   gpu_memory.c    below all the others: the polled waits, device memory and its account, the
 *                   workspace the convolutions, dense layers and depthwise kernels share;
 *   gpu_dense.cu    dense layers on cuBLAS, and bias rows (also the convolutions');
 *   gpu_conv.c      convolution on cuDNN (NHWC activations, per-shape plans and algorithms);
 *   gpu_weights.c   the weights' copies cuDNN and cuBLAS take (KRSC, bfloat16, padded channels),
 *                   made up to date once after each update;
 *   gpu_layout.cu   batched transposes (flatten, filters), explicit padding and its adjoint;
 *   gpu_reduce.cu   deterministic column sums (biases, batchnorm statistics and gradients);
 *   gpu_pool.cu     max and average pooling;
 *   gpu_graph.cu    what graph models add: residual sums, concatenation, zero padding, global
 *                   average pooling; gpu_depthwise.cu: depthwise convolution (own kernels);
 *   gpu_norm.cu     batch normalisation;
 *   gpu_seq.cu      sequence models' row-wise ops: dense layers with [in][out] weights (cuBLAS),
 *                   token and position embeddings, layer normalisation;
 *   gpu_attn.cu     causal multi-head self-attention (own fused kernels), and its generation op;
 *   gpu_sdpa.c      the same attention through cuDNN's fused flash attention (graph API), where
 *                   it can run (bfloat16, no dropout);
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
struct mgt_gpu_weights;    /* gpu_weights.c */
struct mgt_gpu_sdpa_cache; /* gpu_sdpa.c */

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
    /* The weights' copies in the layouts and types cuDNN and cuBLAS take (gpu_weights.c). */
    struct mgt_gpu_weights *wc;
    /* cuDNN's fused attention: its plans per shape (gpu_sdpa.c). */
    struct mgt_gpu_sdpa_cache *sdpa;
    /* Host waits poll this event (recorded where the wait must reach) and call watch() between
     * polls with the seconds waited so far; the NCCL transport sets watch to check its
     * communicator and its timeout. */
    cudaEvent_t wait_ev;
    void (*watch)(void *ctx, double waited);
    void *watch_ctx;
    /* The transport's stream (NCCL's), while it exists: mgt_gpu_quiesce waits for it too. */
    cudaStream_t comm_stream;
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
    double copy_bps; /* mgt_gpu_copy_rate's measurement, once made */
    const char *capture_broken;
} mgt_gpu_impl;

static inline mgt_gpu_impl *mgt_gpu_impl_of(mgt_backend *be) {
    return (mgt_gpu_impl *)be->impl;
}

/* The compute stream, where every op is queued. */
static inline cudaStream_t mgt_gpu_stream(mgt_backend *be) {
    return mgt_gpu_impl_of(be)->stream;
}

/* ---- gpu_memory.c: below every other file of the backend ---- */
/* Waits until `ev` has completed, polling (see watch above). */
void mgt_gpu_wait_event(mgt_gpu_impl *im, cudaEvent_t ev);
/* Waits until everything queued on the compute stream so far has run. */
void mgt_gpu_drain(mgt_gpu_impl *im);
/* Waits until every stream the backend knows (compute, copy, the transport's) is idle, by polled
 * waits: what must precede a call that waits for the whole device (cudaFree, cudaFreeHost), which
 * would otherwise wait, beyond --comm-timeout, for a collective whose peer died. */
void mgt_gpu_quiesce(mgt_gpu_impl *im);
/* cudaMalloc that returns NULL (after a line with the numbers) when memory runs out, and ends
 * the job on any other error (a sticky fault from an earlier kernel, say). */
void *mgt_gpu_malloc(size_t bytes, const char *what);
/* cudaFree(p) after mgt_gpu_quiesce. */
void mgt_gpu_free_now(mgt_gpu_impl *im, void *p);
/* The account of device memory mgtrain holds: `add` bytes taken, then `sub` given back. */
void mgt_gpu_account(mgt_gpu_impl *im, size_t add, size_t sub);
/* The workspace grown to at least `bytes` (reserve: -1 when it cannot be had), or as at least
 * `bytes`, grown (outside the step loop, normally) if needed, ending the job when it cannot. */
int mgt_gpu_reserve_workspace(mgt_gpu_impl *im, size_t bytes);
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

/* A stream capture that CUDA has invalidated: a call the capture could not hold (a library's
 * synchronising call, allocation or query inside it, say) ends it, and from then on every call
 * that queues work on the capturing stream fails (cudaErrorStreamCaptureInvalidated; cuBLAS and
 * cuDNN answer EXECUTION_FAILED) until cudaStreamEndCapture, which fails too. Such a failure is
 * the capture's, not the job's: capture_end reports it and the passes are issued again the
 * ordinary way (passes.h). mgt_gpu_capture_lost(st): whether st is in such a capture (clearing
 * the last error it left); mgt_gpu_fail_on: mgt_gpu_fail unless it is. GPU_CHECK_ON(st, LIB,
 * call) checks a call that queues work on stream st, as MGT_LAUNCH checks a launch. */
int mgt_gpu_capture_lost(cudaStream_t st);
void mgt_gpu_fail_on(cudaStream_t st, mgt_gpu_lib lib, int status, const char *call,
                     const char *file, int line);
#define GPU_CHECK_ON(stream, LIB, call)                                                            \
    do {                                                                                           \
        const int st_ = (int)(call);                                                               \
        if (!mgt_gpu_ok(MGT_GPU_##LIB, st_))                                                       \
            mgt_gpu_fail_on(stream, MGT_GPU_##LIB, st_, #call, __FILE__, __LINE__);                \
    } while (0)

#ifdef __cplusplus
}
#endif

/* The op families (see the list at the top). */
#include "gpu_attn.h"
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
#include "gpu_sdpa.h"
#include "gpu_loss.h"
#include "gpu_seq.h"
#include "gpu_weights.h"
#include "gpu_xent.h"

#endif
