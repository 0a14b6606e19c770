/* gpu_conv.c: 2-D convolution on cuDNN's descriptor ("classic") API, NHWC float activations.
 *
 * Layouts. Activations stay NHWC, as everywhere in mgtrain. The filter is given to cuDNN in NHWC
 * ("KRSC", [oc][kh][kw][c]) too, the format cuDNN pairs with NHWC activations (as PyTorch's
 * channels_last does): a copy of the OIHW weights kept in that layout (and type) and made up to
 * date once after each update (gpu_weights.c), not at each call; cuDNN's dW comes out KRSC into
 * the workspace and is brought back (transposed, widened, its padded channels left out) in one
 * pass. When c == 1 or kh*kw == 1 the two layouts are the same bytes: a float run then gives
 * cuDNN the weights and dW themselves. Plain float (no TF32,
 * no bf16, not --reproducible) may also run NCHW, where cuDNN has far more algorithms (Winograd,
 * FFT, ...): the activations are then copied to NCHW in the workspace and the output back (the
 * bias added after), and the filter is the weights' own OIHW. Which layout a direction runs is
 * measured, the copies' time included (below).
 *
 * Channels. cuDNN's tensor-core kernels for NHWC data want the channels in whole 16-byte vectors
 * (8 bfloat16 or 4 floats); with fewer, as a network's first convolution has (3 colours, or one
 * grey channel), cuDNN 9 runs CUDA-core kernels (seen on an H100: DEFAULT_MATH for 1, 2, 3 and 5
 * channels in bfloat16), far slower on the largest images of the network. With tensor-op math
 * (bfloat16, or TF32), a plan whose c is not such a multiple gives cuDNN cp channels, c rounded up
 * to it: x copied into the workspace with zero channels after its own, the filter's copy with zero
 * weights there, the padded part of dx and dW left out. The extra products are exact zeros: the
 * results are the unpadded convolution's.
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
 * and says so where none runs. Then, in order: deterministic algorithms whose workspace fits,
 * any that fits, the rest by workspace (which then grows, once). Under --reproducible that list,
 * deterministic algorithms only, is the choice: it depends on the shape alone. Otherwise, at the
 * same first call, cuDNN measures every algorithm it has for the shape on the call's own operands
 * and the reserved workspace (cudnnFind*AlgorithmEx, as PyTorch's cudnn.benchmark), in NHWC and,
 * for plain float, in NCHW (the copies' time added), and the candidates become what ran, fastest
 * first (measure()): any algorithm, deterministic or not. --algo-cache FILE keeps these choices
 * per GPU model, cuDNN version, data type and shape, for the next run (mgt_gpu_algo_cache).
 * The _v7 heuristics can rank first an algorithm whose kernel then refuses the shape at
 * execution (NOT_SUPPORTED), and a cached choice may no longer run, so the candidates are tried
 * in order until one runs; the one that ran is final. --profile prints the log
 * (mgt_gpu_conv_describe): algorithm, math type, layout, workspace, how it was chosen, its
 * determinism and measured time, and what was refused.
 *
 * Workspace. conv2d_scratch() has no backend (it is a pure function of the shape, called while
 * the model is built), so it cannot ask cuDNN. It returns the exact bytes of the transposed
 * filters and the padded input, plus an allowance for cuDNN's own workspace: the size of the
 * im2col matrix (the most any GEMM-like algorithm needs), clamped to [16 MiB, 256 MiB]. reserve()
 * allocates that once; the algorithm choice is then limited to what fits, so the step loop does
 * not allocate. Only if reserve() was never called with enough (a test calling the op directly),
 * or a shape's first call needs room for bfloat16 or NCHW copies, does that first call grow the
 * workspace itself.
 *
 * --precision bf16. Activations are bfloat16 there (backend.h): x, y, dy and dx come and go in
 * bfloat16, and the descriptors are bfloat16 with float compute (cuDNN's PSEUDO_BFLOAT16_CONFIG:
 * x, w and y bfloat16, accumulation in float, each output rounded once to bfloat16), with
 * tensor-op math; such a run is never NCHW. Only the weights are float: their kept copy is
 * bfloat16 (rounded once per update, gpu_weights.c), and cuDNN's bfloat16 dW is widened back to
 * float as it is transposed; the explicit padding and the crop move bfloat16 values. A direction of
 * a shape for which cuDNN offers no bfloat16 algorithm, or refuses every one it offered, runs on
 * float descriptors instead (the plan keeps both sets), with a notice, and the log says so: its
 * bfloat16 inputs are widened into float copies in the workspace and its outputs rounded back.
 *
 * This is the one file that calls the deprecated-marked classic API (silenced just here). Its
 * helper kernels (filter layouts, padding, cropping, bias rows, bias gradients) are the layout,
 * dense and reduce families'; the weights' copies are gpu_weights.c's. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

#include <cudnn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu.h"
#include "gpu_internal.h"
#include "runtime.h"
#include "tensor_io.h"

/* The three directions a plan chooses an algorithm for. */
enum { DIR_FWD = 0, DIR_BWD_DATA = 1, DIR_BWD_FILTER = 2, NDIRS };

/* One candidate algorithm: its math type as it will run, its workspace, the status of its call
 * if cuDNN refused it at execution, its layout, and the time measured for it. */
typedef struct conv_cand {
    int algo;
    cudnnStatus_t status;
    int deterministic;
    cudnnMathType_t math;
    size_t ws;
    int refused;
    int nchw;   /* runs on NCHW copies of the activations (float only: see "Layouts" above) */
    float ms;   /* measured (cudnnFind*AlgorithmEx, with the NCHW copies), or < 0: not measured */
    int cached; /* taken from the --algo-cache file (measured by an earlier run) */
    int from_n; /* > 0: measured for this shape at that batch size (from_sibling) */
    int shared; /* measured by the rank of this GPU that measures (mgt_gpu_share_measurements) */
} conv_cand;

typedef struct conv_plan {
    mgt_conv_shape s; /* the key */
    int padded;       /* explicit zero padding (asymmetric "same") */
    int hp, wp;       /* the padded input's height and width (padded only) */
    int transpose;    /* OIHW <-> KRSC transposes needed (c > 1 and kh*kw > 1) */
    int cp;           /* input channels as cuDNN sees them: c, or c padded (see "Channels") */
    int chpad;        /* cp > c: x copied with zero channels, the filter's copy padded too */
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
    /* Measured choice (not --reproducible): whether the candidates are measured ones (by
     * cudnnFind*AlgorithmEx, or from the --algo-cache file); with plain float (no TF32, no
     * bf16) NCHW descriptors too (the filter's NCHW is the weights' own OIHW), and room in the
     * workspace for NCHW copies of x (or dx) and y (or dy). */
    int measured[NDIRS];
    int nchw_ok;
    cudnnTensorDescriptor_t xdn, ydn;
    cudnnFilterDescriptor_t wdn;
} conv_plan;

static const char *const dir_name[] = {
    [DIR_FWD] = "forward", [DIR_BWD_DATA] = "backward-data", [DIR_BWD_FILTER] = "backward-filter"};
_Static_assert(sizeof dir_name / sizeof dir_name[0] == NDIRS, "one name per direction");
static const char *const want_name[] = {
    [MGT_CONV_AUTO] = "auto", [MGT_CONV_DIRECT] = "direct", [MGT_CONV_WINOGRAD] = "winograd"};
_Static_assert(sizeof want_name / sizeof want_name[0] == MGT_CONV_WINOGRAD + 1,
               "one name per --conv-algo value");

/* A measured choice, as the --algo-cache file keeps it: on which GPU and cuDNN, for which data
 * type and shape (key), in which direction, what ran, and how fast. */
typedef struct algo_entry {
    char key[320];
    int dir, algo, nchw;
    cudnnMathType_t math;
    float ms;
} algo_entry;

