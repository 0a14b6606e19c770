/* gpu_kernels.c: the GPU backend's memory-bound kernels one by one, on the shapes of the models
 * they serve: time, bytes moved, achieved GB/s and the fraction of the device's bandwidth, each
 * result checked against the CPU backend first.
 *
 *   mgt_gpu_kernels [--batch 32] [--iters 10] [--warmup 3] [--only NAME] [--no-check]
 *                   [--small] [--bf16] [--hbm-gbs GBPS]
 *
 * The ceiling: a device-to-device copy of 1 GiB (the backend's copy op), counting the bytes read
 * and written, measured here first: the fastest any kernel that streams memory can go, and what
 * "of copy" is a share of (about 4,300 GB/s on an H200, 3,000 on an H100). "of HBM" is a share
 * of the data sheet's figure for the GPU by its name (H200 4,800, H100 SXM 3,350 GB/s), or of
 * --hbm-gbs; a dash for a GPU of no known figure. Each kernel's bytes are what it must move at
 * least: every input read once, every output written once (the filter gradient's partials and
 * the weights, a few KB, left out). Its time is the median of --iters runs between device events
 * after --warmup runs, on inputs rotated among up to four copies so that one run's inputs are
 * not in the L2 cache from the run before (50 MB on an H100, 60 on an H200). Inputs are random,
 * never zeros.
 *
 * Cases (--only picks those whose name contains NAME):
 *   dwconv      depthwise convolution, forward / backward data / backward filter, on
 *               Xception's depthwise layers at 224x224x3 (and a stride-2 and a 5x5 layer); where
 *               the build has cuDNN proper, cuDNN's grouped convolution (groups = channels, its
 *               fastest algorithm of those its heuristics list) on the same shape beside it;
 *   bn          batch normalisation on ResNet-50's shapes and Xception's middle flow: the
 *               statistics, apply alone and with a fusion group's ReLU and residual sum (and the
 *               three unfused ops it replaces), the backward sums and dx with the ReLU's mask
 *               recomputed or read from the output and the residual's gradient.
 * --bf16: the activations in bfloat16, as --precision bf16 holds them (half the bytes; results
 * checked against the CPU on the same rounded inputs, within one rounding to bfloat16).
 * --small: the same cases on small shapes (the emulated GPU of the tests runs them in seconds).
 * Exit status 1 when a result differs from the CPU's by more than its bound. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* cuDNN's classic API */
#endif

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#ifdef MGT_BENCH_CUDNN
#include <cudnn.h>
#endif

#include "backend.h"
#include "bench_args.h"
#include "gpu.h"
#include "model.h"
#include "util.h"

typedef struct bench {
    mgt_backend gpu, cpu;
    int batch, iters, warmup, check, small, bf16;
    const char *only;
    double copy_gbs, hbm_gbs;
    int fails;
    uint64_t key;
} bench;

enum { MAX_SETS = 4 };
/* Inputs of one run, rotated so that the L2 cache (50 MB on an H100, 60 on an H200) does not
 * hold them. */
static const size_t kRotateBytes = (size_t)160 << 20;

static int sets_for(size_t bytes_per_run) {
    size_t n = bytes_per_run ? (kRotateBytes + bytes_per_run - 1) / bytes_per_run : 1;
    return n < 1 ? 1 : n > MAX_SETS ? MAX_SETS : (int)n;
}

static void *dalloc(bench *b, size_t bytes) {
    void *p = b->gpu.ops->alloc(&b->gpu, bytes ? bytes : 16);
    if (!p)
        mgt_die_all("out of GPU memory: %zu bytes; use a smaller --batch", bytes);
    return p;
}

static float *hrand(bench *b, size_t n, float lo, float hi) {
    float *h = malloc(n * sizeof *h);
    if (!h)
        mgt_die_all("out of host memory: %zu floats", n);
    const uint64_t k = mgt_key3(b->key++, 0x42454e43ULL /* "BENC" */, n);
    for (size_t i = 0; i < n; i++)
        h[i] = lo + (hi - lo) * mgt_uniform(k, i);
    return h;
}

static float *dput(bench *b, const float *h, size_t n) {
    float *d = dalloc(b, n * sizeof(float));
    b->gpu.ops->to_device(&b->gpu, d, h, n * sizeof(float));
    return d;
}

/* Activations: bfloat16 on a --bf16 backend (backend.h). aput: n host values as the backend holds
 * them (rounded to nearest even), and the values it holds into h (the CPU's inputs); aget: n
 * of them widened to float. */
