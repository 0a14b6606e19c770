/* cpu_seq.c: the ops of sequence models on the CPU: dense layers with [in][out] weights (GPT-2's
 * Conv1D), token and position embeddings, layer normalisation and causal multi-head attention.
 * Activations are (n, t, c) row-major, one row of c values per position (backend.h).
 *
 * Every pass is split across the lanes so that each value is computed by one lane in an order
 * fixed by the shapes alone: rows (a layer norm's, the embedding's) are computed alone; a sum
 * over rows (a layer norm's dgamma and dbeta, the embeddings' gradients) is split by columns,
 * each column summed over the rows in row order; attention is split by (sequence, head), each
 * pair computed whole by one lane. So the results do not depend on the number of threads.
 *
 * Attention is fused over blocks of keys (FlashAttention's order of work, Dao et al. 2022, on
 * the CPU's BLAS): for a block of ATT_BQ queries and each block of ATT_BK keys at or below it,
 * the block's scores S = Q K^T / sqrt(d) (one GEMM on the fused QKV rows in place, their
 * stride 3c), a running row maximum and sum of exponentials rescaling the output accumulated so
 * far (an online softmax), and O += P V (a second GEMM). No t x t matrix is kept, per head or
 * at all: a lane holds one block of scores. Each query's log-sum-exp is saved, so backward
 * recomputes a block's weights P = exp(S - lse) exactly as forward had them (FlashAttention-2's
 * backward): for each block of keys, over the query blocks at or after it, dV += P^T dO,
 * dP = dO V^T, dS = P (dP - D) with D_i = dO_i . O_i, dQ += dS K / sqrt(d) and
 * dK += dS^T Q / sqrt(d). Causal blocks above the diagonal are skipped, not masked. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_internal.h"
#include "util.h"

/* Rows below which a row-wise pass is not split (waking a lane costs microseconds). */
enum { ROW_PART = 64, COL_PART = 64 };

/* ---- dense with [in][out] weights -------------------------------------------------------- */

typedef struct {
    mgt_act act;
    const float *pre;
    float *y;
    size_t row;
} gelu_job;

static void gelu_rows(void *p, size_t lo, size_t hi) {
    const gelu_job *j = p;
    mgt_cpu_act_fwd_range(j->act, j->pre + lo * j->row, j->y + lo * j->row, (hi - lo) * j->row);
}

void mgt_cpu_dense_io_fwd(mgt_backend *be, int n, int in, int out, mgt_act act, const float *x,
                          const float *w, const float *b, float *pre, float *y) {
    if (n <= 0 || out <= 0)
        return;
    mgt_cpu_lanes *lanes = mgt_cpu_impl_of(be)->lanes;
    float *dst = act == MGT_ACT_NONE ? y : pre;
    if (in <= 0) {
        for (int i = 0; i < n; i++)
            if (b)
                memcpy(dst + (size_t)i * out, b, sizeof(float) * (size_t)out);
            else
                memset(dst + (size_t)i * out, 0, sizeof(float) * (size_t)out);
    } else {
        const mgt_cpu_gemm_args a = {CblasNoTrans, CblasNoTrans, n,   out, in, 1.0f, x, in, w,
                                     out,          0.0f,         dst, out};
        const mgt_cpu_gemm_epi e = {.bias = b};
        mgt_cpu_gemm_with(lanes, &a, &e);
    }
    if (act != MGT_ACT_NONE) {
        gelu_job j = {act, pre, y, (size_t)out};
        mgt_cpu_lanes_for(lanes, (size_t)n, (size_t)(ROW_PART * 64 / out + 1), gelu_rows, &j);
    }
}

void mgt_cpu_dense_io_bwd(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *db) {
    mgt_cpu_lanes *lanes = mgt_cpu_impl_of(be)->lanes;
    if (n < 0)
        n = 0;
    if (db)
        mgt_cpu_colsum((size_t)n, out, dy, db);
    if (in <= 0 || out <= 0)
        return;
    if (n == 0) {
        if (dw)
            memset(dw, 0, sizeof(float) * (size_t)in * (size_t)out);
        return;
    }
    /* dx[n][in] = dy[n][out] W^T, W [in][out]; dW[in][out] = x^T dy */
    const mgt_cpu_gemm_args gx = {CblasNoTrans, CblasTrans, n,   in,   out, 1.0f, dy,
                                  out,          w,          out, 0.0f, dx,  in};
    const mgt_cpu_gemm_args gw = {CblasTrans, CblasNoTrans, in,  out,  n,  1.0f, x,
                                  in,         dy,           out, 0.0f, dw, out};
    if (dw && dx)
        mgt_cpu_gemm_pair(lanes, &gw, &gx, NULL);
    else if (dw)
        mgt_cpu_gemm_with(lanes, &gw, NULL);
    else if (dx)
        mgt_cpu_gemm_with(lanes, &gx, NULL);
}

