/* cpu_winograd.c: 3x3, stride-1 convolutions by Winograd's minimal filtering F(m x m, 3 x 3)
 * (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016), m = 2 or 4, for
 * the forward pass, the backward-data pass and the backward-filter pass. cpu_conv.c decides
 * when to call it (and which m), and what runs everything else (cpu_convk.c, im2col + GEMM).
 *
 * Why: the big 3x3 layers are bound by their GEMMs, which OpenBLAS already runs near the
 * machine's peak, so the only way to go faster is fewer multiplications. Winograd computes an
 * m x m output tile from an n x n input tile (n = m + 2) with n^2 multiplications per
 * (input channel, output channel) pair instead of 9 m^2: 2.25x fewer for m = 2, 4x for m = 4.
 *
 * For one output tile Y (m x m), its input tile d (n x n) and a filter g (3 x 3):
 *     Y = A^T [ (G g G^T) .* (B^T d B) ] A
 * Summed over the input channels, the element-wise product at each of the P = n^2 positions xi
 * of the transformed tile is a matrix product over a chunk of tiles:
 *     M_xi[tile][oc] = V_xi[tile][c] * U_xi[c][oc],   V = B^T d B,  U = G g G^T,
 * so a chunk costs P small matrix products (see "the chunk GEMMs") plus the transforms, which
 * are linear in the data.
 *
 * Backward data: the input gradient of a 3x3 stride-1 correlation is the correlation of dy
 *     (zero outside the output) with the kernel rotated by 180 degrees and its two channel
 *     roles swapped, the padding becoming 2 - pad. It runs through the same routine.
 * Backward filter: the gradient of the bilinear form above with respect to g is
 *     dg = G^T [ (A dY A^T) .* (B^T d B) ] G
 *     (the transposed, "nested" algorithm), so summed over all tiles of the batch
 *         S_xi[oc][c] = sum_tiles (A dY A^T)_xi[tile][oc] * (B^T d B)_xi[tile][c],
 *     one GEMM per position with the chunk's tiles as the reduction dimension, accumulated
 *     over chunks, and dW = G^T S G at the end.
 *
 * Tiling: the output is cut into ceil(oh/m) x ceil(ow/m) tiles per sample; positions past the
 * bottom/right edge are computed and dropped, and input (or dy) outside the tensor reads as
 * zero, which is also how padding is done. The tiles of the whole batch are numbered
 * sample-major and processed in chunks of T tiles. A chunk's transformed tiles are stored
 * position-major, [xi][tile][channel], so each position's GEMM operand is one contiguous
 * T x channels matrix, and the transformed filters are laid out as the GEMM kernel reads them.
 * T is small (see wino_target_tiles): the chunk stays in L2 from the transform through the
 * GEMMs to the inverse transform. The parallelism comes from lanes: each thread takes whole
 * chunks (see "lanes" below), so the transforms run in parallel too.
 * A tile's outputs depend only on that tile, and the GEMM kernel sums every element in the
 * same order whatever the chunk, so forward and backward-data results depend neither on the
 * chunking nor on the number of threads; backward filter sums its tiles in two fixed halves,
 * each in tile order through its chunks, so its result does not depend on the number of
 * threads either, and on the chunking only through where the halves meet.
 *
 * The transforms work on blocks of WINO_CB channels (NHWC keeps a pixel's channels adjacent),
 * each 1-D transform a loop over the channel block that the compiler vectorises. Filter
 * transforms (c x oc small 3x3 filters per call, little next to the tiles) are done in
 * double. */
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "cpu_internal.h"

enum {
    WINO_CB = 64,   /* channels per transform block */
    WINO_NMAX = 6,  /* largest input tile side (m = 4) */
    WINO_PMAX = 36, /* positions of the largest transformed tile */
};

enum {
    WINO_MAX_LANES = 4, /* most threads one pass uses (scratch is sized for them) */
    WINO_GROUPS = 2,    /* fixed partial sums of the backward-filter pass */
};

/* Tiles per chunk (measured on the seed ConvNet's layers, see wino_target_tiles): a lane's
 * buffers stay within about the L2 of a core (1 MB on AMD's Zen 4, 2 MB on Intel's Sapphire
 * Rapids). */
#define WINO_LANE_BYTES ((size_t)1 << 20)
/* Work (multiply-adds) below which a pass runs on the calling thread alone: waking a worker
 * costs tens of microseconds. (The transforms make a pass with few channels, such as a first
 * layer's, cost far more than its multiply-adds: 28x28x1 -> 32 at batch 128 has 7 x 10^6 of
 * them and takes 3 ms.) */
#define WINO_LANE_MIN_MACS 1000000.0

/* One correlation as the transforms see it: `in` (n, ih, iw, ic) -> `out` (n, oh, ow, oc),
 * output (oy, ox) reading input rows oy - pt .. oy - pt + 2 and columns ox - pl .. ox - pl + 2. */
typedef struct {
    int n, ih, iw, ic, oh, ow, oc, pt, pl;
    int m, nt, P; /* output tile side, input tile side (m + 2), positions (nt^2) */
    int th, tw;   /* tiles per sample, down and across */
    size_t tiles; /* n * th * tw */
} wino_geom;

static wino_geom wino_geom_of(int m, int n, int ih, int iw, int ic, int oh, int ow, int oc, int pt,
                              int pl) {
    wino_geom g = {.n = n,
                   .ih = ih,
                   .iw = iw,
                   .ic = ic,
                   .oh = oh,
                   .ow = ow,
                   .oc = oc,
                   .pt = pt,
                   .pl = pl,
                   .m = m,
                   .nt = m + 2};
    g.P = g.nt * g.nt;
    g.th = (oh + m - 1) / m;
    g.tw = (ow + m - 1) / m;
    g.tiles = (size_t)(n > 0 ? n : 0) * (size_t)g.th * (size_t)g.tw;
    return g;
}

static size_t align16(size_t floats) { /* keeps each buffer 64-byte aligned */
    return (floats + 15) & ~(size_t)15;
}

/* A chunk's transformed tiles, position-major: element (tile r, position xi, channel ch) is
 * at p[r * st + xi * sp + ch], st = the row stride (the channels, or more where the GEMM wants
 * padding), sp = rows per chunk * st. (Measured against [tile][xi][channel]: the same to 10%
 * faster, the GEMMs reading contiguous rows.) */
typedef struct {
    float *p;
    size_t st, sp;
} wino_buf;