static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float *aput(bench *b, float *h, size_t n) {
    if (!b->bf16)
        return dput(b, h, n);
    uint16_t *t = malloc(n * sizeof *t + 2);
    if (!t)
        mgt_die_all("out of host memory: %zu values", n);
    for (size_t i = 0; i < n; i++) {
        t[i] = bf16_bits(h[i]);
        const uint32_t u = (uint32_t)t[i] << 16;
        memcpy(&h[i], &u, sizeof u);
    }
    float *d = dalloc(b, n * sizeof *t);
    b->gpu.ops->to_device(&b->gpu, d, t, n * sizeof *t);
    free(t);
    return d;
}

static float *aalloc(bench *b, size_t n) {
    return dalloc(b, n * mgt_dtype_size(b->gpu.act));
}

static float *dget(bench *b, const float *d, size_t n);

static float *aget(bench *b, const float *d, size_t n) {
    if (!b->bf16)
        return dget(b, d, n);
    uint16_t *t = malloc(n * sizeof *t + 2);
    float *h = malloc(n * sizeof *h + 4);
    if (!t || !h)
        mgt_die_all("out of host memory: %zu values", n);
    b->gpu.ops->to_host(&b->gpu, t, d, n * sizeof *t);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)t[i] << 16;
        memcpy(&h[i], &u, sizeof u);
    }
    free(t);
    return h;
}

static float *dget(bench *b, const float *d, size_t n) {
    float *h = malloc(n * sizeof *h);
    if (!h)
        mgt_die_all("out of host memory: %zu floats", n);
    b->gpu.ops->to_host(&b->gpu, h, d, n * sizeof(float));
    return h;
}

/* The largest |gpu - cpu| over the largest |cpu| of a tensor. */
static double rel_err(const float *gpu, const float *cpu, size_t n) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)gpu[i] - cpu[i]);
        e = d > e || isnan(d) ? d : e;
        m = fabs(cpu[i]) > m ? fabs(cpu[i]) : m;
    }
    return m > 0.0 ? e / m : e;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of b->iters runs of run(ctx, set) on the backend's stream, sets in turn. */
static double time_runs(bench *b, void (*run)(void *ctx, int set), void *ctx, int sets) {
    mgt_backend *g = &b->gpu;
    for (int i = 0; i < b->warmup; i++)
        run(ctx, i % sets);
    const int n = b->iters < MGT_TIME_POINTS - 1 ? b->iters : MGT_TIME_POINTS - 1;
    g->ops->time_mark(g, 0, 0);
    for (int i = 0; i < n; i++) {
        run(ctx, i % sets);
        g->ops->time_mark(g, 0, i + 1);
    }
    double t[MGT_TIME_POINTS], d[MGT_TIME_POINTS];
    g->ops->time_read(g, 0, n + 1, t);
    for (int i = 0; i < n; i++)
        d[i] = t[i + 1] - t[i];
    qsort(d, (size_t)n, sizeof d[0], cmp_double);
    return n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2]);
}

static void row(bench *b, const char *kernel, const char *shape, double bytes, double sec,
                double err, double bound) {
    const double gbs = sec > 0 ? bytes / sec / 1e9 : 0.0;
    const int bad = b->check && !(err <= bound);
    char hbm[16] = "       -";
    if (b->hbm_gbs > 0)
        snprintf(hbm, sizeof hbm, "%7.1f%%", 100.0 * gbs / b->hbm_gbs);
    printf("%-26s %-28s %10.1f %10.1f %9.0f %7.1f%% %s   %s\n", kernel, shape, bytes / 1e6,
           sec * 1e6, gbs, 100.0 * gbs / b->copy_gbs, hbm,
           !b->check ? "-"
           : bad     ? "FAIL"
                     : "ok");
    if (bad) {
        fprintf(stderr, "%s %s: error %.3g of the largest value, more than %.1g\n", kernel, shape,
                err, bound);
        b->fails++;
    }
    fflush(stdout);
}

static int wanted(const bench *b, const char *name) {
    return !b->only || strstr(name, b->only);
}

/* ---- the ceiling: a device-to-device copy ---- */

typedef struct {
    bench *b;
    void *src[MAX_SETS], *dst;
    size_t bytes;
} copy_ctx;

static void run_copy(void *p, int set) {
    copy_ctx *c = p;
    c->b->gpu.ops->copy(&c->b->gpu, c->dst, c->src[set], c->bytes);
}

