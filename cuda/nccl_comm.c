/* nccl_comm.c: the NCCL transport (comm.h) for the gradient all-reduce on device memory.
 *
 * Bootstrap: rank 0 makes the unique id and broadcasts it over the job's MPI communicator
 * (together with whether it succeeded, so that a failure there fails every rank the same way);
 * the device was bound by the GPU backend's init (cudaSetDevice) before this is called.
 *
 * The communicator is NON-BLOCKING (config.blocking = 0): no NCCL call waits for a peer. Every
 * call may return ncclInProgress, and the communicator's state is polled (ncclCommGetAsyncError).
 *
 * The all-reduce runs in place on the transport's own stream, ordered by events: it waits for
 * the gradients (an event on the compute stream after the backward pass), and the compute stream
 * waits for it (an event after it) before the optimizer step. The host does NOT wait for it: the
 * step returns at once, and the next host wait of the GPU backend (a metric read, a staged
 * batch's slot, a sync) is where a collective that never completes would be noticed. Every such
 * wait polls an event and calls this transport's watch() between polls, which checks the
 * communicator for asynchronous errors and, while an all-reduce is outstanding, the timeout: past
 * c->timeout seconds (--comm-timeout) of waiting, the communicator is aborted (ncclCommAbort,
 * which also releases the kernels stuck on the GPU) and the job ends naming what happened.
 * Requests (comm.h: the step's buckets, reducer.h) work the same way, each with its own pair of
 * events: start records the slot's "ready" event on the compute stream where backward has just
 * written the bucket, makes the transport stream wait for it and queues the collective there
 * (ncclAllReduce; for ZeRO-1's REDUCE_OWNERS one in-place ncclReduce per owner, for
 * GATHER_OWNERS one in-place ncclBroadcast per owner, each group in ncclGroupStart/End), then
 * records the slot's "done" event; wait makes the compute stream wait for "done". Neither
 * blocks the host. The transport stream runs its collectives in order, so the watch polls the
 * last "done" recorded: while it is pending, every request before it is too, and the timeout
 * covers them all.
 * Counts are ELEMENTS (floats), as everywhere in comm.h.
 *
 * Start-up failures are agreed on: after its init every rank shares its outcome (MPI), so that a
 * communicator that fails on some rank is reported once, by rank 0, naming the rank and NCCL's
 * own words, and every rank ends alike (mgt_comm_init_nccl returns MGT_NCCL_FAILED_ALL), rather
 * than each printing its own line and aborting the others. A rank whose init waits on a peer
 * that never comes gives up after the --comm-timeout, so the agreement never hangs.
 *
 * Several ranks on one GPU (mgt_nccl_share_gpu, for tests: --share-gpu) are below. */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "gpu.h"
#include "gpu_internal.h"
#include "runtime.h"
#include "util.h"

typedef struct nccl_state {
    ncclComm_t comm;
    mgt_gpu_impl *gpu;   /* the backend: its compute stream, and its host waits' watch hook */
    cudaStream_t stream; /* the transport's own */
    cudaEvent_t ready;   /* compute stream: the gradients are complete */
    cudaEvent_t done;    /* transport stream: the all-reduce is complete */
    cudaEvent_t last;    /* the last "done" recorded on the transport stream (the watch's) */
    int outstanding;     /* a collective was queued and not yet seen complete */
    size_t count;        /* its size, for messages */
    const char *what;    /* and its name */
    int device;
    /* Request slots: per slot, the compute stream's "ready" and the transport's "done". */
    cudaEvent_t *slot_ready, *slot_done;
    int nslots;
} nccl_state;

/* A short pause between polls: about 20 us, so that the host neither spins a core at 100% for a
 * whole backward pass nor adds noticeable latency to a step. */
static void poll_pause(void) {
    struct timespec ts = {0, 20 * 1000};
    nanosleep(&ts, NULL);
}

/* Waits while the communicator reports ncclInProgress (after a non-blocking call). Returns the
 * final state; past `timeout` seconds (> 0) returns ncclInProgress. */
static ncclResult_t wait_comm(ncclComm_t comm, double timeout) {
    const double t0 = mgt_now();
    ncclResult_t st = ncclInProgress;
    for (;;) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess)
            return ncclInternalError;
        if (st != ncclInProgress)
            return st;
        if (timeout > 0 && mgt_now() - t0 > timeout)
            return ncclInProgress;
        poll_pause();
    }
}

