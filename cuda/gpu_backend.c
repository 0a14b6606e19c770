/* gpu_backend.c: the GPU backend's life cycle and the "gpu" op table: device discovery
 * (mgt_gpu_count, mgt_gpu_describe), mgt_gpu_backend_init and destroy, device memory, batch
 * staging, device timing, the convolution workspace and the account of the backend's choices for
 * --profile. The ops themselves live in one file per
 * family (gpu_internal.h lists them); the table points straight at their entry points.
 *
 * Ops are queued on the backend's compute stream (non-blocking, so nothing else on the device
 * orders against it); staged batches come in on a copy stream, ordered by events (stage()).
 * Copies to the device return as soon as the host buffer may be reused (pageable memory is staged
 * by the driver). The host waits only in to_host(), sync(), stage_wait() and time_read(), and
 * always by polling an event (mgt_gpu_wait_event), never in a blocking CUDA call that could wait
 * forever behind a collective whose peer died. Any failure after init ends the job through
 * GPU_CHECK (gpu_check.c); init itself returns -1 with the reason so the trainer can word the
 * message. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "gpu_internal.h"
#include "runtime.h"
#include "util.h"

/* cuBLAS's workspace (its recommendation for Hopper), given to it once at init. */
#define MGT_GPU_BLAS_WS ((size_t)32 << 20)

/* ---- discovery ----------------------------------------------------------------------------- */

int mgt_gpu_count(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        if (why && n)
            snprintf(why, n, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        (void)cudaGetLastError();
        return -1;
    }
    if (count == 0 && why && n)
        snprintf(why, n, "no CUDA device is visible");
    return count;
}

void mgt_gpu_describe(int device, char *buf, size_t n) {
    struct cudaDeviceProp p;
    char bus[32] = "?";
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        snprintf(buf, n, "device %d (properties unavailable: %s)", device, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return;
    }
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device) != cudaSuccess) {
        snprintf(bus, sizeof bus, "?");
        (void)cudaGetLastError();
    }
    snprintf(buf, n, "%s, PCI %s, %.0f GiB", p.name, bus,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

/* Linked in (the GPU tests, the emulated build): at hand. In libmgt_gpu.so, gpu_load.c answers. */
int mgt_gpu_loadable(void) {
    return 1;
}

int mgt_gpu_may_exist(void) {
    return 1;
}

size_t mgt_gpu_workspace_bytes(const mgt_backend *be) {
    return be && be->impl ? ((const mgt_gpu_impl *)be->impl)->ws_bytes : 0;
}

size_t mgt_gpu_dwconv_workspace(const mgt_conv_shape *s) {
    return mgt_gpu_dwconv_scratch(NULL, s); /* a pure function of the shape */
}

size_t mgt_gpu_peak_bytes(const mgt_backend *be) {
    return be && be->impl ? ((const mgt_gpu_impl *)be->impl)->mem_peak : 0;
}

static void *gpu_alloc(mgt_backend *be, size_t bytes) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (im->nalloc == im->alloc_cap) { /* the tensor list (a few dozen entries) */
        int cap = im->alloc_cap ? 2 * im->alloc_cap : 64;
        void **np = realloc(im->alloc_p, sizeof(void *) * (size_t)cap);
        if (np)
            im->alloc_p = np;
        size_t *nn = realloc(im->alloc_n, sizeof(size_t) * (size_t)cap);
        if (nn)
            im->alloc_n = nn;
        if (!np || !nn)
            return NULL;
        im->alloc_cap = cap;
    }
    void *p = mgt_gpu_malloc(bytes, "a tensor");
    if (!p)
        return NULL;
    GPU_CHECK(CUDA, cudaMemsetAsync(p, 0, bytes ? bytes : 1, im->stream));
    im->alloc_p[im->nalloc] = p;
    im->alloc_n[im->nalloc++] = bytes ? bytes : 1;
    mgt_gpu_account(im, bytes ? bytes : 1, 0);
    return p;
}

/* Every stream drained first, by polled waits: queued work may still use p, and cudaFree waits
 * for the whole device, a collective whose peer died included, with no --comm-timeout (never
 * called in the step loop). */