static void measure_copy(bench *b) {
    copy_ctx c = {.b = b, .bytes = b->small ? (size_t)4 << 20 : (size_t)1 << 30};
    for (int i = 0; i < 2; i++)
        c.src[i] = dalloc(b, c.bytes);
    c.dst = dalloc(b, c.bytes);
    const double sec = time_runs(b, run_copy, &c, 2);
    b->copy_gbs = 2.0 * (double)c.bytes / sec / 1e9;
    printf("device-to-device copy of %zu MiB: %.0f GB/s (read + write), the ceiling below; "
           "HBM's data sheet: %.0f GB/s%s\n\n",
           c.bytes >> 20, b->copy_gbs, b->hbm_gbs,
           b->hbm_gbs > 0 ? "" : " (not known for this GPU: give it with --hbm-gbs)");
    for (int i = 0; i < 2; i++)
        b->gpu.ops->free(&b->gpu, c.src[i]);
    b->gpu.ops->free(&b->gpu, c.dst);
}

/* ---- depthwise convolution ---- */

typedef struct {
    bench *b;
    mgt_conv_shape s;
    float *x[MAX_SETS], *dy[MAX_SETS], *w, *bias, *y, *dx, *dw;
    int pass;
} dw_ctx;

static void run_dw(void *p, int set) {
    dw_ctx *c = p;
    mgt_backend *g = &c->b->gpu;
    if (c->pass == 0)
        g->ops->dwconv_fwd(g, &c->s, c->x[set], c->w, c->bias, c->y);
    else if (c->pass == 1)
        g->ops->dwconv_bwd(g, &c->s, c->x[set], c->w, c->dy[set], c->dx, NULL, NULL);
    else
        g->ops->dwconv_bwd(g, &c->s, c->x[set], c->w, c->dy[set], NULL, c->dw, NULL);
}

#ifdef MGT_BENCH_CUDNN
#define CUDNN_OK(call) ((call) == CUDNN_STATUS_SUCCESS)

/* cuDNN's grouped convolution on the same shape: its candidates in its heuristics' order, each
 * timed (median of iters) where it runs; the fastest. Symmetric padding only (cuDNN has no
 * other). Returns 0 where it has nothing to offer. */
