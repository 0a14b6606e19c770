/* cpu_backend.c: the CPU reference backend's op table ("cpu"), its life cycle (init/destroy),
 * memory (host memory: calloc/free/memcpy), the scratch buffer, dense layers and the Flatten
 * layout changes. The other ops live in the sibling files listed in cpu_internal.h.
 *
 * This backend is the reference the GPU one is compared against, so every op follows backend.h
 * literally; speed comes from OpenBLAS (every matrix product but Winograd's goes to cblas_sgemm,
 * split across the lanes by mgt_cpu_gemm) and from plain loops the compiler can vectorise. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../exactsum.h"
#include "cpu_internal.h"

/* ---- memory ---------------------------------------------------------------------------- */

static void *cpu_alloc(mgt_backend *be, size_t bytes) {
    (void)be;
    return calloc(1, bytes ? bytes : 1); /* never NULL for 0 bytes: NULL means "out of memory" */
}

static void cpu_free(mgt_backend *be, void *p) {
    (void)be;
    free(p);
}

/* Host to host: the three transfers are copies. memmove so that an accidental overlap is
 * harmless; bytes == 0 may come with NULL pointers, which memcpy/memmove must not see. */
static void cpu_copy(mgt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes)
        memmove(dst, src, bytes);
}

static void cpu_zero(mgt_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes)
        memset(p, 0, bytes);
}

static void cpu_sync(mgt_backend *be) {
    (void)be;
}

/* Grows the scratch buffer to at least `bytes` (never shrinks it). The old content is not kept:
 * scratch only lives within one op call. On failure the old buffer stays and -1 is returned. */
static int cpu_reserve(mgt_backend *be, size_t bytes) {
    mgt_cpu_impl *im = mgt_cpu_impl_of(be);
    if (bytes <= im->scratch_bytes)
        return 0;
    size_t rounded = (bytes + 63) & ~(size_t)63; /* aligned_alloc wants a multiple of 64 */
    if (rounded < bytes)
        return -1; /* overflow */
    float *p = aligned_alloc(64, rounded);
    if (!p)
        return -1;
    free(im->scratch);
    im->scratch = p;
    im->scratch_bytes = rounded;
    return 0;
}

static void cpu_destroy(mgt_backend *be) {
    mgt_cpu_impl *im = mgt_cpu_impl_of(be);
    if (im) {
        mgt_cpu_lanes_destroy(im->lanes);
        free(im->scratch);
        free(im);
    }
    be->impl = NULL;
    be->ops = NULL;
}

/* ---- shared helper ----------------------------------------------------------------------- */

/* Column sums of a rows x cols matrix in double, into out (NULL: none). Columns are taken in
 * blocks of up to 256 so that the accumulators stay on the stack (ops must not allocate) while
 * each row is still read contiguously. With y (the same shape), each row is first masked in
 * place, m = y > 0 ? m : 0 (a ReLU's gradient, act_bwd's), and the masked values summed; without
 * it m is only read. */
MGT_SIMD
static void colsum_masked(size_t rows, int cols, const float *y, float *m, float *out) {
    enum { BLOCK = 256 };
    double acc[BLOCK];
    for (int c0 = 0; c0 < cols; c0 += BLOCK) {
        const int nc = cols - c0 < BLOCK ? cols - c0 : BLOCK;
        for (int j = 0; j < nc; j++)
            acc[j] = 0.0;
        for (size_t r = 0; r < rows; r++) {
            float *restrict row = m + r * (size_t)cols + c0;
            if (y) {
                const float *restrict yr = y + r * (size_t)cols + c0;
                for (int j = 0; j < nc; j++)
                    row[j] = mgt_cpu_keep_if(row[j], yr[j] > 0.0f);
            }
            for (int j = 0; j < nc; j++)
                acc[j] += row[j];
        }
        if (out)
            for (int j = 0; j < nc; j++)
                out[c0 + j] = (float)acc[j];
    }
}

void mgt_cpu_colsum(size_t rows, int cols, const float *m, float *out) {
    colsum_masked(rows, cols, NULL, (float *)m, out); /* read only, without a mask */
}

/* ---- dense ------------------------------------------------------------------------------- */

