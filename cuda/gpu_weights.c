/* gpu_weights.c: the weights' copies cuDNN and cuBLAS read (gpu_weights.h).
 *
 * A convolution on cuDNN's NHWC path takes its filter in KRSC ([oc][kh][kw][c]), in bfloat16
 * under --precision bf16, with the input channels padded to the tensor cores' multiple where the
 * plan pads them (gpu_conv.c); a dense layer under --precision bf16 takes W in bfloat16. The
 * weights themselves stay OIHW float (backend.h). Making those copies at every call cost a
 * transpose and a rounding per convolution and direction, 4 to 6 small kernels per convolution
 * and step (about 210 for ResNet-50). Here each copy is made once, at the first use of its
 * weights in that form, and kept: it holds the weights' values until they are written, and it is
 * brought up to date then, for every copy at once in one launch (mgt_gpu_weights_refresh):
 * right after the optimizer's update, which is the one write of the weights in a step.
 *
 * Which writes make a copy out of date: every write of device memory the backend is told of
 * that overlaps the weights it was made from (mgt_gpu_weights_written: the memory ops to_device,
 * copy and zero, the optimizer's update, the exact sums' rounding, the NCCL collectives' results).
 * Kernels of the passes write activations and gradients, never the weights.
 *
 * With CUDA graphs: a copy made up to date while a pass is being captured is made in the graph,
 * and so at every replay, but it is not counted as up to date (the capture may yet fail, and then
 * nothing of it ran); a graph that reads a copy without making it relies on the copy being up to
 * date when it is replayed, which gpu_replay ensures by calling mgt_gpu_weights_refresh first.
 * A copy's memory is allocated at its first use, in the eager micro-batches before any capture;
 * one that would be first needed inside a capture (a bug) breaks the capture instead (the
 * capture then fails and is given up, and nothing recorded in it ever runs). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"
#include "runtime.h"

typedef struct wcopy {
    const float *src;
    size_t src_bytes;
    void *dst;
    size_t dst_bytes;
    int oc, c, cp, khkw, bf16;
    int fresh; /* holds the weights' values as the stream will have them */
} wcopy;

struct mgt_gpu_weights {
    wcopy *c;
    int n, cap;
    /* The jobs of every copy, in the copies' order, here and in device memory (its_n uploaded:
     * the table is sent again when a copy is added or forgotten). */
    mgt_gpu_krsc_job *jobs;
    mgt_gpu_krsc_job *jobs_dev;
    int jobs_dev_cap, jobs_dev_n;
    size_t total;        /* elements of all copies */
    uintptr_t lo, hi;    /* the smallest range holding every copy's weights */
    long long refreshes; /* copies made up to date (for the tests) */
};

static int overlaps(const wcopy *w, uintptr_t a, uintptr_t b) {
    const uintptr_t s = (uintptr_t)w->src;
    return a < s + w->src_bytes && s < b;
}

/* The jobs table, with each copy's first element, and the envelope, after a copy came or went;
 * sent to the device (outside any capture: copies come and go only there). */
static void relayout(mgt_gpu_impl *im) {
    struct mgt_gpu_weights *W = im->wc;
    W->total = 0;
    W->lo = UINTPTR_MAX;
    W->hi = 0;
    for (int i = 0; i < W->n; i++) {
        const wcopy *w = &W->c[i];
        W->jobs[i] =
            (mgt_gpu_krsc_job){w->src, w->dst, w->oc, w->c, w->cp, w->khkw, w->bf16, W->total};
        W->total += (size_t)w->oc * (size_t)w->khkw * (size_t)w->cp;
        const uintptr_t s = (uintptr_t)w->src;
        W->lo = s < W->lo ? s : W->lo;
        W->hi = s + w->src_bytes > W->hi ? s + w->src_bytes : W->hi;
    }
    if (W->n > W->jobs_dev_cap) {
        const int cap = W->n < 64 ? 64 : 2 * W->n;
        mgt_gpu_krsc_job *d = mgt_gpu_malloc(sizeof *d * (size_t)cap, "the weights' copies");
        if (!d)
            mgt_gpu_fail_oom(sizeof *d * (size_t)cap, "the table of the weights' copies", __FILE__,
                             __LINE__);
        mgt_gpu_free_now(im, W->jobs_dev);
        mgt_gpu_account(im, sizeof *d * (size_t)cap, sizeof *d * (size_t)W->jobs_dev_cap);
        W->jobs_dev = d;
        W->jobs_dev_cap = cap;
    }
    /* (pageable memory: the call returns once the driver holds the bytes) */
    if (W->n)
        GPU_CHECK(CUDA, cudaMemcpyAsync(W->jobs_dev, W->jobs, sizeof *W->jobs * (size_t)W->n,
                                        cudaMemcpyHostToDevice, im->stream));
    W->jobs_dev_n = W->n;
}

