/* cpu_norm.c: batch normalisation over `rows` rows of c channels (rows = n*h*w for NHWC).
 *
 * Training splits the work so that ranks can combine statistics between the steps:
 *   bn_stats (per-rank sums) -> [allreduce] -> bn_finalize (mean, invstd, running stats)
 *   -> bn_apply;  backward: bn_bwd_reduce (per-rank dgamma, dbeta) -> [allreduce]
 *   -> bn_bwd_apply (dx, with `count` = rows over all ranks).
 * Per-channel sums accumulate in double: a channel may sum hundreds of thousands of rows.
 * The double accumulators live on the stack in blocks of channels (ops do not allocate); each
 * row's block is still read contiguously. gamma == NULL means 1 and beta == NULL means 0
 * (layers without scale / centre).
 *
 * Every pass is split across the backend's lanes: the sums by ranges of channels, one per lane
 * (each channel is still summed over all rows in row order, so the split changes no bit), the
 * maps by rows. */
#include <math.h>
#include <string.h>

#include "bn_math.h"
#include "cpu_internal.h"

enum { BN_BLOCK = 256 }; /* channels per block of stack accumulators */

/* Rows below which a pass runs on the calling thread alone (see cpu_elem.c's ELEM_PART). */
#define BN_PART ((size_t)1 << 16)

/* What the passes below share; each lane takes a range of channels (sums) or rows (maps). */
typedef struct {
    int rows, c;
    size_t nrows; /* the sums' rows (a convolution's bias gradient may have more than INT_MAX) */
    float count;
    const float *x, *dy, *mean, *invstd, *gamma, *beta, *dgamma, *dbeta;
    const float *r;     /* a fusion group's residual, or NULL */
    const float *ymask; /* backward: the group's output, the ReLU's mask (NULL: recomputed) */
    int relu;           /* the group ends in a ReLU */
    int x_relu;         /* backward: dx masked by x > 0 (the ReLU that wrote x) */
    int accumulate;     /* dr += dz */
    float *out0, *out1; /* sum, sumsq / dgamma, dbeta / y / dx */
    float *dr;          /* the residual's gradient, or NULL */
} bn_job;

/* A fusion group's pass as a job (mgt_bn_pass). */
static bn_job job_of(const mgt_bn_pass *p) {
    return (bn_job){.rows = p->rows > 0 ? p->rows : 0,
                    .c = p->c,
                    .x = p->x,
                    .mean = p->mean,
                    .invstd = p->invstd,
                    .gamma = p->gamma,
                    .beta = p->beta,
                    .r = p->r,
                    .ymask = p->y,
                    .relu = p->act == MGT_ACT_RELU,
                    .x_relu = p->x_relu};
}

/* z of row xr, channel k: the normalisation, then the residual (one float addition). The ReLU
 * (z < 0 ? 0 : z, a NaN staying NaN as act_fwd's) and its mask (z > 0) are taken from it. */
static inline float bn_z(const bn_job *j, const float *xr, const float *rr, int k) {
    const float g = j->gamma ? j->gamma[k] : 1.0f, b = j->beta ? j->beta[k] : 0.0f;
    const float y = (xr[k] - j->mean[k]) * (j->invstd[k] * g) + b;
    return rr ? y + rr[k] : y;
}

/* Whether the ReLU passed element k of row r: the output read (y > 0, which is z > 0: y is
 * z or 0), or z recomputed from x and the residual. */
static inline int bn_pass(const bn_job *j, size_t r, const float *xr, int k) {
    if (j->ymask)
        return j->ymask[r * (size_t)j->c + (size_t)k] > 0.0f;
    return bn_z(j, xr, j->r ? j->r + r * (size_t)j->c : NULL, k) > 0.0f;
}

/* Channels per part of a per-channel sum: one contiguous range per lane, so each lane reads a
 * long run of every row. */
static size_t bn_channel_part(mgt_backend *be, int c, size_t rows) {
    const int lanes = mgt_cpu_lanes_count(mgt_cpu_impl_of(be)->lanes);
    if ((size_t)c * rows < BN_PART)
        return (size_t)c;
    return ((size_t)c + (size_t)lanes - 1) / (size_t)lanes;
}

/* sum (and sumsq, unless NULL) of channels [lo, hi) over all rows, each summed in row order
 * in double. */
