/* comm.h: the collectives the trainer needs, on flat typed buffers.
 *
 * One small interface with one implementation per transport: MPI here (host buffers), NCCL in
 * cuda/ (device buffers). The trainer calls only these wrappers, once per step for the gradient
 * arena, so a new transport slots in without changes above it. Counts are in ELEMENTS.
 *
 * Every call is watched: if one collective does not finish within the timeout (a peer died or
 * stopped), the watchdog prints which collective and ends the job instead of waiting forever. */
#ifndef MGT_COMM_H
#define MGT_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mgt_comm mgt_comm;

typedef struct mgt_comm_ops {
    const char *name;
    void (*allreduce_sum_f32)(mgt_comm *c, float *buf, size_t count);
    void (*allreduce_sum_f64)(mgt_comm *c, double *buf, size_t count); /* host buffers */
    void (*bcast)(mgt_comm *c, void *buf, size_t bytes, int root);
    /* Rank r sends count floats; root receives them concatenated in rank order into recv, whose
     * per-rank counts are in counts[world] (root only). */
    void (*gatherv_f32)(mgt_comm *c, const float *send, size_t count, float *recv,
                        const size_t *counts, int root);
    void (*destroy)(mgt_comm *c);
} mgt_comm_ops;

struct mgt_comm {
    const mgt_comm_ops *ops;
    int rank, world;
    MPI_Comm mpi;
    void *impl;
    struct mgt_watchdog *dog;
};

/* The MPI transport over `mpi` (host memory). timeout_s <= 0: no watchdog. */
void mgt_comm_init_mpi(mgt_comm *c, MPI_Comm mpi, double timeout_s);
void mgt_comm_destroy(mgt_comm *c);

/* Typed, watched wrappers: what the rest of the code calls. */
void mgt_allreduce_sum(mgt_comm *c, float *buf, size_t count, const char *what);
void mgt_allreduce_sum_f64(mgt_comm *c, double *buf, size_t count, const char *what);
void mgt_bcast(mgt_comm *c, void *buf, size_t bytes, int root, const char *what);
void mgt_gatherv(mgt_comm *c, const float *send, size_t count, float *recv, const size_t *counts,
                 int root, const char *what);

/* Host-side byte gather over the job's MPI communicator whatever the transport (profiles, start-up
 * block): counts[] and recv matter on the root only. */
void mgt_gather_host(mgt_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                     int root, const char *what);
/* Host-side all-reduce of doubles over MPI, whatever the transport (metrics at epoch end). */
void mgt_allreduce_host_f64(mgt_comm *c, double *buf, size_t count, const char *what);

#endif
