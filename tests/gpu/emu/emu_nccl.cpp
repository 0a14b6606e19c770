/* emu_nccl.cpp: the NCCL functions the backend calls, over MPI, with NCCL's documented
 * behaviour for what the backend relies on:
 *   - a non-blocking communicator (config.blocking = 0): init, collectives and finalize may
 *     return ncclInProgress, and ncclCommGetAsyncError reports progress;
 *   - a collective is queued on its stream and completes only when every rank has joined: its
 *     stream (and an event recorded after it) stalls until then, so a peer that never joins
 *     leaves the caller polling, as on a GPU;
 *   - two ranks of one communicator on the same GPU of the same host are refused at init
 *     ("Duplicate GPU detected"); NCCL_HOSTID, when set, names the host.
 *     NCCL_HOSTID is not in NCCL's documentation: in 2.28 it replaces the host hash, so the ranks
 *     count as separate nodes (and, on a real GPU, talk over sockets); NCCL's user guide calls
 *     one device used by several ranks of a communicator unsupported, and 2.30 adds the
 *     documented, experimental NCCL_MULTI_RANK_GPU_ENABLE=1. The emulator follows 2.28 (the
 *     version ncclGetVersion answers, the headers'); with MGT_EMU_NCCL_VERSION=23000 (or later)
 *     it answers that and follows 2.30, accepting NCCL_MULTI_RANK_GPU_ENABLE=1.
 * The communicator must span MPI_COMM_WORLD (the only way the trainer uses it). Buffers are staged
 * through host memory, because MPI progresses requests inside any MPI call, when device memory is
 * closed to the host. */
#define OMPI_SKIP_MPICXX 1 /* the C API only */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <vector>

#include "emu.h"

namespace {

struct Pending { /* one queued collective */
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<char> stage;
    bool started = false, done = false;
};

struct PeerId {
    char host[128];
    int device;
};

} // namespace

struct ncclComm {
    MPI_Comm comm = MPI_COMM_NULL;
    int nranks = 0, rank = 0;
    int stage = 0; /* 0: duplicating MPI_COMM_WORLD, 1: exchanging ids, 2: ready */
    MPI_Request req = MPI_REQUEST_NULL;
    PeerId me;
    std::vector<PeerId> all;
    ncclResult_t state = ncclSuccess;
    bool blocking = true, aborted = false, finalizing = false, first_collective = true;
    std::vector<std::shared_ptr<Pending>> pending;
    char last[256] = "";
};

namespace {

/* The NCCL version emulated (see the top). */
int emu_version() {
    const char *v = getenv("MGT_EMU_NCCL_VERSION");
    return v && *v ? atoi(v) : NCCL_VERSION_CODE;
}

/* Whether several ranks of a communicator may use one GPU: 2.30's documented route. */
bool multi_rank_gpu() {
    const char *e = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    return emu_version() >= 23000 && e && !strcmp(e, "1");
}

int mpi_done(MPI_Request *r) {
    int flag = 0;
    MPI_Test(r, &flag, MPI_STATUS_IGNORE);
    return flag;
}

/* Advances init; returns the communicator's state. */
ncclResult_t advance(ncclComm *c) {
    if (c->aborted)
        return ncclInvalidUsage;
    if (c->stage == 0 && mpi_done(&c->req)) {
        c->all.resize((size_t)c->nranks);
        MPI_Iallgather(&c->me, (int)sizeof c->me, MPI_BYTE, c->all.data(), (int)sizeof c->me,
                       MPI_BYTE, c->comm, &c->req);
        c->stage = 1;
    }
    if (c->stage == 1 && mpi_done(&c->req)) {
        c->stage = 2;
        c->state = ncclSuccess;
        for (int i = 0; i < c->nranks && !multi_rank_gpu(); i++)
            if (i != c->rank && c->all[(size_t)i].device == c->me.device &&
                !strcmp(c->all[(size_t)i].host, c->me.host)) {
                snprintf(c->last, sizeof c->last,
                         "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d",
                         c->rank, i, c->me.device);
                c->state = ncclInvalidUsage;
                break;
            }
    }
    if (c->stage < 2)
        return ncclInProgress;
    if (c->finalizing) {
        for (auto &p : c->pending)
            if (!p->done)
                return ncclInProgress;
    }
    return c->state;
}

MPI_Datatype mpi_type(ncclDataType_t t, size_t *size) {
    switch (t) {
    case ncclFloat32:
        *size = 4;
        return MPI_FLOAT;
    case ncclFloat64:
        *size = 8;
        return MPI_DOUBLE;
    case ncclInt32:
        *size = 4;
        return MPI_INT;
    case ncclInt64:
        *size = 8;
        return MPI_INT64_T;
    default:
        *size = 0;
        return MPI_DATATYPE_NULL;
    }
}

} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version)
        return ncclInvalidArgument;
    *version = emu_version();
    return ncclSuccess;
}

