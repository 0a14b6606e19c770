/* fit.c: the training loop (see fit.h).
 *
 * One optimizer step (train_step), in phases the profiler times:
 *   data       the stager hands over this rank's part of the global batch (mgt_input);
 *   forward    layer by layer, over the local rows;
 *   backward   the loss and back-propagation: per-sample gradient SUMS into the arena (m->g),
 *              layer by layer in reverse; the reducer hears each layer's gradients as soon as
 *              they are final (model.h: grads_ready) and sends each bucket of the arena the
 *              moment it is complete, so the sums travel while backward goes on (reducer.h);
 *   all-reduce the wait for the buckets still in flight once backward is done: the EXPOSED
 *              communication (the step's loss and accuracy sums ride in the first bucket);
 *   update     the optimizer, with the sums divided by the global batch: on the CPU bucket by
 *              bucket as each arrives, on a GPU once, queued behind all of them.
 * With gradient accumulation (--accum-steps K) data, forward and backward run for K
 * micro-batches, the buckets going out during the last one only. The global batch of a
 * micro-batch is [train] batch_size; an optimizer step takes K of them, i.e. the K x batch_size
 * samples that the same step without accumulation would take at batch_size K x batch_size:
 * micro-batch k of step s is global batch s*K + k of the epoch's permutation (shard.h), and its
 * samples keep their positions k x batch_size + i within the step's batch, which key their
 * dropout masks with the optimizer step. So K x 64 and 256 see the same samples with the same
 * masks (batchnorm's statistics, per micro-batch, are what differs). Steps, epochs, checkpoints,
 * --max-steps, --save-every and the progress bar all count optimizer steps.
 * Under --reproducible (repro.h) the step exchanges no float buckets: forward and backward run
 * chunk by chunk into exact integer accumulators (over all of a step's micro-batches), and the
 * all-reduce phase is their one integer all-reduce, rounded once into the arena and the metric
 * sums (the stop vote among them); the update then runs on the whole arena. micro_batch and
 * reduce_and_update are where the two paths part.
 * With ZeRO-1 the buckets go to their owners, each rank updates its slice, and the weights are
 * all-gathered; the all-reduce phase then also holds the wait for that gather.
 * Between steps (after_step): the metric read (every step on the CPU, every 20 on a GPU, which
 * must not wait on the host each step), the --debug-check comparison, the progress bar and the
 * --save-every checkpoint. Between epochs (end_epoch): the replicas' batchnorm statistics are
 * averaged, the model is validated, the epoch line is written and a checkpoint saved.
 *
 * The training regime: the update phase first clips the all-reduced gradient (clip.h; clipping by
 * norm needs the whole gradient, so the update then waits for every bucket first) and sets the
 * step's learning rate from the schedule (schedule.h); after_step writes the per-step rows of
 * --log-every (metrics.h); end_epoch hands a whole epoch's validation to the monitor (monitor.h:
 * best weights, early stopping, the plateau schedule's cuts), whose state the checkpoint keeps.
 *
 * Stopping on a signal (runtime.h: SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGINT) may reach one rank,
 * some or all, at any moment. A rank that has caught one writes a 1 into a third metric sum
 * (SUM_STOP) before the step's first bucket leaves, so when the sums are next read (every step on
 * the CPU, every 20 on a GPU) every rank sees the same count at the same step, and all stop after
 * that step: no rank is left waiting in a collective, and no extra collective runs per step. They
 * then agree on which signal it was, save a checkpoint at the next step's position, and training
 * returns with res->stop_signal set (the trainer exits 128 + its number). A request that comes
 * during an epoch's end is settled there, where a checkpoint has just been saved. */
#include "fit.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "clip.h"
#include "data/shard.h"
#include "evaluate.h"
#include "metrics.h"
#include "monitor.h"
#include "passes.h"
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
    int accum;           /* micro-batches per optimizer step */
    int64_t micro_steps; /* micro-batches per epoch */
    mgt_reducer red;     /* the step's gradient traffic */
    mgt_repro *repro;    /* --reproducible's chunks and exact sums instead (NULL: off) */
    int dump;            /* MGT_DUMP_GRADIENTS is set (on rank 0, which tells every rank) */
    mgt_profile prof;
    mgt_passes passes; /* how forward and backward are issued (eager, marked, replayed) */
    mgt_metrics mt;
    /* Metric sums since the last read, in backend memory; read every read_every steps. */
    float *acc;
    int64_t read_every, read_at, pending;
    double t_epoch;     /* when this epoch (or its resumed part) started */
    int64_t first_step; /* the epoch's first step in this run */
    int stop_voted;     /* some rank asked to stop: the sums read said so */
    /* The training regime (see the top). */
    mgt_sched sched;
    mgt_clip clip;
    mgt_monitor mon;
    float lr;      /* the learning rate of the last step */
    double win[4]; /* --log-every: loss sum, correct, samples, top-5 hits since the last row */
    double win_task[MGT_TASK_SUMS_MAX]; /* and the task's sums (model.h) */
    int ntask;                          /* the task's sums: mgt_model_task_sums */
    double t_win;  /* when that window started */
    int stop;      /* early stopping: no further epoch */
} fit;