struct mgt_gpu_conv_cache {
    conv_plan *plans;
    int n, cap;
    /* --algo-cache: the file, its entries (with this run's measurements), and whether this run
     * added any; this GPU's name and cuDNN's version, for the keys. */
    char *path;
    algo_entry *known;
    int nknown, known_cap, added;
    char gpu[128];
    size_t cudnn;
    cudaEvent_t ev[4]; /* timing the NCHW copies while measuring (made at first use) */
    /* Several ranks on this GPU (mgt_gpu_share_measurements): their communicator, this rank in
     * it (0 measures), and the job's transport, whose watchdog times the exchange. */
    MPI_Comm share;
    int share_rank, share_size;
    mgt_comm *share_watch;
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

/* The input channels cuDNN is given (see "Channels" at the top): with tensor-op math (bfloat16,
 * or TF32), c padded to a multiple of one 16-byte vector of activations, 8 bfloat16 or 4 floats;
 * else c. */
static int padded_channels(const mgt_conv_shape *s, int bf16, int tf32) {
    const int v = bf16 ? 8 : tf32 ? 4 : 1;
    return (s->c + v - 1) / v * v;
}

typedef struct ws_layout {
    size_t dw_t, pad; /* byte offsets */
    size_t xb, yb;    /* bf16 only: float x or dx, float y or dy */
    size_t xn, yn;    /* NCHW x or dx, y or dy (nchw only) */
    size_t algo;
} ws_layout;

/* [cuDNN's dW in KRSC][x or dx padded (rows and columns, or channels: the activations' type)],
 * with bf16 then [x or dx][y or dy] in float (x and dx padded as above; only where a direction of
 * the plan runs on float data, f32), with nchw then [x or dx][y or dy] in NCHW float, then
 * [cuDNN's workspace]; returns the bytes before cuDNN's part. cp: the channels cuDNN is given.
 * The filter cuDNN reads is not here: it is the weights' kept copy (gpu_weights.c). */
static size_t conv_layout(const mgt_conv_shape *s, int cp, int bf16, int f32, int nchw,
                          ws_layout *l) {
    int padded, hp, wp;
    conv_geometry(s, &padded, &hp, &wp);
    const int chpad = cp != s->c;
    const size_t khkw = (size_t)s->kh * (size_t)s->kw, esize = bf16 ? 2 : 4;
    const size_t dkbytes =
        conv_transposes(s) || chpad || bf16 ? align256((size_t)s->oc * khkw * (size_t)cp * 4) : 0;
    const size_t n = s->n > 0 ? (size_t)s->n : 0;
    const size_t xcount = n * (size_t)(padded ? hp : s->h) * (size_t)(padded ? wp : s->w) * cp;
    const size_t ycount = n * (size_t)s->oh * (size_t)s->ow * (size_t)s->oc;
    const size_t pbytes = padded || chpad ? align256(xcount * esize) : 0;
    const int copies = bf16 && f32;
    l->dw_t = 0;
    l->pad = dkbytes;
    l->xb = l->pad + pbytes;
    l->yb = l->xb + (copies ? align256(xcount * 4) : 0);
    l->xn = l->yb + (copies ? align256(ycount * 4) : 0);
    l->yn = l->xn + (nchw ? align256(xcount * 4) : 0);
    l->algo = l->yn + (nchw ? align256(ycount * 4) : 0);
    return l->algo;
}

/* The workspace a shape needs (see "Workspace" at the top), with conv_layout's copies. */
static size_t scratch_bytes(const mgt_conv_shape *s, int cp, int bf16, int f32, int nchw) {
    if (s->n <= 0 || s->oc <= 0 || conv_k(s) == 0 || s->oh <= 0 || s->ow <= 0)
        return 0;
    ws_layout l;
    const size_t fixed = conv_layout(s, cp, bf16, f32, nchw, &l);
    size_t allowance =
        (size_t)s->n * (size_t)s->oh * (size_t)s->ow * (size_t)cp * (size_t)s->kh * s->kw * 4;
    const size_t lo = (size_t)16 << 20, hi = (size_t)256 << 20;
    allowance = allowance < lo ? lo : allowance > hi ? hi : allowance;
    return fixed + allowance;
}

/* conv2d_scratch has no backend: the float layout (a bf16 backend's differs by its padded
 * channels and by the float copies of a direction run on float data; a float one that may run
 * NCHW by its NCHW copies: each grows the workspace at a shape's first call where needed). */
size_t mgt_gpu_conv2d_scratch(const mgt_conv_shape *s) {
    return scratch_bytes(s, s->c, 0, 0, 0);
}

size_t mgt_gpu_conv_workspace(const mgt_conv_shape *s, int math) {
    if (s->n <= 0 || s->oc <= 0 || conv_k(s) == 0 || s->oh <= 0 || s->ow <= 0)
        return 0;
    const int bf16 = (math & MGT_GPU_BF16) != 0, tf32 = (math & MGT_GPU_TF32) != 0;
    const int nchw = !bf16 && !(math & (MGT_GPU_TF32 | MGT_GPU_DETERMINISTIC));
    return scratch_bytes(s, padded_channels(s, bf16, tf32), bf16, 0, nchw);
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
    if (p->xdn)
        cudnnDestroyTensorDescriptor(p->xdn);
    if (p->ydn)
        cudnnDestroyTensorDescriptor(p->ydn);
    if (p->wdn)
        cudnnDestroyFilterDescriptor(p->wdn);
    for (int d = 0; d < NDIRS; d++) {
        if (p->cd[d])
            cudnnDestroyConvolutionDescriptor(p->cd[d]);
        free(p->cand[d]);
    }
}

static void cache_save(struct mgt_gpu_conv_cache *c);

void mgt_gpu_conv_cache_free(mgt_gpu_impl *im) {
    struct mgt_gpu_conv_cache *c = im->conv;
    if (!c)
        return;
    if (c->path && c->added && mgt_gpu_rank() == 0)
        cache_save(c);
    for (int i = 0; i < c->n; i++)
        plan_destroy(&c->plans[i]);
    for (int k = 0; k < 4; k++)
        if (c->ev[k])
            (void)cudaEventDestroy(c->ev[k]);
    int fin = 1;
    if (c->share_size > 1 && MPI_Finalized(&fin) == MPI_SUCCESS && !fin)
        MPI_Comm_free(&c->share);
    free(c->plans);
    free(c->known);
    free(c->path);
    free(c);
    im->conv = NULL;
}

/* The same shape but perhaps for the batch size. */
static int same_but_n(const mgt_conv_shape *a, const mgt_conv_shape *b) {
    return a->h == b->h && a->w == b->w && a->c == b->c && a->oc == b->oc && a->kh == b->kh &&
           a->kw == b->kw && a->stride == b->stride && a->pad_top == b->pad_top &&
           a->pad_left == b->pad_left && a->oh == b->oh && a->ow == b->ow && a->algo == b->algo;
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
    p->cp = padded_channels(s, im->bf16, im->tf32);
    p->chpad = p->cp != s->c;
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
                  cudnnSetTensor4dDescriptor(*xd, CUDNN_TENSOR_NHWC, dt, s->n, p->cp, xh, xw));
        GPU_CHECK(CUDNN, cudnnSetTensor4dDescriptor(*yd, CUDNN_TENSOR_NHWC, dt, s->n, s->oc, s->oh,
                                                    s->ow));
        GPU_CHECK(CUDNN, cudnnSetFilter4dDescriptor(*wd, dt, CUDNN_TENSOR_NHWC, s->oc, p->cp, s->kh,
                                                    s->kw));
    }
    p->nchw_ok = !im->bf16 && !im->tf32 && !im->deterministic;
    if (p->nchw_ok) {
        GPU_CHECK(CUDNN, cudnnCreateTensorDescriptor(&p->xdn));
        GPU_CHECK(CUDNN, cudnnCreateTensorDescriptor(&p->ydn));
        GPU_CHECK(CUDNN, cudnnCreateFilterDescriptor(&p->wdn));
        GPU_CHECK(CUDNN, cudnnSetTensor4dDescriptor(p->xdn, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                    s->n, s->c, xh, xw));
        GPU_CHECK(CUDNN, cudnnSetTensor4dDescriptor(p->ydn, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                    s->n, s->oc, s->oh, s->ow));
        GPU_CHECK(CUDNN, cudnnSetFilter4dDescriptor(p->wdn, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                    s->oc, s->c, s->kh, s->kw));
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
/* Whether any direction of p runs on float data (its float copies then have room). */
static int any_f32(const conv_plan *p) {
    return p->f32[DIR_FWD] || p->f32[DIR_BWD_DATA] || p->f32[DIR_BWD_FILTER];
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
/* The same for layout nchw (1: the NCHW descriptors, float). */
static cudnnTensorDescriptor_t xdesc_l(const conv_plan *p, int dir, int nchw) {
    return nchw ? p->xdn : xdesc(p, dir);
}
static cudnnTensorDescriptor_t ydesc_l(const conv_plan *p, int dir, int nchw) {
    return nchw ? p->ydn : ydesc(p, dir);
}
static cudnnFilterDescriptor_t wdesc_l(const conv_plan *p, int dir, int nchw) {
    return nchw ? p->wdn : wdesc(p, dir);
}

/* The workspace layout of plan p (the NCHW copies' room where the plan may run NCHW). */
static size_t plan_layout(const mgt_gpu_impl *im, const conv_plan *p, ws_layout *l) {
    return conv_layout(&p->s, p->cp, im->bf16, any_f32(p), p->nchw_ok, l);
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
                (r)[i].mathType, (r)[i].memory, 0, 0, (r)[i].time, 0, 0, 0                         \
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

static cudnnStatus_t algo_ws(mgt_gpu_impl *im, conv_plan *p, int dir, int algo, int nchw,
                             size_t *bytes) {
    cudnnHandle_t h = (cudnnHandle_t)im->cudnn;
    cudnnTensorDescriptor_t xd = xdesc_l(p, dir, nchw), yd = ydesc_l(p, dir, nchw);
    cudnnFilterDescriptor_t wd = wdesc_l(p, dir, nchw);
    if (dir == DIR_FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, p->cd[dir], yd,
                                                       (cudnnConvolutionFwdAlgo_t)algo, bytes);
    if (dir == DIR_BWD_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, wd, yd, p->cd[dir], xd, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, xd, yd, p->cd[dir], wd, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
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
    p->measured[dir] = 0;
    p->f32[dir] = 1;
}

/* ---- measured choice, and the --algo-cache file ---- */

/* The data type a direction runs in, for keys and the log. */
static const char *dtype_name(const mgt_gpu_impl *im, const conv_plan *p, int dir) {
    return lowp(im, p, dir) ? "bf16" : im->tf32 ? "tf32" : "fp32";
}

/* A plan's key in the file: GPU, cuDNN, data type and shape (the direction is a field). */
static void entry_key(const mgt_gpu_impl *im, const conv_plan *p, int dir, char *key, size_t n) {
    const mgt_conv_shape *s = &p->s;
    snprintf(key, n, "%s\tcuDNN %zu\t%s\tn=%d %dx%dx%d -> %dx%dx%d k=%dx%d s=%d pad=%d,%d algo=%s",
             im->conv->gpu, im->conv->cudnn, dtype_name(im, p, dir), s->n, s->h, s->w, p->cp, s->oh,
             s->ow, s->oc, s->kh, s->kw, s->stride, s->pad_top, s->pad_left,
             want_name[(unsigned)s->algo <= MGT_CONV_WINOGRAD ? s->algo : 0]);
}

static algo_entry *find_entry(const mgt_gpu_impl *im, const char *key, int dir) {
    struct mgt_gpu_conv_cache *c = im->conv;
    for (int i = 0; c && i < c->nknown; i++)
        if (c->known[i].dir == dir && !strcmp(c->known[i].key, key))
            return &c->known[i];
    return NULL;
}

static algo_entry *add_entry(mgt_gpu_impl *im, const char *key, int dir) {
    struct mgt_gpu_conv_cache *c = im->conv;
    algo_entry *e = find_entry(im, key, dir);
    if (e)
        return e;
    if (c->nknown == c->known_cap) {
        const int cap = c->known_cap ? 2 * c->known_cap : 64;
        algo_entry *nk = realloc(c->known, sizeof *nk * (size_t)cap);
        if (!nk)
            mgt_die("out of host memory for the convolution algorithm cache");
        c->known = nk;
        c->known_cap = cap;
    }
    e = &c->known[c->nknown++];
    memset(e, 0, sizeof *e);
    snprintf(e->key, sizeof e->key, "%s", key);
    e->dir = dir;
    return e;
}

/* c as the first candidate of p's direction, before the heuristics' (which stay behind it, in
 * case it does not run), its workspace for p's shape; 0 where cuDNN has no such algorithm for
 * it. */
static int prepend(mgt_gpu_impl *im, conv_plan *p, int dir, conv_cand c) {
    if (cudnnSetConvolutionMathType(p->cd[dir], c.math) != CUDNN_STATUS_SUCCESS ||
        algo_ws(im, p, dir, c.algo, c.nchw, &c.ws) != CUDNN_STATUS_SUCCESS)
        return 0;
    conv_cand *all = malloc(sizeof *all * (size_t)(p->ncand[dir] + 1));
    if (!all)
        mgt_die("out of host memory for the convolution algorithm list");
    all[0] = c;
    memcpy(all + 1, p->cand[dir], sizeof *all * (size_t)p->ncand[dir]);
    free(p->cand[dir]);
    p->cand[dir] = all;
    p->ncand[dir]++;
    return 1;
}

/* The cache's choice for a direction, as the first candidate before the heuristics' (which
 * stay behind it, in case it no longer runs); returns whether there was one. */
static int from_cache(mgt_gpu_impl *im, conv_plan *p, int dir) {
    char key[320];
    entry_key(im, p, dir, key, sizeof key);
    const algo_entry *e = find_entry(im, key, dir);
    if (!e || (e->nchw && !p->nchw_ok))
        return 0;
    /* cuDNN documents as non-deterministic backward-data ALGO_0 and backward-filter ALGO_0 and
     * ALGO_3 (their atomic sums) */
    const int det = !((dir == DIR_BWD_DATA && e->algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0) ||
                      (dir == DIR_BWD_FILTER && (e->algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
                                                 e->algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3)));
    conv_cand c = {e->algo, CUDNN_STATUS_SUCCESS, det, e->math, 0, 0, e->nchw, e->ms, 1, 0, 0};
    return prepend(im, p, dir, c);
}

/* An epoch's short last batch, a validation batch of another size: a plan of the same shape at
 * another batch size whose direction has run a measured choice (measured here, by another rank
 * of this GPU, or read from the cache file) gives it first, as from_cache does, the
 * heuristics' order behind it; nothing is measured again in the middle of a run (cuDNN's Find
 * waits for the device, may grow the workspace, and its graphs would go with it). Returns
 * whether there was such a plan. */
static int from_sibling(mgt_gpu_impl *im, conv_plan *p, int dir) {
    const struct mgt_gpu_conv_cache *cc = im->conv;
    for (int i = 0; i < cc->n; i++) {
        const conv_plan *q = &cc->plans[i];
        if (q == p || !q->measured[dir] || !q->ran[dir] || !same_but_n(&q->s, &p->s) ||
            q->f32[dir] != p->f32[dir])
            continue;
        conv_cand c = q->cand[dir][q->cur[dir]];
        if (c.nchw && !p->nchw_ok)
            continue;
        c.from_n = c.from_n ? c.from_n : q->s.n;
        c.refused = 0;
        if (prepend(im, p, dir, c))
            return 1;
    }
    return 0;
}

static void choose(mgt_backend *be, conv_plan *p, int dir) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const mgt_conv_shape *s = &p->s;
    ws_layout l;
    const size_t fixed = plan_layout(im, p, &l);
    if (im->ws_bytes < fixed) /* never reserved for this shape: size it now, once */
        mgt_gpu_workspace(be, scratch_bytes(s, p->cp, im->bf16, any_f32(p), p->nchw_ok));
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
            algo_ws(im, p, dir, c[i].algo, 0, &c[i].ws) != CUDNN_STATUS_SUCCESS)
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
    for (int i = 0; i < kept; i++)
        c[i].ms = -1; /* the heuristics' times are estimates */
    p->cand[dir] = c;
    p->ncand[dir] = kept;
    p->cur[dir] = 0;
    p->chosen[dir] = 1;
    /* outside --reproducible the candidates are measured at the first call, unless a cache
     * file has this shape's choice, or the shape ran at another batch size */
    p->measured[dir] = im->deterministic || from_cache(im, p, dir) || from_sibling(im, p, dir);
}

/* The workspace for plan p in direction dir (candidates made on first use), with the current
 * candidate's math type set on the descriptor. */
static char *plan_ws(mgt_backend *be, conv_plan *p, int dir, ws_layout *l) {
    if (!p->chosen[dir])
        choose(be, p, dir);
    const size_t fixed = plan_layout(mgt_gpu_impl_of(be), p, l); /* choose may go to float */
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

/* After a convolution call in direction dir: returns 0 when it ran (or was to be recorded into
 * a stream capture that CUDA has invalidated: gpu_internal.h's GPU_CHECK_ON). Until a direction's
 * first success, a candidate cuDNN refuses at execution (a NOT_SUPPORTED status: the heuristics can
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
            mgt_log0("notice: cuDNN runs no Winograd %s algorithm for the convolution %dx%dx%d "
                     "-> %dx%dx%d, kernel %dx%d, stride %d in this run's layouts and arithmetic "
                     "(cuDNN's Winograd needs NCHW float, which plain FP32 runs may use, stride 1 "
                     "and a 3x3 or 5x5 kernel); --conv-algo winograd uses %s there\n",
                     dir_name[dir], s->h, s->w, s->c, s->oh, s->ow, s->oc, s->kh, s->kw, s->stride,
                     algo_name(dir, algo));
        p->ran[dir] = 1;
        return 0;
    }
    /* a capture CUDA invalidated (a call inside cuDNN it could not hold, or one before): the
     * capture's failure, which capture_end reports; nothing is learnt of the candidate */
    if (mgt_gpu_capture_lost(im->stream))
        return 0;
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
            char layout[64], how[64];
            snprintf(how, sizeof how, "as measured at n=%d", c->from_n);
            if (p->chpad && !c->nchw)
                snprintf(layout, sizeof layout, "NHWC with %d channels padded to %d", s->c, p->cp);
            else
                snprintf(layout, sizeof layout, "%s", c->nchw ? "NCHW" : "NHWC");
            PUT("cuDNN conv n=%d %dx%dx%d -> %dx%dx%d k=%dx%d s=%d --conv-algo %s, %s: %s, %s, "
                "%s, workspace %zu bytes, %s, %s%s%s",
                s->n, s->h, s->w, s->c, s->oh, s->ow, s->oc, s->kh, s->kw, s->stride,
                want_name[(unsigned)s->algo <= MGT_CONV_WINOGRAD ? s->algo : 0], dir_name[d],
                algo_name(d, c->algo), math_name(c->math), layout, c->ws,
                !p->measured[d] || im->deterministic ? "by cuDNN's heuristics"
                : c->from_n                          ? how
                : c->cached                          ? "from the --algo-cache file"
                : c->ms < 0                          ? "cuDNN's heuristics (nothing measured ran)"
                : c->shared ? "measured by the rank of this GPU that measures"
                            : "measured",
                c->deterministic ? "deterministic" : "non-deterministic",
                lowp(im, p, d) ? ", bfloat16 data"
                : im->bf16     ? ", float data (cuDNN ran no bfloat16 algorithm)"
                               : "",
                p->ran[d] ? "" : " (not run yet)");
            for (int j = 0; j < p->cur[d]; j++)
                PUT("%s%s refused (cuDNN status %d)", j ? ", " : "; before it ",
                    algo_name(d, p->cand[d][j].algo), p->cand[d][j].refused);
            if (p->measured[d] && !im->deterministic && c->ms >= 0)
                PUT("; %.4f ms", (double)c->ms);
            PUT("\n");
        }
    }
#undef PUT
    return len;
}

