/* cpu_internal.h: private to src/cpu/. The CPU reference backend's state and the ops each of its
 * files defines; cpu_backend.c gathers them into the "cpu" op table.
 *
 * Files:
 *   cpu_backend.c  memory, scratch, the table, init/destroy, dense, flatten layout changes;
 *   cpu_lanes.c    the worker threads, and ranges cut in parts for them;
 *   cpu_gemm.c     GEMMs split across the lanes, with a dense layer's epilogue;
 *   cpu_blas.c     which OpenBLAS kernel runs, and choosing it where OpenBLAS cannot;
 *   cpu_conv.c     convolution: the choice between Winograd, cpu_convk.c and im2col +
 *                  OpenBLAS GEMM (chunked through the scratch buffer), and the last;
 *   cpu_winograd.c 3x3 stride-1 convolution by Winograd F(2x2,3x3) / F(4x4,3x3);
 *   cpu_convk.c    other stride-1 convolution, read straight from NHWC (no column matrix);
 *   cpu_pool.c     max / average pooling;
 *   cpu_graph.c    what graph models add: residual sums, concatenation, zero padding, global
 *                  average pooling;
 *   cpu_depthwise.c depthwise convolution;
 *   cpu_norm.c     batch normalisation;
 *   cpu_elem.c     activations, dropout, fused softmax + cross-entropy;
 *   cpu_seq.c      sequence models: [in][out] dense layers, embeddings, layer normalisation,
 *                  attention;
 *   cpu_clip.c     gradient clipping by value and by global norm;
 *   cpu_optim.c    the optimizers' steps over the flat parameter arena.
 *
 * No file holds mutable globals: everything per instance lives in mgt_cpu_impl (be->impl). */
#ifndef MGT_CPU_INTERNAL_H
#define MGT_CPU_INTERNAL_H

#include <cblas.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../simd.h"
#include "backend.h"

/* v where keep is true, else +0: act_bwd's ReLU gradient (y > 0 ? g : 0) written as a bit mask,
 * which compilers keep branch-free (and vectorise) where a ternary operator may become a branch
 * around the computation of v, costly on a ReLU's unpredictable signs. */
static inline float mgt_cpu_keep_if(float v, int keep) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u &= (uint32_t)0 - (uint32_t)(keep != 0);
    memcpy(&v, &u, sizeof v);
    return v;
}

/* e^v without a call per element (glibc's expf is one): v = k ln 2 + r with k the nearest
 * integer to v / ln 2 (ln 2 in two parts, Cody and Waite's reduction, so r is exact to
 * |r| <= ln 2 / 2), e^r by its Taylor polynomial of degree 7 (truncation below |r|^8 / 8! <
 * 6e-9, a tenth of float's rounding), times 2^k put into the exponent's bits: within 2 units in
 * the last place of e^v (Horner's roundings). v is clamped to [-87, 88], where e^v stays a
 * normal float (e^-87 = 1.6e-38 stands for anything smaller, which a softmax's sum of at least
 * 1 cannot see); NaN stays NaN. Two forms of the same arithmetic: mgt_cpu_exp on one float, and
 * mgt_cpu_exp8 on eight at once in a vector of GCC's and Clang's vector extension (two SSE
 * registers in the baseline build, one AVX register in the x86-64-v3 clones), which is how the
 * hot loops call it: the compiler keeps the clamp of the scalar form a branch, and the loop
 * around it scalar, unless floating-point traps are assumed away. In a vector the clamp is a
 * select, and every element of a loop over blocks of 8 takes the same instructions, so a
 * pass split across lanes at multiples of 8 gives the same bits on any number of threads. */
#define MGT_EXP_LO (-87.0f)
#define MGT_EXP_HI 88.0f
#define MGT_EXP_POLY(p, r)                                                                         \
    do {                                                                                           \
        p = (r) * (1.0f / 5040.0f) + 1.0f / 720.0f;                                                \
        p = p * (r) + 1.0f / 120.0f;                                                               \
        p = p * (r) + 1.0f / 24.0f;                                                                \
        p = p * (r) + 1.0f / 6.0f;                                                                 \
        p = p * (r) + 0.5f;                                                                        \
        p = p * (r) + 1.0f;                                                                        \
        p = p * (r) + 1.0f;                                                                        \
    } while (0)

