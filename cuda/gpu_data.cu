/* gpu_data.cu: batches made on the device (gpu_data.h), bit for bit as the host makes them
 * (dataset.h). */
#include "gpu_launch.h"
#include "util.h"

namespace {

/* ---- synthetic samples (dataset.h's definition, bit for bit) ----
 * One block per sample. Value j is byte j % 8 of draw row * words + j / 8; the label is the
 * class whose template has the largest dot product with the sample, both centred as
 * 2 * byte - 255. The dot products are exact integer sums, so the block's reduction order cannot
 * change them; classes are scanned in increasing order with a strict >, so ties go to the lowest
 * class, as on the host. Classes are taken kSynClasses at a time (the pixels are regenerated per
 * pass, which is cheaper than keeping them). Launched with kThreads threads per block. */
constexpr int kSynClasses = 16;

__global__ void k_synthetic(int n, int64_t elems, int classes, uint64_t pkey, uint64_t tkey,
                            int64_t first, const int64_t *__restrict__ ids, float *__restrict__ x,
                            int32_t *__restrict__ labels, float *__restrict__ targets) {
    __shared__ long long part[kThreads / 32][kSynClasses];
    __shared__ long long best_v;
    __shared__ int best_c;
    const uint64_t words = (uint64_t)((elems + 7) / 8);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int s = blockIdx.x; s < n; s += gridDim.x) {
        const uint64_t row = (uint64_t)(first + ids[s]);
        float *xs = x + (int64_t)s * elems;
        for (int c0 = 0; c0 < classes; c0 += kSynClasses) {
            const int nc = classes - c0 < kSynClasses ? classes - c0 : kSynClasses;
            long long acc[kSynClasses];
#pragma unroll
            for (int c = 0; c < kSynClasses; c++)
                acc[c] = 0;
            for (int64_t j = threadIdx.x; j < elems; j += blockDim.x) {
                const int shift = (int)(j % 8) * 8;
                const uint64_t word = (uint64_t)(j / 8);
                const int b = (int)((mgt_rand64(pkey, row * words + word) >> shift) & 255);
                if (c0 == 0)
                    xs[j] = ((float)b + 0.5f) * (1.0f / 256.0f);
                const int pc = 2 * b - 255;
#pragma unroll
                for (int c = 0; c < kSynClasses; c++)
                    if (c < nc) {
                        const uint64_t t = mgt_rand64(tkey, (uint64_t)(c0 + c) * words + word);
                        acc[c] += (long long)(pc * (2 * (int)((t >> shift) & 255) - 255));
                    }
            }
#pragma unroll
            for (int c = 0; c < kSynClasses; c++) {
                long long v = acc[c];
                for (int o = 16; o > 0; o >>= 1)
                    v += __shfl_xor_sync(kFull, v, o);
                if (lane == 0)
                    part[warp][c] = v;
            }
            __syncthreads();
            if (threadIdx.x == 0)
                for (int c = 0; c < nc; c++) {
                    long long t = 0;
                    for (int w = 0; w < (int)blockDim.x / 32; w++)
                        t += part[w][c];
                    if ((c0 == 0 && c == 0) || t > best_v) {
                        best_v = t;
                        best_c = c0 + c;
                    }
                }
            __syncthreads();
        }
        if (threadIdx.x == 0)
            labels[s] = best_c;
        if (targets)
            for (int c = threadIdx.x; c < classes; c += blockDim.x)
                targets[(int64_t)s * classes + c] = c == best_c ? 1.0f : 0.0f;
        __syncthreads(); /* best_c and part are reused by the next sample */
    }
}

/* ---- batches gathered from a byte dataset on the device (dataset.h's scaling) ---- */

__global__ void k_gather_u8(size_t total, int64_t elems, const uint8_t *__restrict__ pixels,
                            const int64_t *__restrict__ ids, float *__restrict__ x) {
    GRID_STRIDE(i, total) {
        const size_t s = i / (size_t)elems, j = i % (size_t)elems;
        x[i] = (float)pixels[(size_t)ids[s] * (size_t)elems + j] / 255.0f;
    }
}

__global__ void k_gather_labels(int n, int classes, const uint8_t *__restrict__ labels,
                                const int64_t *__restrict__ ids, int32_t *__restrict__ out,
                                float *__restrict__ targets) {
    GRID_STRIDE(s, (size_t)n) {
        const int label = labels[ids[s]];
        out[s] = label;
        if (targets)
            for (int c = 0; c < classes; c++)
                targets[s * (size_t)classes + c] = c == label ? 1.0f : 0.0f;
    }
}

} /* namespace */

extern "C" {

void mgt_gpu_synthetic(mgt_backend *be, int n, int64_t elems, int classes, uint64_t pixel_key,
                       uint64_t template_key, int64_t first, const int64_t *ids, float *x,
                       int32_t *labels, float *targets) {
    if (n <= 0 || classes <= 0)
        return;
    const unsigned grid = (unsigned)(n < 65535 ? n : 65535);
    MGT_LAUNCH(k_synthetic, grid, kThreads, mgt_gpu_stream(be), n, elems, classes, pixel_key,
               template_key, first, ids, x, labels, targets);
}

void mgt_gpu_gather_u8(mgt_backend *be, int n, int64_t elems, int classes, const uint8_t *pixels,
                       const uint8_t *labels, const int64_t *ids, float *x, int32_t *labels_out,
                       float *targets) {
    if (n <= 0)
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    const size_t total = (size_t)n * (size_t)elems;
    if (total)
        MGT_LAUNCH(k_gather_u8, blocks_for(total), kThreads, st, total, elems, pixels, ids, x);
    MGT_LAUNCH(k_gather_labels, blocks_for((size_t)n), kThreads, st, n, classes, labels, ids,
               labels_out, targets);
}

} /* extern "C" */