const char *ncclGetLastError(ncclComm_t comm) {
    return comm ? comm->last : "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    memcpy(id->internal, "emu", 3);
    if (getrandom(id->internal + 8, 16, 0) != 16)
        return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    *out = NULL;
    int init = 0, world = 0, me = 0;
    MPI_Initialized(&init);
    if (!init || memcmp(id.internal, "emu", 3))
        return ncclInvalidArgument;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (nranks != world || rank != me || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    if (config && (config->size != sizeof(ncclConfig_t) || config->magic != 0xcafebeef))
        return ncclInvalidArgument;
    ncclComm *c = new ncclComm;
    c->nranks = nranks;
    c->rank = rank;
    c->blocking = !config || config->blocking != 0; /* NCCL's default is blocking */
    const char *hid = getenv("NCCL_HOSTID");
    if (hid && *hid)
        snprintf(c->me.host, sizeof c->me.host, "%s", hid);
    else if (gethostname(c->me.host, sizeof c->me.host))
        snprintf(c->me.host, sizeof c->me.host, "?");
    c->me.device = emu::physical_device();
    c->state = ncclInProgress;
    MPI_Comm_idup(MPI_COMM_WORLD, &c->comm, &c->req);
    *out = c;
    if (!c->blocking)
        return advance(c);
    ncclResult_t r;
    while ((r = advance(c)) == ncclInProgress)
        usleep(20);
    return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
    if (!comm)
        return ncclInvalidArgument;
    emu::progress(); /* queued collectives advance as the GPU would run them */
    *state = advance(comm);
    return ncclSuccess;
}

} // extern "C"

namespace {

/* A collective on `comm` queued on `stream`, as NCCL queues its kernels: when the stream reaches
 * it, `begin` starts the MPI request on a host copy of `send` (n bytes), and the stream stalls
 * until the request completes; then `end` writes the result to `recv`. */
ncclResult_t queue_collective(ncclComm *c, cudaStream_t stream, const void *send, void *recv,
                              size_t n, const char *name,
                              std::function<void(Pending *, MPI_Comm)> begin,
                              std::function<void(Pending *, void *)> end) {
    if (!c || c->aborted)
        return ncclInvalidArgument;
    if (advance(c) != ncclSuccess) {
        snprintf(c->last, sizeof c->last, "%s on a communicator not ready", name);
        return ncclInvalidUsage;
    }
    if (n == 0)
        return ncclSuccess;
    if (!emu::is_device(send, n) || !emu::is_device(recv, n))
        emu::fail("%s of %zu bytes: the buffers %p, %p are not that much device memory (NCCL "
                  "counts are elements, not bytes)",
                  name, n, send, recv);
    auto p = std::make_shared<Pending>();
    c->pending.push_back(p);
    emu::enqueue(
        stream,
        [p, c, send, n, begin] {
            if (c->aborted)
                return;
            p->stage.assign((const char *)send, (const char *)send + n);
            begin(p.get(), c->comm);
            p->started = true;
        },
        name);
    emu::enqueue_gate(
        stream,
        [p, c, recv, end] {
            if (c->aborted) /* ncclCommAbort releases the stream */
                return p->done = true;
            if (!mpi_done(&p->req))
                return false;
            end(p.get(), recv);
            std::vector<char>().swap(p->stage);
            return p->done = true;
        },
        name);
    /* A non-blocking communicator may report the first enqueue as in progress. */
    if (!c->blocking && c->first_collective) {
        c->first_collective = false;
        return ncclInProgress;
    }
    return ncclSuccess;
}

} // namespace