static inline float mgt_cpu_exp(float v) {
    v = v < MGT_EXP_LO ? MGT_EXP_LO : v > MGT_EXP_HI ? MGT_EXP_HI : v;
    const float k = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const float r = (v - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;
    float p;
    MGT_EXP_POLY(p, r);
    const uint32_t bits = (uint32_t)((int32_t)k + 127) << 23; /* unsigned: NaN's k shifts too */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Eight floats (and their bit patterns) as one value; loaded and stored with memcpy, which
 * compiles to one unaligned vector move. Passed by pointer: a 32-byte vector passed by value
 * changes the ABI between the clones (GCC's -Wpsabi). */
typedef float mgt_v8f __attribute__((vector_size(32)));
typedef int32_t mgt_v8i __attribute__((vector_size(32)));
typedef uint32_t mgt_v8u __attribute__((vector_size(32)));

/* *v = e^*v, element by element, as mgt_cpu_exp computes it (the blend of a comparison's mask:
 * NaN compares false, and stays). */
static inline __attribute__((always_inline)) void mgt_cpu_exp8(mgt_v8f *v) {
    const mgt_v8f lo = (mgt_v8f){0} + MGT_EXP_LO, hi = (mgt_v8f){0} + MGT_EXP_HI;
    mgt_v8i m = *v < lo;
    mgt_v8f x = (mgt_v8f)(((mgt_v8i)lo & m) | ((mgt_v8i)*v & ~m));
    m = x > hi;
    x = (mgt_v8f)(((mgt_v8i)hi & m) | ((mgt_v8i)x & ~m));
    const mgt_v8f k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const mgt_v8f r = (x - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;
    mgt_v8f p;
    MGT_EXP_POLY(p, r);
    const mgt_v8u bits = (mgt_v8u)(__builtin_convertvector(k, mgt_v8i) + 127) << 23;
    *v = p * (mgt_v8f)bits;
}

/* x rounded up to a multiple of q (buffer sizes in floats, channel counts in blocks). */
static inline size_t mgt_cpu_pad_up(size_t x, size_t q) {
    return (x + q - 1) / q * q;
}

/* cpu_lanes.c: worker threads started with the backend, for passes split in lanes. */
typedef struct mgt_cpu_lanes mgt_cpu_lanes;
/* n lanes: the calling thread and n - 1 workers (fewer if threads cannot be had). */
mgt_cpu_lanes *mgt_cpu_lanes_create(int n);
int mgt_cpu_lanes_count(const mgt_cpu_lanes *l); /* NULL: 1 */
/* Runs fn(ctx, lane) for lane = 0 .. lanes - 1, lane 0 on the calling thread, the others on the
 * workers (or the caller, beyond them), and returns when all are done. l may be NULL. */
void mgt_cpu_lanes_run(mgt_cpu_lanes *l, int lanes, void (*fn)(void *ctx, int lane), void *ctx);
void mgt_cpu_lanes_destroy(mgt_cpu_lanes *l);
/* fn(ctx, lo, hi) over [0, n) cut into parts of at least min_part items (boundaries at multiples
 * of 16 items), which the lanes take in any order; the calling thread alone does all of [0, n)
 * when there is one lane or too little work for two parts. For passes whose every item is
 * computed the same way wherever the cuts fall (element-wise maps, per-channel sums over all
 * rows), so that the results do not depend on the number of threads. */
void mgt_cpu_lanes_for(mgt_cpu_lanes *l, size_t n, size_t min_part,
                       void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx);
/* Part boundaries of mgt_cpu_lanes_for and mgt_cpu_lanes_parts: multiples of 16 items (64 bytes
 * of floats). */
#define MGT_CPU_SPLIT_ALIGN 16
/* fn(ctx, lo, hi) over [0, n) in `parts` parts, the units of MGT_CPU_SPLIT_ALIGN items shared out
 * evenly (shares differ by one unit at most; fixed by n and parts alone), which the lanes take in
 * any order; on one lane, or with one part, in order on the calling thread. */
void mgt_cpu_lanes_parts(mgt_cpu_lanes *l, size_t n, size_t parts,
                         void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx);

/* cpu_gemm.c: GEMMs split across the lanes. */
/* C = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm (OpenBLAS single-threaded): the
 * larger GEMMs are cut into parts fixed by the shape alone (rows or columns of C) that the lanes
 * take, so the result is the same on any number of threads. l may be NULL. */
void mgt_cpu_gemm(mgt_cpu_lanes *l, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K,
                  float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                  float *C, int ldc);
/* One cblas_sgemm call's arguments (row-major). */
typedef struct mgt_cpu_gemm_args {
    CBLAS_TRANSPOSE ta, tb;
    int M, N, K;
    float alpha;
    const float *A;
    int lda;
    const float *B;
    int ldb;
    float beta;
    float *C;
    int ldc;
} mgt_cpu_gemm_args;
/* What a split product writes around each lane's part of C, by that lane while the part is in
 * cache (every field optional): bias, C's rows start as this row (beta = 1; the product's beta
 * is not read), as a dense layer's forward wants; relu, then act_fwd's ReLU (C < 0 ? 0 : C);
 * mask, then C = mask > 0 ? C : 0 (mgt_cpu_keep_pos_rows, mask laid out as C: the gradient of
 * the ReLU whose output the mask is). */
typedef struct mgt_cpu_gemm_epi {
    const float *bias;
    int relu;
    const float *mask;
} mgt_cpu_gemm_epi;
/* mgt_cpu_gemm with an epilogue (NULL: none), split as mgt_cpu_gemm splits. */
void mgt_cpu_gemm_with(mgt_cpu_lanes *l, const mgt_cpu_gemm_args *a, const mgt_cpu_gemm_epi *e);
/* Two independent products (a backward's weight and input gradients): where mgt_cpu_gemm would
 * cut neither in more than two parts, each is one call, the two on two lanes at once (or one
 * after the other on one lane), so that no operand is packed twice; larger ones are each split
 * as mgt_cpu_gemm splits them. Which way is fixed by the shapes alone. b_epi: b's epilogue
 * (mgt_cpu_gemm_epi; NULL: none). */
void mgt_cpu_gemm_pair(mgt_cpu_lanes *l, const mgt_cpu_gemm_args *a, const mgt_cpu_gemm_args *b,
                       const mgt_cpu_gemm_epi *b_epi);
/* cpu_elem.c: the row-wise passes of a split product's epilogue. */
/* ReLU in place on an m x n block of rows `ld` floats apart (act_fwd's: NaN stays NaN). */
void mgt_cpu_relu_rows(int m, int n, int ld, float *c);
/* c = mask > 0 ? c : 0 in place on an m x n block of rows `ld` floats apart, the mask laid out
 * alike (a ReLU's gradient, act_bwd's, where the mask is the ReLU's output or input). */
void mgt_cpu_keep_pos_rows(int m, int n, int ld, float *c, const float *mask);

typedef struct mgt_cpu_impl {
    /* Scratch for the ops' own use (the convolution's column buffer). 64-byte aligned; only
     * reserve() (re)allocates it, ops never do. NULL / 0 until the first reserve(). */
    float *scratch;
    size_t scratch_bytes;
    int threads;          /* threads asked for at init (0: as many as OpenBLAS would have used) */
    mgt_cpu_lanes *lanes; /* one per thread the backend was given, for the passes split in lanes */
} mgt_cpu_impl;

static inline mgt_cpu_impl *mgt_cpu_impl_of(mgt_backend *be) {
    return (mgt_cpu_impl *)be->impl;
}

/* out[j] = sum over rows of m[r][j], accumulated in double (out is overwritten; rows may be 0). */
void mgt_cpu_colsum(size_t rows, int cols, const float *m, float *out);

/* cpu_backend.c */
void mgt_cpu_dense_fwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *b, float *y);
void mgt_cpu_dense_bwd_rows(mgt_backend *be, int n, int in, int out, int r0, int r1, const float *x,
                            const float *dy, float *dw);
void mgt_cpu_dense_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                       const float *dy, float *dx, float *dw, float *db);
void mgt_cpu_nhwc_to_chw(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y);
void mgt_cpu_chw_to_nhwc(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y);

/* cpu_conv.c */
size_t mgt_cpu_conv2d_scratch(const mgt_conv_shape *s);
void mgt_cpu_conv2d_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y);
void mgt_cpu_conv2d_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db);
/* The Winograd variant conv2d uses for this shape: output tile side 2 or 4, 0 for none. */
int mgt_cpu_conv_wino_tile(const mgt_conv_shape *s);