static double cudnn_dw(bench *b, const mgt_conv_shape *s, int pass, const float *x, const float *w,
                       const float *dy, float *y, float *dx, float *dw, char *algo, size_t n) {
    snprintf(algo, n, "-");
    if (s->stride * (s->oh - 1) + s->kh - s->h != 2 * s->pad_top ||
        s->stride * (s->ow - 1) + s->kw - s->w != 2 * s->pad_left)
        return 0.0;
    cudnnHandle_t h;
    cudaStream_t st;
    if (!CUDNN_OK(cudnnCreate(&h)) || cudaStreamCreate(&st) != cudaSuccess)
        return 0.0;
    cudnnSetStream(h, st);
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnCreateTensorDescriptor(&xd);
    cudnnCreateTensorDescriptor(&yd);
    cudnnCreateFilterDescriptor(&wd);
    cudnnCreateConvolutionDescriptor(&cd);
    double best = 0.0;
    if (CUDNN_OK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, s->n, s->c,
                                            s->h, s->w)) &&
        CUDNN_OK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, s->n, s->c,
                                            s->oh, s->ow)) &&
        CUDNN_OK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, s->c, 1, s->kh,
                                            s->kw)) &&
        CUDNN_OK(cudnnSetConvolution2dDescriptor(cd, s->pad_top, s->pad_left, s->stride, s->stride,
                                                 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT)) &&
        CUDNN_OK(cudnnSetConvolutionGroupCount(cd, s->c)) &&
        CUDNN_OK(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH))) {
        enum { MAXA = 16 };
        int got = 0, algos[MAXA];
        if (pass == 0) {
            cudnnConvolutionFwdAlgoPerf_t perf[MAXA];
            cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, MAXA, &got, perf);
            for (int i = 0; i < got; i++)
                algos[i] = perf[i].status == CUDNN_STATUS_SUCCESS ? (int)perf[i].algo : -1;
        } else if (pass == 1) {
            cudnnConvolutionBwdDataAlgoPerf_t perf[MAXA];
            cudnnGetConvolutionBackwardDataAlgorithm_v7(h, wd, yd, cd, xd, MAXA, &got, perf);
            for (int i = 0; i < got; i++)
                algos[i] = perf[i].status == CUDNN_STATUS_SUCCESS ? (int)perf[i].algo : -1;
        } else {
            cudnnConvolutionBwdFilterAlgoPerf_t perf[MAXA];
            cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, xd, yd, cd, wd, MAXA, &got, perf);
            for (int i = 0; i < got; i++)
                algos[i] = perf[i].status == CUDNN_STATUS_SUCCESS ? (int)perf[i].algo : -1;
        }
        cudaEvent_t ev[MGT_TIME_POINTS];
        for (int i = 0; i < MGT_TIME_POINTS; i++)
            cudaEventCreate(&ev[i]);
        const float one = 1.0f, zero = 0.0f;
        for (int i = 0; i < got; i++) {
            if (algos[i] < 0)
                continue;
            size_t ws = 0;
            cudnnStatus_t q;
            if (pass == 0)
                q = cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algos[i], &ws);
            else if (pass == 1)
                q = cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd, algos[i], &ws);
            else
                q = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd, algos[i],
                                                                   &ws);
            void *wsp = NULL;
            if (!CUDNN_OK(q) || (ws && cudaMalloc(&wsp, ws) != cudaSuccess)) {
                (void)cudaGetLastError();
                continue;
            }
            const int iters = b->iters < MGT_TIME_POINTS - 1 ? b->iters : MGT_TIME_POINTS - 1;
            int ok = 1;
            for (int k = 0; k <= iters + b->warmup && ok; k++) {
                if (k >= b->warmup)
                    cudaEventRecord(ev[k - b->warmup], st);
                if (k == iters + b->warmup)
                    break;
                if (pass == 0)
                    q = cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, algos[i], wsp, ws, &zero,
                                                yd, y);
                else if (pass == 1)
                    q = cudnnConvolutionBackwardData(h, &one, wd, w, yd, dy, cd, algos[i], wsp, ws,
                                                     &zero, xd, dx);
                else
                    q = cudnnConvolutionBackwardFilter(h, &one, xd, x, yd, dy, cd, algos[i], wsp,
                                                       ws, &zero, wd, dw);
                ok = CUDNN_OK(q);
            }
            if (ok && cudaEventSynchronize(ev[iters]) == cudaSuccess) {
                double d[MGT_TIME_POINTS];
                for (int k = 0; k < iters; k++) {
                    float ms = 0.0f;
                    cudaEventElapsedTime(&ms, ev[k], ev[k + 1]);
                    d[k] = 1e-3 * ms;
                }
                qsort(d, (size_t)iters, sizeof d[0], cmp_double);
                const double med = d[iters / 2];
                if (best == 0.0 || med < best) {
                    best = med;
                    snprintf(algo, n, "algo %d", algos[i]);
                }
            }
            cudaFree(wsp);
        }
        for (int i = 0; i < MGT_TIME_POINTS; i++)
            cudaEventDestroy(ev[i]);
    }
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyConvolutionDescriptor(cd);
    cudnnDestroy(h);
    cudaStreamDestroy(st);
    return best;
}
#endif

