/* fit.c: the training loop (see fit.h).
 *
 * One optimizer step (train_step), in phases the profiler times:
 *   data       the stager hands over this rank's part of the global batch (mgt_input);
 *   forward    layer by layer, over the local rows;
 *   backward   the loss and back-propagation: per-sample gradient SUMS into the arena (m->g),
 *              layer by layer in reverse; the step's mgt_step may name a callback that hears
 *              each layer's gradients as soon as they are final (model.h: grads_ready);
 *   all-reduce ONE collective over the whole gradient arena and the step's loss and accuracy
 *              sums, which sit right after it;
 *   update     the optimizer, with the sums divided by the global batch.
 * Under --reproducible (repro.h) forward and backward run chunk by chunk, and the all-reduce adds
 * exact integer accumulators, rounded once into the arena: the same bits on any rank count.
 * Between steps (after_step): the metric read (every step on the CPU, every 20 on a GPU, which
 * must not wait on the host each step), the --debug-check comparison, the progress bar and the
 * --save-every checkpoint. Between epochs (end_epoch): the replicas' batchnorm statistics are
 * averaged, the model is validated, the epoch line is written and a checkpoint saved.
 *
 * Where the next features go: gradient accumulation repeats data/forward/backward for K
 * micro-batches before the all-reduce; a bucketed all-reduce overlapping backward hooks into
 * grads_ready and waits for its last bucket in the all-reduce phase; clipping comes between the
 * all-reduce and the update; learning-rate schedules and sharded optimizer state (ZeRO-1) are
 * the update phase's; per-step logging and a signal-driven checkpoint-and-exit belong in
 * after_step, whose checkpoint path they can share; early stopping is end_epoch's answer. */
#include "fit.h"

#include <math.h>
#include <string.h>

#include "data/shard.h"
#include "evaluate.h"
#include "metrics.h"
#include "profile.h"
#include "repro.h"
#include "runtime.h"

/* The loop's state besides the position. */
typedef struct fit {
    const mgt_fit_env *env;
    const mgt_fit_opts *o;
    mgt_ckpt_pos *pos;
    mgt_fit_result *res;
    int64_t steps;       /* optimizer steps per epoch */
    int64_t limit;       /* stop before this step */
    size_t reduce_count; /* the gradient arena's floats and the step's two metric sums */
    mgt_profile prof;
    mgt_metrics mt;
    /* Metric sums since the last read, in backend memory; read every read_every steps. */
    float *acc;
    int64_t read_every, read_at, pending;
    double t_epoch;     /* when this epoch (or its resumed part) started */
    int64_t first_step; /* the epoch's first step in this run */
    mgt_repro *repro;   /* --reproducible's chunks and exact sums (NULL: off) */
} fit;

/* The loss and accuracy sums since the last read join the epoch's, and the loss is checked:
 * a non-finite loss stops the job before anything overwrites the last checkpoint. */
static void read_metrics(fit *f, int64_t next) {
    mgt_backend *be = f->env->be;
    float hs[2];
    be->ops->to_host(be, hs, f->acc, sizeof hs);
    be->ops->zero(be, f->acc, 2 * sizeof(float));
    if (!isfinite(hs[0]))
        mgt_die_all("the loss became %s at step %lld%s (epoch %lld): training stopped, nothing "
                    "was saved over the last checkpoint; lower --lr or check the data",
                    isnan(hs[0]) ? "NaN" : "infinite", (long long)next,
                    f->read_every > 1 ? " or just before" : "", (long long)f->pos->epoch + 1);
    double *s = f->pos->epoch_sums;
    s[0] += hs[0];
    s[1] += hs[1];
    s[2] += (double)f->pending;
    f->pending = 0;
    f->read_at = next;
}

/* Whether the metrics are read after the step that ends at `next`: every interval, and wherever
 * they are about to be used (epoch end, the last step, a checkpoint, a debug check). */
static int metrics_due(const fit *f, int64_t next) {
    const mgt_fit_opts *o = f->o;
    return next - f->read_at >= f->read_every || f->pos->step_in_epoch + 1 == f->steps ||
           next >= f->limit || (o->save_every > 0 && next % o->save_every == 0) ||
           (o->debug_check > 0 && next % o->debug_check == 0);
}