/* A dense layer's bias gradient (mgt_ops.dense_bias_grad): one pass over dy where act_bwd and
 * dense_bwd made two, summed as mgt_cpu_colsum sums (colsum_masked). On the calling lane: split
 * in parts of columns over two lanes it took 104-123 us a call for the MLP's 256 x 256
 * gradients, against some 30 here (each part's rows, 128 bytes every 1 KB, came from the other
 * core's cache, where the product before wrote them). */
static void cpu_dense_bias_grad(mgt_backend *be, int n, int out, const float *y, float *dy,
                                float *db) {
    (void)be;
    if (n > 0 && out > 0)
        colsum_masked((size_t)n, out, y, dy, db);
    else if (db && out > 0)
        memset(db, 0, sizeof(float) * (size_t)out);
}

/* y[n][out] = act(x[n][in] * W^T + b), act none or ReLU: each lane's part of y starts as the
 * bias (the GEMM adds onto it, beta = 1) and takes the ReLU once its product is done, while it
 * is in cache (mgt_cpu_gemm_epi): no pass of its own for either, nor a lane left waiting while
 * the other copies or rectifies. */
static void dense_fwd(mgt_backend *be, mgt_act act, int n, int in, int out, const float *x,
                      const float *w, const float *b, float *y) {
    if (n <= 0 || out <= 0)
        return;
    if (in <= 0) {
        for (int i = 0; i < n; i++)
            if (b)
                memcpy(y + (size_t)i * out, b, sizeof(float) * (size_t)out);
            else
                memset(y + (size_t)i * out, 0, sizeof(float) * (size_t)out);
        if (act == MGT_ACT_RELU)
            mgt_cpu_relu_rows(n, out, out, y);
        return;
    }
    const mgt_cpu_gemm_args a = {CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in,
                                 0.0f, y, out};
    const mgt_cpu_gemm_epi e = {.bias = b, .relu = act == MGT_ACT_RELU};
    mgt_cpu_gemm_with(mgt_cpu_impl_of(be)->lanes, &a, &e);
}

void mgt_cpu_dense_fwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *b, float *y) {
    dense_fwd(be, MGT_ACT_NONE, n, in, out, x, w, b, y);
}

static void cpu_dense_fwd_relu(mgt_backend *be, int n, int in, int out, const float *x,
                               const float *w, const float *b, float *y) {
    dense_fwd(be, MGT_ACT_RELU, n, in, out, x, w, b, y);
}

/* Rows r0 .. r1 - 1 of dW = dy^T * x: those columns of dy (a row stride of `out`) times x. With
 * n == 0 the GEMM would have an empty inner dimension, which BLAS implementations treat
 * inconsistently, so the rows are zeroed by hand instead. */
void mgt_cpu_dense_bwd_rows(mgt_backend *be, int n, int in, int out, int r0, int r1,
                            const float *x, const float *dy, float *dw) {
    if (r1 <= r0 || in <= 0)
        return;
    float *rows = dw + (size_t)r0 * in;
    if (n <= 0) {
        memset(rows, 0, sizeof(float) * (size_t)(r1 - r0) * in);
        return;
    }
    mgt_cpu_gemm(mgt_cpu_impl_of(be)->lanes, CblasTrans, CblasNoTrans, r1 - r0, in, n, 1.0f,
                 dy + r0, out, x, in, 0.0f, rows, in);
}

/* dx = dy * W, dW = dy^T * x, db = column sums of dy; with x_relu, dx then masked,
 * x > 0 ? dx : 0 (the gradient of the ReLU that wrote x), by the lane that computed it. */
static void dense_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                      const float *dy, float *dx, float *dw, float *db, int x_relu) {
    mgt_cpu_lanes *lanes = mgt_cpu_impl_of(be)->lanes;
    if (n < 0)
        n = 0;
    if (db)
        mgt_cpu_colsum((size_t)n, out, dy, db);
    if (in <= 0 || out <= 0) {
        if (dx && n > 0 && in > 0)
            memset(dx, 0, sizeof(float) * (size_t)n * in);
        return;
    }
    const mgt_cpu_gemm_args gx = {CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w, in,
                                  0.0f, dx, in};
    const mgt_cpu_gemm_epi epi = {.mask = x_relu ? x : NULL}; /* x is laid out as dx */
    if (dw && dx && n > 0) {
        const mgt_cpu_gemm_args gw = {CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in,
                                      0.0f, dw, in};
        mgt_cpu_gemm_pair(lanes, &gw, &gx, &epi);
        return;
    }
    if (dw)
        mgt_cpu_dense_bwd_rows(be, n, in, out, 0, out, x, dy, dw);
    if (dx && n > 0)
        mgt_cpu_gemm_with(lanes, &gx, &epi);
}