/* cpu_winograd.c: 3x3 stride-1 convolution (forward, backward data, backward filter) by
 * Winograd F(m x m, 3 x 3), m = 2 or 4, through the given scratch buffer, on the lanes of
 * `lanes` (NULL: the calling thread alone). Each pass returns 0 when done and -1, having written
 * nothing, when the shape does not qualify or the scratch cannot hold one tile's buffers (the
 * caller then takes another path). n == 0 writes nothing (backward filter: zeros). */
int mgt_cpu_wino_fits(const mgt_conv_shape *s); /* 3x3, stride 1, non-empty */
/* Scratch bytes for bounded chunks of tiles on up to 4 lanes (the three passes need the same);
 * 0 if the shape does not fit. */
size_t mgt_cpu_wino_scratch(const mgt_conv_shape *s, int m);
/* Scratch bytes for chunks of `tiles` tiles on `lanes` lanes, c and oc channels. */
size_t mgt_cpu_wino_scratch_tiles(int m, int c, int oc, size_t tiles, int lanes);
int mgt_cpu_wino_fwd(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, int m,
                     const mgt_conv_shape *s, const float *x, const float *w, const float *b,
                     float *y);
int mgt_cpu_wino_bwd_data(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, int m,
                          const mgt_conv_shape *s, const float *w, const float *dy, float *dx);