static void gpu_free(mgt_backend *be, void *p) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!p)
        return;
    for (int i = 0; i < im->nalloc; i++)
        if (im->alloc_p[i] == p)
            mgt_gpu_weights_forget(im, p, im->alloc_n[i]); /* copies of weights that lived there */
    mgt_gpu_free_now(im, p);
    for (int i = 0; i < im->nalloc; i++)
        if (im->alloc_p[i] == p) {
            mgt_gpu_account(im, 0, im->alloc_n[i]);
            im->alloc_p[i] = im->alloc_p[--im->nalloc];
            im->alloc_n[i] = im->alloc_n[im->nalloc];
            break;
        }
}

/* Pinned host memory: copies from it run asynchronously (the loader's batch slots). */
static void *gpu_host_alloc(mgt_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

/* cudaFreeHost waits for the whole device, as cudaFree does: the streams drained first. */
static void gpu_host_free(mgt_backend *be, void *p) {
    if (!p)
        return;
    mgt_gpu_quiesce(mgt_gpu_impl_of(be));
    GPU_CHECK(CUDA, cudaFreeHost(p));
}

static void gpu_to_device(mgt_backend *be, void *dst, const void *src, size_t bytes) {
    cudaStream_t st = mgt_gpu_impl_of(be)->stream;
    mgt_gpu_weights_written(mgt_gpu_impl_of(be), dst, bytes);
    if (bytes)
        GPU_CHECK_ON(st, CUDA, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
}

/* The wait for the work before the copy is polled; the copy itself, queued on an idle stream,
 * cannot then wait on anything. */
static void gpu_to_host(mgt_backend *be, void *dst, const void *src, size_t bytes) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    mgt_gpu_drain(im);
    if (bytes)
        GPU_CHECK(CUDA, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, im->stream));
    GPU_CHECK(CUDA, cudaStreamSynchronize(im->stream));
}

static void gpu_copy(mgt_backend *be, void *dst, const void *src, size_t bytes) {
    cudaStream_t st = mgt_gpu_impl_of(be)->stream;
    mgt_gpu_weights_written(mgt_gpu_impl_of(be), dst, bytes);
    if (bytes && dst != src)
        GPU_CHECK_ON(st, CUDA, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
}

static void gpu_zero(mgt_backend *be, void *p, size_t bytes) {
    cudaStream_t st = mgt_gpu_impl_of(be)->stream;
    mgt_gpu_weights_written(mgt_gpu_impl_of(be), p, bytes);
    if (bytes)
        GPU_CHECK_ON(st, CUDA, cudaMemsetAsync(p, 0, bytes, st));
}

static void gpu_sync(mgt_backend *be) {
    mgt_gpu_drain(mgt_gpu_impl_of(be));
}

/* ---- staging and timing ---------------------------------------------------------------------- */

static void gpu_stage(mgt_backend *be, int slot, int count, void *const *dst,
                      const void *const *src, const size_t *bytes) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (im->released_set[slot]) /* the copies overwrite what that step reads */
        GPU_CHECK(CUDA, cudaStreamWaitEvent(im->copy_stream, im->released[slot], 0));
    for (int i = 0; i < count; i++)
        if (bytes[i])
            GPU_CHECK(CUDA, cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyHostToDevice,
                                            im->copy_stream));
    GPU_CHECK(CUDA, cudaEventRecord(im->staged[slot], im->copy_stream));
    GPU_CHECK(CUDA, cudaStreamWaitEvent(im->stream, im->staged[slot], 0));
}

static void gpu_stage_release(mgt_backend *be, int slot) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    GPU_CHECK_ON(im->stream, CUDA, cudaEventRecord(im->released[slot], im->stream));
    im->released_set[slot] = 1;
}

static void gpu_stage_wait(mgt_backend *be, int slot) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    mgt_gpu_wait_event(im, im->staged[slot]);
}

static void gpu_time_mark(mgt_backend *be, int set, int point) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    GPU_CHECK_ON(im->stream, CUDA, cudaEventRecord(im->timing[set][point], im->stream));
}

/* sec[i] = seconds from ev[0] to ev[i], i < n, once ev[n - 1] has run (waited for). */
static void read_events(mgt_gpu_impl *im, const cudaEvent_t *ev, int n, double *sec) {
    if (n <= 0)
        return;
    mgt_gpu_wait_event(im, ev[n - 1]);
    sec[0] = 0;
    for (int i = 1; i < n; i++) {
        float ms = 0;
        GPU_CHECK(CUDA, cudaEventElapsedTime(&ms, ev[0], ev[i]));
        sec[i] = 1e-3 * (double)ms;
    }
}