/* ---- embeddings --------------------------------------------------------------------------- */

typedef struct {
    int t, c, v;
    const float *ids, *wte, *wpe, *dy;
    float *y, *dwte, *dwpe;
    size_t rows;
    int accumulate;
} embed_job;

/* A token id as the op reads it; out of [0, v) it is clamped (the data readers refuse such ids
 * before they reach a batch, so this only keeps a damaged batch inside the table). */
static inline size_t token_of(float id, int v) {
    const long k = (long)id;
    return (size_t)(k < 0 ? 0 : k >= v ? v - 1 : k);
}

static void embed_rows(void *p, size_t lo, size_t hi) {
    const embed_job *j = p;
    const size_t c = (size_t)j->c;
    for (size_t r = lo; r < hi; r++) {
        const float *e = j->wte + token_of(j->ids[r], j->v) * c;
        float *restrict y = j->y + r * c;
        if (j->wpe) {
            const float *q = j->wpe + (r % (size_t)j->t) * c;
            for (size_t k = 0; k < c; k++)
                y[k] = e[k] + q[k];
        } else {
            memcpy(y, e, sizeof(float) * c);
        }
    }
}

void mgt_cpu_embed_fwd(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                       const float *wte, const float *wpe, float *y) {
    if (n <= 0 || t <= 0 || c <= 0 || v <= 0)
        return;
    embed_job j = {.t = t, .c = c, .v = v, .ids = ids, .wte = wte, .wpe = wpe, .y = y};
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)n * (size_t)t, ROW_PART, embed_rows, &j);
}

/* Columns [lo, hi) of both gradients: dwte's rows get each position's dy added in position
 * order (float additions, as PyTorch's embedding backward adds them); dwpe's entries are sums
 * over the sequences in double. */
static void embed_grad_cols(void *p, size_t lo, size_t hi) {
    const embed_job *j = p;
    const size_t c = (size_t)j->c, t = (size_t)j->t, w = hi - lo;
    if (j->dwte) {
        if (!j->accumulate)
            for (size_t r = 0; r < (size_t)j->v; r++)
                memset(j->dwte + r * c + lo, 0, sizeof(float) * w);
        for (size_t r = 0; r < j->rows; r++) {
            float *restrict d = j->dwte + token_of(j->ids[r], j->v) * c + lo;
            const float *restrict g = j->dy + r * c + lo;
            for (size_t k = 0; k < w; k++)
                d[k] += g[k];
        }
    }
    if (j->dwpe) {
        double acc[COL_PART];
        const size_t seqs = t ? j->rows / t : 0;
        for (size_t p0 = 0; p0 < t; p0++)
            for (size_t k0 = lo; k0 < hi; k0 += COL_PART) {
                const size_t kw = hi - k0 < COL_PART ? hi - k0 : COL_PART;
                for (size_t k = 0; k < kw; k++)
                    acc[k] = 0.0;
                for (size_t s = 0; s < seqs; s++) {
                    const float *g = j->dy + (s * t + p0) * c + k0;
                    for (size_t k = 0; k < kw; k++)
                        acc[k] += g[k];
                }
                for (size_t k = 0; k < kw; k++)
                    j->dwpe[p0 * c + k0 + k] = (float)acc[k];
            }
    }
}

void mgt_cpu_embed_bwd(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                       const float *dy, float *dwte, int accumulate, float *dwpe) {
    if (t <= 0 || c <= 0)
        return;
    embed_job j = {.t = t,
                   .c = c,
                   .v = v,
                   .ids = ids,
                   .dy = dy,
                   .dwte = dwte,
                   .dwpe = dwpe,
                   .rows = (size_t)(n > 0 ? n : 0) * (size_t)t,
                   .accumulate = accumulate};
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)c, 16, embed_grad_cols, &j);
}