size_t mgt_gpu_conv_describe_shape(mgt_backend *be, const mgt_conv_shape *s, char *buf, size_t n) {
    static const char *const dir_short[] = {"fwd", "bwd-data", "bwd-filter"};
    const mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const struct mgt_gpu_conv_cache *cc = im->conv;
    size_t len = 0;
    if (n > 0)
        buf[0] = '\0';
    for (int i = 0; cc && i < cc->n; i++) {
        const conv_plan *p = &cc->plans[i];
        if (!same_shape(&p->s, s))
            continue;
        for (int d = 0; d < NDIRS; d++) {
            if (!p->chosen[d])
                continue;
            const conv_cand *c = &p->cand[d][p->cur[d]];
            const int k =
                snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "%s%s %s%s%s",
                         len ? ", " : "", dir_short[d], algo_name(d, c->algo),
                         tensor_op(c->math) ? " (tensor cores)" : "", c->nchw ? " NCHW" : "");
            len += k > 0 ? (size_t)k : 0;
        }
        break;
    }
    return len;
}

/* ---- the --algo-cache file ----
 * Text, one measured choice a line, tab-separated: GPU name, "cuDNN <version>", data type
 * (fp32, tf32, bf16), shape, direction, algorithm, math type, layout (NHWC, NCHW), and the time
 * measured in ms; '#' starts a comment. A line is used only by a run on the same GPU model and
 * cuDNN version with the same data type and shape; lines for others are kept. Rank 0 writes the
 * file at the end of a run that measured something new, whole or not at all. */