/* The step's sums after the gradients (model.h: nsums of them), reduced with them: loss,
 * correct predictions, top-5 hits, the task's own, and last the number of ranks that asked to
 * stop. */
static int sum_stop(const fit *f) {
    return f->env->m->nsums - 1;
}

/* Accuracy from the correct count of `samples` samples: binary cross-entropy counts each of a
 * sample's outputs (Keras' binary accuracy); none (0) for a regression. */
static double accuracy(const fit *f, double correct, double samples) {
    const mgt_model *m = f->env->m;
    if (mgt_loss_is_regression(m->loss) || !(samples > 0))
        return 0;
    return correct / (samples * (m->loss == MGT_LOSS_BCE ? m->classes : 1));
}

/* The loss and accuracy sums since the last read join the epoch's, and the loss is checked:
 * a non-finite loss stops the job before anything overwrites the last checkpoint. */
static void read_metrics(fit *f, int64_t next) {
    mgt_backend *be = f->env->be;
    float hs[MGT_SUMS_MAX];
    const size_t bytes = (size_t)f->env->m->nsums * sizeof(float);
    be->ops->to_host(be, hs, f->acc, bytes);
    be->ops->zero(be, f->acc, bytes);
    if (hs[sum_stop(f)] > 0)
        f->stop_voted = 1;
    if (!isfinite(hs[0]))
        mgt_die_all("the loss became %s at step %lld%s (epoch %lld): training stopped, nothing "
                    "was saved over the last checkpoint; lower --lr or check the data",
                    isnan(hs[0]) ? "NaN" : "infinite", (long long)next,
                    f->read_every > 1 ? " or just before" : "", (long long)f->pos->epoch + 1);
    double *s = f->pos->epoch_sums;
    s[0] += hs[MGT_SUM_LOSS];
    s[1] += hs[MGT_SUM_CORRECT];
    s[2] += (double)f->pending;
    if (s[3] >= 0) /* -1: this epoch's top-5 is not known (checkpoint.h) */
        s[3] += hs[MGT_SUM_TOP5];
    f->win[0] += hs[MGT_SUM_LOSS];
    f->win[1] += hs[MGT_SUM_CORRECT];
    f->win[2] += (double)f->pending;
    f->win[3] += hs[MGT_SUM_TOP5];
    for (int i = 0; i < f->ntask; i++) {
        f->pos->epoch_task[i] += hs[MGT_SUM_TASK + i];
        f->win_task[i] += hs[MGT_SUM_TASK + i];
    }
    f->pending = 0;
    f->read_at = next;
}

/* Whether the metrics are read after the step that ends at `next`: every interval, and wherever
 * they are about to be used (epoch end, the last step, a checkpoint, a debug check). */
static int metrics_due(const fit *f, int64_t next) {
    const mgt_fit_opts *o = f->o;
    return next - f->read_at >= f->read_every || f->pos->step_in_epoch + 1 == f->steps ||
           next >= f->limit || (o->save_every > 0 && next % o->save_every == 0) ||
           (o->log.debug_check > 0 && next % o->log.debug_check == 0) ||
           (o->log.log_every > 0 && next % o->log.log_every == 0);
}

/* This step's learning rate from the schedule (a function of the step and the validation
 * history's cuts, the same on every rank), before mgt_optim_begin takes it. */
static void set_rate(fit *f) {
    f->lr = mgt_sched_lr(&f->sched, f->pos->step, f->pos->mon.cuts);
    f->env->opt->lr = f->lr;
}

/* This rank's vote to stop, into the step's sums before they leave (backend memory, in the order
 * of the compute queue, after the step's zeroing). */
static void stop_vote(fit *f) {
    if (!mgt_stop_signal())
        return;
    const float one = 1;
    f->env->be->ops->to_device(f->env->be, f->env->m->sums + sum_stop(f), &one, sizeof one);
}

/* Micro-batch k of the step's `of` (micro-batch `micro` of the epoch): data, forward and
 * backward. Returns its global batch's size. */
