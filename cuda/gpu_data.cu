/* gpu_data.cu: batches made on the device (gpu_data.h), bit for bit as the host makes them
 * (dataset.h, data/synthetic_def.h). */
#include "data/synthetic_def.h"
#include "gpu_launch.h"
#include "util.h"

namespace {

/* ---- synthetic samples (data/synthetic_def.h's definition, bit for bit) ----
 * One thread per draw pair: sample s = i / words, draw w = i % words, 8 values from the class
 * template's draw and the sample's noise draw (the label, one more draw, is recomputed by each
 * thread: cheaper than a pass to share it). The values go out as two 16-byte stores (vec) when a
 * sample's values fill whole draws and x is 16-byte aligned (then so is every draw's start), one
 * by one otherwise. Memory-bound: 4 * elems bytes written per sample, nothing read but the ids. */
__global__ void k_synthetic(size_t total, uint64_t words, int64_t elems, int vec, int classes,
                            uint64_t pkey, uint64_t tkey, uint64_t lkey, int64_t first,
                            const int64_t *__restrict__ ids, float *__restrict__ x,
                            int32_t *__restrict__ labels) {
    GRID_STRIDE(i, total) {
        const size_t s = i / words;
        const uint64_t w = i - s * words;
        const uint64_t row = (uint64_t)(first + ids[s]);
        const int32_t label = mgt_syn_label(lkey, row, classes);
        const uint64_t t = mgt_rand64(tkey, (uint64_t)label * words + w);
        const uint64_t u = mgt_rand64(pkey, row * words + w);
        float *xs = x + (int64_t)s * elems + (int64_t)(8 * w);
        if (vec) {
            reinterpret_cast<float4 *>(xs)[0] =
                make_float4(mgt_syn_value(t, u, 0), mgt_syn_value(t, u, 1), mgt_syn_value(t, u, 2),
                            mgt_syn_value(t, u, 3));
            reinterpret_cast<float4 *>(xs)[1] =
                make_float4(mgt_syn_value(t, u, 4), mgt_syn_value(t, u, 5), mgt_syn_value(t, u, 6),
                            mgt_syn_value(t, u, 7));
        } else {
            const int64_t left = elems - (int64_t)(8 * w);
            for (int k = 0; k < 8 && k < left; k++)
                xs[k] = mgt_syn_value(t, u, k);
        }
        if (w == 0)
            labels[s] = label;
    }
}

/* One-hot rows from labels (synthetic batches: the labels just made). */
__global__ void k_onehot(size_t total, int classes, const int32_t *__restrict__ labels,
                         float *__restrict__ targets) {
    GRID_STRIDE(i, total) {
        const size_t s = i / (size_t)classes;
        targets[i] = (int)(i - s * (size_t)classes) == labels[s] ? 1.0f : 0.0f;
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
    cudaStream_t st = mgt_gpu_stream(be);
    const uint64_t words = (uint64_t)(elems + 7) / 8;
    const size_t total = (size_t)n * (size_t)(words ? words : 1);
    /* elems == 0: one "draw" per sample still writes its label (and no value) */
    const int vec = elems > 0 && elems % 8 == 0 && (uintptr_t)x % 16 == 0;
    MGT_LAUNCH(k_synthetic, blocks_for(total), kThreads, st, total, words ? words : 1, elems, vec,
               classes, pixel_key, template_key, mgt_syn_label_key(pixel_key), first, ids, x,
               labels);
    if (targets)
        MGT_LAUNCH(k_onehot, blocks_for((size_t)n * (size_t)classes), kThreads, st,
                   (size_t)n * (size_t)classes, classes, labels, targets);
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