/* Copies [i, j) made up to date, in one launch. */
static void refresh_range(mgt_gpu_impl *im, int i, int j) {
    struct mgt_gpu_weights *W = im->wc;
    if (i >= j)
        return;
    const size_t base = W->jobs[i].first;
    const size_t end = j < W->n ? W->jobs[j].first : W->total;
    mgt_k_weights_krsc(im->stream, W->jobs_dev, W->n, base, end - base);
    for (int k = i; k < j; k++)
        W->c[k].fresh = !im->capturing;
    W->refreshes += j - i;
}

const void *mgt_gpu_weights_copy(mgt_backend *be, const float *w, int oc, int c, int cp, int khkw,
                                 int bf16) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!im->wc && !(im->wc = calloc(1, sizeof *im->wc)))
        mgt_die("out of host memory for the weights' copies");
    struct mgt_gpu_weights *W = im->wc;
    int k = 0;
    for (; k < W->n; k++) {
        const wcopy *x = &W->c[k];
        if (x->src == w && x->oc == oc && x->c == c && x->cp == cp && x->khkw == khkw &&
            x->bf16 == bf16)
            break;
    }
    if (k == W->n) {
        if (im->capturing) { /* no allocation can be recorded: the capture fails (see the top) */
            im->capture_broken = "a weights' copy made for the first time";
            return w;
        }
        if (W->n == W->cap) {
            const int cap = W->cap ? 2 * W->cap : 64;
            wcopy *nc = realloc(W->c, sizeof *nc * (size_t)cap);
            if (nc)
                W->c = nc;
            mgt_gpu_krsc_job *nj = nc ? realloc(W->jobs, sizeof *nj * (size_t)cap) : NULL;
            if (!nc || !nj)
                mgt_die("out of host memory for the weights' copies");
            W->jobs = nj;
            W->cap = cap;
        }
        const size_t count = (size_t)oc * (size_t)khkw * (size_t)cp;
        const size_t bytes = count * (bf16 ? 2 : 4);
        void *dst = mgt_gpu_malloc(bytes, "a copy of the weights");
        if (!dst)
            mgt_gpu_fail_oom(bytes, "a copy of the weights in cuDNN's layout", __FILE__, __LINE__);
        mgt_gpu_account(im, bytes, 0);
        W->c[W->n++] = (wcopy){w,    sizeof(float) * (size_t)oc * (size_t)c * (size_t)khkw,
                               dst,  bytes,
                               oc,   c,
                               cp,   khkw,
                               bf16, 0};
        relayout(im);
    }
    if (!W->c[k].fresh)
        refresh_range(im, k, k + 1);
    return W->c[k].dst;
}

void mgt_gpu_weights_written(mgt_gpu_impl *im, const void *p, size_t bytes) {
    struct mgt_gpu_weights *W = im->wc;
    const uintptr_t a = (uintptr_t)p, b = a + bytes;
    if (!W || !W->n || !bytes || b <= W->lo || a >= W->hi)
        return;
    for (int i = 0; i < W->n; i++)
        if (overlaps(&W->c[i], a, b))
            W->c[i].fresh = 0;
}

void mgt_gpu_weights_refresh(mgt_gpu_impl *im) {
    struct mgt_gpu_weights *W = im->wc;
    if (!W)
        return;
    /* runs of copies out of date, each in one launch: all of them after an update */
    for (int i = 0; i < W->n;) {
        if (W->c[i].fresh) {
            i++;
            continue;
        }
        int j = i + 1;
        while (j < W->n && !W->c[j].fresh)
            j++;
        refresh_range(im, i, j);
        i = j;
    }
}

void mgt_gpu_weights_forget(mgt_gpu_impl *im, const void *p, size_t bytes) {
    struct mgt_gpu_weights *W = im->wc;
    const uintptr_t a = (uintptr_t)p, b = a + bytes;
    if (!W || !W->n || b <= W->lo || a >= W->hi)
        return;
    int kept = 0;
    for (int i = 0; i < W->n; i++) {
        if (overlaps(&W->c[i], a, b)) {
            mgt_gpu_free_now(im, W->c[i].dst);
            mgt_gpu_account(im, 0, W->c[i].dst_bytes);
        } else {
            W->c[kept++] = W->c[i];
        }
    }
    if (kept != W->n) {
        W->n = kept;
        relayout(im);
    }
}

void mgt_gpu_weights_free(mgt_gpu_impl *im) {
    struct mgt_gpu_weights *W = im->wc;
    if (!W)
        return;
    for (int i = 0; i < W->n; i++) /* best effort: a destroy after a failure must not fail */
        (void)cudaFree(W->c[i].dst);
    if (W->jobs_dev)
        (void)cudaFree(W->jobs_dev);
    free(W->c);
    free(W->jobs);
    free(W);
    im->wc = NULL;
}

void mgt_gpu_weights_stats(const mgt_gpu_impl *im, int *copies, long long *refreshes) {
    *copies = im->wc ? im->wc->n : 0;
    *refreshes = im->wc ? im->wc->refreshes : 0;
}