static int64_t micro_batch(fit *f, int k, int of, int64_t micro) {
    const mgt_fit_env *env = f->env;
    mgt_model *m = env->m;
    const double t_data = mgt_now();
    const mgt_batch *bt = mgt_stage_next(env->st);
    if (bt->step != micro)
        mgt_die("data loader delivered batch %lld for batch %lld; please report this",
                (long long)bt->step, (long long)micro);
    if (bt->x) /* NULL when the batch is made on the device */
        mgt_fault_poison(env->fault, f->pos->step, bt->x,
                         (size_t)bt->n * (size_t)mgt_shape_elems(m->input));
    mgt_step s = {.in = mgt_stage_put(env->st, bt),
                  .be = env->be,
                  .n = bt->n,
                  .training = 1,
                  .global_step = f->pos->step,
                  .first_sample = (int64_t)k * f->o->step.batch + bt->first,
                  .global_n = bt->global_n,
                  .seed = f->pos->seed,
                  .comm = env->comm,
                  .repro = f->repro};
    mgt_profile_data_host(&f->prof, mgt_now() - t_data);
    if (!f->repro)
        mgt_reducer_listen(&f->red, k, of, &s);
    mgt_profile_phase(&f->prof, MGT_PH_DATA);
    if (f->repro)
        mgt_repro_forward(m, &s);
    else
        mgt_passes_forward(&f->passes, &s);
    mgt_profile_phase(&f->prof, MGT_PH_FORWARD);
    if (f->repro) {
        mgt_repro_backward(m, &s, k == 0);
    } else {
        mgt_passes_backward(&f->passes, &s);
        mgt_reducer_backward_done(&f->red);
    }
    mgt_stage_done(env->st); /* every op that reads the batch is issued */
    mgt_profile_phase(&f->prof, MGT_PH_BACKWARD);
    return bt->global_n;
}

/* The step's metric sums, once their reduction is in: they stay in backend memory until they
 * are read (metrics_due). */
static void take_metrics(fit *f, int64_t global_n) {
    mgt_backend *be = f->env->be;
    be->ops->add(be, (size_t)f->env->m->nsums, f->env->m->sums, f->acc);
    f->pending += global_n;
    if (metrics_due(f, f->pos->step + 1))
        read_metrics(f, f->pos->step + 1);
}

/* MGT_DUMP_GRADIENTS (fault.h), at the run's first step: every bucket in, and under ZeRO-1 every
 * owner's part of the gradients sent to all (the update reads only its own part, unchanged).
 * Collective: every rank takes part (f->dump), rank 0 writes. */
static void dump_gradients(fit *f) {
    const mgt_fit_env *env = f->env;
    mgt_model *m = env->m;
    mgt_reducer *r = &f->red;
    if (!f->repro) { /* the exact all-reduce has already put them in place */
        for (int b = 0; b < r->nb; b++)
            mgt_reducer_wait(r, b);
        mgt_reducer_gather(r, -1, m->g);
        mgt_reducer_gather_wait(r);
    }
    mgt_fault_dump_gradients(env->fault, m, f->pos->step);
}

/* The all-reduce and update phases: each bucket's wait, then the update of what it holds (see
 * the top). The optimizer's rule is element-wise, so updating by parts gives the weights and
 * state of one update of the whole arena, bit for bit. */
static void reduce_and_update(fit *f, int64_t global_n) {
    const mgt_fit_env *env = f->env;
    mgt_model *m = env->m;
    mgt_reducer *r = &f->red;
    size_t lo, n;
    if (f->repro) /* the exact integer all-reduce instead of the buckets (repro.h) */
        mgt_repro_allreduce(f->repro, f->pos->step);
    if (f->dump && f->res->steps == 0)
        dump_gradients(f);
    const int clipping = f->clip.cfg.norm > 0 || f->clip.cfg.value > 0;
    set_rate(f);
    if (r->interleave && !clipping && !f->repro) {
        mgt_optim_begin(env->opt, global_n);
        for (int b; (b = mgt_reducer_next(r)) >= 0;) { /* in the order they arrive */
            mgt_profile_phase(&f->prof, MGT_PH_ALLREDUCE);
            if (b == 0)
                take_metrics(f, global_n);
            mgt_reducer_update_range(r, b, &lo, &n);
            mgt_optim_update(env->opt, env->be, m->w, m->g, lo, n);
            mgt_reducer_gather(r, b, m->w);
            mgt_reducer_progress(r);
            mgt_profile_phase(&f->prof, MGT_PH_UPDATE);
        }
    } else {
        for (int b = 0; b < r->nb && !f->repro; b++)
            mgt_reducer_wait(r, b);
        mgt_profile_phase(&f->prof, MGT_PH_ALLREDUCE);
        take_metrics(f, global_n);
        if (clipping) /* on the whole all-reduced gradient (clip.h) */
            mgt_clip_apply(&f->clip, env->be, m->g, m->grad_count, global_n);
        mgt_optim_begin(env->opt, global_n);
        mgt_reducer_update_range(r, -1, &lo, &n);
        mgt_optim_update(env->opt, env->be, m->w, m->g, lo, n);
        mgt_reducer_gather(r, -1, m->w);
        mgt_profile_phase(&f->prof, MGT_PH_UPDATE);
    }
    if (r->o.zero) {
        mgt_reducer_gather_wait(r);
        mgt_profile_phase(&f->prof, MGT_PH_ALLREDUCE);
    }
}