static wino_buf wino_buf_at(float *p, size_t rows, size_t stride) {
    return (wino_buf){p, stride, rows * stride};
}

/* ---- the chunk GEMMs ----------------------------------------------------------------------- *
 * Every product of a pass is C = A B, or C += A B, in blocks of GEMM_MR rows by GEMM_NR columns
 * whose sums stay in registers from the first k to the last: each element is summed over k in
 * order (by FMAs where the CPU has them), whatever the block, the chunk or the thread, so the
 * results depend on neither, and the backward-filter sums run in tile order through the chunks.
 *   A(i, k) = a[i * ai + k * ak]                  any strides: rows of V, or columns of D
 *   B(k, j) = b[(j / NR) * bp + k * bk + j % NR]   NR-wide panels: the packed U, or rows of X
 *   C(i, j) = c[i * ldc + j]
 * with rows a multiple of GEMM_MR and columns of GEMM_NR: the buffers are padded, with zeros or
 * with rows that are computed and dropped.
 * Why not OpenBLAS: the products are small (tens of rows, P of them per chunk), and how fast
 * OpenBLAS runs them depends on the kernel it picks for the CPU: its SkylakeX / Cooperlake
 * small-matrix path took the seed ConvNet's shapes at 75-110 GFLOP/s per core of a 2-core AMD
 * EPYC (AVX-512, 116 GFLOP/s peak), its Haswell and Zen kernels, which EPYCs get, at 65-85, both
 * copying operands and clearing C first. This kernel, on operands the transforms and the
 * filter transform lay out for it, ran every one of them at 100-113 on the same core. */
enum { GEMM_MR = 6, GEMM_NR = 32 };

typedef struct {
    int rows, cols, K, acc; /* acc: C += A B, else C = A B */
    const float *a;
    ptrdiff_t ai, ak;
    const float *b;
    ptrdiff_t bp, bk;
    float *c;
    ptrdiff_t ldc;
} wino_gemm_args;

typedef void (*wino_gemm_fn)(const wino_gemm_args *g);

/* The kernel for vectors of W floats, NV of them across a row at a time (GEMM_NR / (W NV)
 * strips of columns per block): GEMM_MR x NV vector sums in registers (12 of 16 or 32), NV
 * loads of B and GEMM_MR broadcasts of A per k. Compiled once per instruction set below. */
