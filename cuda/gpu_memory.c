/* gpu_memory.c: what every file of the GPU backend may lean on, below them all: the polled wait
 * for the device (mgt_gpu_wait_event, mgt_gpu_drain), device memory with its account (what
 * mgtrain holds now and at most), and the one workspace the convolutions, the dense layers and
 * the depthwise kernels share (mgt_gpu_workspace). It calls nothing of the backend above it: the
 * op table (gpu_backend.c) and the op families (gpu_conv.c, gpu_dense.cu, ...) call it.
 *
 * The host never blocks in CUDA: a wait records or takes an event and polls it, calling the
 * transport's watch between polls (gpu_internal.h), so that a wait behind a collective whose
 * peer died ends the job within --comm-timeout instead of hanging. */
#include <cuda_runtime_api.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "gpu_internal.h"
#include "util.h"

/* ---- waiting ----------------------------------------------------------------------------- */

void mgt_gpu_wait_event(mgt_gpu_impl *im, cudaEvent_t ev) {
    if (im->capturing) { /* no wait can be recorded: the capture fails, the ops run again */
        im->capture_broken = "a wait for the device";
        return;
    }
    const double t0 = mgt_now();
    for (int polls = 0;; polls++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            mgt_gpu_fail(MGT_GPU_CUDA, (int)e, "cudaEventQuery", __FILE__, __LINE__);
        if (im->watch)
            im->watch(im->watch_ctx, mgt_now() - t0);
        /* Spin briefly (most waits are short: a metric read), then sleep between polls so a long
         * wait does not hold a core the loader thread could use. */
        if (polls < 200) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

void mgt_gpu_drain(mgt_gpu_impl *im) {
    GPU_CHECK(CUDA, cudaEventRecord(im->wait_ev, im->stream));
    mgt_gpu_wait_event(im, im->wait_ev);
}

void mgt_gpu_quiesce(mgt_gpu_impl *im) {
    cudaStream_t s[3] = {im->stream, im->copy_stream, im->comm_stream};
    for (int i = 0; i < 3; i++)
        if (s[i] && !im->capturing) {
            GPU_CHECK(CUDA, cudaEventRecord(im->wait_ev, s[i]));
            mgt_gpu_wait_event(im, im->wait_ev);
        }
}

/* ---- memory ------------------------------------------------------------------------------ */

/* An allocation that failed for lack of memory: one line with the numbers (the caller, which
 * knows what the memory was for, words the error that ends the job). */
static void note_oom(size_t bytes, const char *what) {
    size_t free_b = 0, total_b = 0;
    (void)cudaGetLastError();
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        free_b = total_b = 0;
    fprintf(stderr,
            "rank %d: cudaMalloc of %.1f MiB for %s failed: %.1f MiB free of %.1f MiB on this "
            "GPU; a smaller per-GPU batch needs less\n",
            mgt_gpu_rank(), (double)bytes / 1048576.0, what, (double)free_b / 1048576.0,
            (double)total_b / 1048576.0);
    fflush(stderr);
}

void *mgt_gpu_malloc(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        note_oom(bytes, what);
        return NULL;
    }
    if (e != cudaSuccess)
        mgt_gpu_fail(MGT_GPU_CUDA, (int)e, "cudaMalloc", __FILE__, __LINE__);
    return p;
}

void mgt_gpu_free_now(mgt_gpu_impl *im, void *p) {
    if (!p)
        return;
    mgt_gpu_quiesce(im);
    GPU_CHECK(CUDA, cudaFree(p));
}

void mgt_gpu_account(mgt_gpu_impl *im, size_t add, size_t sub) {
    im->mem_now += add;
    if (im->mem_now > im->mem_peak)
        im->mem_peak = im->mem_now;
    im->mem_now -= sub;
}

/* ---- the workspace ----------------------------------------------------------------------- */

/* Grows the workspace to `bytes` (never shrinks; the content is not kept). The streams are
 * drained first: queued kernels may still use the old buffer. Returns -1 when the memory cannot
 * be had even with the old buffer freed (then there is no workspace at all). */
static int grow_workspace(mgt_gpu_impl *im, size_t bytes) {
    if (bytes <= im->ws_bytes)
        return 0;
    if (im->capturing) { /* no allocation can be recorded: the capture fails, as above */
        im->capture_broken = "the workspace's growth";
        return 0;
    }
    size_t rounded = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    mgt_gpu_quiesce(im);
    /* the graphs hold the old workspace's addresses: they go with it (replay says so) */
    for (int g = 0; g < MGT_GRAPHS; g++)
        if (im->graph[g]) {
            GPU_CHECK(CUDA, cudaGraphExecDestroy((cudaGraphExec_t)im->graph[g]));
            im->graph[g] = NULL;
        }
    void *p = NULL;
    if (cudaMalloc(&p, rounded) != cudaSuccess) {
        /* perhaps only without the old buffer beside it */
        (void)cudaGetLastError();
        if (im->ws)
            GPU_CHECK(CUDA, cudaFree(im->ws));
        mgt_gpu_account(im, 0, im->ws_bytes);
        im->ws = NULL;
        im->ws_bytes = 0;
        if (!(p = mgt_gpu_malloc(rounded, "the convolution workspace")))
            return -1;
        mgt_gpu_account(im, rounded, 0);
    } else {
        mgt_gpu_account(im, rounded, im->ws_bytes); /* both were held for a moment */
        if (im->ws)
            GPU_CHECK(CUDA, cudaFree(im->ws));
    }
    im->ws = p;
    im->ws_bytes = rounded;
    return 0;
}

int mgt_gpu_reserve_workspace(mgt_gpu_impl *im, size_t bytes) {
    return grow_workspace(im, bytes);
}

void *mgt_gpu_workspace(mgt_backend *be, size_t bytes) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (grow_workspace(im, bytes) < 0)
        mgt_gpu_fail_oom(bytes, "growing the convolution workspace", __FILE__, __LINE__);
    return im->ws;
}
