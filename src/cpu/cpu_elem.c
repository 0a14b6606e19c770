/* cpu_elem.c: element- and row-wise ops: activations, inverted dropout, and the fused, stable
 * softmax + cross-entropy.
 *
 * Dropout draws its mask from the stateless RNG of util.h, element j of global sample s using
 * counter s*row + j, so the forward and backward passes (and the GPU backend, and any split of
 * the batch across ranks) see the same mask without storing it.
 *
 * Softmax (activation and loss) subtracts the row maximum before exponentiating, so no logit is
 * too large; the log-sum-exp and the loss are formed in double.
 *
 * Activations and dropout split their elements (softmax its rows) across the backend's lanes;
 * each element is computed alone, so the split changes no bit. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "loss_math.h"
#include "util.h"

/* Elements below which a pass is not worth splitting across the lanes (waking a worker costs
 * microseconds; 64K floats take tens of them). */
#define ELEM_PART ((size_t)1 << 16)

/* ---- dropout ---- */

/* Forward and backward are the same map: the mask from (key, counter) times 1/(1-rate), over
 * rows [r0, r1) of x. mgt_uniform(key, c) = u * 2^-24 with u its 24 random bits, so an element
 * is kept when u >= rate * 2^24, i.e. u >= ceil(rate * 2^24) (exact: rate * 2^24 is a float
 * scaled by a power of two), which the loop tests on the integer bits. */
typedef struct {
    int row;
    uint64_t key, first_sample;
    uint32_t keep_from; /* keep when the 24 bits are >= keep_from (2^24: keep none) */
    float keep_scale;
    float *x;
} dropout_job;

MGT_SIMD
static void dropout_rows(void *p, size_t r0, size_t r1) {
    enum { BLOCK = 64 }; /* the mask's bits for a block of elements, then the block */
    const dropout_job *j = p;
    const int row = j->row;
    const uint64_t key = j->key;
    const uint32_t keep_from = j->keep_from;
    const float keep_scale = j->keep_scale;
    uint32_t bits[BLOCK];
    for (size_t i = r0; i < r1; i++) {
        float *restrict xr = j->x + i * (size_t)row;
        const uint64_t base = (j->first_sample + (uint64_t)i) * (uint64_t)row;
        for (int c0 = 0; c0 < row; c0 += BLOCK) {
            const int len = row - c0 < BLOCK ? row - c0 : BLOCK;
            for (int v = 0; v < len; v++)
                bits[v] = (uint32_t)(mgt_rand64(key, base + (uint64_t)(c0 + v)) >> 40);
            for (int v = 0; v < len; v++)
                xr[c0 + v] = bits[v] >= keep_from ? xr[c0 + v] * keep_scale : 0.0f;
        }
    }
}

static void dropout_apply(mgt_backend *be, int n, int row, float rate, uint64_t key,
                          uint64_t first_sample, float *x) {
    if (!(rate > 0.0f) || n <= 0 || row <= 0)
        return;
    dropout_job j = {.row = row,
                     .key = key,
                     .first_sample = first_sample,
                     .keep_from = rate < 1.0f ? (uint32_t)ceil((double)rate * 16777216.0)
                                              : (uint32_t)1 << 24,
                     .keep_scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f,
                     .x = x};
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)n, ELEM_PART / (size_t)row + 1,
                      dropout_rows, &j);
}

void mgt_cpu_dropout_fwd(mgt_backend *be, int n, int row, float rate, uint64_t key,
                         uint64_t first_sample, float *x) {
    dropout_apply(be, n, row, rate, key, first_sample, x);
}

void mgt_cpu_dropout_bwd(mgt_backend *be, int n, int row, float rate, uint64_t key,
                         uint64_t first_sample, float *dx) {
    dropout_apply(be, n, row, rate, key, first_sample, dx);
}

/* ---- activations ---- */