MGT_SIMD
static void bn_stats_part(void *p, size_t lo, size_t hi) {
    const bn_job *j = p;
    double s1[BN_BLOCK], s2[BN_BLOCK];
    for (int c0 = (int)lo; c0 < (int)hi; c0 += BN_BLOCK) {
        const int nc = (int)hi - c0 < BN_BLOCK ? (int)hi - c0 : BN_BLOCK;
        for (int k = 0; k < nc; k++)
            s1[k] = s2[k] = 0.0;
        if (j->out1) {
            for (size_t r = 0; r < j->nrows; r++) {
                const float *restrict xr = j->x + r * j->c + c0;
                for (int k = 0; k < nc; k++) {
                    const double v = xr[k];
                    s1[k] += v;
                    s2[k] += v * v;
                }
            }
        } else {
            for (size_t r = 0; r < j->nrows; r++) {
                const float *restrict xr = j->x + r * j->c + c0;
                for (int k = 0; k < nc; k++)
                    s1[k] += xr[k];
            }
        }
        for (int k = 0; k < nc; k++) {
            j->out0[c0 + k] = (float)s1[k];
            if (j->out1)
                j->out1[c0 + k] = (float)s2[k];
        }
    }
}

void mgt_cpu_channel_sums(mgt_backend *be, size_t rows, int c, const float *x, float *sum,
                          float *sumsq) {
    if (c <= 0)
        return;
    bn_job j = {.nrows = rows, .c = c, .x = x, .out0 = sum, .out1 = sumsq};
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)c, bn_channel_part(be, c, rows),
                      bn_stats_part, &j);
}

void mgt_cpu_bn_stats(mgt_backend *be, int rows, int c, const float *x, float *sum, float *sumsq) {
    mgt_cpu_channel_sums(be, rows < 0 ? 0 : (size_t)rows, c, x, sum, sumsq);
}

MGT_SIMD
static void bn_apply_rows(void *p, size_t lo, size_t hi) {
    const bn_job *j = p;
    const int c = j->c;
    for (size_t r = lo; r < hi; r++) {
        const float *restrict xr = j->x + r * c;
        const float *restrict rr = j->r ? j->r + r * c : NULL;
        float *restrict yr = j->out0 + r * c;
        if (j->relu)
            for (int k = 0; k < c; k++) {
                const float z = bn_z(j, xr, rr, k);
                yr[k] = z < 0.0f ? 0.0f : z;
            }
        else
            for (int k = 0; k < c; k++)
                yr[k] = bn_z(j, xr, rr, k);
    }
}

void mgt_cpu_bn_apply(mgt_backend *be, const mgt_bn_pass *p, float *y) {
    if (p->rows <= 0 || p->c <= 0)
        return;
    bn_job j = job_of(p);
    j.out0 = y;
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)j.rows, BN_PART / (size_t)j.c + 1,
                      bn_apply_rows, &j);
}

/* The arithmetic is bn_math.h's, shared with the GPU kernel. */
void mgt_cpu_bn_finalize(mgt_backend *be, int c, float count, const float *sum, const float *sumsq,
                         float eps, float momentum, const float *shift, float *mean, float *invstd,
                         float *running_mean, float *running_var) {
    (void)be;
    for (int j = 0; j < c; j++)
        mgt_bn_finalize_channel(count, sum[j], sumsq[j], eps, momentum, shift ? shift[j] : 0.0f,
                                &mean[j], &invstd[j], running_mean ? &running_mean[j] : NULL,
                                running_var ? &running_var[j] : NULL);
}

void mgt_cpu_bn_running(mgt_backend *be, int c, float eps, const float *running_mean,
                        const float *running_var, float *mean, float *invstd) {
    (void)be;
    for (int j = 0; j < c; j++) {
        mean[j] = running_mean[j];
        invstd[j] = (float)(1.0 / sqrt((double)running_var[j] + (double)eps));
    }
}

/* dbeta = sum dz; dgamma = sum dz * (x - mean) * invstd = invstd * sum dz * (x - mean), dz = dy
 * masked by the group's ReLU. */
MGT_SIMD
static void bn_bwd_reduce_part(void *p, size_t lo, size_t hi) {
    const bn_job *j = p;
    double sg[BN_BLOCK], sb[BN_BLOCK];
    for (int c0 = (int)lo; c0 < (int)hi; c0 += BN_BLOCK) {
        const int nc = (int)hi - c0 < BN_BLOCK ? (int)hi - c0 : BN_BLOCK;
        for (int k = 0; k < nc; k++)
            sg[k] = sb[k] = 0.0;
        for (int r = 0; r < j->rows; r++) {
            const size_t at = (size_t)r * j->c;
            const float *restrict xr = j->x + at;
            const float *restrict gr = j->dy + at;
            const float *restrict mr = j->mean + c0;
            if (j->relu) {
                for (int k = 0; k < nc; k++) {
                    const float dz = bn_pass(j, (size_t)r, xr, c0 + k) ? gr[c0 + k] : 0.0f;
                    sb[k] += dz;
                    sg[k] += (double)dz * (xr[c0 + k] - mr[k]);
                }
            } else {
                for (int k = 0; k < nc; k++) {
                    sb[k] += gr[c0 + k];
                    sg[k] += (double)gr[c0 + k] * (xr[c0 + k] - mr[k]);
                }
            }
        }
        for (int k = 0; k < nc; k++) {
            if (j->out0)
                j->out0[c0 + k] = (float)(sg[k] * j->invstd[c0 + k]);
            if (j->out1)
                j->out1[c0 + k] = (float)sb[k];
        }
    }
}