/* One optimizer step at the position (see the top of the file). */
static void train_step(fit *f) {
    mgt_ckpt_pos *pos = f->pos;
    mgt_profile_begin_step(&f->prof, pos->step);
    f->env->be->ops->zero(f->env->be, f->env->m->sums, (size_t)f->env->m->nsums * sizeof(float));
    stop_vote(f);
    /* The step's micro-batches: K, or what the epoch has left. */
    const int64_t first = pos->step_in_epoch * f->accum;
    const int of = (int)(f->micro_steps - first < f->accum ? f->micro_steps - first : f->accum);
    int64_t global_n = 0;
    for (int k = 0; k < of; k++)
        global_n += micro_batch(f, k, of, first + k);
    reduce_and_update(f, global_n);
    mgt_reducer_end_step(&f->red, &f->prof);
    mgt_profile_end_step(&f->prof);
    pos->step++;
    f->res->steps++;
}

/* Which stop request the ranks act on, the same everywhere: each rank's caught signal, counted by
 * signal over the ranks, the most urgent first (runtime.h). 0: none anywhere. Collective. */
static int agree_stop(fit *f) {
    double votes[MGT_STOP_SIGNALS];
    for (int i = 0; i < MGT_STOP_SIGNALS; i++)
        votes[i] = mgt_stop_signal() == mgt_stop_signals[i];
    mgt_allreduce_host_f64(f->env->comm, votes, MGT_STOP_SIGNALS, "stop agreement");
    for (int i = 0; i < MGT_STOP_SIGNALS; i++)
        if (votes[i] > 0)
            return mgt_stop_signals[i];
    return 0;
}

/* The stop, once the checkpoint at the position is saved: rank 0 says where and how to go on, and
 * no rank leaves before it has (a launcher ends the job when the first rank exits). */
static void stopped(fit *f, int sig) {
    const mgt_ckpt_pos *pos = f->pos;
    f->res->stop_signal = sig;
    if (f->env->comm->rank == 0) {
        if (f->mt.bar_open)
            printf("\n");
        /* The epoch the last step belonged to, 1-based, as the epoch lines count. After SIGPIPE
         * stdout has no reader: the message goes where it can be read. */
        const int64_t epoch = pos->step_in_epoch > 0 ? pos->epoch + 1 : pos->epoch;
        FILE *to = sig == SIGPIPE ? stderr : stdout;
        fprintf(to,
                "interrupted at epoch %lld step %lld (%s): checkpoint saved; resume with "
                "--resume\n",
                (long long)epoch, (long long)pos->step, mgt_signal_name(sig));
        fflush(to);
    }
    int done = 1;
    mgt_bcast(f->env->comm, &done, sizeof done, 0, "stop");
}

/* The checkpoint of a step boundary: the position saved is the NEXT step's. */
static void save_step_checkpoint(fit *f) {
    mgt_ckpt_pos at = *f->pos;
    at.step_in_epoch++;
    at.optimizer_t = f->env->opt->t;
    mgt_replica_save_checkpoint(f->env->rep, f->env->out, &at);
    mgt_profile_gap(&f->prof);
}

/* --log-every: the row of the steps since the last one (their metrics were read: metrics_due). */
static void log_step(fit *f, int64_t done) {
    const double now = mgt_now();
    mgt_step_row row = {.step = f->pos->step,
                              .epoch = (double)f->pos->epoch + (double)done / (double)f->steps,
                              .loss = f->win[2] > 0 ? f->win[0] / f->win[2] : 0,
                              .acc = f->win[2] > 0 ? f->win[1] / f->win[2] : 0,
                              .lr = f->lr,
                              .samples_per_s = now > f->t_win ? f->win[2] / (now - f->t_win) : 0,
                              .top5 = f->win[2] > 0 ? f->win[3] / f->win[2] : 0};
    mgt_figs_of(f->mt.task, f->env->m->classes, f->win_task, f->win[2], &row.task);
    row.acc = accuracy(f, f->win[1], f->win[2]);
    mgt_err e;
    if (f->env->comm->rank == 0 && mgt_metrics_step(&f->mt, &row, &e) < 0)
        mgt_die("%s", e.msg);
    memset(f->win, 0, sizeof f->win);
    memset(f->win_task, 0, sizeof f->win_task);
    f->t_win = mgt_now();
    mgt_profile_gap(&f->prof);
}

