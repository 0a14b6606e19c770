/* cpu_convk.c: stride-1 convolution straight from NHWC activations, without a column matrix.
 *
 * im2col (cpu_conv.c) writes every input value kh*kw times into a column matrix, which OpenBLAS
 * then copies again into its own packed panels, for every chunk, and packs the weights anew for
 * every call. Here each pass is one product whose operands are read where they lie:
 *
 *   forward       y[p][o]   = b[o] + sum_{i,j,k} x[p + (i, j)][k] * W[o][k][i][j]
 *   backward data dx[p][k]  = sum_{i,j,o} dy[p - (i, j)][o] * W[o][k][i][j]
 *   backward filt dW[o][k][i][j] = sum_p x[p + (i, j)][k] * dy[p][o]
 *
 * The two first are the same correlation (cv_row below): a block of up to RM consecutive output
 * pixels of one row (12 with AVX-512's 32 registers, else 6) by CK_N output channels keeps its
 * sums in registers over every tap (i, j) and every input channel k; each step loads CK_N weights
 * (packed once per call, CK_N channels wide) and broadcasts one input value per pixel, read from
 * the NHWC row itself (pixel p's window row starts at p + j, its channels are contiguous).
 * Backward data is the forward correlation of dy with the window turned round and the channel
 * roles swapped; dy is read from a copy of the sample with zero columns at both ends, where the
 * window leaves it (a padded forward input likewise), and rows outside are skipped.
 * Backward filter (cv_dw) keeps up to RM input channels by CK_N output channels of one tap in
 * registers and runs over a sample's pixels: a broadcast of x and CK_N values of dy per pixel.
 * Where the scratch has room, each lane first copies the blocks of a sample its parts read, x as
 * [channel block][pixel][RM] and dy as [output block][pixel][CK_N], so that the kernel reads both
 * contiguously, as the other passes read their packed weights, instead of a few floats of every
 * pixel's row of c (or oc) values: on a 2-core EPYC (x86-64-v3) the seed ConvNet's conv2d_3
 * backward filter went from 83-92 to 128 GFLOP/s (the same bits, summed in the same order).
 *
 * Every output value is summed in one fixed order (taps, then channels; or the batch's pixels
 * in order), by FMAs where the CPU has them, whatever the lanes, the block or the chunk: the
 * results do not depend on the number of threads, and each is within the rounding bound of a
 * direct convolution (tests/unit/convref.h). Work is cut into fixed parts: output rows (forward,
 * backward data) or (tap, channel block, output block) triples (backward filter), each lane a
 * contiguous run of them.
 *
 * The kernels are compiled for the build's own target and, with GCC on x86-64, for x86-64-v3
 * and x86-64-v4, as Winograd's GEMM kernel is (cpu_winograd.c), and picked by what the CPU has.
 *
 * Measured on the seed ConvNet at batch 128 with --conv-algo direct (2-core Xeon, x86-64-v4;
 * bench/layer_times, ms of wall time per step; im2col with OpenBLAS's SkylakeX kernel):
 *                               im2col + OpenBLAS              here
 *   conv2d_2 24x24x32 -> 256    fwd 73-80, bwd 145-158         fwd 41-50, bwd 100-140
 *   conv2d_3 24x24x256 -> 128   fwd 209-231, bwd 450-464       fwd 132-138, bwd 292-338
 *   the step                    1008                           645-760
 * (runs of the same hour; in pairs of runs interleaved at a busier moment the step took 0.81-0.89
 * of im2col's). The forward pass reaches 265-275 GFLOP/s on the two cores, more than OpenBLAS's
 * SGEMM of 2048^3 on the same machine (198-241): no column matrix, no packing per call, each sum
 * stored once. On a 2-core EPYC (x86-64-v3, bench/layer_times, interleaved runs) with the
 * backward filter's copies and the ReLU in the forward stores (cpu_conv.c, fuse.c): conv2d_2
 * fwd 79-87, bwd 157-192 (before 90-95, 246-265); conv2d_3 fwd 278, bwd 493-594 (288-311,
 * 727-795); the step 1061-1286 ms (1435-1567). */
#include <string.h>

#include "cpu_internal.h"

enum {
    CK_R = 12,        /* most pixels (or input channels) per block: rows of register sums */
    CK_N = 32,        /* output channels per block: columns of register sums */
    CK_MAX_LANES = 8, /* most lanes one pass uses (the scratch holds their copies) */
};

static size_t ck_blocks(int channels) {
    return ((size_t)channels + CK_N - 1) / CK_N;
}