static void gpu_time_read(mgt_backend *be, int set, int npoints, double *sec) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    read_events(im, im->timing[set], npoints, sec);
}

/* ---- marks (--profile-layers) ---- */

static int gpu_marks_reserve(mgt_backend *be, int n) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (n <= im->nmarks)
        return 0;
    for (int k = 0; k < MGT_MARK_SETS; k++) { /* room first: then nothing can fail half-way */
        cudaEvent_t *ev = realloc(im->marks[k], sizeof *ev * (size_t)n);
        if (!ev)
            return -1;
        im->marks[k] = ev;
    }
    for (int k = 0; k < MGT_MARK_SETS; k++)
        for (int i = im->nmarks; i < n; i++)
            GPU_CHECK(CUDA, cudaEventCreate(&im->marks[k][i]));
    im->nmarks = n;
    return 0;
}

static void gpu_mark(mgt_backend *be, int set, int i) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    GPU_CHECK(CUDA, cudaEventRecord(im->marks[set][i], im->stream));
}

static void gpu_marks_read(mgt_backend *be, int set, int n, double *sec) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    read_events(im, im->marks[set], n, sec);
}

/* ---- replay: CUDA graphs captured from the compute stream ---- */

static void gpu_drop(mgt_backend *be, int g) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (im->graph[g])
        GPU_CHECK(CUDA, cudaGraphExecDestroy((cudaGraphExec_t)im->graph[g]));
    im->graph[g] = NULL;
}

/* Capture mode "thread local": the loader's thread may go on calling CUDA meanwhile. */
static int gpu_capture_begin(mgt_backend *be) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (im->capturing ||
        cudaStreamBeginCapture(im->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    im->capturing = 1;
    im->capture_broken = NULL;
    return 0;
}

static int gpu_capture_end(mgt_backend *be, int g) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!im->capturing)
        return -1;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(im->stream, &graph);
    im->capturing = 0;
    cudaGraphExec_t exec = NULL;
    if (e == cudaSuccess && !im->capture_broken)
        e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph)
        (void)cudaGraphDestroy(graph);
    if (e != cudaSuccess || im->capture_broken) {
        (void)cudaGetLastError();
        if (exec)
            (void)cudaGraphExecDestroy(exec);
        return -1;
    }
    gpu_drop(be, g);
    im->graph[g] = exec;
    return 0;
}

static int gpu_replay(mgt_backend *be, int g) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!im->graph[g])
        return -1;
    mgt_gpu_weights_refresh(im); /* a graph may read the weights' copies without making them */
    GPU_CHECK(CUDA, cudaGraphLaunch((cudaGraphExec_t)im->graph[g], im->stream));
    return 0;
}

static int gpu_reserve(mgt_backend *be, size_t bytes) {
    return mgt_gpu_reserve_workspace(mgt_gpu_impl_of(be), bytes);
}

double mgt_gpu_copy_rate(mgt_backend *be, char *name, size_t n) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    struct cudaDeviceProp prop;
    if (n && cudaGetDeviceProperties(&prop, im->device) == cudaSuccess)
        snprintf(name, n, "%s", prop.name);
    if (im->copy_bps > 0 || im->capturing)
        return im->copy_bps;
    /* 256 MiB each way (several times the 50-60 MB of an H100's or H200's L2), less where the
     * GPU has not 3 times that free; one copy to warm up, then 4 timed */
    size_t bytes = (size_t)256 << 20, free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        free_b = 0;
    while (bytes > ((size_t)1 << 20) && 3 * bytes > free_b)
        bytes /= 2;
    char *p = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    if (cudaMalloc((void **)&p, 2 * bytes) != cudaSuccess ||
        cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) {
        (void)cudaGetLastError();
    } else {
        enum { REPS = 4 };
        GPU_CHECK(CUDA, cudaMemcpyAsync(p + bytes, p, bytes, cudaMemcpyDeviceToDevice, im->stream));
        GPU_CHECK(CUDA, cudaEventRecord(ev[0], im->stream));
        for (int i = 0; i < REPS; i++)
            GPU_CHECK(CUDA, cudaMemcpyAsync(i % 2 ? p : p + bytes, i % 2 ? p + bytes : p, bytes,
                                            cudaMemcpyDeviceToDevice, im->stream));
        GPU_CHECK(CUDA, cudaEventRecord(ev[1], im->stream));
        mgt_gpu_wait_event(im, ev[1]);
        float ms = 0;
        GPU_CHECK(CUDA, cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (ms > 0)
            im->copy_bps = 2.0 * (double)bytes * REPS / (1e-3 * (double)ms);
    }
    for (int i = 0; i < 2; i++)
        if (ev[i])
            (void)cudaEventDestroy(ev[i]);
    mgt_gpu_free_now(im, p);
    return im->copy_bps;
}

