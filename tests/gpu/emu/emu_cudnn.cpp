/* emu_cudnn.cpp: the cuDNN (9.x, classic descriptor API) functions the GPU backend calls,
 * emulated on the host (see emu.h). The backend (graph) API is emu_cudnn_graph.cpp's; it takes
 * the handles' streams and the last error from here (emu_cudnn.h).
 *
 * Semantics follow NVIDIA's cuDNN documentation:
 *   - 4-D float tensors in NCHW or NHWC; filters in NCHW ("KCRS") or NHWC ("KRSC");
 *   - symmetric padding, strides and dilation; CUDNN_CROSS_CORRELATION applies the filter as
 *     stored, CUDNN_CONVOLUTION flips it in both spatial dimensions;
 *   - output size 1 + (in + 2 pad - ((f - 1) dilation + 1)) / stride per spatial dimension;
 *   - every compute call is out = alpha * op(inputs) + beta * out, alpha and beta host pointers
 *     read at the call, beta == 0 meaning out is not read;
 *   - descriptors are read at the call (they may be changed or destroyed right after it);
 *   - inconsistent descriptors return the status the documentation gives (BAD_PARAM for
 *     mismatched channels, batch or data types; NOT_SUPPORTED for an algorithm that does not
 *     handle the shape or layout); cudnnGetLastErrorString says which check failed.
 * Algorithms: the heuristics (cudnnGet*Algorithm_v7) return every algorithm of the direction,
 * ranked, with the per-algorithm status, determinism, math type and workspace a real library
 * reports (unsupported ones with CUDNN_STATUS_NOT_SUPPORTED), so that a caller's selection is
 * exercised; which algorithm supports which layout follows cuDNN 9's "Supported algorithms"
 * tables (unsupported()), so a layout with no algorithm fails here as on the GPU. As cuDNN's
 * heuristics can, they rank first, for some shapes, an algorithm that the compute call then
 * refuses (stale_algo(), MGT_EMU_CUDNN_STALE), so that a caller's fallback is exercised too.
 * cudnnGet*AlgorithmMaxCount answers every algorithm of the direction. Each algorithm has its
 * own nonzero workspace size; the compute calls check that the workspace given is that large
 * and is device memory, and overwrite it, as the GPU would. All algorithms compute the same
 * exact result (double accumulation); a math type other than CUDNN_FMA_MATH rounds the inputs
 * to TF32 first, as tensor cores do. Float data (FLOAT_CONFIG) and bfloat16 data with float
 * compute (PSEUDO_BFLOAT16_CONFIG: inputs exact, each result rounded once to nearest even) are
 * computed; other data types are valid in descriptors but the compute calls answer
 * CUDNN_STATUS_NOT_SUPPORTED.
 *
 * Misuse that a real GPU punishes with a crash or garbage (host pointers for tensors, tensors
 * running past their allocation, a workspace overlapping the data) ends the process through
 * emu::fail. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

#include <cudnn.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu.h"
#include "emu_cudnn.h"
#include "emu_util.h"

namespace {

/* What tensor and filter descriptors share: a data type and a packed 4-D layout. */
struct Layout4d {
    bool set;
    cudnnDataType_t type;
    cudnnTensorFormat_t format;
    int64_t stride[4]; /* in elements, in the order of the dimensions */
};

} // namespace

struct cudnnContext {
    cudaStream_t stream;
};

struct cudnnTensorStruct : Layout4d {
    int n, c, h, w;
    void set_dims(const int (&d)[4]) {
        n = d[0];
        c = d[1];
        h = d[2];
        w = d[3];
    }
};

struct cudnnFilterStruct : Layout4d {
    int k, c, r, s;
    void set_dims(const int (&d)[4]) {
        k = d[0];
        c = d[1];
        r = d[2];
        s = d[3];
    }
};

