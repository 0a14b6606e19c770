/* trainer.c: the train, eval, predict and summary commands: each resolves its plan (run_plan.h:
 * the command line and the model file), sets up the modules it needs in order, each from its part
 * of the plan, runs them and prints its result. The work itself is the modules':
 * placement (backend, GPU, transport), splits (data), staging (batches into backend memory),
 * replica (the state and its copies on every rank), checkpoint (files), rundir (the run folder:
 * its lock, protection and run.json), fit (the training loop) and evaluate.
 *
 * Training never loses work it was not told to drop: the run folder is claimed (locked, checked
 * for another run, its checkpoint found) before anything is read from it, every check a failed
 * start can stop at comes before anything is written there, and a stop signal ends training at a
 * step boundary with a checkpoint. */
#include "trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "data/convert.h"
#include "data/shard.h"
#include "data/text.h"
#include "default_model.h"
#include "evaluate.h"
#include "export.h"
#include "generate.h"
#include "fault.h"
#include "fit.h"
#include "gpu.h"
#include "layer_cost.h"
#include "model.h"
#include "optim.h"
#include "placement.h"
#include "pretrained.h"
#include "replica.h"
#include "resume.h"
#include "run_plan.h"
#include "rundir.h"
#include "splits.h"
#include "staging.h"
#include "tensor_io.h"
#include "train_cfg.h"

/* What a command works with, one module each, set up in this order. */
typedef struct session {
    mgt_runtime *rt;
    mgt_run_plan p; /* the command's plan: each module below is set up from its part */
    mgt_model m;
    mgt_placement pl;
    mgt_optim opt;
    mgt_replica rep;
    mgt_stage st;
    mgt_splits data;
    const mgt_options *o; /* the options the plan was made from */
    const char *out;      /* the run folder (train), p.out.dir */
    mgt_rundir rd;        /* the run folder (rank 0 of train) */
    int resumed;          /* train: from the run folder's checkpoint */
} session;

/* The command's plan and its model, resolved from the command line o (errors end the job). */
static session *open_session(session *s, mgt_runtime *rt, const mgt_options *o) {
    memset(s, 0, sizeof *s);
    s->rt = rt;
    s->o = o;
    mgt_rundir_init(&s->rd, "");
    mgt_run_plan_make(&s->p, &s->m, o, rt);
    s->out = s->p.out.dir;
    return s;
}

/* m->share for the transport's shared memory (collective: every rank asks alike, and a refusal,
 * such as too little room in /dev/shm, is the same on every rank). */
static void *share_arena(void *ctx, size_t bytes) {
    mgt_err e;
    void *p = mgt_comm_share(ctx, bytes, &e);
    if (!p)
        mgt_die_all("%s", e.msg);
    return p;
}

/* AdamW decays the matrices only (optim.h): the trainable tensors of one dimension (biases,
 * norms' gains) are told to the optimizer, in arena order. */
static int skip_decay(mgt_optim *o, const mgt_model *m, mgt_err *err) {
    size_t *lo = malloc(sizeof *lo * (size_t)(m->nparams + 1));
    size_t *n = malloc(sizeof *n * (size_t)(m->nparams + 1));
    int k = 0;
    for (int i = 0; lo && n && i < m->nparams; i++) {
        const mgt_param *p = &m->params[i];
        if (p->ndim >= 2 || p->offset >= m->grad_count)
            continue;
        int j = k++; /* insertion by offset */
        for (; j > 0 && lo[j - 1] > p->offset; j--)
            lo[j] = lo[j - 1], n[j] = n[j - 1];
        lo[j] = p->offset, n[j] = p->count;
    }
    const int rc = lo && n ? mgt_optim_skip_decay(o, lo, n, k, err)
                           : mgt_errf(err, "out of host memory for the optimizer's tensors");
    free(lo);
    free(n);
    return rc;
}

/* The backend and transport the plan asks for, and memory for the model, its optimizer, the
 * host copies of the state and the input batches. */