/* --profile's account of the backend's choices: the arithmetic, then the convolutions'. */
static size_t gpu_describe(mgt_backend *be, char *buf, size_t n) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const char *f32 = im->tf32 ? "fp32 with TF32 tensor cores (cuBLAS "
                                 "CUBLAS_TF32_TENSOR_OP_MATH, cuDNN tensor-op math)"
                               : "fp32 (cuBLAS default math, cuDNN CUDNN_FMA_MATH: no TF32)";
    const int len =
        im->bf16 ? snprintf(buf, n,
                            "GPU arithmetic: bf16 mixed precision: dense layers and convolutions "
                            "on bfloat16 inputs with fp32 accumulation (cublasGemmEx CUDA_R_16BF, "
                            "CUBLAS_COMPUTE_32F; cuDNN bfloat16 data with float compute), "
                            "activations stored in bfloat16 between layers; weights, statistics, "
                            "the loss, optimizer state and every op's arithmetic %s\n",
                            f32)
                 : snprintf(buf, n, "GPU arithmetic: %s\n", f32);
    const size_t used = len > 0 ? (size_t)len : 0;
    return used + mgt_gpu_conv_describe(im, used < n ? buf + used : NULL, used < n ? n - used : 0);
}

static void gpu_destroy(mgt_backend *be) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (im) {
        /* Best effort: a destroy after a failure must not fail again. */
        if (im->stream)
            (void)cudaStreamSynchronize(im->stream);
        if (im->copy_stream)
            (void)cudaStreamSynchronize(im->copy_stream);
        mgt_gpu_conv_cache_free(im);
        mgt_gpu_sdpa_free(im);
        mgt_gpu_weights_free(im);
        for (int g = 0; g < MGT_GRAPHS; g++)
            if (im->graph[g])
                (void)cudaGraphExecDestroy((cudaGraphExec_t)im->graph[g]);
        for (int k = 0; k < MGT_MARK_SETS; k++) {
            for (int i = 0; i < im->nmarks; i++)
                (void)cudaEventDestroy(im->marks[k][i]);
            free(im->marks[k]);
        }
        if (im->cudnn)
            (void)cudnnDestroy((cudnnHandle_t)im->cudnn);
        if (im->cublas)
            (void)cublasDestroy((cublasHandle_t)im->cublas);
        if (im->ws)
            (void)cudaFree(im->ws);
        if (im->blas_ws)
            (void)cudaFree(im->blas_ws);
        if (im->part.a)
            (void)cudaFree(im->part.a);
        if (im->part.b)
            (void)cudaFree(im->part.b);
        if (im->part.c)
            (void)cudaFree(im->part.c);
        cudaEvent_t *evs[] = {&im->wait_ev, &im->staged[0], &im->staged[1], &im->released[0],
                              &im->released[1]};
        for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
            if (*evs[i])
                (void)cudaEventDestroy(*evs[i]);
        for (int i = 0; i < MGT_TIME_SETS; i++)
            for (int k = 0; k < MGT_TIME_POINTS; k++)
                if (im->timing[i][k])
                    (void)cudaEventDestroy(im->timing[i][k]);
        if (im->copy_stream)
            (void)cudaStreamDestroy(im->copy_stream);
        if (im->stream)
            (void)cudaStreamDestroy(im->stream);
        free(im->alloc_p);
        free(im->alloc_n);
        free(im);
    }
    be->impl = NULL;
    be->ops = NULL;
    be->act = MGT_F32;
    be->cancel_bias = 0;
}