/* 1/(1+e^-v) without overflow: for v < 0 use e^v/(1+e^v). */
static inline float sigmoidf(float v) {
    if (v >= 0.0f)
        return 1.0f / (1.0f + expf(-v));
    const float e = expf(v);
    return e / (1.0f + e);
}

/* GELU (backend.h): the exact form x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), and the tanh form
 * 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3); their derivatives, from x:
 * Phi(x) + x phi(x), and 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2 / pi) (1 + 3 0.044715 x^2).
 */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

static inline float gelu_f(float x) {
    return 0.5f * x * (1.0f + erff(x * INV_SQRT2));
}

static inline float gelu_grad(float x) {
    return 0.5f * (1.0f + erff(x * INV_SQRT2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}

/* The tanh GELU on blocks of 8 elements (mgt_v8f), tanh(u) = 1 - 2 / (e^2u + 1) with
 * mgt_cpu_exp8: vectorised, where glibc's tanhf is a call per element (GELU took about as long
 * as the GEMM before it in a GPT MLP's first layer). tanh is then within a few units in the last
 * place of 1 (the form's absolute error, which is what 1 + tanh in GELU sees). A range's last
 * few elements go through a zero-padded block, so every element takes the same instructions
 * wherever a lane's range starts or ends (its bits do not depend on the thread count). Each
 * block is read whole before it is written: y may be x, dx may be dy. */
static inline __attribute__((always_inline)) void gelu_tanh_th8(const mgt_v8f *x, mgt_v8f *th) {
    mgt_v8f e = 2.0f * (GELU_K * (*x + GELU_A * *x * *x * *x));
    mgt_cpu_exp8(&e);
    *th = 1.0f - 2.0f / (e + 1.0f);
}

static inline __attribute__((always_inline)) void gelu_tanh_fwd8(const float *x, float *y) {
    mgt_v8f v, th;
    memcpy(&v, x, sizeof v);
    gelu_tanh_th8(&v, &th);
    v = 0.5f * v * (1.0f + th);
    memcpy(y, &v, sizeof v);
}

static inline __attribute__((always_inline)) void gelu_tanh_fwd_n(const float *x, float *y,
                                                                  size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        gelu_tanh_fwd8(x + i, y + i);
    if (i < n) {
        float a[8] = {0};
        memcpy(a, x + i, sizeof(float) * (n - i));
        gelu_tanh_fwd8(a, a);
        memcpy(y + i, a, sizeof(float) * (n - i));
    }
}

/* dx = dy * GELU'(x), or dx += it (acc), with GELU' = 0.5 (1 + th) + 0.5 x (1 - th^2)
 * sqrt(2 / pi) (1 + 3 0.044715 x^2). */
static inline __attribute__((always_inline)) void gelu_tanh_bwd8(const float *x, const float *dy,
                                                                 float *dx, int acc) {
    mgt_v8f v, g, th;
    memcpy(&v, x, sizeof v);
    memcpy(&g, dy, sizeof g);
    gelu_tanh_th8(&v, &th);
    g = g * (0.5f * (1.0f + th) +
             0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * v * v));
    if (acc) {
        mgt_v8f d;
        memcpy(&d, dx, sizeof d);
        g = d + g;
    }
    memcpy(dx, &g, sizeof g);
}

static inline __attribute__((always_inline)) void gelu_tanh_bwd_n(const float *x, const float *dy,
                                                                  float *dx, size_t n, int acc) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        gelu_tanh_bwd8(x + i, dy + i, dx + i, acc);
    if (i < n) {
        float a[8] = {0}, g[8] = {0}, d[8] = {0};
        memcpy(a, x + i, sizeof(float) * (n - i));
        memcpy(g, dy + i, sizeof(float) * (n - i));
        if (acc)
            memcpy(d, dx + i, sizeof(float) * (n - i));
        gelu_tanh_bwd8(a, g, d, acc);
        memcpy(dx + i, d, sizeof(float) * (n - i));
    }
}