/* One optimizer step at the position (see the top of the file). */
static void train_step(fit *f) {
    const mgt_fit_env *env = f->env;
    mgt_model *m = env->m;
    mgt_backend *be = env->be;
    mgt_ckpt_pos *pos = f->pos;
    mgt_profile_begin_step(&f->prof, pos->step);

    const mgt_batch *bt = mgt_stage_next(env->st);
    if (bt->step != pos->step_in_epoch)
        mgt_die("data loader delivered step %lld for step %lld; please report this",
                (long long)bt->step, (long long)pos->step_in_epoch);
    if (bt->x) /* NULL when the batch is made on the device */
        mgt_fault_poison(env->fault, pos->step, bt->x,
                         (size_t)bt->n * (size_t)mgt_shape_elems(m->input));
    const mgt_step s = {.in = mgt_stage_put(env->st, bt),
                        .be = be,
                        .n = bt->n,
                        .training = 1,
                        .global_step = pos->step,
                        .first_sample = bt->first,
                        .global_n = bt->global_n,
                        .seed = m->train.seed,
                        .comm = env->comm,
                        .repro = f->repro};
    be->ops->zero(be, m->sums, 2 * sizeof(float));
    mgt_profile_phase(&f->prof, MGT_PH_DATA);

    mgt_model_forward(m, &s);
    mgt_profile_phase(&f->prof, MGT_PH_FORWARD);
    mgt_model_loss_backward(m, &s, 1);
    mgt_profile_phase(&f->prof, MGT_PH_BACKWARD);

    /* The one collective of the step: gradient sums and the step's loss/accuracy sums (exact
     * integer sums, rounded once, under --reproducible). */
    if (f->repro)
        mgt_repro_allreduce(f->repro, pos->step);
    else
        mgt_allreduce_sum(env->comm, m->g, f->reduce_count, "gradient all-reduce");
    mgt_profile_phase(&f->prof, MGT_PH_ALLREDUCE);
    if (f->res->steps == 0)
        mgt_fault_dump_gradients(env->fault, m, pos->step);

    /* Metrics stay in backend memory until they are read (metrics_due). */
    be->ops->add(be, 2, m->sums, f->acc);
    f->pending += bt->global_n;
    if (metrics_due(f, pos->step + 1))
        read_metrics(f, pos->step + 1);
    mgt_optim_step(env->opt, be, m->w, m->g, bt->global_n);
    mgt_stage_done(env->st);
    mgt_profile_phase(&f->prof, MGT_PH_UPDATE);
    mgt_profile_end_step(&f->prof);
    pos->step++;
    f->res->steps++;
}

/* After a step, before the position moves on to the next one. */
static void after_step(fit *f) {
    const mgt_fit_opts *o = f->o;
    mgt_ckpt_pos *pos = f->pos;
    const int64_t done = pos->step_in_epoch + 1; /* steps of this epoch behind us */
    if (o->debug_check > 0 && pos->step % o->debug_check == 0) {
        mgt_replica_check(f->env->rep, "during training (debug check)");
        mgt_profile_gap(&f->prof);
    }
    const double *s = pos->epoch_sums;
    if (f->env->comm->rank == 0 && f->mt.verbose == 1 && s[2] > 0) {
        const double el = mgt_now() - f->t_epoch;
        const double eta = el / (double)(done - f->first_step) * (double)(f->steps - done);
        mgt_metrics_progress(&f->mt, (int)pos->epoch, done, f->steps, eta, s[0] / s[2], s[1] / s[2],
                             done == f->steps);
    }
    if (o->save_every > 0 && pos->step % o->save_every == 0) {
        mgt_ckpt_pos at = *pos;
        at.step_in_epoch = done; /* the position saved is the NEXT step */
        at.optimizer_t = f->env->opt->t;
        mgt_replica_save_checkpoint(f->env->rep, f->env->out, &at);
        mgt_profile_gap(&f->prof);
    }
}

/* After the steps of an epoch (all of them, or up to the limit): validation, the epoch line and
 * a checkpoint. Returns 1 when the epoch was finished and training goes on to the next. */