extern "C" {

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    size_t size = 0;
    MPI_Datatype dt = mpi_type(type, &size);
    if (dt == MPI_DATATYPE_NULL || (op != ncclSum && op != ncclAvg))
        return ncclInvalidArgument;
    const int n = comm ? comm->nranks : 1;
    return queue_collective(
        comm, stream, send, recv, count * size, "ncclAllReduce",
        [count, dt](Pending *p, MPI_Comm mc) {
            MPI_Iallreduce(MPI_IN_PLACE, p->stage.data(), (int)count, dt, MPI_SUM, mc, &p->req);
        },
        [type, op, n](Pending *p, void *recv) {
            if (op == ncclAvg && type == ncclFloat32)
                for (float *f = (float *)p->stage.data(), *e = f + p->stage.size() / 4; f < e; f++)
                    *f /= (float)n;
            memcpy(recv, p->stage.data(), p->stage.size());
        });
}

/* The root receives the sum in recv; elsewhere recv is left alone (NCCL: significant at the root
 * only). */
ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    size_t size = 0;
    MPI_Datatype dt = mpi_type(type, &size);
    if (dt == MPI_DATATYPE_NULL || op != ncclSum || !comm || root < 0 || root >= comm->nranks)
        return ncclInvalidArgument;
    const bool me = comm->rank == root;
    return queue_collective(
        comm, stream, send, me ? recv : const_cast<void *>(send), count * size, "ncclReduce",
        [count, dt, root, me](Pending *p, MPI_Comm mc) {
            MPI_Ireduce(me ? MPI_IN_PLACE : p->stage.data(), p->stage.data(), (int)count, dt,
                        MPI_SUM, root, mc, &p->req);
        },
        [me](Pending *p, void *recv) {
            if (me)
                memcpy(recv, p->stage.data(), p->stage.size());
        });
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
    size_t size = 0;
    MPI_Datatype dt = mpi_type(type, &size);
    if (dt == MPI_DATATYPE_NULL || !comm || root < 0 || root >= comm->nranks)
        return ncclInvalidArgument;
    /* send is read at the root only (NCCL); elsewhere the stage is just the receive buffer. */
    const void *from = comm->rank == root ? send : recv;
    return queue_collective(
        comm, stream, from, recv, count * size, "ncclBroadcast",
        [count, dt, root](Pending *p, MPI_Comm mc) {
            MPI_Ibcast(p->stage.data(), (int)count, dt, root, mc, &p->req);
        },
        [](Pending *p, void *recv) { memcpy(recv, p->stage.data(), p->stage.size()); });
}

/* Grouping only fuses launches in NCCL: every rank issues the same calls in the same order, and
 * here each is its own request. */
ncclResult_t ncclGroupStart(void) {
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm || comm->aborted)
        return ncclInvalidArgument;
    comm->finalizing = true;
    if (!comm->blocking)
        return advance(comm);
    ncclResult_t r;
    while ((r = advance(comm)) == ncclInProgress)
        if (!emu::progress())
            usleep(20);
    return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm)
        return ncclInvalidArgument;
    if (comm->comm != MPI_COMM_NULL && comm->stage == 2)
        MPI_Comm_free(&comm->comm);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm)
        return ncclSuccess;
    /* What the stream waited on is released. Requests in flight cannot be cancelled in MPI: a
     * communicator with any is left to the process's end. One with none (a start-up that
     * failed, or one whose work is done) is freed, as NCCL frees it; its duplicate of the MPI
     * communicator is left, since freeing that is collective and the other ranks may be gone. */
    comm->aborted = true;
    emu::progress();
    bool busy = comm->req != MPI_REQUEST_NULL;
    for (auto &p : comm->pending)
        busy = busy || !p->done;
    if (!busy)
        delete comm;
    return ncclSuccess;
}

} // extern "C"