static void set_up(session *s) {
    const mgt_run_plan *p = &s->p;
    mgt_model *m = &s->m;
    const int train = p->command == MGT_CMD_TRAIN;
    mgt_place_init(&s->pl, s->rt, &p->place);
    mgt_backend *be = &s->pl.be;
    const int world = s->rt->world;
    const mgt_pipeline *pipe = &p->step.pipeline;
    const int64_t b = pipe->batch, chunk = pipe->chunk;
    /* --reproducible: ranks take whole chunks, so one may get more than an even share */
    const int max_batch =
        (int)(chunk ? mgt_shard_chunks_max(b, chunk, world) : (b + world - 1) / world);
    mgt_err e;
    if (chunk && mgt_repro_check(m, be, &p->step.repro, &e) < 0) /* the same on every rank */
        mgt_die_all("%s", e.msg);
    if (mgt_model_check_batch(m, max_batch, &e) < 0) /* the same on every rank */
        mgt_die_all("%s", e.msg);
    /* The shared-memory transport reduces straight from the ranks' weight and gradient arenas. */
    if (mgt_comm_shares(&s->pl.comm)) {
        m->share = share_arena;
        m->share_ctx = &s->pl.comm;
    }
    /* A checkpoint resumes a run of the same optimizer step and --reproducible chunk. */
    const mgt_replica_files files = {
        .keep_checkpoints = p->out.keep_checkpoints,
        .run = {.step_batch = b * (pipe->accum_steps > 1 ? pipe->accum_steps : 1), .chunk = chunk}};
    /* ZeRO-1: this rank keeps the optimizer state of its slice of the arena only. */
    const int shards = train && pipe->zero ? world : 1;
    if (mgt_model_alloc(m, be, max_batch, &e) < 0 ||
        mgt_optim_init_sharded(&s->opt, &p->step.optim, be, m->grad_count, s->rt->rank, shards,
                               &e) < 0 ||
        skip_decay(&s->opt, m, &e) < 0 ||
        mgt_replica_init(&s->rep, m, &s->opt, be, &s->pl.comm, train ? &files : NULL, &e) < 0 ||
        mgt_stage_init(&s->st, be, m, &e) < 0)
        mgt_die("%s", e.msg);
}

/* Threads preparing this rank's batches (an image set's crops and resizes, images.h): as the plan
 * says, else the rank's cores but the one that drives the device, where a GPU computes; on the
 * CPU, whose compute takes every core, one (the loader's own). */
static int loader_threads(const session *s) {
    if (s->p.data.threads > 0)
        return s->p.data.threads;
    const int cores = mgt_runtime_cores(s->rt);
    return strcmp(s->pl.be.ops->name, "cpu") && cores > 1 ? cores - 1 : 1;
}

/* The data the plan names; seed keys synthetic data. */
static void load_data(session *s, uint64_t seed, int train) {
    mgt_splits_opts so = s->p.data;
    so.threads = loader_threads(s);
    mgt_splits_load(&s->data, &so, &s->m, seed, s->rt->rank, train);
}

static void free_session(session *s) {
    mgt_rundir_free(&s->rd);
    mgt_run_plan_free(&s->p);
    mgt_stage_free(&s->st);
    mgt_replica_free(&s->rep);
    mgt_optim_free(&s->opt, &s->pl.be);
    mgt_model_free(&s->m);
    mgt_splits_free(&s->data);
    mgt_place_free(&s->pl);
}

/* The run folder before anything is read from it. Rank 0 takes its lock (when it exists: a job
 * that writes it now is named at once), finds whether the run resumes (--resume auto: when there
 * is a checkpoint) and refuses a folder that holds another run; every rank learns the outcome,
 * and a refusal ends them all alike. The lock is given back until make_out_dir takes it for good,
 * after every check of the start: a start that fails leaves no lock behind. */
static void claim_out(session *s) {
    const mgt_out_plan *o = &s->p.out;
    const char *failed = NULL;
    char msg[1100];
    mgt_err e;
    int resume = 0;
    mgt_rundir_init(&s->rd, s->out);
    if (s->rt->rank == 0) {
        struct stat sb;
        const int exists = stat(s->out, &sb) == 0;
        char notice[1024], ckpt[600];
        snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", s->out);
        const int have = access(ckpt, F_OK) == 0;
        resume = o->resume == MGT_RESUME_REQUIRE || (o->resume == MGT_RESUME_AUTO && have);
        if (exists && !S_ISDIR(sb.st_mode)) {
            snprintf(msg, sizeof msg,
                     "--out %s exists and is not a folder; pass --out with a folder (new or "
                     "existing)",
                     s->out);
            failed = msg;
        } else if (exists && mgt_rundir_lock(&s->rd, s->rt->host, notice, sizeof notice, &e) < 0) {
            failed = e.msg;
        } else if (o->resume == MGT_RESUME_REQUIRE && !have) {
            snprintf(msg, sizeof msg,
                     "--resume: no checkpoint at %s; start without --resume (--resume auto "
                     "starts afresh when there is none), or pass the --out folder of the run to "
                     "resume",
                     ckpt);
            failed = msg;
        } else if (!resume && !o->overwrite && exists && mgt_rundir_holds_run(s->out, &e)) {
            failed = e.msg;
        } else if (exists && notice[0]) {
            fprintf(stderr, "%s\n", notice);
        }
        mgt_rundir_unlock(&s->rd);
    }
    mgt_die_all_if_root(failed);
    mgt_bcast(&s->pl.comm, &resume, sizeof resume, 0, "resume decision");
    s->resumed = resume;
}

static void make_out_dir(session *s);