void mgt_cpu_dense_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *dy, float *dx, float *dw, float *db) {
    dense_bwd(be, n, in, out, x, w, dy, dx, dw, db, 0);
}

static void cpu_dense_bwd_x_relu(mgt_backend *be, int n, int in, int out, const float *x,
                                 const float *w, const float *dy, float *dx, float *dw,
                                 float *db) {
    dense_bwd(be, n, in, out, x, w, dy, dx, dw, db, 1);
}

/* ---- Flatten layout ---------------------------------------------------------------------- */

/* One sample is a [hw][c] matrix in NHWC and its transpose [c][hw] in CHW. The transpose goes
 * by 32x32 tiles so that both the reads and the writes stay within a few cache lines. */
static void transpose_tiled(size_t rows, size_t cols, const float *restrict src,
                            float *restrict dst) {
    enum { T = 32 };
    for (size_t r0 = 0; r0 < rows; r0 += T) {
        const size_t r1 = r0 + T < rows ? r0 + T : rows;
        for (size_t c0 = 0; c0 < cols; c0 += T) {
            const size_t c1 = c0 + T < cols ? c0 + T : cols;
            for (size_t r = r0; r < r1; r++)
                for (size_t c = c0; c < c1; c++)
                    dst[c * rows + r] = src[r * cols + c];
        }
    }
}

/* With one channel, or one pixel (mgt_nhwc_is_chw), the two orders are the same: a plain copy
 * (an MLP's 28x28x1 input is 784 one-float rows, which the tiled loop moved a float at a time, 5
 * times slower than memcpy). */

void mgt_cpu_nhwc_to_chw(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y) {
    const size_t hw = (size_t)h * w, per = hw * c;
    if (n > 0 && mgt_nhwc_is_chw(h, w, c)) {
        cpu_copy(be, y, x, sizeof(float) * per * (size_t)n);
        return;
    }
    for (int i = 0; i < n; i++)
        transpose_tiled(hw, (size_t)c, x + i * per, y + i * per);
}

void mgt_cpu_chw_to_nhwc(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y) {
    const size_t hw = (size_t)h * w, per = hw * c;
    if (n > 0 && mgt_nhwc_is_chw(h, w, c)) {
        cpu_copy(be, y, x, sizeof(float) * per * (size_t)n);
        return;
    }
    for (int i = 0; i < n; i++)
        transpose_tiled((size_t)c, hw, x + i * per, y + i * per);
}

/* ---- the table --------------------------------------------------------------------------- */

MGT_SIMD
static void cpu_add(mgt_backend *be, size_t n, const float *x, float *y) {
    (void)be;
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

static void cpu_xs_add(mgt_backend *be, size_t n, const float *x, int64_t *words, int64_t *bad) {
    (void)be;
    mgt_xs_add(n, x, words, bad);
}

static void cpu_xs_round(mgt_backend *be, size_t n, int64_t *words, float *out) {
    (void)be;
    mgt_xs_round(n, words, out);
}

static void cpu_host_for(mgt_backend *be, size_t n, size_t min_part,
                         void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx) {
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, n, min_part, fn, ctx);
}

