/* reducer.c: buckets, accumulation and ZeRO-1's traffic within a step (see reducer.h). */
#include "reducer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* The plan being made: buckets are opened from the arena's top and closed when the next part
 * would take the open one past its cap. */
typedef struct plan {
    double first, cap; /* bytes; cap <= 0: one bucket */
    size_t hi;         /* the open bucket's upper end */
    mgt_bucket *b;
    int nb, max;
} plan;

/* The next part down, [lo, the part above it), in backward's order. */
static int plan_part(plan *p, size_t lo) {
    if (p->nb > 0 && p->cap > 0) {
        /* Close the open bucket when this part would take it past its cap: it then ends where
         * its lowest part starts, and the new one begins there. */
        const double cap = p->nb == 1 && p->first < p->cap ? p->first : p->cap;
        if ((double)(p->hi - lo) * sizeof(float) > cap) {
            p->hi = p->b[p->nb - 1].lo;
            if (p->nb == p->max)
                return -1;
            memset(&p->b[p->nb++], 0, sizeof *p->b);
        }
    }
    if (p->nb == 0) {
        if (p->max < 1)
            return -1;
        memset(&p->b[p->nb++], 0, sizeof *p->b);
    }
    p->b[p->nb - 1].lo = lo;
    return 0;
}

int mgt_bucket_plan(const mgt_model *m, const mgt_ops *ops, double first_mb, double cap_mb,
                    size_t end, mgt_bucket *b, int max) {
    const double mib = 1048576.0;
    plan p = {first_mb * mib, cap_mb * mib, end, b, 0, max};
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const mgt_layer *l = &m->layers[i];
        size_t lo_l;
        if (!mgt_layer_param_range(m, l, &lo_l))
            continue;
        /* A layer that hands its gradients over in parts (model.h: grad_rows) may be cut
         * between them: the tensors above its first, then its first tensor's row blocks. */
        const int rows = ops && l->type->grad_rows ? l->type->grad_rows(l, ops) : 0;
        const mgt_param *p0 = &m->params[l->param[0]];
        if (rows > 0 && p0->offset == lo_l && p0->shape[0] > rows) {
            const size_t row = p0->count / (size_t)p0->shape[0];
            const size_t top = p0->offset + p0->count;
            if (top < p.hi && plan_part(&p, top) < 0)
                return -1;
            for (int64_t r = (p0->shape[0] - 1) / rows * rows; r >= 0; r -= rows)
                if (plan_part(&p, p0->offset + (size_t)r * row) < 0)
                    return -1;
        } else if (plan_part(&p, lo_l) < 0) {
            return -1;
        }
    }
    if (p.nb == 0)
        return 0;
    /* The buckets tile [0, end): the lowest also takes whatever lies below its first tensor. */
    b[p.nb - 1].lo = 0;
    for (int k = 0; k < p.nb; k++)
        b[k].count = (k == 0 ? end : b[k - 1].lo) - b[k].lo;
    return p.nb;
}

/* GPUs: PyTorch DDP's 25 MiB, where NCCL's per-call cost (tens of microseconds) wants few large
 * messages. CPUs: 0.25 MiB. There the ranks move the bytes themselves, inside their MPI calls
 * between the parts of backward, so what hides communication is many buckets leaving while a
 * long part of backward remains: the MLP's whole gradient is 1 MiB, three quarters of it in its
 * first layer's four row blocks (layers/dense.c), and at 0.25 MiB each block is a bucket of its
 * own (at 1 MiB the first bucket would wait for three of them). bench/overlap, 2 ranks on a
 * 2-core AMD EPYC (bench/results/cpu-overlap-epyc.md), exposed share of the step, median of 9
 * runs: MLP 14.8% one-shot, 12.4% at 0.25 MiB, 17.2% at 1 MiB (single runs spread from 1% to
 * 23% in every variant: see docs/benchmarks.md); seed ConvNet 1.9%, 0.8%, 0.8%. */
double mgt_bucket_mb_default(const mgt_ops *ops) {
    return strcmp(ops->name, "cpu") ? 25.0 : 0.25;
}

static int sums_at(const mgt_model *m) {
    return (int)(m->sums - m->g);
}

