/* gpu_conv.c: 2-D convolution on cuDNN's descriptor ("classic") API, NHWC float activations.
 *
 * Layout. Activations stay NHWC, as everywhere in mgtrain: no transposes of x, y, dx or dy. The
 * filter is given to cuDNN in NHWC ("KRSC", [oc][kh][kw][c]) too, the format cuDNN pairs with
 * NHWC activations (as PyTorch's channels_last does); the OIHW weights are transposed into the
 * workspace before each call and dW transposed back after (a few KB to MB, next to the
 * convolution itself). When c == 1 or kh*kw == 1 the two layouts are the same bytes and nothing
 * is transposed.
 *
 * Padding. cuDNN pads symmetrically (pad_top = pad_bottom). Keras' "same" is asymmetric when the
 * total padding is odd (even kernels, stride 2 on even sizes: the extra row/column at the
 * bottom/right). A plan first tries cuDNN's padding = (pad_top, pad_left) and keeps it if cuDNN's
 * output size is exactly (oh, ow) -- then every window starts where mgtrain's does. Otherwise the
 * input is zero-padded explicitly into the workspace (hp = (oh-1)*stride + kh rows) and cuDNN
 * runs unpadded; backward crops dx out of the padded gradient.
 *
 * Plans and algorithms. A plan per distinct shape (batch size included) is cached in the backend
 * (linear search: a model has a handful of shapes). Its algorithms are chosen once, at the first
 * call in each direction, from cuDNN's heuristics (cudnnGet*Algorithm_v7, which runs nothing):
 * the best-ranked DETERMINISTIC algorithm whose workspace fits, else the best-ranked that fits,
 * else the one needing the least workspace (and the workspace then grows, once). Without --tf32
 * the descriptors use CUDNN_FMA_MATH (no tensor-core TF32; CUDNN_DEFAULT_MATH would allow TF32 on
 * Ampere and later) and algorithms that need tensor-op math are skipped.
 *
 * Workspace. conv2d_scratch() has no backend (it is a pure function of the shape, called while
 * the model is built), so it cannot ask cuDNN. It returns the exact bytes of the transposed
 * filters and the padded input, plus an allowance for cuDNN's own workspace: the size of the
 * im2col matrix (the most any GEMM-like algorithm needs), clamped to [16 MiB, 256 MiB]. reserve()
 * allocates that once; the algorithm choice is then limited to what fits, so the step loop does
 * not allocate. Only if reserve() was never called with enough (a test calling the op directly)
 * does the first call grow the workspace itself.
 *
 * This is the one file that calls the deprecated-marked classic API (silenced just here). Its
 * helper kernels (filter transposes, padding, cropping, bias rows, bias gradients) are the
 * layout, dense and reduce families'. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"
#include "runtime.h"

/* The three directions a plan chooses an algorithm for. */
enum { DIR_FWD = 0, DIR_BWD_DATA = 1, DIR_BWD_FILTER = 2, NDIRS };

typedef struct conv_plan {
    mgt_conv_shape s; /* the key */
    int padded;       /* explicit zero padding (asymmetric "same") */
    int hp, wp;       /* the padded input's height and width (padded only) */
    int transpose;    /* OIHW <-> KRSC transposes needed (c > 1 and kh*kw > 1) */
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd[NDIRS]; /* per direction: the math type is per algorithm */
    int chosen[NDIRS];
    int algo[NDIRS];
    size_t algo_ws[NDIRS];
} conv_plan;

static const char *const dir_name[] = {
    [DIR_FWD] = "forward", [DIR_BWD_DATA] = "backward-data", [DIR_BWD_FILTER] = "backward-filter"};
_Static_assert(sizeof dir_name / sizeof dir_name[0] == NDIRS, "one name per direction");

struct mgt_gpu_conv_cache {
    conv_plan *plans;
    int n, cap;
};

/* ---- geometry and workspace layout (pure functions of the shape) ---- */

static size_t conv_k(const mgt_conv_shape *s) {
    return (size_t)s->c * (size_t)s->kh * (size_t)s->kw;
}

static size_t align256(size_t b) {
    return (b + 255) & ~(size_t)255;
}

