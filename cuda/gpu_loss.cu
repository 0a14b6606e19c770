/* gpu_loss.cu: the losses of float targets (backend.h: elem_loss) on the GPU, their arithmetic
 * loss_math.h's, as the CPU's.
 *
 * One warp per row computes each output's term, writes the gradient (and the sigmoid where the
 * loss takes it over), and leaves the row's loss (the mean of its terms), and for a regression
 * its sums of |e| and e^2, in the backend's reduction partials; a fixed-order tree sum adds them
 * to sums. Binary cross-entropy's counts come from a second pass, one thread per output (label)
 * counting its true positives, false positives and false negatives over the rows in row order,
 * added to its per-label sums where the model keeps them and summed over the labels into the
 * micro counts and the outputs predicted right (the n k outputs less the false ones). The
 * counts are whole numbers, exact in any order; the float sums have the same bits for the same
 * rows on every run. */
#include "gpu_launch.h"

#include "cpu/loss_math.h"

namespace {

__global__ void k_loss_rows(int n, int k, mgt_elem_loss L, const float *y, const float *__restrict__ t, float *probs, float *dy,
                            float gs, double *__restrict__ loss_out, double *__restrict__ abs_out,
                            double *__restrict__ sq_out) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)n)
        return;
    const bool bce = L.kind == MGT_ELEM_BCE;
    const float w0 = L.cw ? L.cw[0] : 1.0f, w1 = L.cw ? L.cw[1] : 1.0f;
    double loss = 0.0, ab = 0.0, sq = 0.0;
    for (int j = lane; j < k; j += 32) {
        const size_t at = row * (size_t)k + (size_t)j;
        const float v = y[at], tj = t[at];
        float g, p;
        loss += mgt_loss_term(L.kind, v, mgt_loss_target(L.kind, tj, L.smoothing), L.delta, w0,
                              w1, &g, &p);
        if (!bce) {
            const double e = (double)v - (double)tj;
            ab += fabs(e);
            sq += e * e;
        }
        if (probs && bce)
            probs[at] = p; /* y[at] was read above: probs may alias y */
        if (dy)
            dy[at] = g * gs;
    }
    loss = warp_sum(loss);
    ab = warp_sum(ab);
    sq = warp_sum(sq);
    if (lane == 0) {
        loss_out[row] = loss / k;
        abs_out[row] = ab;
        sq_out[row] = sq;
    }
}

/* Binary counts of labels j0 .. j0 + m - 1 over the n rows, from the logits (before the rows'
 * pass may write the sigmoid over them): into the partials (TP, FP, FN), and into the per-label
 * sums where there are some. */
__global__ void k_label_counts(int n, int k, int j0, int m, const float *y,
                               const float *__restrict__ t, double *__restrict__ tp_out,
                               double *__restrict__ fp_out, double *__restrict__ fn_out,
                               float *per_label) {
    GRID_STRIDE(q, (size_t)m) {
        const int j = j0 + (int)q;
        double tp = 0, fp = 0, fn = 0;
        for (int i = 0; i < n; i++) {
            const size_t at = (size_t)i * (size_t)k + (size_t)j;
            const bool pred = y[at] > 0.0f, pos = t[at] > 0.5f;
            tp += pred && pos;
            fp += pred && !pos;
            fn += !pred && pos;
        }
        tp_out[q] = tp;
        fp_out[q] = fp;
        fn_out[q] = fn;
        if (per_label) {
            per_label[3 * j + MGT_SUM_TP] += (float)tp;
            per_label[3 * j + MGT_SUM_FP] += (float)fp;
            per_label[3 * j + MGT_SUM_FN] += (float)fn;
        }
    }
}

/* Fixed-order tree sum of n partials of each of a, b, c onto *sa, *sb, *sc (NULL: not kept);
 * with right set, right += outputs less b's and c's sums (the outputs predicted right). One
 * block. */
constexpr int kSumThreads = 256;

__global__ void k_sum_to(int n, const double *__restrict__ a, const double *__restrict__ b,
                         const double *__restrict__ c, float *sa, float *sb, float *sc,
                         float *right, double outputs) {
    __shared__ double ha[kSumThreads], hb[kSumThreads], hc[kSumThreads];
    double ta = 0.0, tb = 0.0, tc = 0.0;
    for (int i = threadIdx.x; i < n; i += kSumThreads) {
        ta += a[i];
        tb += b[i];
        tc += c[i];
    }
    ha[threadIdx.x] = ta;
    hb[threadIdx.x] = tb;
    hc[threadIdx.x] = tc;
    __syncthreads();
    for (int s = kSumThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            ha[threadIdx.x] += ha[threadIdx.x + s];
            hb[threadIdx.x] += hb[threadIdx.x + s];
            hc[threadIdx.x] += hc[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (sa)
            *sa += (float)ha[0];
        if (sb)
            *sb += (float)hb[0];
        if (sc)
            *sc += (float)hc[0];
        if (right)
            *right += (float)(outputs - hb[0] - hc[0]);
    }
}

} /* namespace */

extern "C" void mgt_gpu_elem_loss(mgt_backend *be, const mgt_elem_loss *L, int n, int k,
                                  const float *y, const float *t, float *probs, float *dy,
                                  float scale, float *sums) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (n <= 0 || k <= 0)
        return;
    const bool bce = L->kind == MGT_ELEM_BCE;
    float *task = sums + MGT_SUM_TASK;
    const float gs = scale / (float)k;
    for (int r0 = 0; r0 < n; r0 += MGT_GPU_PART_CAP) {
        const int m = n - r0 < MGT_GPU_PART_CAP ? n - r0 : MGT_GPU_PART_CAP;
        const size_t off = (size_t)r0 * (size_t)k;
        for (int j0 = 0; bce && j0 < k; j0 += MGT_GPU_PART_CAP) { /* the counts first */
            const int q = k - j0 < MGT_GPU_PART_CAP ? k - j0 : MGT_GPU_PART_CAP;
            MGT_LAUNCH(k_label_counts, blocks_for((size_t)q), kThreads, im->stream, m, k, j0, q,
                       y + off, t + off, im->part.a, im->part.b, im->part.c,
                       L->per_label ? task + MGT_SUM_LABELS : nullptr);
            MGT_LAUNCH(k_sum_to, 1, kSumThreads, im->stream, q, im->part.a, im->part.b,
                       im->part.c, task + MGT_SUM_TP, task + MGT_SUM_FP, task + MGT_SUM_FN,
                       sums + MGT_SUM_CORRECT, (double)m * (double)q);
        }
        MGT_LAUNCH(k_loss_rows, (unsigned)((m + 7) / 8), kThreads, im->stream, m, k, *L, y + off,
                   t + off, probs ? probs + off : nullptr, dy ? dy + off : nullptr, gs,
                   im->part.a, im->part.b, im->part.c);
        MGT_LAUNCH(k_sum_to, 1, kSumThreads, im->stream, m, im->part.a, im->part.b, im->part.c,
                   sums + MGT_SUM_LOSS, bce ? nullptr : task + MGT_SUM_ABS,
                   bce ? nullptr : task + MGT_SUM_SQ, nullptr, 0.0);
    }
}