MGT_SIMD
static void softmax_row(int k, float *restrict x) {
    float mx = x[0];
    for (int j = 1; j < k; j++)
        mx = x[j] > mx ? x[j] : mx;
    double sum = 0.0;
    for (int j = 0; j < k; j++) {
        x[j] = expf(x[j] - mx);
        sum += x[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < k; j++)
        x[j] *= inv;
}

/* An activation pass over a flat range [lo, hi) of elements (softmax: of rows): forward
 * y = f(x) (y may be x), backward dx = dy * f'(y), or dx += it with accumulate (dx may be dy
 * without). */
typedef struct {
    mgt_act act;
    int row, accumulate;
    const float *x, *y, *dy;
    float *out; /* forward: y; backward: dx */
} act_job;

MGT_SIMD
static void act_fwd_range(void *p, size_t lo, size_t hi) {
    const act_job *j = p;
    const float *x = j->x;
    float *y = j->out;
    switch (j->act) {
    case MGT_ACT_RELU:
        /* NaN stays NaN (as in PyTorch): a diverged model must reach the loss check. */
        for (size_t i = lo; i < hi; i++)
            y[i] = x[i] < 0.0f ? 0.0f : x[i];
        break;
    case MGT_ACT_SIGMOID:
        for (size_t i = lo; i < hi; i++)
            y[i] = sigmoidf(x[i]);
        break;
    case MGT_ACT_TANH:
        for (size_t i = lo; i < hi; i++)
            y[i] = tanhf(x[i]);
        break;
    case MGT_ACT_SOFTMAX:
        for (size_t i = lo; i < hi; i++) {
            float *r = y + i * (size_t)j->row;
            if (r != x + i * (size_t)j->row)
                memcpy(r, x + i * (size_t)j->row, sizeof(float) * (size_t)j->row);
            softmax_row(j->row, r);
        }
        break;
    case MGT_ACT_GELU:
        for (size_t i = lo; i < hi; i++)
            y[i] = gelu_f(x[i]);
        break;
    case MGT_ACT_GELU_TANH:
        gelu_tanh_fwd_n(x + lo, y + lo, hi - lo);
        break;
    case MGT_ACT_NONE:
    default:
        if (y != x)
            memcpy(y + lo, x + lo, sizeof(float) * (hi - lo));
        break;
    }
}

void mgt_cpu_act_fwd_range(mgt_act act, const float *x, float *y, size_t n) {
    act_job j = {.act = act, .row = 1, .x = x, .out = y};
    act_fwd_range(&j, 0, n);
}

MGT_SIMD
void mgt_cpu_relu_rows(int m, int n, int ld, float *c) {
    for (int i = 0; i < m; i++) {
        float *restrict r = c + (size_t)i * (size_t)ld;
        for (int k = 0; k < n; k++)
            r[k] = r[k] < 0.0f ? 0.0f : r[k];
    }
}

MGT_SIMD
void mgt_cpu_keep_pos_rows(int m, int n, int ld, float *c, const float *mask) {
    for (int i = 0; i < m; i++) {
        float *restrict r = c + (size_t)i * (size_t)ld;
        const float *restrict k = mask + (size_t)i * (size_t)ld;
        for (int j = 0; j < n; j++)
            r[j] = mgt_cpu_keep_if(r[j], k[j] > 0.0f);
    }
}

/* g = dy * f'(x), written with y = f(x): relu' = [y > 0], sigmoid' = y(1-y), tanh' = 1-y^2,
 * softmax (per row): g_j = y_j (dy_j - sum_k dy_k y_k); none: g = dy. Then dx = g, or dx += g. */
MGT_SIMD
static void act_bwd_range(void *p, size_t lo, size_t hi) {
    const act_job *j = p;
    const float *y = j->y, *dy = j->dy;
    float *dx = j->out;
    const int acc = j->accumulate;
    switch (j->act) {
    case MGT_ACT_RELU:
        for (size_t i = lo; i < hi; i++) {
            const float g = y[i] > 0.0f ? dy[i] : 0.0f;
            dx[i] = acc ? dx[i] + g : g;
        }
        break;
    case MGT_ACT_SIGMOID:
        for (size_t i = lo; i < hi; i++) {
            const float g = dy[i] * (y[i] * (1.0f - y[i]));
            dx[i] = acc ? dx[i] + g : g;
        }
        break;
    case MGT_ACT_TANH:
        for (size_t i = lo; i < hi; i++) {
            const float g = dy[i] * (1.0f - y[i] * y[i]);
            dx[i] = acc ? dx[i] + g : g;
        }
        break;
    case MGT_ACT_GELU: /* y is the input x here (backend.h) */
        for (size_t i = lo; i < hi; i++) {
            const float g = dy[i] * gelu_grad(y[i]);
            dx[i] = acc ? dx[i] + g : g;
        }
        break;
    case MGT_ACT_GELU_TANH: /* y is the input x here too */
        gelu_tanh_bwd_n(y + lo, dy + lo, dx + lo, hi - lo, acc);
        break;
    case MGT_ACT_SOFTMAX:
        for (size_t i = lo; i < hi; i++) {
            const float *yr = y + i * (size_t)j->row, *gr = dy + i * (size_t)j->row;
            float *xr = dx + i * (size_t)j->row;
            double dot = 0.0;
            for (int c = 0; c < j->row; c++)
                dot += (double)gr[c] * yr[c];
            const float d = (float)dot;
            for (int c = 0; c < j->row; c++) {
                const float g = yr[c] * (gr[c] - d);
                xr[c] = acc ? xr[c] + g : g;
            }
        }
        break;
    case MGT_ACT_NONE:
    default:
        for (size_t i = lo; i < hi; i++)
            dx[i] = acc ? dx[i] + dy[i] : dy[i];
        break;
    }
}

/* Softmax goes by rows, the others by elements; either way every element is computed alone. */
static void act_split(mgt_backend *be, act_job *j, int n, void (*range)(void *, size_t, size_t)) {
    if (n <= 0 || j->row <= 0)
        return;
    const int rows = j->act == MGT_ACT_SOFTMAX;
    const size_t count = rows ? (size_t)n : (size_t)n * j->row;
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, count,
                      rows ? ELEM_PART / (size_t)j->row + 1 : ELEM_PART, range, j);
}