/* Decides direct (cuDNN pads) or explicit padding, as described at the top. */
static void conv_geometry(const mgt_conv_shape *s, int *padded, int *hp, int *wp) {
    const int eh = s->h + 2 * s->pad_top, ew = s->w + 2 * s->pad_left;
    const int ohc = eh >= s->kh ? (eh - s->kh) / s->stride + 1 : 0;
    const int owc = ew >= s->kw ? (ew - s->kw) / s->stride + 1 : 0;
    *padded = !(ohc == s->oh && owc == s->ow);
    *hp = (s->oh - 1) * s->stride + s->kh;
    *wp = (s->ow - 1) * s->stride + s->kw;
}

static int conv_transposes(const mgt_conv_shape *s) {
    return s->c > 1 && s->kh * s->kw > 1;
}

typedef struct ws_layout {
    size_t w_t, dw_t, pad, algo; /* byte offsets */
} ws_layout;

/* [transposed W][transposed dW][padded x / padded dx][cuDNN's workspace]; returns the bytes
 * before cuDNN's part. */
static size_t conv_layout(const mgt_conv_shape *s, ws_layout *l) {
    int padded, hp, wp;
    conv_geometry(s, &padded, &hp, &wp);
    const size_t wbytes = conv_transposes(s) ? align256((size_t)s->oc * conv_k(s) * 4) : 0;
    const size_t n = s->n > 0 ? (size_t)s->n : 0;
    const size_t pbytes = padded ? align256(n * (size_t)hp * (size_t)wp * (size_t)s->c * 4) : 0;
    l->w_t = 0;
    l->dw_t = wbytes;
    l->pad = 2 * wbytes;
    l->algo = 2 * wbytes + pbytes;
    return l->algo;
}

size_t mgt_gpu_conv2d_scratch(const mgt_conv_shape *s) {
    if (s->n <= 0 || s->oc <= 0 || conv_k(s) == 0 || s->oh <= 0 || s->ow <= 0)
        return 0;
    ws_layout l;
    const size_t fixed = conv_layout(s, &l);
    size_t allowance = (size_t)s->n * (size_t)s->oh * (size_t)s->ow * conv_k(s) * 4;
    const size_t lo = (size_t)16 << 20, hi = (size_t)256 << 20;
    allowance = allowance < lo ? lo : allowance > hi ? hi : allowance;
    return fixed + allowance;
}

/* ---- plans ---- */

static void plan_destroy(conv_plan *p) {
    if (p->xd)
        cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd)
        cudnnDestroyTensorDescriptor(p->yd);
    if (p->wd)
        cudnnDestroyFilterDescriptor(p->wd);
    for (int d = 0; d < NDIRS; d++)
        if (p->cd[d])
            cudnnDestroyConvolutionDescriptor(p->cd[d]);
}

void mgt_gpu_conv_cache_free(mgt_gpu_impl *im) {
    struct mgt_gpu_conv_cache *c = im->conv;
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        plan_destroy(&c->plans[i]);
    free(c->plans);
    free(c);
    im->conv = NULL;
}

static int same_shape(const mgt_conv_shape *a, const mgt_conv_shape *b) {
    return a->n == b->n && a->h == b->h && a->w == b->w && a->c == b->c && a->oc == b->oc &&
           a->kh == b->kh && a->kw == b->kw && a->stride == b->stride && a->pad_top == b->pad_top &&
           a->pad_left == b->pad_left && a->oh == b->oh && a->ow == b->ow;
}