static void bench_dw(bench *b, int h, int w, int c, int k, int stride) {
    const mgt_conv_shape s = mgt_conv2d_geometry(b->batch, h, w, c, c, k, k, stride, 1);
    const size_t nx = (size_t)s.n * s.h * s.w * s.c, ny = (size_t)s.n * s.oh * s.ow * s.c;
    const size_t nw = (size_t)c * k * k;
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%dx%dx%d k%d s%d", s.n, h, w, c, k, stride);
    dw_ctx ctx = {.b = b, .s = s};
    const int sets = sets_for((nx + ny) * sizeof(float));
    float *hx = hrand(b, nx, -1, 1), *hdy = hrand(b, ny, -1, 1), *hw = hrand(b, nw, -1, 1);
    float *hb = hrand(b, (size_t)c, -1, 1);
    for (int i = 0; i < sets; i++) {
        ctx.x[i] = aput(b, hx, nx);
        ctx.dy[i] = aput(b, hdy, ny);
    }
    ctx.w = dput(b, hw, nw);
    ctx.bias = dput(b, hb, (size_t)c);
    ctx.y = aalloc(b, ny);
    ctx.dx = aalloc(b, nx);
    ctx.dw = dalloc(b, nw * sizeof(float));
    if (b->gpu.ops->reserve(&b->gpu, b->gpu.ops->dwconv_scratch(&b->gpu, &s)) < 0)
        mgt_die_all("out of GPU memory for the depthwise workspace");
    double err[3] = {0, 0, 0};
    if (b->check) { /* the CPU's results, the GPU's on set 0 */
        mgt_backend *cb = &b->cpu;
        float *y = malloc(ny * sizeof *y), *dx = malloc(nx * sizeof *dx);
        float *dw = malloc(nw * sizeof *dw);
        if (!y || !dx || !dw || cb->ops->reserve(cb, cb->ops->dwconv_scratch(cb, &s)) < 0)
            mgt_die_all("out of host memory for the CPU's depthwise convolution");
        cb->ops->dwconv_fwd(cb, &s, hx, hw, hb, y);
        cb->ops->dwconv_bwd(cb, &s, hx, hw, hdy, dx, dw, NULL);
        const float *want[3] = {y, dx, dw};
        float *got[3] = {ctx.y, ctx.dx, ctx.dw};
        const size_t cnt[3] = {ny, nx, nw};
        for (int p = 0; p < 3; p++) {
            ctx.pass = p;
            run_dw(&ctx, 0);
            float *h2 = p < 2 ? aget(b, got[p], cnt[p]) : dget(b, got[p], cnt[p]);
            err[p] = rel_err(h2, want[p], cnt[p]);
            free(h2);
        }
        free(y), free(dx), free(dw);
    }
    static const char *const names[3] = {"dwconv fwd", "dwconv bwd data", "dwconv bwd filter"};
    const double bytes = (double)mgt_dtype_size(b->gpu.act) * (double)(nx + ny);
    for (int p = 0; p < 3; p++) {
        ctx.pass = p;
        const double sec = time_runs(b, run_dw, &ctx, sets);
        row(b, names[p], shape, bytes, sec, err[p], b->bf16 && p < 2 ? 0x1p-8 + 1e-4 : 1e-4);
#ifdef MGT_BENCH_CUDNN
        if (b->bf16)
            continue; /* the float comparison only */
        char algo[32], nm[64];
        const double t = cudnn_dw(b, &s, p, ctx.x[0], ctx.w, ctx.dy[0], ctx.y, ctx.dx, ctx.dw, algo,
                                  sizeof algo);
        snprintf(nm, sizeof nm, "  cuDNN grouped, %s", algo);
        if (t > 0)
            row(b, nm, shape, bytes, t, 0.0, 1.0);
        else
            printf("  cuDNN grouped: no algorithm for this shape\n");
#endif
    }
    for (int i = 0; i < sets; i++) {
        b->gpu.ops->free(&b->gpu, ctx.x[i]);
        b->gpu.ops->free(&b->gpu, ctx.dy[i]);
    }
    void *fr[] = {ctx.w, ctx.bias, ctx.y, ctx.dx, ctx.dw};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        b->gpu.ops->free(&b->gpu, fr[i]);
    free(hx), free(hdy), free(hw), free(hb);
}

static void cases_dw(bench *b) {
    if (!wanted(b, "dwconv"))
        return;
    /* Xception at 224x224x3: the inputs of its depthwise steps (stride 1, "same") */
    static const int xception[][3] = {{109, 109, 64}, {109, 109, 128}, {55, 55, 128},
                                      {55, 55, 256},  {28, 28, 256},   {28, 28, 728},
                                      {14, 14, 728},  {7, 7, 1024},    {7, 7, 1536}};
    static const int small[][3] = {{13, 11, 24}, {7, 7, 40}};
    const int n = b->small ? 2 : 9;
    for (int i = 0; i < n; i++) {
        const int *q = b->small ? small[i] : xception[i];
        bench_dw(b, q[0], q[1], q[2], 3, 1);
    }
    /* MobileNet's stride-2 depthwise steps and a 5x5 window (the general tiled kernels) */
    bench_dw(b, b->small ? 12 : 112, b->small ? 12 : 112, b->small ? 8 : 64, 3, 2);
    bench_dw(b, b->small ? 9 : 28, b->small ? 9 : 28, b->small ? 12 : 240, 5, 1);
}

/* ---- batch normalisation and its fusion groups ---- */

typedef struct {
    bench *b;
    int rows, c, kind;
    float *x[MAX_SETS], *dy[MAX_SETS], *r[MAX_SETS], *y, *dx, *dr, *t;
    float *mean, *invstd, *gamma, *beta, *sum, *sumsq, *dg, *db;
} bn_ctx;

