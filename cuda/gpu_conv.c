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
 * Plans and algorithms. A plan per distinct shape (batch size and --conv-algo included) is cached
 * in the backend (linear search: a model has a handful of shapes). At the first call in each
 * direction it lists candidates from cuDNN's heuristics (cudnnGet*Algorithm_v7, which runs
 * nothing, asked for cudnnGet*AlgorithmMaxCount entries): without --tf32 the descriptors use
 * CUDNN_FMA_MATH (CUDNN_DEFAULT_MATH would allow TF32 on Ampere and later) and entries that need
 * tensor-op math are left out; --conv-algo direct leaves out FFT and Winograd (their transforms
 * round on their own: not a plain fp32 dot product), --conv-algo winograd puts Winograd first
 * and says so where none runs for the layout (NHWC float has none). Then, in order:
 * deterministic algorithms whose workspace fits, any that fits, the rest by workspace (which
 * then grows, once). NHWC float filters have few algorithms, and the _v7 heuristics can rank
 * first one whose kernel then refuses the shape at execution (NOT_SUPPORTED), so the candidates
 * are tried in that order until one runs; the one that ran is final. --profile prints the log
 * (mgt_gpu_conv_describe): algorithm, math type, workspace, determinism, and what was refused.
 *
 * Workspace. conv2d_scratch() has no backend (it is a pure function of the shape, called while
 * the model is built), so it cannot ask cuDNN. It returns the exact bytes of the transposed
 * filters and the padded input, plus an allowance for cuDNN's own workspace: the size of the
 * im2col matrix (the most any GEMM-like algorithm needs), clamped to [16 MiB, 256 MiB]. reserve()
 * allocates that once; the algorithm choice is then limited to what fits, so the step loop does
 * not allocate. Only if reserve() was never called with enough (a test calling the op directly)
 * does the first call grow the workspace itself.
 *
 * --precision bf16. The descriptors are bfloat16 with float compute (cuDNN's
 * PSEUDO_BFLOAT16_CONFIG: x, w and y bfloat16, accumulation in float, each output rounded once to
 * bfloat16), with tensor-op math. The float operands are rounded into bfloat16 copies in the
 * workspace before each call (after the filter transpose and the explicit padding, which stay
 * float) and the bfloat16 outputs widened back to float after it (y with its bias added, dW
 * before its transpose, the padded dx before its crop): activations, weights and gradients
 * between layers stay float. A direction of a shape for which cuDNN offers no bfloat16
 * algorithm, or refuses every one it offered, runs on float descriptors instead (the plan keeps
 * both sets), with a notice, and the log says so.
 *
 * This is the one file that calls the deprecated-marked classic API (silenced just here). Its
 * helper kernels (filter transposes, padding, cropping, bias rows, bias gradients) are the
 * layout, dense and reduce families'. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"
#include "runtime.h"

/* The three directions a plan chooses an algorithm for. */
enum { DIR_FWD = 0, DIR_BWD_DATA = 1, DIR_BWD_FILTER = 2, NDIRS };

/* One heuristics entry kept as a candidate: its math type as it will run, its workspace, and the
 * status of its call if cuDNN refused it at execution. */
typedef struct conv_cand {
    int algo;
    cudnnStatus_t status;
    int deterministic;
    cudnnMathType_t math;
    size_t ws;
    int refused;
} conv_cand;

typedef struct conv_plan {
    mgt_conv_shape s; /* the key */
    int padded;       /* explicit zero padding (asymmetric "same") */
    int hp, wp;       /* the padded input's height and width (padded only) */
    int transpose;    /* OIHW <-> KRSC transposes needed (c > 1 and kh*kw > 1) */
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    /* bf16 only: float descriptors, for a direction cuDNN runs no bfloat16 algorithm in (f32) */
    cudnnTensorDescriptor_t xdf, ydf;
    cudnnFilterDescriptor_t wdf;
    int f32[NDIRS];
    cudnnConvolutionDescriptor_t cd[NDIRS]; /* per direction: the math type is per algorithm */
    /* Per direction, made at first use (choose): the candidates in the order they are tried, the
     * current one, whether it has run (then it is final), and the statuses of those refused. */
    int chosen[NDIRS];
    conv_cand *cand[NDIRS];
    int ncand[NDIRS];
    int cur[NDIRS];
    int ran[NDIRS];
} conv_plan;

