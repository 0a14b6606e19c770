/* evaluate.c: the model on a dataset without training (see evaluate.h). */
#include "evaluate.h"

#include <stdlib.h>
#include <string.h>

#include "data/shard.h"
#include "runtime.h"

/* The outputs of one sample: its classes' scores, at every position of a sequence model. */
static size_t outputs_per_sample(const mgt_model *m) {
    return (size_t)m->classes * (size_t)(m->labels_per_sample > 1 ? m->labels_per_sample : 1);
}

/* Runs this rank's shard of ds forward. With labels: loss and accuracy sums of the shard. With
 * outputs != NULL: the shard's outputs (rows of outputs_per_sample), in dataset order. */
static mgt_eval_sums run_shard(const mgt_eval *e, const mgt_dataset *ds, int labels,
                               float *outputs) {
    mgt_model *m = e->m;
    mgt_backend *be = e->st->be;
    const mgt_ops *o = be->ops;
    const mgt_range r = mgt_shard_range(ds->n, e->comm->rank, e->comm->world);
    const size_t k = outputs_per_sample(m);
    mgt_eval_sums sums = {0, 0, (double)r.count, 0, {0}};
    const int ntask = mgt_model_task_sums(m);
    const size_t nloss = (size_t)(MGT_SUM_TASK + ntask); /* the loss op's (no stop vote) */
    o->zero(be, m->sums, nloss * sizeof(float));
    for (int64_t done = 0; done < r.count;) {
        const int n = (int)(r.count - done < m->max_batch ? r.count - done : m->max_batch);
        const mgt_step s = {.in = mgt_stage_rows(e->st, ds, r.first + done, n),
                            .be = be,
                            .n = n,
                            .training = 0,
                            .global_step = e->step,
                            .first_sample = r.first + done,
                            .global_n = ds->n,
                            .comm = e->comm}; /* no training: no dropout, no seed */
        float *out = mgt_model_forward(m, &s);
        if (labels) {
            mgt_model_loss_backward(m, &s, 0);
            /* Per-batch float sums are folded into doubles so long evaluations stay exact. */
            float hs[MGT_SUMS_MAX];
            o->to_host(be, hs, m->sums, nloss * sizeof(float));
            sums.loss += hs[MGT_SUM_LOSS];
            sums.correct += hs[MGT_SUM_CORRECT];
            sums.top5 += hs[MGT_SUM_TOP5];
            for (int i = 0; i < ntask; i++)
                sums.task[i] += hs[MGT_SUM_TASK + i];
            o->zero(be, m->sums, nloss * sizeof(float));
        } else {
            mgt_model_finish_output(m, &s, out);
        }
        if (outputs)
            o->to_host(be, outputs + (size_t)done * k, out, sizeof(float) * (size_t)n * k);
        done += n;
    }
    return sums;
}

mgt_eval_sums mgt_eval_metrics(const mgt_eval *e, const mgt_dataset *ds) {
    mgt_eval_sums s = run_shard(e, ds, 1, NULL);
    const int ntask = mgt_model_task_sums(e->m);
    double part[4 + MGT_TASK_SUMS_MAX] = {s.loss, s.correct, s.samples, s.top5};
    memcpy(part + 4, s.task, sizeof(double) * (size_t)ntask);
    mgt_allreduce_host_f64(e->comm, part, 4 + (size_t)ntask, "evaluation metrics");
    mgt_eval_sums g = {part[0], part[1], part[2], part[3], {0}};
    memcpy(g.task, part + 4, sizeof(double) * (size_t)ntask);
    return g;
}

float *mgt_eval_outputs(const mgt_eval *e, const mgt_dataset *ds) {
    const int rank = e->comm->rank, world = e->comm->world;
    const size_t k = outputs_per_sample(e->m);
    const mgt_range r = mgt_shard_range(ds->n, rank, world);
    float *mine = malloc(sizeof(float) * (size_t)(r.count ? r.count : 1) * k);
    float *all = rank == 0 ? malloc(sizeof(float) * (size_t)(ds->n ? ds->n : 1) * k) : NULL;
    size_t *counts = rank == 0 ? malloc(sizeof(size_t) * (size_t)world) : NULL;
    if (!mine || (rank == 0 && (!all || !counts)))
        mgt_die("out of host memory for %lld predictions", (long long)ds->n);
    for (int q = 0; rank == 0 && q < world; q++)
        counts[q] = (size_t)mgt_shard_range(ds->n, q, world).count * k;
    run_shard(e, ds, 0, mine);
    /* Rank order = dataset order, because each rank's shard is one contiguous range. */
    mgt_gatherv(e->comm, mine, (size_t)r.count * k, all, counts, 0, "prediction gather");
    free(mine);
    free(counts);
    return all;
}