int mgt_reducer_init(mgt_reducer *r, mgt_model *m, mgt_backend *be, mgt_comm *comm,
                     const mgt_reducer_opts *o, mgt_err *err) {
    memset(r, 0, sizeof *r);
    r->m = m;
    r->be = be;
    r->comm = comm;
    r->o = *o;
    if (r->o.accum_steps < 1)
        r->o.accum_steps = 1;
    /* Without ZeRO the metric sums ride in the first bucket: it ends past them. */
    const size_t end = o->zero ? m->grad_count : (size_t)sums_at(m) + (size_t)m->nsums;
    /* At most a bucket per part: a layer is one part, or its top and GRAD_BLOCKS row blocks. */
    const int max = 8 * m->nlayers + 1;
    r->b = calloc((size_t)max, sizeof *r->b);
    r->t_gather = calloc((size_t)max + 1, sizeof *r->t_gather);
    r->t_gather_done = calloc((size_t)max + 1, sizeof *r->t_gather_done);
    r->gather_state = calloc((size_t)max + 1, 1);
    /* the buckets' requests, the sums' and the gathers' (one per bucket and the whole arena) */
    r->spans = calloc(2 * (size_t)max + 2, sizeof *r->spans);
    r->owners = calloc((size_t)comm->world + 1, sizeof *r->owners);
    if (!r->b || !r->spans || !r->t_gather || !r->t_gather_done || !r->gather_state ||
        !r->owners)
        return mgt_errf(err, "out of host memory for the gradient buckets");
    r->end = end;
    r->nb = mgt_bucket_plan(m, be->ops, MGT_FIRST_BUCKET_MB, o->bucket_mb, end, r->b, max);
    if (r->nb < 1)
        return mgt_errf(err, "model %s has no trainable parameters: nothing to train", m->name);
    if (o->zero) {
        for (int k = 0; k < comm->world; k++) {
            size_t n;
            mgt_comm_slice(m->grad_count, k, comm->world, &r->owners[k], &n);
        }
        r->owners[comm->world] = m->grad_count;
        mgt_comm_set_owners(comm, r->owners);
    }
    r->sums_slot = r->nb;
    r->gather_slot = r->nb + 1;
    /* The host updates bucket by bucket where it drives the requests itself (MPI on the CPU); a
     * GPU queues one update behind all of them, its phases timed on the device. One rank has no
     * bucket to wait for: one update of the whole arena, one hand-off to the lanes where there
     * were six (the MLP's buckets), each with a part of a lane waiting for the other. */
    r->interleave = comm->host_progress && !strcmp(be->ops->name, "cpu") && comm->world > 1;
    if (mgt_comm_reserve(comm, r->gather_slot + r->nb + 1, err) < 0)
        return -1;
    if (r->o.accum_steps > 1) {
        r->acc = be->ops->alloc(be, m->grad_count * sizeof(float) + 16);
        if (!r->acc)
            return mgt_errf(err,
                            "out of %s memory for the gradient accumulation arena (%zu bytes); "
                            "a smaller model or --accum-steps 1 needs none",
                            be->ops->name, m->grad_count * sizeof(float));
    }
    return 0;
}

void mgt_reducer_free(mgt_reducer *r) {
    if (r->acc)
        r->be->ops->free(r->be, r->acc);
    if (r->comm && r->comm->owners == r->owners)
        mgt_comm_set_owners(r->comm, NULL);
    free(r->b);
    free(r->t_gather);
    free(r->t_gather_done);
    free(r->gather_state);
    free(r->spans);
    free(r->owners);
    memset(r, 0, sizeof *r);
}

static void start_bucket(mgt_reducer *r, int k) {
    mgt_bucket *b = &r->b[k];
    mgt_comm_start(r->comm, k, r->o.zero ? MGT_COLL_REDUCE_OWNERS : MGT_COLL_ALLREDUCE, r->m->g,
                   b->lo, b->count);
    b->started = 1;
    b->t_start = mgt_now();
    b->t_done = 0;
}

/* ZeRO-1: the metric sums' own all-reduce (they are final once the loss is computed). */
static void start_sums(mgt_reducer *r) {
    mgt_comm_start(r->comm, r->sums_slot, MGT_COLL_ALLREDUCE, r->m->g, (size_t)sums_at(r->m),
                   (size_t)r->m->nsums);
    r->t_sums = mgt_now();
    r->t_sums_done = 0;
}

/* Between layers: lets the requests in flight advance (the host drives them), and notes when
 * each completes. */
static void progress(mgt_reducer *r) {
    if (!r->comm->host_progress)
        return;
    for (int k = 0; k < r->nb; k++) {
        mgt_bucket *b = &r->b[k];
        if (b->started && !b->t_done && mgt_comm_test(r->comm, k))
            b->t_done = mgt_now();
    }
}

/* The listener of the step's last micro-batch: a layer's gradients, or a part of them, are
 * final. The parts come from the top of the arena down (model.h: grads_ready), so everything
 * from the lowest start heard so far up to the end is final: a bucket leaves when that mark
 * reaches its start. */
