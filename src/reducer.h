/* reducer.h: the step's gradient traffic as a pipeline: buckets of the gradient arena reduced
 * while backward still runs, gradient accumulation over micro-batches, and ZeRO-1's reduce to
 * the owners and all-gather of the weights they updated.
 *
 * Buckets. Backward produces the gradients layer by layer from the last (model.h: grads_ready),
 * and every layer's tensors are one range of the arena, the layers' ranges in layer order; a
 * large dense layer hands its range over in parts, its bias and then its weight's row blocks
 * from the last (model.h: grad_rows). A bucket is a run of consecutive parts in that reverse
 * order, so it is one contiguous range; the buckets tile the arena from its end (the last
 * layers, plus the two metric sums that sit after the arena) to offset 0. The first bucket is
 * small (at most MGT_FIRST_BUCKET_MB) so that communication starts early, the others up to the
 * cap (--bucket-mb); a part larger than the cap is a bucket of its own; cap 0 makes ONE bucket,
 * sent when backward has ended (the one-shot all-reduce). A bucket is started the moment its
 * lowest part is heard, and the update waits for each bucket in turn (on the CPU it updates
 * each bucket as its reduction completes, in whatever order, while the others are in flight:
 * mgt_reducer_next). So a layer that holds most of the gradients (an
 * MLP's first) keeps only its last block back until backward ends, not all of them.
 * Each element is still summed by one reduction of the same addends: the grouping into messages
 * changes nothing but which elements travel together.
 *
 * Accumulation (--accum-steps K): the first K - 1 micro-batches of an optimizer step leave their
 * gradient sums in an accumulation arena (backward OVERWRITES the gradient arena, backend.h);
 * during the last one each layer's gradients get the accumulated ones added as soon as they are
 * final, and only then does its bucket go out: one reduction per optimizer step. The metric sums
 * add up across micro-batches by themselves (the loss op adds to them).
 *
 * ZeRO-1 (--zero 1): rank r owns the slice [owners[r], owners[r + 1]) of the arena
 * (mgt_comm_slice: contiguous, 16-float aligned). Buckets are REDUCE_OWNERS requests, so each
 * rank receives the summed gradients of its own slice only; the metric sums get an all-reduce of
 * their own, started with the first bucket; after the update of the owned part, the weights are
 * sent to every rank (GATHER_OWNERS), bucket by bucket where the host drives the requests. */
#ifndef MGT_REDUCER_H
#define MGT_REDUCER_H

#include <stddef.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "profile.h"
#include "util.h"

/* The first bucket's cap in MiB (PyTorch DDP's first bucket is 1 MiB too). */
#define MGT_FIRST_BUCKET_MB 1.0

/* --bucket-mb's default for a backend (see reducer.c for the measurements behind it). */
double mgt_bucket_mb_default(const mgt_ops *ops);

typedef struct mgt_interval {
    double a, b;
} mgt_interval;

typedef struct mgt_bucket {
    size_t lo, count;       /* its range of the arena */
    int started;            /* its request went out in this step */
    int taken;              /* mgt_reducer_next handed it out in this step */
    double t_start, t_done; /* host clock: sent, seen complete (the profile's spans) */
} mgt_bucket;

/* The bucket plan of model m (pure: no communication) for a backend with ops `ops` (which
 * layers hand their gradients over in parts: model.h, grad_rows; NULL: none). cap_mb <= 0: one
 * bucket. end: where the arena's reduced part ends (m->grad_count, or past the metric sums
 * when they travel in the first bucket). Writes up to max buckets into b; returns the count, or
 * -1 when more than max. */
int mgt_bucket_plan(const mgt_model *m, const mgt_ops *ops, double first_mb, double cap_mb,
                    size_t end, mgt_bucket *b, int max);

typedef struct mgt_reducer_opts {
    double bucket_mb; /* bucket cap in MiB; 0: one bucket after backward */
    int zero;         /* ZeRO-1 */
    int accum_steps;  /* micro-batches per optimizer step (>= 1) */
    int64_t batch;    /* the global batch of a micro-batch (for the description) */
} mgt_reducer_opts;

