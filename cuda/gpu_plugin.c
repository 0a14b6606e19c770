/* gpu_plugin.c: the entry point of libmgt_gpu.so, the GPU backend as a library of its own
 * (src/gpu_plugin.h), and the functions of the core it borrows.
 *
 * The backend's files call mgt_die, mgt_log0, mgt_atomic_write and comm.c's common part as anywhere else in
 * mgtrain; in the library these forward to the core that loaded it, so that a device fault ends
 * the job exactly as any other failure does (the run folder's lock removed first, runtime.h) and
 * a transport's watchdog is the core's. Only mgt_gpu_plugin is exported (gpu_plugin.map): nothing
 * here can be confused with the core's own functions. */
#include <stdarg.h>
#include <stdio.h>

#include "gpu.h"
#include "gpu_plugin.h"
#include "runtime.h"
#include "tensor_io.h"

/* Set once, by the loader, before any other function of the library runs. */
static const mgt_gpu_host *core;

void mgt_die(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    core->die(msg);
}

void mgt_log0(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    core->log0(msg);
}

int mgt_atomic_write(const char *path, const void *data, size_t len, mgt_err *err) {
    return core->atomic_write(path, data, len, err);
}

void mgt_comm_init_common(mgt_comm *c, MPI_Comm mpi, double timeout_s) {
    core->comm_init_common(c, mpi, timeout_s);
}

void mgt_comm_enter(mgt_comm *c, const char *what) {
    core->comm_enter(c, what);
}

void mgt_comm_leave(mgt_comm *c) {
    core->comm_leave(c);
}

void mgt_comm_owned(const mgt_comm *c, int r, size_t lo, size_t count, size_t *a, size_t *b) {
    core->comm_owned(c, r, lo, count, a, b);
}

static const mgt_gpu_api api = {
    .size = sizeof(mgt_gpu_api),
    .version = MGT_VERSION,
    .count = mgt_gpu_count,
    .describe = mgt_gpu_describe,
    .backend_init = mgt_gpu_backend_init,
    .peak_bytes = mgt_gpu_peak_bytes,
    .comm_init_nccl = mgt_comm_init_nccl,
    .comm_init_mpi_staged = mgt_comm_init_mpi_staged,
    .version_text = mgt_gpu_version,
    .nccl_share_gpu = mgt_nccl_share_gpu,
    .algo_cache = mgt_gpu_algo_cache,
    .share_measurements = mgt_gpu_share_measurements,
    .copy_rate = mgt_gpu_copy_rate,
    .conv_workspace = mgt_gpu_conv_workspace,
    .dwconv_workspace = mgt_gpu_dwconv_workspace,
    .workspace_bytes = mgt_gpu_workspace_bytes,
};

const mgt_gpu_api *mgt_gpu_plugin(const mgt_gpu_host *host) {
    core = host;
    return &api;
}