struct cudnnConvolutionStruct {
    bool set;
    int pad_h, pad_w, u, v, dil_h, dil_w;
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace {

/* ---- live objects: a pointer that is not live is a use after destroy (or garbage) ---- */

emu::LiveSet live;

void require_live(const void *p, const char *fn, const char *what) {
    if (!live.contains(p))
        emu::fail("%s: %s %p is not live (destroyed, or never created)", fn, what, p);
}

/* ---- the last error, per thread (cudnnGetLastErrorString) ---- */

thread_local char last_error[512];

__attribute__((format(printf, 2, 3))) cudnnStatus_t err(cudnnStatus_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

} // namespace

/* ---- what the backend API (emu_cudnn_graph.cpp) takes from here: emu_cudnn.h ---- */

cudaStream_t emu::cudnn_stream(cudnnHandle_t h, const char *fn) {
    require_live(h, fn, "cudnnHandle_t");
    return h->stream;
}

cudnnStatus_t emu::cudnn_error(cudnnStatus_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

namespace {

/* ---- enumerants ---- */

bool valid_type(cudnnDataType_t t) {
    return (int)t >= (int)CUDNN_DATA_FLOAT && (int)t <= (int)CUDNN_DATA_COMPLEX_FP64;
}

bool valid_math(cudnnMathType_t m) {
    return m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH ||
           m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION || m == CUDNN_FMA_MATH;
}

/* cuDNN on tensor-core GPUs may use TF32 for float data under any math type but FMA. */
bool tf32_math(cudnnMathType_t m) {
    return m != CUDNN_FMA_MATH;
}

bool tensor_op_math(cudnnMathType_t m) {
    return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

size_t align256(size_t b) {
    return (b + 255) & ~(size_t)255;
}

/* ---- geometry of one convolution, copied out of the descriptors at the call ---- */

enum Dir { FWD = 0, BWD_DATA = 1, BWD_FILTER = 2 };

struct Geom {
    int n, c, h, w;    /* x (or dx) */
    int k, r, s;       /* filter: k outputs, r x s window */
    int oh, ow;        /* y (or dy) */
    int pad_h, pad_w, u, v, dil_h, dil_w;
    bool flip;         /* CUDNN_CONVOLUTION */
    bool tf32;
    bool bf16;                   /* PSEUDO_BFLOAT16_CONFIG: bf16 data, float compute */
    bool nchw_x, nchw_y, nchw_w; /* layouts, for algorithm support */
    int64_t xs[4], ys[4]; /* n, c, h, w strides */
    int64_t fs[4];        /* k, c, r, s strides */
    cudnnMathType_t math;
};

int out_dim(int in, int pad, int f, int dil, int stride) {
    return 1 + (in + 2 * pad - ((f - 1) * dil + 1)) / stride;
}

/* `xn` names the input in the message. */
cudnnStatus_t check_in_channels(const char *fn, const char *xn, const cudnnTensorStruct *x,
                                const cudnnFilterStruct *w) {
    if (x->c != w->c)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: %s has %d channels but the filter %d input feature maps", fn, xn, x->c,
                   w->c);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_window(const char *fn, const cudnnTensorStruct *x, const cudnnFilterStruct *w,
                           const cudnnConvolutionStruct *cd) {
    const int eh = (w->r - 1) * cd->dil_h + 1, ew = (w->s - 1) * cd->dil_w + 1;
    if (eh > x->h + 2 * cd->pad_h || ew > x->w + 2 * cd->pad_w)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: the (dilated) %dx%d filter is larger than the padded %dx%d input", fn, eh,
                   ew, x->h + 2 * cd->pad_h, x->w + 2 * cd->pad_w);
    return CUDNN_STATUS_SUCCESS;
}

/* Descriptor checks shared by the heuristics, the workspace queries and the compute calls.
 * `fn` names the caller in messages; `x` is the input (dx for backward data), `y` the output
 * (dy for the backward calls). */
cudnnStatus_t geometry(const char *fn, Dir dir, bool compute, cudnnHandle_t handle,
                       const cudnnTensorStruct *x, const cudnnFilterStruct *w,
                       const cudnnConvolutionStruct *cd, const cudnnTensorStruct *y, Geom *g) {
    if (!handle || !x || !w || !cd || !y)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: a NULL handle or descriptor", fn);
    require_live(handle, fn, "cudnnHandle_t");
    require_live(x, fn, "tensor descriptor");
    require_live(w, fn, "filter descriptor");
    require_live(cd, fn, "convolution descriptor");
    require_live(y, fn, "tensor descriptor");
    const char *xn = dir == BWD_DATA ? "dx" : "x", *yn = dir == FWD ? "y" : "dy";
    const char *wn = dir == BWD_FILTER ? "dw" : "w";
    if (!x->set || !y->set || !w->set || !cd->set)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: a descriptor was created but never set", fn);
    if (x->type != w->type || x->type != y->type)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: %s, %s and %s descriptors have different data types (%d, %d, %d)", fn, xn,
                   wn, yn, (int)x->type, (int)w->type, (int)y->type);
    if ((x->type != CUDNN_DATA_FLOAT && x->type != CUDNN_DATA_BFLOAT16) ||
        cd->compute != CUDNN_DATA_FLOAT)
        return err(CUDNN_STATUS_NOT_SUPPORTED,
                   "%s: data type %d with compute type %d: the emulation implements float data "
                   "(FLOAT_CONFIG) and bfloat16 data (PSEUDO_BFLOAT16_CONFIG), both with float "
                   "compute, only",
                   fn, (int)x->type, (int)cd->compute);
    cudnnStatus_t st = check_in_channels(fn, xn, x, w);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (y->c != w->k)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: %s has %d channels but the filter %d output feature maps", fn, yn, y->c,
                   w->k);
    if (x->n != y->n)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %s has batch size %d but %s has %d", fn, xn, x->n,
                   yn, y->n);
    st = check_window(fn, x, w, cd);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const int oh = out_dim(x->h, cd->pad_h, w->r, cd->dil_h, cd->u);
    const int ow = out_dim(x->w, cd->pad_w, w->s, cd->dil_w, cd->v);
    if (y->h != oh || y->w != ow)
        /* documented as NOT_SUPPORTED for cudnnConvolutionForward, BAD_PARAM elsewhere */
        return err(dir == FWD && compute ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_BAD_PARAM,
                   "%s: %s is %dx%d but the convolution of a %dx%d input gives %dx%d "
                   "(cudnnGetConvolution2dForwardOutputDim)",
                   fn, yn, y->h, y->w, x->h, x->w, oh, ow);
    g->n = x->n;
    g->c = x->c;
    g->h = x->h;
    g->w = x->w;
    g->k = w->k;
    g->r = w->r;
    g->s = w->s;
    g->oh = oh;
    g->ow = ow;
    g->pad_h = cd->pad_h;
    g->pad_w = cd->pad_w;
    g->u = cd->u;
    g->v = cd->v;
    g->dil_h = cd->dil_h;
    g->dil_w = cd->dil_w;
    g->flip = cd->mode == CUDNN_CONVOLUTION;
    g->math = cd->math;
    g->bf16 = x->type == CUDNN_DATA_BFLOAT16;
    g->tf32 = !g->bf16 && tf32_math(cd->math); /* bf16 inputs have fewer bits than TF32 */
    g->nchw_x = x->format == CUDNN_TENSOR_NCHW;
    g->nchw_y = y->format == CUDNN_TENSOR_NCHW;
    g->nchw_w = w->format == CUDNN_TENSOR_NCHW;
    std::copy(x->stride, x->stride + 4, g->xs);
    std::copy(y->stride, y->stride + 4, g->ys);
    std::copy(w->stride, w->stride + 4, g->fs);
    return CUDNN_STATUS_SUCCESS;
}

size_t x_elems(const Geom &g) {
    return (size_t)g.n * g.c * g.h * g.w;
}
size_t y_elems(const Geom &g) {
    return (size_t)g.n * g.k * g.oh * g.ow;
}
size_t w_elems(const Geom &g) {
    return (size_t)g.k * g.c * g.r * g.s;
}

/* ---- algorithms: support, determinism, workspace ---- */

int algo_count(Dir d) {
    return d == FWD        ? (int)CUDNN_CONVOLUTION_FWD_ALGO_COUNT
           : d == BWD_DATA ? (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT
                           : (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
}

enum Kind { K_IMPLICIT, K_PRECOMP, K_GEMM, K_DIRECT, K_FFT, K_FFT_TILING, K_WINO, K_WINO_NF,
            K_ATOMIC, K_NONE };

Kind kind(Dir d, int a) {
    if (d == FWD) {
        switch (a) {
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return K_IMPLICIT;
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return K_PRECOMP;
        case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return K_GEMM;
        case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return K_DIRECT;
        case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return K_FFT;
        case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return K_FFT_TILING;
        case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return K_WINO;
        case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return K_WINO_NF;
        }
    } else if (d == BWD_DATA) {
        switch (a) {
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: return K_ATOMIC;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: return K_GEMM;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: return K_FFT;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: return K_FFT_TILING;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: return K_WINO;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED: return K_WINO_NF;
        }
    } else {
        switch (a) {
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: return K_ATOMIC;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: return K_GEMM;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: return K_FFT;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3: return K_ATOMIC;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD: return K_DIRECT; /* not implemented */
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: return K_WINO_NF;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING: return K_FFT_TILING;
        }
    }
    return K_NONE;
}

/* Whether the algorithm handles the shape, layouts and data type: cuDNN 9's "Supported
 * algorithms" tables of the legacy API (cudnnConvolutionForward, cudnnConvolutionBackwardData,
 * cudnnConvolutionBackwardFilter), for the packed 4-D descriptors the emulation has:
 *   - an NHWC filter (KRSC) needs NHWC x and y, and then only forward IMPLICIT_GEMM and
 *     IMPLICIT_PRECOMP_GEMM, backward-data ALGO_1 and backward-filter ALGO_0 and ALGO_1 exist;
 *   - with an NCHW filter: forward IMPLICIT_GEMM and IMPLICIT_PRECOMP_GEMM take any layout,
 *     GEMM any layout with dilation 1; FFT (x and y NCHW, each padded side at most 256) and
 *     FFT_TILING (NCHW, filter at most 32x32) want unit stride and dilation and padding smaller
 *     than the filter; WINOGRAD wants NCHW, unit stride and dilation and a 3x3 filter;
 *     WINOGRAD_NONFUSED unit stride and dilation and a 3x3 or 5x5 filter. The backward
 *     directions read dy as NCHW in every algorithm (ALGO_0, ALGO_1, ALGO_3 with dilation 1), and
 *     their FFT and Winograd variants want the same as forward's;
 *   - forward DIRECT and backward-filter WINOGRAD are not implemented;
 *   - bfloat16 data with float compute (PSEUDO_BFLOAT16_CONFIG) is accepted only on the tensor
 *     core path, NHWC with forward IMPLICIT_PRECOMP_GEMM and backward ALGO_1 (a narrower set than
 *     cuDNN may offer: a layout the emulation accepts is one cuDNN certainly runs); with
 *     MGT_EMU_CUDNN_BF16=off by no algorithm at all, as a cuDNN without a bfloat16 kernel for a
 *     shape would answer, so that a caller's way out is exercised.
 * So NHWC float convolutions have no FFT or Winograd algorithm at all, as on the GPU. */
const char *unsupported(Dir d, int a, const Geom &g) {
    const Kind kd = kind(d, a);
    if (kd == K_NONE)
        return "unknown algorithm";
    if (kd == K_DIRECT)
        return "the algorithm is not implemented";
    const bool nhwc_w = !g.nchw_w, all_nhwc = !g.nchw_x && !g.nchw_y && nhwc_w;
    const bool unit = g.u == 1 && g.v == 1 && g.dil_h == 1 && g.dil_w == 1;
    if (nhwc_w && !all_nhwc)
        return "an NHWC filter needs NHWC x and y";
    if (g.bf16) {
        const char *bf = std::getenv("MGT_EMU_CUDNN_BF16");
        if (bf && !std::strcmp(bf, "off"))
            return "no bfloat16 algorithm (MGT_EMU_CUDNN_BF16=off)";
        if (!all_nhwc)
            return "bfloat16 convolutions are emulated in NHWC only";
        const bool tc = d == FWD ? kd == K_PRECOMP : kd == K_GEMM;
        return tc ? nullptr
                  : "bfloat16 convolutions are emulated with forward IMPLICIT_PRECOMP_GEMM and "
                    "backward ALGO_1 only";
    }
    if (nhwc_w) {
        const bool ok = d == FWD        ? kd == K_IMPLICIT || kd == K_PRECOMP
                        : d == BWD_DATA ? kd == K_GEMM
                                        : a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
                                              a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
        return ok ? nullptr
                  : "with an NHWC filter cuDNN has forward IMPLICIT_GEMM and "
                    "IMPLICIT_PRECOMP_GEMM, backward-data ALGO_1 and backward-filter ALGO_0 and "
                    "ALGO_1 only";
    }
    /* an NCHW filter */
    const bool nchw = g.nchw_x && g.nchw_y;
    if (d != FWD && !g.nchw_y)
        return "the backward algorithms read dy as NCHW";
    switch (kd) {
    case K_IMPLICIT:
    case K_PRECOMP:
        return nullptr;
    case K_GEMM:
    case K_ATOMIC:
        if ((d == FWD || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3) &&
            (g.dil_h != 1 || g.dil_w != 1))
            return "the algorithm needs dilation 1";
        return nullptr;
    case K_FFT:
    case K_FFT_TILING:
        if (!nchw)
            return "FFT algorithms need NCHW tensors and filters";
        if (!unit)
            return "FFT algorithms need stride 1 and dilation 1";
        if (g.pad_h >= g.r || g.pad_w >= g.s)
            return "FFT algorithms need padding smaller than the filter";
        if (kd == K_FFT && (g.h + 2 * g.pad_h > 256 || g.w + 2 * g.pad_w > 256))
            return "FFT needs the padded input at most 256x256";
        if (kd == K_FFT_TILING && (g.r > 32 || g.s > 32))
            return "FFT_TILING needs a filter of at most 32x32";
        return nullptr;
    case K_WINO:
    case K_WINO_NF:
        if (kd == K_WINO && !nchw)
            return "WINOGRAD needs NCHW tensors and filters";
        if (!unit)
            return "Winograd algorithms need stride 1 and dilation 1";
        if (!(g.r == 3 && g.s == 3) && !(kd == K_WINO_NF && g.r == 5 && g.s == 5))
            return "Winograd needs a 3x3 filter (5x5 too for WINOGRAD_NONFUSED)";
        return nullptr;
    case K_DIRECT:
    case K_NONE:
        break;
    }
    return "unknown algorithm";
}

/* The heuristics can rank first an algorithm that then fails to run: cuDNN's _v7 heuristics
 * rank from a model of the kernels, not from the kernels' own checks, and for NHWC float
 * filters they are known to name one that answers NOT_SUPPORTED at execution. The emulation
 * does the same ("stale" entries): for every NHWC float convolution whose input has an odd
 * number of channels above one (as a vectorised kernel needing channel pairs would), or for
 * every convolution with MGT_EMU_CUDNN_STALE=all, and for none with MGT_EMU_CUDNN_STALE=none.
 * The stale entry is the best-ranked deterministic algorithm the tables above reject (not one
 * that is not implemented at all); the heuristics report it first with SUCCESS, its workspace
 * query answers, and only the compute call refuses it. Returns the algorithm, or -1. */
int stale_algo(Dir d, const Geom &g);

bool deterministic(Dir d, int a) {
    return kind(d, a) != K_ATOMIC;
}

/* Algorithms that have a tensor-core variant. */
bool tensor_capable(Dir d, int a) {
    const Kind kd = kind(d, a);
    return kd == K_PRECOMP || (d != FWD && kd == K_GEMM);
}

uint64_t pow2_at_least(uint64_t v) {
    uint64_t p = 1;
    while (p < v)
        p <<= 1;
    return p;
}

/* Workspace bytes of an algorithm under a math type: nonzero for every algorithm, so that a
 * caller passing too little (or none) is caught. The GEMM-like ones scale with the im2col matrix,
 * the FFT ones with the transformed tensors. */
size_t ws_bytes(Dir d, int a, cudnnMathType_t math, const Geom &g) {
    const uint64_t N = g.n, C = g.c, H = g.h, W = g.w, K = g.k, R = g.r, S = g.s, OH = g.oh,
                   OW = g.ow;
    const uint64_t crs = C * R * S, filt = K * crs;
    const uint64_t col_image = OH * OW * crs * 4, col = N * col_image;
    uint64_t b = 0;
    switch (kind(d, a)) {
    case K_IMPLICIT:
        b = 4 * K + 4 * C;
        break;
    case K_PRECOMP:
        b = 8 * (crs + OH * OW);
        break;
    case K_GEMM:
        b = d == FWD ? col : d == BWD_DATA ? 4 * filt + 4 * OH * OW * R * S : col_image;
        break;
    case K_ATOMIC:
        b = d == BWD_FILTER && a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 ? 8 * filt : 4 * crs;
        break;
    case K_FFT: {
        const uint64_t fh = pow2_at_least(H + 2 * g.pad_h), fw = pow2_at_least(W + 2 * g.pad_w);
        b = 8 * (N * C + K * C + N * K) * fh * (fw / 2 + 1);
        break;
    }
    case K_FFT_TILING:
        b = 8 * (N * C + K * C + N * K) * 32 * 17;
        break;
    case K_WINO:
        b = 4 * 16 * (C * K + N * C * ((OH + 1) / 2) * ((OW + 1) / 2));
        break;
    case K_WINO_NF: {
        const uint64_t tiles = ((OH + 3) / 4) * ((OW + 3) / 4);
        b = 4 * 36 * (C * K + N * (C + K) * tiles);
        break;
    }
    case K_DIRECT:
    case K_NONE:
        b = 0;
        break;
    }
    if (tensor_capable(d, a) && tensor_op_math(math))
        b += 4 * filt; /* the filter, re-laid out for the tensor cores */
    return align256(std::max<uint64_t>(b, 1));
}

/* The ranking the heuristics return: best first, every algorithm of the direction once; the
 * backward non-deterministic ALGO_0 ranks above the deterministic ALGO_1, so that a caller that
 * wants determinism has to look at the determinism field. */
const int fwd_rank[] = {
    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,     CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,         CUDNN_CONVOLUTION_FWD_ALGO_FFT,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,              CUDNN_CONVOLUTION_FWD_ALGO_DIRECT};
const int bwd_data_rank[] = {
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,   CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD};
const int bwd_filter_rank[] = {
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD};
static_assert(sizeof fwd_rank / sizeof *fwd_rank == CUDNN_CONVOLUTION_FWD_ALGO_COUNT, "fwd");
static_assert(sizeof bwd_data_rank / sizeof *bwd_data_rank ==
                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
              "bwd data");
static_assert(sizeof bwd_filter_rank / sizeof *bwd_filter_rank ==
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
              "bwd filter");

struct Perf {
    int algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
};

/* Whether cuDNN's documentation says a tensor-op request on these half-width (bfloat16) data is
 * granted: the Developer Guide's legacy API, "Tensor Core Operations", for algorithms other than
 * *_WINOGRAD_NONFUSED: the number of input and output feature maps (C and K) a multiple of 8, and
 * with an NHWC filter the data pointers aligned to 128 bits (which the heuristics cannot see:
 * the compute calls take the pointers). Its automatic channel padding is for packed NCHW data
 * only. Elsewhere cuDNN may use the tensor cores or not, as it chooses. */
bool tensor_ops_documented(const Geom &g) {
    return g.c % 8 == 0 && g.k % 8 == 0;
}

/* The math type an entry reports: FMA is honoured (float callers that disallow TF32 rely on
 * every entry being FMA); otherwise the tensor-core capable algorithms report a tensor-op type
 * and the rest the default math, except where cuDNN chooses (bfloat16 data outside the
 * documented requirements, above): there, as cuDNN 9.19 did on an H100 for such shapes
 * (bench/results/gpu-2026-11-26-h100), forward and backward-filter report the default math when
 * the input channel count is not a multiple of 8, so that a caller meets both kinds of choice. */
cudnnMathType_t entry_math(Dir d, int a, const Geom &g) {
    if (g.math == CUDNN_FMA_MATH)
        return CUDNN_FMA_MATH;
    if (!tensor_capable(d, a))
        return CUDNN_DEFAULT_MATH;
    if (g.bf16 && !tensor_ops_documented(g) && d != BWD_DATA && g.c % 8 != 0)
        return CUDNN_DEFAULT_MATH;
    return tensor_op_math(g.math) ? g.math : CUDNN_TENSOR_OP_MATH;
}

const int *rank_of(Dir d) {
    return d == FWD ? fwd_rank : d == BWD_DATA ? bwd_data_rank : bwd_filter_rank;
}

int stale_algo(Dir d, const Geom &g) {
    const char *mode = std::getenv("MGT_EMU_CUDNN_STALE");
    const bool all = mode && !std::strcmp(mode, "all"), none = mode && !std::strcmp(mode, "none");
    const bool rule = !g.bf16 && !g.nchw_x && g.c > 1 && g.c % 2 == 1;
    if (none || !(all || rule))
        return -1;
    const int *rank = rank_of(d);
    for (int i = 0; i < algo_count(d); i++)
        if (deterministic(d, rank[i]) && kind(d, rank[i]) != K_DIRECT && unsupported(d, rank[i], g))
            return rank[i];
    return -1;
}

std::vector<Perf> heuristics(Dir d, const Geom &g) {
    const int *rank = rank_of(d);
    const int stale = stale_algo(d, g);
    std::vector<Perf> ok, bad;
    for (int i = 0; i < algo_count(d); i++) {
        const int a = rank[i];
        Perf p{};
        p.algo = a;
        p.determinism = deterministic(d, a) ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
        p.math = entry_math(d, a, g);
        if (a == stale) { /* ranked first, as if it ran (see stale_algo) */
            p.status = CUDNN_STATUS_SUCCESS;
            p.time = 0.01f;
            p.memory = ws_bytes(d, a, p.math, g);
            ok.insert(ok.begin(), p);
        } else if (unsupported(d, a, g)) {
            p.status = CUDNN_STATUS_NOT_SUPPORTED;
            p.time = -1.0f;
            p.memory = 0;
            bad.push_back(p);
        } else {
            p.status = CUDNN_STATUS_SUCCESS;
            p.time = 0.05f * (float)(ok.size() + 1);
            p.memory = ws_bytes(d, a, p.math, g);
            ok.push_back(p);
        }
    }
    ok.insert(ok.end(), bad.begin(), bad.end());
    return ok;
}

/* ---- the arithmetic: canonical double buffers, loops whose innermost index is contiguous ----
 * Images are packed as [h][w][c], filters as [r][s][c][k] (forward) or [k][r][s][c], with the
 * spatial flip of CUDNN_CONVOLUTION applied while packing. Float data is read as it is (rounded
 * to TF32 first under a tensor-op math type), bfloat16 data exactly; the sums are exact (double:
 * a product of two bfloat16 or TF32 values is exact in float, and the sums of a float
 * accumulation are within its rounding of these), and each result is rounded once to the
 * output's type, as a kernel accumulating in float and storing to bfloat16 rounds it. */

/* Element i of a float or bfloat16 tensor, as the algorithm reads it. */
double load(const void *p, int64_t i, const Geom &g) {
    if (g.bf16)
        return (double)emu::bf16_to_float(((const uint16_t *)p)[i]);
    const float f = ((const float *)p)[i];
    return g.tf32 ? (double)emu::to_tf32(f) : (double)f;
}

/* out[i] = alpha * acc + beta * out[i], rounded once to the output's type; out is not read when
 * beta == 0. */
void store(void *out, int64_t i, double acc, float alpha, float beta, bool bf16) {
    double v = (double)alpha * acc;
    if (bf16) {
        uint16_t *q = (uint16_t *)out + i;
        if (beta != 0.0f)
            v += (double)beta * (double)emu::bf16_to_float(*q);
        *q = emu::bf16_from_double(v);
    } else {
        float *q = (float *)out + i;
        *q = (float)(beta == 0.0f ? v : v + (double)beta * (double)*q);
    }
}

/* Image n of x (strides g.xs, dims h, w, c) or dy (g.ys; oh, ow, k), packed [h][w][c]. */
void pack(const void *p, const int64_t st[4], int n, int H, int W, int C, const Geom &g,
          std::vector<double> &out) {
    out.resize((size_t)H * W * C);
    for (int ih = 0; ih < H; ih++)
        for (int iw = 0; iw < W; iw++)
            for (int c = 0; c < C; c++)
                out[((size_t)ih * W + iw) * C + c] =
                    load(p, n * st[0] + c * st[1] + ih * st[2] + iw * st[3], g);
}

/* Offset of filter element (k, c, r, s) of the effective (cross-correlation) filter. */
int64_t filter_at(const Geom &g, int k, int c, int r, int s) {
    if (g.flip) {
        r = g.r - 1 - r;
        s = g.s - 1 - s;
    }
    return k * g.fs[0] + c * g.fs[1] + r * g.fs[2] + s * g.fs[3];
}

/* f(r, s, ih, iw) for every tap of the window at output (oh, ow) that lands inside the input
 * rather than in the padding. */
template <typename F> void for_each_tap(const Geom &g, int oh, int ow, F f) {
    for (int r = 0; r < g.r; r++) {
        const int ih = oh * g.u - g.pad_h + r * g.dil_h;
        if (ih < 0 || ih >= g.h)
            continue;
        for (int s = 0; s < g.s; s++) {
            const int iw = ow * g.v - g.pad_w + s * g.dil_w;
            if (iw < 0 || iw >= g.w)
                continue;
            f(r, s, ih, iw);
        }
    }
}

/* The backward passes' nest: f(k, gv, r, s, ih, iw) for every element gv = dy(oh, ow, k) of one
 * packed gradient image and every tap of its window. */
template <typename F> void for_each_grad_tap(const Geom &g, const std::vector<double> &gi, F f) {
    for (int oh = 0; oh < g.oh; oh++)
        for (int ow = 0; ow < g.ow; ow++)
            for (int k = 0; k < g.k; k++) {
                const double gv = gi[((size_t)oh * g.ow + ow) * g.k + k];
                for_each_tap(g, oh, ow,
                             [&](int r, int s, int ih, int iw) { f(k, gv, r, s, ih, iw); });
            }
}

/* f(k, c, r, s) for every filter element, in [k][r][s][c] order. */
template <typename F> void for_each_krsc(const Geom &g, F f) {
    for (int k = 0; k < g.k; k++)
        for (int r = 0; r < g.r; r++)
            for (int s = 0; s < g.s; s++)
                for (int c = 0; c < g.c; c++)
                    f(k, c, r, s);
}

void run_forward(const Geom g, const void *x, const void *w, void *y, float alpha, float beta) {
    const int K = g.k, C = g.c;
    std::vector<double> wt((size_t)g.r * g.s * C * K); /* [r][s][c][k] */
    for (int r = 0; r < g.r; r++)
        for (int s = 0; s < g.s; s++)
            for (int c = 0; c < C; c++)
                for (int k = 0; k < K; k++)
                    wt[(((size_t)r * g.s + s) * C + c) * K + k] =
                        load(w, filter_at(g, k, c, r, s), g);
    std::vector<double> xi, acc(K);
    for (int n = 0; n < g.n; n++) {
        pack(x, g.xs, n, g.h, g.w, C, g, xi);
        for (int oh = 0; oh < g.oh; oh++)
            for (int ow = 0; ow < g.ow; ow++) {
                std::fill(acc.begin(), acc.end(), 0.0);
                for_each_tap(g, oh, ow, [&](int r, int s, int ih, int iw) {
                    const double *xp = &xi[((size_t)ih * g.w + iw) * C];
                    const double *wp = &wt[((size_t)r * g.s + s) * C * K];
                    for (int c = 0; c < C; c++) {
                        const double xv = xp[c];
                        const double *wk = wp + (size_t)c * K;
                        for (int k = 0; k < K; k++)
                            acc[k] += xv * wk[k];
                    }
                });
                const int64_t yo = n * g.ys[0] + oh * g.ys[2] + ow * g.ys[3];
                for (int k = 0; k < K; k++)
                    store(y, yo + k * g.ys[1], acc[k], alpha, beta, g.bf16);
            }
    }
}

void run_backward_data(const Geom g, const void *w, const void *dy, void *dx, float alpha,
                       float beta) {
    const int C = g.c;
    std::vector<double> wk((size_t)g.k * g.r * g.s * C); /* [k][r][s][c] */
    size_t i = 0;
    for_each_krsc(
        g, [&](int k, int c, int r, int s) { wk[i++] = load(w, filter_at(g, k, c, r, s), g); });
    std::vector<double> gi, acc((size_t)g.h * g.w * C); /* [h][w][c] of one image */
    for (int n = 0; n < g.n; n++) {
        pack(dy, g.ys, n, g.oh, g.ow, g.k, g, gi);
        std::fill(acc.begin(), acc.end(), 0.0);
        for_each_grad_tap(g, gi, [&](int k, double gv, int r, int s, int ih, int iw) {
            double *ap = &acc[((size_t)ih * g.w + iw) * C];
            const double *wp = &wk[(((size_t)k * g.r + r) * g.s + s) * C];
            for (int c = 0; c < C; c++)
                ap[c] += gv * wp[c];
        });
        for (int ih = 0; ih < g.h; ih++)
            for (int iw = 0; iw < g.w; iw++)
                for (int c = 0; c < C; c++)
                    store(dx, n * g.xs[0] + c * g.xs[1] + ih * g.xs[2] + iw * g.xs[3],
                          acc[((size_t)ih * g.w + iw) * C + c], alpha, beta, g.bf16);
    }
}

void run_backward_filter(const Geom g, const void *x, const void *dy, void *dw, float alpha,
                         float beta) {
    const int C = g.c;
    std::vector<double> acc((size_t)g.k * g.r * g.s * C, 0.0); /* [k][r][s][c], effective filter */
    std::vector<double> xi, gi;
    for (int n = 0; n < g.n; n++) {
        pack(x, g.xs, n, g.h, g.w, C, g, xi);
        pack(dy, g.ys, n, g.oh, g.ow, g.k, g, gi);
        for_each_grad_tap(g, gi, [&](int k, double gv, int r, int s, int ih, int iw) {
            const double *xp = &xi[((size_t)ih * g.w + iw) * C];
            double *ap = &acc[(((size_t)k * g.r + r) * g.s + s) * C];
            for (int c = 0; c < C; c++)
                ap[c] += gv * xp[c];
        });
    }
    size_t i = 0;
    for_each_krsc(g, [&](int k, int c, int r, int s) {
        store(dw, filter_at(g, k, c, r, s), acc[i++], alpha, beta, g.bf16);
    });
}

/* ---- the three compute calls share their checks ---- */

bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return na && nb && pa < pb + nb && pb < pa + na;
}

struct Operand {
    const void *p;
    size_t bytes;
    const char *name;
};

/* Device-memory and aliasing checks (a GPU would fault or compute garbage). */
void check_memory(const char *fn, const Operand &in1, const Operand &in2, const Operand &out,
                  const void *ws, size_t ws_size) {
    for (const Operand *o : {&in1, &in2, &out})
        if (!emu::is_device(o->p, o->bytes))
            emu::fail("%s: %s = %p (%zu bytes by its descriptor) is not all inside one device "
                      "allocation",
                      fn, o->name, o->p, o->bytes);
    if (ws_size && !emu::is_device(ws, ws_size))
        emu::fail("%s: the workspace [%p, +%zu bytes) is not all inside one device allocation",
                  fn, ws, ws_size);
    for (const Operand *o : {&in1, &in2})
        if (overlap(o->p, o->bytes, out.p, out.bytes))
            emu::fail("%s: the output %s overlaps the input %s (cuDNN convolutions are not "
                      "in-place)",
                      fn, out.name, o->name);
    for (const Operand *o : {&in1, &in2, &out})
        if (overlap(o->p, o->bytes, ws, ws_size))
            emu::fail("%s: the workspace [%p, +%zu bytes) overlaps %s", fn, ws, ws_size, o->name);
}

/* The algorithm checks of the workspace queries and the compute calls; a stale heuristics entry
 * (stale_algo) passes the query and fails the compute call. */
cudnnStatus_t check_algo(const char *fn, Dir d, int algo, const Geom &g, bool compute) {
    if (algo < 0 || algo >= algo_count(d))
        return err(CUDNN_STATUS_BAD_PARAM, "%s: algorithm %d is not an enumerant", fn, algo);
    if (!compute && algo == stale_algo(d, g))
        return CUDNN_STATUS_SUCCESS;
    if (const char *why = unsupported(d, algo, g))
        return err(CUDNN_STATUS_NOT_SUPPORTED, "%s: algorithm %d: %s%s", fn, algo, why,
                   algo == stale_algo(d, g)
                       ? " (the heuristics ranked it first: a stale entry, see "
                         "MGT_EMU_CUDNN_STALE)"
                       : "");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_call(const char *fn, Dir d, int algo, const Geom &g, const void *alpha,
                         const void *beta, const void *in1, const void *in2, const void *out,
                         const void *ws, size_t ws_size) {
    if (!alpha || !beta || !in1 || !in2 || !out)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: a NULL data pointer or scaling factor", fn);
    const cudnnStatus_t st = check_algo(fn, d, algo, g, true);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const size_t need = ws_bytes(d, algo, g.math, g);
    if (ws_size < need || (need && !ws))
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: algorithm %d with math type %d needs a workspace of %zu bytes; %zu given "
                   "at %p (cudnnGet*WorkspaceSize with the same descriptors and math type)",
                   fn, algo, (int)g.math, need, ws_size, ws);
    if (emu::is_device(alpha, 4) || emu::is_device(beta, 4))
        emu::fail("%s: alpha (%p) or beta (%p) is device memory; cuDNN reads them on the host", fn,
                  alpha, beta);
    return CUDNN_STATUS_SUCCESS;
}

void scribble(void *ws, size_t bytes) {
    if (ws && bytes)
        std::memset(ws, 0xff, bytes);
}

/* What tells the three compute calls apart: their name, their operands (two inputs, then the
 * output, each with its name and its element count) and the loops that compute. */
struct Direction {
    const char *fn;
    const char *names[3];
    size_t (*elems[3])(const Geom &);
    void (*run)(const Geom, const void *, const void *, void *, float, float);
};
const Direction directions[3] = {
    {"cudnnConvolutionForward", {"x", "w", "y"}, {x_elems, w_elems, y_elems}, run_forward},
    {"cudnnConvolutionBackwardData", {"w", "dy", "dx"}, {w_elems, y_elems, x_elems},
     run_backward_data},
    {"cudnnConvolutionBackwardFilter", {"x", "dy", "dw"}, {x_elems, y_elems, w_elems},
     run_backward_filter},
};

/* A compute call: x, w, y are the descriptors as geometry() takes them; in1, in2 and out the
 * data, in the order of the Direction. */
cudnnStatus_t convolve(Dir d, cudnnHandle_t handle, const cudnnTensorStruct *x,
                       const cudnnFilterStruct *w, const cudnnConvolutionStruct *cd,
                       const cudnnTensorStruct *y, int algo, const void *alpha, const void *beta,
                       const void *in1, const void *in2, void *out, void *ws, size_t ws_size) {
    const Direction &dir = directions[d];
    const char *fn = dir.fn;
    Geom g;
    cudnnStatus_t st = geometry(fn, d, true, handle, x, w, cd, y, &g);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_call(fn, d, algo, g, alpha, beta, in1, in2, out, ws, ws_size);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const size_t es = g.bf16 ? 2 : 4; /* bytes per element */
    check_memory(fn, {in1, dir.elems[0](g) * es, dir.names[0]},
                 {in2, dir.elems[1](g) * es, dir.names[1]},
                 {out, dir.elems[2](g) * es, dir.names[2]}, ws, ws_size);
    const float a = *(const float *)alpha, b = *(const float *)beta;
    const void *p1 = in1, *p2 = in2;
    void *po = out;
    const auto run = dir.run;
    emu::library_call_in_capture("cudnn", handle->stream);
    const cudaError_t queued = emu::enqueue(
        handle->stream,
        [=]() {
            scribble(ws, ws_size);
            run(g, p1, p2, po, a, b);
        },
        fn);
    if (queued != cudaSuccess) /* a stream capture CUDA invalidated refused its kernels */
        return err(CUDNN_STATUS_EXECUTION_FAILED_CUDART,
                   "%s: a CUDA runtime call failed (error %d)", fn, (int)queued);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_handle(cudnnHandle_t h, const char *fn) {
    if (!h)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", fn);
    require_live(h, fn, "cudnnHandle_t");
    return CUDNN_STATUS_SUCCESS;
}

/* ---- what the cudnnCreate*, cudnnDestroy*Descriptor and cudnnSet*4dDescriptor calls share ---- */

/* `what` names the output pointer in the message. */
template <typename T> cudnnStatus_t create_live(T **out, const char *fn, const char *what) {
    if (!out)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL %s", fn, what);
    T *t = new T{};
    live.add(t);
    *out = t;
    return CUDNN_STATUS_SUCCESS;
}

/* NULL is allowed; anything else must be live. */
template <typename T> cudnnStatus_t destroy_desc(T *d, const char *fn, const char *what) {
    if (!d)
        return CUDNN_STATUS_SUCCESS;
    if (!live.remove(d))
        emu::fail("%s: %p is not a live %s (destroyed twice?)", fn, (void *)d, what);
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

/* A tensor's (n, c, h, w) or a filter's (k, c, r, s), packed: NCHW stores them in that order,
 * NHWC with the channels innermost. `formats` names the accepted formats in the message; only
 * tensors (`limit_elems`) are limited to 2^31 elements. */
template <typename D>
cudnnStatus_t set_4d(const char *fn, D *d, const char *what, const char *formats, bool limit_elems,
                     cudnnTensorFormat_t format, cudnnDataType_t type, const int (&dim)[4]) {
    if (!d)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", fn);
    require_live(d, fn, what);
    const int n = dim[0], c = dim[1], h = dim[2], w = dim[3];
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: dimensions %d, %d, %d, %d must be positive", fn,
                   n, c, h, w);
    if (!valid_type(type))
        return err(CUDNN_STATUS_BAD_PARAM, "%s: data type %d is not an enumerant", fn, (int)type);
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: format %d is not %s (NCHW_VECT_C is for vectorised integer types only)",
                   fn, (int)format, formats);
    if (limit_elems) {
        const int64_t total = (int64_t)n * c * h * w;
        if (total > INT32_MAX)
            return err(CUDNN_STATUS_NOT_SUPPORTED, "%s: %lld elements exceed the 2^31 limit", fn,
                       (long long)total);
    }
    const int64_t nchw[4] = {(int64_t)c * h * w, (int64_t)h * w, w, 1},
                  nhwc[4] = {(int64_t)h * w * c, 1, (int64_t)w * c, c};
    const int64_t *st = format == CUDNN_TENSOR_NCHW ? nchw : nhwc;
    d->set = true;
    d->type = type;
    d->format = format;
    std::copy(st, st + 4, d->stride);
    d->set_dims(dim);
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

extern "C" {

const char *cudnnGetErrorString(cudnnStatus_t status) {
    switch ((int)status) {
#define NAME(s)                                                                                    \
    case s:                                                                                        \
        return #s;
        NAME(CUDNN_STATUS_SUCCESS)
        NAME(CUDNN_STATUS_NOT_INITIALIZED)
        NAME(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
        NAME(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH)
        NAME(CUDNN_STATUS_DEPRECATED)
        NAME(CUDNN_STATUS_LICENSE_ERROR)
        NAME(CUDNN_STATUS_RUNTIME_IN_PROGRESS)
        NAME(CUDNN_STATUS_RUNTIME_FP_OVERFLOW)
        NAME(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
        NAME(CUDNN_STATUS_BAD_PARAM)
        NAME(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
        NAME(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
        NAME(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
        NAME(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
        NAME(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
        NAME(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH)
        NAME(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
        NAME(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
        NAME(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE)
        NAME(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH)
        NAME(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
        NAME(CUDNN_STATUS_NOT_SUPPORTED)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_PADDING)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE)
        NAME(CUDNN_STATUS_INTERNAL_ERROR)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED)
        NAME(CUDNN_STATUS_EXECUTION_FAILED)
        NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
        NAME(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS)
        NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
        NAME(CUDNN_STATUS_EXECUTION_FAILED_CURAND)
        NAME(CUDNN_STATUS_INVALID_VALUE)
#undef NAME
    }
    return "CUDNN_UNKNOWN_STATUS";
}

void cudnnGetLastErrorString(char *message, size_t max_size) {
    if (!message || max_size == 0)
        return;
    std::snprintf(message, max_size, "%s", last_error);
    last_error[0] = '\0';
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
    return create_live(handle, "cudnnCreate", "handle pointer");
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    const cudnnStatus_t st = check_handle(handle, "cudnnDestroy");
    if (st == CUDNN_STATUS_SUCCESS)
        emu::destroy_handle(live, handle);
    return st;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
    const cudnnStatus_t st = check_handle(handle, "cudnnSetStream");
    if (st == CUDNN_STATUS_SUCCESS)
        handle->stream = streamId;
    return st;
}

/* ---- tensor, filter and convolution descriptors ---- */

/* cudnnCreate<Kind>Descriptor and cudnnDestroy<Kind>Descriptor differ only in the kind. */
#define LIFETIME(Kind, what)                                                                       \
    cudnnStatus_t cudnnCreate##Kind##Descriptor(cudnn##Kind##Descriptor_t *desc) {                 \
        return create_live(desc, "cudnnCreate" #Kind "Descriptor", "pointer");                     \
    }                                                                                              \
    cudnnStatus_t cudnnDestroy##Kind##Descriptor(cudnn##Kind##Descriptor_t desc) {                 \
        return destroy_desc(desc, "cudnnDestroy" #Kind "Descriptor", what);                        \
    }
LIFETIME(Tensor, "tensor descriptor")
LIFETIME(Filter, "filter descriptor")
LIFETIME(Convolution, "convolution descriptor")
#undef LIFETIME

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                         cudnnTensorFormat_t format, cudnnDataType_t dataType,
                                         int n, int c, int h, int w) {
    return set_4d("cudnnSetTensor4dDescriptor", tensorDesc, "tensor descriptor", "NCHW or NHWC",
                  true, format, dataType, {n, c, h, w});
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc,
                                         cudnnDataType_t dataType, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w) {
    return set_4d("cudnnSetFilter4dDescriptor", filterDesc, "filter descriptor",
                  "NCHW (KCRS) or NHWC (KRSC)", false, format, dataType, {k, c, h, w});
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
    const char *fn = "cudnnSetConvolution2dDescriptor";
    if (!convDesc)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", fn);
    require_live(convDesc, fn, "convolution descriptor");
    if (pad_h < 0 || pad_w < 0)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: negative padding %d, %d", fn, pad_h, pad_w);
    if (u <= 0 || v <= 0)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: strides %d, %d must be positive", fn, u, v);
    if (dilation_h <= 0 || dilation_w <= 0)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: dilations %d, %d must be positive", fn,
                   dilation_h, dilation_w);
    if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: mode %d is not an enumerant", fn, (int)mode);
    if (!valid_type(computeType))
        return err(CUDNN_STATUS_BAD_PARAM, "%s: compute type %d is not an enumerant", fn,
                   (int)computeType);
    cudnnConvolutionStruct *d = convDesc;
    d->set = true;
    d->pad_h = pad_h;
    d->pad_w = pad_w;
    d->u = u;
    d->v = v;
    d->dil_h = dilation_h;
    d->dil_w = dilation_w;
    d->mode = mode;
    d->compute = computeType;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
                                          cudnnMathType_t mathType) {
    const char *fn = "cudnnSetConvolutionMathType";
    if (!convDesc)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", fn);
    require_live(convDesc, fn, "convolution descriptor");
    if (!valid_math(mathType))
        return err(CUDNN_STATUS_BAD_PARAM, "%s: math type %d is not an enumerant", fn,
                   (int)mathType);
    convDesc->math = mathType;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc,
                                                    int *n, int *c, int *h, int *w) {
    const char *fn = "cudnnGetConvolution2dForwardOutputDim";
    if (!convDesc || !inputTensorDesc || !filterDesc || !n || !c || !h || !w)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: a NULL descriptor or output pointer", fn);
    require_live(convDesc, fn, "convolution descriptor");
    require_live(inputTensorDesc, fn, "tensor descriptor");
    require_live(filterDesc, fn, "filter descriptor");
    const cudnnTensorStruct *x = inputTensorDesc;
    const cudnnFilterStruct *f = filterDesc;
    const cudnnConvolutionStruct *d = convDesc;
    if (!x->set || !f->set || !d->set)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: a descriptor was created but never set", fn);
    cudnnStatus_t st = check_in_channels(fn, "the input", x, f);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_window(fn, x, f, d);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    *n = x->n;
    *c = f->k;
    *h = out_dim(x->h, d->pad_h, f->r, d->dil_h, d->u);
    *w = out_dim(x->w, d->pad_w, f->s, d->dil_w, d->v);
    return CUDNN_STATUS_SUCCESS;
}

} // extern "C"

/* ---- heuristics and workspace sizes ---- */

namespace {

/* The first `requested` entries of list into a direction's perf results (their types differ in
 * the algorithm's enum only). */
template <typename P>
void put_perf(const std::vector<Perf> &list, int requested, int *returned, P *perf) {
    const int cnt = std::min(requested, (int)list.size());
    for (int i = 0; i < cnt; i++) {
        P p;
        std::memset(&p, 0, sizeof p);
        p.algo = (decltype(p.algo))list[i].algo;
        p.status = list[i].status;
        p.time = list[i].time;
        p.memory = list[i].memory;
        p.determinism = list[i].determinism;
        p.mathType = list[i].math;
        perf[i] = p;
    }
    *returned = cnt;
}

template <typename P>
cudnnStatus_t fill_perf(const char *fn, Dir d, cudnnHandle_t handle, const cudnnTensorStruct *x,
                        const cudnnFilterStruct *w, const cudnnConvolutionStruct *cd,
                        const cudnnTensorStruct *y, int requested, int *returned, P *perf) {
    if (requested <= 0 || !returned || !perf)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: requestedAlgoCount %d must be positive and the outputs non-NULL", fn,
                   requested);
    Geom g;
    cudnnStatus_t st = geometry(fn, d, false, handle, x, w, cd, y, &g);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    put_perf(heuristics(d, g), requested, returned, perf);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t max_count(const char *fn, Dir d, cudnnHandle_t handle, int *count) {
    const cudnnStatus_t st = check_handle(handle, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!count)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL count", fn);
    *count = algo_count(d);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t workspace(const char *fn, Dir d, cudnnHandle_t handle, const cudnnTensorStruct *x,
                        const cudnnFilterStruct *w, const cudnnConvolutionStruct *cd,
                        const cudnnTensorStruct *y, int algo, size_t *size) {
    if (!size)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL sizeInBytes", fn);
    Geom g;
    cudnnStatus_t st = geometry(fn, d, false, handle, x, w, cd, y, &g);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    st = check_algo(fn, d, algo, g, false);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    *size = ws_bytes(d, algo, g.math, g);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- Find: every algorithm run on the caller's buffers and timed ----
 * cudnnFind*AlgorithmEx runs each algorithm the descriptors allow on the given data and
 * workspace and returns them fastest first. The emulation computes the output once (every
 * algorithm gives the same result here) and reports, for each algorithm that runs, the time of
 * a model of an H100-class GPU: the products at a rate per algorithm and layout (tensor-core
 * math far above the rest; Winograd and FFT above the implicit GEMMs for the shapes they take;
 * NCHW float above NHWC float, whose kernels are few), plus a launch. The ordering is what the
 * caller's choice is tested against; MGT_EMU_CUDNN_FASTEST=nchw (or nhwc) makes that layout's
 * algorithms a million times faster than the other's (the NCHW copies, timed by the caller on
 * this host, cost far less than that), so that a caller choosing between layouts by
 * measurement can be made to take either. An algorithm the shape or layout does not
 * allow (a stale heuristics entry included: Find runs it, and it refuses) and one needing more
 * workspace than given are listed after the rest with a failure status and time -1. */
double model_ms(Dir d, int a, const Geom &g) {
    const double flops = 2.0 * g.n * g.k * g.c * g.r * g.s * g.oh * g.ow;
    const bool nchw = g.nchw_x && g.nchw_y && g.nchw_w;
    double tflops;
    switch (kind(d, a)) {
    case K_PRECOMP:
        tflops = tensor_op_math(g.math) || g.bf16 ? 300 : nchw ? 20 : 12;
        break;
    case K_GEMM:
        tflops = d != FWD && (tensor_op_math(g.math) || g.bf16) ? 250 : nchw ? 15 : 10;
        break;
    case K_IMPLICIT:
        tflops = 8;
        break;
    case K_ATOMIC:
        tflops = 18;
        break;
    case K_WINO:
        tflops = 45;
        break;
    case K_WINO_NF:
        tflops = 35;
        break;
    case K_FFT:
    case K_FFT_TILING:
        tflops = g.r * g.s >= 25 ? 40 : 10;
        break;
    default:
        tflops = 1;
    }
    double ms = 0.004 + flops / (tflops * 1e12) * 1e3;
    const char *fast = std::getenv("MGT_EMU_CUDNN_FASTEST");
    if (fast && ((!std::strcmp(fast, "nchw") && !nchw) || (!std::strcmp(fast, "nhwc") && nchw)))
        ms *= 1e6; /* far beyond the copies' cost, which is measured on this host */
    return ms;
}

template <typename P>
cudnnStatus_t find_ex(Dir d, cudnnHandle_t handle, const cudnnTensorStruct *x,
                      const cudnnFilterStruct *w, const cudnnConvolutionStruct *cd,
                      const cudnnTensorStruct *y, const void *in1, const void *in2, void *out,
                      int requested, int *returned, P *perf, void *ws, size_t ws_size) {
    static const char *const names[3] = {"cudnnFindConvolutionForwardAlgorithmEx",
                                         "cudnnFindConvolutionBackwardDataAlgorithmEx",
                                         "cudnnFindConvolutionBackwardFilterAlgorithmEx"};
    const char *fn = names[d];
    const Direction &dir = directions[d];
    if (requested <= 0 || !returned || !perf || !in1 || !in2 || !out)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: requestedAlgoCount %d must be positive and the pointers non-NULL", fn,
                   requested);
    Geom g;
    cudnnStatus_t st = geometry(fn, d, true, handle, x, w, cd, y, &g);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const size_t es = g.bf16 ? 2 : 4;
    check_memory(fn, {in1, dir.elems[0](g) * es, dir.names[0]},
                 {in2, dir.elems[1](g) * es, dir.names[1]},
                 {out, dir.elems[2](g) * es, dir.names[2]}, ws, ws_size);
    std::vector<Perf> ok, bad;
    const int *rank = rank_of(d);
    for (int i = 0; i < algo_count(d); i++) {
        const int a = rank[i];
        Perf p{};
        p.algo = a;
        p.determinism = deterministic(d, a) ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
        p.math = entry_math(d, a, g);
        p.memory = ws_bytes(d, a, p.math, g);
        if (unsupported(d, a, g)) {
            p.status = CUDNN_STATUS_NOT_SUPPORTED;
            p.time = -1.0f;
            p.memory = 0;
            bad.push_back(p);
        } else if (p.memory > ws_size) {
            p.status = CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT;
            p.time = -1.0f;
            bad.push_back(p);
        } else {
            p.status = CUDNN_STATUS_SUCCESS;
            p.time = (float)model_ms(d, a, g);
            ok.push_back(p);
        }
    }
    std::stable_sort(ok.begin(), ok.end(),
                     [](const Perf &u, const Perf &v) { return u.time < v.time; });
    ok.insert(ok.end(), bad.begin(), bad.end());
    put_perf(ok, requested, returned, perf);
    /* the algorithms ran on the caller's data: the output is written, the workspace used */
    const void *p1 = in1, *p2 = in2;
    void *po = out;
    const auto run = dir.run;
    emu::enqueue(
        handle->stream,
        [=]() {
            scribble(ws, ws_size);
            run(g, p1, p2, po, 1.0f, 0.0f);
        },
        fn);
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

extern "C" {

/* The most entries the heuristics return in a direction: every algorithm of it. */
cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int *count) {
    return max_count("cudnnGetConvolutionForwardAlgorithmMaxCount", FWD, handle, count);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int *count) {
    return max_count("cudnnGetConvolutionBackwardDataAlgorithmMaxCount", BWD_DATA, handle, count);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle, int *count) {
    return max_count("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", BWD_FILTER, handle,
                     count);
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle,
                                                     const cudnnTensorDescriptor_t srcDesc,
                                                     const cudnnFilterDescriptor_t filterDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t destDesc,
                                                     const int requestedAlgoCount,
                                                     int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults) {
    return fill_perf("cudnnGetConvolutionForwardAlgorithm_v7", FWD, handle, srcDesc, filterDesc,
                     convDesc, destDesc, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults) {
    return fill_perf("cudnnGetConvolutionBackwardDataAlgorithm_v7", BWD_DATA, handle, gradDesc,
                     filterDesc, convDesc, diffDesc, requestedAlgoCount, returnedAlgoCount,
                     perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnFilterDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults) {
    return fill_perf("cudnnGetConvolutionBackwardFilterAlgorithm_v7", BWD_FILTER, handle, srcDesc,
                     gradDesc, convDesc, diffDesc, requestedAlgoCount, returnedAlgoCount,
                     perfResults);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
                                                      const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *sizeInBytes) {
    return workspace("cudnnGetConvolutionForwardWorkspaceSize", FWD, handle, xDesc, wDesc,
                     convDesc, yDesc, (int)algo, sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes) {
    return workspace("cudnnGetConvolutionBackwardDataWorkspaceSize", BWD_DATA, handle, dxDesc,
                     wDesc, convDesc, dyDesc, (int)algo, sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes) {
    return workspace("cudnnGetConvolutionBackwardFilterWorkspaceSize", BWD_FILTER, handle, xDesc,
                     gradDesc, convDesc, dyDesc, (int)algo, sizeInBytes);
}

/* ---- compute ---- */

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                      const cudnnTensorDescriptor_t xDesc, const void *x,
                                      const cudnnFilterDescriptor_t wDesc, const void *w,
                                      const cudnnConvolutionDescriptor_t convDesc,
                                      cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                      size_t workSpaceSizeInBytes, const void *beta,
                                      const cudnnTensorDescriptor_t yDesc, void *y) {
    return convolve(FWD, handle, xDesc, wDesc, convDesc, yDesc, (int)algo, alpha, beta, x, w, y,
                    workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                           const cudnnFilterDescriptor_t wDesc, const void *w,
                                           const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *workSpace,
                                           size_t workSpaceSizeInBytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxDesc, void *dx) {
    return convolve(BWD_DATA, handle, dxDesc, wDesc, convDesc, dyDesc, (int)algo, alpha, beta, w,
                    dy, dx, workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void *x,
                                             const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             const cudnnFilterDescriptor_t dwDesc, void *dw) {
    return convolve(BWD_FILTER, handle, xDesc, dwDesc, convDesc, dyDesc, (int)algo, alpha, beta,
                    x, dy, dw, workSpace, workSpaceSizeInBytes);
}

/* ---- Find (see find_ex) ---- */

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t yDesc, void *y, const int requestedAlgoCount,
    int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace,
    size_t workSpaceSizeInBytes) {
    return find_ex(FWD, handle, xDesc, wDesc, convDesc, yDesc, x, w, y, requestedAlgoCount,
                   returnedAlgoCount, perfResults, workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const void *w,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes) {
    return find_ex(BWD_DATA, handle, dxDesc, wDesc, convDesc, dyDesc, w, dy, dx,
                   requestedAlgoCount, returnedAlgoCount, perfResults, workSpace,
                   workSpaceSizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void *dw,
    const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults, void *workSpace,
    size_t workSpaceSizeInBytes) {
    return find_ex(BWD_FILTER, handle, xDesc, dwDesc, convDesc, dyDesc, x, dy, dw,
                   requestedAlgoCount, returnedAlgoCount, perfResults, workSpace,
                   workSpaceSizeInBytes);
}

size_t cudnnGetVersion(void) {
    return CUDNN_VERSION;
}

} // extern "C"
