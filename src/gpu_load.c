/* gpu_load.c: the GPU backend opened on first use, and gpu.h's functions over it (gpu_plugin.h
 * says why it is a library of its own). Built into mgtrain and libmgt when cuda/ is built; the
 * programs that link the backend itself have its own functions instead of these.
 *
 * Nothing is loaded until a function here is called: --device cpu never calls one, so a CPU run
 * maps no GPU library at all. A backend that cannot be loaded (its file or a CUDA library
 * missing, too little address space to map them) makes mgt_gpu_count return -1 with the
 * loader's reason, which names the file, and every caller already turns -1 into "no usable GPU"
 * (--device auto: the CPU; --device gpu: one line naming it).
 *
 * Where: beside the file this code is part of (mgtrain or libmgt.so) when the backend is there
 * (a build tree, or a copy of one without RUNPATH, as the GPU check carries), else wherever the
 * dynamic loader finds it: the RUNPATH of mgtrain and libmgt leads to LIBDIR/mgtrain installed,
 * and LD_LIBRARY_PATH counts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"
#include "gpu_plugin.h"
#include "runtime.h"
#include "tensor_io.h"

/* Process-wide, written once under pthread_once: a library is loaded into the process, not into
 * a context, and it stays (its threads and the CUDA runtime live until the process ends). */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const mgt_gpu_api *gpu_api;
static char load_failure[600]; /* "the GPU backend cannot be loaded: <the loader's reason>" */
static const char failure_prefix[] = "the GPU backend cannot be loaded: ";

static void __attribute__((noreturn)) host_die(const char *msg) {
    mgt_die("%s", msg);
}

static void host_log0(const char *msg) {
    mgt_log0("%s", msg);
}

static const mgt_gpu_host host = {.die = host_die,
                                  .log0 = host_log0,
                                  .comm_init_common = mgt_comm_init_common,
                                  .comm_enter = mgt_comm_enter,
                                  .comm_leave = mgt_comm_leave,
                                  .comm_owned = mgt_comm_owned,
                                  .atomic_write = mgt_atomic_write};

static void load(void);

/* The backend's file beside the object this function is in, into path: 1 if it is there. */
static int beside_me(char *path, size_t n) {
    Dl_info info;
    struct link_map *map = NULL;
    char exe[PATH_MAX];
    if (!dladdr1((void *)load, &info, (void **)&map, RTLD_DL_LINKMAP) || !map)
        return 0;
    const char *self = map->l_name; /* "" for the program itself */
    if (!self[0]) {
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (len <= 0)
            return 0;
        exe[len] = 0;
        self = exe;
    }
    const char *slash = strrchr(self, '/');
    int dir = slash ? (int)(slash - self) : 1;
    int w = snprintf(path, n, "%.*s/%s", dir, slash ? self : ".", MGT_GPU_PLUGIN_FILE);
    return w > 0 && (size_t)w < n && access(path, F_OK) == 0;
}

static void load(void) {
    char path[PATH_MAX + 32];
    void *lib =
        dlopen(beside_me(path, sizeof path) ? path : MGT_GPU_PLUGIN_FILE, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(load_failure, sizeof load_failure, "%s%s", failure_prefix,
                 why ? why : "unknown reason");
        return;
    }
    mgt_gpu_plugin_fn entry = (mgt_gpu_plugin_fn)dlsym(lib, MGT_GPU_PLUGIN_ENTRY);
    const mgt_gpu_api *api = entry ? entry(&host) : NULL;
    if (!api || api->size != sizeof *api || strcmp(api->version, MGT_VERSION)) {
        snprintf(load_failure, sizeof load_failure,
                 "%s%s is not this mgtrain's (version %s, this is %s); install mgtrain and its "
                 "%s together",
                 failure_prefix, MGT_GPU_PLUGIN_FILE,
                 api && api->size == sizeof *api ? api->version : "unknown", MGT_VERSION,
                 MGT_GPU_PLUGIN_FILE);
        return;
    }
    gpu_api = api;
}

/* The backend, or NULL with the reason in load_failure. */
static const mgt_gpu_api *backend(void) {
    pthread_once(&load_once, load);
    return gpu_api;
}

int mgt_gpu_count(char *why, size_t n) {
    const mgt_gpu_api *a = backend();
    if (a)
        return a->count(why, n);
    if (why && n)
        snprintf(why, n, "%s", load_failure);
    return -1;
}

void mgt_gpu_describe(int device, char *buf, size_t n) {
    const mgt_gpu_api *a = backend();
    if (a)
        a->describe(device, buf, n);
    else if (n)
        snprintf(buf, n, "device %d (no GPU backend)", device);
}

int mgt_gpu_backend_init(mgt_backend *be, int device, int math, mgt_err *err) {
    const mgt_gpu_api *a = backend();
    return a ? a->backend_init(be, device, math, err) : mgt_errf(err, "%s", load_failure);
}

size_t mgt_gpu_peak_bytes(const mgt_backend *be) {
    const mgt_gpu_api *a = backend();
    return a ? a->peak_bytes(be) : 0;
}

int mgt_comm_init_nccl(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s, mgt_err *err) {
    const mgt_gpu_api *a = backend();
    return a ? a->comm_init_nccl(c, mpi, be, timeout_s, err) : mgt_errf(err, "%s", load_failure);
}

int mgt_comm_init_mpi_staged(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s,
                             mgt_err *err) {
    const mgt_gpu_api *a = backend();
    return a ? a->comm_init_mpi_staged(c, mpi, be, timeout_s, err)
             : mgt_errf(err, "%s", load_failure);
}

int mgt_gpu_loadable(void) {
    return backend() != NULL;
}

int mgt_gpu_may_exist(void) {
    /* The driver's device files count too (NVIDIA's, and WSL's GPU device), in case its library
     * is somewhere only the CUDA runtime knows. The handle stays open: where the driver is
     * there, the CUDA runtime maps it anyway. */
    return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/dxg", F_OK) == 0 ||
           dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != NULL;
}

int mgt_gpu_algo_cache(mgt_backend *be, const char *path, mgt_err *err) {
    const mgt_gpu_api *a = backend();
    return a ? a->algo_cache(be, path, err) : mgt_errf(err, "%s", load_failure);
}

size_t mgt_gpu_conv_workspace(const mgt_conv_shape *s, int math) {
    const mgt_gpu_api *a = backend();
    return a ? a->conv_workspace(s, math) : 0;
}

size_t mgt_gpu_dwconv_workspace(const mgt_conv_shape *s) {
    const mgt_gpu_api *a = backend();
    return a ? a->dwconv_workspace(s) : 0;
}

size_t mgt_gpu_workspace_bytes(const mgt_backend *be) {
    const mgt_gpu_api *a = backend();
    return a ? a->workspace_bytes(be) : 0;
}

int mgt_nccl_share_gpu(int rank, int nodes, char *route, size_t n) {
    const mgt_gpu_api *a = backend();
    if (a)
        return a->nccl_share_gpu(rank, nodes, route, n);
    if (n)
        snprintf(route, n, "%s", load_failure);
    return 0;
}

void mgt_gpu_version(char *buf, size_t n) {
    const mgt_gpu_api *a = backend();
    if (a)
        a->version_text(buf, n);
    else if (n)
        snprintf(buf, n, "cannot be loaded here (%s); CPU runs do not need it",
                 load_failure + strlen(failure_prefix));
}