/* Where the run is and how it ended, for run.json's segment. */
static void how_it_ended(char *buf, size_t n, const session *s, const mgt_fit_result *r,
                         const mgt_ckpt_pos *pos) {
    if (r->stop_signal)
        snprintf(buf, n, "interrupted by %s", mgt_signal_name(r->stop_signal));
    else if (pos->epoch < s->p.loop.epochs)
        snprintf(buf, n, "stopped at --max-steps %lld", (long long)s->p.loop.max_steps);
    else
        snprintf(buf, n, "finished");
}

/* A run whose checkpoint is already where this one would end: say so and write nothing (but the
 * weights, if the run ended before it could write them). Collective. Returns 1 if so. */
static int nothing_left(session *s, const mgt_ckpt_pos *pos) {
    const mgt_regime *o = &s->p.loop;
    const int epochs = o->epochs;
    if (pos->epoch < epochs && (o->max_steps == 0 || pos->step < o->max_steps))
        return 0;
    char path[600];
    snprintf(path, sizeof path, "%s/weights.safetensors", s->out);
    int missing = s->rt->rank == 0 && access(path, F_OK) != 0;
    mgt_bcast(&s->pl.comm, &missing, sizeof missing, 0, "weights check");
    if (missing) {
        make_out_dir(s); /* its lock */
        mgt_replica_save_weights(&s->rep, s->out, pos->step);
    }
    if (s->rt->rank == 0 && s->p.log.verbose != 0) {
        if (pos->epoch >= epochs)
            printf("nothing left to train: the run in %s has trained all its %lld epochs (%lld "
                   "steps); pass --epochs with more to train it further\n",
                   s->out, (long long)pos->epoch, (long long)pos->step);
        else
            printf("nothing left to train: the run in %s is at step %lld and --max-steps is "
                   "%lld; pass a larger --max-steps to train it further\n",
                   s->out, (long long)pos->step, (long long)o->max_steps);
        if (missing)
            printf("wrote %s from its checkpoint\n", path);
        fflush(stdout);
    }
    return 1;
}

/* Makes the output folder (rank 0, with its parents) and takes its lock until the command ends; a
 * folder that cannot be made or locked ends every rank alike. */
static void make_out_dir(session *s) {
    char tmp[512], msg[700], notice[1024];
    const char *failed = NULL;
    mgt_err e;
    snprintf(tmp, sizeof tmp, "%s", s->out);
    for (char *p = tmp + 1; s->rt->rank == 0 && !failed; p++) {
        int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
                snprintf(msg, sizeof msg,
                         "cannot create output folder %s: %s; pass --out with a writable folder",
                         tmp, strerror(errno));
                failed = msg;
            }
            if (end)
                break;
            *p = '/';
        }
    }
    if (!failed && s->rt->rank == 0) {
        if (mgt_rundir_lock(&s->rd, s->rt->host, notice, sizeof notice, &e) < 0)
            failed = e.msg;
        else if (notice[0])
            fprintf(stderr, "%s\n", notice);
    }
    mgt_die_all_if_root(failed);
}

/* Rank 0, the folder locked: what a killed writer left is removed, the old run's files with
 * --overwrite, and the run's model file copy and run.json (its new segment) are written. */
static void prepare_out(session *s, int64_t start_step, uint64_t seed) {
    if (s->rt->rank != 0)
        return;
    const mgt_model *m = &s->m;
    char notice[2048], copy[80];
    mgt_err e;
    if (mgt_rundir_clean_temporaries(&s->rd, notice, sizeof notice, &e) < 0)
        mgt_die("%s", e.msg);
    if (notice[0])
        fprintf(stderr, "%s\n", notice);
    const mgt_run_plan *p = &s->p;
    if (!s->resumed && p->out.overwrite && mgt_rundir_clear(&s->rd, &e) < 0)
        mgt_die("%s", e.msg);
    const char *text = p->model_text ? p->model_text : MGT_DEFAULT_MODEL_TEXT;
    const size_t len = p->model_text ? p->model_len : strlen(MGT_DEFAULT_MODEL_TEXT);
    snprintf(copy, sizeof copy, "%.*s.cfg", (int)sizeof m->name - 1, m->name);
    const char *flags[MGT_MAX_GIVEN_FLAGS];
    char words[8192];
    const int nflags = mgt_resume_record(s->o, flags, MGT_MAX_GIVEN_FLAGS, words, sizeof words);
    const mgt_run_info ri = {.model = m->name,
                             .model_file = m->path,
                             .model_copy = copy,
                             .optimizer = mgt_opt_name(p->step.optim.optimizer),
                             .backend = s->pl.be.ops->name,
                             .data = s->data.desc,
                             .version = MGT_VERSION,
                             .world = s->rt->world,
                             .nodes = s->rt->nodes,
                             .epochs = p->loop.epochs,
                             .global_batch = p->step.pipeline.batch,
                             .lr = p->step.optim.lr,
                             .seed = seed,
                             .flags = flags,
                             .nflags = nflags};
    if (mgt_rundir_copy_model(&s->rd, m->name, text, len, &e) < 0 ||
        mgt_rundir_begin(&s->rd, &ri, s->resumed, start_step, &e) < 0)
        mgt_die("%s", e.msg);
}