static void nccl_abort_die(nccl_state *s, const char *what, double timeout, size_t count) {
    ncclCommAbort(s->comm);
    s->comm = NULL;
    mgt_die("NCCL %s of %zu floats did not complete within %.0f s: another rank died, stopped or "
            "lost its network; the communicator was aborted and the job ends (see the other "
            "ranks' messages; raise --comm-timeout if steps are legitimately this slow)",
            what, count, timeout);
}

/* Ends the job when the communicator reports an asynchronous error (a peer's network, say). */
static void check_async(nccl_state *s, size_t count) {
    ncclResult_t st = ncclSuccess;
    GPU_CHECK(NCCL, ncclCommGetAsyncError(s->comm, &st));
    if (st == ncclSuccess || st == ncclInProgress)
        return;
    char last[256]; /* copied: the string may live in the communicator */
    const char *l = ncclGetLastError(s->comm);
    snprintf(last, sizeof last, "%s", l ? l : "");
    ncclCommAbort(s->comm);
    s->comm = NULL;
    mgt_die("NCCL %s of %zu floats failed: %s%s%s; the communicator was aborted and the "
            "job ends (another rank may have died; see its messages)",
            s->what ? s->what : "all-reduce", count, ncclGetErrorString(st), last[0] ? ": " : "",
            last);
}

/* The GPU backend's host waits call this between polls (waited: seconds into the wait). */
static void nccl_watch(void *ctx, double waited) {
    mgt_comm *c = ctx;
    nccl_state *s = c->impl;
    if (!s || !s->comm || !s->outstanding)
        return;
    cudaError_t e = cudaEventQuery(s->last);
    if (e == cudaSuccess) {
        s->outstanding = 0;
        return;
    }
    if (e != cudaErrorNotReady)
        mgt_gpu_fail(MGT_GPU_CUDA, (int)e, "cudaEventQuery after an NCCL collective", __FILE__,
                     __LINE__);
    check_async(s, s->count);
    if (c->timeout > 0 && waited > c->timeout)
        nccl_abort_die(s, s->what ? s->what : "all-reduce", c->timeout, s->count);
}

/* Completes a non-blocking NCCL call that may answer "in progress" (enqueueing on a
 * non-blocking communicator), within the timeout. */
static void nccl_done_enqueue(mgt_comm *c, nccl_state *s, ncclResult_t r, const char *call,
                              const char *what, size_t count) {
    if (r == ncclInProgress)
        r = wait_comm(s->comm, c->timeout);
    if (r == ncclInProgress) {
        char w[96];
        snprintf(w, sizeof w, "%s (enqueue)", what);
        nccl_abort_die(s, w, c->timeout, count);
    }
    if (r != ncclSuccess)
        mgt_gpu_fail(MGT_GPU_NCCL, (int)r, call, __FILE__, __LINE__);
}

static void nccl_allreduce_f32(mgt_comm *c, float *buf, size_t count) {
    nccl_state *s = c->impl;
    if (count > SIZE_MAX / sizeof(float))
        mgt_die("NCCL all-reduce of %zu floats: the byte count does not fit size_t", count);
    if (count == 0)
        return;
    GPU_CHECK(CUDA, cudaEventRecord(s->ready, s->gpu->stream));
    GPU_CHECK(CUDA, cudaStreamWaitEvent(s->stream, s->ready, 0));
    nccl_done_enqueue(c, s,
                      ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, s->comm, s->stream),
                      "ncclAllReduce", "all-reduce", count);
    GPU_CHECK(CUDA, cudaEventRecord(s->done, s->stream));
    GPU_CHECK(CUDA, cudaStreamWaitEvent(s->gpu->stream, s->done, 0));
    mgt_gpu_weights_written(s->gpu, buf, count * sizeof(float));
    s->last = s->done;
    s->outstanding = 1;
    s->count = count;
    s->what = "all-reduce";
    check_async(s, count); /* cheap: an error already known ends the job now */
}

