/* version.c: the text of `mgtrain --version`. Library versions come from the libraries loaded
 * (OpenBLAS's build configuration, MPI_Get_library_version), which is what a user debugging a
 * run on another machine needs; the GPU line comes from cuda/gpu_version.c. */
#include "version.h"

#include <cblas.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "gpu.h"

/* Appends printf output at buf + *len, never past n - 1 bytes. */
static void put(char *buf, size_t n, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t n, size_t *len, const char *fmt, ...) {
    if (*len + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *len, n - *len, fmt, ap);
    va_end(ap);
    if (w > 0)
        *len = *len + (size_t)w < n ? *len + (size_t)w : n - 1;
}

void mgt_version_text(char *buf, size_t n) {
    if (!n)
        return;
    buf[0] = 0;
    size_t len = 0;
    put(buf, n, &len, "mgtrain %s\n", MGT_VERSION);
    char kernel[160];
    mgt_cpu_blas_notice(kernel, sizeof kernel);
    put(buf, n, &len, "cpu backend: %s\n  %s\n", openblas_get_config(), kernel);
#ifdef MGT_HAVE_CUDA
    char gpu[256];
    mgt_gpu_version(gpu, sizeof gpu);
    put(buf, n, &len, "gpu backend: %s\n", gpu);
#else
    put(buf, n, &len,
        "gpu backend: not built (no CUDA toolkit with cuDNN and NCCL was found when "
        "this binary was built)\n");
#endif
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
    int mlen = 0;
    /* One of the few MPI calls allowed before MPI_Init. Its text may span lines: keep the first. */
    if (MPI_Get_library_version(mpi, &mlen) != MPI_SUCCESS)
        snprintf(mpi, sizeof mpi, "unknown");
    mpi[strcspn(mpi, "\r\n")] = 0;
    put(buf, n, &len, "mpi: %s\n", mpi);
}