/* ---- layer normalisation ------------------------------------------------------------------ */

typedef struct {
    int c;
    float eps;
    const float *x, *gamma, *beta, *mean, *rstd, *dy;
    float *y, *mean_out, *rstd_out, *dx, *dgamma, *dbeta;
    size_t rows;
} ln_job;

/* Each row's mean and variance in double (two passes), so the saved statistics are the
 * float32 roundings of the exact ones; the row then in float, (x - mean) * rstd * gamma + beta,
 * as PyTorch's CPU kernel forms it. */
MGT_SIMD
static void ln_fwd_rows(void *p, size_t lo, size_t hi) {
    const ln_job *j = p;
    const size_t c = (size_t)j->c;
    for (size_t r = lo; r < hi; r++) {
        const float *restrict x = j->x + r * c;
        float *restrict y = j->y + r * c;
        double s = 0.0, ss = 0.0;
        for (size_t k = 0; k < c; k++)
            s += x[k];
        const double mean = s / (double)c;
        for (size_t k = 0; k < c; k++) {
            const double d = x[k] - mean;
            ss += d * d;
        }
        const float m = (float)mean, rs = (float)(1.0 / sqrt(ss / (double)c + (double)j->eps));
        for (size_t k = 0; k < c; k++) {
            const float xh = (x[k] - m) * rs;
            y[k] = xh * (j->gamma ? j->gamma[k] : 1.0f) + (j->beta ? j->beta[k] : 0.0f);
        }
        j->mean_out[r] = m;
        j->rstd_out[r] = rs;
    }
}

void mgt_cpu_layernorm_fwd(mgt_backend *be, int rows, int c, float eps, const float *x,
                           const float *gamma, const float *beta, float *y, float *mean,
                           float *rstd) {
    if (rows <= 0 || c <= 0)
        return;
    ln_job j = {.c = c,
                .eps = eps,
                .x = x,
                .gamma = gamma,
                .beta = beta,
                .y = y,
                .mean_out = mean,
                .rstd_out = rstd};
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)rows, ROW_PART, ln_fwd_rows, &j);
}

/* dx per row: with xhat = (x - mean) rstd and g = dy gamma,
 * dx = rstd (g - mean(g) - xhat mean(g xhat)), the two means in double. */
MGT_SIMD
static void ln_bwd_rows(void *p, size_t lo, size_t hi) {
    const ln_job *j = p;
    const size_t c = (size_t)j->c;
    for (size_t r = lo; r < hi; r++) {
        const float *restrict x = j->x + r * c, *restrict dy = j->dy + r * c;
        float *restrict dx = j->dx + r * c;
        const float m = j->mean[r], rs = j->rstd[r];
        double sg = 0.0, sgx = 0.0;
        for (size_t k = 0; k < c; k++) {
            const float g = dy[k] * (j->gamma ? j->gamma[k] : 1.0f);
            sg += g;
            sgx += (double)g * ((x[k] - m) * rs);
        }
        const float mg = (float)(sg / (double)c), mgx = (float)(sgx / (double)c);
        for (size_t k = 0; k < c; k++) {
            const float g = dy[k] * (j->gamma ? j->gamma[k] : 1.0f);
            dx[k] = rs * (g - mg - (x[k] - m) * rs * mgx);
        }
    }
}

/* dgamma and dbeta for columns [lo, hi): sums over every row in row order, in double. */
static void ln_bwd_cols(void *p, size_t lo, size_t hi) {
    const ln_job *j = p;
    const size_t c = (size_t)j->c;
    double sg[COL_PART], sb[COL_PART];
    for (size_t k0 = lo; k0 < hi; k0 += COL_PART) {
        const size_t kw = hi - k0 < COL_PART ? hi - k0 : COL_PART;
        for (size_t k = 0; k < kw; k++)
            sg[k] = sb[k] = 0.0;
        for (size_t r = 0; r < j->rows; r++) {
            const float *x = j->x + r * c + k0, *dy = j->dy + r * c + k0;
            const float m = j->mean[r], rs = j->rstd[r];
            for (size_t k = 0; k < kw; k++) {
                sg[k] += (double)dy[k] * ((x[k] - m) * rs);
                sb[k] += dy[k];
            }
        }
        for (size_t k = 0; k < kw; k++) {
            if (j->dgamma)
                j->dgamma[k0 + k] = (float)sg[k];
            if (j->dbeta)
                j->dbeta[k0 + k] = (float)sb[k];
        }
    }
}