static int field_index(const char *const *names, int n, const char *v) {
    for (int i = 0; i < n; i++)
        if (names[i] && !strcmp(names[i], v))
            return i;
    return -1;
}

static const char *const math_names[] = {[CUDNN_DEFAULT_MATH] = "DEFAULT_MATH",
                                         [CUDNN_TENSOR_OP_MATH] = "TENSOR_OP_MATH",
                                         [CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION] =
                                             "TENSOR_OP_MATH_ALLOW_CONVERSION",
                                         [CUDNN_FMA_MATH] = "FMA_MATH"};

/* One line (without its newline) into an entry; -1 with what is wrong in err. */
static int cache_parse(char *line, algo_entry *e, mgt_err *err) {
    char *f[9];
    int nf = 0;
    for (char *q = line; nf < 9; nf++) {
        f[nf] = q;
        char *tab = strchr(q, '\t');
        if (!tab) {
            nf++;
            break;
        }
        *tab = '\0';
        q = tab + 1;
    }
    if (nf != 9)
        return mgt_errf(err, "%d tab-separated fields where 9 are written", nf);
    const int dir = field_index(dir_name, NDIRS, f[4]);
    if (dir < 0)
        return mgt_errf(err, "unknown direction '%.40s'", f[4]);
    const char *const *names = dir == DIR_FWD        ? fwd_names
                               : dir == DIR_BWD_DATA ? bwd_data_names
                                                     : bwd_filter_names;
    const int nalgo = dir == DIR_FWD        ? CUDNN_CONVOLUTION_FWD_ALGO_COUNT
                      : dir == DIR_BWD_DATA ? CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT
                                            : CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
    const int algo = field_index(names, nalgo, f[5]);
    const int math = field_index(math_names, (int)(sizeof math_names / sizeof *math_names), f[6]);
    const int nchw = !strcmp(f[7], "NCHW") ? 1 : !strcmp(f[7], "NHWC") ? 0 : -1;
    char *end;
    const double ms = strtod(f[8], &end);
    if (algo < 0 || math < 0 || nchw < 0 || end == f[8] || *end)
        return mgt_errf(err,
                        "unknown algorithm, math type, layout or time ('%.40s', '%.40s', "
                        "'%.10s', '%.20s')",
                        f[5], f[6], f[7], f[8]);
    const int k = snprintf(e->key, sizeof e->key, "%s\t%s\t%s\t%s", f[0], f[1], f[2], f[3]);
    if (k < 0 || (size_t)k >= sizeof e->key)
        return mgt_errf(err, "a key longer than %zu bytes", sizeof e->key - 1);
    e->dir = dir;
    e->algo = algo;
    e->math = (cudnnMathType_t)math;
    e->nchw = nchw;
    e->ms = (float)ms;
    return 0;
}

