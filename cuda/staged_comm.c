/* staged_comm.c: the MPI transport for device buffers (comm.h: mgt_comm_init_mpi_staged).
 *
 * Open MPI as packaged is not CUDA-aware, so each all-reduce waits for the gradients (a polled
 * wait, like every host wait of the GPU backend), copies them into pinned host memory, sums
 * them over MPI in place and copies them back. It exists for ranks NCCL will not connect; NCCL
 * is the transport for speed. The buffer grows to the largest all-reduce once (outside the step
 * loop in practice: the first step). */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "gpu_internal.h"
#include "runtime.h"

typedef struct staged_state {
    mgt_backend *be;
    float *host;
    size_t cap;
} staged_state;

static void staged_allreduce_f32(mgt_comm *c, float *buf, size_t count) {
    staged_state *s = c->impl;
    const mgt_ops *o = s->be->ops;
    if (count == 0)
        return;
    if (count > s->cap) {
        if (s->host)
            o->host_free(s->be, s->host);
        s->host = o->host_alloc(s->be, count * sizeof(float));
        if (!s->host)
            mgt_die("out of pinned host memory for the MPI all-reduce of %zu floats", count);
        s->cap = count;
    }
    o->to_host(s->be, s->host, buf, count * sizeof(float));
    if (count > (size_t)0x7fffffff)
        mgt_die("MPI all-reduce of %zu floats: more than MPI's int count allows", count);
    int rc = MPI_Allreduce(MPI_IN_PLACE, s->host, (int)count, MPI_FLOAT, MPI_SUM, c->mpi);
    if (rc != MPI_SUCCESS)
        mgt_die("MPI_Allreduce of %zu floats failed (MPI error %d)", count, rc);
    o->to_device(s->be, buf, s->host, count * sizeof(float));
}

static void staged_destroy(mgt_comm *c) {
    staged_state *s = c->impl;
    if (!s)
        return;
    if (s->host)
        s->be->ops->host_free(s->be, s->host);
    free(s);
    c->impl = NULL;
}

static const mgt_comm_ops staged_ops = {
    .name = "mpi-staged",
    .allreduce_sum_f32 = staged_allreduce_f32,
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
