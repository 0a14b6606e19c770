/* comm.c: the MPI transport and the watchdog that keeps a job from hanging.
 *
 * MPI counts are int: buffers larger than INT_MAX elements are sent in pieces. */
#include "comm.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"
#include "util.h"

/* The watchdog: the main thread stamps the start of each collective; a thread checks once a
 * second and, past the timeout, reports and exits the process (mpirun then ends the others). It
 * never calls MPI itself, so MPI_THREAD_FUNNELED is enough. */
struct mgt_watchdog {
    pthread_t thread;
    double timeout;
    int rank;
    _Atomic double since; /* 0: not inside a collective */
    _Atomic(const char *) what;
    atomic_int stop;
};

static void *watch(void *arg) {
    struct mgt_watchdog *d = arg;
    while (!atomic_load(&d->stop)) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        double since = atomic_load(&d->since);
        if (since > 0 && mgt_now() - since > d->timeout) {
            fprintf(stderr,
                    "rank %d: %s did not complete within %.0f s: another rank died or stopped; "
                    "ending the job (see the other ranks' messages above; raise --comm-timeout "
                    "if steps are legitimately this slow)\n",
                    d->rank, atomic_load(&d->what), d->timeout);
            fflush(stderr);
            _exit(124);
        }
    }
    return NULL;
}

void mgt_comm_enter(mgt_comm *c, const char *what) {
    if (c->dog) {
        atomic_store(&c->dog->what, what);
        atomic_store(&c->dog->since, mgt_now());
    }
}

void mgt_comm_leave(mgt_comm *c) {
    if (c->dog)
        atomic_store(&c->dog->since, 0.0);
}

static void mpi_check(int rc, const char *call, const char *what) {
    if (rc != MPI_SUCCESS) {
        char s[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, s, &len);
        mgt_die("%s failed during %s: %s", call, what, s);
    }
}

static void mpi_allreduce_f32(mgt_comm *c, float *buf, size_t count) {
    for (size_t off = 0; off < count; off += INT_MAX) {
        size_t n = count - off < INT_MAX ? count - off : INT_MAX;
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)n, MPI_FLOAT, MPI_SUM, c->mpi),
                  "MPI_Allreduce", "gradient all-reduce");
    }
}

/* MPI_Gatherv's int counts and displacements from size_t counts (root only); NULL elsewhere. */
static int *gather_layout(mgt_comm *c, const size_t *counts, int root, const char *what) {
    if (c->rank != root)
        return NULL;
    int *rc = malloc(2 * sizeof(int) * (size_t)c->world);
    if (!rc)
        mgt_die("out of host memory for a gather of %d ranks", c->world);
    size_t off = 0;
    for (int r = 0; r < c->world; r++) {
        if (counts[r] > INT_MAX || off > INT_MAX)
            mgt_die("%s: %zu elements are too many for one MPI_Gatherv", what, off + counts[r]);
        rc[r] = (int)counts[r];
        rc[c->world + r] = (int)off;
        off += counts[r];
    }
    return rc;
}

static void mpi_destroy(mgt_comm *c) { (void)c; }

static const mgt_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce_sum_f32 = mpi_allreduce_f32,
    .destroy = mpi_destroy,
};

void mgt_comm_init_mpi(mgt_comm *c, MPI_Comm mpi, double timeout_s) {
    mgt_comm_init_common(c, mpi, timeout_s);
    c->ops = &mpi_ops;
}

void mgt_comm_init_common(mgt_comm *c, MPI_Comm mpi, double timeout_s) {
    memset(c, 0, sizeof *c);
    c->mpi = mpi;
    c->timeout = timeout_s;
    int init = 0;
    MPI_Initialized(&init);
    c->world = 1; /* a process started without a launcher runs without MPI: a world of one */
    if (init) {
        MPI_Comm_rank(mpi, &c->rank);
        MPI_Comm_size(mpi, &c->world);
    }
    if (timeout_s > 0 && c->world > 1) {
        c->dog = calloc(1, sizeof *c->dog);
        if (!c->dog)
            mgt_die("out of host memory");
        c->dog->timeout = timeout_s;
        c->dog->rank = c->rank;
        if (pthread_create(&c->dog->thread, NULL, watch, c->dog) != 0)
            mgt_die("cannot start the communication watchdog thread");
    }
}

void mgt_comm_destroy(mgt_comm *c) {
    if (c->dog) {
        atomic_store(&c->dog->stop, 1);
        pthread_join(c->dog->thread, NULL);
        free(c->dog);
        c->dog = NULL;
    }
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c);
}

void mgt_allreduce_sum(mgt_comm *c, float *buf, size_t count, const char *what) {
    if ((c->world == 1 && !c->always) || count == 0)
        return;
    mgt_comm_enter(c, what);
    c->ops->allreduce_sum_f32(c, buf, count);
    mgt_comm_leave(c);
}

void mgt_bcast(mgt_comm *c, void *buf, size_t bytes, int root, const char *what) {
    if (c->world == 1 || bytes == 0)
        return;
    mgt_comm_enter(c, what);
    for (size_t off = 0; off < bytes; off += INT_MAX) {
        size_t n = bytes - off < INT_MAX ? bytes - off : INT_MAX;
        mpi_check(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, c->mpi), "MPI_Bcast", what);
    }
    mgt_comm_leave(c);
}

/* Both gathers: `count` items of MPI type t (size bytes each) from every rank to root. */
static void gatherv(mgt_comm *c, const void *send, size_t count, MPI_Datatype t, size_t size,
                    void *recv, const size_t *counts, int root, const char *what) {
    if (c->world == 1) {
        if (count && recv != send)
            memcpy(recv, send, count * size);
        return;
    }
    int *rc = gather_layout(c, counts, root, what);
    mgt_comm_enter(c, what);
    mpi_check(MPI_Gatherv(send, (int)count, t, recv, rc, rc ? rc + c->world : NULL, t, root,
                          c->mpi),
              "MPI_Gatherv", what);
    mgt_comm_leave(c);
    free(rc);
}

void mgt_gatherv(mgt_comm *c, const float *send, size_t count, float *recv, const size_t *counts,
                 int root, const char *what) {
    gatherv(c, send, count, MPI_FLOAT, sizeof(float), recv, counts, root, what);
}

void mgt_gather_host(mgt_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                     int root, const char *what) {
    gatherv(c, send, bytes, MPI_BYTE, 1, recv, counts, root, what);
}

void mgt_allreduce_host_f64(mgt_comm *c, double *buf, size_t count, const char *what) {
    if (c->world == 1 || count == 0)
        return;
    mgt_comm_enter(c, what);
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_DOUBLE, MPI_SUM, c->mpi),
              "MPI_Allreduce", what);
    mgt_comm_leave(c);
}