void mgt_cpu_act_fwd(mgt_backend *be, mgt_act act, int n, int row, const float *x, float *y) {
    if (act == MGT_ACT_NONE && x == y)
        return;
    act_job j = {.act = act, .row = row, .x = x, .out = y};
    act_split(be, &j, n, act_fwd_range);
}

void mgt_cpu_act_bwd(mgt_backend *be, mgt_act act, int n, int row, const float *y, const float *dy,
                     float *dx, int accumulate) {
    if (act == MGT_ACT_NONE && dx == dy && !accumulate)
        return;
    act_job j = {.act = act, .row = row, .accumulate = accumulate, .y = y, .dy = dy, .out = dx};
    act_split(be, &j, n, act_bwd_range);
}

/* ---- softmax + cross-entropy ----
 * For each row: mx = max logit, se = sum exp(l - mx), lse = mx + log(se),
 * p_j = exp(l_j - mx) / se, loss = lse - l[label] (dense: sum(t) * lse - sum t_j l_j).
 * probs and dlogits may alias logits (or each other): everything read from a row is read
 * before that row is written, and the last pass reads l_j before writing p_j / d_j at the same
 * index. The argmax for the accuracy is taken over the p_j written (first maximum wins). Top-5:
 * the label's rank is the number of classes ahead of it, those with a larger p_j and those with
 * an equal one at a lower index (the argmax's tie rule, so rank 0 is exactly the argmax); the
 * sample counts when its rank is below 5. The label's p is formed as the loop forms every p_j,
 * from l[label] read before the row is written.
 *
 * Label smoothing s (Keras' label_smoothing) replaces the target t by (1 - s) * t + s / k. The
 * gradient uses that target in float, t'_j = t_on * t_j + t_off (t_on = 1 - s, t_off = s / k,
 * both floats); the loss is formed in double: sparse, lse - (1 - s) * l[label] - (s / k) * sum_j
 * l_j (the smoothed target sums to 1); dense, sum(t') * lse - sum t'_j l_j. With s = 0 every branch
 * below takes the unsmoothed path, so the results are the same bits as without smoothing. */