static int nccl_reserve(mgt_comm *c, int n, mgt_err *err) {
    nccl_state *s = c->impl;
    if (n <= s->nslots)
        return 0;
    cudaEvent_t *r = realloc(s->slot_ready, sizeof *r * (size_t)n);
    if (r)
        s->slot_ready = r;
    cudaEvent_t *d = r ? realloc(s->slot_done, sizeof *d * (size_t)n) : NULL;
    if (!r || !d)
        return mgt_errf(err, "out of host memory for %d NCCL requests", n);
    s->slot_done = d;
    for (; s->nslots < n; s->nslots++) {
        cudaError_t e = cudaEventCreateWithFlags(&s->slot_ready[s->nslots], cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&s->slot_done[s->nslots], cudaEventDisableTiming);
        if (e != cudaSuccess)
            return mgt_errf(err, "GPU %d: creating the events of NCCL's requests failed: %s",
                            s->device, cudaGetErrorString(e));
    }
    return 0;
}

static void nccl_start(mgt_comm *c, int slot, mgt_coll kind, float *buf, size_t lo, size_t count) {
    nccl_state *s = c->impl;
    static const char *const names[] = {"all-reduce", "reduce-scatter", "all-gather"};
    const char *what = names[kind];
    if (count > SIZE_MAX / sizeof(float))
        mgt_die("NCCL %s of %zu floats: the byte count does not fit size_t", what, count);
    GPU_CHECK(CUDA, cudaEventRecord(s->slot_ready[slot], s->gpu->stream));
    GPU_CHECK(CUDA, cudaStreamWaitEvent(s->stream, s->slot_ready[slot], 0));
    if (kind == MGT_COLL_ALLREDUCE) {
        nccl_done_enqueue(
            c, s,
            ncclAllReduce(buf + lo, buf + lo, count, ncclFloat32, ncclSum, s->comm, s->stream),
            "ncclAllReduce", what, count);
    } else {
        /* NCCL's reduce-scatter and all-gather take equal parts; the owners' slices are not,
         * so each owner's part is its own in-place reduce (or broadcast), grouped. */
        nccl_done_enqueue(c, s, ncclGroupStart(), "ncclGroupStart", what, count);
        for (int o = 0; o < c->world; o++) {
            size_t a, b;
            mgt_comm_owned(c, o, lo, count, &a, &b);
            if (a == b)
                continue;
            ncclResult_t r =
                kind == MGT_COLL_REDUCE_OWNERS
                    ? ncclReduce(buf + a, buf + a, b - a, ncclFloat32, ncclSum, o, s->comm,
                                 s->stream)
                    : ncclBroadcast(buf + a, buf + a, b - a, ncclFloat32, o, s->comm, s->stream);
            nccl_done_enqueue(c, s, r,
                              kind == MGT_COLL_REDUCE_OWNERS ? "ncclReduce" : "ncclBroadcast", what,
                              count);
        }
        nccl_done_enqueue(c, s, ncclGroupEnd(), "ncclGroupEnd", what, count);
    }
    GPU_CHECK(CUDA, cudaEventRecord(s->slot_done[slot], s->stream));
    mgt_gpu_weights_written(s->gpu, buf + lo, count * sizeof(float)); /* the weights, gathered */
    s->last = s->slot_done[slot];
    s->outstanding = 1;
    s->count = count;
    s->what = what;
    check_async(s, count);
}

static int nccl_test(mgt_comm *c, int slot) {
    (void)c;
    (void)slot;
    return 1; /* the device orders the request: nothing for the host to drive */
}

static void nccl_wait(mgt_comm *c, int slot) {
    nccl_state *s = c->impl;
    GPU_CHECK(CUDA, cudaStreamWaitEvent(s->gpu->stream, s->slot_done[slot], 0));
}

