/* gpu_internal.h: private to cuda/. The GPU backend's state, its check macros, and the kernel
 * launchers gpu_kernels.cu defines for the host files.
 *
 * Files:
 *   gpu_backend.c   life cycle (count, describe, init, destroy), memory, scratch, dense (cuBLAS),
 *                   the "gpu" op table; thin wrappers that hand every other op to a launcher;
 *   gpu_conv.c      convolution on cuDNN (NHWC activations, per-shape plans and algorithms);
 *   gpu_kernels.cu  every CUDA kernel, each behind an extern "C" launcher declared below;
 *   gpu_check.c     what a failed CUDA / cuBLAS / cuDNN / NCCL call prints before the job ends;
 *   nccl_comm.c     the NCCL transport (mgt_comm_init_nccl).
 *
 * Host files are C (compiled by the project's C compiler with its warnings); only the kernels go
 * through nvcc, so this header is read both as C and as CUDA C++.
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

#ifdef __cplusplus
extern "C" {
#endif

/* Reduction partials: two arrays of this many doubles, allocated once at init. Column sums over
 * many rows are done in two deterministic passes (per-chunk partial sums, then a fixed-order sum
 * of the partials), so a result never depends on thread scheduling. */
enum { MGT_GPU_PART_CAP = 1 << 16 };

typedef struct mgt_gpu_part {
    double *a, *b; /* device, MGT_GPU_PART_CAP each */
} mgt_gpu_part;

struct mgt_gpu_conv_cache; /* gpu_conv.c */

typedef struct mgt_gpu_impl {
    int device;
    int tf32;
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
} mgt_gpu_impl;

/* Waits until `ev` has completed, polling (see watch above). */
void mgt_gpu_wait_event(mgt_gpu_impl *im, cudaEvent_t ev);

static inline mgt_gpu_impl *mgt_gpu_impl_of(mgt_backend *be) {
    return (mgt_gpu_impl *)be->impl;
}

/* ---- checks (gpu_check.c): each prints "rank R: CALL failed at FILE:LINE: reason" and ends the
 * whole job (mgt_die: MPI_Abort when there are other ranks). ---- */
void mgt_gpu_fail_cuda(int status, const char *call, const char *file, int line)
    __attribute__((noreturn));
void mgt_gpu_fail_cublas(int status, const char *call, const char *file, int line)
    __attribute__((noreturn));
void mgt_gpu_fail_cudnn(int status, const char *call, const char *file, int line)
    __attribute__((noreturn));
void mgt_gpu_fail_nccl(int status, const char *call, const char *file, int line)
    __attribute__((noreturn));
/* Out of device memory: how much was asked, how much is free, what to do. */
void mgt_gpu_fail_oom(size_t bytes, const char *what, const char *file, int line)
    __attribute__((noreturn));
/* The rank in MPI_COMM_WORLD, or 0 before MPI_Init / after MPI_Finalize. */
int mgt_gpu_rank(void);

#define CHECK_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t st_ = (call);                                                                  \
        if (st_ != cudaSuccess)                                                                    \
            mgt_gpu_fail_cuda((int)st_, #call, __FILE__, __LINE__);                                \
    } while (0)
/* After every kernel launch: a bad configuration is reported here, naming the kernel. */
#define CHECK_LAUNCH(kernel_name)                                                                  \
    do {                                                                                           \
        cudaError_t st_ = cudaGetLastError();                                                      \
        if (st_ != cudaSuccess)                                                                    \
            mgt_gpu_fail_cuda((int)st_, "launch of " kernel_name, __FILE__, __LINE__);             \
    } while (0)
#define CHECK_CUBLAS(call)                                                                         \
    do {                                                                                           \
        int st_ = (int)(call);                                                                     \
        if (st_ != 0)                                                                              \
            mgt_gpu_fail_cublas(st_, #call, __FILE__, __LINE__);                                   \
    } while (0)
#define CHECK_CUDNN(call)                                                                          \
    do {                                                                                           \
        int st_ = (int)(call);                                                                     \
        if (st_ != 0)                                                                              \
            mgt_gpu_fail_cudnn(st_, #call, __FILE__, __LINE__);                                    \
    } while (0)

/* ---- gpu_backend.c ---- */
/* The workspace as at least `bytes`, grown (outside the step loop, normally) if needed. */
void *mgt_gpu_workspace(mgt_backend *be, size_t bytes);

/* ---- gpu_conv.c ---- */
size_t mgt_gpu_conv2d_scratch(const mgt_conv_shape *s);
void mgt_gpu_conv2d_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y);
void mgt_gpu_conv2d_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db);
void mgt_gpu_conv_cache_free(mgt_gpu_impl *im);

/* ---- gpu_kernels.cu: launchers. All run on stream `st`, accept empty sizes, and check the
 * launch. ---- */

/* y[r][j] = b[j] for r < rows, j < cols. */
void mgt_k_fill_rows(cudaStream_t st, size_t rows, int cols, const float *b, float *y);
/* y[i] += x[i]. */
void mgt_k_add(cudaStream_t st, size_t n, const float *x, float *y);

