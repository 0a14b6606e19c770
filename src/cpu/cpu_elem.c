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
 * Phi(x) + x phi(x), and 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2 / pi) (1 + 3 0.044715 x^2). */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

static inline float gelu_f(float x) {
    return 0.5f * x * (1.0f + erff(x * INV_SQRT2));
}

/* tanh(u) = 1 - 2 / (e^2u + 1) with e^v of its own, in plain arithmetic that the compiler
 * vectorises (glibc's tanhf is a call per element: GELU took about as long as the GEMM before
 * it in a GPT MLP's first layer). e^v: v = k ln 2 + r with k the nearest integer to v / ln 2
 * (ln 2 in two parts, Cody and Waite's reduction, so r is exact to |r| <= ln 2 / 2), e^r by its
 * Taylor polynomial of degree 7 (truncation below |r|^8 / 8! < 7e-9, a tenth of float's
 * rounding), times 2^k put into the exponent's bits. v is clamped to [-87, 88], where e^v stays a
 * normal float; tanh is then within a few units in the last place of 1 (the form's absolute
 * error, which is what 1 + tanh in GELU sees). */
static inline float exp_poly(float v) {
    v = v < -87.0f ? -87.0f : v > 88.0f ? 88.0f : v;
    const float k = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const float r = (v - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float tanh_poly(float u) {
    return 1.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f);
}

static inline float gelu_tanh_f(float x) {
    return 0.5f * x * (1.0f + tanh_poly(GELU_K * (x + GELU_A * x * x * x)));
}

static inline float gelu_grad(float x) {
    return 0.5f * (1.0f + erff(x * INV_SQRT2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}

static inline float gelu_tanh_grad(float x) {
    const float th = tanh_poly(GELU_K * (x + GELU_A * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
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
        for (size_t i = lo; i < hi; i++)
            y[i] = gelu_tanh_f(x[i]);
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
    case MGT_ACT_GELU_TANH:
        for (size_t i = lo; i < hi; i++) {
            const float g = dy[i] * gelu_tanh_grad(y[i]);
            dx[i] = acc ? dx[i] + g : g;
        }
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

/* An out-of-range label counts as an all-zero target: no loss, zero gradient, never correct. */
MGT_SIMD
void mgt_cpu_xent_sparse(mgt_backend *be, int n, int k, const float *logits, const int32_t *labels,
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
        float *p = probs ? probs + off : NULL;
        float *d = dlogits ? dlogits + off : NULL;
        const int lab = labels[i];
        const int valid = lab >= 0 && lab < k;
        float mx, inv_se;
        double lse;
        row_lse(k, l, &mx, &lse, &inv_se, e);
        const float p_lab = valid ? (e ? e[lab] : expf(l[lab] - mx)) * inv_se : 0.0f;
        int ahead = 0;
        if (valid && smooth) {
            double sl = 0.0;
            for (int j = 0; j < k; j++)
                sl += l[j];
            loss += lse - (1.0 - (double)smoothing) * l[lab] - (double)smoothing / k * sl;
        } else if (valid) {
            loss += lse - (double)l[lab];
        }
        int best = 0;
        float best_p = -1.0f;
        for (int j = 0; j < k; j++) {
            const float pj = (e ? e[j] : expf(l[j] - mx)) * inv_se;
            if (pj > best_p) {
                best_p = pj;
                best = j;
            }
            ahead += pj > p_lab || (pj == p_lab && j < lab);
            if (p)
                p[j] = pj;
            if (d) {
                const float t =
                    smooth ? (j == lab ? t_on + t_off : t_off) : (j == lab ? 1.0f : 0.0f);
                d[j] = valid ? (pj - t) * scale : 0.0f;
            }
        }
        if (valid && best == lab)
            correct++;
        if (valid && ahead < 5)
            top5++;
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