static const char *const dir_name[] = {
    [DIR_FWD] = "forward", [DIR_BWD_DATA] = "backward-data", [DIR_BWD_FILTER] = "backward-filter"};
_Static_assert(sizeof dir_name / sizeof dir_name[0] == NDIRS, "one name per direction");
static const char *const want_name[] = {
    [MGT_CONV_AUTO] = "auto", [MGT_CONV_DIRECT] = "direct", [MGT_CONV_WINOGRAD] = "winograd"};
_Static_assert(sizeof want_name / sizeof want_name[0] == MGT_CONV_WINOGRAD + 1,
               "one name per --conv-algo value");

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
    size_t w_t, dw_t, pad; /* byte offsets */
    size_t xb, yb, wb;     /* bfloat16 x or dx, y or dy, W or dW (bf16 only) */
    size_t algo;
} ws_layout;

/* [transposed W][transposed dW][padded x / padded dx], with bf16 then [x or dx][y or dy]
 * [W or dW] in bfloat16 (x and dx padded when the input is), then [cuDNN's workspace]; returns
 * the bytes before cuDNN's part. */
static size_t conv_layout(const mgt_conv_shape *s, int bf16, ws_layout *l) {
    int padded, hp, wp;
    conv_geometry(s, &padded, &hp, &wp);
    const size_t wcount = (size_t)s->oc * conv_k(s);
    const size_t wbytes = conv_transposes(s) ? align256(wcount * 4) : 0;
    const size_t n = s->n > 0 ? (size_t)s->n : 0;
    const size_t xcount = n * (size_t)(padded ? hp : s->h) * (size_t)(padded ? wp : s->w) * s->c;
    const size_t ycount = n * (size_t)s->oh * (size_t)s->ow * (size_t)s->oc;
    const size_t pbytes = padded ? align256(xcount * 4) : 0;
    l->w_t = 0;
    l->dw_t = wbytes;
    l->pad = 2 * wbytes;
    l->xb = l->pad + pbytes;
    l->yb = l->xb + (bf16 ? align256(xcount * 2) : 0);
    l->wb = l->yb + (bf16 ? align256(ycount * 2) : 0);
    l->algo = l->wb + (bf16 ? align256(wcount * 2) : 0);
    return l->algo;
}

/* The workspace a shape needs (see "Workspace" at the top). */
static size_t scratch_bytes(const mgt_conv_shape *s, int bf16) {
    if (s->n <= 0 || s->oc <= 0 || conv_k(s) == 0 || s->oh <= 0 || s->ow <= 0)
        return 0;
    ws_layout l;
    const size_t fixed = conv_layout(s, bf16, &l);
    size_t allowance = (size_t)s->n * (size_t)s->oh * (size_t)s->ow * conv_k(s) * 4;
    const size_t lo = (size_t)16 << 20, hi = (size_t)256 << 20;
    allowance = allowance < lo ? lo : allowance > hi ? hi : allowance;
    return fixed + allowance;
}

/* conv2d_scratch has no backend: the float layout (a bf16 backend grows the workspace by the
 * bfloat16 copies at a shape's first call). */
size_t mgt_gpu_conv2d_scratch(const mgt_conv_shape *s) {
    return scratch_bytes(s, 0);
}

/* ---- plans ---- */

