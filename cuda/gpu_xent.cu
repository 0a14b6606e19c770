/* gpu_xent.cu: fused softmax + cross-entropy (gpu_xent.h), one warp per row.
 *
 * As cpu_elem.c: mx, se = sum exp(l - mx) (double), lse = mx + log(se), p = exp(l - mx) / se,
 * loss = lse - l[label] (dense: sum(t) * lse - sum t*l), and label smoothing s as there (the
 * target (1 - s) * t + s / k: in float for the gradient, the loss in double; s = 0 takes the
 * unsmoothed path, the same bits as without smoothing). probs/dlogits may alias logits: every
 * value of the row that another lane may overwrite is read before a __syncwarp, and in the final
 * pass a lane writes only the indices it has just read. Argmax: first maximum (ties to the lower
 * index), as the CPU's sequential scan. Top-5 as there: the label's p from l[label] read before
 * the writes, formed as every p_j is, and the classes ahead of it counted (larger p, or equal p at
 * a lower index) over the lanes. Per-row losses, correct and top-5 counts go to the backend's
 * reduction partials, then one fixed-order sum is added to sums[0..2]. */
#include "gpu_launch.h"

namespace {

/* The better of two (value, index) candidates under "strictly larger wins, first on ties". */
__device__ inline void warp_argmax(float &v, int &j) {
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(kFull, v, o);
        const int j2 = __shfl_xor_sync(kFull, j, o);
        if (v2 > v || (v2 == v && j2 < j)) {
            v = v2;
            j = j2;
        }
    }
}

__global__ void k_xent(int n, int k, const float *logits, const int32_t *__restrict__ labels,
                       const float *__restrict__ targets, float *probs, float *dlogits, float scale,
                       float smoothing, double *__restrict__ loss_out,
                       double *__restrict__ correct_out, double *__restrict__ top5_out) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)n)
        return;
    const size_t off = row * (size_t)k;
    const float *l = logits + off;
    const float mx = row_max(l, k, lane);
    double se = 0.0;
    for (int j = lane; j < k; j += 32)
        se += expf(l[j] - mx);
    /* everything else read from l before the writes below */
    const bool smooth = smoothing > 0.0f;
    const float t_on = 1.0f - smoothing, t_off = smoothing / (float)k;
    int lab = -1, valid = 0, tbest = 0;
    double st = 0.0, stl = 0.0, l_lab = 0.0, sl = 0.0;
    const float *t = targets ? targets + off : nullptr;
    if (t) {
        float tb = -INFINITY;
        int tj = INT32_MAX;
        for (int j = lane; j < k; j += 32) {
            const float ts = smooth ? t_on * t[j] + t_off : t[j];
            st += ts;
            stl += (double)ts * l[j];
            if (tj == INT32_MAX || t[j] > tb) {
                tb = t[j];
                tj = j;
            }
        }
        warp_argmax(tb, tj);
        tbest = tj == INT32_MAX ? 0 : tj;
        l_lab = l[tbest];
        st = warp_sum(st);
        stl = warp_sum(stl);
    } else {
        lab = labels[row];
        valid = lab >= 0 && lab < k;
        if (valid)
            l_lab = l[lab];
        if (valid && smooth) {
            for (int j = lane; j < k; j += 32)
                sl += l[j];
            sl = warp_sum(sl);
        }
    }
    se = warp_sum(se);
    __syncwarp(); /* orders every lane's reads of l above before any lane's writes below */
    const double lse = (double)mx + log(se);
    const float inv_se = (float)(1.0 / se);
    const float stf = (float)st;
    float *p = probs ? probs + off : nullptr;
    float *d = dlogits ? dlogits + off : nullptr;
    float best_p = -1.0f;
    int best = INT32_MAX;
    const int target = t ? tbest : lab; /* the class top-5 ranks */
    const float p_lab = t || valid ? expf((float)l_lab - mx) * inv_se : 0.0f;
    int ahead = 0;
    for (int j = lane; j < k; j += 32) {
        const float pj = expf(l[j] - mx) * inv_se;
        if (pj > best_p) { /* the CPU's rule, from -1: a NaN never wins */
            best_p = pj;
            best = j;
        }
        ahead += pj > p_lab || (pj == p_lab && j < target);
        if (p)
            p[j] = pj;
        if (d) {
            if (t) {
                d[j] = (pj * stf - (smooth ? t_on * t[j] + t_off : t[j])) * scale;
            } else {
                const float tj =
                    smooth ? (j == lab ? t_on + t_off : t_off) : (j == lab ? 1.0f : 0.0f);
                d[j] = valid ? (pj - tj) * scale : 0.0f;
            }
        }
    }
    warp_argmax(best_p, best);
    if (best == INT32_MAX)
        best = 0; /* nothing beat -1 (all NaN): index 0, as on the CPU */
    for (int o = 16; o > 0; o >>= 1)
        ahead += __shfl_xor_sync(kFull, ahead, o);
    if (lane == 0) {
        top5_out[row] = (t || valid) && ahead < 5 ? 1.0 : 0.0;
        if (t) {
            loss_out[row] = st * lse - stl;
            correct_out[row] = best == tbest ? 1.0 : 0.0;
        } else {
            loss_out[row] =
                !valid   ? 0.0
                : smooth ? lse - (1.0 - (double)smoothing) * l_lab - (double)smoothing / k * sl
                         : lse - l_lab;
            correct_out[row] = valid && best == lab ? 1.0 : 0.0;
        }
    }
}

