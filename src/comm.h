/* comm.h: the collectives the trainer needs, on flat typed buffers.
 *
 * One small interface with one implementation per transport: MPI (comm.c), shared memory between
 * the CPU ranks of one node (comm_shm.c), NCCL in cuda/. The collectives on float buffers work on
 * BACKEND memory (host for the CPU backend, device for the GPU one) through the transport;
 * broadcasts, gathers and double sums work on HOST memory over MPI whatever the transport
 * (start-up, metrics, predictions: never in the step loop). The trainer calls only these
 * wrappers, so a new transport slots in without changes above it. Counts are in ELEMENTS.
 *
 * The step's gradient traffic is asynchronous (reducer.h runs it): a request is STARTED on a
 * range of the arena as soon as backward has written it, progresses while backward goes on, and
 * is WAITED for before the update reads it. Over MPI the requests are non-blocking messages,
 * advanced either by the test calls the reducer makes between layers or by a progress thread
 * (--comm-progress); over shared memory there are no messages: whichever rank tests or waits
 * makes the sums straight from the ranks' buffers; on a GPU (NCCL) they run on the transport's
 * stream, ordered by an event per request, and "wait" only makes the compute stream wait: the
 * host never blocks.
 * Three kinds, all on ranges [lo, lo + count) of one buffer:
 *   ALLREDUCE      every rank ends with the sum over the ranks;
 *   REDUCE_OWNERS  each part of the range that rank r owns (c->owners: ZeRO-1's slices) ends on
 *                  rank r holding the sum; elsewhere the buffer is left as it was;
 *   GATHER_OWNERS  every rank ends with each owner's part as its owner holds it.
 * The sums are exact copies of one reduction of the same addends, whichever kind or grouping into
 * requests carries them: the grouping changes only which elements travel together.
 *
 * Every wait is watched: if a collective does not finish within the timeout (a peer died or
 * stopped), the watchdog prints which collective and ends the job instead of waiting forever. */
#ifndef MGT_COMM_H
#define MGT_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "util.h"

typedef struct mgt_comm mgt_comm;

/* The asynchronous collectives (see the top). */
typedef enum { MGT_COLL_ALLREDUCE = 0, MGT_COLL_REDUCE_OWNERS, MGT_COLL_GATHER_OWNERS } mgt_coll;

typedef struct mgt_comm_ops {
    const char *name;
    /* In-place sum over all ranks of a float buffer in backend memory. */
    void (*allreduce_sum_f32)(mgt_comm *c, float *buf, size_t count);
    /* Requests (see the top): slots 0 .. n-1 of this transport, reserved once before the loop.
     * start queues collective `kind` on buf[lo, lo + count) after every backend op issued so
     * far; test advances the requests and returns 1 when `slot` is complete (a GPU transport,
     * whose device orders the work, returns 1 at once); wait makes `slot` complete before any
     * backend op issued afterwards. A slot is started again only after its wait. */
    int (*reserve)(mgt_comm *c, int n, mgt_err *err);
    void (*start)(mgt_comm *c, int slot, mgt_coll kind, float *buf, size_t lo, size_t count);
    int (*test)(mgt_comm *c, int slot);
    void (*wait)(mgt_comm *c, int slot);
    void (*destroy)(mgt_comm *c);
    /* Host memory the requests can work on in place (shm: a window every rank of the node
     * maps); collective. NULL op: the transport works on any buffer. */
    void *(*share)(mgt_comm *c, size_t bytes, mgt_err *err);
} mgt_comm_ops;

struct mgt_comm {
    const mgt_comm_ops *ops;
    int rank, world;
    MPI_Comm mpi;      /* host collectives, and the bootstrap of other transports */
    void *impl;        /* the transport's state */
    double timeout;    /* seconds a collective may take before the job is ended (0: forever) */
    int always;        /* all-reduce even in a world of one (to time the transport) */
    struct mgt_watchdog *dog;
    /* ZeRO-1: rank r owns [owners[r], owners[r + 1]) of the arena the OWNERS kinds work on
     * (world + 1 offsets, mgt_comm_set_owners); NULL: no owners. */
    const size_t *owners;
    /* The host must drive the requests (MPI): the reducer tests them between layers and may
     * update one range while the next is in flight. 0: the device orders them (NCCL). */
    int host_progress;
    int progress_thread; /* ... and a thread of its own does (--comm-progress thread) */
};