int mgt_gpu_algo_cache(mgt_backend *be, const char *path, mgt_err *err) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!im->conv && !(im->conv = calloc(1, sizeof *im->conv)))
        return mgt_errf(err, "out of host memory for the convolution plans");
    struct mgt_gpu_conv_cache *c = im->conv;
    struct cudaDeviceProp prop;
    GPU_CHECK(CUDA, cudaGetDeviceProperties(&prop, im->device));
    snprintf(c->gpu, sizeof c->gpu, "%.127s", prop.name);
    for (char *q = c->gpu; *q; q++) /* a name is one field */
        if (*q == '\t' || *q == '\n')
            *q = ' ';
    c->cudnn = cudnnGetVersion();
    free(c->path);
    if (!(c->path = strdup(path)))
        return mgt_errf(err, "out of host memory");
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 0; /* written at the end of this run */
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        const size_t len = strlen(line);
        if (len && line[len - 1] == '\n')
            line[len - 1] = '\0';
        else if (!feof(fp)) {
            fclose(fp);
            return mgt_errf(err,
                            "--algo-cache %s: line %d is longer than %zu bytes: not a file "
                            "mgtrain wrote; delete it, or name another file",
                            path, lineno, sizeof line - 2);
        }
        if (!line[0] || line[0] == '#')
            continue;
        algo_entry e;
        mgt_err why;
        if (cache_parse(line, &e, &why) < 0) {
            fclose(fp);
            return mgt_errf(err,
                            "--algo-cache %s: line %d: %s: not a file mgtrain wrote; "
                            "delete it, or name another file",
                            path, lineno, why.msg);
        }
        *add_entry(im, e.key, e.dir) = e;
    }
    fclose(fp);
    return 0;
}

static void cache_save(struct mgt_gpu_conv_cache *c) {
    size_t cap = 256 + (size_t)c->nknown * 512, len = 0;
    char *text = malloc(cap);
    if (!text)
        return;
    len += (size_t)snprintf(text, cap,
                            "# mgtrain --algo-cache: convolution algorithms measured by cuDNN "
                            "(cudnnFind*AlgorithmEx)\n# gpu\tcudnn\tdtype\tshape\tdirection"
                            "\talgorithm\tmath\tlayout\tms\n");
    for (int i = 0; i < c->nknown && len < cap; i++) {
        const algo_entry *e = &c->known[i];
        len += (size_t)snprintf(text + len, cap - len, "%s\t%s\t%s\t%s\t%s\t%.4f\n", e->key,
                                dir_name[e->dir], algo_name(e->dir, e->algo), math_name(e->math),
                                e->nchw ? "NCHW" : "NHWC", (double)e->ms);
    }
    mgt_err err;
    if (len >= cap || mgt_atomic_write(c->path, text, len, &err) < 0)
        fprintf(stderr, "warning: the measured convolution algorithms were not saved to %s: %s\n",
                c->path, len >= cap ? "too many entries" : err.msg);
    free(text);
}

/* ---- ops ---- */

/* Elements of the input as cuDNN sees it (padded when the plan pads explicitly, with its cp
 * channels). */
static size_t conv_x_count(const conv_plan *p) {
    const mgt_conv_shape *s = &p->s;
    return (size_t)s->n * (size_t)(p->padded ? p->hp : s->h) * (size_t)(p->padded ? p->wp : s->w) *
           (size_t)p->cp;
}

/* The bytes of an activation value (bfloat16 with --precision bf16). */
static size_t act_size(const mgt_gpu_impl *im) {
    return im->bf16 ? 2 : 4;
}

/* x as cuDNN takes it: as it is, or zero-padded into the workspace (rows and columns cuDNN
 * cannot pad, channels up to cp; the activations' type). */
static const void *conv_input(mgt_gpu_impl *im, const conv_plan *p, const float *x, char *ws,
                              const ws_layout *l) {
    const mgt_conv_shape *s = &p->s;
    if (!p->padded && !p->chpad)
        return x;
    mgt_k_pad_nhwc(im->stream, act_size(im), s->n, s->h, s->w, s->c, p->cp,
                   p->padded ? p->hp : s->h, p->padded ? p->wp : s->w, p->padded ? s->pad_top : 0,
                   p->padded ? s->pad_left : 0, x, ws + l->pad);
    return ws + l->pad;
}

/* The filter cuDNN reads in direction dir, layout nchw: the weights themselves where they are
 * already its layout and type (OIHW for NCHW; for NHWC float, where KRSC is the same bytes and no
 * channel is padded), else their kept copy (gpu_weights.c: KRSC, bfloat16 for a bfloat16
 * direction, the channels padded to cp). */
static const void *filter(mgt_backend *be, const conv_plan *p, int dir, int nchw, const float *w) {
    const int bf = lowp(mgt_gpu_impl_of(be), p, dir);
    if (nchw || (!p->transpose && !p->chpad && !bf))
        return w;
    const mgt_conv_shape *s = &p->s;
    return mgt_gpu_weights_copy(be, w, s->oc, s->c, p->cp, s->kh * s->kw, bf);
}

/* Whether cuDNN's filter gradient in direction-layout (bf, nchw) is not yet dW itself: KRSC,
 * padded or bfloat16, brought back by mgt_k_filter_from_krsc. */
static int dw_converted(const conv_plan *p, int bf, int nchw) {
    return !nchw && (p->transpose || p->chpad || bf);
}

/* A direction of a bf16 backend run on float data: bfloat16 activation values widened into the
 * workspace's float copy at dst. */
static const float *widened(mgt_gpu_impl *im, const void *src, size_t count, char *dst) {
    mgt_k_from_bf16(im->stream, count, 1, (const uint16_t *)src, NULL, (float *)dst);
    return (const float *)dst;
}

/* What a convolution op was given (x, y, dy, dx of the activations' type), and where dy's float
 * copy is once one of the two backward passes run on float data by a bf16 backend has made it
 * (the other reuses it, unless the workspace moved in between). */
typedef struct conv_io {
    const float *x, *w, *b, *dy;
    float *y, *dx, *dw;
    const char *dyf;
} conv_io;

/* A measurement in progress (cudnnFind*AlgorithmEx over one layout): what it found, and the
 * time of the NCHW copies around the call (timed with the cache's events). */
typedef struct conv_find {
    conv_cand *c;
    int n, max;
    size_t avail; /* workspace given to cuDNN */
    double copies_ms;
} conv_find;

/* The workspace while measuring: the fixed part, and what is left of the reserve for cuDNN. */
static char *find_ws(mgt_backend *be, conv_plan *p, ws_layout *l, size_t *avail) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const size_t fixed = plan_layout(im, p, l);
    char *ws = mgt_gpu_workspace(be, fixed);
    *avail = im->ws_bytes - fixed;
    return ws;
}

/* Event k of the copies' timing, on the compute stream (made at first use). */
static void copies_mark(mgt_gpu_impl *im, int k) {
    cudaEvent_t *ev = im->conv->ev;
    if (!ev[k])
        GPU_CHECK(CUDA, cudaEventCreate(&ev[k]));
    GPU_CHECK(CUDA, cudaEventRecord(ev[k], im->stream));
}

