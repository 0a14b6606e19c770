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
 * Where: by its absolute path, in the folder of the file this code is part of (mgtrain or
 * libmgt.so, as the kernel mapped it), never by a bare name that the dynamic loader would look
 * up: the loader's search takes LD_LIBRARY_PATH, and any empty or relative entry there (or in a
 * RUNPATH) means the current folder, from which a stray libmgt_gpu.so would then run inside
 * mgtrain. The places, in order: beside the file (a build tree, or a copy of one, as the GPU
 * check carries), then where the install puts it (LIBDIR/mgtrain: MGT_GPU_PLUGIN_FROM_BIN from
 * BINDIR for mgtrain, mgtrain/ for libmgt.so in LIBDIR). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
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
static char load_failure[2048]; /* "the GPU backend cannot be loaded: <the loader's reason>" */
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

#ifndef MGT_GPU_PLUGIN_FROM_BIN
#define MGT_GPU_PLUGIN_FROM_BIN "../lib/mgtrain"
#endif

/* The folder of the file this function is part of, absolute, into dir: from /proc/self/maps,
 * the kernel's own name of the mapping that holds this code (the dynamic loader's l_name may be
 * relative, as LD_LIBRARY_PATH=. gives it). 0 if it cannot be told. */
static int my_folder(char *dir, size_t n) {
    FILE *maps = fopen("/proc/self/maps", "re");
    if (!maps)
        return 0;
    const uintptr_t me = (uintptr_t)(void *)load;
    char line[PATH_MAX + 256];
    int found = 0;
    while (!found && fgets(line, sizeof line, maps)) {
        unsigned long lo, hi;
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &path_at) < 2 || !path_at ||
            me < lo || me >= hi)
            continue;
        char *path = line + path_at;
        path[strcspn(path, "\n")] = 0;
        char *slash = strrchr(path, '/');
        /* Only an absolute name of a file still there ("(deleted)" after a reinstall). */
        if (path[0] != '/' || !slash || strstr(path, " (deleted)"))
            break;
        int dlen = (int)(slash - path);
        int w = snprintf(dir, n, "%.*s", dlen > 0 ? dlen : 1, path);
        found = w > 0 && (size_t)w < n;
    }
    fclose(maps);
    return found;
}

/* dir joined with rel (relative), each leading "../" of rel taking one folder off dir. */
static void join(char *out, size_t n, const char *dir, const char *rel) {
    int len = (int)strlen(dir);
    while (strncmp(rel, "../", 3) == 0 && len > 1) {
        while (len > 1 && dir[len - 1] != '/')
            len--;
        if (len > 1)
            len--; /* the slash, unless it is the root */
        rel += 3;
    }
    snprintf(out, n, "%.*s%s%s", len, dir, rel[0] && dir[len - 1] != '/' ? "/" : "", rel);
}

/* The first place (the header above) that holds the backend's file, into path: 1 if one does;
 * 0 with the reason, which names the folders looked in, in why otherwise. */
static int find_plugin(char *path, size_t n, char *why, size_t wn) {
    char dir[PATH_MAX], place[PATH_MAX];
    if (!my_folder(dir, sizeof dir)) {
        snprintf(why, wn,
                 "%s: cannot be found: /proc/self/maps does not name the file this program runs "
                 "from",
                 MGT_GPU_PLUGIN_FILE);
        return 0;
    }
    const char *subs[] = {"", "mgtrain", MGT_GPU_PLUGIN_FROM_BIN};
    const size_t count = sizeof subs / sizeof *subs;
    int w = snprintf(why, wn, "%s: cannot open shared object file: none in ", MGT_GPU_PLUGIN_FILE);
    for (size_t i = 0; i < count; i++) {
        join(place, sizeof place, dir, subs[i]);
        int pw = snprintf(path, n, "%s/%s", place, MGT_GPU_PLUGIN_FILE);
        if (pw > 0 && (size_t)pw < n && access(path, F_OK) == 0)
            return 1;
        if (w > 0 && (size_t)w < wn)
            w += snprintf(why + w, wn - (size_t)w, "%s%s",
                          i == 0          ? ""
                          : i + 1 < count ? ", "
                                          : " or ",
                          place);
    }
    return 0;
}

static void load(void) {
    char path[PATH_MAX + 64], why[1900];
    if (!find_plugin(path, sizeof path, why, sizeof why)) {
        snprintf(load_failure, sizeof load_failure, "%s%s", failure_prefix, why);
        return;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(load_failure, sizeof load_failure, "%s%s", failure_prefix,
                 why ? why : "unknown reason");
        return;
    }
    mgt_gpu_plugin_fn entry = (mgt_gpu_plugin_fn)dlsym(lib, MGT_GPU_PLUGIN_ENTRY);
    const mgt_gpu_api *api = entry ? entry(&host) : NULL;
    if (!api || api->size != sizeof *api || strcmp(api->version, MGT_VERSION)) {
        snprintf(
            load_failure, sizeof load_failure,
            "%s%.1800s is not this mgtrain's (version %s, this is %s); install mgtrain and its "
            "%s together",
            failure_prefix, path, api && api->size == sizeof *api ? api->version : "unknown",
            MGT_VERSION, MGT_GPU_PLUGIN_FILE);
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

void mgt_gpu_share_measurements(mgt_backend *be, MPI_Comm same_gpu, mgt_comm *c) {
    const mgt_gpu_api *a = backend();
    if (a)
        a->share_measurements(be, same_gpu, c);
}

double mgt_gpu_copy_rate(mgt_backend *be, char *name, size_t n) {
    const mgt_gpu_api *a = backend();
    return a ? a->copy_rate(be, name, n) : 0;
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