/* A row of at most XENT_ROW_KEEP classes keeps its exp(l_j - mx) from row_lse for the p_j (in a
 * buffer of the caller's, as probs and dlogits may alias the logits): the same values, from half
 * the exponentials. The MLP's loss at batch 256 and 10 classes: 27 -> 21 us. */
enum { XENT_ROW_KEEP = 256 };

static void row_lse(int k, const float *l, float *mx_out, double *lse_out, float *inv_se_out,
                    float *e) {
    float mx = l[0];
    for (int j = 1; j < k; j++)
        mx = l[j] > mx ? l[j] : mx;
    double se = 0.0;
    for (int j = 0; j < k; j++) {
        const float ej = expf(l[j] - mx);
        if (e)
            e[j] = ej;
        se += ej;
    }
    *mx_out = mx;
    *lse_out = (double)mx + log(se);
    *inv_se_out = (float)(1.0 / se);
}

/* The sparse loss goes by blocks of rows, which the lanes take in any order: a language model's
 * B x T rows of V logits (GPT-2: 8 x 1024 rows of 50,257) are a pass as large as a layer's, where
 * one thread made the loss a tenth of the step. A block's sums are its own (the loss in double);
 * the caller adds the blocks in order, and the block size follows from the row count alone, so
 * the sums do not depend on the thread count. At most XENT_BLOCKS blocks of at least
 * XENT_BLOCK_ROWS rows. A row runs on mgt_cpu_exp8 (cpu_internal.h) 8 logits at a time, its
 * last k mod 8 on mgt_cpu_exp: every logit's exponential is formed by the same instructions in
 * every pass over the row (p of the label, its rank and the argmax compare like with like). */
enum { XENT_BLOCKS = 1024, XENT_BLOCK_ROWS = 16 };

typedef struct {
    int k, smooth;
    float t_on, t_off, scale, smoothing;
    const float *logits;
    const int32_t *labels;
    float *probs, *dlogits;
    size_t n, block;
    double loss[XENT_BLOCKS];
    long correct[XENT_BLOCKS], top5[XENT_BLOCKS];
} xent_job;

/* e^(l[j] - mx) as the row's passes form it (the 8-wide form for j below k8, the rest alone). */
static inline __attribute__((always_inline)) float xent_exp_at(const float *l, int j, int k8,
                                                               float mx) {
    if (j >= k8)
        return mgt_cpu_exp(l[j] - mx);
    mgt_v8f v;
    memcpy(&v, l + (j & ~7), sizeof v);
    v -= mx;
    mgt_cpu_exp8(&v);
    return v[j & 7];
}

/* One row: its loss (0 for an out-of-range label), and whether it is correct and in the top 5;
 * p and d (either may be NULL, or l itself) written. e: k floats of scratch for the exponentials
 * (k <= XENT_ROW_KEEP), or NULL to form them again. */