/* Milliseconds between copies marks 0 and 1 plus those between 2 and 3 (waiting for 3). */
static double copies_ms(mgt_gpu_impl *im) {
    cudaEvent_t *ev = im->conv->ev;
    mgt_gpu_wait_event(im, ev[3]);
    float a = 0, b = 0;
    GPU_CHECK(CUDA, cudaEventElapsedTime(&a, ev[0], ev[1]));
    GPU_CHECK(CUDA, cudaEventElapsedTime(&b, ev[2], ev[3]));
    return (double)a + (double)b;
}

/* The three directions' Find results differ in type only: keep the fields we use. */
#define FOUND(r)                                                                                   \
    for (int i = 0; i < got && f->n < f->max; i++)                                                 \
        f->c[f->n++] = (conv_cand) {                                                               \
            (int)(r)[i].algo, (r)[i].status, (r)[i].determinism == CUDNN_DETERMINISTIC,            \
                (r)[i].mathType, (r)[i].memory, 0, nchw, (r)[i].time, 0, 0, 0                      \
        }

/* cudnnFind*AlgorithmEx in direction dir on prepared operands (in1, in2, out in the order of
 * the direction's compute call), layout nchw; appends what it found to f. */
static cudnnStatus_t find_call(mgt_gpu_impl *im, conv_plan *p, int dir, int nchw, const void *in1,
                               const void *in2, void *out, char *ws, conv_find *f) {
    cudnnHandle_t h = (cudnnHandle_t)im->cudnn;
    cudnnTensorDescriptor_t xd = xdesc_l(p, dir, nchw), yd = ydesc_l(p, dir, nchw);
    cudnnFilterDescriptor_t wd = wdesc_l(p, dir, nchw);
    enum { MAXALG = 16 };
    union {
        cudnnConvolutionFwdAlgoPerf_t fwd[MAXALG];
        cudnnConvolutionBwdDataAlgoPerf_t data[MAXALG];
        cudnnConvolutionBwdFilterAlgoPerf_t filter[MAXALG];
    } r;
    int got = 0;
    cudnnStatus_t st;
    if (dir == DIR_FWD) {
        st = cudnnFindConvolutionForwardAlgorithmEx(h, xd, in1, wd, in2, p->cd[dir], yd, out,
                                                    MAXALG, &got, r.fwd, ws, f->avail);
        if (st == CUDNN_STATUS_SUCCESS)
            FOUND(r.fwd);
    } else if (dir == DIR_BWD_DATA) {
        st = cudnnFindConvolutionBackwardDataAlgorithmEx(h, wd, in1, yd, in2, p->cd[dir], xd, out,
                                                         MAXALG, &got, r.data, ws, f->avail);
        if (st == CUDNN_STATUS_SUCCESS)
            FOUND(r.data);
    } else {
        st = cudnnFindConvolutionBackwardFilterAlgorithmEx(h, xd, in1, yd, in2, p->cd[dir], wd, out,
                                                           MAXALG, &got, r.filter, ws, f->avail);
        if (st == CUDNN_STATUS_SUCCESS)
            FOUND(r.filter);
    }
    return st;
}
#undef FOUND

/* Forward in layout nchw: with the current candidate, or (f) measuring every algorithm. The
 * operands are prepared as the layout and data type need them: the filter transposed to KRSC
 * (NHWC) or taken as OIHW (NCHW), the input padded explicitly where cuDNN cannot pad, copied to
 * NCHW or rounded to bfloat16; the output widened or copied back, with the bias. */
static cudnnStatus_t run_fwd(mgt_backend *be, conv_plan *p, conv_io *io, int nchw, conv_find *f) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const mgt_conv_shape *s = &p->s;
    cudaStream_t st = im->stream;
    const size_t rows = (size_t)s->n * s->oh * s->ow;
    ws_layout l;
    char *ws = f ? find_ws(be, p, &l, &f->avail) : plan_ws(be, p, DIR_FWD, &l);
    const void *xin = conv_input(im, p, io->x, ws, &l);
    const void *xa = xin, *wa = filter(be, p, DIR_FWD, nchw, io->w);
    void *ya = io->y;
    float beta = 0.0f;
    const int bf = !nchw && lowp(im, p, DIR_FWD);
    if (nchw) { /* x to NCHW; y comes out NCHW */
        if (f)
            copies_mark(im, 0);
        mgt_k_transpose(st, 4, (size_t)s->n, conv_x_count(p) / s->n / p->cp, (size_t)p->cp, xin,
                        ws + l.xn);
        if (f)
            copies_mark(im, 1);
        xa = ws + l.xn;
        ya = ws + l.yn;
    } else if (!bf && im->bf16) { /* float data: x widened, y in the workspace, then rounded */
        xa = widened(im, xin, conv_x_count(p), ws + l.xb);
        ya = ws + l.yb;
    }
    if (!nchw && io->b && !f) { /* the bias first, the convolution adds onto it (as the CPU does) */
        mgt_k_fill_rows(st, bf ? 2 : 4, rows, s->oc, io->b, ya);
        beta = 1.0f;
    }
    const float one = 1.0f;
    cudnnStatus_t cs =
        f ? find_call(im, p, DIR_FWD, nchw, xa, wa, ya, ws + l.algo, f)
          : cudnnConvolutionForward((cudnnHandle_t)im->cudnn, &one, xdesc_l(p, DIR_FWD, nchw), xa,
                                    wdesc_l(p, DIR_FWD, nchw), wa, p->cd[DIR_FWD],
                                    (cudnnConvolutionFwdAlgo_t)cur_algo(p, DIR_FWD), ws + l.algo,
                                    cur_ws(p, DIR_FWD), &beta, ydesc_l(p, DIR_FWD, nchw), ya);
    if (cs != CUDNN_STATUS_SUCCESS)
        return cs;
    if (!nchw && ya != io->y) {
        mgt_k_to_bf16(st, rows * (size_t)s->oc, (const float *)ya, (uint16_t *)io->y);
    } else if (nchw) { /* [n][oc][oh*ow] -> [n][oh*ow][oc], then the bias */
        if (f)
            copies_mark(im, 2);
        mgt_k_transpose(st, 4, (size_t)s->n, (size_t)s->oc, (size_t)s->oh * s->ow, ws + l.yn,
                        io->y);
        if (io->b)
            mgt_k_add_rows(st, rows, s->oc, io->b, io->y);
        if (f) {
            copies_mark(im, 3);
            f->copies_ms = copies_ms(im);
        }
    }
    return cs;
}

/* dy's float copy at yb (a bf16 backend's direction run on float data), made once for both
 * backward passes unless the workspace moved in between; a measurement's copy is not counted on
 * (the passes then make their own). */
static const void *dy_f32(mgt_gpu_impl *im, conv_io *io, char *yb, size_t count, int measuring) {
    if (io->dyf != yb)
        widened(im, io->dy, count, yb);
    io->dyf = measuring ? NULL : yb;
    return yb;
}

/* Backward-filter in layout nchw (as run_fwd): dW from x and dy. NCHW's filter is OIHW, the
 * weights' own layout: dW is written in place, with no transpose back. */