void mgt_cpu_layernorm_bwd(mgt_backend *be, int rows, int c, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta) {
    if (c <= 0)
        return;
    mgt_cpu_lanes *lanes = mgt_cpu_impl_of(be)->lanes;
    ln_job j = {.c = c,
                .x = x,
                .gamma = gamma,
                .mean = mean,
                .rstd = rstd,
                .dy = dy,
                .dx = dx,
                .dgamma = dgamma,
                .dbeta = dbeta,
                .rows = (size_t)(rows > 0 ? rows : 0)};
    if ((dgamma || dbeta) && rows <= 0) {
        if (dgamma)
            memset(dgamma, 0, sizeof(float) * (size_t)c);
        if (dbeta)
            memset(dbeta, 0, sizeof(float) * (size_t)c);
    } else if (dgamma || dbeta) {
        mgt_cpu_lanes_for(lanes, (size_t)c, 16, ln_bwd_cols, &j);
    }
    if (dx && rows > 0)
        mgt_cpu_lanes_for(lanes, (size_t)rows, ROW_PART, ln_bwd_rows, &j);
}

/* ---- attention ----------------------------------------------------------------------------- */

/* Query and key blocks: a block of scores (64 x 64 floats, 16 KB) and the block's output rows
 * stay in a core's L1/L2 cache while their GEMMs run. */
enum { ATT_BQ = 64, ATT_BK = 64 };

/* A lane's memory for one (sequence, head): scores or weights S, their gradient dP, the running
 * maximum, sum and output accumulator of a query block, the key block's dK and dV accumulators
 * and D (backward). d channels per head. */
static size_t attn_lane_floats(int d) {
    const size_t fwd = (size_t)ATT_BQ * ATT_BK + 2 * (size_t)ATT_BQ + (size_t)ATT_BQ * (size_t)d;
    const size_t bwd = 2 * (size_t)ATT_BQ * ATT_BK + ATT_BQ + 2 * (size_t)ATT_BK * (size_t)d;
    return mgt_cpu_pad_up(fwd > bwd ? fwd : bwd, 16); /* 64-byte aligned workspaces */
}

size_t mgt_cpu_attn_scratch(mgt_backend *be, const mgt_attn_shape *s) {
    const int d = s->heads > 0 ? s->c / s->heads : 0;
    return sizeof(float) * attn_lane_floats(d) *
           (size_t)mgt_cpu_lanes_count(mgt_cpu_impl_of(be)->lanes);
}

typedef struct {
    const mgt_attn_shape *s;
    const float *qkv, *y, *lse, *dy;
    float *out, *lse_out, *dqkv;
    float *scratch;
    atomic_size_t next;
} attn_job;

/* The dropout mask's keep test and scale for weight (seq, head, i, j) (backend.h). */
static inline float attn_keep(const mgt_attn_shape *s, uint64_t seq, int h, int i, int j) {
    const uint64_t ctr =
        (((s->first_sample + seq) * (uint64_t)s->heads + (uint64_t)h) * (uint64_t)s->t +
         (uint64_t)i) *
            (uint64_t)s->t +
        (uint64_t)j;
    return mgt_uniform(s->key, ctr) >= s->rate ? 1.0f / (1.0f - s->rate) : 0.0f;
}

/* The largest of m and row[0 .. n), in 8 running maxima (one vector; a maximum is exact in any
 * order). */
static inline __attribute__((always_inline)) float row_max(const float *row, int n, float m) {
    mgt_v8f acc = (mgt_v8f){0} + m;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        mgt_v8f v;
        memcpy(&v, row + j, sizeof v);
        const mgt_v8i gt = v > acc;
        acc = (mgt_v8f)(((mgt_v8i)v & gt) | ((mgt_v8i)acc & ~gt));
    }
    for (int k = 0; k < 8; k++)
        m = acc[k] > m ? acc[k] : m;
    for (; j < n; j++)
        m = row[j] > m ? row[j] : m;
    return m;
}

/* row[j] = e^(row[j] - m) for j < n (mgt_cpu_exp8 on blocks of 8, mgt_cpu_exp on the rest), and
 * their sum: 8 running sums added in a fixed order, then the rest, so it depends on n alone. */