enum {
    BN_STATS,
    BN_APPLY,
    BN_APPLY_RELU,
    BN_APPLY_ADD_RELU,
    BN_UNFUSED_ADD_RELU,
    BN_REDUCE,
    BN_REDUCE_RELU,
    BN_REDUCE_YMASK,
    BN_BWD,
    BN_BWD_RELU,
    BN_BWD_YMASK_DR,
    BN_KINDS
};
static const char *const bn_names[BN_KINDS] = {"bn stats",
                                               "bn apply",
                                               "bn+relu apply",
                                               "bn+add+relu apply",
                                               "  unfused bn,add,relu",
                                               "bn bwd reduce",
                                               "bn+relu bwd reduce",
                                               "bn+add+relu bwd reduce",
                                               "bn bwd dx",
                                               "bn+relu bwd dx",
                                               "bn+add+relu bwd dx,dr"};
/* Bytes per element of the tensor (x's size) each kind must move at least. */
static const int bn_bytes[BN_KINDS] = {4, 8, 8, 12, 28, 8, 8, 12, 12, 12, 20};

static mgt_bn_pass bn_pass_of(const bn_ctx *c, int set, int kind) {
    mgt_bn_pass p = {c->rows,  c->c,    c->x[set], c->mean,      c->invstd,
                     c->gamma, c->beta, NULL,      MGT_ACT_NONE, NULL, 0};
    if (kind == BN_APPLY_RELU || kind == BN_REDUCE_RELU || kind == BN_BWD_RELU)
        p.act = MGT_ACT_RELU;
    if (kind == BN_APPLY_ADD_RELU) {
        p.act = MGT_ACT_RELU;
        p.r = c->r[set];
    }
    if (kind == BN_REDUCE_YMASK || kind == BN_BWD_YMASK_DR) {
        p.act = MGT_ACT_RELU;
        p.y = c->y;
    }
    return p;
}

static void run_bn(void *p, int set) {
    bn_ctx *c = p;
    mgt_backend *g = &c->b->gpu;
    const mgt_ops *o = g->ops;
    const mgt_bn_pass bp = bn_pass_of(c, set, c->kind);
    const float count = (float)c->rows;
    switch (c->kind) {
    case BN_STATS:
        o->bn_stats(g, c->rows, c->c, c->x[set], c->sum, c->sumsq);
        break;
    case BN_APPLY:
    case BN_APPLY_RELU:
    case BN_APPLY_ADD_RELU:
        o->bn_apply(g, &bp, c->y);
        break;
    case BN_UNFUSED_ADD_RELU: /* what the three layers cost one after another */
        o->bn_apply(g, &bp, c->t);
        o->add2(g, (size_t)c->rows * (size_t)c->c, c->t, c->r[set], c->y);
        o->act_fwd(g, MGT_ACT_RELU, c->rows, c->c, c->y, c->y);
        break;
    case BN_REDUCE:
    case BN_REDUCE_RELU:
    case BN_REDUCE_YMASK:
        o->bn_bwd_reduce(g, &bp, c->dy[set], c->dg, c->db);
        break;
    case BN_BWD:
    case BN_BWD_RELU:
        o->bn_bwd_apply(g, &bp, count, c->dy[set], c->dg, c->db, c->dx, NULL, 0);
        break;
    default:
        o->bn_bwd_apply(g, &bp, count, c->dy[set], c->dg, c->db, c->dx, c->dr, 0);
        break;
    }
}

/* The CPU's result of kind on set 0 against the GPU's: the largest difference over the largest
 * value of the output (the parameter gradients for the reduces). */