/* After a step, before the position moves on to the next one. Returns 1 when training stops here
 * (a stop request, see the top of the file), the position then moved on and saved. */
static int after_step(fit *f) {
    const mgt_fit_opts *o = f->o;
    mgt_ckpt_pos *pos = f->pos;
    const int64_t done = pos->step_in_epoch + 1; /* steps of this epoch behind us */
    if (o->log.log_every > 0 && pos->step % o->log.log_every == 0)
        log_step(f, done);
    const double t0 = mgt_now();
    if (o->log.debug_check > 0 && pos->step % o->log.debug_check == 0) {
        mgt_replica_check(f->env->rep, "during training (debug check)");
        mgt_profile_gap(&f->prof);
    }
    const double *s = pos->epoch_sums;
    if (f->env->comm->rank == 0 && f->mt.verbose == 1 && s[2] > 0) {
        /* The bar ends where this epoch will: its last step, or where --max-steps stops. */
        const int64_t left = f->limit - pos->step;
        const int64_t target = left < f->steps - done ? done + left : f->steps;
        const double el = mgt_now() - f->t_epoch;
        const double eta = el / (double)(done - f->first_step) * (double)(target - done);
        /* a regression's bar shows its mean absolute error where the others show accuracy */
        const double acc = f->mt.task == MGT_TASK_REGRESSION
                               ? pos->epoch_task[MGT_SUM_ABS] / (s[2] * f->env->m->classes)
                               : accuracy(f, s[1], s[2]);
        mgt_metrics_progress(&f->mt, (int)pos->epoch, done, target, eta, s[0] / s[2], acc,
                             s[3] >= 0 ? s[3] / s[2] : -1, done == target);
    }
    if (f->stop_voted) {
        const int sig = agree_stop(f);
        save_step_checkpoint(f);
        pos->step_in_epoch = done;
        stopped(f, sig);
        return 1;
    }
    if (o->save_every > 0 && pos->step % o->save_every == 0)
        save_step_checkpoint(f);
    f->t_win += mgt_now() - t0; /* no step's time: not in the per-step rows' samples/s */
    return 0;
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
    if (env->val && env->comm->rank == 0)
        mgt_metrics_validating(&f->mt);
    if (env->val) {
        const mgt_eval e = {.m = env->m, .st = env->st, .comm = env->comm, .step = pos->step};
        const mgt_eval_sums v = mgt_eval_metrics(&e, env->val);
        res->val_loss = v.loss / v.samples;
        res->val_acc = accuracy(f, v.correct, v.samples);
        mgt_figs_of(f->mt.task, env->m->classes, v.task, v.samples, &res->val_task);
        res->val_top5 = v.top5 / v.samples;
        res->val_step = pos->step;
        /* The lowest validation loss so far, kept in the checkpoint; best.safetensors follows
         * the monitored metric (below). */
        if (pos->best_val_loss < 0 || res->val_loss < pos->best_val_loss)
            pos->best_val_loss = res->val_loss;
    }
    const double *s = pos->epoch_sums;
    mgt_epoch_row row = {.epoch = (int)pos->epoch + 1,
                               .step = pos->step,
                               .loss = s[0] / s[2],
                               .acc = accuracy(f, s[1], s[2]),
                               .val_loss = res->val_loss,
                               .val_acc = res->val_acc,
                               .samples_per_s = secs > 0 ? (s[2] - seen_before) / secs : 0,
                               .seconds = secs,
                               .lr = f->lr,
                               .top5 = s[3] >= 0 ? s[3] / s[2] : -1,
                               .val_top5 = res->val_top5};
    mgt_figs_of(f->mt.task, env->m->classes, pos->epoch_task, s[2], &row.task);
    if (env->val)
        row.val_task = res->val_task;
    mgt_err e;
    if (env->comm->rank == 0 && mgt_metrics_epoch(&f->mt, &row, &e) < 0)
        mgt_die("%s", e.msg);
    /* Only a whole epoch's validation decides (monitor.h): best.safetensors (Keras'
     * ModelCheckpoint with save_best_only), early stopping and plateau cuts; the checkpoint below
     * keeps its state. */
    if (finished && env->val) {
        const mgt_monitor_verdict v =
            mgt_monitor_epoch(&f->mon, &pos->mon, pos->epoch + 1, res->val_loss, res->val_acc);
        if (v.improved)
            mgt_replica_save_best(env->rep, env->out, pos->step, res->val_loss);
        mgt_monitor_say(&f->mon, &pos->mon, pos->epoch + 1, pos->step, v);
        f->stop = v.stop;
    }
    if (finished) { /* the checkpoint resumes at the next epoch's first step */
        pos->epoch++;
        pos->step_in_epoch = 0;
        memset(pos->epoch_sums, 0, sizeof pos->epoch_sums);
        memset(pos->epoch_task, 0, sizeof pos->epoch_task);
    }
    pos->optimizer_t = env->opt->t;
    mgt_replica_save_checkpoint(env->rep, env->out, pos);
    /* A stop asked for during the epoch's end: the checkpoint is saved, so stop here rather than
     * after one more step (only when there is more to train). */
    if (finished && pos->epoch < f->o->regime.epochs && pos->step < f->limit) {
        const int sig = agree_stop(f);
        if (sig) {
            stopped(f, sig);
            return 0;
        }
    }
    return finished;
}