/* Rank 0: run.json's segment ends. */
static void end_segment(session *s, int64_t step, const char *how) {
    mgt_err e;
    if (s->rt->rank == 0 && mgt_rundir_end(&s->rd, step, how, &e) < 0)
        mgt_die("%s", e.msg);
}

/* Accuracy of evaluation sums: per output for binary cross-entropy (Keras' binary accuracy). */
static double eval_accuracy(const mgt_model *m, const mgt_eval_sums *t) {
    return t->correct / (t->samples * (m->loss == MGT_LOSS_BCE ? m->classes : 1));
}

/* " - acc: 0.9 - top5_acc: ...", or a regression's " - mae: ... - rmse: ...", with prefix before
 * each name ("test " or ""), into buf. */
static void task_line(const mgt_model *m, double acc, double top5, const mgt_figs *f,
                      const char *prefix, char *buf, size_t n) {
    buf[0] = 0;
    const mgt_task task = mgt_task_of(m);
    if (task != MGT_TASK_REGRESSION)
        snprintf(buf, n, " - %sacc: %.4f", prefix, acc);
    if (task == MGT_TASK_CLASSES && m->classes > 5 && top5 >= 0)
        snprintf(buf + strlen(buf), n - strlen(buf), " - %stop5_acc: %.4f", prefix, top5);
    mgt_figs_line(task, f, prefix, buf, n);
}

/* Each label's precision, recall and F1 (binary cross-entropy of several labels), as
 * scikit-learn's classification_report, with the micro average. */
static void label_table(const mgt_model *m, const double *task, FILE *out) {
    if (m->loss != MGT_LOSS_BCE || m->classes < 2 || m->classes > MGT_LABEL_SUMS_MAX)
        return;
    fprintf(out, "%10s %10s %10s %10s %10s\n", "label", "precision", "recall", "f1", "support");
    for (int j = 0; j <= m->classes; j++) { /* the labels, then their micro average */
        const int micro = j == m->classes;
        const double *c = task + (micro ? 0 : MGT_SUM_LABELS + 3 * j);
        double p, r, f1;
        mgt_figs_label(task, micro ? -1 : j, &p, &r, &f1);
        char name[16];
        snprintf(name, sizeof name, micro ? "micro avg" : "%d", j);
        fprintf(out, "%10s %10.4f %10.4f %10.4f %10.0f\n", name, p, r, f1,
                c[MGT_SUM_TP] + c[MGT_SUM_FN]);
    }
}

/* The closing lines: test figures, speed, where the weights are, and a GPU's peak memory. */
static void report_training(const session *s, const mgt_fit_result *r, double test_loss,
                            double test_acc, double test_top5, const mgt_figs *test_task,
                            double t_start) {
    if (s->rt->rank != 0 || s->p.log.verbose == 0) /* --verbose 0: nothing but errors */
        return;
    char figs[320];
    task_line(&s->m, test_acc, test_top5, test_task, "test ", figs, sizeof figs);
    if (test_loss >= 0)
        printf("Test loss: %.4f%s\n", test_loss, figs);
    printf("Trained %lld steps in %.1f s (%.0f samples/s); total %.1f s; weights: "
           "%s/weights.safetensors\n",
           (long long)r->steps, r->seconds,
           r->seconds > 0 ? (double)r->steps * (double)s->p.step.pipeline.batch *
                                s->p.step.pipeline.accum_steps / r->seconds
                          : 0.0,
           mgt_now() - t_start, s->out);
    /* Keras' "s/step": a large model's samples/s rounds to a few digits, its step time does not */
    if (r->steps > 0)
        printf("Step time: %.3f s (mean of %lld steps)\n", r->seconds / (double)r->steps,
               (long long)r->steps);
#ifdef MGT_HAVE_CUDA
    if (!strcmp(s->pl.be.ops->name, "gpu"))
        printf("Peak GPU memory: %.1f MiB on rank 0 (mgtrain's own allocations, the CUDA "
               "context excluded), of which activations %.1f MiB (the memory plan) and the "
               "convolution workspace %.1f MiB\n",
               (double)mgt_gpu_peak_bytes(&s->pl.be) / 1048576.0,
               (double)s->m.plan.arena / 1048576.0,
               (double)mgt_gpu_workspace_bytes(&s->pl.be) / 1048576.0);
#endif
    fflush(stdout);
}