static inline __attribute__((always_inline)) double xent_sparse_row(const xent_job *jb,
                                                                    const float *l, int lab,
                                                                    float *p, float *d, float *e,
                                                                    int *correct, int *top5) {
    const int k = jb->k, k8 = k & ~7, valid = lab >= 0 && lab < k;
    /* the maximum, 8 running maxima (exact in any order) */
    mgt_v8f vm = (mgt_v8f){0} + l[0];
    for (int j = 0; j < k8; j += 8) {
        mgt_v8f v;
        memcpy(&v, l + j, sizeof v);
        const mgt_v8i gt = v > vm;
        vm = (mgt_v8f)(((mgt_v8i)v & gt) | ((mgt_v8i)vm & ~gt));
    }
    float mx = l[0];
    for (int i = 0; i < 8; i++)
        mx = vm[i] > mx ? vm[i] : mx;
    for (int j = k8; j < k; j++)
        mx = l[j] > mx ? l[j] : mx;
    /* the sum of exponentials in double, 8 running sums added in a fixed order */
    double s8[8] = {0}, se = 0.0;
    for (int j = 0; j < k8; j += 8) {
        mgt_v8f v;
        memcpy(&v, l + j, sizeof v);
        v -= mx;
        mgt_cpu_exp8(&v);
        if (e)
            memcpy(e + j, &v, sizeof v);
        for (int i = 0; i < 8; i++)
            s8[i] += v[i];
    }
    for (int j = k8; j < k; j++) {
        const float ej = mgt_cpu_exp(l[j] - mx);
        if (e)
            e[j] = ej;
        se += ej;
    }
    se += ((s8[0] + s8[4]) + (s8[1] + s8[5])) + ((s8[2] + s8[6]) + (s8[3] + s8[7]));
    const double lse = (double)mx + log(se);
    const float inv_se = (float)(1.0 / se);
    const float p_lab = valid ? (e ? e[lab] : xent_exp_at(l, lab, k8, mx)) * inv_se : 0.0f;
    double loss = 0.0;
    if (valid && jb->smooth) {
        double sl = 0.0;
        for (int j = 0; j < k; j++)
            sl += l[j];
        loss = lse - (1.0 - (double)jb->smoothing) * l[lab] - (double)jb->smoothing / k * sl;
    } else if (valid) {
        loss = lse - (double)l[lab];
    }
    /* p_j, the gradient, the first maximum of p (per vector lane the first of its largest,
     * then the lowest index among the lanes that hold the largest) and the label's rank */
    const float t_hit = jb->smooth ? jb->t_on + jb->t_off : 1.0f,
                t_miss = jb->smooth ? jb->t_off : 0.0f, scale = jb->scale;
    mgt_v8f bp = (mgt_v8f){0} - 1.0f;
    mgt_v8i bi = {0}, ahead8 = {0};
    const mgt_v8i iota = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int j = 0; j < k8; j += 8) {
        mgt_v8f v;
        if (e) {
            memcpy(&v, e + j, sizeof v);
        } else {
            memcpy(&v, l + j, sizeof v);
            v -= mx;
            mgt_cpu_exp8(&v);
        }
        const mgt_v8f pj = v * inv_se;
        const mgt_v8i idx = iota + j, gt = pj > bp;
        bp = (mgt_v8f)(((mgt_v8i)pj & gt) | ((mgt_v8i)bp & ~gt));
        bi = (idx & gt) | (bi & ~gt);
        ahead8 -= (pj > p_lab) | ((pj == p_lab) & (idx < lab)); /* a true compare is -1 */
        if (d) {
            const mgt_v8i hit = idx == lab;
            const mgt_v8f t = (mgt_v8f)(((mgt_v8i)((mgt_v8f){0} + t_hit) & hit) |
                                        ((mgt_v8i)((mgt_v8f){0} + t_miss) & ~hit));
            const mgt_v8f dj = valid ? (pj - t) * scale : (mgt_v8f){0};
            if (p)
                memcpy(p + j, &pj, sizeof pj);
            memcpy(d + j, &dj, sizeof dj);
        } else if (p) {
            memcpy(p + j, &pj, sizeof pj);
        }
    }
    int best = 0, ahead = 0;
    float best_p = -1.0f;
    for (int i = 0; i < 8; i++) {
        ahead += ahead8[i];
        if (bp[i] > best_p || (bp[i] == best_p && bp[i] > -1.0f && bi[i] < best))
            best_p = bp[i], best = bi[i];
    }
    for (int j = k8; j < k; j++) {
        const float pj = (e ? e[j] : mgt_cpu_exp(l[j] - mx)) * inv_se;
        if (pj > best_p)
            best_p = pj, best = j;
        ahead += pj > p_lab || (pj == p_lab && j < lab);
        if (p)
            p[j] = pj;
        if (d)
            d[j] = valid ? (pj - (j == lab ? t_hit : t_miss)) * scale : 0.0f;
    }
    *correct = valid && best == lab;
    *top5 = valid && ahead < 5;
    return loss;
}