/* The schedule, clipping, the monitor and the per-step files for this run. A resumed run whose
 * history already stopped it trains no further. */
static void regime_init(fit *f) {
    const mgt_fit_env *env = f->env;
    const mgt_regime *t = &f->o->regime;
    const int rank0 = env->comm->rank == 0;
    mgt_err e;
    mgt_sched_init(&f->sched, &t->sched, t->lr, f->steps, t->epochs);
    if (mgt_clip_init(&f->clip, &t->clip, env->be, &e) < 0)
        mgt_die("%s", e.msg);
    if (t->clip.norm > 0 && f->o->step.zero)
        mgt_die_all("clip_norm needs the whole gradient, which ZeRO-1 (--zero 1) leaves in slices "
                    "on their owners; train with --zero 0 or clip by value (clip_value)");
    f->mon =
        (mgt_monitor){.cfg = t->stop, .sched = &f->sched, .print = rank0 && f->mt.verbose >= 1};
    const int64_t step = f->pos->step;
    f->lr = mgt_sched_lr(&f->sched, step > 0 ? step - 1 : 0, f->pos->mon.cuts);
    f->t_win = mgt_now();
    if (rank0 && f->o->log.log_every > 0 && mgt_metrics_steps_open(&f->mt, step, &e) < 0)
        mgt_die("%s", e.msg);
    f->stop = mgt_monitor_stopped(&f->mon, &f->pos->mon);
    if (f->stop && f->mon.print) {
        const mgt_monitor_state *h = &f->pos->mon;
        printf("Early stopping ended this run: %s has not improved for %lld epochs since epoch "
               "%lld; nothing to train (a larger --early-stop continues it)\n",
               mgt_mon_metric_name(t->stop.metric), (long long)h->wait, (long long)h->best_epoch);
        fflush(stdout);
    }
}

/* Rank 0 of a resumed run: the metrics files keep the rows up to the checkpoint. */
static void keep_history(fit *f) {
    char notice[1024];
    mgt_err e;
    const mgt_ckpt_pos *pos = f->pos;
    if (mgt_metrics_resume(&f->mt, pos->step, notice, sizeof notice, &e) < 0)
        mgt_die("%s", e.msg);
    if (notice[0])
        fprintf(stderr, "%s\n", notice);
}

/* The stager's data marks, into the profile (profile.h). */
static void stage_mark(void *ctx, int what) {
    mgt_profile_mark(ctx, what ? MGT_MARK_DATA_MAKE : MGT_MARK_DATA_WAIT);
}

/* Rank 0: a batch normalisation whose moving statistics cannot settle in the run's steps. Each
 * training forward moves them by (1 - momentum) towards the batch's statistics, so after U
 * updates momentum^U of their starting values (mean 0, variance 1) is left, and the rest is an
 * average over about the last 1 / (1 - momentum) batches' activations, weighted to the latest.
 * Evaluation and prediction normalise with them. With Keras' default of 0.99 a run of a few
 * hundred steps ends with statistics partly from its start and its first weights: a small image
 * set's ResNet trained to 0.998 and evaluated at chance, even on its own training images, after
 * 160 steps. Said once, when more than e^-3 (5%) of the start would be left at the end: the
 * average then spans less than a third of the run. */