static void plan_destroy(conv_plan *p) {
    if (p->xd)
        cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd)
        cudnnDestroyTensorDescriptor(p->yd);
    if (p->wd)
        cudnnDestroyFilterDescriptor(p->wd);
    if (p->xdf)
        cudnnDestroyTensorDescriptor(p->xdf);
    if (p->ydf)
        cudnnDestroyTensorDescriptor(p->ydf);
    if (p->wdf)
        cudnnDestroyFilterDescriptor(p->wdf);
    for (int d = 0; d < NDIRS; d++) {
        if (p->cd[d])
            cudnnDestroyConvolutionDescriptor(p->cd[d]);
        free(p->cand[d]);
    }
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
           a->pad_left == b->pad_left && a->oh == b->oh && a->ow == b->ow && a->algo == b->algo;
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
    for (int f = 0; f < 1 + im->bf16; f++) { /* the plan's data type, then (bf16) float */
        const cudnnDataType_t dt = im->bf16 && !f ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
        cudnnTensorDescriptor_t *xd = f ? &p->xdf : &p->xd, *yd = f ? &p->ydf : &p->yd;
        cudnnFilterDescriptor_t *wd = f ? &p->wdf : &p->wd;
        GPU_CHECK(CUDNN, cudnnCreateTensorDescriptor(xd));
        GPU_CHECK(CUDNN, cudnnCreateTensorDescriptor(yd));
        GPU_CHECK(CUDNN, cudnnCreateFilterDescriptor(wd));
        GPU_CHECK(CUDNN,
                  cudnnSetTensor4dDescriptor(*xd, CUDNN_TENSOR_NHWC, dt, s->n, s->c, xh, xw));
        GPU_CHECK(CUDNN, cudnnSetTensor4dDescriptor(*yd, CUDNN_TENSOR_NHWC, dt, s->n, s->oc, s->oh,
                                                    s->ow));
        GPU_CHECK(CUDNN, cudnnSetFilter4dDescriptor(*wd, dt, CUDNN_TENSOR_NHWC, s->oc, s->c, s->kh,
                                                    s->kw));
    }
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

/* Whether direction dir runs on bfloat16 data (--precision bf16, unless cuDNN ran no bfloat16
 * algorithm there: then float), and its descriptors. */
static int lowp(const mgt_gpu_impl *im, const conv_plan *p, int dir) {
    return im->bf16 && !p->f32[dir];
}
static cudnnTensorDescriptor_t xdesc(const conv_plan *p, int dir) {
    return p->f32[dir] ? p->xdf : p->xd;
}
static cudnnTensorDescriptor_t ydesc(const conv_plan *p, int dir) {
    return p->f32[dir] ? p->ydf : p->yd;
}
static cudnnFilterDescriptor_t wdesc(const conv_plan *p, int dir) {
    return p->f32[dir] ? p->wdf : p->wd;
}

/* ---- algorithm choice ---- */

/* cuDNN's names, for the log and for messages. */
static const char *const fwd_names[] = {
    "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
    "WINOGRAD",      "WINOGRAD_NONFUSED"};
