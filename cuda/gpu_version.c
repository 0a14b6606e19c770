/* gpu_version.c: the GPU backend's line of `mgtrain --version`.
 *
 * The versions reported are those of the libraries actually loaded (cudaRuntimeGetVersion,
 * cudnnGetVersion, ncclGetVersion): on a GPU machine they may come from other installs (pip's
 * wheels) than the headers this file was compiled with, and a mismatch is then shown as
 * "cuDNN 9.10.1 (built with 9.19.0)". None of the calls needs a GPU or a driver. The emulated CUDA
 * stack of the tests implements only the calls the backend makes, so the three are weak
 * references here: where one is absent the headers' version stands alone. */
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "gpu.h"

#pragma weak cudaRuntimeGetVersion
#pragma weak cudnnGetVersion
#pragma weak ncclGetVersion

/* "13.0" from CUDA's 1000 * major + 10 * minor. */
static void cuda_str(char *s, size_t n, int v) {
    snprintf(s, n, "%d.%d", v / 1000, v % 1000 / 10);
}

/* "9.19.0" from cuDNN 9's 10000 * major + 100 * minor + patch. */
static void cudnn_str(char *s, size_t n, size_t v) {
    snprintf(s, n, "%zu.%zu.%zu", v / 10000, v % 10000 / 100, v % 100);
}

/* "2.28.9" from NCCL's 10000 * major + 100 * minor + patch (since 2.9). */
static void nccl_str(char *s, size_t n, int v) {
    snprintf(s, n, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
}

/* "NAME LOADED" or "NAME LOADED (built with BUILT)". */
static int one(char *buf, size_t n, const char *name, const char *loaded, const char *built) {
    if (!loaded[0] || !strcmp(loaded, built))
        return snprintf(buf, n, "%s %s", name, built);
    return snprintf(buf, n, "%s %s (built with %s)", name, loaded, built);
}

void mgt_gpu_version(char *buf, size_t n) {
    char built[3][32], loaded[3][32] = {"", "", ""};
    cuda_str(built[0], sizeof built[0], CUDART_VERSION);
    cudnn_str(built[1], sizeof built[1], (size_t)CUDNN_VERSION);
    nccl_str(built[2], sizeof built[2], NCCL_VERSION_CODE);
    int v = 0;
    if (cudaRuntimeGetVersion && cudaRuntimeGetVersion(&v) == cudaSuccess)
        cuda_str(loaded[0], sizeof loaded[0], v);
    if (cudnnGetVersion)
        cudnn_str(loaded[1], sizeof loaded[1], cudnnGetVersion());
    if (ncclGetVersion && ncclGetVersion(&v) == ncclSuccess)
        nccl_str(loaded[2], sizeof loaded[2], v);
    static const char *const names[3] = {"CUDA", "cuDNN", "NCCL"};
    size_t len = 0;
    for (int i = 0; i < 3 && len + 1 < n; i++) {
        int w = snprintf(buf + len, n - len, "%s", i ? ", " : "");
        len += w > 0 ? (size_t)w : 0;
        if (len + 1 >= n)
            break;
        w = one(buf + len, n - len, names[i], loaded[i], built[i]);
        len += w > 0 ? (size_t)w : 0;
    }
    if (len >= n)
        buf[n - 1] = 0;
}