static void nccl_destroy(mgt_comm *c) {
    nccl_state *s = c->impl;
    if (!s)
        return;
    if (s->gpu && s->gpu->watch == nccl_watch) {
        s->gpu->watch = NULL;
        s->gpu->watch_ctx = NULL;
    }
    if (s->gpu && s->gpu->comm_stream == s->stream)
        s->gpu->comm_stream = NULL;
    if (s->comm) {
        /* Non-blocking: Finalize flushes outstanding work (polled, bounded by the timeout),
         * then Destroy frees; on a timeout or an error Abort instead. */
        ncclResult_t r = ncclCommFinalize(s->comm);
        if (r == ncclSuccess || r == ncclInProgress)
            r = wait_comm(s->comm, c->timeout > 0 ? c->timeout : 60);
        if (r == ncclSuccess)
            (void)ncclCommDestroy(s->comm);
        else
            (void)ncclCommAbort(s->comm);
    }
    if (s->stream)
        (void)cudaStreamSynchronize(s->stream);
    for (int i = 0; i < s->nslots; i++) {
        (void)cudaEventDestroy(s->slot_ready[i]);
        (void)cudaEventDestroy(s->slot_done[i]);
    }
    free(s->slot_ready);
    free(s->slot_done);
    if (s->done)
        (void)cudaEventDestroy(s->done);
    if (s->ready)
        (void)cudaEventDestroy(s->ready);
    if (s->stream)
        (void)cudaStreamDestroy(s->stream);
    free(s);
    c->impl = NULL;
}

static const mgt_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce_sum_f32 = nccl_allreduce_f32,
    .reserve = nccl_reserve,
    .start = nccl_start,
    .test = nccl_test,
    .wait = nccl_wait,
    .destroy = nccl_destroy,
};

/* ---- several ranks on one GPU: a route for tests ----
 * NCCL's user guide calls one device used by several ranks of a communicator unsupported, and
 * the communicator's init refuses it ("Duplicate GPU detected"). NCCL 2.30 adds the documented,
 * experimental NCCL_MULTI_RANK_GPU_ENABLE=1. Before it, a different NCCL_HOSTID per rank
 * (undocumented; in 2.28 it replaces the host hash) makes the ranks count as separate hosts,
 * which then talk over the network transport: sockets, over the loopback interface when the job
 * is on one node. NCCL reads both at its first init, so this runs before any communicator is
 * made; a variable already set is left as it is (and said so). */
int mgt_nccl_share_gpu(int rank, int nodes, char *route, size_t n) {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess)
        v = 0;
    char ver[32];
    if (v > 0)
        snprintf(ver, sizeof ver, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
    else
        snprintf(ver, sizeof ver, "(version unknown)");
    if (v >= 23000) {
        const int set = getenv("NCCL_MULTI_RANK_GPU_ENABLE") != NULL;
        if (!set)
            setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
        snprintf(route, n, "NCCL %s: NCCL_MULTI_RANK_GPU_ENABLE=%s%s", ver,
                 getenv("NCCL_MULTI_RANK_GPU_ENABLE"), set ? " (as set)" : "");
        return v;
    }
    char id[48];
    snprintf(id, sizeof id, "mgt-share-gpu-rank-%d", rank);
    const int set = getenv("NCCL_HOSTID") != NULL;
    if (!set)
        setenv("NCCL_HOSTID", id, 1);
    if (nodes == 1 && !getenv("NCCL_SOCKET_IFNAME"))
        setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    const char *ifname = getenv("NCCL_SOCKET_IFNAME");
    snprintf(route, n,
             "NCCL %s, before 2.30's NCCL_MULTI_RANK_GPU_ENABLE: a host id per rank "
             "(NCCL_HOSTID%s), sockets%s%s",
             ver, set ? " as set" : "", ifname ? " over " : "", ifname ? ifname : "");
    return v;
}

/* NCCL's last error text on one line (it may hold several). */
static void last_error(ncclComm_t comm, char *out, size_t n) {
    const char *l = ncclGetLastError(comm);
    snprintf(out, n, "%s", l ? l : "");
    for (char *p = out; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    size_t len = strlen(out);
    while (len > 0 && out[len - 1] == ' ')
        out[--len] = 0;
}

/* Every rank's start-up outcome (ok, or why not), shared over MPI; returns 0 when all are ok,
 * else MGT_NCCL_FAILED_ALL with one message naming the first rank that failed and how many did. */
static int agree(mgt_comm *c, MPI_Comm mpi, int ok, const char *why, mgt_err *err) {
    struct outcome {
        int ok;
        char why[500];
    } mine, *all = malloc(sizeof mine * (size_t)c->world);
    if (!all)
        mgt_die("out of host memory for the NCCL start-up of %d ranks", c->world);
    memset(&mine, 0, sizeof mine);
    mine.ok = ok;
    snprintf(mine.why, sizeof mine.why, "%s", why ? why : "");
    mgt_comm_enter(c, "NCCL start-up (every rank's outcome)");
    int mr = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, mpi);
    mgt_comm_leave(c);
    if (mr != MPI_SUCCESS) {
        free(all);
        return mgt_errf(err, "MPI_Allgather of the NCCL start-up outcomes failed (MPI error %d)",
                        mr);
    }
    int first = -1, failed = 0;
    for (int r = 0; r < c->world; r++)
        if (!all[r].ok) {
            failed++;
            if (first < 0)
                first = r;
        }
    if (failed) {
        char more[48] = "";
        if (failed > 1)
            snprintf(more, sizeof more, " (and on %d more)", failed - 1);
        mgt_errf(err, "NCCL start-up failed on rank %d of %d%s: %s", first, c->world, more,
                 all[first].why);
    }
    free(all);
    return failed ? MGT_NCCL_FAILED_ALL : 0;
}