int mgt_cpu_wino_bwd_filter(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, int m,
                            const mgt_conv_shape *s, const float *x, const float *dy, float *dw);
/* The passes' GEMM kernel, for the tests: the variants this CPU runs (the base one, then the
 * x86-64-v3 and x86-64-v4 ones where the CPU has them; the passes use the last), and one
 * product by variant `variant`: C = A B (acc: C += A B), rows a multiple of 6 and cols of 32,
 * A(i, k) = a[i * ai + k * ak], B(k, j) = b[(j / 32) * bp + k * bk + j % 32],
 * C(i, j) = c[i * ldc + j]. Returns the variant's name, NULL (and does nothing) when there is
 * no such variant or the sizes are not multiples. */
int mgt_cpu_wino_gemm_count(void);
const char *mgt_cpu_wino_gemm(int variant, int rows, int cols, int K, int acc, const float *a,
                              ptrdiff_t ai, ptrdiff_t ak, const float *b, ptrdiff_t bp,
                              ptrdiff_t bk, float *c, ptrdiff_t ldc);

/* cpu_convk.c: stride-1 convolution read straight from NHWC (no column matrix), for what
 * Winograd does not take. Each pass returns 0 when done and -1, having written nothing, when
 * the shape does not qualify (mgt_cpu_convk_fits) or the scratch is too small. */
enum { MGT_CPU_CONVK_FORWARD, MGT_CPU_CONVK_DATA, MGT_CPU_CONVK_FILTER };
int mgt_cpu_convk_fits(const mgt_conv_shape *s, int pass);
/* Scratch bytes any pass that fits needs (on up to 8 lanes); 0 when none fits. */
size_t mgt_cpu_convk_scratch(const mgt_conv_shape *s);
int mgt_cpu_convk_fwd(float *scratch, size_t bytes, mgt_cpu_lanes *lanes, const mgt_conv_shape *s,
                      const float *x, const float *w, const float *b, float *y);
int mgt_cpu_convk_bwd_data(float *scratch, size_t bytes, mgt_cpu_lanes *lanes,
                           const mgt_conv_shape *s, const float *w, const float *dy, float *dx);
int mgt_cpu_convk_bwd_filter(float *scratch, size_t bytes, mgt_cpu_lanes *lanes,
                             const mgt_conv_shape *s, const float *x, const float *dy, float *dw);
/* For the tests: how many kernel variants this CPU runs (the base one, then x86-64-v3 and
 * x86-64-v4 where the CPU has them; the passes use the last), and which one the calling
 * thread's passes use from now on (its name), or, for a variant out of range, the default
 * again (NULL). */
int mgt_cpu_convk_variants(void);
const char *mgt_cpu_convk_use(int variant);

/* cpu_pool.c */
void mgt_cpu_maxpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y,
                         int32_t *argmax);
void mgt_cpu_maxpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy,
                         const int32_t *argmax, float *dx);
void mgt_cpu_maxpool_bwd_relu(mgt_backend *be, const mgt_pool_shape *s, const float *x,
                              const float *dy, const int32_t *argmax, float *dx);
void mgt_cpu_avgpool_fwd(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y);
void mgt_cpu_avgpool_bwd(mgt_backend *be, const mgt_pool_shape *s, const float *dy, float *dx);

/* cpu_graph.c */
void mgt_cpu_add2(mgt_backend *be, size_t count, const float *a, const float *b, float *y);
void mgt_cpu_copy_cols(mgt_backend *be, size_t rows, int width, const float *src, int src_ld,
                       float *dst, int dst_ld, int accumulate);
void mgt_cpu_pad_fwd(mgt_backend *be, const mgt_pad_shape *s, const float *x, float *y);
void mgt_cpu_pad_bwd(mgt_backend *be, const mgt_pad_shape *s, const float *dy, float *dx);
void mgt_cpu_gap_fwd(mgt_backend *be, int n, int hw, int c, const float *x, float *y);
void mgt_cpu_gap_bwd(mgt_backend *be, int n, int hw, int c, const float *dy, float *dx);