int mgt_cmd_train(mgt_runtime *rt, const mgt_options *given) {
    const double t_start = mgt_now();
    /* A resumed run takes the flags its folder records, given ones after them (resume.h). */
    mgt_resume *resume = malloc(sizeof *resume);
    if (!resume)
        mgt_die("out of memory");
    const mgt_options *o = mgt_resume_options(resume, given, rt);
    session ss, *s = open_session(&ss, rt, o);
    mgt_resume_check(resume, given, &s->p, &s->m, rt);
    const mgt_run_plan *p = &s->p;
    mgt_model *m = &s->m;
    const mgt_pipeline *pipe = &p->step.pipeline;
    set_up(s);
    mgt_fault fault;
    mgt_fault_init(&fault, rt->rank);
    /* A --data folder that is not there is the first mistake to name, before the run folder. */
    mgt_err de;
    mgt_die_all_if_root(rt->rank == 0 && p->data.source == MGT_DATA_FOLDER &&
                                mgt_dataset_dir_check(p->data.dir, &de) < 0
                            ? de.msg
                            : NULL);
    claim_out(s);
    mgt_ckpt_pos pos;
    const mgt_replica_source src = {.weights = s->resumed ? NULL : p->out.init_weights,
                                    .pretrained = 1,
                                    .partial = p->out.init_partial,
                                    .map = p->out.name_map,
                                    .flag = "--init-weights",
                                    .resume_dir = s->resumed ? s->out : NULL,
                                    .seed = p->step.seed};
    mgt_replica_start(&s->rep, &src, &pos);
    /* A resumed run keeps the checkpoint's seed; one asked for by name that differs would be
     * ignored without a word (every rank has both). */
    const char *seed = p->step.seed_given;
    if (s->resumed && seed && p->step.seed != pos.seed)
        mgt_die_all("--seed %s: the run in %s was started with seed %" PRIu64 " (its checkpoint "
                    "says so), and a resumed run keeps it: it keys the shuffling, dropout and "
                    "augmentation of the steps to come; resume with --seed %" PRIu64
                    " or without --seed, or train seed %s as a new run into another --out",
                    seed, s->out, pos.seed, pos.seed, seed);
    mgt_err e;
    if (s->resumed && nothing_left(s, &pos)) {
        free_session(s);
        free(resume);
        return 0;
    }
    /* After the start: a resumed run's seed is the checkpoint's, and it keys synthetic data. */
    load_data(s, pos.seed, 1);
    mgt_resume_check_data(resume, given, s->data.desc, rt);
    if (s->resumed &&
        mgt_ckpt_check_position(&pos, s->out, s->data.train.n,
                                pipe->batch * (pipe->accum_steps > 1 ? pipe->accum_steps : 1),
                                &e) < 0) /* every rank; a step takes B x K samples */
        mgt_die_all("%s", e.msg);
    /* From here until the folder is let go a stop signal saves the work done (the loop stops at
     * a step boundary) and ends with the folder clean: the default action would kill the
     * process with the lock in place. */
    mgt_runtime_catch_stops(rt);
    make_out_dir(s);
    prepare_out(s, pos.step, pos.seed);
    const mgt_place_run run = {.what = s->resumed ? "resuming" : "training",
                               .m = m,
                               .batch = pipe->batch,
                               .optimizer = mgt_opt_name(p->step.optim.optimizer),
                               .lr = p->step.optim.lr,
                               .data = s->data.desc,
                               .out = s->out,
                               .chunk = pipe->chunk,
                               .quiet = p->log.verbose == 0};
    mgt_place_report(&s->pl, rt, &run);
    if (s->resumed && rt->rank == 0 && !run.quiet)
        printf("  resumed from %s/checkpoint.safetensors at epoch %lld, step %lld\n", s->out,
               (long long)pos.epoch + 1, (long long)pos.step);
    if (s->rep.weights_report) { /* rank 0: what --init-weights loaded */
        fputs(s->rep.weights_report, stdout);
        fflush(stdout);
    }
    if (s->resumed)
        mgt_resume_report(resume, given, rt);

    /* A loader thread pays where a GPU computes, or where reading a batch may wait for the disk
     * (it reads ahead). A synthetic batch waits for nothing: on the CPU, whose lanes hold every
     * core of the rank, a thread beside them could only take turns with them (and be woken from
     * sleep for each batch), so the lanes make it between steps instead (loader.c). The MLP's
     * `data` phase at batch 256 on a 2-core EPYC (--profile): 0.07-0.21 ms waiting for a
     * thread, 0.18 made on one, 0.09-0.12 made on the lanes. */
    const int cpu = !strcmp(s->pl.be.ops->name, "cpu");
    const mgt_stage_train_opts so = {
        .seed = pos.seed,
        .batch = pipe->batch,
        .rank = rt->rank,
        .world = rt->world,
        .threaded =
            !cpu || (mgt_runtime_cores(rt) > 1 && !mgt_dataset_is_synthetic(&s->data.train)),
        .device_data = p->step.device_data,
        .host_batches = mgt_fault_host_batches(&fault),
        .augment = p->data.augment,
        .chunk = pipe->chunk};
    if (mgt_stage_train(&s->st, &s->data.train, &so, &e) < 0)
        mgt_die("%s", e.msg);
    const mgt_fit_env env = {.m = m,
                             .opt = &s->opt,
                             .be = &s->pl.be,
                             .comm = &s->pl.comm,
                             .rep = &s->rep,
                             .st = &s->st,
                             .fault = &fault,
                             .val = p->validate ? &s->data.val : NULL,
                             .out = s->out};
    mgt_fit_opts fo = {.regime = p->loop,
                       .step = *pipe,
                       .log = p->log,
                       .save_every = p->out.save_every,
                       .resumed = s->resumed};
    if (fo.step.bucket_mb < 0)
        fo.step.bucket_mb = mgt_bucket_mb_default(s->pl.be.ops);
    mgt_fit_result res;
    mgt_fit(&env, &fo, &pos, &res);
    char how[64];
    how_it_ended(how, sizeof how, s, &res, &pos);
    if (res.stop_signal) {
        end_segment(s, pos.step, how);
        free_session(s);
        free(resume);
        mgt_runtime_release_stops(rt);
        return 128 + res.stop_signal;
    }

    /* The test figures: the last validation's when it was on the test split at this step;
     * none when training only (benchmarks). */
    double test_loss = -1, test_acc = -1, test_top5 = -1;
    mgt_figs test_task = {0};
    if (!p->validate) {
    } else if (s->data.val_is_test && res.val_step == pos.step) {
        test_loss = res.val_loss;
        test_acc = res.val_acc;
        test_top5 = res.val_top5;
        test_task = res.val_task;
    } else if (mgt_splits_test(&s->data, m)) {
        const mgt_eval ev = {.m = m, .st = &s->st, .comm = &s->pl.comm, .step = pos.step};
        const mgt_eval_sums t = mgt_eval_metrics(&ev, mgt_splits_test(&s->data, m));
        test_loss = t.loss / t.samples;
        test_acc = eval_accuracy(m, &t);
        test_top5 = t.top5 / t.samples;
        mgt_figs_of(mgt_task_of(m), m->classes, t.task, t.samples, &test_task);
    }
    mgt_replica_save_weights(&s->rep, s->out, pos.step);
    end_segment(s, pos.step, how);
    report_training(s, &res, test_loss, test_acc, test_top5, &test_task, t_start);
    free_session(s);
    free(resume);
    mgt_runtime_release_stops(rt);
    return 0;
}