static void bn_settle_notice(const fit *f) {
    const mgt_model *m = f->env->m;
    float momentum = 0;
    int n = 0;
    const char *first = NULL;
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        if (strcmp(l->type->name, "batchnorm") || l->frozen)
            continue; /* a frozen batchnorm normalises with its statistics and never moves them */
        if (l->cfg.momentum > momentum)
            momentum = l->cfg.momentum, first = l->name;
        n++;
    }
    if (n == 0 || momentum <= 0)
        return;
    /* The whole run's steps (a resumed run's statistics have moved since its start), each a
     * forward per micro-batch. */
    int64_t steps = f->o->regime.epochs * f->steps;
    if (steps > f->limit)
        steps = f->limit;
    const double updates = (double)steps * f->accum, left = pow(momentum, updates);
    if (steps <= 0 || left <= exp(-3.0))
        return;
    const int64_t need = (int64_t)ceil(-3.0 / log(momentum) / f->accum);
    fprintf(stderr,
            "notice: batch normalisation will not settle in this run: its moving statistics "
            "(%d batchnorm layer%s, %s%s; momentum %g, an average over about the last %.0f "
            "batches) will still be %.0f%% their starting values after the run's %lld step%s, "
            "and most of the rest from its first steps' weights, and evaluation and prediction "
            "normalise with them; set momentum = 0.9 in the [batchnorm] sections (PyTorch's "
            "default, its momentum=0.1: about the last 10 batches) or train at least %lld steps "
            "(more epochs, or a smaller --batch-size for more steps an epoch)\n",
            n, n == 1 ? "" : "s", first, n > 1 ? ", ..." : "", momentum, 1.0 / (1.0 - momentum),
            100.0 * left, (long long)steps, steps == 1 ? "" : "s", (long long)need);
    fflush(stderr);
}

/* The step's pipeline (reducer.h) and its line in the start-up block (rank 0). */
static void start_pipeline(fit *f) {
    const mgt_fit_env *env = f->env;
    mgt_err e;
    /* --reproducible: the reducer stays idle (one bucket, no accumulation arena of its own). */
    const mgt_pipeline *p = &f->o->step;
    if (p->chunk > 0 && !(f->repro = mgt_repro_create(env->m, env->comm, p->chunk, &e)))
        mgt_die("%s", e.msg);
    const mgt_reducer_opts ro = {.bucket_mb = f->repro ? 0 : p->bucket_mb,
                                 .zero = p->zero,
                                 .accum_steps = f->repro ? 1 : f->accum,
                                 .batch = p->batch};
    if (mgt_comm_set_progress(env->comm, p->progress, &e) < 0 ||
        mgt_reducer_init(&f->red, env->m, env->be, env->comm, &ro, &e) < 0)
        mgt_die("%s", e.msg);
    f->dump = env->fault->dump_gradients != NULL;
    mgt_bcast(env->comm, &f->dump, sizeof f->dump, 0, "gradient dump flag");
    if (env->comm->rank == 0 && f->o->log.verbose != 0) { /* --verbose 0: nothing but errors */
        char line[512];
        const mgt_optim *opt = env->opt;
        if (f->repro)
            mgt_repro_describe(f->repro, p->batch, line, sizeof line);
        else
            mgt_reducer_describe(&f->red, (size_t)opt->nslots * opt->n,
                                 (size_t)opt->nslots * opt->count, line, sizeof line);
        printf("  step: %s\n", line);
        fflush(stdout);
    }
}

/* restore_best_weights: every replica ends with best.safetensors' weights. They were validated at
 * another step, so the caller tests them afresh. */
static void restore_best(fit *f) {
    char path[600];
    snprintf(path, sizeof path, "%s/best.safetensors", f->env->out);
    mgt_replica_load_weights(f->env->rep, path);
    mgt_monitor_say_restored(&f->mon, &f->pos->mon, path);
    f->res->val_step = -1;
}