static const char *const bwd_data_names[] = {"ALGO_0",     "ALGO_1",   "FFT",
                                             "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
static const char *const bwd_filter_names[] = {
    "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
_Static_assert(sizeof fwd_names / sizeof fwd_names[0] == CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
               "one name per forward algorithm");
_Static_assert(sizeof bwd_data_names / sizeof bwd_data_names[0] ==
                   CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
               "one name per backward-data algorithm");
_Static_assert(sizeof bwd_filter_names / sizeof bwd_filter_names[0] ==
                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
               "one name per backward-filter algorithm");

static const char *algo_name(int dir, int algo) {
    const char *const *t = dir == DIR_FWD        ? fwd_names
                           : dir == DIR_BWD_DATA ? bwd_data_names
                                                 : bwd_filter_names;
    const int n = dir == DIR_FWD        ? CUDNN_CONVOLUTION_FWD_ALGO_COUNT
                  : dir == DIR_BWD_DATA ? CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT
                                        : CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
    return algo >= 0 && algo < n ? t[algo] : "(unknown)";
}

/* The transform algorithms: Winograd's and FFT's results are not plain fp32 dot products (the
 * transforms round on their own and can lose several bits on large inputs), so --conv-algo
 * direct leaves both out, as PyTorch's deterministic cuDNN mode would for agreement; "winograd"
 * puts Winograd first. */
static int is_winograd(int dir, int algo) {
    if (dir == DIR_FWD)
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    if (dir == DIR_BWD_DATA)
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD ||
           algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

static int is_fft(int dir, int algo) {
    if (dir == DIR_FWD)
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING;
    if (dir == DIR_BWD_DATA)
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING;
    return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
           algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING;
}

/* The three directions' result structs differ in type only: copy the fields we use. */
#define CANDS(r)                                                                                   \
    for (int i = 0; i < got; i++)                                                                  \
        out[i] = (conv_cand) {                                                                     \
            (int)(r)[i].algo, (r)[i].status, (r)[i].determinism == CUDNN_DETERMINISTIC,            \
                (r)[i].mathType, 0, 0                                                              \
        }

/* cuDNN's heuristics (cudnnGet*Algorithm_v7, which runs nothing), as many entries as the
 * direction has algorithms (cudnnGet*AlgorithmMaxCount), best first. Returns the count; *out is
 * malloc'd. */
static int heuristics(mgt_gpu_impl *im, conv_plan *p, int dir, conv_cand **out_p) {
    cudnnHandle_t h = (cudnnHandle_t)im->cudnn;
    int max = 0, got = 0;
    if (dir == DIR_FWD)
        GPU_CHECK(CUDNN, cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
    else if (dir == DIR_BWD_DATA)
        GPU_CHECK(CUDNN, cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
    else
        GPU_CHECK(CUDNN, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
    if (max < 1)
        max = 1;
    /* one allocation big enough for any direction's result type, then the candidates */
    size_t rsz = sizeof(cudnnConvolutionFwdAlgoPerf_t);
    if (sizeof(cudnnConvolutionBwdDataAlgoPerf_t) > rsz)
        rsz = sizeof(cudnnConvolutionBwdDataAlgoPerf_t);
    if (sizeof(cudnnConvolutionBwdFilterAlgoPerf_t) > rsz)
        rsz = sizeof(cudnnConvolutionBwdFilterAlgoPerf_t);
    void *r = malloc(rsz * (size_t)max);
    conv_cand *out = malloc(sizeof *out * (size_t)max);
    if (!r || !out)
        mgt_die("out of host memory for the convolution algorithm list");
    if (dir == DIR_FWD) {
        GPU_CHECK(CUDNN,
                  cudnnGetConvolutionForwardAlgorithm_v7(h, xdesc(p, dir), wdesc(p, dir),
                                                         p->cd[dir], ydesc(p, dir), max, &got, r));
        CANDS((cudnnConvolutionFwdAlgoPerf_t *)r);
    } else if (dir == DIR_BWD_DATA) {
        GPU_CHECK(CUDNN, cudnnGetConvolutionBackwardDataAlgorithm_v7(h, wdesc(p, dir),
                                                                     ydesc(p, dir), p->cd[dir],
                                                                     xdesc(p, dir), max, &got, r));
        CANDS((cudnnConvolutionBwdDataAlgoPerf_t *)r);
    } else {
        GPU_CHECK(CUDNN,
                  cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                      h, xdesc(p, dir), ydesc(p, dir), p->cd[dir], wdesc(p, dir), max, &got, r));
        CANDS((cudnnConvolutionBwdFilterAlgoPerf_t *)r);
    }
    free(r);
    *out_p = out;
    return got < 0 ? 0 : got > max ? max : got;
}
#undef CANDS

static cudnnStatus_t algo_ws(mgt_gpu_impl *im, conv_plan *p, int dir, int algo, size_t *bytes) {
    cudnnHandle_t h = (cudnnHandle_t)im->cudnn;
    if (dir == DIR_FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(h, xdesc(p, dir), wdesc(p, dir), p->cd[dir],
                                                       ydesc(p, dir),
                                                       (cudnnConvolutionFwdAlgo_t)algo, bytes);
    if (dir == DIR_BWD_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, wdesc(p, dir), ydesc(p, dir), p->cd[dir], xdesc(p, dir),
            (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, xdesc(p, dir), ydesc(p, dir), p->cd[dir], wdesc(p, dir),
        (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
}

static int tensor_op(cudnnMathType_t m) {
    return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

static const char *math_name(cudnnMathType_t m) {
    switch (m) {
    case CUDNN_DEFAULT_MATH:
        return "DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH:
        return "TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
        return "TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH:
        return "FMA_MATH";
    }
    return "(unknown math)";
}

/* The order candidates are tried in: with --conv-algo winograd, Winograd first; then (under
 * --reproducible: deterministic ones only, in cuDNN's order) deterministic ones whose workspace
 * fits, then any that fits, then the rest by workspace
 * (the workspace then grows, once); ties keep cuDNN's ranking. */
static int cand_tier(const conv_cand *c, int dir, mgt_conv_algo want, size_t avail,
                     int deterministic) {
    const int wino_last = want == MGT_CONV_WINOGRAD && !is_winograd(dir, c->algo);
    /* deterministic: cuDNN's ranking alone, whatever fits (the workspace then grows) */
    const int fit = deterministic ? 0 : c->ws <= avail ? (c->deterministic ? 0 : 1) : 2;
    return wino_last * 4 + fit;
}

/* Makes the plan's ordered candidate list for one direction (first use): cuDNN's heuristics,
 * less what this run excludes (a failed entry, tensor-op math without --tf32, transform
 * algorithms under --conv-algo direct, an entry whose workspace query fails), ordered as
 * cand_tier says. Candidates are then tried in that order when the op runs (conv_ran). */
/* --precision bf16 where cuDNN runs no bfloat16 algorithm for a direction of a shape (none
 * offered, or every one refused at execution): that direction runs on float data instead, once
 * said. */
static void to_float(conv_plan *p, int dir) {
    const mgt_conv_shape *s = &p->s;
    mgt_log0("notice: cuDNN runs no bfloat16 %s algorithm for the NHWC convolution n=%d "
             "%dx%dx%d -> %dx%dx%d, kernel %dx%d, stride %d; --precision bf16 runs it in fp32 "
             "there\n",
             dir_name[dir], s->n, s->h, s->w, s->c, s->oh, s->ow, s->oc, s->kh, s->kw, s->stride);
    free(p->cand[dir]);
    p->cand[dir] = NULL;
    p->chosen[dir] = 0;
    p->f32[dir] = 1;
}

static void choose(mgt_backend *be, conv_plan *p, int dir) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const mgt_conv_shape *s = &p->s;
    ws_layout l;
    const size_t fixed = conv_layout(s, im->bf16, &l);
    if (im->ws_bytes < fixed) /* never reserved for this shape: size it now, once */
        mgt_gpu_workspace(be, scratch_bytes(s, im->bf16));
    const size_t avail = im->ws_bytes > fixed ? im->ws_bytes - fixed : 0;
    /* tensor ops: TF32 for float data with --tf32, the bfloat16 path's own math with bf16 */
    const int bf = lowp(im, p, dir), tensor_ok = im->tf32 || bf;
    GPU_CHECK(CUDNN, cudnnSetConvolutionMathType(p->cd[dir], tensor_ok ? CUDNN_TENSOR_OP_MATH
                                                                       : CUDNN_FMA_MATH));
    conv_cand *c = NULL;
    const int n = heuristics(im, p, dir, &c);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].status != CUDNN_STATUS_SUCCESS || (!tensor_ok && tensor_op(c[i].math)))
            continue;
        if (s->algo == MGT_CONV_DIRECT && (is_winograd(dir, c[i].algo) || is_fft(dir, c[i].algo)))
            continue;
        if (im->deterministic && !c[i].deterministic)
            continue;
        c[i].math = tensor_ok ? c[i].math : CUDNN_FMA_MATH;
        if (cudnnSetConvolutionMathType(p->cd[dir], c[i].math) != CUDNN_STATUS_SUCCESS ||
            algo_ws(im, p, dir, c[i].algo, &c[i].ws) != CUDNN_STATUS_SUCCESS)
            continue;
        c[kept++] = c[i];
    }
    /* a stable insertion sort by (tier, workspace in the last tier), so that ties keep cuDNN's
     * ranking: a handful of entries */
    for (int i = 1; i < kept; i++) {
        conv_cand v = c[i];
        const int tv = cand_tier(&v, dir, s->algo, avail, im->deterministic);
        int j = i;
        for (; j > 0; j--) {
            const int tj = cand_tier(&c[j - 1], dir, s->algo, avail, im->deterministic);
            const int before = tv < tj || (tv == tj && (tv % 4) == 2 && v.ws < c[j - 1].ws);
            if (!before)
                break;
            c[j] = c[j - 1];
        }
        c[j] = v;
    }
    if (kept == 0 && bf) {
        free(c);
        to_float(p, dir);
        choose(be, p, dir);
        return;
    }
    if (kept == 0) {
        free(c);
        mgt_die("cuDNN offers no %s%s algorithm for the convolution n=%d %dx%dx%d -> %dx%dx%d, "
                "kernel %dx%d, stride %d (NHWC %s, %s%s); please report this with the model "
                "file",
                im->deterministic ? "deterministic (--reproducible) " : "", dir_name[dir], s->n,
                s->h, s->w, s->c, s->oh, s->ow, s->oc, s->kh, s->kw, s->stride, "float",
                im->tf32 ? "TF32 allowed" : "FMA math",
                s->algo == MGT_CONV_DIRECT ? ", --conv-algo direct: no FFT or Winograd" : "");
    }
    p->cand[dir] = c;
    p->ncand[dir] = kept;
    p->cur[dir] = 0;
    p->chosen[dir] = 1;
}

/* The workspace for plan p in direction dir (candidates made on first use), with the current
 * candidate's math type set on the descriptor. */
static char *plan_ws(mgt_backend *be, conv_plan *p, int dir, ws_layout *l) {
    const size_t fixed = conv_layout(&p->s, mgt_gpu_impl_of(be)->bf16, l);
    if (!p->chosen[dir])
        choose(be, p, dir);
    const conv_cand *c = &p->cand[dir][p->cur[dir]];
    GPU_CHECK(CUDNN, cudnnSetConvolutionMathType(p->cd[dir], c->math));
    return mgt_gpu_workspace(be, fixed + c->ws);
}

static int cur_algo(const conv_plan *p, int dir) {
    return p->cand[dir][p->cur[dir]].algo;
}

static size_t cur_ws(const conv_plan *p, int dir) {
    return p->cand[dir][p->cur[dir]].ws;
}

/* After a convolution call in direction dir: returns 0 when it ran. Until a direction's first
 * success, a candidate cuDNN refuses at execution (a NOT_SUPPORTED status: the heuristics can
 * name an algorithm whose kernel then declines the shape or layout) is recorded and the next
 * candidate is made current: returns 1, and the caller redoes the call (its workspace may have
 * moved). Any other failure, or a refusal once a candidate has run or when none is left, ends the
 * job as GPU_CHECK does. */
static int conv_ran(const mgt_gpu_impl *im, conv_plan *p, int dir, cudnnStatus_t st,
                    const char *call, int line) {
    if (st == CUDNN_STATUS_SUCCESS) {
        const mgt_conv_shape *s = &p->s;
        const int algo = cur_algo(p, dir);
        if (!p->ran[dir] && s->algo == MGT_CONV_WINOGRAD && !is_winograd(dir, algo))
            mgt_log0("notice: cuDNN runs no Winograd %s algorithm for the NHWC float convolution "
                     "%dx%dx%d -> %dx%dx%d, kernel %dx%d, stride %d (cuDNN's Winograd needs NCHW "
                     "float, stride 1 and a 3x3 or 5x5 kernel); --conv-algo winograd uses %s "
                     "there\n",
                     dir_name[dir], s->h, s->w, s->c, s->oh, s->ow, s->oc, s->kh, s->kw, s->stride,
                     algo_name(dir, algo));
        p->ran[dir] = 1;
        return 0;
    }
    const int not_supported = (int)st / 1000 == (int)CUDNN_STATUS_NOT_SUPPORTED / 1000;
    if (!p->ran[dir] && not_supported && p->cur[dir] + 1 >= p->ncand[dir] && lowp(im, p, dir)) {
        to_float(p, dir); /* the last bfloat16 candidate refused: float from now on */
        return 1;
    }
    if (p->ran[dir] || !not_supported || p->cur[dir] + 1 >= p->ncand[dir])
        mgt_gpu_fail(MGT_GPU_CUDNN, (int)st, call, __FILE__, line);
    p->cand[dir][p->cur[dir]].refused = (int)st;
    p->cur[dir]++;
    return 1;
}

/* One line per plan and direction: the algorithm that runs, its math type, workspace and
 * determinism, and what cuDNN refused before it. */
size_t mgt_gpu_conv_describe(mgt_gpu_impl *im, char *buf, size_t n) {
    size_t len = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        const int k_ = snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, __VA_ARGS__);   \
        len += k_ > 0 ? (size_t)k_ : 0;                                                            \
    } while (0)
    if (n > 0)
        buf[0] = '\0';
    const struct mgt_gpu_conv_cache *cc = im->conv;
    for (int i = 0; cc && i < cc->n; i++) {
        const conv_plan *p = &cc->plans[i];
        const mgt_conv_shape *s = &p->s;
        for (int d = 0; d < NDIRS; d++) {
            if (!p->chosen[d])
                continue;
            const conv_cand *c = &p->cand[d][p->cur[d]];
            PUT("cuDNN conv n=%d %dx%dx%d -> %dx%dx%d k=%dx%d s=%d --conv-algo %s, %s: %s, %s, "
                "workspace %zu bytes, %s%s%s",
                s->n, s->h, s->w, s->c, s->oh, s->ow, s->oc, s->kh, s->kw, s->stride,
                want_name[(unsigned)s->algo <= MGT_CONV_WINOGRAD ? s->algo : 0], dir_name[d],
                algo_name(d, c->algo), math_name(c->math), c->ws,
                c->deterministic ? "deterministic" : "non-deterministic",
                lowp(im, p, d) ? ", bfloat16 data"
                : im->bf16     ? ", float data (cuDNN ran no bfloat16 algorithm)"
                               : "",
                p->ran[d] ? "" : " (not run yet)");
            for (int j = 0; j < p->cur[d]; j++)
                PUT("%s%s refused (cuDNN status %d)", j ? ", " : "; before it ",
                    algo_name(d, p->cand[d][j].algo), p->cand[d][j].refused);
            PUT("\n");
        }
    }
#undef PUT
    return len;
}

/* ---- ops ---- */

/* Elements of the input as cuDNN sees it (padded when the plan pads explicitly). */
static size_t bf16_x_count(const conv_plan *p) {
    const mgt_conv_shape *s = &p->s;
    return (size_t)s->n * (size_t)(p->padded ? p->hp : s->h) * (size_t)(p->padded ? p->wp : s->w) *
           (size_t)s->c;
}

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
    const float one = 1.0f;
    cudnnStatus_t st;
    do { /* again with the next candidate while cuDNN refuses one at its first use */
        ws_layout l;
        char *ws = plan_ws(be, p, DIR_FWD, &l);
        const float *wk = w, *xin = x;
        if (p->transpose) { /* per filter: [c][kh*kw] -> [kh*kw][c] */
            mgt_k_transpose(im->stream, (size_t)s->oc, (size_t)s->c, (size_t)s->kh * s->kw, w,
                            (float *)(ws + l.w_t));
            wk = (const float *)(ws + l.w_t);
        }
        if (p->padded) {
            mgt_k_pad_nhwc(im->stream, s->n, s->h, s->w, s->c, p->hp, p->wp, s->pad_top,
                           s->pad_left, x, (float *)(ws + l.pad));
            xin = (const float *)(ws + l.pad);
        }
        const void *xa = xin, *wa = wk;
        void *ya = y;
        float beta = 0.0f;
        const int bf = lowp(im, p, DIR_FWD); /* as chosen for this try */
        if (bf) { /* bfloat16 copies; the bias is added as y is widened */
            mgt_k_to_bf16(im->stream, (size_t)s->oc * conv_k(s), wk, (uint16_t *)(ws + l.wb));
            mgt_k_to_bf16(im->stream, bf16_x_count(p), xin, (uint16_t *)(ws + l.xb));
            xa = ws + l.xb;
            wa = ws + l.wb;
            ya = ws + l.yb;
        } else if (b) { /* the bias first, the convolution adds onto it (as the CPU backend does) */
            mgt_k_fill_rows(im->stream, rows, s->oc, b, y);
            beta = 1.0f;
        }
        st = cudnnConvolutionForward((cudnnHandle_t)im->cudnn, &one, xdesc(p, DIR_FWD), xa,
                                     wdesc(p, DIR_FWD), wa, p->cd[DIR_FWD],
                                     (cudnnConvolutionFwdAlgo_t)cur_algo(p, DIR_FWD), ws + l.algo,
                                     cur_ws(p, DIR_FWD), &beta, ydesc(p, DIR_FWD), ya);
        if (st == CUDNN_STATUS_SUCCESS && bf)
            mgt_k_from_bf16(im->stream, rows, s->oc, (const uint16_t *)ya, b, y);
    } while (conv_ran(im, p, DIR_FWD, st, "cudnnConvolutionForward", __LINE__));
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
    const char *dyb = NULL; /* where dy's bfloat16 copy was made (the passes share it) */
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t cs;
    if (dw)
        do {
            ws_layout l;
            char *ws = plan_ws(be, p, DIR_BWD_FILTER, &l);
            const float *xin = x;
            if (p->padded) {
                mgt_k_pad_nhwc(st, s->n, s->h, s->w, s->c, p->hp, p->wp, s->pad_top, s->pad_left, x,
                               (float *)(ws + l.pad));
                xin = (const float *)(ws + l.pad);
            }
            float *dwk = p->transpose ? (float *)(ws + l.dw_t) : dw;
            const void *xa = xin, *dya = dy;
            void *dwa = dwk;
            const int bf = lowp(im, p, DIR_BWD_FILTER);
            if (bf) { /* bfloat16 copies; cuDNN's bfloat16 dW is widened into dwk */
                mgt_k_to_bf16(st, bf16_x_count(p), xin, (uint16_t *)(ws + l.xb));
                if (dyb != ws + l.yb) /* once for both passes, unless the workspace moved */
                    mgt_k_to_bf16(st, rows * (size_t)oc, dy, (uint16_t *)(ws + l.yb));
                dyb = ws + l.yb;
                xa = ws + l.xb;
                dya = ws + l.yb;
                dwa = ws + l.wb;
            }
            cs = cudnnConvolutionBackwardFilter(
                h, &one, xdesc(p, DIR_BWD_FILTER), xa, ydesc(p, DIR_BWD_FILTER), dya,
                p->cd[DIR_BWD_FILTER], (cudnnConvolutionBwdFilterAlgo_t)cur_algo(p, DIR_BWD_FILTER),
                ws + l.algo, cur_ws(p, DIR_BWD_FILTER), &zero, wdesc(p, DIR_BWD_FILTER), dwa);
            if (cs == CUDNN_STATUS_SUCCESS && bf)
                mgt_k_from_bf16(st, (size_t)oc * K, 1, (const uint16_t *)dwa, NULL, dwk);
            if (cs == CUDNN_STATUS_SUCCESS && p->transpose) /* [kh*kw][c] -> [c][kh*kw] */
                mgt_k_transpose(st, (size_t)oc, (size_t)s->kh * s->kw, (size_t)s->c, dwk, dw);
        } while (conv_ran(im, p, DIR_BWD_FILTER, cs, "cudnnConvolutionBackwardFilter", __LINE__));
    if (dx)
        do {
            ws_layout l;
            char *ws = plan_ws(be, p, DIR_BWD_DATA, &l);
            const float *wk = w;
            if (p->transpose) {
                mgt_k_transpose(st, (size_t)oc, (size_t)s->c, (size_t)s->kh * s->kw, w,
                                (float *)(ws + l.w_t));
                wk = (const float *)(ws + l.w_t);
            }
            /* the padded gradient reuses the padded input's place: dW is done with it */
            float *dxo = p->padded ? (float *)(ws + l.pad) : dx;
            const void *wa = wk, *dya = dy;
            void *dxa = dxo;
            const int bf = lowp(im, p, DIR_BWD_DATA);
            if (bf) { /* bfloat16 copies; cuDNN's bfloat16 dx is widened into dxo */
                mgt_k_to_bf16(st, (size_t)oc * K, wk, (uint16_t *)(ws + l.wb));
                if (dyb != ws + l.yb) /* once for both passes, unless the workspace moved */
                    mgt_k_to_bf16(st, rows * (size_t)oc, dy, (uint16_t *)(ws + l.yb));
                dyb = ws + l.yb;
                wa = ws + l.wb;
                dya = ws + l.yb;
                dxa = ws + l.xb;
            }
            cs = cudnnConvolutionBackwardData(
                h, &one, wdesc(p, DIR_BWD_DATA), wa, ydesc(p, DIR_BWD_DATA), dya,
                p->cd[DIR_BWD_DATA], (cudnnConvolutionBwdDataAlgo_t)cur_algo(p, DIR_BWD_DATA),
                ws + l.algo, cur_ws(p, DIR_BWD_DATA), &zero, xdesc(p, DIR_BWD_DATA), dxa);
            if (cs == CUDNN_STATUS_SUCCESS && bf)
                mgt_k_from_bf16(st, bf16_x_count(p), 1, (const uint16_t *)dxa, NULL, dxo);
            if (cs == CUDNN_STATUS_SUCCESS && p->padded)
                mgt_k_crop_nhwc(st, s->n, s->h, s->w, s->c, p->hp, p->wp, s->pad_top, s->pad_left,
                                dxo, dx);
        } while (conv_ran(im, p, DIR_BWD_DATA, cs, "cudnnConvolutionBackwardData", __LINE__));
}
