/* gpu_plugin.h: how mgtrain and libmgt reach the GPU backend, which is a library of its own.
 *
 * The GPU backend (cuda/) and the CUDA, cuDNN, cuBLAS and NCCL libraries it needs (over 800 MB
 * of them) are not linked into mgtrain or libmgt: a CPU run must neither need them installed nor
 * pay for mapping them (a job under a modest `ulimit -v` would die in the dynamic loader before
 * mgtrain printed a word). They are built into libmgt_gpu.so, which src/gpu_load.c opens with
 * dlopen the first time something asks for a GPU (--device gpu or auto, --version); a library
 * that cannot be loaded then reads as "no usable GPU", with the loader's reason, which names
 * the missing file. The programs that test the backend's internals link it statically instead
 * (the GPU tests, the emulated CUDA build): there the functions of gpu.h are the backend's own.
 *
 * The backend names one entry point, mgt_gpu_plugin; everything else in it is local. The core
 * lends it the functions whose effect must be the core's own: ending the job (which removes the
 * run folder's lock, runtime.h), rank 0's log, replacing a file whole, and the transports'
 * common part (comm.c: its watchdog thread ends the job the same way). What else it uses of the core (util.c) has no
 * state and is compiled into it. */
#ifndef MGT_GPU_PLUGIN_H
#define MGT_GPU_PLUGIN_H

#include <mpi.h>
#include <stddef.h>

#include "backend.h"
#include "comm.h"
#include "util.h"

/* The file gpu_load.c opens by its absolute path: in the folder of mgtrain or libmgt.so (a build
 * tree), else in LIBDIR/mgtrain (installed: ../lib/mgtrain from mgtrain, mgtrain/ from libmgt). */
#define MGT_GPU_PLUGIN_FILE "libmgt_gpu.so"
#define MGT_GPU_PLUGIN_ENTRY "mgt_gpu_plugin"

/* What the core lends the backend. */
typedef struct mgt_gpu_host {
    void (*die)(const char *msg) __attribute__((noreturn)); /* mgt_die("%s", msg) */
    void (*log0)(const char *msg);                          /* mgt_log0("%s", msg) */
    void (*comm_init_common)(mgt_comm *c, MPI_Comm mpi, double timeout_s);
    void (*comm_enter)(mgt_comm *c, const char *what);
    void (*comm_leave)(mgt_comm *c);
    void (*comm_owned)(const mgt_comm *c, int r, size_t lo, size_t count, size_t *a, size_t *b);
    /* tensor_io.h's mgt_atomic_write (--algo-cache's file), whose temporaries the core sweeps */
    int (*atomic_write)(const char *path, const void *data, size_t len, mgt_err *err);
} mgt_gpu_host;

/* What the backend gives: gpu.h's functions (mgt_nccl_share_gpu among them),
 * mgt_comm_init_mpi_staged and mgt_gpu_version. */
typedef struct mgt_gpu_api {
    size_t size;         /* sizeof(mgt_gpu_api) and version: a backend of another build is */
    const char *version; /* refused rather than called through a table of another shape */
    int (*count)(char *why, size_t n);
    void (*describe)(int device, char *buf, size_t n);
    int (*backend_init)(mgt_backend *be, int device, int math, mgt_err *err);
    size_t (*peak_bytes)(const mgt_backend *be);
    int (*comm_init_nccl)(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s,
                          mgt_err *err);
    int (*comm_init_mpi_staged)(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s,
                                mgt_err *err);
    void (*version_text)(char *buf, size_t n);
    int (*nccl_share_gpu)(int rank, int nodes, char *route, size_t n);
    int (*algo_cache)(mgt_backend *be, const char *path, mgt_err *err);
    void (*share_measurements)(mgt_backend *be, MPI_Comm same_gpu, mgt_comm *c);
    double (*copy_rate)(mgt_backend *be, char *name, size_t n);
    size_t (*conv_workspace)(const mgt_conv_shape *s, int math);
    size_t (*dwconv_workspace)(const mgt_conv_shape *s);
    size_t (*workspace_bytes)(const mgt_backend *be);
} mgt_gpu_api;

typedef const mgt_gpu_api *(*mgt_gpu_plugin_fn)(const mgt_gpu_host *host);

/* The entry point (cuda/gpu_plugin.c); the backend keeps `host` for the rest of the process. */
const mgt_gpu_api *mgt_gpu_plugin(const mgt_gpu_host *host);

#endif