#define WINO_GEMM_DEFINE(NAME, W, NV, ATTR)                                                        \
    typedef float NAME##_vec __attribute__((vector_size(4 * (W)), aligned(4)));                    \
    ATTR static void NAME(const wino_gemm_args *g) {                                               \
        const int rows = g->rows, cols = g->cols, K = g->K, acc = g->acc;                          \
        const ptrdiff_t ai = g->ai, ak = g->ak, bp = g->bp, bk = g->bk, ldc = g->ldc;              \
        for (int j0 = 0; j0 < cols; j0 += GEMM_NR) {                                               \
            const float *bpan = g->b + (j0 / GEMM_NR) * bp;                                        \
            for (int i0 = 0; i0 < rows; i0 += GEMM_MR) {                                           \
                const float *a = g->a + i0 * ai;                                                   \
                float *c = g->c + i0 * ldc + j0;                                                   \
                for (int js = 0; js < GEMM_NR; js += (W) * (NV)) {                                 \
                    NAME##_vec sum[GEMM_MR][NV];                                                   \
                    for (int i = 0; i < GEMM_MR; i++)                                              \
                        for (int v = 0; v < (NV); v++)                                             \
                            sum[i][v] = acc ? *(const NAME##_vec *)(c + i * ldc + js + v * (W))    \
                                            : (NAME##_vec){0};                                     \
                    for (int k = 0; k < K; k++) {                                                  \
                        const float *bk_row = bpan + k * bk + js;                                  \
                        NAME##_vec bv[NV];                                                         \
                        for (int v = 0; v < (NV); v++)                                             \
                            bv[v] = *(const NAME##_vec *)(bk_row + v * (W));                       \
                        for (int i = 0; i < GEMM_MR; i++) {                                        \
                            const float x = a[i * ai + k * ak];                                    \
                            for (int v = 0; v < (NV); v++)                                         \
                                sum[i][v] += x * bv[v];                                            \
                        }                                                                          \
                    }                                                                              \
                    for (int i = 0; i < GEMM_MR; i++)                                              \
                        for (int v = 0; v < (NV); v++)                                             \
                            *(NAME##_vec *)(c + i * ldc + js + v * (W)) = sum[i][v];               \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

/* One variant for the build's own target (the widest vectors it has) and, on x86-64 with GCC,
 * one each for x86-64-v3 (AVX2 + FMA, 16 registers of 8 floats) and x86-64-v4 (AVX-512, 32
 * registers of 16 floats), picked by what the CPU has, as MGT_SIMD's clones are. */
#if defined(__AVX512F__)
#define WINO_GEMM_BASE_W 16
#elif defined(__AVX__)
#define WINO_GEMM_BASE_W 8
#else
#define WINO_GEMM_BASE_W 4
#endif
WINO_GEMM_DEFINE(wino_gemm_base, WINO_GEMM_BASE_W, 2, )
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define WINO_GEMM_MULTI 1
WINO_GEMM_DEFINE(wino_gemm_v3, 8, 2, __attribute__((target("arch=x86-64-v3"))))
WINO_GEMM_DEFINE(wino_gemm_v4, 16, 2, __attribute__((target("arch=x86-64-v4"))))
#endif

/* The variants this CPU can run, in order: the base one, then x86-64-v3 and x86-64-v4 where the
 * CPU has them; the passes use the last. */
static int wino_gemm_variants(wino_gemm_fn *fn, const char **name) {
    int n = 0;
    fn[n] = wino_gemm_base, name[n++] = "base";
#ifdef WINO_GEMM_MULTI
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v3"))
        fn[n] = wino_gemm_v3, name[n++] = "x86-64-v3";
    if (__builtin_cpu_supports("x86-64-v4"))
        fn[n] = wino_gemm_v4, name[n++] = "x86-64-v4";
#endif
    return n;
}

static wino_gemm_fn wino_gemm_pick(void) {
    wino_gemm_fn fn[3];
    const char *name[3];
    return fn[wino_gemm_variants(fn, name) - 1];
}

int mgt_cpu_wino_gemm_count(void) {
    wino_gemm_fn fn[3];
    const char *name[3];
    return wino_gemm_variants(fn, name);
}

const char *mgt_cpu_wino_gemm(int variant, int rows, int cols, int K, int acc, const float *a,
                              ptrdiff_t ai, ptrdiff_t ak, const float *b, ptrdiff_t bp,
                              ptrdiff_t bk, float *c, ptrdiff_t ldc) {
    wino_gemm_fn fn[3];
    const char *name[3];
    const int n = wino_gemm_variants(fn, name);
    if (variant < 0 || variant >= n || rows % GEMM_MR || cols % GEMM_NR)
        return NULL;
    const wino_gemm_args g = {.rows = rows,
                              .cols = cols,
                              .K = K,
                              .acc = acc,
                              .a = a,
                              .ai = ai,
                              .ak = ak,
                              .b = b,
                              .bp = bp,
                              .bk = bk,
                              .c = c,
                              .ldc = ldc};
    fn[variant](&g);
    return name[variant];
}

/* ---- tile walk ---------------------------------------------------------------------------- */

typedef struct {
    size_t smp;
    int ty, tx;
} wino_tile;

static wino_tile wino_tile_at(const wino_geom *g, size_t t) {
    const size_t per = (size_t)g->th * g->tw, r = t % per;
    return (wino_tile){t / per, (int)(r / (size_t)g->tw), (int)(r % (size_t)g->tw)};
}

static void wino_tile_next(const wino_geom *g, wino_tile *p) {
    if (++p->tx == g->tw) {
        p->tx = 0;
        if (++p->ty == g->th) {
            p->ty = 0;
            p->smp++;
        }
    }
}

/* ---- 1-D transforms over `len` channels ---------------------------------------------------
 * Each reads its k-th input row at in[k] and writes its k-th output row at out[k]: rows are
 * addressed through pointer tables so that one kernel runs down a tile's columns, along its
 * rows, and straight from / to the tensors (with a shared row of zeros standing in for pixels
 * outside the input, and a scratch row for outputs past its edge). The *_k kernels take one
 * restrict pointer per row so that the compiler vectorises the channel loop without run-time
 * alias checks. */

#define IN4                                                                                        \
    const float *restrict a0, const float *restrict a1, const float *restrict a2,                  \
        const float *restrict a3
#define IN6 IN4, const float *restrict a4, const float *restrict a5
#define OUT2 float *restrict o0, float *restrict o1
#define OUT4 OUT2, float *restrict o2, float *restrict o3
#define OUT6 OUT4, float *restrict o4, float *restrict o5
#define ROWS4(p) (p)[0], (p)[1], (p)[2], (p)[3]
#define ROWS6(p) ROWS4(p), (p)[4], (p)[5]

/* F(2,3):  B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   (input tile, 4 -> 4)
 *          A^T = [1 1 1 0; 0 1 -1 -1]                       (output, 4 -> 2)
 *          G   = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]  (filter, 3 -> 4)  */
static inline void bt4_k(int len, IN4, OUT4) {
    for (int v = 0; v < len; v++) {
        const float d0 = a0[v], d1 = a1[v], d2 = a2[v], d3 = a3[v];
        o0[v] = d0 - d2;
        o1[v] = d1 + d2;
        o2[v] = d2 - d1;
        o3[v] = d1 - d3;
    }
}

/* A^T, plus `add` (the bias, or zeros) on each output. */
static inline void at4_k(int len, IN4, const float *restrict add, OUT2) {
    for (int v = 0; v < len; v++) {
        const float d0 = a0[v], d1 = a1[v], d2 = a2[v], d3 = a3[v];
        o0[v] = d0 + d1 + d2 + add[v];
        o1[v] = d1 - d2 - d3 + add[v];
    }
}

/* A (4 x 2), the transpose of A^T: spreads a 2-point gradient over the 4 positions. */
static inline void a4_k(int len, const float *restrict a0, const float *restrict a1, OUT4) {
    for (int v = 0; v < len; v++) {
        const float d0 = a0[v], d1 = a1[v];
        o0[v] = d0;
        o1[v] = d0 + d1;
        o2[v] = d0 - d1;
        o3[v] = -d1;
    }
}

/* F(4,3), interpolation points 0, 1, -1, 2, -2 and infinity:
 *   B^T = [4  0 -5  0 1 0;   A^T = [1 1  1 1  1 0;   G = [ 1/4     0    0;
 *          0 -4 -4  1 1 0;          0 1 -1 2 -2 0;         -1/6  -1/6 -1/6;
 *          0  4 -4 -1 1 0;          0 1  1 4  4 0;         -1/6   1/6 -1/6;
 *          0 -2 -1  2 1 0;          0 1 -1 8 -8 1]          1/24 1/12  1/6;
 *          0  2 -1 -2 1 0;                                  1/24 -1/12 1/6;
 *          0  4  0 -5 0 1]                                  0     0    1]
 * The kernels share the sums that pairs of rows have in common. */
static inline void bt6_k(int len, IN6, OUT6) {
    for (int v = 0; v < len; v++) {
        const float d0 = a0[v], d1 = a1[v], d2 = a2[v], d3 = a3[v], d4 = a4[v], d5 = a5[v];
        const float p = d4 - 4.0f * d2, q = d3 - 4.0f * d1;
        const float r = d4 - d2, s = 2.0f * (d3 - d1);
        o0[v] = 4.0f * d0 - 5.0f * d2 + d4;
        o1[v] = p + q;
        o2[v] = p - q;
        o3[v] = r + s;
        o4[v] = r - s;
        o5[v] = 4.0f * d1 - 5.0f * d3 + d5;
    }
}

static inline void at6_k(int len, IN6, const float *restrict add, OUT4) {
    for (int v = 0; v < len; v++) {
        const float d0 = a0[v], d5 = a5[v], b = add[v];
        const float sp = a1[v] + a2[v], sm = a1[v] - a2[v];
        const float tp = a3[v] + a4[v], tm = a3[v] - a4[v];
        o0[v] = d0 + sp + tp + b;
        o1[v] = sm + 2.0f * tm + b;
        o2[v] = sp + 4.0f * tp + b;
        o3[v] = sm + 8.0f * tm + d5 + b;
    }
}

/* A (6 x 4), the transpose of A^T above. */
static inline void a6_k(int len, IN4, OUT6) {
    for (int v = 0; v < len; v++) {
        const float d0 = a0[v], d1 = a1[v], d2 = a2[v], d3 = a3[v];
        const float e1 = d0 + d2, f1 = d1 + d3, e2 = d0 + 4.0f * d2, f2 = 2.0f * d1 + 8.0f * d3;
        o0[v] = d0;
        o1[v] = e1 + f1;
        o2[v] = e1 - f1;
        o3[v] = e2 + f2;
        o4[v] = e2 - f2;
        o5[v] = d3;
    }
}

/* B^T: nt -> nt rows. */
static inline void wino_bt(int m, int len, const float *const *in, float *const *out) {
    if (m == 2)
        bt4_k(len, ROWS4(in), ROWS4(out));
    else
        bt6_k(len, ROWS6(in), ROWS6(out));
}

/* A^T (+ add): nt -> m rows. */
static inline void wino_at(int m, int len, const float *const *in, const float *add,
                           float *const *out) {
    if (m == 2)
        at4_k(len, ROWS4(in), add, out[0], out[1]);
    else
        at6_k(len, ROWS6(in), add, ROWS4(out));
}

/* A: m -> nt rows. */
static inline void wino_a(int m, int len, const float *const *in, float *const *out) {
    if (m == 2)
        a4_k(len, in[0], in[1], ROWS4(out));
    else
        a6_k(len, ROWS4(in), ROWS6(out));
}

/* ---- 2-D tile transforms over a chunk of tiles [t0, t1) -----------------------------------
 * Each works on WINO_CB channels of one tile at a time: a 1-D transform down every column of
 * the tile into a small L1-resident buffer t[i][j][WINO_CB], then along every row of t into
 * the destination. */

static const float wino_zeros[WINO_CB]; /* stands in for pixels outside the input */

/* Points px[i * w + j] at pixel (y0 + i, x0 + j), channel c0, of one sample's [rows][cols][ch]
 * tensor, or at wino_zeros outside it. */
static void wino_window(const float *xs, int rows, int cols, int ch, int y0, int x0, int h, int w,
                        int c0, const float **px) {
    for (int i = 0; i < h; i++)
        for (int j = 0; j < w; j++) {
            const int y = y0 + i, x = x0 + j;
            px[i * w + j] = y < 0 || y >= rows || x < 0 || x >= cols
                                ? wino_zeros
                                : xs + ((size_t)y * cols + x) * ch + c0;
        }
}

/* V[xi][tile][ic] = B^T d B for the input tiles of the chunk. */
MGT_SIMD
static void wino_input(const wino_geom *g, const float *x, size_t t0, size_t t1, wino_buf V) {
    const int m = g->m, nt = g->nt, C = g->ic;
    float t[WINO_PMAX * WINO_CB];
    const float *px[WINO_PMAX], *in[WINO_NMAX];
    float *out[WINO_NMAX];
    wino_tile p = wino_tile_at(g, t0);
    for (size_t tt = t0; tt < t1; tt++, wino_tile_next(g, &p)) {
        float *Vt = V.p + (tt - t0) * V.st;
        const float *xs = x + p.smp * (size_t)g->ih * g->iw * C;
        for (int c0 = 0; c0 < C; c0 += WINO_CB) {
            const int len = C - c0 < WINO_CB ? C - c0 : WINO_CB;
            wino_window(xs, g->ih, g->iw, C, p.ty * m - g->pt, p.tx * m - g->pl, nt, nt, c0, px);
            for (int j = 0; j < nt; j++) { /* down each column: t = B^T d */
                for (int k = 0; k < nt; k++) {
                    in[k] = px[k * nt + j];
                    out[k] = t + ((size_t)k * nt + j) * WINO_CB;
                }
                wino_bt(m, len, in, out);
            }
            for (int i = 0; i < nt; i++) { /* along each row: (B^T d) B */
                for (int k = 0; k < nt; k++) {
                    in[k] = t + ((size_t)i * nt + k) * WINO_CB;
                    out[k] = Vt + (size_t)(i * nt + k) * V.sp + c0;
                }
                wino_bt(m, len, in, out);
            }
        }
    }
}

/* out[pixel][oc] = A^T M A + bias for the output tiles of the chunk; positions past the
 * output's bottom/right edge go to a scratch row and are dropped. */
MGT_SIMD
static void wino_output(const wino_geom *g, wino_buf M, size_t t0, size_t t1, const float *bias,
                        float *y) {
    const int m = g->m, nt = g->nt, C = g->oc;
    float t[WINO_PMAX * WINO_CB], junk[WINO_NMAX][WINO_CB]; /* one row each: restrict */
    const float *in[WINO_NMAX];
    float *out[WINO_NMAX];
    wino_tile p = wino_tile_at(g, t0);
    for (size_t tt = t0; tt < t1; tt++, wino_tile_next(g, &p)) {
        const float *Mt = M.p + (tt - t0) * M.st;
        const int oy0 = p.ty * m, ox0 = p.tx * m;
        float *ys = y + p.smp * (size_t)g->oh * g->ow * C;
        for (int c0 = 0; c0 < C; c0 += WINO_CB) {
            const int len = C - c0 < WINO_CB ? C - c0 : WINO_CB;
            for (int j = 0; j < nt; j++) { /* down each column: t = A^T M */
                for (int k = 0; k < nt; k++)
                    in[k] = Mt + (size_t)(k * nt + j) * M.sp + c0;
                for (int k = 0; k < m; k++)
                    out[k] = t + ((size_t)k * nt + j) * WINO_CB;
                wino_at(m, len, in, wino_zeros, out);
            }
            for (int i = 0; i < m; i++) { /* along each row: (A^T M) A + bias, into y */
                const int oy = oy0 + i;
                for (int k = 0; k < nt; k++)
                    in[k] = t + ((size_t)i * nt + k) * WINO_CB;
                for (int k = 0; k < m; k++)
                    out[k] = oy < g->oh && ox0 + k < g->ow
                                 ? ys + ((size_t)oy * g->ow + ox0 + k) * C + c0
                                 : junk[k];
                wino_at(m, len, in, bias ? bias + c0 : wino_zeros, out);
            }
        }
    }
}

/* D[xi][tile][oc] = A dY A^T for the output-gradient tiles of the chunk (backward filter);
 * dY outside the output is zero. */
MGT_SIMD
static void wino_grad_output(const wino_geom *g, const float *dy, size_t t0, size_t t1,
                             wino_buf D) {
    const int m = g->m, nt = g->nt, C = g->oc;
    float t[WINO_PMAX * WINO_CB];
    const float *px[WINO_PMAX], *in[WINO_NMAX];
    float *out[WINO_NMAX];
    wino_tile p = wino_tile_at(g, t0);
    for (size_t tt = t0; tt < t1; tt++, wino_tile_next(g, &p)) {
        float *Dt = D.p + (tt - t0) * D.st;
        const float *ys = dy + p.smp * (size_t)g->oh * g->ow * C;
        for (int c0 = 0; c0 < C; c0 += WINO_CB) {
            const int len = C - c0 < WINO_CB ? C - c0 : WINO_CB;
            wino_window(ys, g->oh, g->ow, C, p.ty * m, p.tx * m, m, m, c0, px);
            for (int j = 0; j < m; j++) { /* down each column: t = A dY (nt x m) */
                for (int k = 0; k < m; k++)
                    in[k] = px[k * m + j];
                for (int k = 0; k < nt; k++)
                    out[k] = t + ((size_t)k * nt + j) * WINO_CB;
                wino_a(m, len, in, out);
            }
            for (int i = 0; i < nt; i++) { /* along each row: (A dY) A^T */
                for (int k = 0; k < m; k++)
                    in[k] = t + ((size_t)i * nt + k) * WINO_CB;
                for (int k = 0; k < nt; k++)
                    out[k] = Dt + (size_t)(i * nt + k) * D.sp + c0;
                wino_a(m, len, in, out);
            }
        }
    }
}

/* ---- filter transforms (double; c x oc filters, small next to the tiles) ------------------ */

static const double WINO_G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
static const double WINO_G4[6][3] = {{1.0 / 4, 0, 0},
                                     {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                     {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                     {0, 0, 1}};

static const double (*wino_g(int m))[3] {
    return m == 2 ? WINO_G2 : WINO_G4;
}

/* U_xi = G g G^T for the correlation's filters, a < na its input channels (the lanes split
 * them), b < nb its output channels, as the GEMM kernel reads B: in panels of GEMM_NR output
 * channels, U_xi(a, b) at U[xi * na * nbp + (b / NR) * na * NR + a * NR + b % NR], nbp = nb
 * padded to GEMM_NR with zeros. From the layer's OIHW w:
 *   forward        (flip = 0): g = w[b][a] (the layer has na input channels);
 *   backward data  (flip = 1): g = w[a][b] rotated by 180 degrees (nb input channels).
 * Filters go GEMM_NR at a time along b, so each of the P rows written is one panel's row. */
MGT_SIMD
static void wino_filter(int m, int na, int nb, const float *w, int flip, float *U, int a0, int a1) {
    const int nt = m + 2;
    const double(*G)[3] = wino_g(m);
    const size_t plane = (size_t)na * mgt_cpu_pad_up((size_t)nb, GEMM_NR);
    const int lc = flip ? nb : na; /* the layer's input channels */
    double gg[9][GEMM_NR], t[WINO_NMAX][3][GEMM_NR];
    for (int a = a0; a < a1; a++)
        for (int b0 = 0; b0 < nb; b0 += GEMM_NR) {
            const int len = nb - b0 < GEMM_NR ? nb - b0 : GEMM_NR;
            for (int v = 0; v < len; v++) {
                const int o = flip ? a : b0 + v, ch = flip ? b0 + v : a;
                const float *f = w + ((size_t)o * lc + ch) * 9;
                for (int k = 0; k < 9; k++)
                    gg[k][v] = f[flip ? 8 - k : k];
            }
            for (int i = 0; i < nt; i++) /* t = G g */
                for (int j = 0; j < 3; j++)
                    for (int v = 0; v < len; v++)
                        t[i][j][v] =
                            G[i][0] * gg[j][v] + G[i][1] * gg[3 + j][v] + G[i][2] * gg[6 + j][v];
            for (int i = 0; i < nt; i++) /* (G g) G^T */
                for (int j = 0; j < nt; j++) {
                    float *restrict dst =
                        U + (size_t)(i * nt + j) * plane + (size_t)b0 * na + (size_t)a * GEMM_NR;
                    for (int v = 0; v < len; v++)
                        dst[v] = (float)(t[i][0][v] * G[j][0] + t[i][1][v] * G[j][1] +
                                         t[i][2][v] * G[j][2]);
                    for (int v = len; v < GEMM_NR; v++)
                        dst[v] = 0.0f;
                }
        }
}

/* dW[o][ch] = G^T (S0 + S1)[xi](o, ch) G (3 x 3 from nt x nt) for o in [o0, o1), S_xi(o, ch)
 * at S[xi * plane + o * so + ch * sc]: the two partial sums of the backward-filter pass are
 * added here, in double, WINO_CB channels at a time. */
MGT_SIMD
static void wino_filter_grad(int m, int oc, int c, const float *S0, const float *S1, size_t plane,
                             size_t so, size_t sc, float *dw, int o0, int o1) {
    (void)oc;
    const int nt = m + 2;
    const double(*G)[3] = wino_g(m);
    double sm[WINO_PMAX][WINO_CB], t[3][WINO_NMAX][WINO_CB];
    for (int o = o0; o < o1; o++)
        for (int c0 = 0; c0 < c; c0 += WINO_CB) {
            const int len = c - c0 < WINO_CB ? c - c0 : WINO_CB;
            const size_t at = (size_t)o * c + c0, s_at = (size_t)o * so + (size_t)c0 * sc;
            for (int k = 0; k < nt * nt; k++)
                for (int v = 0; v < len; v++)
                    sm[k][v] = (double)S0[k * plane + s_at + v * sc] +
                               (double)S1[k * plane + s_at + v * sc];
            for (int i = 0; i < 3; i++) /* t = G^T S */
                for (int j = 0; j < nt; j++) {
                    for (int v = 0; v < len; v++)
                        t[i][j][v] = 0.0;
                    for (int k = 0; k < nt; k++)
                        for (int v = 0; v < len; v++)
                            t[i][j][v] += G[k][i] * sm[k * nt + j][v];
                }
            for (int v = 0; v < len; v++) { /* (G^T S) G */
                float *f = dw + (at + v) * 9;
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 3; j++) {
                        double acc = 0.0;
                        for (int k = 0; k < nt; k++)
                            acc += t[i][k][v] * G[k][j];
                        f[i * 3 + j] = (float)acc;
                    }
            }
        }
}

/* ---- sizing ------------------------------------------------------------------------------- *
 * Scratch: [ U, or S0 and S1 ][ lane 0's buffers ][ lane 1's ] ... The three passes of a layer
 * (c input and oc output channels, P positions) lay them out so (T tiles per chunk):
 *   forward        U: P x c x oc32       lane: V (T6 x P x c), M (T6 x P x oc32)
 *   backward data  U: P x oc x c32       lane: V (T6 x P x oc), M (T6 x P x c32)
 *   backward filter S0, S1: P x R6 x C32  lane: the tiles of x and of dy (T x P each, rows
 *                  padded as the product takes them)
 * where n6 and n32 are n padded to GEMM_MR and GEMM_NR, and (R, C) is (oc, c) or (c, oc)
 * (wino_grad_rows_oc). Every pass plans with the largest of the three, so that one size of
 * scratch gives all three passes the same chunks. The backward-filter pass sums its tiles into
 * two fixed halves S0 and S1 (added at the end), which makes its result independent of how
 * many lanes ran. */

int mgt_cpu_wino_fits(const mgt_conv_shape *s) {
    return s->kh == 3 && s->kw == 3 && s->stride == 1 && s->c > 0 && s->oc > 0 && s->h > 0 &&
           s->w > 0 && s->oh > 0 && s->ow > 0;
}

/* Backward filter's product has the layer's output channels as rows (padded to GEMM_MR) and its
 * input channels as columns (padded to GEMM_NR), or the other way round: whichever pads less. */
static int wino_grad_rows_oc(int c, int oc) {
    return mgt_cpu_pad_up((size_t)oc, GEMM_MR) * mgt_cpu_pad_up((size_t)c, GEMM_NR) <=
           mgt_cpu_pad_up((size_t)c, GEMM_MR) * mgt_cpu_pad_up((size_t)oc, GEMM_NR);
}

/* Row strides of the backward-filter pass's tile buffers (x's, dy's): the operand whose channels
 * are the product's rows is padded to GEMM_MR, the other to GEMM_NR. */
static size_t wino_grad_x_stride(int c, int oc) {
    return mgt_cpu_pad_up((size_t)c, wino_grad_rows_oc(c, oc) ? GEMM_NR : GEMM_MR);
}
static size_t wino_grad_dy_stride(int c, int oc) {
    return mgt_cpu_pad_up((size_t)oc, wino_grad_rows_oc(c, oc) ? GEMM_MR : GEMM_NR);
}

/* Floats of one S_xi block (P of them make S0, as many S1). */
static size_t wino_grad_block(int c, int oc) {
    const int roc = wino_grad_rows_oc(c, oc);
    return mgt_cpu_pad_up((size_t)(roc ? oc : c), GEMM_MR) *
           mgt_cpu_pad_up((size_t)(roc ? c : oc), GEMM_NR);
}

typedef struct {
    size_t planes, lane; /* floats: U or S0 + S1; one lane's buffers */
} wino_need;

static size_t max3(size_t a, size_t b, size_t c) {
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

/* What the largest of a layer's three passes needs for chunks of T tiles. */
static wino_need wino_need_of(size_t P, int c, int oc, size_t T) {
    const size_t T6 = mgt_cpu_pad_up(T, GEMM_MR), c32 = mgt_cpu_pad_up((size_t)c, GEMM_NR);
    const size_t oc32 = mgt_cpu_pad_up((size_t)oc, GEMM_NR);
    const size_t fwd_u = P * (size_t)c * oc32, data_u = P * (size_t)oc * c32;
    const size_t grad_s = 2 * align16(P * wino_grad_block(c, oc));
    const size_t fwd = align16(T6 * P * (size_t)c) + align16(T6 * P * oc32);
    const size_t data = align16(T6 * P * (size_t)oc) + align16(T6 * P * c32);
    const size_t grad =
        align16(T * P * wino_grad_x_stride(c, oc)) + align16(T * P * wino_grad_dy_stride(c, oc));
    return (wino_need){align16(max3(fwd_u, data_u, grad_s)), max3(fwd, data, grad)};
}

size_t mgt_cpu_wino_scratch_tiles(int m, int c, int oc, size_t tiles, int lanes) {
    const wino_need need = wino_need_of((size_t)(m + 2) * (m + 2), c, oc, tiles);
    return sizeof(float) * (need.planes + (size_t)lanes * need.lane);
}

/* Tiles per chunk: as many as keep a lane's buffers within WINO_LANE_BYTES, a multiple of
 * GEMM_MR. Measured at batch 128 on the 2 lanes of a 2-core AMD EPYC (Zen 4, 1 MB L2 per
 * core), F(4x4), CPU ms of both threads fwd / bwd data / bwd filter, best of 3, two runs:
 *   26x26x32 -> 256:    24 tiles (1 MB): 44-46/70-77/49-54   48: 46-48/73-77/49-50
 *                       96: 48/79/50-55
 *   24x24x256 -> 128:   18 tiles (1 MB): 126-127/132-140/148-156   36: 131-134/141-143/154-158
 *                       72: 139-142/147-150/186-204 */
static size_t wino_target_tiles(size_t P, int c, int oc) {
    const size_t floats = WINO_LANE_BYTES / sizeof(float);
    size_t t =
        floats / (P * (mgt_cpu_pad_up((size_t)c, GEMM_NR) + mgt_cpu_pad_up((size_t)oc, GEMM_NR)));
    while (t > 1 && wino_need_of(P, c, oc, t).lane > floats)
        t--;
    if (t >= GEMM_MR)
        t -= t % GEMM_MR;
    return t ? t : 1;
}

size_t mgt_cpu_wino_scratch(const mgt_conv_shape *s, int m) {
    if (!mgt_cpu_wino_fits(s) || (m != 2 && m != 4))
        return 0;
    const size_t P = (size_t)(m + 2) * (m + 2);
    size_t t = wino_target_tiles(P, s->c, s->oc);
    /* no more than the batch has (backward data tiles dx, h x w, forward y, oh x ow) */
    const size_t n = (size_t)(s->n > 0 ? s->n : 1);
    const size_t ty = (size_t)((s->oh > s->h ? s->oh : s->h) + m - 1) / m;
    const size_t tx = (size_t)((s->ow > s->w ? s->ow : s->w) + m - 1) / m;
    if (t > n * ty * tx)
        t = n * ty * tx;
    return mgt_cpu_wino_scratch_tiles(m, s->c, s->oc, t, WINO_MAX_LANES);
}

/* ---- lanes -------------------------------------------------------------------------------- *
 * A pass runs on up to `lanes` lanes of the backend's workers (cpu_lanes.c; the calling thread
 * is lane 0). Each lane takes whole chunks - transform, P GEMMs, inverse transform - on its own
 * L2-sized buffers, so the transforms run in parallel too, and the GEMMs need no
 * synchronisation. Every buffer is in the reserved scratch, and the lanes' only shared state is
 * the job below. */

typedef struct wino_job wino_job;
typedef void (*wino_task)(wino_job *job, int lane);

struct wino_job {
    const wino_geom *g;
    mgt_cpu_lanes *pool;
    int lanes;
    int c, oc;          /* the layer's channels (for backward data, g's are swapped) */
    size_t tc, nchunks; /* tiles per chunk, chunks */
    atomic_size_t next; /* next chunk (forward, backward data) or half (backward filter) */
    float *U;           /* transformed filters (or S0, with S1 = U + plane) */
    size_t plane;       /* floats of S0 (backward filter) */
    float *lane0;       /* lane l's buffers at lane0 + l * lane_floats */
    size_t lane_floats;
    wino_gemm_fn gemm;
    const float *w; /* filters, OIHW */
    int flip;       /* filter transform for backward data */
    const float *in, *bias, *dy;
    float *out;
    wino_task task;
};

static void wino_lane(void *ctx, int lane) {
    wino_job *job = ctx;
    job->task(job, lane);
}

static void wino_run(wino_job *job, int lanes, wino_task task) {
    job->task = task;
    mgt_cpu_lanes_run(job->pool, lanes, wino_lane, job);
}

/* Lane l's share [lo, hi) of n items split in `lanes` contiguous parts. */
static void wino_share(int n, int lane, int lanes, int *lo, int *hi) {
    *lo = (int)((long long)n * lane / lanes);
    *hi = (int)((long long)n * (lane + 1) / lanes);
}

/* Plans a pass: tiles per chunk and lanes that the scratch allows (0 tiles: it cannot run). */
static void wino_plan(wino_job *job, float *scratch, size_t bytes) {
    const wino_geom *g = job->g;
    int lanes = mgt_cpu_lanes_count(job->pool);
    const size_t P = (size_t)g->P;
    const size_t floats = scratch ? bytes / sizeof(float) : 0;
    const size_t planes = wino_need_of(P, job->c, job->oc, 1).planes;
    job->tc = 0;
    if (lanes < 1)
        lanes = 1;
    if (lanes > WINO_MAX_LANES)
        lanes = WINO_MAX_LANES;
    if (floats <= planes)
        return;
    const size_t avail = floats - planes;
    const size_t want = wino_target_tiles(P, job->c, job->oc);
    for (; lanes >= 1; lanes--) {
        const size_t per_lane = avail / (size_t)lanes;
        size_t t = want;
        while (t > 0 && wino_need_of(P, job->c, job->oc, t).lane > per_lane)
            t--;
        if (t == 0)
            continue;
        const double macs = (double)g->tiles * (double)P * job->c * (double)job->oc;
        if (lanes > 1 && macs < WINO_LANE_MIN_MACS * lanes)
            continue; /* too little work to share: fewer lanes */
        /* Small batches: chunks small enough to give every lane work. Split for the most
         * lanes, not this call's, so that the chunking (hence where backward filter's halves
         * meet) does not depend on the thread count. */
        const size_t even =
            mgt_cpu_pad_up((g->tiles + WINO_MAX_LANES - 1) / WINO_MAX_LANES, GEMM_MR);
        t = t < even ? t : even;
        job->tc = t;
        job->lanes = lanes;
        job->nchunks = (g->tiles + job->tc - 1) / job->tc;
        job->U = scratch;
        job->plane = align16(P * wino_grad_block(job->c, job->oc));
        job->lane0 = scratch + planes;
        job->lane_floats = wino_need_of(P, job->c, job->oc, t).lane;
        job->gemm = wino_gemm_pick();
        atomic_init(&job->next, 0);
        return;
    }
}

/* ---- the three passes --------------------------------------------------------------------- */

/* Filter transform, lanes splitting the correlation's input channels. */
static void wino_task_filter(wino_job *job, int lane) {
    const wino_geom *g = job->g;
    int a0, a1;
    wino_share(g->ic, lane, job->lanes, &a0, &a1);
    wino_filter(g->m, g->ic, g->oc, job->w, job->flip, job->U, a0, a1);
}

/* out = in (*) w: chunks taken in any order (a tile's result depends only on the tile). Each
 * GEMM takes the chunk's rows rounded up to GEMM_MR: V's extra rows are zeroed, M's dropped. */
static void wino_task_corr(wino_job *job, int lane) {
    const wino_geom *g = job->g;
    const int P = g->P, ic = g->ic;
    const size_t rows = mgt_cpu_pad_up(job->tc, GEMM_MR),
                 oc32 = mgt_cpu_pad_up((size_t)g->oc, GEMM_NR);
    float *vp = job->lane0 + (size_t)lane * job->lane_floats;
    const wino_buf V = wino_buf_at(vp, rows, (size_t)ic);
    const wino_buf M = wino_buf_at(vp + align16(rows * P * (size_t)ic), rows, oc32);
    for (;;) {
        const size_t k = atomic_fetch_add(&job->next, 1);
        if (k >= job->nchunks)
            break;
        const size_t t0 = k * job->tc, t1 = t0 + job->tc < g->tiles ? t0 + job->tc : g->tiles;
        const size_t n = t1 - t0, n6 = mgt_cpu_pad_up(n, GEMM_MR);
        wino_input(g, job->in, t0, t1, V);
        for (int xi = 0; xi < P; xi++) { /* M_xi = V_xi U_xi */
            if (n6 > n)
                memset(V.p + xi * V.sp + n * V.st, 0, sizeof(float) * (n6 - n) * V.st);
            const wino_gemm_args a = {.rows = (int)n6,
                                      .cols = (int)oc32,
                                      .K = ic,
                                      .a = V.p + xi * V.sp,
                                      .ai = (ptrdiff_t)V.st,
                                      .ak = 1,
                                      .b = job->U + (size_t)xi * ic * oc32,
                                      .bp = (ptrdiff_t)ic * GEMM_NR,
                                      .bk = GEMM_NR,
                                      .c = M.p + xi * M.sp,
                                      .ldc = (ptrdiff_t)M.st};
            job->gemm(&a);
        }
        wino_output(g, M, t0, t1, job->bias, job->out);
    }
}

static int wino_corr(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, const wino_geom *g,
                     const float *w, int flip, const float *in, const float *bias, float *out) {
    wino_job job = {.g = g,
                    .pool = lanes,
                    .c = flip ? g->oc : g->ic,
                    .oc = flip ? g->ic : g->oc,
                    .w = w,
                    .flip = flip,
                    .in = in,
                    .bias = bias,
                    .out = out};
    wino_plan(&job, scratch, bytes);
    if (job.tc == 0)
        return -1;
    wino_run(&job, job.lanes, wino_task_filter);
    wino_run(&job, job.lanes, wino_task_corr);
    return 0;
}

/* Backward filter: half h of the chunks sums into S_h, in chunk order, on one lane. The tile
 * buffers' padding columns are zeroed once and never written by the transforms, so they add
 * zeros to padding rows and columns of S that nothing reads. */
static void wino_task_grad(wino_job *job, int lane) {
    const wino_geom *g = job->g;
    const int P = g->P, c = g->ic, oc = g->oc, roc = wino_grad_rows_oc(c, oc);
    const size_t xs = wino_grad_x_stride(c, oc), ds = wino_grad_dy_stride(c, oc);
    float *vp = job->lane0 + (size_t)lane * job->lane_floats;
    const wino_buf X = wino_buf_at(vp, job->tc, xs);
    const wino_buf D = wino_buf_at(vp + align16(job->tc * P * xs), job->tc, ds);
    int zeroed = 0;
    /* S_xi = sum over tiles of D_xi^T X_xi (rows oc), or of X_xi^T D_xi (rows c) */
    const wino_buf rows_op = roc ? D : X, cols_op = roc ? X : D;
    const size_t rows = mgt_cpu_pad_up((size_t)(roc ? oc : c), GEMM_MR);
    const size_t cols = mgt_cpu_pad_up((size_t)(roc ? c : oc), GEMM_NR);
    for (;;) { /* the halves go to whichever lane is free: a late worker leaves its half */
        const size_t h = atomic_fetch_add(&job->next, 1);
        if (h >= WINO_GROUPS)
            break;
        if (!zeroed) {
            memset(vp, 0, sizeof(float) * job->lane_floats);
            zeroed = 1;
        }
        float *S = job->U + (size_t)h * job->plane;
        const size_t k0 = job->nchunks * (size_t)h / WINO_GROUPS,
                     k1 = job->nchunks * (size_t)(h + 1) / WINO_GROUPS;
        if (k0 == k1)
            memset(S, 0, sizeof(float) * (size_t)P * rows * cols);
        for (size_t k = k0; k < k1; k++) {
            const size_t t0 = k * job->tc, t1 = t0 + job->tc < g->tiles ? t0 + job->tc : g->tiles;
            wino_input(g, job->in, t0, t1, X);
            wino_grad_output(g, job->dy, t0, t1, D);
            for (int xi = 0; xi < P; xi++) {
                const wino_gemm_args a = {.rows = (int)rows,
                                          .cols = (int)cols,
                                          .K = (int)(t1 - t0),
                                          .acc = k > k0,
                                          .a = rows_op.p + xi * rows_op.sp,
                                          .ai = 1,
                                          .ak = (ptrdiff_t)rows_op.st,
                                          .b = cols_op.p + xi * cols_op.sp,
                                          .bp = GEMM_NR,
                                          .bk = (ptrdiff_t)cols_op.st,
                                          .c = S + (size_t)xi * rows * cols,
                                          .ldc = (ptrdiff_t)cols};
                job->gemm(&a);
            }
        }
    }
}

static void wino_task_grad_filter(wino_job *job, int lane) {
    const wino_geom *g = job->g;
    const int c = g->ic, oc = g->oc, roc = wino_grad_rows_oc(c, oc);
    /* S_xi(o, ch): rows oc, columns c (padded to GEMM_NR), or the transpose */
    const size_t ld = mgt_cpu_pad_up((size_t)(roc ? c : oc), GEMM_NR);
    int o0, o1;
    wino_share(oc, lane, job->lanes, &o0, &o1);
    wino_filter_grad(g->m, oc, c, job->U, job->U + job->plane, wino_grad_block(c, oc), roc ? ld : 1,
                     roc ? 1 : ld, job->out, o0, o1);
}

static int wino_grad(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, const wino_geom *g,
                     const float *x, const float *dy, float *dw) {
    wino_job job = {.g = g, .pool = lanes, .c = g->ic, .oc = g->oc, .in = x, .dy = dy, .out = dw};
    wino_plan(&job, scratch, bytes);
    if (job.tc == 0)
        return -1;
    wino_run(&job, job.lanes < WINO_GROUPS ? job.lanes : WINO_GROUPS, wino_task_grad);
    wino_run(&job, job.lanes, wino_task_grad_filter);
    return 0;
}

int mgt_cpu_wino_fwd(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, int m,
                     const mgt_conv_shape *s, const float *x, const float *w, const float *b,
                     float *y) {
    if (!mgt_cpu_wino_fits(s) || (m != 2 && m != 4))
        return -1;
    const wino_geom g =
        wino_geom_of(m, s->n, s->h, s->w, s->c, s->oh, s->ow, s->oc, s->pad_top, s->pad_left);
    if (g.tiles == 0)
        return 0;
    return wino_corr(scratch, bytes, lanes, &g, w, 0, x, b, y);
}

int mgt_cpu_wino_bwd_data(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, int m,
                          const mgt_conv_shape *s, const float *w, const float *dy, float *dx) {
    if (!mgt_cpu_wino_fits(s) || (m != 2 && m != 4))
        return -1;
    /* dx (h x w) = dy (oh x ow, zero outside) correlated with the rotated kernel: dx[iy] gets
     * dy[iy + pad - i] * w[i] = dy[iy - (2 - pad) + i'] * w[2 - i']. */
    const wino_geom g = wino_geom_of(m, s->n, s->oh, s->ow, s->oc, s->h, s->w, s->c, 2 - s->pad_top,
                                     2 - s->pad_left);
    if (g.tiles == 0)
        return 0;
    return wino_corr(scratch, bytes, lanes, &g, w, 1, dy, NULL, dx);
}

int mgt_cpu_wino_bwd_filter(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, int m,
                            const mgt_conv_shape *s, const float *x, const float *dy, float *dw) {
    if (!mgt_cpu_wino_fits(s) || (m != 2 && m != 4))
        return -1;
    const wino_geom g =
        wino_geom_of(m, s->n, s->h, s->w, s->c, s->oh, s->ow, s->oc, s->pad_top, s->pad_left);
    if (g.tiles == 0) {
        memset(dw, 0, sizeof(float) * (size_t)s->oc * s->c * 9);
        return 0;
    }
    return wino_grad(scratch, bytes, lanes, &g, x, dy, dw);
}