MGT_SIMD
static void xent_sparse_blocks(void *p, size_t lo, size_t hi) {
    xent_job *jb = p;
    const size_t k = (size_t)jb->k;
    float keep[XENT_ROW_KEEP], *e = k <= XENT_ROW_KEEP ? keep : NULL;
    for (size_t b = lo; b < hi; b++) {
        const size_t r1 = (b + 1) * jb->block < jb->n ? (b + 1) * jb->block : jb->n;
        double loss = 0.0;
        long correct = 0, top5 = 0;
        for (size_t r = b * jb->block; r < r1; r++) {
            int c, t;
            loss += xent_sparse_row(jb, jb->logits + r * k, jb->labels[r],
                                    jb->probs ? jb->probs + r * k : NULL,
                                    jb->dlogits ? jb->dlogits + r * k : NULL, e, &c, &t);
            correct += c;
            top5 += t;
        }
        jb->loss[b] = loss;
        jb->correct[b] = correct;
        jb->top5[b] = top5;
    }
}

/* An out-of-range label counts as an all-zero target: no loss, zero gradient, never correct. */
void mgt_cpu_xent_sparse(mgt_backend *be, int n, int k, const float *logits, const int32_t *labels,
                         float *probs, float *dlogits, float scale, float smoothing, float *sums) {
    if (n <= 0 || k <= 0)
        return;
    xent_job job, *jb = &job; /* 24 KB of block sums, on the calling thread's stack */
    size_t block = ((size_t)n + XENT_BLOCKS - 1) / XENT_BLOCKS;
    block = block < XENT_BLOCK_ROWS ? XENT_BLOCK_ROWS : block;
    *jb = (xent_job){.k = k,
                     .smooth = smoothing > 0.0f,
                     .t_on = 1.0f - smoothing,
                     .t_off = smoothing / (float)k,
                     .scale = scale,
                     .smoothing = smoothing,
                     .logits = logits,
                     .labels = labels,
                     .probs = probs,
                     .dlogits = dlogits,
                     .n = (size_t)n,
                     .block = block};
    const size_t blocks = ((size_t)n + block - 1) / block;
    /* a part of the lanes' at least ELEM_PART logits */
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, blocks, ELEM_PART / (block * (size_t)k) + 1,
                      xent_sparse_blocks, jb);
    double loss = 0.0;
    long correct = 0, top5 = 0;
    for (size_t b = 0; b < blocks; b++) {
        loss += jb->loss[b];
        correct += jb->correct[b];
        top5 += jb->top5[b];
    }
    sums[0] += (float)(loss * scale);
    sums[1] += (float)((double)correct * scale);
    sums[2] += (float)((double)top5 * scale);
}

