/* trainer.c: the train, eval, predict and summary commands: each reads the model, sets up the
 * modules it needs in order, runs them and prints its result. The work itself is the modules':
 * placement (backend, GPU, transport), splits (data), staging (batches into backend memory),
 * replica (the state and its copies on every rank), checkpoint (files), fit (the training loop)
 * and evaluate. */
#include "trainer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "data/shard.h"
#include "default_model.h"
#include "evaluate.h"
#include "fault.h"
#include "fit.h"
#include "gpu.h"
#include "model.h"
#include "optim.h"
#include "placement.h"
#include "replica.h"
#include "repro.h"
#include "splits.h"
#include "staging.h"
#include "tensor_io.h"

void mgt_options_defaults(mgt_options *o) {
    memset(o, 0, sizeof *o);
    o->command = "train";
    o->val_split = -1;
    o->verbose = -1;
    o->comm_timeout = 300;
    o->device = "auto";
    o->synthetic_samples = 60000;
    o->device_data = 1;
    o->repro_chunk = MGT_REPRO_CHUNK_DEFAULT;
}

/* What a command works with, one module each, set up in this order. */
typedef struct session {
    mgt_runtime *rt;
    const mgt_options *o;
    mgt_model m;
    mgt_placement pl;
    mgt_optim opt;
    mgt_replica rep;
    mgt_stage st;
    mgt_splits data;
    char out[512];
} session;

/* A [train] key given on the command line; its error names the flag instead of the key. */
static void override(session *s, const char *flag, const char *key, const char *value) {
    mgt_err e;
    if (value && mgt_train_set(&s->m.train, key, value, &e) < 0)
        mgt_die_all("%s %s: %s", flag, value, strchr(e.msg, ':') ? strchr(e.msg, ':') + 2 : e.msg);
}

/* The model file (or the built-in one) with the command line's [train] overrides. */
static void load_model(session *s) {
    const mgt_options *o = s->o;
    mgt_err e;
    int rc = o->model ? mgt_model_parse(&s->m, o->model, NULL, &e)
                      : mgt_model_parse(&s->m, "examples/" MGT_DEFAULT_MODEL_NAME ".cfg",
                                        MGT_DEFAULT_MODEL_TEXT, &e);
    if (rc < 0)
        mgt_die_all("%s", e.msg);
    override(s, "--epochs", "epochs", o->epochs);
    override(s, "--batch-size", "batch_size", o->batch_size);
    override(s, "--optimizer", "optimizer", o->optimizer);
    override(s, "--lr", "learning_rate", o->lr);
    override(s, "--seed", "seed", o->seed);
    if (o->conv_algo && mgt_conv2d_set_algo(&s->m, o->conv_algo, &e) < 0)
        mgt_die_all("--conv-algo %s: %s", o->conv_algo, e.msg);
    mgt_train_cfg *t = &s->m.train;
    if (t->lr < 0)
        t->lr = mgt_optimizer_of(t->optimizer)->default_lr;
}

/* The backend and transport the options ask for, and memory for the model, its optimizer, the
 * host copies of the state and the input batches. */
static void set_up(session *s) {
    const mgt_options *o = s->o;
    const mgt_place_opts po = {.device = o->device,
                               .gpus = o->gpus,
                               .transport = o->transport,
                               .tf32 = o->tf32,
                               .comm_timeout = o->comm_timeout,
                               .one_thread = o->reproducible};
    mgt_place_init(&s->pl, s->rt, &po);
    mgt_model *m = &s->m;
    mgt_backend *be = &s->pl.be;
    const int world = s->rt->world;
    const int64_t b = m->train.batch_size;
    mgt_err e;
    /* --reproducible: ranks take whole chunks, so one may get more than an even share */
    const int64_t most =
        o->reproducible ? mgt_shard_chunks_max(b, o->repro_chunk, world) : (b + world - 1) / world;
    if (o->reproducible && mgt_repro_check(m, be, b, o->repro_chunk, &e) < 0)
        mgt_die_all("%s", e.msg);
    if (mgt_model_alloc(m, be, (int)most, &e) < 0 ||
        mgt_optim_init(&s->opt, &m->train, be, m->param_count, &e) < 0 ||
        mgt_replica_init(&s->rep, m, &s->opt, be, &s->pl.comm, &e) < 0 ||
        mgt_stage_init(&s->st, be, m, &e) < 0)
        mgt_die("%s", e.msg);
}

static void load_data(session *s, int train, const char *split) {
    const mgt_splits_opts so = {.data = s->o->data,
                                .val_split = s->o->val_split,
                                .synthetic_samples = s->o->synthetic_samples,
                                .rank = s->rt->rank};
    mgt_splits_load(&s->data, &so, &s->m, train, split);
}

static void free_session(session *s) {
    mgt_stage_free(&s->st);
    mgt_replica_free(&s->rep);
    mgt_optim_free(&s->opt, &s->pl.be);
    mgt_model_free(&s->m);
    mgt_splits_free(&s->data);
    mgt_place_free(&s->pl);
}