void mgt_cpu_bn_bwd_reduce(mgt_backend *be, const mgt_bn_pass *p, const float *dy, float *dgamma,
                           float *dbeta) {
    if (p->c <= 0)
        return;
    bn_job j = job_of(p);
    j.dy = dy;
    j.out0 = dgamma;
    j.out1 = dbeta;
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)j.c,
                      bn_channel_part(be, j.c, (size_t)j.rows), bn_bwd_reduce_part, &j);
}

/* dx = gamma * invstd * (dz - (dbeta + xhat * dgamma) / count), dz = dy masked by the group's
 * ReLU, then with x_relu masked by x > 0 (act_bwd's ReLU gradient, y > 0 ? g : 0, as x is that
 * ReLU's output); the residual's gradient dr = dz (or += dz). */
MGT_SIMD
static void bn_bwd_apply_rows(void *p, size_t lo, size_t hi) {
    const bn_job *j = p;
    const int c = j->c;
    const float inv_count = j->count > 0.0f ? 1.0f / j->count : 0.0f;
    const float *restrict mean = j->mean, *restrict invstd = j->invstd, *restrict gamma = j->gamma;
    const float *restrict dgamma = j->dgamma, *restrict dbeta = j->dbeta;
    for (size_t r = lo; r < hi; r++) {
        const float *restrict xr = j->x + r * c;
        const float *restrict gr = j->dy + r * c;
        float *restrict dx = j->out0 ? j->out0 + r * c : NULL;
        float *restrict dr = j->dr ? j->dr + r * c : NULL;
        if (dx && !dr && !j->relu) {
            /* a batchnorm alone (dz = dy): the same arithmetic, in a loop without the general
             * loop's branches, so that it vectorises (the general loop runs a float at a time) */
            if (j->x_relu)
                for (int k = 0; k < c; k++) {
                    const float is = invstd[k], g = gamma ? gamma[k] : 1.0f;
                    const float xhat = (xr[k] - mean[k]) * is;
                    const float v = g * is * (gr[k] - (dbeta[k] + xhat * dgamma[k]) * inv_count);
                    dx[k] = mgt_cpu_keep_if(v, xr[k] > 0.0f);
                }
            else
                for (int k = 0; k < c; k++) {
                    const float is = invstd[k], g = gamma ? gamma[k] : 1.0f;
                    const float xhat = (xr[k] - mean[k]) * is;
                    dx[k] = g * is * (gr[k] - (dbeta[k] + xhat * dgamma[k]) * inv_count);
                }
            continue;
        }
        for (int k = 0; k < c; k++) {
            const float dz = !j->relu || bn_pass(j, r, xr, k) ? gr[k] : 0.0f;
            if (dx) {
                const float is = invstd[k], g = gamma ? gamma[k] : 1.0f;
                const float xhat = (xr[k] - mean[k]) * is;
                const float v = g * is * (dz - (dbeta[k] + xhat * dgamma[k]) * inv_count);
                dx[k] = j->x_relu ? mgt_cpu_keep_if(v, xr[k] > 0.0f) : v;
            }
            if (dr)
                dr[k] = j->accumulate ? dr[k] + dz : dz;
        }
    }
}

void mgt_cpu_bn_bwd_apply(mgt_backend *be, const mgt_bn_pass *p, float count, const float *dy,
                          const float *dgamma, const float *dbeta, float *dx, float *dr,
                          int accumulate) {
    if ((!dx && !dr) || p->rows <= 0 || p->c <= 0)
        return;
    bn_job j = job_of(p);
    j.count = count;
    j.dy = dy;
    j.dgamma = dgamma;
    j.dbeta = dbeta;
    j.out0 = dx;
    j.dr = dr;
    j.accumulate = accumulate;
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, (size_t)j.rows, BN_PART / (size_t)j.c + 1,
                      bn_bwd_apply_rows, &j);
}