/* ---- kernels -------------------------------------------------------------------------------- */

/* One output row of the correlation: out[p][o] for p < npix, o < nout, CK_N channels at a time:
 *   out[p][o] = init[o] + sum_{i < ni, j < kw, k < ic} in[i * in_row + (p + j) * ic + k]
 *                 * w[(o / CK_N) * w_blk + ((i * kw + j) * ic + k) * CK_N + o % CK_N]
 * (init NULL: 0), w padded with zeros beyond nout; with relu, each sum stored as act_fwd's ReLU
 * would leave it (v < 0 ? 0 : v: -0 and NaN unchanged). */
typedef struct {
    const float *in;
    ptrdiff_t in_row;
    int ni, kw, ic;
    const float *w;
    ptrdiff_t w_blk;
    const float *init;
    int npix, nout, relu;
    float *out;
} cv_row;

/* Backward filter for one tap, CK_R (or fewer) input channels and one block of CK_N output
 * channels, over nrows rows of npix pixels:
 *   acc[r * acc_row + o] += sum_{row, p} x[row * x_row + p * c + r] * dy[row * dy_row + p * oc + o]
 * (o < CK_N: the block is whole, oc a multiple of CK_N). */
typedef struct {
    const float *x;
    ptrdiff_t x_row;
    const float *dy;
    ptrdiff_t dy_row;
    int nrows, npix, c, oc, nr;
    float *acc;
    ptrdiff_t acc_row;
} cv_dw;

typedef void (*cv_row_fn)(const cv_row *g);
typedef void (*cv_dw_fn)(const cv_dw *g);

/* switch cases 1 .. RM (6 or 12) running CALL with R_ the constant case */
#define CK_CASE(CALL, N)                                                                           \
    case N: {                                                                                      \
        enum { R_ = N };                                                                           \
        CALL;                                                                                      \
        break;                                                                                     \
    }
#define CK_CASES6(CALL)                                                                            \
    CK_CASE(CALL, 1)                                                                               \
    CK_CASE(CALL, 2) CK_CASE(CALL, 3) CK_CASE(CALL, 4) CK_CASE(CALL, 5) CK_CASE(CALL, 6)
#define CK_CASES_6(CALL) CK_CASES6(CALL)
#define CK_CASES_12(CALL)                                                                          \
    CK_CASES6(CALL)                                                                                \
    CK_CASE(CALL, 7) CK_CASE(CALL, 8) CK_CASE(CALL, 9) CK_CASE(CALL, 10) CK_CASE(CALL, 11)         \
        CK_CASE(CALL, 12)
#define CK_CASES(CALL, RM) CK_CASES_##RM(CALL)

/* The kernels for vectors of W floats, NV of them across a strip (CK_N / (W NV) strips per
 * block). R is a constant in each case of the switches, so that the sums stay in registers. */