/* The MPI transport over `mpi` (host memory). timeout_s <= 0: no watchdog. */
void mgt_comm_init_mpi(mgt_comm *c, MPI_Comm mpi, double timeout_s);
/* The shared-memory transport (comm_shm.c): CPU ranks all on one node reduce straight from each
 * other's buffers, which must come from mgt_comm_share. Returns -1 with err when the ranks span
 * nodes or the memory cannot be had (mgt_comm_destroy releases what it set up). */
int mgt_comm_init_shm(mgt_comm *c, MPI_Comm mpi, double timeout_s, mgt_err *err);
/* Whether the requests need their buffers from mgt_comm_share (shm), and that memory: `bytes`
 * of host memory, collective (every rank asks alike, in the same order), owned by the transport
 * and released with it. NULL with err on failure. */
int mgt_comm_shares(const mgt_comm *c);
void *mgt_comm_share(mgt_comm *c, size_t bytes, mgt_err *err);
/* How the MPI transport's requests progress: by the test calls between layers (the default), or
 * by a thread of its own that tests them while the step computes (needs MPI_THREAD_SERIALIZED).
 * Returns -1 with err when the thread cannot be had. */
typedef enum { MGT_PROGRESS_TEST = 0, MGT_PROGRESS_THREAD } mgt_progress;
int mgt_comm_set_progress(mgt_comm *c, mgt_progress how, mgt_err *err);
/* The MPI transport for device buffers (cuda/, GPU builds): each all-reduce copies the buffer to
 * pinned host memory, reduces it over MPI and copies it back (MPI here is not CUDA-aware). For
 * ranks that NCCL will not connect; slower than NCCL. Returns -1 with err on failure. */
int mgt_comm_init_mpi_staged(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s,
                             mgt_err *err);
/* The common part every transport's init calls first: ranks, MPI communicator, watchdog. */
void mgt_comm_init_common(mgt_comm *c, MPI_Comm mpi, double timeout_s);
/* Rank r's slice of a range of `count` floats cut over `world` ranks: [*lo, *lo + *n) from its
 * start. Slices are contiguous, in rank order, tile the range, and start on 16-float
 * boundaries. ZeRO-1's owners (reducer.h) and the MPI transport's parts of a sum are cut so. */
void mgt_comm_slice(size_t count, int r, int world, size_t *lo, size_t *n);
/* Releases the transport: also one whose init failed, and then what that init had set up. */
void mgt_comm_destroy(mgt_comm *c);

/* The owner slices of the OWNERS kinds (world + 1 offsets, kept by the caller). */
void mgt_comm_set_owners(mgt_comm *c, const size_t *owners);
/* The part of [lo, lo + count) that rank r owns, as [*a, *b) (empty: *a == *b). */
void mgt_comm_owned(const mgt_comm *c, int r, size_t lo, size_t count, size_t *a, size_t *b);

/* Typed, watched wrappers: what the rest of the code calls. */
void mgt_allreduce_sum(mgt_comm *c, float *buf, size_t count, const char *what); /* backend */
void mgt_bcast(mgt_comm *c, void *buf, size_t bytes, int root, const char *what);  /* host */
void mgt_gatherv(mgt_comm *c, const float *send, size_t count, float *recv, const size_t *counts,
                 int root, const char *what);                                       /* host */
/* The inverse of mgt_gatherv: root's send holds counts[r] floats for each rank r in rank order;
 * each rank receives its `count` of them (host). */
void mgt_scatterv(mgt_comm *c, const float *send, const size_t *counts, float *recv, size_t count,
                  int root, const char *what);

/* Host-side byte gather over the job's MPI communicator whatever the transport (profiles, start-up
 * block): counts[] and recv matter on the root only. */
void mgt_gather_host(mgt_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                     int root, const char *what);
/* Host-side all-reduce (sum) of doubles over MPI, whatever the transport (metrics, averages). */
void mgt_allreduce_host_f64(mgt_comm *c, double *buf, size_t count, const char *what);
/* The requests (see mgt_comm_ops; slots reserved with mgt_comm_reserve). In a world of one,
 * unless c->always, they are no-ops: there is nothing to reduce. */
int mgt_comm_reserve(mgt_comm *c, int n, mgt_err *err);
/* Whether requests run at all: a world of more than one, or of one when the transport is to be
 * timed (c->always). */
int mgt_comm_requests_on(const mgt_comm *c);
void mgt_comm_start(mgt_comm *c, int slot, mgt_coll kind, float *buf, size_t lo, size_t count);
int mgt_comm_test(mgt_comm *c, int slot);
void mgt_comm_wait(mgt_comm *c, int slot, const char *what);
/* Marks the start and end of a watched collective (transports call these around their work). */
void mgt_comm_enter(mgt_comm *c, const char *what);
void mgt_comm_leave(mgt_comm *c);

#endif