static inline __attribute__((always_inline)) float row_exp_sum(float *row, int n, float m) {
    mgt_v8f acc = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        mgt_v8f v;
        memcpy(&v, row + j, sizeof v);
        v -= m;
        mgt_cpu_exp8(&v);
        memcpy(row + j, &v, sizeof v);
        acc += v;
    }
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; j < n; j++) {
        row[j] = mgt_cpu_exp(row[j] - m);
        sum += row[j];
    }
    return sum;
}

/* Backward's weights and score gradients for one query row of n keys, without dropout:
 * p = e^(s - lse), dS = p (dP - D), in place of s and dP. */
static inline __attribute__((always_inline)) void row_softmax_grad(float *pr, float *dpr, int n,
                                                                   float lse, float D) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        mgt_v8f p, dp;
        memcpy(&p, pr + j, sizeof p);
        memcpy(&dp, dpr + j, sizeof dp);
        p -= lse;
        mgt_cpu_exp8(&p);
        dp = p * (dp - D);
        memcpy(pr + j, &p, sizeof p);
        memcpy(dpr + j, &dp, sizeof dp);
    }
    for (; j < n; j++) {
        const float p = mgt_cpu_exp(pr[j] - lse);
        dpr[j] = p * (dpr[j] - D);
        pr[j] = p;
    }
}

/* Forward of one (sequence b, head h). */
MGT_SIMD
static void attn_fwd_one(const attn_job *jb, float *ws, int b, int h) {
    const mgt_attn_shape *s = jb->s;
    const int t = s->t, c = s->c, d = c / s->heads, ld = 3 * c;
    const float scale = 1.0f / sqrtf((float)d);
    const int drop = s->rate > 0.0f;
    const float *q = jb->qkv + (size_t)b * t * ld + (size_t)h * d;
    const float *k = q + c, *v = q + 2 * c;
    float *S = ws, *mx = ws + ATT_BQ * ATT_BK, *sum = mx + ATT_BQ, *O = sum + ATT_BQ;
    for (int i0 = 0; i0 < t; i0 += ATT_BQ) {
        const int bq = t - i0 < ATT_BQ ? t - i0 : ATT_BQ;
        for (int i = 0; i < bq; i++)
            mx[i] = -INFINITY, sum[i] = 0.0f;
        memset(O, 0, sizeof(float) * (size_t)bq * (size_t)d);
        const int kend = s->causal ? i0 + bq : t;
        for (int j0 = 0; j0 < kend; j0 += ATT_BK) {
            const int bk = kend - j0 < ATT_BK ? kend - j0 : ATT_BK;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, d, scale,
                        q + (size_t)i0 * ld, ld, k + (size_t)j0 * ld, ld, 0.0f, S, ATT_BK);
            for (int i = 0; i < bq; i++) {
                float *row = S + (size_t)i * ATT_BK;
                /* causal: keys after the query are not part of its softmax */
                int jn = s->causal && i0 + i - j0 + 1 < bk ? i0 + i - j0 + 1 : bk;
                jn = jn < 0 ? 0 : jn;
                const float m = row_max(row, jn, mx[i]);
                /* 0 for the first block (mx -inf); 1 while no key has been seen */
                const float corr = m == -INFINITY ? 1.0f : mgt_cpu_exp(mx[i] - m);
                const float ps = row_exp_sum(row, jn, m);
                for (int j = jn; j < bk; j++)
                    row[j] = 0.0f;
                sum[i] = sum[i] * corr + ps;
                mx[i] = m;
                if (corr != 1.0f)
                    for (int e = 0; e < d; e++)
                        O[(size_t)i * d + e] *= corr;
                if (drop)
                    for (int j = 0; j < jn; j++)
                        row[j] *= attn_keep(s, (uint64_t)b, h, i0 + i, j0 + j);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, d, bk, 1.0f, S, ATT_BK,
                        v + (size_t)j0 * ld, ld, 1.0f, O, d);
        }
        for (int i = 0; i < bq; i++) {
            float *y = jb->out + ((size_t)b * t + (size_t)(i0 + i)) * c + (size_t)h * d;
            const float inv = 1.0f / sum[i];
            for (int e = 0; e < d; e++)
                y[e] = O[(size_t)i * d + e] * inv;
            jb->lse_out[((size_t)b * s->heads + (size_t)h) * t + (size_t)(i0 + i)] =
                mx[i] + logf(sum[i]);
        }
    }
}