static void grads_ready(void *ctx, const mgt_layer *l, size_t offset, size_t count) {
    (void)l;
    mgt_reducer *r = ctx;
    mgt_model *m = r->m;
    const size_t top = offset + count < r->ready ? offset + count : r->ready;
    if (top > offset) { /* what is new in it */
        if (r->micro > 0) /* the earlier micro-batches' sums join this one's before it leaves */
            r->be->ops->add(r->be, top - offset, r->acc + offset, m->g + offset);
        r->ready = offset;
    }
    if (r->heard++ == 0 && r->o.zero)
        start_sums(r);
    while (r->next < r->nb && r->b[r->next].lo >= r->ready)
        start_bucket(r, r->next++);
    progress(r);
}

void mgt_reducer_listen(mgt_reducer *r, int k, int of, mgt_step *s) {
    r->micro = k;
    r->heard = 0;
    r->reducing = k + 1 == of;
    if (r->reducing) {
        for (int i = 0; i < r->nb; i++)
            r->b[i].started = r->b[i].taken = 0;
        r->ready = r->end;
        r->next = 0;
        memset(r->gather_state, 0, (size_t)r->nb + 1);
    }
    s->grads_ready = r->reducing ? grads_ready : NULL;
    s->grads_ctx = r;
    s->whole_grads = r->comm->world == 1;
}

void mgt_reducer_backward_done(mgt_reducer *r) {
    const mgt_ops *o = r->be->ops;
    mgt_model *m = r->m;
    if (!r->reducing) { /* an earlier micro-batch: its sums are kept for the last one */
        const size_t bytes = m->grad_count * sizeof(float);
        if (r->micro == 0)
            o->copy(r->be, r->acc, m->g, bytes);
        else
            o->add(r->be, m->grad_count, m->g, r->acc);
        return;
    }
    if (r->heard == 0 && r->o.zero)
        start_sums(r);
    while (r->next < r->nb) /* what lies below the lowest tensor */
        start_bucket(r, r->next++);
}

void mgt_reducer_progress(mgt_reducer *r) {
    progress(r);
}

void mgt_reducer_wait(mgt_reducer *r, int k) {
    if (k == 0 && r->o.zero) {
        mgt_comm_wait(r->comm, r->sums_slot, "metric sums all-reduce");
        r->t_sums_done = mgt_now();
    }
    mgt_bucket *b = &r->b[k];
    /* (The MPI transport moves every request in flight while it waits for this one.) */
    mgt_comm_wait(r->comm, k, r->o.zero ? "gradient reduce-scatter" : "gradient all-reduce");
    if (!b->t_done)
        b->t_done = mgt_now();
}

int mgt_reducer_next(mgt_reducer *r) {
    mgt_comm *c = r->comm;
    const int any_order = c->host_progress && !c->progress_thread && mgt_comm_requests_on(c);
    int entered = 0, k = -1;
    for (int i = 0; i < r->nb && k < 0; i++)
        if (!r->b[i].taken)
            k = i;
    while (any_order && k >= 0) {
        /* The first one complete; the ZeRO-1 metric sums go with bucket 0 (they started
         * before it). */
        int ready = -1;
        for (int i = k; i < r->nb && ready < 0; i++)
            if (!r->b[i].taken && r->b[i].started && mgt_comm_test(c, i) &&
                (i > 0 || !r->o.zero || mgt_comm_test(c, r->sums_slot)))
                ready = i;
        if (ready >= 0) {
            k = ready;
            break;
        }
        if (!entered) { /* the watchdog covers the wait */
            mgt_comm_enter(c, r->o.zero ? "gradient reduce-scatter" : "gradient all-reduce");
            entered = 1;
        }
        progress(r);
    }
    if (entered)
        mgt_comm_leave(c);
    if (k >= 0) {
        r->b[k].taken = 1;
        mgt_reducer_wait(r, k);
    }
    return k;
}

void mgt_reducer_update_range(const mgt_reducer *r, int k, size_t *lo, size_t *count) {
    size_t a = k < 0 ? 0 : r->b[k].lo;
    size_t e = k < 0 ? r->m->grad_count : r->b[k].lo + r->b[k].count;
    if (e > r->m->grad_count)
        e = r->m->grad_count;
    if (r->o.zero) {
        const int me = r->comm->rank;
        a = a > r->owners[me] ? a : r->owners[me];
        e = e < r->owners[me + 1] ? e : r->owners[me + 1];
    }
    *lo = a;
    *count = e > a ? e - a : 0;
}