static double bn_check(bn_ctx *c, float **h, int kind) {
    mgt_backend *cb = &c->b->cpu, *g = &c->b->gpu;
    const size_t n = (size_t)c->rows * c->c, nc = (size_t)c->c;
    mgt_bn_pass p = bn_pass_of(c, 0, kind);
    p.x = h[0];
    p.mean = h[3], p.invstd = h[4], p.gamma = h[5], p.beta = h[6];
    p.r = p.r ? h[2] : NULL;
    float *want = malloc(sizeof(float) * (n + 2 * nc)), *yc = NULL;
    if (!want)
        mgt_die_all("out of host memory");
    if (p.y) { /* the mask from the GPU's own forward output, as the kernels see it */
        yc = aget(c->b, c->y, n);
        p.y = yc;
    }
    double err = 0.0;
    if (kind == BN_STATS) {
        cb->ops->bn_stats(cb, c->rows, c->c, h[0], want, want + nc);
        float *a = dget(c->b, c->sum, nc), *q = dget(c->b, c->sumsq, nc);
        err = fmax(rel_err(a, want, nc), rel_err(q, want + nc, nc));
        free(a), free(q);
    } else if (kind <= BN_UNFUSED_ADD_RELU) {
        if (kind == BN_UNFUSED_ADD_RELU) {
            p.r = h[2];
            p.act = MGT_ACT_RELU;
        }
        cb->ops->bn_apply(cb, &p, want);
        float *a = aget(c->b, c->y, n);
        err = rel_err(a, want, n);
        free(a);
    } else if (kind <= BN_REDUCE_YMASK) {
        cb->ops->bn_bwd_reduce(cb, &p, h[1], want, want + nc);
        float *a = dget(c->b, c->dg, nc), *q = dget(c->b, c->db, nc);
        err = fmax(rel_err(a, want, nc), rel_err(q, want + nc, nc));
        free(a), free(q);
    } else {
        float *dg = dget(c->b, c->dg, nc), *db = dget(c->b, c->db, nc);
        cb->ops->bn_bwd_apply(cb, &p, (float)c->rows, h[1], dg, db, want, NULL, 0);
        float *a = aget(c->b, c->dx, n);
        err = rel_err(a, want, n);
        free(a), free(dg), free(db);
    }
    (void)g;
    free(want);
    free(yc);
    return err;
}

static void bench_bn(bench *b, int h, int w, int c) {
    bn_ctx ctx = {.b = b, .rows = b->batch * h * w, .c = c};
    const size_t n = (size_t)ctx.rows * c, nc = (size_t)c;
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%dx%dx%d", b->batch, h, w, c);
    const int sets = sets_for(3 * n * sizeof(float));
    float *h_[7] = {hrand(b, n, -2, 3),        hrand(b, n, -1, 1),       hrand(b, n, -1, 1),
                    hrand(b, nc, -0.5f, 0.5f), hrand(b, nc, 0.5f, 1.5f), hrand(b, nc, 0.5f, 1.5f),
                    hrand(b, nc, -1, 1)};
    for (int i = 0; i < sets; i++) {
        ctx.x[i] = aput(b, h_[0], n);
        ctx.dy[i] = aput(b, h_[1], n);
        ctx.r[i] = aput(b, h_[2], n);
    }
    ctx.mean = dput(b, h_[3], nc), ctx.invstd = dput(b, h_[4], nc);
    ctx.gamma = dput(b, h_[5], nc), ctx.beta = dput(b, h_[6], nc);
    ctx.y = aalloc(b, n), ctx.dx = aalloc(b, n), ctx.dr = aalloc(b, n), ctx.t = aalloc(b, n);
    ctx.sum = dalloc(b, nc * sizeof(float)), ctx.sumsq = dalloc(b, nc * sizeof(float));
    ctx.dg = dalloc(b, nc * sizeof(float)), ctx.db = dalloc(b, nc * sizeof(float));
    for (int k = 0; k < BN_KINDS; k++) {
        ctx.kind = k;
        double err = 0.0;
        if (k == BN_REDUCE_YMASK || k == BN_BWD_YMASK_DR) { /* y: the group's forward output */
            ctx.kind = BN_APPLY_ADD_RELU;
            run_bn(&ctx, 0);
            ctx.kind = k;
        }
        if (b->check) {
            run_bn(&ctx, 0);
            err = bn_check(&ctx, h_, k);
        }
        const double sec = time_runs(b, run_bn, &ctx, sets);
        /* bfloat16 outputs: one rounding (2^-8 of a value), the unfused ops three (each of the
         * largest value they pass) */
        const int act_out = k != BN_STATS && (k < BN_REDUCE || k > BN_REDUCE_YMASK);
        const double bound = !b->bf16 || !act_out      ? 1e-4
                             : k == BN_UNFUSED_ADD_RELU ? 3 * 0x1p-8 + 1e-4
                                                        : 0x1p-8 + 1e-4;
        row(b, bn_names[k], shape,
            (double)bn_bytes[k] / 4.0 * (double)mgt_dtype_size(b->gpu.act) * (double)n, sec, err,
            bound);
    }
    for (int i = 0; i < sets; i++) {
        b->gpu.ops->free(&b->gpu, ctx.x[i]);
        b->gpu.ops->free(&b->gpu, ctx.dy[i]);
        b->gpu.ops->free(&b->gpu, ctx.r[i]);
    }
    void *fr[] = {ctx.mean, ctx.invstd, ctx.gamma, ctx.beta,  ctx.y,  ctx.dx,
                  ctx.dr,   ctx.t,      ctx.sum,   ctx.sumsq, ctx.dg, ctx.db};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        b->gpu.ops->free(&b->gpu, fr[i]);
    for (int i = 0; i < 7; i++)
        free(h_[i]);
}