static cudnnStatus_t run_bwd_filter(mgt_backend *be, conv_plan *p, conv_io *io, int nchw,
                                    conv_find *f) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const mgt_conv_shape *s = &p->s;
    cudaStream_t st = im->stream;
    const size_t rows = (size_t)s->n * s->oh * s->ow;
    const int oc = s->oc;
    ws_layout l;
    char *ws = f ? find_ws(be, p, &l, &f->avail) : plan_ws(be, p, DIR_BWD_FILTER, &l);
    const void *xin = conv_input(im, p, io->x, ws, &l);
    const void *xa = xin, *dya = io->dy;
    const int bf = !nchw && lowp(im, p, DIR_BWD_FILTER);
    /* cuDNN's dW: in place where it is dW's own layout and type, else KRSC in the workspace */
    void *dwa = dw_converted(p, bf, nchw) ? (void *)(ws + l.dw_t) : (void *)io->dw;
    if (nchw) {
        if (f)
            copies_mark(im, 0);
        mgt_k_transpose(st, 4, (size_t)s->n, conv_x_count(p) / s->n / p->cp, (size_t)p->cp, xin,
                        ws + l.xn);
        mgt_k_transpose(st, 4, (size_t)s->n, (size_t)s->oh * s->ow, (size_t)oc, io->dy,
                        ws + l.yn);
        if (f) {
            copies_mark(im, 1);
            copies_mark(im, 2);
            copies_mark(im, 3);
            f->copies_ms = copies_ms(im);
        }
        xa = ws + l.xn;
        dya = ws + l.yn;
    } else if (!bf && im->bf16) { /* float data: x and dy widened */
        xa = widened(im, xin, conv_x_count(p), ws + l.xb);
        dya = dy_f32(im, io, ws + l.yb, rows * (size_t)oc, f != NULL);
    }
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t cs =
        f ? find_call(im, p, DIR_BWD_FILTER, nchw, xa, dya, dwa, ws + l.algo, f)
          : cudnnConvolutionBackwardFilter(
                (cudnnHandle_t)im->cudnn, &one, xdesc_l(p, DIR_BWD_FILTER, nchw), xa,
                ydesc_l(p, DIR_BWD_FILTER, nchw), dya, p->cd[DIR_BWD_FILTER],
                (cudnnConvolutionBwdFilterAlgo_t)cur_algo(p, DIR_BWD_FILTER), ws + l.algo,
                cur_ws(p, DIR_BWD_FILTER), &zero, wdesc_l(p, DIR_BWD_FILTER, nchw), dwa);
    if (cs != CUDNN_STATUS_SUCCESS)
        return cs;
    if (dw_converted(p, bf, nchw)) /* [kh*kw][cp] -> [c][kh*kw], widened: one pass */
        mgt_k_filter_from_krsc(st, bf ? 2 : 4, oc, s->c, p->cp, s->kh * s->kw, dwa, io->dw);
    return cs;
}

/* Backward-data in layout nchw (as run_fwd): dx from dy and W, cropped out of the padded
 * gradient where the input was padded explicitly. */
static cudnnStatus_t run_bwd_data(mgt_backend *be, conv_plan *p, conv_io *io, int nchw,
                                  conv_find *f) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const mgt_conv_shape *s = &p->s;
    cudaStream_t st = im->stream;
    const size_t rows = (size_t)s->n * s->oh * s->ow;
    const int oc = s->oc;
    ws_layout l;
    char *ws = f ? find_ws(be, p, &l, &f->avail) : plan_ws(be, p, DIR_BWD_DATA, &l);
    /* the padded gradient reuses the padded input's place: dW is done with it */
    const int cropped = p->padded || p->chpad;
    void *dxo = cropped ? (void *)(ws + l.pad) : (void *)io->dx;
    const void *wa = filter(be, p, DIR_BWD_DATA, nchw, io->w), *dya = io->dy;
    void *dxa = dxo;
    const int bf = !nchw && lowp(im, p, DIR_BWD_DATA);
    if (nchw) {
        if (f)
            copies_mark(im, 0);
        mgt_k_transpose(st, 4, (size_t)s->n, (size_t)s->oh * s->ow, (size_t)oc, io->dy,
                        ws + l.yn);
        if (f)
            copies_mark(im, 1);
        dya = ws + l.yn;
        dxa = ws + l.xn;
    } else if (!bf && im->bf16) { /* float data: dy widened, dx in the workspace, then rounded */
        dya = dy_f32(im, io, ws + l.yb, rows * (size_t)oc, f != NULL);
        dxa = ws + l.xb;
    }
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t cs =
        f ? find_call(im, p, DIR_BWD_DATA, nchw, wa, dya, dxa, ws + l.algo, f)
          : cudnnConvolutionBackwardData(
                (cudnnHandle_t)im->cudnn, &one, wdesc_l(p, DIR_BWD_DATA, nchw), wa,
                ydesc_l(p, DIR_BWD_DATA, nchw), dya, p->cd[DIR_BWD_DATA],
                (cudnnConvolutionBwdDataAlgo_t)cur_algo(p, DIR_BWD_DATA), ws + l.algo,
                cur_ws(p, DIR_BWD_DATA), &zero, xdesc_l(p, DIR_BWD_DATA, nchw), dxa);
    if (cs != CUDNN_STATUS_SUCCESS)
        return cs;
    if (!nchw && dxa != dxo) {
        mgt_k_to_bf16(st, conv_x_count(p), (const float *)dxa, (uint16_t *)dxo);
    } else if (nchw) { /* [n][c][h*w] -> [n][h*w][c] */
        if (f)
            copies_mark(im, 2);
        mgt_k_transpose(st, 4, (size_t)s->n, (size_t)p->cp, conv_x_count(p) / s->n / p->cp,
                        ws + l.xn, dxo);
        if (f) {
            copies_mark(im, 3);
            f->copies_ms = copies_ms(im);
        }
    }
    if (cropped)
        mgt_k_crop_nhwc(st, act_size(im), s->n, s->h, s->w, s->c, p->cp, p->padded ? p->hp : s->h,
                        p->padded ? p->wp : s->w, p->padded ? s->pad_top : 0,
                        p->padded ? s->pad_left : 0, dxo, io->dx);
    return cs;
}

typedef cudnnStatus_t (*run_fn)(mgt_backend *, conv_plan *, conv_io *, int, conv_find *);
static const run_fn run_dir[NDIRS] = {run_fwd, run_bwd_data, run_bwd_filter};
static const char *const call_name[NDIRS] = {
    "cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter"};

/* Order of measured candidates: --conv-algo winograd's first, then the fastest. */
static int before(const conv_cand *a, const conv_cand *b, int dir, mgt_conv_algo want) {
    const int wa = want == MGT_CONV_WINOGRAD && is_winograd(dir, a->algo);
    const int wb = want == MGT_CONV_WINOGRAD && is_winograd(dir, b->algo);
    return wa != wb ? wa > wb : a->ms < b->ms;
}

/* The first call in direction dir outside --reproducible: every algorithm cuDNN has for the
 * shape is run on this call's operands and timed (cudnnFind*AlgorithmEx: cuDNN's own
 * measurement, as PyTorch's cudnn.benchmark does), in NHWC and, for plain float, in NCHW with
 * the time of the copies to and from NCHW added; the candidates become those that ran, fastest
 * first, less what the run excludes (tensor-op math without --tf32, FFT and Winograd under
 * --conv-algo direct). Nothing queued may still run meanwhile (cuDNN waits for the device
 * while it measures): the queue is drained first, by polling. If nothing usable was found,
 * the heuristics' order stands. */
static void measure_here(mgt_backend *be, conv_plan *p, int dir, conv_io *io) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const mgt_conv_shape *s = &p->s;
    enum { MAXALL = 32 };
    conv_cand found[MAXALL];
    int n = 0;
    mgt_gpu_drain(im);
    const int bf = lowp(im, p, dir), tensor_ok = im->tf32 || bf;
    for (int nchw = 0; nchw <= p->nchw_ok; nchw++) {
        GPU_CHECK(CUDNN, cudnnSetConvolutionMathType(p->cd[dir], tensor_ok ? CUDNN_TENSOR_OP_MATH
                                                                           : CUDNN_FMA_MATH));
        conv_cand got[MAXALL / 2];
        conv_find f = {got, 0, MAXALL / 2, 0, 0};
        if (run_dir[dir](be, p, io, nchw, &f) != CUDNN_STATUS_SUCCESS)
            continue; /* this layout has nothing for the shape */
        for (int i = 0; i < f.n; i++) {
            conv_cand c = got[i];
            if (c.status != CUDNN_STATUS_SUCCESS || c.ms < 0 || c.ws > f.avail ||
                (!tensor_ok && tensor_op(c.math)))
                continue;
            if (s->algo == MGT_CONV_DIRECT && (is_winograd(dir, c.algo) || is_fft(dir, c.algo)))
                continue;
            c.ms += (float)f.copies_ms;
            found[n++] = c;
        }
    }
    mgt_gpu_drain(im);
    p->measured[dir] = 1;
    if (n == 0)
        return;
    for (int i = 1; i < n; i++) { /* insertion sort: a handful of entries */
        const conv_cand v = found[i];
        int j = i;
        for (; j > 0 && before(&v, &found[j - 1], dir, s->algo); j--)
            found[j] = found[j - 1];
        found[j] = v;
    }
    conv_cand *c = malloc(sizeof *c * (size_t)n);
    if (!c)
        mgt_die("out of host memory for the convolution algorithm list");
    memcpy(c, found, sizeof *c * (size_t)n);
    free(p->cand[dir]);
    p->cand[dir] = c;
    p->ncand[dir] = n;
    p->cur[dir] = 0;
    if (im->conv->path) { /* into the cache file's entries, saved at the end */
        char key[320];
        entry_key(im, p, dir, key, sizeof key);
        algo_entry *e = add_entry(im, key, dir);
        e->algo = c[0].algo;
        e->math = c[0].math;
        e->nchw = c[0].nchw;
        e->ms = c[0].ms;
        im->conv->added = 1;
    }
}