void mgt_reducer_gather(mgt_reducer *r, int k, float *w) {
    if (!r->o.zero)
        return;
    size_t a = k < 0 ? 0 : r->b[k].lo;
    size_t e = k < 0 ? r->m->grad_count : r->b[k].lo + r->b[k].count;
    if (e > r->m->grad_count)
        e = r->m->grad_count;
    if (e <= a)
        return;
    const int i = k < 0 ? r->nb : k;
    mgt_comm_start(r->comm, r->gather_slot + i, MGT_COLL_GATHER_OWNERS, w, a, e - a);
    r->gather_state[i] = 1;
    r->t_gather[i] = mgt_now();
}

void mgt_reducer_gather_wait(mgt_reducer *r) {
    for (int i = 0; r->o.zero && i <= r->nb; i++)
        if (r->gather_state[i] == 1) {
            mgt_comm_wait(r->comm, r->gather_slot + i, "weight all-gather");
            r->gather_state[i] = 2;
            r->t_gather_done[i] = mgt_now();
        }
}

/* The time at least one request was in flight: the union of [start, done) intervals. */
static int cmp_iv(const void *x, const void *y) {
    const mgt_interval *p = x, *q = y;
    return (p->a > q->a) - (p->a < q->a);
}

void mgt_reducer_end_step(mgt_reducer *r, mgt_profile *p) {
    if (!p->on || p->device || !mgt_comm_requests_on(r->comm))
        return;
    mgt_interval *v = r->spans;
    int n = 0;
    const double now = mgt_now();
    const mgt_coll kind = r->o.zero ? MGT_COLL_REDUCE_OWNERS : MGT_COLL_ALLREDUCE;
    for (int k = 0; k < r->nb; k++) {
        const mgt_bucket *b = &r->b[k];
        if (!b->started)
            continue;
        const double done = b->t_done > 0 ? b->t_done : now;
        mgt_profile_request(p, k, kind, b->count * sizeof(float), b->t_start, done);
        v[n++] = (mgt_interval){b->t_start, done};
    }
    if (r->o.zero) {
        v[n++] = (mgt_interval){r->t_sums, r->t_sums_done > 0 ? r->t_sums_done : now};
        for (int i = 0; i <= r->nb; i++) /* the gathers: from each start to its wait's end */
            if (r->gather_state[i] == 2) {
                const size_t bytes =
                    (i < r->nb ? r->b[i].count : r->m->grad_count) * sizeof(float);
                mgt_profile_request(p, i < r->nb ? i : -1, MGT_COLL_GATHER_OWNERS, bytes,
                                    r->t_gather[i], r->t_gather_done[i]);
                v[n++] = (mgt_interval){r->t_gather[i], r->t_gather_done[i]};
            }
    }
    qsort(v, (size_t)n, sizeof *v, cmp_iv);
    double total = 0, a = 0, b = -1;
    for (int i = 0; i < n; i++) {
        if (v[i].a > b) {
            total += b > a ? b - a : 0;
            a = v[i].a;
            b = v[i].b;
        } else if (v[i].b > b) {
            b = v[i].b;
        }
    }
    total += b > a ? b - a : 0;
    mgt_profile_inflight(p, total);
}

void mgt_reducer_describe(const mgt_reducer *r, size_t state_floats_per_rank,
                          size_t state_floats_all, char *buf, size_t n) {
    const double mib = 1048576.0;
    size_t at = 0;
    if (r->o.bucket_mb > 0)
        at += (size_t)snprintf(
            buf + at, n - at,
            "%d gradient bucket%s (first %.3g MiB, then up to %.3g MiB) %s "
            "while backward runs",
            r->nb, r->nb == 1 ? "" : "s",
            r->o.bucket_mb < MGT_FIRST_BUCKET_MB ? r->o.bucket_mb : MGT_FIRST_BUCKET_MB,
            r->o.bucket_mb, r->o.zero ? "reduced to their owners" : "all-reduced");
    else
        at += (size_t)snprintf(buf + at, n - at, "one %s of the gradients after backward",
                               r->o.zero ? "reduce-scatter" : "all-reduce");
    if (at < n && r->o.accum_steps > 1)
        at += (size_t)snprintf(
            buf + at, n - at, "; %d micro-batches of %lld per optimizer step (%lld samples)",
            r->o.accum_steps, (long long)r->o.batch, (long long)r->o.batch * r->o.accum_steps);
    if (at >= n)
        return;
    if (r->o.zero)
        snprintf(buf + at, n - at,
                 "; optimizer state %.2f MiB per rank (ZeRO-1: its slice of %.2f MiB)",
                 (double)state_floats_per_rank * sizeof(float) / mib,
                 (double)state_floats_all * sizeof(float) / mib);
    else
        snprintf(buf + at, n - at, "; optimizer state %.2f MiB per rank",
                 (double)state_floats_per_rank * sizeof(float) / mib);
}