/* eval and predict: the weights the plan names, on its split of the data. */
static void prepare_inference(session *s) {
    set_up(s);
    load_data(s, s->p.step.seed, 0);
    if (s->data.test.n < s->rt->world)
        mgt_die_all("%d ranks for %lld samples: start at most %lld ranks", s->rt->world,
                    (long long)s->data.test.n, (long long)s->data.test.n);
    mgt_ckpt_pos pos;
    const mgt_replica_source src = {.weights = s->p.out.weights,
                                    .map = s->p.out.name_map,
                                    .flag = "--weights",
                                    .seed = s->p.step.seed};
    mgt_replica_start(&s->rep, &src, &pos);
    if (s->rep.weights_report) { /* rank 0: what the name map loaded */
        fputs(s->rep.weights_report, stdout);
        fflush(stdout);
    }
}

int mgt_cmd_eval(mgt_runtime *rt, const mgt_options *o) {
    session ss, *s = open_session(&ss, rt, o);
    prepare_inference(s);
    const double t0 = mgt_now();
    const mgt_eval ev = {.m = &s->m, .st = &s->st, .comm = &s->pl.comm};
    const mgt_eval_sums r = mgt_eval_metrics(&ev, &s->data.test);
    /* The same global sums on every rank: a non-finite loss is no result to print. */
    if (!isfinite(r.loss))
        mgt_die_all("eval: the loss is %s on %s: the weights (%s) give non-finite outputs on this "
                    "data; they come from a run that diverged or are damaged: evaluate other "
                    "weights",
                    isnan(r.loss) ? "NaN" : "infinite", s->data.desc, s->p.out.weights);
    if (rt->rank == 0) {
        char figs[320];
        mgt_figs f;
        mgt_figs_of(mgt_task_of(&s->m), s->m.classes, r.task, r.samples, &f);
        task_line(&s->m, eval_accuracy(&s->m, &r), r.top5 / r.samples, &f, "", figs, sizeof figs);
        printf("%lld samples from %s (%s split) - %.1f s - loss: %.4f%s\n", (long long)r.samples,
               s->data.desc, mgt_split_name(s->p.data.split), mgt_now() - t0, r.loss / r.samples,
               figs);
        label_table(&s->m, r.task, stdout);
        fflush(stdout);
    }
    free_session(s);
    return 0;
}