/* Backward of one (sequence b, head h): dq, dk, dv of the head's channels of dqkv. */
MGT_SIMD
static void attn_bwd_one(const attn_job *jb, float *ws, int b, int h) {
    const mgt_attn_shape *s = jb->s;
    const int t = s->t, c = s->c, d = c / s->heads, ld = 3 * c;
    const float scale = 1.0f / sqrtf((float)d);
    const int drop = s->rate > 0.0f;
    const size_t base = (size_t)b * t * ld + (size_t)h * d;
    const float *q = jb->qkv + base, *k = q + c, *v = q + 2 * c;
    float *dq = jb->dqkv + base, *dk = dq + c, *dv = dq + 2 * c;
    const float *lse = jb->lse + ((size_t)b * s->heads + (size_t)h) * t;
    const float *dO = jb->dy + (size_t)b * t * c + (size_t)h * d;
    const float *O = jb->y + (size_t)b * t * c + (size_t)h * d;
    float *P = ws, *dP = ws + ATT_BQ * ATT_BK, *Dall = dP + ATT_BQ * ATT_BK;
    float *dK = Dall + ATT_BQ, *dV = dK + (size_t)ATT_BK * d;
    for (int i = 0; i < t; i++)
        memset(dq + (size_t)i * ld, 0, sizeof(float) * (size_t)d);
    for (int j0 = 0; j0 < t; j0 += ATT_BK) {
        const int bk = t - j0 < ATT_BK ? t - j0 : ATT_BK;
        memset(dK, 0, sizeof(float) * (size_t)bk * d);
        memset(dV, 0, sizeof(float) * (size_t)bk * d);
        const int istart = s->causal ? j0 / ATT_BQ * ATT_BQ : 0;
        for (int i0 = istart; i0 < t; i0 += ATT_BQ) {
            const int bq = t - i0 < ATT_BQ ? t - i0 : ATT_BQ;
            /* D_i = dO_i . O_i (in double) */
            for (int i = 0; i < bq; i++) {
                const float *a = dO + (size_t)(i0 + i) * c, *o = O + (size_t)(i0 + i) * c;
                double acc = 0.0;
                for (int e = 0; e < d; e++)
                    acc += (double)a[e] * o[e];
                Dall[i] = (float)acc;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, d, scale,
                        q + (size_t)i0 * ld, ld, k + (size_t)j0 * ld, ld, 0.0f, P, ATT_BK);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, d, 1.0f,
                        dO + (size_t)i0 * c, c, v + (size_t)j0 * ld, ld, 0.0f, dP, ATT_BK);
            for (int i = 0; i < bq; i++) {
                float *pr = P + (size_t)i * ATT_BK, *dpr = dP + (size_t)i * ATT_BK;
                const int jn = !s->causal             ? bk
                               : i0 + i - j0 + 1 < 0  ? 0
                               : i0 + i - j0 + 1 < bk ? i0 + i - j0 + 1
                                                      : bk;
                const float l = lse[i0 + i], D = Dall[i];
                if (drop) {
                    for (int j = 0; j < jn; j++) {
                        const float p = mgt_cpu_exp(pr[j] - l);
                        const float keep = attn_keep(s, (uint64_t)b, h, i0 + i, j0 + j);
                        /* dS = P (dP keep - D); P keep enters dV */
                        dpr[j] = p * (dpr[j] * keep - D);
                        pr[j] = p * keep;
                    }
                } else {
                    row_softmax_grad(pr, dpr, jn, l, D);
                }
                for (int j = jn; j < bk; j++)
                    pr[j] = dpr[j] = 0.0f;
            }
            /* dV += (P keep)^T dO; dK += dS^T Q scale; dQ += dS K scale */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bk, d, bq, 1.0f, P, ATT_BK,
                        dO + (size_t)i0 * c, c, 1.0f, dV, d);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bk, d, bq, scale, dP, ATT_BK,
                        q + (size_t)i0 * ld, ld, 1.0f, dK, d);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, d, bk, scale, dP, ATT_BK,
                        k + (size_t)j0 * ld, ld, 1.0f, dq + (size_t)i0 * ld, ld);
        }
        for (int j = 0; j < bk; j++) {
            memcpy(dk + (size_t)(j0 + j) * ld, dK + (size_t)j * d, sizeof(float) * (size_t)d);
            memcpy(dv + (size_t)(j0 + j) * ld, dV + (size_t)j * d, sizeof(float) * (size_t)d);
        }
    }
}

