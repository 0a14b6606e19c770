/* gpu_colsum.h: for the kernel files (.cu, C++ only): deterministic sums over the rows of a
 * row-major [rows][cols] matrix, per column, two sums at once, in double: the bias gradients,
 * batchnorm's statistics and its parameter gradients (gpu_reduce.cu, gpu_norm.cu).
 *
 * What is summed comes from a term functor F:
 *   F::T, F::N         the element type read and the columns a thread takes (1 or a vector)
 *   f.load(col0)       reads what the columns col0 .. col0 + N - 1 need (their parameters)
 *   f.add(row, col0, s1, s2)  adds row's terms of those columns to s1[0 .. N), s2[0 .. N)
 * and where the two sums go from an output functor O: o.store(col, t1, t2).
 *
 * Two passes, no atomics, an order that depends on the sizes alone:
 *   partial  block (8 column vectors, 32 row lanes) over a chunk of rows: lane l adds the
 *            chunk's rows l, l + 32, ... in order; the lanes' sums are added in a fixed
 *            pairwise tree; one double partial per (chunk, column) in the backend's partial
 *            arrays. Chunks are sized so that about kColsumBlocks blocks run in all: enough to
 *            keep every SM's loads in flight, with few partials;
 *   final    gpu_launch.h's tree_col_sum over the chunks' partials of each column.
 * Columns wider than the partial arrays hold are done in slices. rows == 0 stores zeros. */
#ifndef MGT_GPU_COLSUM_H
#define MGT_GPU_COLSUM_H

#include "gpu_launch.h"
#include "gpu_vec.h"

constexpr int kSumVecs = 8, kSumRows = 32;
/* Blocks of the partial pass in all (over column blocks and chunks), and the fewest rows a row
 * lane takes per chunk. */
constexpr int kColsumBlocks = 512, kColsumMinRows = 8;

/* At least 3 blocks an SM: at most 80 registers a thread. Without the bound the bfloat16
 * batchnorm sums (8 columns a thread, two double sums each) took 90 and 94 registers (2 blocks
 * an SM) and two others spilled 4 bytes; with it none spills (sm_90, nvcc 13.0 -Xptxas -v: 75
 * to 80 registers for those, the rest unchanged or below). */
template <class F>
__global__ void __launch_bounds__(kSumVecs *kSumRows, 3)
    k_colsum_part(F f, unsigned rows, unsigned rows_per_chunk, int cols, int col_base,
                  double *__restrict__ p1, double *__restrict__ p2) {
    constexpr int N = F::N;
    __shared__ double sh1[kSumRows][kSumVecs * N], sh2[kSumRows][kSumVecs * N];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col0 = (blockIdx.x * kSumVecs + tx) * N; /* within the slice */
    double s1[N], s2[N];
    for (int v = 0; v < N; v++)
        s1[v] = s2[v] = 0.0;
    if (col0 < cols) {
        f.load(col_base + col0);
        const unsigned r0 = blockIdx.y * rows_per_chunk;
        const unsigned r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
#pragma unroll 4
        for (unsigned r = r0 + ty; r < r1; r += kSumRows)
            f.add(r, col_base + col0, s1, s2);
    }
    for (int v = 0; v < N; v++) {
        sh1[ty][tx * N + v] = s1[v];
        sh2[ty][tx * N + v] = s2[v];
    }
    __syncthreads();
    for (int half = kSumRows / 2; half > 0; half /= 2) {
        if (ty < half)
            for (int v = 0; v < N; v++) {
                sh1[ty][tx * N + v] += sh1[ty + half][tx * N + v];
                sh2[ty][tx * N + v] += sh2[ty + half][tx * N + v];
            }
        __syncthreads();
    }
    if (ty == 0)
        for (int v = 0; v < N && col0 + v < cols; v++) {
            const size_t at = (size_t)blockIdx.y * cols + col0 + v;
            p1[at] = sh1[0][tx * N + v];
            p2[at] = sh2[0][tx * N + v];
        }
}

