/* gpu_kernels.c: the GPU backend's memory-bound kernels one by one, on the shapes of the models
 * they serve: time, bytes moved, achieved GB/s and the fraction of the device's bandwidth, each
 * result checked against the CPU backend first.
 *
 *   mgt_gpu_kernels [--batch 32] [--iters 10] [--warmup 3] [--only NAME] [--no-check]
 *                   [--small] [--hbm-gbs 3350]
 *
 * The ceiling: a device-to-device copy of 1 GiB (the backend's copy op), counting the bytes read
 * and written, the fastest any kernel that streams memory can go; --hbm-gbs is the data sheet's
 * figure (H100 SXM: 3350), printed beside it. Each kernel's bytes are what it must move at
 * least: every input read once, every output written once (the filter gradient's partials and
 * the weights, a few KB, left out). Its time is the median of --iters runs between device events
 * after --warmup runs, on inputs rotated among up to four copies so that one run's inputs are
 * not in the L2 cache from the run before (50 MB on an H100). Inputs are random, never zeros.
 *
 * Cases (--only picks those whose name contains NAME):
 *   dwconv      depthwise convolution, forward / backward data / backward filter, on
 *               Xception's depthwise layers at 224x224x3 (and a stride-2 and a 5x5 layer); where
 *               the build has cuDNN proper, cuDNN's grouped convolution (groups = channels, its
 *               fastest algorithm of those its heuristics list) on the same shape beside it.
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
    int batch, iters, warmup, check, small;
    const char *only;
    double copy_gbs, hbm_gbs;
    int fails;
    uint64_t key;
} bench;

enum { MAX_SETS = 4 };
/* Inputs of one run, rotated so that the L2 cache (50 MB on an H100) does not hold them. */
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
    printf("%-26s %-28s %10.1f %10.1f %9.0f %7.1f%% %7.1f%%   %s\n", kernel, shape, bytes / 1e6,
           sec * 1e6, gbs, 100.0 * gbs / b->copy_gbs, 100.0 * gbs / b->hbm_gbs,
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
           "--hbm-gbs %.0f\n\n",
           c.bytes >> 20, b->copy_gbs, b->hbm_gbs);
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
        ctx.x[i] = dput(b, hx, nx);
        ctx.dy[i] = dput(b, hdy, ny);
    }
    ctx.w = dput(b, hw, nw);
    ctx.bias = dput(b, hb, (size_t)c);
    ctx.y = dalloc(b, ny * sizeof(float));
    ctx.dx = dalloc(b, nx * sizeof(float));
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
            float *h2 = dget(b, got[p], cnt[p]);
            err[p] = rel_err(h2, want[p], cnt[p]);
            free(h2);
        }
        free(y), free(dx), free(dw);
    }
    static const char *const names[3] = {"dwconv fwd", "dwconv bwd data", "dwconv bwd filter"};
    const double bytes = 4.0 * (double)(nx + ny);
    for (int p = 0; p < 3; p++) {
        ctx.pass = p;
        const double sec = time_runs(b, run_dw, &ctx, sets);
        row(b, names[p], shape, bytes, sec, err[p], 1e-4);
#ifdef MGT_BENCH_CUDNN
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

static void usage(void) {
    printf("usage: mgt_gpu_kernels [--batch N] [--iters N] [--warmup N] [--only NAME] "
           "[--no-check] [--small] [--hbm-gbs GBPS]\n");
}

int main(int argc, char **argv) {
    bench b = {.batch = 32, .iters = 10, .warmup = 3, .check = 1, .hbm_gbs = 3350.0, .key = 7};
    static const struct option opts[] = {{"batch", required_argument, 0, 'b'},
                                         {"iters", required_argument, 0, 'i'},
                                         {"warmup", required_argument, 0, 'w'},
                                         {"only", required_argument, 0, 'o'},
                                         {"no-check", no_argument, 0, 'n'},
                                         {"small", no_argument, 0, 's'},
                                         {"hbm-gbs", required_argument, 0, 'g'},
                                         {"help", no_argument, 0, 'h'},
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
    if (mgt_gpu_backend_init(&b.gpu, 0, 0, &e) != 0 || mgt_cpu_backend_init(&b.cpu, 0) != 0)
        mgt_die_all("cannot start the backends: %s", e.msg);
    char desc[160];
    mgt_gpu_describe(0, desc, sizeof desc);
    printf("GPU 0: %s; batch %d, median of %d runs after %d\n", desc, b.batch,
           b.iters < MGT_TIME_POINTS - 1 ? b.iters : MGT_TIME_POINTS - 1, b.warmup);
    measure_copy(&b);
    printf("%-26s %-28s %10s %10s %9s %8s %8s   %s\n", "kernel", "shape (n x h x w x c)", "MB",
           "us", "GB/s", "of copy", "of HBM", "vs CPU");
    cases_dw(&b);
    mgt_backend_destroy(&b.gpu);
    mgt_backend_destroy(&b.cpu);
    if (b.fails)
        fprintf(stderr, "%d result(s) differ from the CPU's\n", b.fails);
    return b.fails ? 1 : 0;
}