int mgt_cmd_predict(mgt_runtime *rt, const mgt_options *o) {
    session ss, *s = open_session(&ss, rt, o);
    const char *output = s->p.out.output;
    prepare_inference(s);
    const mgt_model *m = &s->m;
    const mgt_dataset *ds = &s->data.test;
    const mgt_eval ev = {.m = &s->m, .st = &s->st, .comm = &s->pl.comm};
    float *all = mgt_eval_outputs(&ev, ds);
    /* Rank 0 holds the outputs: non-finite ones are not written as predictions. */
    const int per = m->labels_per_sample > 1 ? m->labels_per_sample : 1; /* positions */
    const size_t k = (size_t)m->classes * (size_t)per;
    size_t bad = 0, count = rt->rank == 0 ? (size_t)ds->n * k : 0;
    while (bad < count && isfinite(all[bad]))
        bad++;
    char msg[1100];
    if (bad < count)
        snprintf(msg, sizeof msg,
                 "predict: output %zu of sample %zu is %s: the weights (%.300s) give "
                 "non-finite outputs on this data; they come from a run that diverged or are "
                 "damaged: nothing was written to %.300s",
                 bad % k, bad / k,
                 isnan(all[bad]) ? "NaN" : "infinite", s->p.out.weights, output);
    mgt_die_all_if_root(bad < count ? msg : NULL);
    if (rt->rank == 0) {
        mgt_err e;
        /* a sequence model's: (samples, positions, classes) */
        const int64_t shape[3] = {ds->n, per > 1 ? per : m->classes, m->classes};
        const void *part = all;
        const size_t len = sizeof(float) * count;
        if (mgt_npy_write_parts(output, "<f4", shape, per > 1 ? 3 : 2, 1, &part, &len, &e) < 0)
            mgt_die("%s", e.msg);
        char dims[48];
        snprintf(dims, sizeof dims, per > 1 ? "%d x %d" : "%d", per > 1 ? per : m->classes,
                 m->classes);
        printf("wrote %s: %lld x %s float32 (%s of the last layer)\n", output, (long long)ds->n,
               dims, mgt_export_output_kind(m));
        fflush(stdout);
    }
    free(all);
    free_session(s);
    return 0;
}

int mgt_cmd_summary(mgt_runtime *rt, const mgt_options *o) {
    session ss, *s = open_session(&ss, rt, o);
    if (rt->rank == 0) {
        mgt_model_summary(&s->m, stdout);
        const mgt_run_plan *p = &s->p;
        mgt_train_summary(&p->train, stdout);
        mgt_model_summary_memory(&s->m, p->step.pipeline.batch, p->place.bf16 ? 2 : 4, stdout);
        const int64_t b = p->step.pipeline.batch;
        const int n = b < INT32_MAX ? (int)b : INT32_MAX;
        mgt_memory_print(&s->m, n, p->place.bf16, p->place.tf32, &p->step.optim,
                         p->step.pipeline.accum_steps, stdout);
        mgt_rates r;
        if (p->floor && mgt_rates_for(NULL, p->log.precision, 0, &r) == 0) {
            /* the batch of one GPU: the whole global batch on one rank, on an H200 */
            printf("\n");
            mgt_floor_table(&s->m, n, p->place.bf16 ? 2 : 4, &r, &p->step.optim, stdout);
        }
    }
    mgt_model_free(&s->m);
    mgt_run_plan_free(&s->p);
    return 0;
}

int mgt_cmd_export(mgt_runtime *rt, const mgt_options *o) {
    if (rt->world > 1)
        mgt_die_all("mgtrain export runs as one process; start it without mpirun or with -np 1");
    session ss, *s = open_session(&ss, rt, o);
    mgt_model *m = &s->m;
    const mgt_out_plan *out = &s->p.out;
    float *w = calloc(m->param_count + 1, sizeof *w), *buf = calloc(m->buffer_count + 1, sizeof *buf);
    char *report = NULL;
    mgt_err e;
    int rc = w && buf ? 0 : mgt_errf(&e, "out of host memory for the weights of %s", m->name);
    if (!rc && out->name_map) {
        const mgt_pretrained_opts po = {out->weights, out->name_map, 0, "--weights"};
        rc = mgt_pretrained_load(m, &po, w, buf, &report, &e);
        if (report)
            fputs(report, rc ? stderr : stdout);
    } else if (!rc) {
        rc = mgt_model_load_weights(m, out->weights, w, buf, &e);
    }
    const mgt_export_opts eo = {.keep_bn = out->keep_bn, .version = MGT_VERSION};
    if (!rc)
        rc = mgt_export_onnx(m, w, buf, &eo, out->output, &e);
    free(report);
    free(w);
    free(buf);
    if (rc)
        mgt_die_all("%s", e.msg);
    char in[96];
    const int seq = m->labels_per_sample > 1; /* a language model: [batch, sequence, vocab] */
    if (m->vocab > 0)
        snprintf(in, sizeof in, "[batch, sequence <= %d] int64 token ids", m->input.w);
    else if (m->input_rank == 1)
        snprintf(in, sizeof in, "[batch, %d] float32", m->input.c);
    else
        snprintf(in, sizeof in, "[batch, %d, %d, %d] float32 (NHWC)", m->input.h, m->input.w,
                 m->input.c);
    printf("wrote %s: model %s as ONNX (opset %d), input %s, output [batch, %s%d] (%s)%s%s\n",
           out->output, m->name, MGT_ONNX_OPSET, in, seq ? "sequence, " : "", m->classes,
           mgt_export_output_kind(m), seq ? "" : "; batchnorm ",
           seq ? "" : out->keep_bn ? "kept" : "folded where it follows a convolution");
    fflush(stdout);
    mgt_model_free(m);
    mgt_run_plan_free(&s->p);
    return 0;
}

