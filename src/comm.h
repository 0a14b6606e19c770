/* comm.h: the collectives the trainer needs, on flat typed buffers.
 *
 * One small interface with one implementation per transport: MPI here, NCCL in cuda/. The
 * all-reduce of float buffers works on BACKEND memory (host for the CPU backend, device for the
 * GPU one) through the transport; broadcasts, gathers and double sums work on HOST memory over
 * MPI whatever the transport (start-up, metrics, predictions: never in the step loop). The
 * trainer calls only these wrappers, once per step for the gradient arena, so a new transport
 * slots in without changes above it. Counts are in ELEMENTS.
 *
 * Every call is watched: if one collective does not finish within the timeout (a peer died or
 * stopped), the watchdog prints which collective and ends the job instead of waiting forever. */
#ifndef MGT_COMM_H
#define MGT_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "util.h"

typedef struct mgt_comm mgt_comm;

typedef struct mgt_comm_ops {
    const char *name;
    /* In-place sum over all ranks of a float buffer in backend memory. */
    void (*allreduce_sum_f32)(mgt_comm *c, float *buf, size_t count);
    void (*destroy)(mgt_comm *c);
} mgt_comm_ops;

struct mgt_comm {
    const mgt_comm_ops *ops;
    int rank, world;
    MPI_Comm mpi;      /* host collectives, and the bootstrap of other transports */
    void *impl;        /* the transport's state */
    double timeout;    /* seconds a collective may take before the job is ended (0: forever) */
    int always;        /* all-reduce even in a world of one (to time the transport) */
    struct mgt_watchdog *dog;
};

/* The MPI transport over `mpi` (host memory). timeout_s <= 0: no watchdog. */
void mgt_comm_init_mpi(mgt_comm *c, MPI_Comm mpi, double timeout_s);
/* The MPI transport for device buffers (cuda/, GPU builds): each all-reduce copies the buffer to
 * pinned host memory, reduces it over MPI and copies it back (MPI here is not CUDA-aware). For
 * ranks that NCCL will not connect; slower than NCCL. Returns -1 with err on failure. */
int mgt_comm_init_mpi_staged(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s,
                             mgt_err *err);
/* The common part every transport's init calls first: ranks, MPI communicator, watchdog. */
void mgt_comm_init_common(mgt_comm *c, MPI_Comm mpi, double timeout_s);
void mgt_comm_destroy(mgt_comm *c);

/* Typed, watched wrappers: what the rest of the code calls. */
void mgt_allreduce_sum(mgt_comm *c, float *buf, size_t count, const char *what); /* backend */
void mgt_bcast(mgt_comm *c, void *buf, size_t bytes, int root, const char *what);  /* host */
void mgt_gatherv(mgt_comm *c, const float *send, size_t count, float *recv, const size_t *counts,
                 int root, const char *what);                                       /* host */

/* Host-side byte gather over the job's MPI communicator whatever the transport (profiles, start-up
 * block): counts[] and recv matter on the root only. */
void mgt_gather_host(mgt_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                     int root, const char *what);
/* Host-side all-reduce (sum) of doubles over MPI, whatever the transport (metrics, averages). */
void mgt_allreduce_host_f64(mgt_comm *c, double *buf, size_t count, const char *what);
/* Marks the start and end of a watched collective (transports call these around their work). */
void mgt_comm_enter(mgt_comm *c, const char *what);
void mgt_comm_leave(mgt_comm *c);

#endif