template <class O>
__global__ void k_colsum_final(O o, int chunks, int cols, int col_base,
                               const double *__restrict__ p1, const double *__restrict__ p2) {
    __shared__ double sh[kTreeLanes][kTreeCols];
    const int col = blockIdx.x * kTreeCols + threadIdx.x;
    const double t1 = tree_col_sum(p1, chunks, cols, col, sh);
    const double t2 = tree_col_sum(p2, chunks, cols, col, sh);
    if (threadIdx.y == 0 && col < cols)
        o.store(col_base + col, t1, t2);
}

/* The column sums of f's terms over `rows` rows, stored by o, on stream st (see the top). */
template <class F, class O>
void colsum(cudaStream_t st, const mgt_gpu_part *part, size_t rows, int cols, const F &f,
            const O &o) {
    constexpr int N = F::N;
    for (int c0 = 0; c0 < cols; c0 += MGT_GPU_PART_CAP) {
        const int width = cols - c0 < MGT_GPU_PART_CAP ? cols - c0 : MGT_GPU_PART_CAP;
        const int colblocks = (width + kSumVecs * N - 1) / (kSumVecs * N);
        size_t chunks =
            (rows + (size_t)kSumRows * kColsumMinRows - 1) / ((size_t)kSumRows * kColsumMinRows);
        const size_t most = kColsumBlocks / colblocks > 1 ? kColsumBlocks / colblocks : 1;
        chunks = chunks > most ? most : chunks;
        chunks = chunks > (size_t)(MGT_GPU_PART_CAP / width) ? MGT_GPU_PART_CAP / width : chunks;
        chunks = chunks < 1 ? 1 : chunks;
        const size_t per = (rows + chunks - 1) / chunks;
        MGT_LAUNCH(k_colsum_part<F>, dim3((unsigned)colblocks, (unsigned)chunks),
                   dim3(kSumVecs, kSumRows), st, f, (unsigned)rows, (unsigned)(per ? per : 1),
                   width, c0, part->a, part->b);
        MGT_LAUNCH(k_colsum_final<O>, (unsigned)((width + kTreeCols - 1) / kTreeCols),
                   dim3(kTreeCols, kTreeLanes), st, o, (int)chunks, width, c0, part->a, part->b);
    }
}

/* ---- common terms: the sum (and the sum of squares) of a matrix's columns ---- */

template <class T_, int N_, bool SQ> struct sum_terms {
    using T = T_;
    static constexpr int N = N_;
    const T *a;
    int ld;
    __device__ void load(int) {}
    __device__ void add(unsigned r, int col0, double *s1, double *s2) const {
        float v[N];
        load_v<T, N>(a + (size_t)r * (unsigned)ld + (unsigned)col0, v);
        for (int k = 0; k < N; k++) {
            s1[k] += v[k];
            if (SQ)
                s2[k] += (double)v[k] * v[k];
        }
    }
};

/* out1[col] = t1 and, unless NULL, out2[col] = t2, rounded to float. */
struct store_sums {
    float *out1, *out2;
    __device__ void store(int col, double t1, double t2) const {
        if (out1)
            out1[col] = (float)t1;
        if (out2)
            out2[col] = (float)t2;
    }
};

/* colsum of a matrix's columns (and their squares with SQ), the vector path where the width and
 * the pointer allow. */
template <class T, bool SQ>
void colsum_matrix(cudaStream_t st, const mgt_gpu_part *part, size_t rows, int cols, const T *a,
                   float *out1, float *out2) {
    constexpr int V = vec<T>::V;
    if (cols % V == 0 && aligned_to(a, 16))
        colsum(st, part, rows, cols, sum_terms<T, V, SQ>{a, cols}, store_sums{out1, out2});
    else
        colsum(st, part, rows, cols, sum_terms<T, 1, SQ>{a, cols}, store_sums{out1, out2});
}

#endif