int mgt_cmd_generate(mgt_runtime *rt, const mgt_options *o) {
    if (rt->world > 1)
        mgt_die_all("mgtrain generate samples one sequence on one process; start it without "
                    "mpirun or with -np 1");
    if (!o->prompt)
        mgt_die_all("generate needs --prompt TEXT (the text to continue)");
    session ss, *s = open_session(&ss, rt, o);
    set_up(s);
    mgt_ckpt_pos pos;
    const mgt_replica_source src = {.weights = s->p.out.weights,
                                    .map = s->p.out.name_map,
                                    .flag = "--weights",
                                    .seed = s->p.step.seed};
    mgt_replica_start(&s->rep, &src, &pos);
    const mgt_generate_opts go = {.prompt = o->prompt,
                                  .max_new = o->max_new_tokens,
                                  .temperature = o->temperature,
                                  .top_k = o->top_k,
                                  .seed = s->p.step.seed};
    mgt_err e;
    if (mgt_generate(&s->m, &go, stdout, &e) < 0)
        mgt_die_all("%s", e.msg);
    fflush(stdout);
    free_session(s);
    return 0;
}

int mgt_cmd_convert(mgt_runtime *rt, const mgt_options *o) {
    if (rt->world > 1)
        mgt_die_all("mgtrain convert runs as one process, on --threads threads (default: every "
                    "core); start it without mpirun or with -np 1");
    if (o->convert_text) { /* text into byte-level token shards (data/text.h) */
        const mgt_text_opts to = {.src = o->convert_src,
                                  .dst = o->convert_dst,
                                  .val_fraction = o->val_fraction,
                                  .verbose = o->verbose};
        mgt_text_result r;
        mgt_err e;
        if (mgt_text_convert(&to, &r, &e) < 0)
            mgt_die_all("%s", e.msg);
        if (o->verbose)
            printf("%s: %lld training and %lld validation tokens (bytes; vocab 256) from %d "
                   "file%s%s%s%s%s in %s/train.bin and %s/val.bin\n",
                   o->convert_src, (long long)r.train_tokens, (long long)r.val_tokens, r.files,
                   r.files == 1 ? "" : "s", r.skipped || r.links ? " (" : "",
                   r.skipped ? "binary files" : "", r.skipped && r.links ? " and " : "",
                   r.links     ? "links to a file read already left out)"
                   : r.skipped ? " left out)"
                               : "",
                   o->convert_dst, o->convert_dst);
        return 0;
    }
    const mgt_convert_opts co = {.src = o->convert_src,
                                 .dst = o->convert_dst,
                                 .split = o->split ? o->split : "train",
                                 .size = o->convert_size,
                                 .threads = o->convert_threads,
                                 .shard_size = o->shard_size,
                                 .skip_bad = o->skip_bad,
                                 .square = o->convert_square,
                                 .verbose = o->verbose,
                                 .host = rt->host};
    /* A stop signal (Ctrl-C, kill, a closed pipe: runtime.h) ends the conversion as it ends
     * training: the images being decoded and the shard being written are finished, the lock is
     * let go, and the process exits with 128 + the signal's number after one line. */
    mgt_runtime_catch_stops(rt);
    mgt_err e;
    const int rc = mgt_convert(&co, &e);
    const int sig = mgt_stop_signal();
    mgt_runtime_release_stops(rt);
    if (rc < 0 && sig) {
        fflush(stdout);
        fprintf(stderr, "mgtrain convert: %s\n", e.msg);
        mgt_runtime_finalize(rt);
        exit(128 + sig);
    }
    if (rc < 0)
        mgt_die_all("%s", e.msg);
    return 0;
}