static conv_plan *plan_for(mgt_gpu_impl *im, const mgt_conv_shape *s) {
    if (!im->conv && !(im->conv = calloc(1, sizeof *im->conv)))
        mgt_die("out of host memory for the convolution plans");
    struct mgt_gpu_conv_cache *c = im->conv;
    for (int i = 0; i < c->n; i++)
        if (same_shape(&c->plans[i].s, s))
            return &c->plans[i];
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        conv_plan *np = realloc(c->plans, sizeof *np * (size_t)cap);
        if (!np)
            mgt_die("out of host memory for the convolution plans");
        c->plans = np;
        c->cap = cap;
    }
    conv_plan *p = &c->plans[c->n];
    memset(p, 0, sizeof *p);
    p->s = *s;
    conv_geometry(s, &p->padded, &p->hp, &p->wp);
    p->transpose = conv_transposes(s);
    const int xh = p->padded ? p->hp : s->h, xw = p->padded ? p->wp : s->w;
    const int ph = p->padded ? 0 : s->pad_top, pw = p->padded ? 0 : s->pad_left;
    GPU_CHECK(CUDNN, cudnnCreateTensorDescriptor(&p->xd));
    GPU_CHECK(CUDNN, cudnnCreateTensorDescriptor(&p->yd));
    GPU_CHECK(CUDNN, cudnnCreateFilterDescriptor(&p->wd));
    GPU_CHECK(CUDNN, cudnnSetTensor4dDescriptor(p->xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, s->n,
                                                s->c, xh, xw));
    GPU_CHECK(CUDNN, cudnnSetTensor4dDescriptor(p->yd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, s->n,
                                                s->oc, s->oh, s->ow));
    GPU_CHECK(CUDNN, cudnnSetFilter4dDescriptor(p->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, s->oc,
                                                s->c, s->kh, s->kw));
    for (int d = 0; d < NDIRS; d++) {
        GPU_CHECK(CUDNN, cudnnCreateConvolutionDescriptor(&p->cd[d]));
        GPU_CHECK(CUDNN,
                  cudnnSetConvolution2dDescriptor(p->cd[d], ph, pw, s->stride, s->stride, 1, 1,
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    }
    int on, oc, oh, ow;
    GPU_CHECK(CUDNN,
              cudnnGetConvolution2dForwardOutputDim(p->cd[0], p->xd, p->wd, &on, &oc, &oh, &ow));
    if (on != s->n || oc != s->oc || oh != s->oh || ow != s->ow)
        mgt_die(
            "internal error: cuDNN computes a %dx%dx%d output for a %dx%dx%d input, kernel "
            "%dx%d, stride %d, padding %d,%d where mgtrain expects %dx%dx%d; please report this",
            oh, ow, oc, s->h, s->w, s->c, s->kh, s->kw, s->stride, s->pad_top, s->pad_left, s->oh,
            s->ow, s->oc);
    c->n++;
    return p;
}

/* ---- algorithm choice ---- */

typedef struct cand {
    int algo;
    cudnnStatus_t status;
    int deterministic;
    cudnnMathType_t math;
} cand;

/* The three directions' result structs differ in type only: copy the fields we use. */
#define CANDS(r)                                                                                   \
    for (int i = 0; i < got; i++)                                                                  \
        out[i] = (cand) {                                                                          \
            (int)(r)[i].algo, (r)[i].status, (r)[i].determinism == CUDNN_DETERMINISTIC,            \
                (r)[i].mathType                                                                    \
        }

static int heuristics(mgt_gpu_impl *im, conv_plan *p, int dir, cand *out) {
    cudnnHandle_t h = (cudnnHandle_t)im->cudnn;
    int got = 0;
    if (dir == DIR_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        GPU_CHECK(CUDNN, cudnnGetConvolutionForwardAlgorithm_v7(h, p->xd, p->wd, p->cd[dir], p->yd,
                                                                CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                                &got, r));
        CANDS(r);
    } else if (dir == DIR_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        GPU_CHECK(CUDNN, cudnnGetConvolutionBackwardDataAlgorithm_v7(
                             h, p->wd, p->yd, p->cd[dir], p->xd,
                             CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, r));
        CANDS(r);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        GPU_CHECK(CUDNN, cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                             h, p->xd, p->yd, p->cd[dir], p->wd,
                             CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, r));
        CANDS(r);
    }
    return got;
}
#undef CANDS