/* The table: memory, staging and timing from this file, every op straight from its family. */
static const mgt_ops gpu_ops = {
    .name = "gpu",
    .gelu = 1,
    .alloc = gpu_alloc,
    .free = gpu_free,
    .to_device = gpu_to_device,
    .to_host = gpu_to_host,
    .copy = gpu_copy,
    .zero = gpu_zero,
    .add = mgt_gpu_add,
    .host_alloc = gpu_host_alloc,
    .host_free = gpu_host_free,
    .sync = gpu_sync,
    .stage = gpu_stage,
    .stage_release = gpu_stage_release,
    .stage_wait = gpu_stage_wait,
    .time_mark = gpu_time_mark,
    .time_read = gpu_time_read,
    .marks_reserve = gpu_marks_reserve,
    .mark = gpu_mark,
    .marks_read = gpu_marks_read,
    .capture_begin = gpu_capture_begin,
    .capture_end = gpu_capture_end,
    .replay = gpu_replay,
    .drop = gpu_drop,
    .synthetic = mgt_gpu_synthetic,
    .gather_u8 = mgt_gpu_gather_u8,
    .reserve = gpu_reserve,
    .destroy = gpu_destroy,
    .describe = gpu_describe,
    .describe_conv = mgt_gpu_conv_describe_shape,
    .dense_fwd = mgt_gpu_dense_fwd,
    .dense_bwd = mgt_gpu_dense_bwd,
    .conv2d_scratch = mgt_gpu_conv2d_scratch,
    .conv2d_fwd = mgt_gpu_conv2d_fwd,
    .conv2d_bwd = mgt_gpu_conv2d_bwd,
    .maxpool_fwd = mgt_gpu_maxpool_fwd,
    .maxpool_bwd = mgt_gpu_maxpool_bwd,
    .avgpool_fwd = mgt_gpu_avgpool_fwd,
    .avgpool_bwd = mgt_gpu_avgpool_bwd,
    .bn_stats = mgt_gpu_bn_stats,
    .bn_apply = mgt_gpu_bn_apply,
    .bn_finalize = mgt_gpu_bn_finalize,
    .bn_running = mgt_gpu_bn_running,
    .bn_bwd_reduce = mgt_gpu_bn_bwd_reduce,
    .bn_bwd_apply = mgt_gpu_bn_bwd_apply,
    .dropout_fwd = mgt_gpu_dropout,
    .dropout_bwd = mgt_gpu_dropout,
    .act_fwd = mgt_gpu_act_fwd,
    .act_bwd = mgt_gpu_act_bwd,
    .xent_sparse = mgt_gpu_xent_sparse,
    .xent_dense = mgt_gpu_xent_dense,
    .elem_loss = mgt_gpu_elem_loss,
    .act_from_f32 = mgt_gpu_act_from_f32,
    .act_to_f32 = mgt_gpu_act_to_f32,
    .nhwc_to_chw = mgt_gpu_nhwc_to_chw,
    .chw_to_nhwc = mgt_gpu_chw_to_nhwc,
    .optim_step = mgt_gpu_optim_step,
    .xs_add = mgt_gpu_xs_add,
    .xs_round = mgt_gpu_xs_round,
    .clip_value = mgt_gpu_clip_value,
    .clip_norm = mgt_gpu_clip_norm,
    .add2 = mgt_gpu_add2,
    .copy_cols = mgt_gpu_copy_cols,
    .pad_fwd = mgt_gpu_pad_fwd,
    .pad_bwd = mgt_gpu_pad_bwd,
    .gap_fwd = mgt_gpu_gap_fwd,
    .gap_bwd = mgt_gpu_gap_bwd,
    .dwconv_scratch = mgt_gpu_dwconv_scratch,
    .dwconv_fwd = mgt_gpu_dwconv_fwd,
    .dwconv_bwd = mgt_gpu_dwconv_bwd,
    .dense_io_fwd = mgt_gpu_dense_io_fwd,
    .dense_io_bwd = mgt_gpu_dense_io_bwd,
    .embed_fwd = mgt_gpu_embed_fwd,
    .embed_bwd = mgt_gpu_embed_bwd,
    .layernorm_fwd = mgt_gpu_layernorm_fwd,
    .layernorm_bwd = mgt_gpu_layernorm_bwd,
    .attn_scratch = mgt_gpu_attn_scratch,
    .attn_decode = mgt_gpu_attn_decode,
    .attn_fwd = mgt_gpu_attn_fwd,
    .attn_bwd = mgt_gpu_attn_bwd,
};

/* ---- init ---------------------------------------------------------------------------------- */