/* The lanes take (sequence, head) pairs as they come; each pair is computed whole by one. */
static void attn_lane(void *p, int lane, int backward) {
    attn_job *j = p;
    const mgt_attn_shape *s = j->s;
    float *ws = j->scratch + attn_lane_floats(s->c / s->heads) * (size_t)lane;
    const size_t pairs = (size_t)s->n * (size_t)s->heads;
    for (;;) {
        const size_t k = atomic_fetch_add(&j->next, 1);
        if (k >= pairs)
            return;
        if (backward)
            attn_bwd_one(j, ws, (int)(k / (size_t)s->heads), (int)(k % (size_t)s->heads));
        else
            attn_fwd_one(j, ws, (int)(k / (size_t)s->heads), (int)(k % (size_t)s->heads));
    }
}

static void attn_fwd_lane(void *p, int lane) {
    attn_lane(p, lane, 0);
}

static void attn_bwd_lane(void *p, int lane) {
    attn_lane(p, lane, 1);
}

static void attn_run(mgt_backend *be, attn_job *j, void (*fn)(void *, int)) {
    mgt_cpu_impl *im = mgt_cpu_impl_of(be);
    const mgt_attn_shape *s = j->s;
    const size_t pairs = (size_t)s->n * (size_t)s->heads;
    int lanes = mgt_cpu_lanes_count(im->lanes);
    if ((size_t)lanes > pairs)
        lanes = (int)pairs;
    /* the scratch the layer reserved holds one workspace per lane (mgt_cpu_attn_scratch) */
    j->scratch = im->scratch;
    atomic_init(&j->next, 0);
    mgt_cpu_lanes_run(im->lanes, lanes, fn, j);
}

void mgt_cpu_attn_fwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, float *y,
                      float *lse) {
    if (s->n <= 0 || s->t <= 0 || s->heads <= 0)
        return;
    attn_job j = {.s = s, .qkv = qkv, .out = y, .lse_out = lse};
    attn_run(be, &j, attn_fwd_lane);
}

void mgt_cpu_attn_bwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, const float *y,
                      const float *lse, const float *dy, float *dqkv) {
    if (s->n <= 0 || s->t <= 0 || s->heads <= 0 || !dqkv)
        return;
    attn_job j = {.s = s, .qkv = qkv, .y = y, .lse = lse, .dy = dy, .dqkv = dqkv};
    attn_run(be, &j, attn_bwd_lane);
}

/* One query against the cache (generation): per head, the scores of positions 0 .. p, their
 * softmax (the maximum subtracted, the sum in double) and the weighted sum of the values, on the
 * calling thread (a position's work is small: heads x p x d). */
void mgt_cpu_attn_decode(mgt_backend *be, int c, int heads, int p, const float *q, const float *kc,
                         const float *vc, float *y) {
    (void)be;
    const int d = c / heads;
    const float scale = 1.0f / sqrtf((float)d);
    float *w = mgt_cpu_impl_of(be)->scratch; /* p + 1 weights: the attention's scratch */
    for (int h = 0; h < heads; h++) {
        const float *qh = q + (size_t)h * d;
        float mx = -INFINITY;
        for (int j = 0; j <= p; j++) {
            const float *k = kc + (size_t)j * c + (size_t)h * d;
            float s = 0.0f;
            for (int e = 0; e < d; e++)
                s += qh[e] * k[e];
            w[j] = s * scale;
            mx = w[j] > mx ? w[j] : mx;
        }
        double sum = 0.0;
        for (int j = 0; j <= p; j++)
            sum += w[j] = expf(w[j] - mx);
        const float inv = (float)(1.0 / sum);
        float *yh = y + (size_t)h * d;
        for (int e = 0; e < d; e++)
            yh[e] = 0.0f;
        for (int j = 0; j <= p; j++) {
            const float *v = vc + (size_t)j * c + (size_t)h * d;
            const float a = w[j] * inv;
            for (int e = 0; e < d; e++)
                yh[e] += a * v[e];
        }
    }
}