/* Fixed-order tree sum of n partials, times scale (backend.h: xent's), into sums[0..2] (one
 * block). */
constexpr int kSumThreads = 256;

__global__ void k_sum3(int n, const double *__restrict__ a, const double *__restrict__ b,
                       const double *__restrict__ c, double scale, float *__restrict__ sums) {
    __shared__ double sa[kSumThreads], sb[kSumThreads], sc[kSumThreads];
    double ta = 0.0, tb = 0.0, tc = 0.0;
    for (int i = threadIdx.x; i < n; i += kSumThreads) {
        ta += a[i];
        tb += b[i];
        tc += c[i];
    }
    sa[threadIdx.x] = ta;
    sb[threadIdx.x] = tb;
    sc[threadIdx.x] = tc;
    __syncthreads();
    for (int s = kSumThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            sa[threadIdx.x] += sa[threadIdx.x + s];
            sb[threadIdx.x] += sb[threadIdx.x + s];
            sc[threadIdx.x] += sc[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        sums[0] += (float)(sa[0] * scale);
        sums[1] += (float)(sb[0] * scale);
        sums[2] += (float)(sc[0] * scale);
    }
}

/* Rows in chunks of MGT_GPU_PART_CAP (one chunk in practice): per-row results to the partials,
 * then their fixed-order sum onto sums. */
void xent(mgt_backend *be, int n, int k, const float *logits, const int32_t *labels,
          const float *targets, float *probs, float *dlogits, float scale, float smoothing,
          float *sums) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (n <= 0 || k <= 0)
        return;
    for (int r0 = 0; r0 < n; r0 += MGT_GPU_PART_CAP) {
        const int m = n - r0 < MGT_GPU_PART_CAP ? n - r0 : MGT_GPU_PART_CAP;
        const size_t off = (size_t)r0 * k;
        MGT_LAUNCH(k_xent, (unsigned)((m + 7) / 8), kThreads, im->stream, m, k, logits + off,
                   labels ? labels + r0 : nullptr, targets ? targets + off : nullptr,
                   probs ? probs + off : nullptr, dlogits ? dlogits + off : nullptr, scale,
                   smoothing, im->part.a, im->part.b, im->part.c);
        MGT_LAUNCH(k_sum3, 1, kSumThreads, im->stream, m, im->part.a, im->part.b, im->part.c,
                   (double)scale, sums);
    }
}

} /* namespace */

extern "C" {

void mgt_gpu_xent_sparse(mgt_backend *be, int n, int k, const float *logits, const int32_t *labels,
                         float *probs, float *dlogits, float scale, float smoothing, float *sums) {
    xent(be, n, k, logits, labels, nullptr, probs, dlogits, scale, smoothing, sums);
}

void mgt_gpu_xent_dense(mgt_backend *be, int n, int k, const float *logits, const float *targets,
                        float *probs, float *dlogits, float scale, float smoothing, float *sums) {
    xent(be, n, k, logits, nullptr, targets, probs, dlogits, scale, smoothing, sums);
}

} /* extern "C" */