#define CK_DEFINE(NAME, W, NV, RM, ATTR)                                                           \
    typedef float NAME##_vec __attribute__((vector_size(4 * (W)), aligned(4)));                    \
    typedef int NAME##_ivec __attribute__((vector_size(4 * (W)), aligned(4)));                     \
    enum { NAME##_rm = (RM) };                                                                     \
    ATTR static inline __attribute__((always_inline)) void NAME##_row_blk(                         \
        const cv_row *g, const int R, int p0, int blk) {                                           \
        const int ni = g->ni, kw = g->kw, ic = g->ic;                                              \
        const float *wb = g->w + blk * g->w_blk;                                                   \
        for (int js = 0; js < CK_N; js += (W) * (NV)) {                                            \
            NAME##_vec sum[CK_R][NV];                                                              \
            for (int r = 0; r < R; r++)                                                            \
                for (int v = 0; v < (NV); v++)                                                     \
                    sum[r][v] = g->init                                                            \
                                    ? *(const NAME##_vec *)(g->init + blk * CK_N + js + v * (W))   \
                                    : (NAME##_vec){0};                                             \
            for (int i = 0; i < ni; i++)                                                           \
                for (int j = 0; j < kw; j++) {                                                     \
                    const float *a = g->in + i * g->in_row + (ptrdiff_t)(p0 + j) * ic;             \
                    const float *b = wb + (ptrdiff_t)(i * kw + j) * ic * CK_N + js;                \
                    for (int k = 0; k < ic; k++, a++, b += CK_N) {                                 \
                        NAME##_vec bv[NV];                                                         \
                        for (int v = 0; v < (NV); v++)                                             \
                            bv[v] = *(const NAME##_vec *)(b + v * (W));                            \
                        for (int r = 0; r < R; r++) {                                              \
                            const float s = a[r * ic];                                             \
                            for (int v = 0; v < (NV); v++)                                         \
                                sum[r][v] += s * bv[v];                                            \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            const int o0 = blk * CK_N + js;                                                        \
            if (g->relu)                                                                           \
                for (int r = 0; r < R; r++)                                                        \
                    for (int v = 0; v < (NV); v++)                                                 \
                        sum[r][v] = (NAME##_vec)((NAME##_ivec)sum[r][v] &                          \
                                                 ~(sum[r][v] < (NAME##_vec){0}));                  \
            for (int r = 0; r < R; r++) {                                                          \
                float *dst = g->out + (ptrdiff_t)(p0 + r) * g->nout + o0;                          \
                for (int v = 0; v < (NV); v++) {                                                   \
                    const int left = g->nout - o0 - v * (W);                                       \
                    if (left >= (W)) {                                                             \
                        *(NAME##_vec *)(dst + v * (W)) = sum[r][v];                                \
                    } else if (left > 0) {                                                         \
                        float t[W];                                                                \
                        memcpy(t, &sum[r][v], sizeof t);                                           \
                        memcpy(dst + v * (W), t, sizeof(float) * (size_t)left);                    \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    ATTR static void NAME##_row(const cv_row *g) {                                                 \
        const int nblk = (int)ck_blocks(g->nout), nt = (g->npix + (RM)-1) / (RM);                  \
        for (int blk = 0; blk < nblk; blk++)                                                       \
            for (int t = 0; t < nt; t++) {                                                         \
                const int p0 = g->npix * t / nt, p1 = g->npix * (t + 1) / nt;                      \
                switch (p1 - p0) { CK_CASES(NAME##_row_blk(g, R_, p0, blk), RM) }                  \
            }                                                                                      \
    }                                                                                              \
    ATTR static inline                                                                             \
        __attribute__((always_inline)) void NAME##_dw_r(const cv_dw *g, const int R) {             \
        const int c = g->c, oc = g->oc;                                                            \
        for (int js = 0; js < CK_N; js += (W) * (NV)) {                                            \
            NAME##_vec sum[CK_R][NV];                                                              \
            for (int r = 0; r < R; r++)                                                            \
                for (int v = 0; v < (NV); v++)                                                     \
                    sum[r][v] = *(const NAME##_vec *)(g->acc + r * g->acc_row + js + v * (W));     \
            for (int row = 0; row < g->nrows; row++) {                                             \
                const float *a = g->x + row * g->x_row;                                            \
                const float *b = g->dy + row * g->dy_row + js;                                     \
                for (int p = 0; p < g->npix; p++, a += c, b += oc) {                               \
                    NAME##_vec bv[NV];                                                             \
                    for (int v = 0; v < (NV); v++)                                                 \
                        bv[v] = *(const NAME##_vec *)(b + v * (W));                                \
                    for (int r = 0; r < R; r++) {                                                  \
                        const float s = a[r];                                                      \
                        for (int v = 0; v < (NV); v++)                                             \
                            sum[r][v] += s * bv[v];                                                \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < R; r++)                                                            \
                for (int v = 0; v < (NV); v++)                                                     \
                    *(NAME##_vec *)(g->acc + r * g->acc_row + js + v * (W)) = sum[r][v];           \
        }                                                                                          \
    }                                                                                              \
    ATTR static void NAME##_dw(const cv_dw *g) {                                                   \
        switch (g->nr) { CK_CASES(NAME##_dw_r(g, R_), RM) }                                        \
    }

#if defined(__AVX512F__)
#define CK_BASE_W 16
#define CK_BASE_R 12
#elif defined(__AVX__)
#define CK_BASE_W 8
#define CK_BASE_R 6
#else
#define CK_BASE_W 4
#define CK_BASE_R 6
#endif
CK_DEFINE(ck_base, CK_BASE_W, 2, CK_BASE_R, )
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CK_MULTI 1
CK_DEFINE(ck_v3, 8, 2, 6, __attribute__((target("arch=x86-64-v3"))))
CK_DEFINE(ck_v4, 16, 2, 12, __attribute__((target("arch=x86-64-v4"))))
#endif

typedef struct {
    cv_row_fn row;
    cv_dw_fn dw;
    int rm; /* most rows of register sums: the backward filter's input channels per block */
    const char *name;
} ck_variant;

/* The variants this CPU can run, in order: the base one, then x86-64-v3 and x86-64-v4 where the
 * CPU has them; the passes use the last. */
static int ck_variants(ck_variant *v) {
    int n = 0;
    v[n++] = (ck_variant){ck_base_row, ck_base_dw, ck_base_rm, "base"};
#ifdef CK_MULTI
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v3"))
        v[n++] = (ck_variant){ck_v3_row, ck_v3_dw, ck_v3_rm, "x86-64-v3"};
    if (__builtin_cpu_supports("x86-64-v4"))
        v[n++] = (ck_variant){ck_v4_row, ck_v4_dw, ck_v4_rm, "x86-64-v4"};
#endif
    return n;
}

int mgt_cpu_convk_variants(void) {
    ck_variant v[3];
    return ck_variants(v);
}

/* The variant the passes run: the last one, or `mgt_cpu_convk_use`'s choice. */
static _Thread_local int ck_forced = -1;

const char *mgt_cpu_convk_use(int variant) {
    ck_variant v[3];
    const int n = ck_variants(v);
    if (variant < 0 || variant >= n) {
        ck_forced = -1;
        return NULL;
    }
    ck_forced = variant;
    return v[variant].name;
}

static ck_variant ck_pick(void) {
    ck_variant v[3];
    const int n = ck_variants(v);
    return v[ck_forced >= 0 && ck_forced < n ? ck_forced : n - 1];
}

/* ---- which passes run here, and their scratch --------------------------------------------- */

static int ck_stride1(const mgt_conv_shape *s) {
    return s->stride == 1 && s->n > 0 && s->c > 0 && s->oc > 0 && s->oh > 0 && s->ow > 0 &&
           (size_t)s->kh * s->kw > 1;
}

int mgt_cpu_convk_fits(const mgt_conv_shape *s, int pass) {
    if (!ck_stride1(s))
        return 0;
    if (pass == MGT_CPU_CONVK_FILTER) /* whole blocks of output channels, read from dy as it is */
        return s->oc % CK_N == 0;
    return 1;
}

/* Floats of each part, rounded to 16 floats (64 bytes) so that every part stays aligned. */
static size_t ck_fwd_w(const mgt_conv_shape *s) {
    return mgt_cpu_pad_up(
        ck_blocks(s->oc) * s->kh * s->kw * (size_t)s->c * CK_N + ck_blocks(s->oc) * CK_N, 16);
}

/* Forward reads x in place when the window never leaves it (no padding on the left, none
 * needed on the right); otherwise a copy of each sample with zero columns: h x (ow + kw - 1). */
static int ck_fwd_copies(const mgt_conv_shape *s) {
    return s->pad_left != 0 || s->ow + s->kw - 1 != s->w;
}

static size_t ck_fwd_copy(const mgt_conv_shape *s) {
    return ck_fwd_copies(s) ? mgt_cpu_pad_up((size_t)s->h * (s->ow + s->kw - 1) * s->c, 16) : 0;
}

static size_t ck_bwd_w(const mgt_conv_shape *s) {
    return mgt_cpu_pad_up(ck_blocks(s->c) * s->kh * s->kw * (size_t)s->oc * CK_N, 16);
}

/* Backward data reads dy from a copy of each sample with kw - 1 columns at both ends:
 * oh x (w + kw - 1). */
static size_t ck_bwd_copy(const mgt_conv_shape *s) {
    return mgt_cpu_pad_up((size_t)s->oh * (s->w + s->kw - 1) * s->oc, 16);
}

static size_t ck_filter_acc(const mgt_conv_shape *s) {
    return mgt_cpu_pad_up((size_t)s->kh * s->kw * s->c * s->oc, 16);
}

/* Backward filter's copies of a sample, per lane: x in blocks of at most CK_R channels, each
 * block's pixels one after another (h x w x CK_R at most per block: c + CK_R channels in all),
 * and dy in blocks of CK_N channels, likewise (oh x ow x CK_N per block). */
static size_t ck_filter_xpack(const mgt_conv_shape *s) {
    return mgt_cpu_pad_up((size_t)s->h * s->w * ((size_t)s->c + CK_R), 16);
}

static size_t ck_filter_pack(const mgt_conv_shape *s) {
    return ck_filter_xpack(s) + mgt_cpu_pad_up((size_t)s->oh * s->ow * s->oc, 16);
}

static int ck_lanes(mgt_cpu_lanes *lanes) {
    const int n = mgt_cpu_lanes_count(lanes);
    return n < CK_MAX_LANES ? n : CK_MAX_LANES;
}

size_t mgt_cpu_convk_scratch(const mgt_conv_shape *s) {
    size_t need = 0, part;
    if (mgt_cpu_convk_fits(s, MGT_CPU_CONVK_FORWARD)) {
        part = ck_fwd_w(s) + CK_MAX_LANES * ck_fwd_copy(s);
        need = part > need ? part : need;
        part = ck_bwd_w(s) + CK_MAX_LANES * ck_bwd_copy(s);
        need = part > need ? part : need;
    }
    if (mgt_cpu_convk_fits(s, MGT_CPU_CONVK_FILTER)) {
        part = ck_filter_acc(s) + CK_MAX_LANES * ck_filter_pack(s);
        need = part > need ? part : need;
    }
    return need * sizeof(float);
}

/* ---- forward and backward data: rows of the correlation ------------------------------------ */

typedef struct {
    const mgt_conv_shape *s;
    cv_row_fn kern;
    int lanes, in_h, in_w, ic, out_h, out_w, nout;
    int roff;         /* output row q reads input rows q + roff + i */
    int coff;         /* copy column q holds the source's column q + coff */
    int copies;       /* read from per-lane copies of each sample (with zero columns) */
    int relu;         /* the output stored through a ReLU */
    const float *src; /* NHWC source: in_h x src_w x ic per sample */
    int src_w;
    const float *w, *init;
    float *copy; /* lane l's copy at copy + l * copy_floats */
    size_t copy_floats;
    float *out;
} cv_job;

/* Sample smp of the source into copy: in_h rows of in_w pixels, zeros where the source has none. */
static void cv_copy(const cv_job *j, size_t smp, float *copy) {
    const size_t ic = (size_t)j->ic;
    const float *src = j->src + smp * (size_t)j->in_h * j->src_w * ic;
    const int lo = j->coff < 0 ? -j->coff : 0;
    int hi = j->src_w - j->coff;
    if (hi > j->in_w)
        hi = j->in_w;
    for (int y = 0; y < j->in_h; y++) {
        float *row = copy + (size_t)y * j->in_w * ic;
        if (hi <= lo) {
            memset(row, 0, sizeof(float) * (size_t)j->in_w * ic);
            continue;
        }
        memset(row, 0, sizeof(float) * (size_t)lo * ic);
        memcpy(row + (size_t)lo * ic, src + ((size_t)y * j->src_w + (size_t)(lo + j->coff)) * ic,
               sizeof(float) * (size_t)(hi - lo) * ic);
        memset(row + (size_t)hi * ic, 0, sizeof(float) * (size_t)(j->in_w - hi) * ic);
    }
}

static void cv_lane(void *p, int lane) {
    const cv_job *j = p;
    const mgt_conv_shape *s = j->s;
    const size_t rows = (size_t)s->n * j->out_h;
    const size_t r0 = rows * (size_t)lane / (size_t)j->lanes;
    const size_t r1 = rows * (size_t)(lane + 1) / (size_t)j->lanes;
    float *copy = j->copies ? j->copy + (size_t)lane * j->copy_floats : NULL;
    size_t copied = (size_t)-1;
    const size_t in_sample = (size_t)j->in_h * j->in_w * j->ic;
    const ptrdiff_t in_row = (ptrdiff_t)j->in_w * j->ic;
    cv_row g = {.in_row = in_row,
                .kw = s->kw,
                .ic = j->ic,
                .w_blk = (ptrdiff_t)s->kh * s->kw * j->ic * CK_N,
                .init = j->init,
                .npix = j->out_w,
                .nout = j->nout,
                .relu = j->relu};
    for (size_t r = r0; r < r1; r++) {
        const size_t smp = r / (size_t)j->out_h;
        const int q = (int)(r % (size_t)j->out_h);
        const float *in;
        if (copy) {
            if (copied != smp)
                cv_copy(j, smp, copy), copied = smp;
            in = copy;
        } else {
            in = j->src + smp * in_sample;
        }
        int i0 = -(q + j->roff), i1 = j->in_h - (q + j->roff);
        i0 = i0 < 0 ? 0 : i0;
        i1 = i1 > s->kh ? s->kh : i1;
        g.ni = i1 > i0 ? i1 - i0 : 0;
        g.in = g.ni ? in + (ptrdiff_t)(q + j->roff + i0) * in_row : in;
        g.w = g.ni ? j->w + (ptrdiff_t)i0 * s->kw * j->ic * CK_N : j->w;
        g.out = j->out + (smp * (size_t)j->out_h + (size_t)q) * (size_t)j->out_w * j->nout;
        j->kern(&g);
    }
}

/* The weights as the correlation reads them, CK_N channels of the vector side wide:
 *   forward:       wp[blk][i][j][k][v] = W[blk * CK_N + v][k][i][j]                (v: oc)
 *   backward data: wp[blk][i][j][o][v] = W[o][blk * CK_N + v][kh - 1 - i][kw - 1 - j] (v: c)
 * with zeros beyond the vector side's channels. */
static void ck_pack(const mgt_conv_shape *s, const float *w, int turned, float *wp) {
    const int c = s->c, kh = s->kh, kw = s->kw;
    const size_t nv = (size_t)(turned ? c : s->oc), ni = (size_t)(turned ? s->oc : c);
    const size_t nblk = ck_blocks((int)nv);
    for (size_t blk = 0; blk < nblk; blk++)
        for (int i = 0; i < kh; i++)
            for (int jj = 0; jj < kw; jj++) {
                const int ti = turned ? kh - 1 - i : i, tj = turned ? kw - 1 - jj : jj;
                for (size_t q = 0; q < ni; q++) {
                    float *dst = wp + (((blk * kh + i) * kw + jj) * ni + q) * CK_N;
                    for (size_t v = 0; v < CK_N; v++) {
                        const size_t a = blk * CK_N + v, o = turned ? q : a, k = turned ? a : q;
                        dst[v] = a < nv ? w[((o * c + k) * kh + ti) * kw + tj] : 0.0f;
                    }
                }
            }
}

int mgt_cpu_convk_fwd(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, const mgt_conv_shape *s,
                      const float *x, const float *w, const float *b, float *y) {
    if (!mgt_cpu_convk_fits(s, MGT_CPU_CONVK_FORWARD))
        return -1;
    const int L = ck_lanes(lanes);
    const size_t wf = ck_fwd_w(s), cf = ck_fwd_copy(s);
    if (!scratch || (wf + (size_t)L * cf) * sizeof(float) > bytes)
        return -1;
    const int c = s->c, oc = s->oc, kh = s->kh, kw = s->kw;
    const size_t nblk = ck_blocks(oc);
    /* the packed weights, then the bias */
    float *wp = scratch, *init = scratch + nblk * kh * kw * (size_t)c * CK_N;
    ck_pack(s, w, 0, wp);
    for (size_t o = 0; o < nblk * CK_N; o++)
        init[o] = b && o < (size_t)oc ? b[o] : 0.0f;
    cv_job j = {.s = s,
                .kern = ck_pick().row,
                .lanes = L,
                .in_h = s->h,
                .in_w = s->ow + kw - 1,
                .ic = c,
                .out_h = s->oh,
                .out_w = s->ow,
                .nout = oc,
                .roff = -s->pad_top,
                .coff = -s->pad_left,
                .copies = ck_fwd_copies(s),
                .relu = s->act == MGT_ACT_RELU,
                .src = x,
                .src_w = s->w,
                .w = wp,
                .init = init,
                .copy = scratch + wf,
                .copy_floats = cf,
                .out = y};
    mgt_cpu_lanes_run(lanes, j.lanes, cv_lane, &j);
    return 0;
}

int mgt_cpu_convk_bwd_data(float *scratch, size_t bytes, mgt_cpu_lanes *lanes,
                           const mgt_conv_shape *s, const float *w, const float *dy, float *dx) {
    if (!mgt_cpu_convk_fits(s, MGT_CPU_CONVK_DATA))
        return -1;
    const int L = ck_lanes(lanes);
    const size_t wf = ck_bwd_w(s), cf = ck_bwd_copy(s);
    if (!scratch || (wf + (size_t)L * cf) * sizeof(float) > bytes)
        return -1;
    const int c = s->c, oc = s->oc, kh = s->kh, kw = s->kw;
    ck_pack(s, w, 1, scratch);
    /* dx[iy][ix] reads dy[iy + pad_top - i][ix + pad_left - j]: with the window turned round
     * (i' = kh - 1 - i), rows iy + pad_top - (kh - 1) + i' and copy columns ix + j', the copy's
     * column 0 being dy's column pad_left - (kw - 1). */
    cv_job j = {.s = s,
                .kern = ck_pick().row,
                .lanes = L,
                .in_h = s->oh,
                .in_w = s->w + kw - 1,
                .ic = oc,
                .out_h = s->h,
                .out_w = s->w,
                .nout = c,
                .roff = s->pad_top - (kh - 1),
                .coff = s->pad_left - (kw - 1),
                .copies = 1,
                .src = dy,
                .src_w = s->ow,
                .w = scratch,
                .init = NULL,
                .copy = scratch + wf,
                .copy_floats = cf,
                .out = dx};
    mgt_cpu_lanes_run(lanes, j.lanes, cv_lane, &j);
    return 0;
}

/* ---- backward filter ----------------------------------------------------------------------- */

typedef struct {
    const mgt_conv_shape *s;
    cv_dw_fn kern;
    int lanes, nct; /* blocks of input channels */
    int rm;         /* the variant's most channels per block */
    size_t items;   /* taps x nct x output blocks */
    int x_major;    /* items in (channel block, tap, output block) order, else (output block,
                     * tap, channel block): each lane's run then reads a part of the larger
                     * of a sample's x and dy, and consecutive items share their lines */
    const float *x, *dy;
    float *acc;         /* [tap][k][oc] */
    float *pack;        /* lane l's copies at pack + l * pack_floats, or NULL: read in place */
    size_t pack_floats; /* ck_filter_pack */
} dw_job;

/* Item t's channel block, tap and output block. */
static void dw_item(const dw_job *j, size_t t, int *ct, int *tap, int *blk) {
    const size_t nob = (size_t)(j->s->oc / CK_N), taps = (size_t)j->s->kh * j->s->kw;
    if (j->x_major) { /* (ct, tap, blk) */
        *blk = (int)(t % nob);
        *tap = (int)(t / nob % taps);
        *ct = (int)(t / (nob * taps));
    } else { /* (blk, tap, ct) */
        *ct = (int)(t % (size_t)j->nct);
        *tap = (int)(t / (size_t)j->nct % taps);
        *blk = (int)(t / ((size_t)j->nct * taps));
    }
}

/* Channels [k0, k1) of block ct: nct near-equal blocks of at most the variant's rows. */
static int dw_k0(const dw_job *j, int ct) {
    return (int)((size_t)j->s->c * (size_t)ct / (size_t)j->nct);
}

/* Sample smp's channel blocks ct0..ct1 of x into xp ([ct][pixel][rm]) and its output blocks
 * b0..b1 of dy into yp ([blk][pixel][CK_N]): each item then reads its operands contiguously,
 * as the forward pass reads its packed weights. */
static void dw_pack(const dw_job *j, size_t smp, int ct0, int ct1, int b0, int b1, float *xp,
                    float *yp) {
    const mgt_conv_shape *s = j->s;
    const size_t hw = (size_t)s->h * s->w, ohw = (size_t)s->oh * s->ow;
    const size_t c = (size_t)s->c, oc = (size_t)s->oc, rm = (size_t)j->rm;
    const float *x = j->x + smp * hw * c, *dy = j->dy + smp * ohw * oc;
    for (int ct = ct0; ct <= ct1; ct++) {
        const int k0 = dw_k0(j, ct), nk = dw_k0(j, ct + 1) - k0;
        float *dst = xp + (size_t)(ct - ct0) * hw * rm;
        for (size_t q = 0; q < hw; q++)
            memcpy(dst + q * rm, x + q * c + (size_t)k0, sizeof(float) * (size_t)nk);
    }
    for (int blk = b0; blk <= b1; blk++) {
        float *dst = yp + (size_t)(blk - b0) * ohw * CK_N;
        for (size_t q = 0; q < ohw; q++)
            memcpy(dst + q * CK_N, dy + q * oc + (size_t)blk * CK_N, sizeof(float) * CK_N);
    }
}

static void dw_lane(void *p, int lane) {
    const dw_job *j = p;
    const mgt_conv_shape *s = j->s;
    const size_t t0 = j->items * (size_t)lane / (size_t)j->lanes;
    const size_t t1 = j->items * (size_t)(lane + 1) / (size_t)j->lanes;
    const int c = s->c, oc = s->oc;
    const size_t xs = (size_t)s->h * s->w * c, ys = (size_t)s->oh * s->ow * oc;
    /* the blocks this lane's items read, copied sample by sample where there is room */
    int ct0 = j->nct, ct1 = -1, b0 = oc / CK_N, b1 = -1;
    for (size_t t = t0; t < t1; t++) {
        int ct, tap, blk;
        dw_item(j, t, &ct, &tap, &blk);
        ct0 = ct < ct0 ? ct : ct0, ct1 = ct > ct1 ? ct : ct1;
        b0 = blk < b0 ? blk : b0, b1 = blk > b1 ? blk : b1;
    }
    float *xp = j->pack ? j->pack + (size_t)lane * j->pack_floats : NULL;
    float *yp = xp ? xp + ck_filter_xpack(s) : NULL;
    for (size_t smp = 0; smp < (size_t)s->n; smp++) {
        if (xp && t1 > t0)
            dw_pack(j, smp, ct0, ct1, b0, b1, xp, yp);
        for (size_t t = t0; t < t1; t++) {
            int blk, ct, tap;
            dw_item(j, t, &ct, &tap, &blk);
            const int i = tap / s->kw, jj = tap % s->kw;
            const int k0 = dw_k0(j, ct), k1 = dw_k0(j, ct + 1);
            /* output pixels whose window's tap (i, jj) falls inside x */
            int y0 = s->pad_top - i, y1 = s->h + s->pad_top - i;
            int x0 = s->pad_left - jj, x1 = s->w + s->pad_left - jj;
            y0 = y0 < 0 ? 0 : y0, y1 = y1 > s->oh ? s->oh : y1;
            x0 = x0 < 0 ? 0 : x0, x1 = x1 > s->ow ? s->ow : x1;
            if (y1 <= y0 || x1 <= x0 || k1 <= k0)
                continue;
            /* x's first pixel read, and dy's, as indices of a sample's pixels */
            const size_t xq =
                (size_t)(y0 - s->pad_top + i) * s->w + (size_t)(x0 - s->pad_left + jj);
            const size_t yq = (size_t)y0 * s->ow + (size_t)x0;
            cv_dw g = {.nrows = y1 - y0,
                       .npix = x1 - x0,
                       .nr = k1 - k0,
                       .acc = j->acc + ((size_t)tap * c + (size_t)k0) * oc + (size_t)blk * CK_N,
                       .acc_row = oc};
            if (xp) { /* the copies: rm floats a pixel of x, CK_N of dy */
                g.x = xp + ((size_t)(ct - ct0) * s->h * s->w + xq) * (size_t)j->rm;
                g.x_row = (ptrdiff_t)s->w * j->rm;
                g.dy = yp + ((size_t)(blk - b0) * s->oh * s->ow + yq) * CK_N;
                g.dy_row = (ptrdiff_t)s->ow * CK_N;
                g.c = j->rm;
                g.oc = CK_N;
            } else {
                g.x = j->x + smp * xs + xq * (size_t)c + (size_t)k0;
                g.x_row = (ptrdiff_t)s->w * c;
                g.dy = j->dy + smp * ys + yq * (size_t)oc + (size_t)blk * CK_N;
                g.dy_row = (ptrdiff_t)s->ow * oc;
                g.c = c;
                g.oc = oc;
            }
            j->kern(&g);
        }
    }
}

int mgt_cpu_convk_bwd_filter(float *scratch, size_t bytes, mgt_cpu_lanes *lanes,
                             const mgt_conv_shape *s, const float *x, const float *dy, float *dw) {
    if (!mgt_cpu_convk_fits(s, MGT_CPU_CONVK_FILTER))
        return -1;
    const size_t af = ck_filter_acc(s);
    if (!scratch || af * sizeof(float) > bytes)
        return -1;
    const int c = s->c, oc = s->oc, kh = s->kh, kw = s->kw, taps = kh * kw;
    float *acc = scratch;
    memset(acc, 0, sizeof(float) * (size_t)taps * c * oc);
    const ck_variant v = ck_pick();
    dw_job j = {.s = s,
                .kern = v.dw,
                .lanes = ck_lanes(lanes),
                .nct = (c + v.rm - 1) / v.rm,
                .rm = v.rm,
                .x = x,
                .dy = dy,
                .acc = acc};
    j.items = (size_t)taps * j.nct * (size_t)(oc / CK_N);
    j.x_major = (size_t)s->h * s->w * c >= (size_t)s->oh * s->ow * oc;
    if ((size_t)j.lanes > j.items)
        j.lanes = (int)j.items;
    /* the copies where the scratch has room for every lane's (the same sums either way) */
    j.pack_floats = ck_filter_pack(s);
    if ((af + (size_t)j.lanes * j.pack_floats) * sizeof(float) <= bytes)
        j.pack = scratch + af;
    mgt_cpu_lanes_run(lanes, j.lanes, dw_lane, &j);
    /* [tap][k][o] -> OIHW */
    for (int o = 0; o < oc; o++)
        for (int k = 0; k < c; k++)
            for (int t = 0; t < taps; t++)
                dw[((size_t)o * c + k) * taps + t] = acc[((size_t)t * c + k) * oc + o];
    return 0;
}
