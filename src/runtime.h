/* runtime.h: the MPI world this process is part of, and how a job ends on error.
 *
 * Rank, world size and the node-local rank come from MPI itself (MPI_Comm_split_type with
 * MPI_COMM_TYPE_SHARED), never from launcher variables, so mpirun, srun and a singleton
 * ./mgtrain all work the same way. A process that no launcher started is a world of one and
 * does not start MPI at all: every collective is then a no-op, and Open MPI's singleton
 * start-up (half a second) is saved. */
#ifndef MGT_RUNTIME_H
#define MGT_RUNTIME_H

#include <mpi.h>

typedef struct mgt_runtime {
    int rank, world;             /* in MPI_COMM_WORLD */
    int local_rank, local_size;  /* on this node */
    int node, nodes;             /* this node's index, node count */
    int max_local_size;          /* most ranks on any node */
    char host[64];
    int launched;                /* started by mpirun/srun (seen before MPI_Init) */
    int mpi;                     /* MPI was initialised (launched) */
    int own_mpi;                 /* by mgt_runtime_init, which then also finalises it */
    MPI_Comm node_comm;
} mgt_runtime;

void mgt_runtime_init(mgt_runtime *rt, int *argc, char ***argv);
void mgt_runtime_finalize(mgt_runtime *rt);

/* Cores this rank may use for BLAS threads: its CPU affinity, shared with the other ranks of the
 * node when they were not bound to separate cores. */
int mgt_runtime_cores(const mgt_runtime *rt);

/* Errors come in two tiers (STYLE.md, "Errors, two tiers"):
 *
 * mgt_die: an error this rank meets alone (its own I/O, a dead peer, a device fault). Prints
 * "rank R: <message>" and ends the WHOLE job with MPI_Abort, or, in a world of one, exits 1.
 *
 * mgt_die_all: an error every rank meets in the same way at the same point (a bad flag, model
 * file, data set or output folder). Rank 0 prints "mgtrain: <message>" once; every rank then
 * leaves through MPI_Finalize and exit(2), like argparse: no MPI_Abort, so Open MPI prints no
 * abort banner and nothing races the message. MPI_Finalize waits for every rank; should one rank
 * not arrive within MGT_DIE_ALL_GRACE_S seconds (the error was not symmetric after all), the
 * waiting rank prints its message as "rank R: ..." and exits 2 without finalising, which makes
 * the launcher end the job: misuse costs the grace period, never a hang.
 *
 * Under mpirun, Open MPI itself still reports a non-zero exit status ("mpirun detected that one
 * or more processes exited with non-zero status") unless it runs quiet (mpirun -q). Both never
 * return. */
void mgt_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void mgt_die_all(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
#define MGT_DIE_ALL_GRACE_S 30

/* For an error only rank 0 can see (a file it alone reads or writes, the output folder it
 * creates) that should still end the job as mgt_die_all does. Collective: every rank calls it at
 * the same point. Rank 0 passes its error message, or NULL when all is well (the other ranks'
 * argument is ignored); when rank 0 passed a message, every rank ends through mgt_die_all with
 * it, otherwise the call returns everywhere. */
void mgt_die_all_if_root(const char *root_msg);

/* Prints on rank 0 only. */
void mgt_log0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