void mgt_fit(const mgt_fit_env *env, const mgt_fit_opts *o, mgt_ckpt_pos *pos,
             mgt_fit_result *res) {
    mgt_backend *be = env->be;
    const int64_t epochs = o->regime.epochs;
    memset(res, 0, sizeof *res);
    res->val_step = -1;
    res->val_loss = -1;
    res->val_top5 = -1;
    fit fs = {.env = env, .o = o, .pos = pos, .res = res}, *f = &fs;
    f->accum = o->step.accum_steps > 1 ? o->step.accum_steps : 1;
    f->micro_steps = mgt_shard_steps(env->st->train->n, o->step.batch);
    f->steps = mgt_shard_steps(env->st->train->n, o->step.batch * f->accum);
    f->limit = o->regime.max_steps > 0 ? o->regime.max_steps : INT64_MAX;
    int64_t total = epochs * f->steps - pos->epoch * f->steps - pos->step_in_epoch;
    if (f->limit - pos->step < total)
        total = f->limit - pos->step;
    mgt_err e;
    start_pipeline(f);
    if (env->comm->rank == 0)
        bn_settle_notice(f);
    /* Spans a step may add beyond one per phase: each micro-batch's data, forward and backward
     * phases; each bucket's wait and update phases (interleaved), its request and, under ZeRO-1,
     * its weight gather; the metric sums' request, the whole arena's gather and its wait. */
    if (mgt_profile_init(&f->prof, o->log.profile || o->log.timeline, total > 0 ? total : 1, be,
                         &e) < 0 ||
        mgt_profile_reserve_requests(&f->prof, 3 * f->accum + 4 * f->red.nb + 4, &e) < 0)
        mgt_die("%s", e.msg);
    if (mgt_profile_marks_init(&f->prof, env->m, o->log.profile_layers, o->log.precision, &e) < 0)
        mgt_die("%s", e.msg);
    if (env->st->source != MGT_STAGE_HOST) {
        env->st->mark = stage_mark;
        env->st->mark_ctx = &f->prof;
        mgt_profile_marks_source(&f->prof, env->st->source == MGT_STAGE_DEVICE_SYNTH
                                               ? "synthetic generation"
                                               : "gathered from the set kept on the device");
    } else if (env->st->staged) {
        env->st->mark = stage_mark;
        env->st->mark_ctx = &f->prof;
    }
    const mgt_passes_opts po = {.graphs = o->step.cuda_graph,
                                .comm_inside = mgt_comm_requests_on(env->comm),
                                .accum = f->accum,
                                .reproducible = f->repro != NULL};
    mgt_passes_init(&f->passes, env->m, be, &f->prof, &po);
    mgt_profile_sync(&f->prof, env->comm);
    mgt_metrics_init(&f->mt, env->comm->rank == 0 ? o->log.verbose : 0, (int)epochs, env->out,
                     o->log.launched, env->m->classes);
    if (env->m->labels_per_sample > 1) /* a language model: perplexity and bits too */
        f->mt.lm = env->m->vocab == 256 ? MGT_LM_BYTES : MGT_LM_TOKENS;
    mgt_metrics_set_task(&f->mt, mgt_task_of(env->m));
    f->ntask = mgt_model_task_sums(env->m);
    if (env->comm->rank == 0 && o->resumed)
        keep_history(f);
    if (env->comm->rank == 0 && o->log.tensorboard &&
        mgt_metrics_tb(&f->mt, &f->prof, pos->step, &e) < 0)
        mgt_die("%s", e.msg);
    /* Every step on the CPU, where a read is free; a GPU would otherwise wait on the host. */
    f->read_every = strcmp(be->ops->name, "cpu") ? 20 : 1;
    f->read_at = pos->step;
    f->acc = be->ops->alloc(be, (size_t)env->m->nsums * sizeof(float));
    if (!f->acc)
        mgt_die("out of %s memory for the metric sums", be->ops->name);
    regime_init(f);

    while (pos->epoch < epochs && pos->step < f->limit && !f->stop) {
        mgt_stage_begin_epoch(env->st, pos->epoch, pos->step_in_epoch * f->accum);
        f->t_epoch = mgt_now();
        f->first_step = pos->step_in_epoch;
        const double seen_before = pos->epoch_sums[2];
        for (; pos->step_in_epoch < f->steps && pos->step < f->limit; pos->step_in_epoch++) {
            mgt_fault_point(env->fault, pos->step);
            train_step(f);
            if (after_step(f))
                break;
        }
        const double t_end = mgt_now();
        if (res->stop_signal || !end_epoch(f, t_end - f->t_epoch, seen_before))
            break;
        f->t_win += mgt_now() - t_end; /* validation and saving: not in the per-step rows */
    }
    if (mgt_profile_report(&f->prof, env->comm, o->log.timeline, &e) < 0)
        mgt_die("%s", e.msg);
    if (o->log.profile && env->comm->rank == 0) {
        mgt_passes_report(&f->passes);
        fflush(stdout);
    }
    env->st->mark = NULL;
    mgt_passes_free(&f->passes);
    if (mgt_monitor_restores(&f->mon, &pos->mon))
        restore_best(f);
    mgt_clip_free(&f->clip, be);
    be->ops->free(be, f->acc);
    mgt_reducer_free(&f->red);
    mgt_repro_free(f->repro);
    mgt_metrics_free(&f->mt);
    mgt_profile_free(&f->prof);
}
