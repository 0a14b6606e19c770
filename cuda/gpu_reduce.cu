/* gpu_reduce.cu: deterministic column sums (gpu_reduce.h).
 *
 * Block (32, 8): 32 consecutive columns (coalesced reads of each row) by 8 row lanes. Block
 * (bx, by) covers columns bx*32.. and the rows of chunk by; its 8 lanes' double sums are added in
 * lane order and stored as the chunk's partial. k_colreduce_final adds the chunks in order. */
#include "gpu_launch.h"

namespace {

constexpr int kRedCols = 32, kRedLanes = 8;

template <int MODE>
__global__ void k_colreduce_part(size_t rows, int cols, int ld, size_t rows_per_chunk,
                                 const float *__restrict__ a, const float *__restrict__ b,
                                 const float *__restrict__ mean, double *__restrict__ p1,
                                 double *__restrict__ p2) {
    __shared__ double s1[kRedLanes][kRedCols], s2[kRedLanes][kRedCols];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col = blockIdx.x * kRedCols + tx;
    const size_t r0 = (size_t)blockIdx.y * rows_per_chunk;
    size_t r1 = r0 + rows_per_chunk;
    if (r1 > rows)
        r1 = rows;
    double acc1 = 0.0, acc2 = 0.0;
    if (col < cols) {
        const float m = MODE == MGT_RED_BN_BWD ? mean[col] : 0.0f;
        for (size_t r = r0 + ty; r < r1; r += kRedLanes) {
            const size_t at = r * (size_t)ld + col;
            if (MODE == MGT_RED_SUM) {
                acc1 += a[at];
            } else if (MODE == MGT_RED_SUMSQ) {
                const double v = a[at];
                acc1 += v;
                acc2 += v * v;
            } else { /* BN_BWD: acc1 = sum dy, acc2 = sum dy * (x - mean), (x - mean) in float */
                const float g = b[at];
                acc1 += g;
                acc2 += (double)g * (a[at] - m);
            }
        }
    }
    s1[ty][tx] = acc1;
    s2[ty][tx] = acc2;
    __syncthreads();
    if (ty == 0 && col < cols) {
        double t1 = 0.0, t2 = 0.0;
        for (int l = 0; l < kRedLanes; l++) {
            t1 += s1[l][tx];
            t2 += s2[l][tx];
        }
        const size_t at = (size_t)blockIdx.y * cols + col;
        p1[at] = t1;
        if (MODE != MGT_RED_SUM)
            p2[at] = t2;
    }
}

template <int MODE>
__global__ void k_colreduce_final(int cols, int chunks, const double *__restrict__ p1,
                                  const double *__restrict__ p2, const float *__restrict__ invstd,
                                  float *__restrict__ out1, float *__restrict__ out2) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols)
        return;
    double t1 = 0.0, t2 = 0.0;
    for (int k = 0; k < chunks; k++) {
        t1 += p1[(size_t)k * cols + col];
        if (MODE != MGT_RED_SUM)
            t2 += p2[(size_t)k * cols + col];
    }
    if (MODE == MGT_RED_SUM) {
        out1[col] = (float)t1;
    } else if (MODE == MGT_RED_SUMSQ) {
        out1[col] = (float)t1;
        out2[col] = (float)t2;
    } else { /* dgamma = invstd * sum dy (x - mean); dbeta = sum dy (CPU: (float)(sg * invstd)) */
        if (out1)
            out1[col] = (float)(t2 * invstd[col]);
        if (out2)
            out2[col] = (float)t1;
    }
}

/* One column-reduction slice (mgt_k_colreduce): the partials pass, then the fixed-order sum. */
struct colreduce_args {
    size_t rows;
    int width, ld;
    size_t chunks, rows_per_chunk;
    const float *a, *b, *mean, *invstd;
    float *out1, *out2;
};

template <int MODE>
void colreduce_launch(cudaStream_t st, const mgt_gpu_part *part, dim3 grid,
                      const colreduce_args &r) {
    MGT_LAUNCH(k_colreduce_part<MODE>, grid, dim3(kRedCols, kRedLanes), st, r.rows, r.width, r.ld,
               r.rows_per_chunk, r.a, r.b, r.mean, part->a, part->b);
    MGT_LAUNCH(k_colreduce_final<MODE>, (unsigned)((r.width + kThreads - 1) / kThreads), kThreads,
               st, r.width, (int)r.chunks, part->a, part->b, r.invstd, r.out1, r.out2);
}

} /* namespace */

extern "C" {

/* Slices of at most MGT_GPU_PART_CAP columns; per slice, chunks of rows such that there are
 * about 2048 blocks in all (enough to fill any current GPU) and chunks * width partials fit. */
void mgt_k_colreduce(cudaStream_t st, const mgt_gpu_part *part, int mode, size_t rows, int cols,
                     const float *a, const float *b, const float *mean, const float *invstd,
                     float *out1, float *out2) {
    if (cols <= 0)
        return;
    for (int c0 = 0; c0 < cols; c0 += MGT_GPU_PART_CAP) {
        const int width = cols - c0 < MGT_GPU_PART_CAP ? cols - c0 : MGT_GPU_PART_CAP;
        const int colblocks = (width + kRedCols - 1) / kRedCols;
        size_t chunks = (rows + 63) / 64; /* at least 64 rows (8 per lane) per chunk */
        size_t most = 2048 / (size_t)colblocks;
        if (most < 1)
            most = 1;
        if (chunks > most)
            chunks = most;
        if (chunks > (size_t)(MGT_GPU_PART_CAP / width))
            chunks = (size_t)(MGT_GPU_PART_CAP / width);
        if (chunks < 1)
            chunks = 1;
        const size_t per = (rows + chunks - 1) / chunks;
        const dim3 grid((unsigned)colblocks, (unsigned)chunks);
        const float *ac = a ? a + c0 : nullptr, *bc = b ? b + c0 : nullptr;
        const float *mc = mean ? mean + c0 : nullptr, *ic = invstd ? invstd + c0 : nullptr;
        float *o1 = out1 ? out1 + c0 : nullptr, *o2 = out2 ? out2 + c0 : nullptr;
        const colreduce_args r = {rows, width, cols, chunks, per, ac, bc, mc, ic, o1, o2};
        if (mode == MGT_RED_SUM)
            colreduce_launch<MGT_RED_SUM>(st, part, grid, r);
        else if (mode == MGT_RED_SUMSQ)
            colreduce_launch<MGT_RED_SUMSQ>(st, part, grid, r);
        else
            colreduce_launch<MGT_RED_BN_BWD>(st, part, grid, r);
    }
}

} /* extern "C" */