/* cpu_depthwise.c */
size_t mgt_cpu_dwconv_scratch(mgt_backend *be, const mgt_conv_shape *s);
void mgt_cpu_dwconv_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y);
void mgt_cpu_dwconv_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db);

/* cpu_norm.c */
/* sum[j] (and sumsq[j] unless NULL) of column j of x[rows][c], each in double in row order
 * (the same values as mgt_cpu_colsum), the columns split across the lanes: BatchNorm's
 * statistics and a convolution's bias gradient. */
void mgt_cpu_channel_sums(mgt_backend *be, size_t rows, int c, const float *x, float *sum,
                          float *sumsq);
void mgt_cpu_bn_stats(mgt_backend *be, int rows, int c, const float *x, float *sum, float *sumsq);
void mgt_cpu_bn_apply(mgt_backend *be, const mgt_bn_pass *p, float *y);
void mgt_cpu_bn_finalize(mgt_backend *be, int c, float count, const float *sum, const float *sumsq,
                         float eps, float momentum, const float *shift, float *mean, float *invstd,
                         float *running_mean, float *running_var);
void mgt_cpu_bn_running(mgt_backend *be, int c, float eps, const float *running_mean,
                        const float *running_var, float *mean, float *invstd);
void mgt_cpu_bn_bwd_reduce(mgt_backend *be, const mgt_bn_pass *p, const float *dy, float *dgamma,
                           float *dbeta);
void mgt_cpu_bn_bwd_apply(mgt_backend *be, const mgt_bn_pass *p, float count, const float *dy,
                          const float *dgamma, const float *dbeta, float *dx, float *dr,
                          int accumulate);

/* cpu_elem.c */
void mgt_cpu_dropout_fwd(mgt_backend *be, int n, int row, float rate, uint64_t key,
                         uint64_t first_sample, float *x);
void mgt_cpu_dropout_bwd(mgt_backend *be, int n, int row, float rate, uint64_t key,
                         uint64_t first_sample, float *dx);
void mgt_cpu_act_fwd(mgt_backend *be, mgt_act act, int n, int row, const float *x, float *y);
void mgt_cpu_act_bwd(mgt_backend *be, mgt_act act, int n, int row, const float *y, const float *dy,
                     float *dx, int accumulate);
void mgt_cpu_xent_sparse(mgt_backend *be, int n, int k, const float *logits, const int32_t *labels,
                         float *probs, float *dlogits, float scale, float smoothing, float *sums);
void mgt_cpu_xent_dense(mgt_backend *be, int n, int k, const float *logits, const float *targets,
                        float *probs, float *dlogits, float scale, float smoothing, float *sums);
void mgt_cpu_elem_loss(mgt_backend *be, const mgt_elem_loss *L, int n, int k, const float *y,
                       const float *t, float *probs, float *dy, float scale, float *sums);

/* y[i] = f(x[i]) for i < n, an element-wise activation (not softmax): act_fwd's formulas. */
void mgt_cpu_act_fwd_range(mgt_act act, const float *x, float *y, size_t n);

/* cpu_seq.c */
void mgt_cpu_dense_io_fwd(mgt_backend *be, int n, int in, int out, mgt_act act, const float *x,
                          const float *w, const float *b, float *pre, float *y);
void mgt_cpu_dense_io_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *db);
void mgt_cpu_embed_fwd(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                       const float *wte, const float *wpe, float *y);
void mgt_cpu_embed_bwd(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                       const float *dy, float *dwte, int accumulate, float *dwpe);
void mgt_cpu_layernorm_fwd(mgt_backend *be, int rows, int c, float eps, const float *x,
                           const float *gamma, const float *beta, float *y, float *mean,
                           float *rstd);
void mgt_cpu_layernorm_bwd(mgt_backend *be, int rows, int c, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta);
size_t mgt_cpu_attn_scratch(mgt_backend *be, const mgt_attn_shape *s);
void mgt_cpu_attn_fwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, float *y,
                      float *lse);
void mgt_cpu_attn_bwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, const float *y,
                      const float *lse, const float *dy, float *dqkv);
void mgt_cpu_attn_decode(mgt_backend *be, int c, int heads, int p, const float *q, const float *kc,
                         const float *vc, float *y);

/* cpu_clip.c */
void mgt_cpu_clip_value(mgt_backend *be, size_t n, float *g, float limit);
void mgt_cpu_clip_norm(mgt_backend *be, size_t n, float *g, double limit, double *work);

/* cpu_optim.c */
void mgt_cpu_optim_step(mgt_backend *be, mgt_opt_kind kind, size_t count, float *w, const float *g,
                        float *const *slots, const mgt_opt_hyper *h);

#endif