/* The output folder's path (--out, or runs/<model>): known early, since a resumed run reads its
 * checkpoint there; the folder is made only once everything a failed start would stop at (the
 * model, the placement, the checkpoint, the data) has passed, so a failed start leaves none. */
static void out_path(session *s) {
    const mgt_options *o = s->o;
    if (o->out)
        snprintf(s->out, sizeof s->out, "%s", o->out);
    else
        snprintf(s->out, sizeof s->out, "runs/%s", s->m.name);
}

static void make_out_dir(session *s) {
    if (s->rt->rank != 0)
        return;
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", s->out);
    for (char *p = tmp + 1;; p++) {
        int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                mgt_die("cannot create output folder %s: %s; pass --out with a writable folder",
                        tmp, strerror(errno));
            if (end)
                break;
            *p = '/';
        }
    }
}

/* OUT/run.json: what the run was, for plots and for people reading the folder later. */
static void write_run_info(session *s) {
    if (s->rt->rank != 0)
        return;
    const mgt_model *m = &s->m;
    char text[2048], path[600];
    int n =
        snprintf(text, sizeof text,
                 "{\"model\": \"%s\", \"model_file\": \"%s\", \"world\": %d, "
                 "\"nodes\": %d, \"global_batch\": %lld, \"optimizer\": \"%s\", "
                 "\"learning_rate\": %g, \"epochs\": %d, \"seed\": %llu, \"backend\": "
                 "\"%s\", \"data\": \"%s\", \"version\": \"%s\"}\n",
                 m->name, m->path, s->rt->world, s->rt->nodes, (long long)m->train.batch_size,
                 mgt_opt_name(m->train.optimizer), m->train.lr, m->train.epochs,
                 (unsigned long long)m->train.seed, s->pl.be.ops->name, s->data.desc, MGT_VERSION);
    snprintf(path, sizeof path, "%s/run.json", s->out);
    mgt_err e;
    if (mgt_atomic_write(path, text, (size_t)n, &e) < 0)
        mgt_die("%s", e.msg);
}

/* The closing lines: test figures, speed, where the weights are, and a GPU's peak memory. */
static void report_training(const session *s, const mgt_fit_result *r, double test_loss,
                            double test_acc, double t_start) {
    if (s->rt->rank != 0)
        return;
    if (test_loss >= 0)
        printf("Test loss: %.4f - test acc: %.4f\n", test_loss, test_acc);
    printf("Trained %lld steps in %.1f s (%.0f samples/s); total %.1f s; weights: "
           "%s/weights.safetensors\n",
           (long long)r->steps, r->seconds,
           r->seconds > 0 ? (double)r->steps * (double)s->m.train.batch_size / r->seconds : 0.0,
           mgt_now() - t_start, s->out);
#ifdef MGT_HAVE_CUDA
    if (!strcmp(s->pl.be.ops->name, "gpu"))
        printf("Peak GPU memory: %.1f MiB on rank 0 (mgtrain's own allocations, the CUDA "
               "context excluded)\n",
               (double)mgt_gpu_peak_bytes(&s->pl.be) / 1048576.0);
#endif
    fflush(stdout);
}