MGT_SIMD
void mgt_cpu_xent_dense(mgt_backend *be, int n, int k, const float *logits, const float *targets,
                        float *probs, float *dlogits, float scale, float smoothing, float *sums) {
    (void)be;
    if (n <= 0 || k <= 0)
        return;
    const int smooth = smoothing > 0.0f;
    const float t_on = 1.0f - smoothing, t_off = smoothing / (float)k;
    double loss = 0.0;
    long correct = 0, top5 = 0;
    float keep[XENT_ROW_KEEP], *e = k <= XENT_ROW_KEEP ? keep : NULL;
    for (int i = 0; i < n; i++) {
        const size_t off = (size_t)i * k;
        const float *l = logits + off;
        const float *t = targets + off;
        float *p = probs ? probs + off : NULL;
        float *d = dlogits ? dlogits + off : NULL;
        float mx, inv_se;
        double lse, st = 0.0, stl = 0.0;
        row_lse(k, l, &mx, &lse, &inv_se, e);
        int tbest = 0;
        for (int j = 0; j < k; j++) {
            const float tj = smooth ? t_on * t[j] + t_off : t[j];
            st += tj;
            stl += (double)tj * l[j];
            if (t[j] > t[tbest])
                tbest = j;
        }
        loss += st * lse - stl;
        const float stf = (float)st;
        const float p_lab = (e ? e[tbest] : expf(l[tbest] - mx)) * inv_se;
        int best = 0, ahead = 0;
        float best_p = -1.0f;
        for (int j = 0; j < k; j++) {
            const float pj = (e ? e[j] : expf(l[j] - mx)) * inv_se;
            if (pj > best_p) {
                best_p = pj;
                best = j;
            }
            ahead += pj > p_lab || (pj == p_lab && j < tbest);
            const float tj = smooth ? t_on * t[j] + t_off : t[j];
            if (p)
                p[j] = pj;
            if (d)
                d[j] = (pj * stf - tj) * scale;
        }
        if (best == tbest)
            correct++;
        if (ahead < 5)
            top5++;
    }
    sums[0] += (float)(loss * scale);
    sums[1] += (float)((double)correct * scale);
    sums[2] += (float)((double)top5 * scale);
}

/* ---- losses of float targets (backend.h: elem_loss; the arithmetic is loss_math.h's) ---- */

void mgt_cpu_elem_loss(mgt_backend *be, const mgt_elem_loss *L, int n, int k, const float *y,
                       const float *t, float *probs, float *dy, float scale, float *sums) {
    (void)be;
    if (n <= 0 || k <= 0)
        return;
    const mgt_elem_kind kind = L->kind;
    const int bce = kind == MGT_ELEM_BCE;
    const float w0 = L->cw ? L->cw[0] : 1.0f, w1 = L->cw ? L->cw[1] : 1.0f;
    const float gs = scale / (float)k;
    float *task = sums + MGT_SUM_TASK;
    double loss = 0.0, abs_sum = 0.0, sq_sum = 0.0;
    long correct = 0, tp = 0, fp = 0, fn = 0;
    for (int i = 0; i < n; i++) {
        double row = 0.0;
        for (int j = 0; j < k; j++) {
            const size_t at = (size_t)i * (size_t)k + (size_t)j;
            const float v = y[at], tj = mgt_loss_target(kind, t[at], L->smoothing);
            float g, p;
            row += mgt_loss_term(kind, v, tj, L->delta, w0, w1, &g, &p);
            if (bce) { /* counts against the target as given */
                const int pred = v > 0.0f, pos = t[at] > 0.5f;
                correct += pred == pos;
                tp += pred && pos;
                fp += pred && !pos;
                fn += !pred && pos;
                if (L->per_label) {
                    float *c = task + MGT_SUM_LABELS + 3 * j;
                    c[0] += (float)(pred && pos);
                    c[1] += (float)(pred && !pos);
                    c[2] += (float)(!pred && pos);
                }
            } else {
                const double e = (double)v - (double)t[at];
                abs_sum += fabs(e);
                sq_sum += e * e;
            }
            if (probs && bce)
                probs[at] = p;
            if (dy)
                dy[at] = g * gs;
        }
        loss += row / k;
    }
    sums[MGT_SUM_LOSS] += (float)loss;
    if (bce) {
        sums[MGT_SUM_CORRECT] += (float)correct;
        task[MGT_SUM_TP] += (float)tp;
        task[MGT_SUM_FP] += (float)fp;
        task[MGT_SUM_FN] += (float)fn;
    } else {
        task[MGT_SUM_ABS] += (float)abs_sum;
        task[MGT_SUM_SQ] += (float)sq_sum;
    }
}