static void cases_bn(bench *b) {
    if (!wanted(b, "bn"))
        return;
    /* ResNet-50's batchnorm shapes at 224x224x3, and Xception's middle flow */
    static const int shapes[][3] = {{112, 112, 64}, {56, 56, 64},  {56, 56, 256},  {28, 28, 128},
                                    {28, 28, 512},  {14, 14, 256}, {14, 14, 1024}, {7, 7, 512},
                                    {7, 7, 2048},   {14, 14, 728}};
    static const int small[][3] = {{6, 5, 24}, {3, 3, 7}};
    const int n = b->small ? 2 : 10;
    for (int i = 0; i < n; i++) {
        const int *q = b->small ? small[i] : shapes[i];
        bench_bn(b, q[0], q[1], q[2]);
    }
}

static void usage(void) {
    printf("usage: mgt_gpu_kernels [--batch N] [--iters N] [--warmup N] [--only NAME] "
           "[--no-check] [--small] [--bf16] [--hbm-gbs GBPS]\n");
}

int main(int argc, char **argv) {
    bench b = {.batch = 32, .iters = 10, .warmup = 3, .check = 1, .hbm_gbs = 0, .key = 7};
    static const struct option opts[] = {{"batch", required_argument, 0, 'b'},
                                         {"iters", required_argument, 0, 'i'},
                                         {"warmup", required_argument, 0, 'w'},
                                         {"only", required_argument, 0, 'o'},
                                         {"no-check", no_argument, 0, 'n'},
                                         {"small", no_argument, 0, 's'},
                                         {"hbm-gbs", required_argument, 0, 'g'},
                                         {"help", no_argument, 0, 'h'},
                                         {"bf16", no_argument, 0, 'f'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'b':
            b.batch = (int)bench_need_long("--batch", optarg, 1);
            break;
        case 'i':
            b.iters = (int)bench_need_long("--iters", optarg, 1);
            break;
        case 'w':
            b.warmup = (int)bench_need_long("--warmup", optarg, 0);
            break;
        case 'o':
            b.only = optarg;
            break;
        case 'n':
            b.check = 0;
            break;
        case 's':
            b.small = 1;
            break;
        case 'f':
            b.bf16 = 1;
            break;
        case 'g':
            b.hbm_gbs = (double)bench_need_long("--hbm-gbs", optarg, 1);
            break;
        case 'h':
            usage();
            return 0;
        default:
            usage();
            return 2;
        }
    }
    if (b.small && b.batch == 32)
        b.batch = 2;
    char why[256] = "";
    if (mgt_gpu_count(why, sizeof why) <= 0) {
        printf("SKIPPED: no usable GPU (%s)\n", why);
        return 77;
    }
    mgt_err e;
    if (mgt_gpu_backend_init(&b.gpu, 0, b.bf16 ? MGT_GPU_BF16 : 0, &e) != 0 ||
        mgt_cpu_backend_init(&b.cpu, 0) != 0)
        mgt_die_all("cannot start the backends: %s", e.msg);
    char desc[160];
    mgt_gpu_describe(0, desc, sizeof desc);
    if (b.hbm_gbs == 0) /* the data sheets' HBM bandwidth, by the GPU's name */
        b.hbm_gbs = strstr(desc, "H200")                            ? 4800.0
                    : strstr(desc, "H100") && !strstr(desc, "PCIe") ? 3350.0
                                                                    : 0.0;
    printf("GPU 0: %s; %s activations, batch %d, median of %d runs after %d\n", desc,
           b.bf16 ? "bfloat16" : "float32", b.batch,
           b.iters < MGT_TIME_POINTS - 1 ? b.iters : MGT_TIME_POINTS - 1, b.warmup);
    measure_copy(&b);
    printf("%-26s %-28s %10s %10s %9s %8s %8s   %s\n", "kernel", "shape (n x h x w x c)", "MB",
           "us", "GB/s", "of copy", "of HBM", "vs CPU");
    cases_dw(&b);
    cases_bn(&b);
    mgt_backend_destroy(&b.gpu);
    mgt_backend_destroy(&b.cpu);
    if (b.fails)
        fprintf(stderr, "%d result(s) differ from the CPU's\n", b.fails);
    return b.fails ? 1 : 0;
}