int mgt_cmd_train(mgt_runtime *rt, const mgt_options *o) {
    const double t_start = mgt_now();
    session ss = {.rt = rt, .o = o}, *s = &ss;
    load_model(s);
    mgt_model *m = &s->m;
    const int64_t B = m->train.batch_size;
    if (B < rt->world)
        mgt_die_all("%d ranks but the global batch is %lld: every rank needs at least one sample "
                    "per step; start at most %lld ranks or raise --batch-size",
                    rt->world, (long long)B, (long long)B);
    set_up(s);
    mgt_fault fault;
    mgt_fault_init(&fault, rt->rank);
    out_path(s);
    mgt_ckpt_pos pos;
    const mgt_replica_source src = {.weights = o->resume ? NULL : o->init_weights,
                                    .resume_dir = o->resume ? s->out : NULL};
    mgt_replica_start(&s->rep, &src, &pos);
    /* After the start: a resumed run's seed is the checkpoint's, and it keys synthetic data. */
    load_data(s, 1, NULL);
    make_out_dir(s);
    write_run_info(s);
    const mgt_place_run run = {.what = o->resume ? "resuming" : "training",
                               .m = m,
                               .data = s->data.desc,
                               .out = s->out,
                               .chunk = o->reproducible ? o->repro_chunk : 0};
    mgt_place_report(&s->pl, rt, &run);
    if (o->resume && rt->rank == 0)
        printf("  resumed from %s/checkpoint.safetensors at epoch %lld, step %lld\n", s->out,
               (long long)pos.epoch + 1, (long long)pos.step);

    /* A loader thread pays where the rank has a core to spare for it, or a GPU computes. */
    const mgt_stage_train_opts so = {.seed = m->train.seed,
                                     .batch = B,
                                     .rank = rt->rank,
                                     .world = rt->world,
                                     .threaded = strcmp(s->pl.be.ops->name, "cpu") ||
                                                 mgt_runtime_cores(rt) > 1,
                                     .device_data = o->device_data,
                                     .host_batches = mgt_fault_host_batches(&fault),
                                     .augment = {m->train.augment_flip, m->train.augment_crop},
                                     .chunk = o->reproducible ? o->repro_chunk : 0};
    mgt_err e;
    if (mgt_stage_train(&s->st, &s->data.train, &so, &e) < 0)
        mgt_die("%s", e.msg);
    const mgt_fit_env env = {.m = m,
                             .opt = &s->opt,
                             .be = &s->pl.be,
                             .comm = &s->pl.comm,
                             .rep = &s->rep,
                             .st = &s->st,
                             .fault = &fault,
                             .val = o->no_validation ? NULL : &s->data.val,
                             .out = s->out};
    const mgt_fit_opts fo = {.max_steps = o->max_steps,
                             .save_every = o->save_every,
                             .debug_check = o->debug_check,
                             .verbose = o->verbose,
                             .launched = rt->launched,
                             .profile = o->profile,
                             .no_tensorboard = o->no_tensorboard,
                             .timeline = o->timeline,
                             .repro_chunk = o->reproducible ? o->repro_chunk : 0};
    mgt_fit_result res;
    mgt_fit(&env, &fo, &pos, &res);

    /* The test figures: the last validation's when it was on the test split at this step;
     * none when training only (benchmarks). */
    double test_loss = -1, test_acc = -1;
    if (o->no_validation) {
    } else if (s->data.val_is_test && res.val_step == pos.step) {
        test_loss = res.val_loss;
        test_acc = res.val_acc;
    } else if (mgt_splits_test(&s->data, m)) {
        const mgt_eval ev = {.m = m, .st = &s->st, .comm = &s->pl.comm, .step = pos.step};
        const mgt_eval_sums t = mgt_eval_metrics(&ev, mgt_splits_test(&s->data, m));
        test_loss = t.loss / t.samples;
        test_acc = t.correct / t.samples;
    }
    mgt_replica_save_weights(&s->rep, s->out, pos.step);
    report_training(s, &res, test_loss, test_acc, t_start);
    free_session(s);
    return 0;
}

/* eval and predict: the weights of --weights on one split of --data. */
static void prepare_inference(session *s, const char *what) {
    const mgt_options *o = s->o;
    if (!o->weights)
        mgt_die_all("%s needs --weights FILE (e.g. runs/%s/weights.safetensors from mgtrain "
                    "train)",
                    what, s->m.name);
    set_up(s);
    load_data(s, 0, o->split);
    if (s->data.test.n < s->rt->world)
        mgt_die_all("%d ranks for %lld samples: start at most %lld ranks", s->rt->world,
                    (long long)s->data.test.n, (long long)s->data.test.n);
    snprintf(s->out, sizeof s->out, ".");
    mgt_ckpt_pos pos;
    const mgt_replica_source src = {.weights = o->weights};
    mgt_replica_start(&s->rep, &src, &pos);
}

int mgt_cmd_eval(mgt_runtime *rt, const mgt_options *o) {
    session ss = {.rt = rt, .o = o}, *s = &ss;
    load_model(s);
    prepare_inference(s, "eval");
    const double t0 = mgt_now();
    const mgt_eval ev = {.m = &s->m, .st = &s->st, .comm = &s->pl.comm};
    const mgt_eval_sums r = mgt_eval_metrics(&ev, &s->data.test);
    if (rt->rank == 0) {
        printf("%lld samples from %s (%s split) - %.1f s - loss: %.4f - acc: %.4f\n",
               (long long)r.samples, s->data.desc, o->split ? o->split : "test", mgt_now() - t0,
               r.loss / r.samples, r.correct / r.samples);
        fflush(stdout);
    }
    free_session(s);
    return 0;
}

int mgt_cmd_predict(mgt_runtime *rt, const mgt_options *o) {
    session ss = {.rt = rt, .o = o}, *s = &ss;
    load_model(s);
    if (!o->output)
        mgt_die_all("predict needs --output FILE.npy");
    prepare_inference(s, "predict");
    const mgt_model *m = &s->m;
    const mgt_dataset *ds = &s->data.test;
    const mgt_eval ev = {.m = &s->m, .st = &s->st, .comm = &s->pl.comm};
    float *all = mgt_eval_outputs(&ev, ds);
    if (rt->rank == 0) {
        mgt_err e;
        if (mgt_npy_write(o->output, all, ds->n, m->classes, &e) < 0)
            mgt_die("%s", e.msg);
        printf("wrote %s: %lld x %d float32 (%s of the last layer)\n", o->output, (long long)ds->n,
               m->classes,
               m->layers[m->nlayers - 1].act == MGT_ACT_SOFTMAX ? "softmax probabilities"
                                                                : "logits");
        fflush(stdout);
    }
    free(all);
    free_session(s);
    return 0;
}

int mgt_cmd_summary(mgt_runtime *rt, const mgt_options *o) {
    session ss = {.rt = rt, .o = o}, *s = &ss;
    load_model(s);
    if (rt->rank == 0)
        mgt_model_summary(&s->m, stdout);
    mgt_model_free(&s->m);
    return 0;
}
