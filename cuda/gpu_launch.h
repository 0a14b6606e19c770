/* gpu_launch.h: what the kernel files (.cu) of cuda/ share: the block size, the grid for n
 * elements, the grid-stride loop, the warp reductions of the row kernels, and the one launch
 * helper, which launches and checks. C++ only.
 *
 * The .cu files are also compiled without nvcc, by g++ for the emulated CUDA stack of the tests
 * (tests/gpu/emu: MGT_EMU, simt.h force-included), which has no <<<>>>: MGT_LAUNCH hides the
 * difference. */
#ifndef MGT_GPU_LAUNCH_H
#define MGT_GPU_LAUNCH_H

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpu_internal.h"

#ifdef MGT_EMU
#define MGT_LAUNCH_ON_(k, grid, block, st) MGT_EMU_LAUNCH(k, grid, block, 0, st)
#else
#define MGT_LAUNCH_ON_(k, grid, block, st) k<<<grid, block, 0, st>>>
#endif

/* Launches kernel k on `grid` blocks of `block` threads on stream st with the arguments that
 * follow, and checks the launch: a bad configuration ends the job naming the kernel; a launch
 * into a capture CUDA has invalidated is the capture's failure (gpu_internal.h: GPU_CHECK_ON). */
#define MGT_LAUNCH(k, grid, block, st, ...)                                                        \
    do {                                                                                           \
        MGT_LAUNCH_ON_(k, grid, block, st)(__VA_ARGS__);                                           \
        const cudaError_t e_ = cudaGetLastError();                                                 \
        if (e_ != cudaSuccess)                                                                     \
            mgt_gpu_fail_on(st, MGT_GPU_CUDA, (int)e_, "launch of " #k, __FILE__, __LINE__);       \
    } while (0)

/* Threads per block of the one-dimensional kernels. */
constexpr int kThreads = 256;
/* All lanes of a warp, for the *_sync intrinsics. */
constexpr unsigned kFull = 0xffffffffu;

/* Blocks for n elements at kThreads per block, capped (the kernels stride over the rest). */
static inline unsigned blocks_for(size_t n) {
    const size_t b = (n + kThreads - 1) / kThreads, cap = 16384;
    return (unsigned)(b < 1 ? 1 : (b > cap ? cap : b));
}

/* ---- fixed-order sums of a block of columns: block (kTreeCols, kTreeLanes), thread (column x,
 * lane y). The order depends on the sizes alone, so a sum has the same bits on every run. ---- */
constexpr int kTreeCols = 32, kTreeLanes = 8;

/* The sum of v over the lanes of this thread's column, in a fixed pairwise tree (lanes 0..3 add
 * lanes 4..7, then 0..1 add 2..3, then 0 adds 1), returned to every lane. Every thread of the
 * block must call it. */
__device__ inline double tree_lanes(double v, double (*sh)[kTreeCols]) {
    sh[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    for (int half = kTreeLanes / 2; half > 0; half /= 2) {
        if ((int)threadIdx.y < half)
            sh[threadIdx.y][threadIdx.x] += sh[threadIdx.y + half][threadIdx.x];
        __syncthreads();
    }
    const double s = sh[0][threadIdx.x];
    __syncthreads(); /* sh may be used again */
    return s;
}

/* Column col's sum of the rows of p ([rows][cols] doubles): lane l adds rows l, l + 8, l + 16,
 * ... in order, then the lanes are added by tree_lanes. Every thread of the block must call it
 * (col >= cols adds nothing). */
__device__ inline double tree_col_sum(const double *p, int rows, int cols, int col,
                                      double (*sh)[kTreeCols]) {
    double s = 0.0;
    if (col < cols)
        for (int r = threadIdx.y; r < rows; r += kTreeLanes)
            s += p[(size_t)r * cols + col];
    return tree_lanes(s, sh);
}

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- row kernels: one warp per row (8 rows per 256-thread block), lanes stride over it ---- */

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(kFull, v, o);
        v = u > v ? u : v;
    }
    return v;
}

__device__ inline double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    return v;
}

/* Row maximum with the CPU's comparison (mx = l[j] > mx ? l[j] : mx from l[0]). */
__device__ inline float row_max(const float *l, int k, int lane) {
    float mx = -INFINITY;
    bool any = false;
    for (int j = lane; j < k; j += 32) {
        const float v = l[j];
        if (!any || v > mx)
            mx = v;
        any = true;
    }
    mx = warp_max(mx);
    return mx;
}

#endif
