/* gpu_bf16.cu: float <-> bfloat16 for --precision bf16 (see gpu_bf16.h).
 *
 * The rounding (to nearest even) and the widening are gpu_vec.h's, as every kernel that stores
 * a bfloat16 activation uses them. The op table's act_from_f32 and act_to_f32 (backend.h) carry
 * the model's input batch into bfloat16 and its output back to float. */
#include "gpu_launch.h"
#include "gpu_vec.h"

namespace {

__global__ void k_to_bf16(size_t n, const float *__restrict__ x, uint16_t *__restrict__ y) {
    GRID_STRIDE(i, n) {
        y[i] = to_bf16(x[i]);
    }
}

__global__ void k_from_bf16(size_t total, int cols, const uint16_t *__restrict__ x,
                            const float *__restrict__ b, float *__restrict__ y) {
    GRID_STRIDE(i, total) {
        const float v = from_bf16(x[i]);
        y[i] = b ? v + b[i % (size_t)cols] : v;
    }
}

} /* namespace */

extern "C" {

void mgt_k_to_bf16(cudaStream_t st, size_t n, const float *x, uint16_t *y) {
    if (!n)
        return;
    MGT_LAUNCH(k_to_bf16, blocks_for(n), kThreads, st, n, x, y);
}

void mgt_k_from_bf16(cudaStream_t st, size_t rows, int cols, const uint16_t *x, const float *b,
                     float *y) {
    const size_t total = rows * (size_t)(cols > 0 ? cols : 0);
    if (!total)
        return;
    MGT_LAUNCH(k_from_bf16, blocks_for(total), kThreads, st, total, cols, x, b, y);
}

void mgt_gpu_act_from_f32(mgt_backend *be, size_t n, const float *x, float *y) {
    mgt_k_to_bf16(mgt_gpu_stream(be), n, x, (uint16_t *)y);
}

void mgt_gpu_act_to_f32(mgt_backend *be, mgt_act act, int n, int row, const float *x, float *y) {
    if (n <= 0 || row <= 0)
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    mgt_k_from_bf16(st, (size_t)n, row, (const uint16_t *)x, nullptr, y);
    if (act == MGT_ACT_SOFTMAX)
        mgt_k_softmax_f32(st, n, row, y, y);
}

uint16_t mgt_gpu_bf16_twin(float x) {
    return to_bf16(x);
}

} /* extern "C" */