static const mgt_ops cpu_ops = {
    .name = "cpu",
    .conv_relu = 1,
    .bn_x_relu = 1,
    .gelu = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .host_for = cpu_host_for,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .reserve = cpu_reserve,
    .destroy = cpu_destroy,
    .dense_fwd = mgt_cpu_dense_fwd,
    .dense_fwd_relu = cpu_dense_fwd_relu,
    .dense_bias_grad = cpu_dense_bias_grad,
    .dense_bwd = mgt_cpu_dense_bwd,
    .dense_bwd_x_relu = cpu_dense_bwd_x_relu,
    .dense_bwd_rows = mgt_cpu_dense_bwd_rows,
    .add = cpu_add,
    .conv2d_scratch = mgt_cpu_conv2d_scratch,
    .conv2d_fwd = mgt_cpu_conv2d_fwd,
    .conv2d_bwd = mgt_cpu_conv2d_bwd,
    .maxpool_fwd = mgt_cpu_maxpool_fwd,
    .maxpool_bwd = mgt_cpu_maxpool_bwd,
    .maxpool_bwd_relu = mgt_cpu_maxpool_bwd_relu,
    .avgpool_fwd = mgt_cpu_avgpool_fwd,
    .avgpool_bwd = mgt_cpu_avgpool_bwd,
    .bn_stats = mgt_cpu_bn_stats,
    .bn_apply = mgt_cpu_bn_apply,
    .bn_finalize = mgt_cpu_bn_finalize,
    .bn_running = mgt_cpu_bn_running,
    .bn_bwd_reduce = mgt_cpu_bn_bwd_reduce,
    .bn_bwd_apply = mgt_cpu_bn_bwd_apply,
    .dropout_fwd = mgt_cpu_dropout_fwd,
    .dropout_bwd = mgt_cpu_dropout_bwd,
    .act_fwd = mgt_cpu_act_fwd,
    .act_bwd = mgt_cpu_act_bwd,
    .xent_sparse = mgt_cpu_xent_sparse,
    .xent_dense = mgt_cpu_xent_dense,
    .elem_loss = mgt_cpu_elem_loss,
    .nhwc_to_chw = mgt_cpu_nhwc_to_chw,
    .chw_to_nhwc = mgt_cpu_chw_to_nhwc,
    .optim_step = mgt_cpu_optim_step,
    .xs_add = cpu_xs_add,
    .xs_round = cpu_xs_round,
    .clip_value = mgt_cpu_clip_value,
    .clip_norm = mgt_cpu_clip_norm,
    .add2 = mgt_cpu_add2,
    .copy_cols = mgt_cpu_copy_cols,
    .pad_fwd = mgt_cpu_pad_fwd,
    .pad_bwd = mgt_cpu_pad_bwd,
    .gap_fwd = mgt_cpu_gap_fwd,
    .gap_bwd = mgt_cpu_gap_bwd,
    .dwconv_scratch = mgt_cpu_dwconv_scratch,
    .dwconv_fwd = mgt_cpu_dwconv_fwd,
    .dwconv_bwd = mgt_cpu_dwconv_bwd,
    .dense_io_fwd = mgt_cpu_dense_io_fwd,
    .dense_io_bwd = mgt_cpu_dense_io_bwd,
    .embed_fwd = mgt_cpu_embed_fwd,
    .embed_bwd = mgt_cpu_embed_bwd,
    .layernorm_fwd = mgt_cpu_layernorm_fwd,
    .layernorm_bwd = mgt_cpu_layernorm_bwd,
    .attn_scratch = mgt_cpu_attn_scratch,
    .attn_fwd = mgt_cpu_attn_fwd,
    .attn_bwd = mgt_cpu_attn_bwd,
    .attn_decode = mgt_cpu_attn_decode,
};

int mgt_cpu_backend_init(mgt_backend *be, int threads) {
    if (!be)
        return -1;
    mgt_cpu_impl *im = calloc(1, sizeof *im);
    if (!im)
        return -1;
    im->threads = threads;
    /* The lanes: one per thread this rank was given (0: as many as OpenBLAS would use). They
     * split every pass, the GEMMs included, and OpenBLAS runs on one thread (cpu_lanes.c says
     * why). Without workers (threads unavailable) the passes still run, on the calling thread. */
    const int lanes = threads > 0 ? threads : openblas_get_num_threads();
    openblas_set_num_threads(1);
    im->lanes = mgt_cpu_lanes_create(lanes > 0 ? lanes : 1);
    be->ops = &cpu_ops;
    be->impl = im;
    be->act = MGT_F32;
    be->cancel_bias = 0; /* the reference computes every bias (fuse.c) */
    return 0;
}

void mgt_backend_destroy(mgt_backend *be) {
    if (be && be->ops && be->ops->destroy)
        be->ops->destroy(be);
}
