/* runtime.c: MPI start-up, node-local ranks, core counts, and ending the job on error. */
#define _GNU_SOURCE
#include "runtime.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void mgt_runtime_init(mgt_runtime *rt, int *argc, char ***argv) {
    memset(rt, 0, sizeof *rt);
    /* Before MPI_Init: a singleton's MPI_Init sets these variables itself. A program using
     * libmgt may have started MPI already: then it is used, and left to that program to end. */
    int started = 0;
    MPI_Initialized(&started);
    rt->own_mpi = !started;
    rt->launched = started || getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") ||
                   getenv("PMI_RANK") || getenv("SLURM_STEP_ID");
    if (gethostname(rt->host, sizeof rt->host - 1) != 0)
        snprintf(rt->host, sizeof rt->host, "unknown");
    rt->world = rt->local_size = rt->nodes = rt->max_local_size = 1;
    if (!rt->launched)
        return;
    rt->mpi = 1;
    int provided = 0;
    /* SERIALIZED: the main thread calls MPI, and so may comm.c's progress thread
     * (--comm-progress thread), never at the same time as another (comm.c's lock); the watchdog
     * and loader threads never do. */
    if (rt->own_mpi)
        MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rt->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &rt->world);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rt->rank, MPI_INFO_NULL,
                        &rt->node_comm);
    MPI_Comm_rank(rt->node_comm, &rt->local_rank);
    MPI_Comm_size(rt->node_comm, &rt->local_size);
    /* Node index: the leaders (local rank 0) number themselves in world-rank order. */
    int leader = rt->local_rank == 0, before = 0;
    MPI_Exscan(&leader, &before, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rt->rank == 0)
        before = 0;
    int node = before;
    MPI_Bcast(&node, 1, MPI_INT, 0, rt->node_comm);
    rt->node = node;
    MPI_Allreduce(&leader, &rt->nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&rt->local_size, &rt->max_local_size, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
}

void mgt_runtime_finalize(mgt_runtime *rt) {
    if (!rt->mpi)
        return;
    MPI_Comm_free(&rt->node_comm);
    if (rt->own_mpi)
        MPI_Finalize();
}

int mgt_runtime_cores(const mgt_runtime *rt) {
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int mine = (int)online;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        mine = CPU_COUNT(&set);
    /* Unbound ranks all see every core: share them out. Bound ranks see their own. */
    if (mine >= online && rt->local_size > 1)
        mine = (int)online / rt->local_size;
    return mine < 1 ? 1 : mine;
}

static int world_info(int *rank) {
    int init = 0, fin = 0, world = 1;
    *rank = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) {
        MPI_Comm_rank(MPI_COMM_WORLD, rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
    }
    return world;
}

static void __attribute__((noreturn)) end_job(int world) {
    fflush(stdout);
    fflush(stderr);
    if (world > 1)
        MPI_Abort(MPI_COMM_WORLD, 1);
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Finalize();
    exit(1);
}

static void vreport(int rank, const char *fmt, va_list ap) {
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fflush(stdout);
    fprintf(stderr, "rank %d: %s\n", rank, msg);
    fflush(stderr);
}

void mgt_die(const char *fmt, ...) {
    int rank;
    int world = world_info(&rank);
    va_list ap;
    va_start(ap, fmt);
    vreport(rank, fmt, ap);
    va_end(ap);
    end_job(world);
}

void mgt_die_all(const char *fmt, ...) {
    int rank;
    int world = world_info(&rank);
    if (rank != 0)
        sleep(5); /* rank 0 normally prints and aborts the job before this returns */
    va_list ap;
    va_start(ap, fmt);
    vreport(rank, fmt, ap);
    va_end(ap);
    end_job(world);
}

void mgt_log0(const char *fmt, ...) {
    int rank;
    world_info(&rank);
    if (rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}