/* Column reductions over a row-major [rows][cols] matrix, accumulated in double:
 *   SUM:    out1[j] = sum_r a[r][j]
 *   SUMSQ:  out1[j] = sum_r a[r][j], out2[j] = sum_r a[r][j]^2                  (bn_stats)
 *   BN_BWD: a = x, b = dy: out2[j] = sum dy (dbeta), out1[j] = invstd[j] * sum dy * (x - mean[j])
 *           (dgamma); either output may be NULL                            (bn_bwd_reduce)
 * rows == 0 writes zeros. */
enum { MGT_RED_SUM = 0, MGT_RED_SUMSQ = 1, MGT_RED_BN_BWD = 2 };
void mgt_k_colreduce(cudaStream_t st, const mgt_gpu_part *part, int mode, size_t rows, int cols,
                     const float *a, const float *b, const float *mean, const float *invstd,
                     float *out1, float *out2);

/* dst[k][c][r] = src[k][r][c] for k < batch (a batch of row-major [rows][cols] matrices). */
void mgt_k_transpose(cudaStream_t st, size_t batch, size_t rows, size_t cols, const float *src,
                     float *dst);
/* Zero-padded copy of NHWC x into xp [n][hp][wp][c] (x at offset pt, pl; rows/columns beyond hp,
 * wp are dropped), and its adjoint: dx[n][h][w][c] from dxp (positions outside get 0). */
void mgt_k_pad_nhwc(cudaStream_t st, int n, int h, int w, int c, int hp, int wp, int pt, int pl,
                    const float *x, float *xp);
void mgt_k_crop_nhwc(cudaStream_t st, int n, int h, int w, int c, int hp, int wp, int pt, int pl,
                     const float *dxp, float *dx);

void mgt_k_maxpool_fwd(cudaStream_t st, const mgt_pool_shape *s, const float *x, float *y,
                       int32_t *argmax);
void mgt_k_maxpool_bwd(cudaStream_t st, const mgt_pool_shape *s, const float *dy,
                       const int32_t *argmax, float *dx);
void mgt_k_avgpool_fwd(cudaStream_t st, const mgt_pool_shape *s, const float *x, float *y);
void mgt_k_avgpool_bwd(cudaStream_t st, const mgt_pool_shape *s, const float *dy, float *dx);

void mgt_k_bn_apply(cudaStream_t st, int rows, int c, const float *x, const float *mean,
                    const float *invstd, const float *gamma, const float *beta, float *y);
void mgt_k_bn_finalize(cudaStream_t st, int c, float count, const float *sum, const float *sumsq,
                       float eps, float momentum, float *mean, float *invstd, float *running_mean,
                       float *running_var);
void mgt_k_bn_running(cudaStream_t st, int c, float eps, const float *running_mean,
                      const float *running_var, float *mean, float *invstd);
void mgt_k_bn_bwd_apply(cudaStream_t st, int rows, int c, float inv_count, const float *x,
                        const float *dy, const float *mean, const float *invstd, const float *gamma,
                        const float *dgamma, const float *dbeta, float *dx);

/* x[i][j] = keep(i, j) ? x[i][j] * keep_scale : 0 with util.h's mgt_uniform rule. */
void mgt_k_dropout(cudaStream_t st, int n, int row, float rate, float keep_scale, uint64_t key,
                   uint64_t first_sample, float *x);
void mgt_k_act_fwd(cudaStream_t st, mgt_act act, int n, int row, float *x);
void mgt_k_act_bwd(cudaStream_t st, mgt_act act, int n, int row, const float *y, float *dy);

/* Fused softmax + cross-entropy; per-row loss and correctness go to part, then one fixed-order
 * sum is added to sums[0..1]. */
void mgt_k_xent(cudaStream_t st, const mgt_gpu_part *part, int n, int k, const float *logits,
                const int32_t *labels, const float *targets, float *probs, float *dlogits,
                float scale, float *sums);

void mgt_k_sgd(cudaStream_t st, size_t count, float *w, const float *g, float *vel, float lr,
               float momentum, int nesterov, float wd, float scale);
void mgt_k_rmsprop(cudaStream_t st, size_t count, float *w, const float *g, float *ms, float lr,
                   float rho, float eps, float wd, float scale);
void mgt_k_adam(cudaStream_t st, size_t count, float *w, const float *g, float *m, float *v,
                float lr_t, float beta1, float beta2, float eps, float wd, float scale);

/* Synthetic samples (backend.h: synthetic): rows first + ids[i] into x, labels and, unless NULL,
 * one-hot targets. */
void mgt_k_synthetic(cudaStream_t st, int n, int64_t elems, int classes, uint64_t pixel_key,
                     uint64_t template_key, int64_t first, const int64_t *ids, float *x,
                     int32_t *labels, float *targets);

/* A batch from a byte dataset in device memory (backend.h: gather_u8). */
void mgt_k_gather_u8(cudaStream_t st, int n, int64_t elems, int classes, const uint8_t *pixels,
                     const uint8_t *labels, const int64_t *ids, float *x, int32_t *labels_out,
                     float *targets);

/* The device RNG compiled for the host (the same source as the kernels use), so that a test on
 * any machine can check it against util.h bit for bit. */
uint64_t mgt_gpu_rand64_twin(uint64_t key, uint64_t counter);
float mgt_gpu_uniform_twin(uint64_t key, uint64_t counter);

#ifdef __cplusplus
}
#endif

#endif