static int end_epoch(fit *f, double secs, double seen_before) {
    const mgt_fit_env *env = f->env;
    mgt_ckpt_pos *pos = f->pos;
    mgt_fit_result *res = f->res;
    mgt_profile_gap(&f->prof); /* evaluation and saving are no step's */
    res->seconds += secs;
    const int finished = pos->step_in_epoch == f->steps;
    mgt_replica_average_buffers(env->rep);
    if (env->val) {
        const mgt_eval e = {.m = env->m, .st = env->st, .comm = env->comm, .step = pos->step};
        const mgt_eval_sums v = mgt_eval_metrics(&e, env->val);
        res->val_loss = v.loss / v.samples;
        res->val_acc = v.correct / v.samples;
        res->val_step = pos->step;
    }
    const double *s = pos->epoch_sums;
    const mgt_epoch_row row = {.epoch = (int)pos->epoch + 1,
                               .step = pos->step,
                               .loss = s[0] / s[2],
                               .acc = s[1] / s[2],
                               .val_loss = res->val_loss,
                               .val_acc = res->val_acc,
                               .samples_per_s = secs > 0 ? (s[2] - seen_before) / secs : 0,
                               .seconds = secs,
                               .lr = env->m->train.lr};
    mgt_err e;
    if (env->comm->rank == 0 && mgt_metrics_epoch(&f->mt, &row, &e) < 0)
        mgt_die("%s", e.msg);
    if (finished) { /* the checkpoint resumes at the next epoch's first step */
        pos->epoch++;
        pos->step_in_epoch = 0;
        memset(pos->epoch_sums, 0, sizeof pos->epoch_sums);
    }
    pos->optimizer_t = env->opt->t;
    mgt_replica_save_checkpoint(env->rep, env->out, pos);
    return finished;
}

void mgt_fit(const mgt_fit_env *env, const mgt_fit_opts *o, mgt_ckpt_pos *pos,
             mgt_fit_result *res) {
    mgt_backend *be = env->be;
    const mgt_model *m = env->m;
    const int64_t epochs = m->train.epochs;
    memset(res, 0, sizeof *res);
    res->val_step = -1;
    res->val_loss = -1;
    fit fs = {.env = env, .o = o, .pos = pos, .res = res}, *f = &fs;
    f->steps = mgt_shard_steps(env->st->train->n, m->train.batch_size);
    f->limit = o->max_steps > 0 ? o->max_steps : INT64_MAX;
    f->reduce_count = (size_t)(m->sums - m->g) + 2;
    int64_t total = epochs * f->steps - pos->epoch * f->steps - pos->step_in_epoch;
    if (f->limit - pos->step < total)
        total = f->limit - pos->step;
    mgt_err e;
    if (mgt_profile_init(&f->prof, o->profile || o->timeline, total > 0 ? total : 1, be, &e) < 0)
        mgt_die("%s", e.msg);
    mgt_metrics_init(&f->mt, env->comm->rank == 0 ? o->verbose : 0, (int)epochs, env->out,
                     o->launched);
    if (env->comm->rank == 0 && !o->no_tensorboard &&
        mgt_metrics_tb(&f->mt, &f->prof, pos->step, &e) < 0)
        mgt_die("%s", e.msg);
    /* Every step on the CPU, where a read is free; a GPU would otherwise wait on the host. */
    f->read_every = strcmp(be->ops->name, "cpu") ? 20 : 1;
    f->read_at = pos->step;
    f->acc = be->ops->alloc(be, 16 * sizeof(float));
    if (!f->acc)
        mgt_die("out of %s memory for the metric sums", be->ops->name);
    if (o->repro_chunk > 0 && !(f->repro = mgt_repro_create(env->m, env->comm, o->repro_chunk, &e)))
        mgt_die("%s", e.msg);

    while (pos->epoch < epochs && pos->step < f->limit) {
        mgt_stage_begin_epoch(env->st, pos->epoch, pos->step_in_epoch);
        f->t_epoch = mgt_now();
        f->first_step = pos->step_in_epoch;
        const double seen_before = pos->epoch_sums[2];
        for (; pos->step_in_epoch < f->steps && pos->step < f->limit; pos->step_in_epoch++) {
            mgt_fault_point(env->fault, pos->step);
            train_step(f);
            after_step(f);
        }
        if (!end_epoch(f, mgt_now() - f->t_epoch, seen_before))
            break;
    }
    if (mgt_profile_report(&f->prof, env->comm, o->timeline, &e) < 0)
        mgt_die("%s", e.msg);
    be->ops->free(be, f->acc);
    mgt_repro_free(f->repro);
    mgt_metrics_free(&f->mt);
    mgt_profile_free(&f->prof);
}