static cudnnStatus_t algo_ws(mgt_gpu_impl *im, conv_plan *p, int dir, int algo, size_t *bytes) {
    cudnnHandle_t h = (cudnnHandle_t)im->cudnn;
    if (dir == DIR_FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(h, p->xd, p->wd, p->cd[dir], p->yd,
                                                       (cudnnConvolutionFwdAlgo_t)algo, bytes);
    if (dir == DIR_BWD_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, p->wd, p->yd, p->cd[dir], p->xd, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p->xd, p->yd, p->cd[dir], p->wd, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
}

static int tensor_op(cudnnMathType_t m) {
    return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

static void choose(mgt_backend *be, conv_plan *p, int dir) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const mgt_conv_shape *s = &p->s;
    ws_layout l;
    const size_t fixed = conv_layout(s, &l);
    if (im->ws_bytes < fixed) /* never reserved for this shape: size it now, once */
        mgt_gpu_workspace(be, mgt_gpu_conv2d_scratch(s));
    const size_t avail = im->ws_bytes > fixed ? im->ws_bytes - fixed : 0;
    GPU_CHECK(CUDNN, cudnnSetConvolutionMathType(p->cd[dir],
                                                 im->tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
    cand c[16];
    const int n = heuristics(im, p, dir, c);
    int best = -1;
    size_t best_ws = 0;
    cudnnMathType_t best_math = CUDNN_FMA_MATH;
    /* pass 0: deterministic and fits; 1: fits; 2: the smallest workspace of any */
    for (int pass = 0; pass < 3 && best < 0; pass++)
        for (int i = 0; i < n; i++) {
            if (c[i].status != CUDNN_STATUS_SUCCESS || (!im->tf32 && tensor_op(c[i].math)) ||
                (pass == 0 && !c[i].deterministic))
                continue;
            const cudnnMathType_t math = im->tf32 ? c[i].math : CUDNN_FMA_MATH;
            size_t ws = 0;
            if (cudnnSetConvolutionMathType(p->cd[dir], math) != CUDNN_STATUS_SUCCESS ||
                algo_ws(im, p, dir, c[i].algo, &ws) != CUDNN_STATUS_SUCCESS)
                continue;
            if (pass < 2 && ws > avail)
                continue;
            if (pass == 2 && best >= 0 && ws >= best_ws)
                continue;
            best = i;
            best_ws = ws;
            best_math = math;
            if (pass < 2)
                break;
        }
    if (best < 0)
        mgt_die("cuDNN offers no %s algorithm for the convolution n=%d %dx%dx%d -> %dx%dx%d, "
                "kernel %dx%d, stride %d (NHWC float%s); please report this with the model file",
                dir_name[dir], s->n, s->h, s->w, s->c, s->oh, s->ow, s->oc, s->kh, s->kw, s->stride,
                im->tf32 ? ", TF32 allowed" : ", FMA math");
    GPU_CHECK(CUDNN, cudnnSetConvolutionMathType(p->cd[dir], best_math));
    p->algo[dir] = c[best].algo;
    p->algo_ws[dir] = best_ws;
    p->chosen[dir] = 1;
    if (best_ws > avail)
        mgt_gpu_workspace(be, fixed + best_ws);
}

/* The workspace for plan p in direction dir (chosen on first use). */
static char *plan_ws(mgt_backend *be, conv_plan *p, int dir, ws_layout *l) {
    const size_t fixed = conv_layout(&p->s, l);
    if (!p->chosen[dir])
        choose(be, p, dir);
    return mgt_gpu_workspace(be, fixed + p->algo_ws[dir]);
}

/* ---- ops ---- */

void mgt_gpu_conv2d_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const size_t rows = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    if (rows == 0 || s->oc <= 0)
        return;
    if (conv_k(s) == 0) { /* no input channels: only the bias */
        if (b)
            mgt_k_fill_rows(im->stream, rows, s->oc, b, y);
        else
            GPU_CHECK(CUDA,
                      cudaMemsetAsync(y, 0, rows * (size_t)s->oc * sizeof(float), im->stream));
        return;
    }
    conv_plan *p = plan_for(im, s);
    ws_layout l;
    char *ws = plan_ws(be, p, DIR_FWD, &l);
    const float *wk = w, *xin = x;
    if (p->transpose) { /* per filter: [c][kh*kw] -> [kh*kw][c] */
        mgt_k_transpose(im->stream, (size_t)s->oc, (size_t)s->c, (size_t)s->kh * s->kw, w,
                        (float *)(ws + l.w_t));
        wk = (const float *)(ws + l.w_t);
    }
    if (p->padded) {
        mgt_k_pad_nhwc(im->stream, s->n, s->h, s->w, s->c, p->hp, p->wp, s->pad_top, s->pad_left, x,
                       (float *)(ws + l.pad));
        xin = (const float *)(ws + l.pad);
    }
    const float one = 1.0f;
    float beta = 0.0f;
    if (b) { /* the bias first, the convolution adds onto it (as the CPU backend does) */
        mgt_k_fill_rows(im->stream, rows, s->oc, b, y);
        beta = 1.0f;
    }
    GPU_CHECK(CUDNN,
              cudnnConvolutionForward((cudnnHandle_t)im->cudnn, &one, p->xd, xin, p->wd, wk,
                                      p->cd[DIR_FWD], (cudnnConvolutionFwdAlgo_t)p->algo[DIR_FWD],
                                      ws + l.algo, p->algo_ws[DIR_FWD], &beta, p->yd, y));
}

void mgt_gpu_conv2d_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    cudaStream_t st = im->stream;
    const size_t rows = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    const int oc = s->oc > 0 ? s->oc : 0;
    const size_t K = conv_k(s);
    const size_t x_count = (size_t)(s->n > 0 ? s->n : 0) * s->h * s->w * (s->c > 0 ? s->c : 0);
    if (db) /* zeros when rows == 0 */
        mgt_k_colreduce(st, &im->part, MGT_RED_SUM, rows, oc, dy, NULL, NULL, NULL, db, NULL);
    if (rows == 0 || oc == 0 || K == 0) { /* nothing flows: gradients are zeros */
        if (dw && oc && K)
            GPU_CHECK(CUDA, cudaMemsetAsync(dw, 0, (size_t)oc * K * sizeof(float), st));
        if (dx && x_count)
            GPU_CHECK(CUDA, cudaMemsetAsync(dx, 0, x_count * sizeof(float), st));
        return;
    }
    cudnnHandle_t h = (cudnnHandle_t)im->cudnn;
    conv_plan *p = plan_for(im, s);
    const float one = 1.0f, zero = 0.0f;
    ws_layout l;
    if (dw) {
        char *ws = plan_ws(be, p, DIR_BWD_FILTER, &l);
        const float *xin = x;
        if (p->padded) {
            mgt_k_pad_nhwc(st, s->n, s->h, s->w, s->c, p->hp, p->wp, s->pad_top, s->pad_left, x,
                           (float *)(ws + l.pad));
            xin = (const float *)(ws + l.pad);
        }
        float *dwk = p->transpose ? (float *)(ws + l.dw_t) : dw;
        GPU_CHECK(CUDNN, cudnnConvolutionBackwardFilter(
                             h, &one, p->xd, xin, p->yd, dy, p->cd[DIR_BWD_FILTER],
                             (cudnnConvolutionBwdFilterAlgo_t)p->algo[DIR_BWD_FILTER], ws + l.algo,
                             p->algo_ws[DIR_BWD_FILTER], &zero, p->wd, dwk));
        if (p->transpose) /* per filter: [kh*kw][c] -> [c][kh*kw] */
            mgt_k_transpose(st, (size_t)oc, (size_t)s->kh * s->kw, (size_t)s->c, dwk, dw);
    }
    if (dx) {
        char *ws = plan_ws(be, p, DIR_BWD_DATA, &l);
        const float *wk = w;
        if (p->transpose) {
            mgt_k_transpose(st, (size_t)oc, (size_t)s->c, (size_t)s->kh * s->kw, w,
                            (float *)(ws + l.w_t));
            wk = (const float *)(ws + l.w_t);
        }
        /* the padded gradient reuses the padded input's place: dW is done with it */
        float *dxo = p->padded ? (float *)(ws + l.pad) : dx;
        GPU_CHECK(CUDNN, cudnnConvolutionBackwardData(
                             h, &one, p->wd, wk, p->yd, dy, p->cd[DIR_BWD_DATA],
                             (cudnnConvolutionBwdDataAlgo_t)p->algo[DIR_BWD_DATA], ws + l.algo,
                             p->algo_ws[DIR_BWD_DATA], &zero, p->xd, dxo));
        if (p->padded)
            mgt_k_crop_nhwc(st, s->n, s->h, s->w, s->c, p->hp, p->wp, s->pad_top, s->pad_left, dxo,
                            dx);
    }
}