/* Init failures return -1 with the call and the library's words; the caller ends the job. */
#define INIT_CHECK(LIB, call)                                                                      \
    do {                                                                                           \
        const int st_ = (int)(call);                                                               \
        if (!mgt_gpu_ok(MGT_GPU_##LIB, st_)) {                                                     \
            char text_[512];                                                                       \
            mgt_errf(err, "GPU %d: %s failed: %s%s", device, #call,                                \
                     mgt_gpu_status_text(MGT_GPU_##LIB, st_, text_, sizeof text_),                 \
                     MGT_GPU_##LIB == MGT_GPU_CUDA && st_ == (int)cudaErrorMemoryAllocation        \
                         ? "; the GPU is full (another process?)"                                  \
                         : "");                                                                    \
            (void)cudaGetLastError();                                                              \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

int mgt_gpu_backend_init(mgt_backend *be, int device, int math, mgt_err *err) {
    char why[256] = "";
    int count = mgt_gpu_count(why, sizeof why);
    if (count <= 0)
        return mgt_errf(err, "no usable GPU (%s); run with --device cpu", why);
    if (device < 0 || device >= count)
        return mgt_errf(err, "GPU %d does not exist: %d GPUs are visible (numbered 0 to %d)",
                        device, count, count - 1);
    mgt_gpu_impl *im = calloc(1, sizeof *im);
    if (!im)
        return mgt_errf(err, "out of host memory starting the GPU backend");
    be->ops = &gpu_ops;
    be->impl = im;
    im->device = device;
    im->tf32 = (math & MGT_GPU_TF32) != 0;
    im->bf16 = (math & MGT_GPU_BF16) != 0;
    be->act = im->bf16 ? MGT_BF16 : MGT_F32; /* bfloat16 activations end to end (backend.h) */
    be->cancel_bias = 1; /* no convolution bias computed before a batchnorm (fuse.c) */
    im->deterministic = (math & MGT_GPU_DETERMINISTIC) != 0;
    cublasHandle_t blas = NULL;
    cudnnHandle_t dnn = NULL;
    INIT_CHECK(CUDA, cudaSetDevice(device));
    INIT_CHECK(CUDA, cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
    INIT_CHECK(CUDA, cudaStreamCreateWithFlags(&im->copy_stream, cudaStreamNonBlocking));
    INIT_CHECK(CUDA, cudaEventCreateWithFlags(&im->wait_ev, cudaEventDisableTiming));
    for (int i = 0; i < 2; i++) {
        INIT_CHECK(CUDA, cudaEventCreateWithFlags(&im->staged[i], cudaEventDisableTiming));
        INIT_CHECK(CUDA, cudaEventCreateWithFlags(&im->released[i], cudaEventDisableTiming));
    }
    for (int i = 0; i < MGT_TIME_SETS; i++)
        for (int k = 0; k < MGT_TIME_POINTS; k++)
            INIT_CHECK(CUDA, cudaEventCreate(&im->timing[i][k]));
    INIT_CHECK(CUBLAS, cublasCreate(&blas));
    im->cublas = blas;
    INIT_CHECK(CUBLAS, cublasSetStream(blas, im->stream));
    INIT_CHECK(CUBLAS, cublasSetMathMode(blas, im->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                        : CUBLAS_DEFAULT_MATH));
    INIT_CHECK(CUDA, cudaMalloc(&im->blas_ws, MGT_GPU_BLAS_WS));
    INIT_CHECK(CUBLAS, cublasSetWorkspace(blas, im->blas_ws, MGT_GPU_BLAS_WS));
    INIT_CHECK(CUDNN, cudnnCreate(&dnn));
    im->cudnn = dnn;
    INIT_CHECK(CUDNN, cudnnSetStream(dnn, im->stream));
    INIT_CHECK(CUDA, cudaMalloc((void **)&im->part.a, sizeof(double) * MGT_GPU_PART_CAP));
    INIT_CHECK(CUDA, cudaMalloc((void **)&im->part.b, sizeof(double) * MGT_GPU_PART_CAP));
    INIT_CHECK(CUDA, cudaMalloc((void **)&im->part.c, sizeof(double) * MGT_GPU_PART_CAP));
    mgt_gpu_account(im, MGT_GPU_BLAS_WS + 3 * sizeof(double) * MGT_GPU_PART_CAP, 0);
    INIT_CHECK(CUDA, cudaStreamSynchronize(im->stream));
    return 0;
fail:
    gpu_destroy(be);
    return -1;
}
