/* staged_comm.c: the MPI transport for device buffers (comm.h: mgt_comm_init_mpi_staged).
 *
 * Open MPI as packaged is not CUDA-aware, so each all-reduce waits for the gradients (a polled
 * wait, like every host wait of the GPU backend), copies them into pinned host memory, sums
 * them over MPI in place and copies them back. It exists for ranks NCCL will not connect; NCCL
 * is the transport for speed. The buffer grows to the largest all-reduce once (outside the step
 * loop in practice: the first step).
 *
 * Requests (comm.h) are kept until their wait and run there, one after another, as blocking MPI
 * collectives on the host copy: a copy to the host waits for the GPU, so running them as soon as
 * backward writes a bucket would stop the host from queueing the rest of backward. Without
 * overlap this transport's step is today's: backward, then the reductions, then the update. */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "gpu_internal.h"
#include "runtime.h"

/* A request kept until its wait. */
typedef struct staged_req {
    mgt_coll kind;
    float *buf;
    size_t lo, count;
    int done; /* run by an earlier wait */
} staged_req;

typedef struct staged_state {
    mgt_backend *be;
    float *host;
    size_t cap;
    staged_req *req;
    int nreq;
} staged_state;

static void mpi_ok(int rc, const char *call, size_t count) {
    if (rc != MPI_SUCCESS)
        mgt_die("%s of %zu floats failed (MPI error %d)", call, count, rc);
}

/* Collective `kind` on buf[lo, lo + count) (device memory) through the pinned host copy. */
static void staged_run(mgt_comm *c, mgt_coll kind, float *buf, size_t lo, size_t count) {
    staged_state *s = c->impl;
    const mgt_ops *o = s->be->ops;
    if (count == 0)
        return;
    if (count > (size_t)0x7fffffff)
        mgt_die("MPI collective of %zu floats: more than MPI's int count allows", count);
    if (count > s->cap) {
        if (s->host)
            o->host_free(s->be, s->host);
        s->host = o->host_alloc(s->be, count * sizeof(float));
        if (!s->host)
            mgt_die("out of pinned host memory for the MPI all-reduce of %zu floats", count);
        s->cap = count;
    }
    o->to_host(s->be, s->host, buf + lo, count * sizeof(float));
    if (kind == MGT_COLL_ALLREDUCE) {
        mpi_ok(MPI_Allreduce(MPI_IN_PLACE, s->host, (int)count, MPI_FLOAT, MPI_SUM, c->mpi),
               "MPI_Allreduce", count);
        o->to_device(s->be, buf + lo, s->host, count * sizeof(float));
        return;
    }
    /* The owners' kinds: each owner's part is reduced to it, or sent from it, in place. */
    for (int r = 0; r < c->world; r++) {
        size_t a, b;
        mgt_comm_owned(c, r, lo, count, &a, &b);
        if (a == b)
            continue;
        float *h = s->host + (a - lo);
        if (kind == MGT_COLL_REDUCE_OWNERS)
            mpi_ok(MPI_Reduce(r == c->rank ? MPI_IN_PLACE : h, h, (int)(b - a), MPI_FLOAT, MPI_SUM,
                              r, c->mpi),
                   "MPI_Reduce", b - a);
        else
            mpi_ok(MPI_Bcast(h, (int)(b - a), MPI_FLOAT, r, c->mpi), "MPI_Bcast", b - a);
        if (kind == MGT_COLL_GATHER_OWNERS || r == c->rank)
            o->to_device(s->be, buf + a, h, (b - a) * sizeof(float));
    }
}

static void staged_allreduce_f32(mgt_comm *c, float *buf, size_t count) {
    staged_run(c, MGT_COLL_ALLREDUCE, buf, 0, count);
}

static int staged_reserve(mgt_comm *c, int n, mgt_err *err) {
    staged_state *s = c->impl;
    if (n <= s->nreq)
        return 0;
    staged_req *r = realloc(s->req, sizeof *r * (size_t)n);
    if (!r)
        return mgt_errf(err, "out of host memory for %d communication requests", n);
    s->req = r;
    s->nreq = n;
    return 0;
}

static void staged_start(mgt_comm *c, int slot, mgt_coll kind, float *buf, size_t lo,
                         size_t count) {
    staged_state *s = c->impl;
    s->req[slot] = (staged_req){kind, buf, lo, count, 0};
}

static int staged_test(mgt_comm *c, int slot) {
    (void)c;
    (void)slot;
    return 1; /* nothing moves before the wait */
}

static void staged_wait(mgt_comm *c, int slot) {
    staged_state *s = c->impl;
    staged_req *q = &s->req[slot];
    if (!q->done)
        staged_run(c, q->kind, q->buf, q->lo, q->count);
    q->done = 1;
}

static void staged_destroy(mgt_comm *c) {
    staged_state *s = c->impl;
    if (!s)
        return;
    if (s->host)
        s->be->ops->host_free(s->be, s->host);
    free(s->req);
    free(s);
    c->impl = NULL;
}

static const mgt_comm_ops staged_ops = {
    .name = "mpi-staged",
    .allreduce_sum_f32 = staged_allreduce_f32,
    .reserve = staged_reserve,
    .start = staged_start,
    .test = staged_test,
    .wait = staged_wait,
    .destroy = staged_destroy,
};

int mgt_comm_init_mpi_staged(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s,
                             mgt_err *err) {
    mgt_comm_init_common(c, mpi, timeout_s);
    c->ops = &staged_ops;
    if (!be || !be->ops || !be->ops->host_alloc || !be->ops->host_free)
        return mgt_errf(err, "the staged MPI transport needs a backend with pinned host memory");
    staged_state *s = calloc(1, sizeof *s);
    if (!s)
        return mgt_errf(err, "out of host memory starting the MPI transport");
    s->be = be;
    c->impl = s;
    c->always = 1;
    return 0;
}