/* What the rank of a GPU that measures sends the others on it, for one direction of one shape:
 * the shape, the direction, whether it runs on float data (a bf16 run's fallback), and the
 * candidates as measure_here left them, fastest first. */
enum { SHARED_MAX = 32 };
typedef struct shared_choice {
    mgt_conv_shape s;
    int dir, f32, n;
    conv_cand c[SHARED_MAX];
} shared_choice;

/* m from the GPU's measuring rank to the others, by a broadcast that the host polls as it polls
 * the device (mgt_gpu_wait_event): between polls the device's queues are asked how they stand
 * (which is what makes an emulated GPU run them) and the transport's watch is called (an NCCL
 * peer that died ends the job within --comm-timeout), and the job's watchdog times the whole. A
 * rank waiting here has its collectives already queued, so the measuring rank's device work,
 * which may wait for them, completes. */
static void share_choice(mgt_gpu_impl *im, shared_choice *m) {
    struct mgt_gpu_conv_cache *cc = im->conv;
    if (cc->share_watch)
        mgt_comm_enter(cc->share_watch, "the measured convolution algorithms sent between the "
                                        "ranks of one GPU (MPI_Ibcast)");
    MPI_Request rq;
    int rc = MPI_Ibcast(m, (int)sizeof *m, MPI_BYTE, 0, cc->share, &rq);
    const double t0 = mgt_now();
    for (int done = 0; rc == MPI_SUCCESS && !done;) {
        rc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done)
            break;
        (void)cudaEventQuery(im->wait_ev);
        if (im->watch)
            im->watch(im->watch_ctx, mgt_now() - t0);
        struct timespec ts = {0, 20 * 1000};
        nanosleep(&ts, NULL);
    }
    if (cc->share_watch)
        mgt_comm_leave(cc->share_watch);
    if (rc != MPI_SUCCESS)
        mgt_die("MPI_Ibcast of the measured convolution algorithms failed (MPI error %d)", rc);
}

/* measure_here, once per GPU where several ranks share one (mgt_gpu_share_measurements): rank 0
 * of them measures and broadcasts what it found; the others take it for their own shape (the
 * same but perhaps for the batch size: the global batch's remainder), each candidate's
 * workspace asked of cuDNN for it, and measure only where what came is not for their call (a
 * model whose ranks meet their shapes in different orders: never, as each rank runs the same
 * layers on the same shapes; the exchange is then simply theirs). Every rank of a GPU makes the
 * same first calls in the same order (every rank holds at least one sample a step, and later
 * batch sizes take the first one's choice: from_sibling), so the broadcasts pair up. */
static void measure(mgt_backend *be, conv_plan *p, int dir, conv_io *io) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    struct mgt_gpu_conv_cache *cc = im->conv;
    if (cc->share_size <= 1) {
        measure_here(be, p, dir, io);
        return;
    }
    shared_choice m;
    memset(&m, 0, sizeof m);
    if (cc->share_rank == 0) {
        measure_here(be, p, dir, io);
        m.s = p->s;
        m.dir = dir;
        m.f32 = p->f32[dir];
        m.n = p->ncand[dir] < SHARED_MAX ? p->ncand[dir] : SHARED_MAX;
        memcpy(m.c, p->cand[dir], sizeof *m.c * (size_t)m.n);
    }
    share_choice(im, &m);
    if (cc->share_rank == 0)
        return;
    conv_cand *c = m.dir == dir && m.f32 == p->f32[dir] && same_but_n(&m.s, &p->s) && m.n > 0
                       ? malloc(sizeof *c * (size_t)m.n)
                       : NULL;
    int k = 0;
    for (int i = 0; c && i < m.n; i++) {
        conv_cand x = m.c[i];
        if ((x.nchw && !p->nchw_ok) ||
            cudnnSetConvolutionMathType(p->cd[dir], x.math) != CUDNN_STATUS_SUCCESS ||
            algo_ws(im, p, dir, x.algo, x.nchw, &x.ws) != CUDNN_STATUS_SUCCESS)
            continue;
        x.shared = 1;
        x.refused = 0;
        c[k++] = x;
    }
    if (k == 0) { /* not this call's: measured here */
        free(c);
        measure_here(be, p, dir, io);
        return;
    }
    free(p->cand[dir]);
    p->cand[dir] = c;
    p->ncand[dir] = k;
    p->cur[dir] = 0;
    p->measured[dir] = 1;
}

void mgt_gpu_share_measurements(mgt_backend *be, MPI_Comm same_gpu, mgt_comm *c) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!im->conv && !(im->conv = calloc(1, sizeof *im->conv)))
        mgt_die("out of host memory for the convolution plans");
    struct mgt_gpu_conv_cache *cc = im->conv;
    cc->share = same_gpu;
    MPI_Comm_rank(same_gpu, &cc->share_rank);
    MPI_Comm_size(same_gpu, &cc->share_size);
    cc->share_watch = c;
}

/* Direction dir of plan p: candidates made and measured at the first call, then the current
 * candidate run, the next tried while cuDNN refuses one at its first use (conv_ran). */
static void run(mgt_backend *be, conv_plan *p, int dir, conv_io *io) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    cudnnStatus_t cs;
    do {
        if (!p->chosen[dir])
            choose(be, p, dir);
        if (!p->measured[dir])
            measure(be, p, dir, io);
        const int nchw = p->cand[dir][p->cur[dir]].nchw;
        cs = run_dir[dir](be, p, io, nchw, NULL);
    } while (conv_ran(im, p, dir, cs, call_name[dir], __LINE__));
}

void mgt_gpu_conv2d_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    const size_t rows = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    if (rows == 0 || s->oc <= 0)
        return;
    if (conv_k(s) == 0) { /* no input channels: only the bias */
        if (b)
            mgt_k_fill_rows(im->stream, act_size(im), rows, s->oc, b, y);
        else
            GPU_CHECK_ON(im->stream, CUDA,
                         cudaMemsetAsync(y, 0, rows * (size_t)s->oc * act_size(im), im->stream));
        return;
    }
    conv_io io = {.x = x, .w = w, .b = b, .y = y};
    run(be, plan_for(im, s), DIR_FWD, &io);
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
        mgt_k_colreduce(st, &im->part, MGT_RED_SUM, act_size(im), rows, oc, dy, db, NULL);
    if (rows == 0 || oc == 0 || K == 0) { /* nothing flows: gradients are zeros */
        if (dw && oc && K)
            GPU_CHECK_ON(st, CUDA, cudaMemsetAsync(dw, 0, (size_t)oc * K * sizeof(float), st));
        if (dx && x_count)
            GPU_CHECK_ON(st, CUDA, cudaMemsetAsync(dx, 0, x_count * act_size(im), st));
        return;
    }
    conv_io io = {.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw};
    if (dw)
        run(be, plan_for(im, s), DIR_BWD_FILTER, &io);
    if (dx)
        run(be, plan_for(im, s), DIR_BWD_DATA, &io);
}