int mgt_comm_init_nccl(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s, mgt_err *err) {
    mgt_comm_init_common(c, mpi, timeout_s);
    c->ops = &nccl_ops;
    if (!be || !be->ops || strcmp(be->ops->name, "gpu"))
        return mgt_errf(err, "the NCCL transport needs the GPU backend (got %s)",
                        be && be->ops ? be->ops->name : "none");
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    nccl_state *s = calloc(1, sizeof *s);
    if (!s)
        return mgt_errf(err, "out of host memory starting NCCL");
    s->gpu = im;
    s->device = im->device;
    c->impl = s;
    cudaError_t ce = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
    if (ce != cudaSuccess)
        return mgt_errf(err, "GPU %d: creating the NCCL stream and its events failed: %s",
                        im->device, cudaGetErrorString(ce));
    s->last = s->done;

    /* Rank 0's id, with its status, to everyone. */
    struct {
        int ok;
        ncclUniqueId id;
        char why[200];
    } boot;
    memset(&boot, 0, sizeof boot);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&boot.id);
        boot.ok = r == ncclSuccess;
        if (!boot.ok)
            snprintf(boot.why, sizeof boot.why, "%s", ncclGetErrorString(r));
    }
    mgt_comm_enter(c, "NCCL start-up (unique id broadcast)");
    int mr = MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, mpi);
    mgt_comm_leave(c);
    if (mr != MPI_SUCCESS)
        return mgt_errf(err, "MPI_Bcast of the NCCL unique id failed (MPI error %d)", mr);
    if (!boot.ok) { /* every rank has the same news */
        mgt_errf(err, "NCCL start-up failed: ncclGetUniqueId on rank 0: %s", boot.why);
        return MGT_NCCL_FAILED_ALL;
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    mgt_comm_enter(c, "NCCL start-up (ncclCommInitRankConfig)");
    ncclResult_t r = ncclCommInitRankConfig(&s->comm, c->world, boot.id, c->rank, &config);
    if (r == ncclInProgress)
        r = wait_comm(s->comm, timeout_s);
    mgt_comm_leave(c);
    char why[500] = "";
    if (r == ncclInProgress) {
        snprintf(why, sizeof why,
                 "ncclCommInitRankConfig on GPU %d did not complete within %.0f s: another rank "
                 "did not join (NCCL_DEBUG=WARN tells more)",
                 im->device, timeout_s);
    } else if (r != ncclSuccess) {
        char last[300] = "";
        if (s->comm)
            last_error(s->comm, last, sizeof last);
        snprintf(why, sizeof why,
                 "ncclCommInitRankConfig on GPU %d: %s%s%s (several ranks on one GPU need "
                 "--share-gpu, a route for tests; otherwise a network problem?)",
                 im->device, ncclGetErrorString(r), last[0] ? ": " : "", last);
    }
    if (r != ncclSuccess && s->comm) {
        ncclCommAbort(s->comm);
        s->comm = NULL;
    }
    const int rc = agree(c, mpi, r == ncclSuccess, why, err);
    if (rc < 0) {
        if (s->comm) {
            ncclCommAbort(s->comm);
            s->comm = NULL;
        }
        return rc;
    }
    im->watch = nccl_watch;
    im->watch_ctx = c;
    im->comm_stream = s->stream;
    return 0;
}