typedef struct mgt_reducer {
    mgt_model *m;
    mgt_backend *be;
    mgt_comm *comm;
    mgt_reducer_opts o;
    int nb;
    mgt_bucket *b;
    size_t end;     /* the top of the reduced part of the arena */
    size_t ready;   /* this step: [ready, end) is final (the lowest part heard) */
    int next;       /* this step: the next bucket to start */
    size_t *owners; /* ZeRO-1: world + 1 offsets */
    float *acc;     /* K > 1: the earlier micro-batches' gradient sums (backend memory) */
    int reducing;   /* this micro-batch is the step's last: its buckets go out */
    int micro;      /* this micro-batch's index within the step */
    int heard;      /* layers heard in this micro-batch */
    int interleave; /* the host drives the requests: update bucket by bucket */
    /* Request slots: buckets 0 .. nb-1; ZeRO: the metric sums, then one weight gather per bucket
     * and one for the whole arena. */
    int sums_slot, gather_slot;
    double t_sums, t_sums_done;
    /* ZeRO-1's weight gathers of this step, per bucket and the whole arena (index nb): 0 not
     * started, 1 started, 2 waited for; and when they started and were seen complete. */
    char *gather_state;
    double *t_gather, *t_gather_done;
    mgt_interval *spans; /* mgt_reducer_end_step: every request's [start, done), for their union */
} mgt_reducer;

/* Collective (reserves the transport's slots): the plan for m over comm. */
int mgt_reducer_init(mgt_reducer *r, mgt_model *m, mgt_backend *be, mgt_comm *comm,
                     const mgt_reducer_opts *o, mgt_err *err);
void mgt_reducer_free(mgt_reducer *r);

/* Before micro-batch k (from 0) of the step's `of`: sets s's listener (grads_ready). */
void mgt_reducer_listen(mgt_reducer *r, int k, int of, mgt_step *s);
/* After that micro-batch's backward: keeps an earlier micro-batch's gradients, or sends what the
 * last one left unsent. */
void mgt_reducer_backward_done(mgt_reducer *r);

/* Lets the requests in flight advance where the host drives them (between the update's parts). */
void mgt_reducer_progress(mgt_reducer *r);
/* Where the host drives the requests and tests them itself (MPI, --comm-progress test): the
 * bucket to update next, the first of those not yet handed out in this step whose reduction is
 * complete, waiting (and testing every one) until one is; with mgt_reducer_wait's effect done.
 * Elsewhere the next bucket in order, waited for. -1 when every bucket has been handed out. */
int mgt_reducer_next(mgt_reducer *r);
/* Bucket b's reduced gradients (and, for b == 0, the metric sums) are in place for every op
 * issued after this (CPU: returns when they are; GPU: the compute stream waits for them). */
void mgt_reducer_wait(mgt_reducer *r, int b);
/* The part of bucket b the update of this rank works on: within the parameters, and within
 * this rank's slice under ZeRO-1 (count 0: none). b = -1: the whole of that. */
void mgt_reducer_update_range(const mgt_reducer *r, int b, size_t *lo, size_t *count);
/* ZeRO-1: sends this rank's updated part of bucket b (-1: of the whole arena) of w to every
 * rank; mgt_reducer_gather_wait makes all of them arrive. No-ops without ZeRO. */
void mgt_reducer_gather(mgt_reducer *r, int b, float *w);
void mgt_reducer_gather_wait(mgt_reducer *r);

/* After the step: each bucket's span and the time any request was in flight go to the profile
 * (host timing only: a device times its own phases). */
void mgt_reducer_end_step(mgt_reducer *r, mgt_profile *p);

/* One line for the start-up block: buckets, accumulation, ZeRO-1's state per rank. */
void mgt_reducer_describe(const mgt_reducer *r, size_t state_floats_per_rank,
                          size_t state_floats_all, char *buf, size_t n);

#endif
