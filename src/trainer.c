/* trainer.c: the train, eval, predict and summary commands: each reads the model, sets up the
 * modules it needs in order, runs them and prints its result. The work itself is the modules':
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
#include "default_model.h"
#include "evaluate.h"
#include "fault.h"
#include "fit.h"
#include "gpu.h"
#include "layer_cost.h"
#include "model.h"
#include "optim.h"
#include "placement.h"
#include "replica.h"
#include "repro.h"
#include "rundir.h"
#include "splits.h"
#include "staging.h"
#include "tensor_io.h"
#include "train_cfg.h"

void mgt_options_defaults(mgt_options *o) {
    memset(o, 0, sizeof *o);
    o->command = "train";
    o->val_split = -1;
    o->verbose = -1;
    o->comm_timeout = 300;
    o->device = "auto";
    o->synthetic_samples = 60000;
    o->device_data = 1;
    o->keep_checkpoints = 1;
    o->bucket_mb = -1;
    o->convert_size = 256;
    o->cuda_graph = 1;
}

/* A model file larger than this is not one (the largest legitimate ones are a few kB). */
enum { MODEL_FILE_MAX = 16 << 20 };

/* What a command works with, one module each, set up in this order. */
typedef struct session {
    mgt_runtime *rt;
    const mgt_options *o;
    mgt_model m;
    mgt_train_cfg train; /* the model file's [train] section, with the command line's overrides */
    mgt_placement pl;
    mgt_optim opt;
    mgt_replica rep;
    mgt_stage st;
    mgt_splits data;
    char out[512];
    const char *model_file; /* --model, or --run's model copy; NULL: the built-in model */
    char run_model[600], run_weights[600]; /* eval, predict --run: what the folder names */
    char *model_text; /* the model file as parsed (NULL: the built-in one), for the run's copy */
    size_t model_len;
    mgt_rundir rd; /* the run folder (rank 0 of train) */
    int resumed;   /* train: from the run folder's checkpoint */
} session;

static session *open_session(session *s, mgt_runtime *rt, const mgt_options *o) {
    memset(s, 0, sizeof *s);
    s->rt = rt;
    s->o = o;
    mgt_rundir_init(&s->rd, "");
    return s;
}

/* A [train] key given on the command line; its error names the flag instead of the key. */
static void override(session *s, const char *flag, const char *key, const char *value) {
    mgt_err e;
    if (value && mgt_train_set(&s->train, key, value, &e) < 0)
        mgt_die_all("%s %s: %s", flag, value, strchr(e.msg, ':') ? strchr(e.msg, ':') + 2 : e.msg);
}

/* Without --model the built-in copy of examples/mlp.cfg trains: say so when an examples/mlp.cfg
 * here differs from it (it was edited, and the user may think it is what trains). */
static void note_builtin(const session *s) {
    const char *file = "examples/" MGT_DEFAULT_MODEL_NAME ".cfg";
    char *text = NULL;
    mgt_err e;
    if (s->rt->rank != 0 ||
        mgt_read_text_file(file, "model file", MODEL_FILE_MAX, &text, NULL, &e) < 0)
        return;
    if (strcmp(text, MGT_DEFAULT_MODEL_TEXT))
        fprintf(stderr,
                "notice: %s differs from the built-in model, which is what runs without "
                "--model; pass --model %s to use the file\n",
                file, file);
    free(text);
}

/* The model file (or the built-in one) with the command line's [train] overrides. The file is
 * read once and parsed from that text, so the copy a run keeps is what it trained. */
static void load_model(session *s) {
    const mgt_options *o = s->o;
    mgt_err e;
    int rc;
    if (!s->model_file)
        s->model_file = o->model;
    if (s->model_file) {
        if (mgt_read_text_file(s->model_file, "model file", MODEL_FILE_MAX, &s->model_text,
                               &s->model_len, &e) < 0)
            mgt_die_all("%s; pass --model with a model file such as examples/mlp.cfg", e.msg);
        rc = mgt_model_file_parse_len(&s->m, &s->train, s->model_file, s->model_text,
                                      s->model_len, &e);
    } else {
        rc = mgt_model_file_parse(&s->m, &s->train, "examples/" MGT_DEFAULT_MODEL_NAME ".cfg",
                                  MGT_DEFAULT_MODEL_TEXT, &e);
        snprintf(s->m.path, sizeof s->m.path, "built-in model");
        note_builtin(s);
    }
    if (rc < 0)
        mgt_die_all("%s", e.msg);
    override(s, "--epochs", "epochs", o->epochs);
    override(s, "--batch-size", "batch_size", o->batch_size);
    override(s, "--optimizer", "optimizer", o->optimizer);
    override(s, "--lr", "learning_rate", o->lr);
    override(s, "--seed", "seed", o->seed);
    override(s, "--accum-steps", "accum_steps", o->accum_steps);
    for (int i = 0; i < o->ntrain_keys; i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", o->train_keys[i].flag);
        override(s, flag, o->train_keys[i].key, o->train_keys[i].value);
    }
    if (o->conv_algo && mgt_conv2d_set_algo(&s->m, o->conv_algo, &e) < 0)
        mgt_die_all("--conv-algo %s: %s", o->conv_algo, e.msg);
    if (o->input_shape && mgt_model_set_input_shape(&s->m, o->input_shape, &e) < 0)
        mgt_die_all("--input-shape %s: %s", o->input_shape, e.msg);
    mgt_train_cfg *t = &s->train;
    if (t->lr < 0)
        t->lr = mgt_optimizer_of(t->optimizer)->default_lr;
    mgt_train_apply_loss(t, &s->m);
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

/* The backend and transport the options ask for, and memory for the model, its optimizer, the
 * host copies of the state and the input batches. */
static void set_up(session *s) {
    const mgt_options *o = s->o;
    mgt_model *m = &s->m;
    const mgt_train_cfg *t = &s->train;
    const int train = !strcmp(o->command, "train");
    const mgt_place_opts po = {.device = o->device,
                               .gpus = o->gpus,
                               .transport = o->transport,
                               .tf32 = o->tf32,
                               .bf16 = o->bf16,
                               .algo_cache = o->algo_cache,
                               .comm_timeout = o->comm_timeout,
                               .one_thread = train && t->reproducible,
                               .deterministic = train && t->reproducible,
                               .share_gpu = o->share_gpu};
    mgt_place_init(&s->pl, s->rt, &po);
    mgt_backend *be = &s->pl.be;
    const int world = s->rt->world;
    const int64_t b = t->batch_size;
    /* --reproducible: ranks take whole chunks, so one may get more than an even share */
    const int64_t chunk = train ? mgt_train_repro_chunk(t) : 0;
    const int max_batch =
        (int)(chunk ? mgt_shard_chunks_max(b, chunk, world) : (b + world - 1) / world);
    mgt_err e;
    const mgt_repro_opts ro = {.chunk = chunk,
                               .batch = b,
                               .accum_steps = t->accum_steps,
                               .zero = o->zero,
                               .validation_decider = mgt_train_validation_decider(t)};
    if (chunk && mgt_repro_check(m, be, &ro, &e) < 0) /* the same on every rank */
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
        .keep_checkpoints = o->keep_checkpoints,
        .run = {.step_batch = b * (t->accum_steps > 1 ? t->accum_steps : 1), .chunk = chunk}};
    /* ZeRO-1: this rank keeps the optimizer state of its slice of the arena only. */
    const int shards = train && o->zero ? world : 1;
    const mgt_optim_cfg optim = mgt_train_optim(t);
    if (mgt_model_alloc(m, be, max_batch, &e) < 0 ||
        mgt_optim_init_sharded(&s->opt, &optim, be, m->param_count, s->rt->rank, shards, &e) < 0 ||
        mgt_replica_init(&s->rep, m, &s->opt, be, &s->pl.comm, train ? &files : NULL, &e) < 0 ||
        mgt_stage_init(&s->st, be, m, &e) < 0)
        mgt_die("%s", e.msg);
}

/* Threads preparing this rank's batches (an image set's crops and resizes, images.h): the
 * rank's cores but the one that drives the device, where a GPU computes; on the CPU, whose
 * compute takes every core, one (the loader's own). */
static int loader_threads(const session *s) {
    if (s->o->loader_threads > 0)
        return s->o->loader_threads;
    const int cores = mgt_runtime_cores(s->rt);
    return strcmp(s->pl.be.ops->name, "cpu") && cores > 1 ? cores - 1 : 1;
}

static void load_data(session *s, uint64_t seed, int train, const char *split) {
    const mgt_splits_opts so = {.data = s->o->data,
                                .val_split = s->o->val_split,
                                .synthetic_samples = s->o->synthetic_samples,
                                .rank = s->rt->rank,
                                .threads = loader_threads(s),
                                .no_validation = train && s->o->no_validation,
                                .augment = mgt_train_augment(&s->train)};
    mgt_splits_load(&s->data, &so, &s->m, seed, train, split);
}

static void free_session(session *s) {
    mgt_rundir_free(&s->rd);
    free(s->model_text);
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

/* The run folder before anything is read from it. Rank 0 takes its lock (when it exists: a job
 * that writes it now is named at once), finds whether the run resumes (--resume auto: when there
 * is a checkpoint) and refuses a folder that holds another run; every rank learns the outcome,
 * and a refusal ends them all alike. The lock is given back until make_out_dir takes it for good,
 * after every check of the start: a start that fails leaves no lock behind. */
static void claim_out(session *s) {
    const mgt_options *o = s->o;
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
    else if (pos->epoch < s->train.epochs)
        snprintf(buf, n, "stopped at --max-steps %lld", (long long)s->o->max_steps);
    else
        snprintf(buf, n, "finished");
}

/* A run whose checkpoint is already where this one would end: say so and write nothing (but the
 * weights, if the run ended before it could write them). Collective. Returns 1 if so. */
static int nothing_left(session *s, const mgt_ckpt_pos *pos) {
    const mgt_options *o = s->o;
    const int epochs = s->train.epochs;
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
    if (s->rt->rank == 0) {
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
    if (!s->resumed && s->o->overwrite && mgt_rundir_clear(&s->rd, &e) < 0)
        mgt_die("%s", e.msg);
    const char *text = s->model_text ? s->model_text : MGT_DEFAULT_MODEL_TEXT;
    const size_t len = s->model_text ? s->model_len : strlen(MGT_DEFAULT_MODEL_TEXT);
    snprintf(copy, sizeof copy, "%s.cfg", m->name);
    const mgt_run_info ri = {.model = m->name,
                             .model_file = m->path,
                             .model_copy = copy,
                             .optimizer = mgt_opt_name(s->train.optimizer),
                             .backend = s->pl.be.ops->name,
                             .data = s->data.desc,
                             .version = MGT_VERSION,
                             .world = s->rt->world,
                             .nodes = s->rt->nodes,
                             .epochs = s->train.epochs,
                             .global_batch = s->train.batch_size,
                             .lr = s->train.lr,
                             .seed = seed};
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

/* The closing lines: test figures, speed, where the weights are, and a GPU's peak memory. */
static void report_training(const session *s, const mgt_fit_result *r, double test_loss,
                            double test_acc, double test_top5, double t_start) {
    if (s->rt->rank != 0)
        return;
    char top5[48] = "";
    if (s->m.classes > 5 && test_top5 >= 0)
        snprintf(top5, sizeof top5, " - test top5_acc: %.4f", test_top5);
    if (test_loss >= 0)
        printf("Test loss: %.4f - test acc: %.4f%s\n", test_loss, test_acc, top5);
    printf("Trained %lld steps in %.1f s (%.0f samples/s); total %.1f s; weights: "
           "%s/weights.safetensors\n",
           (long long)r->steps, r->seconds,
           r->seconds > 0
               ? (double)r->steps * (double)s->train.batch_size * s->train.accum_steps / r->seconds
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

int mgt_cmd_train(mgt_runtime *rt, const mgt_options *o) {
    const double t_start = mgt_now();
    session ss, *s = open_session(&ss, rt, o);
    load_model(s);
    mgt_model *m = &s->m;
    const mgt_train_cfg *t = &s->train;
    mgt_err ce;
    if (mgt_train_check(t, !o->no_validation, &ce) < 0)
        mgt_die_all("%s", ce.msg);
    const int64_t B = t->batch_size;
    if (B < rt->world)
        mgt_die_all("%d ranks but the global batch is %lld: every rank needs at least one sample "
                    "per step; start at most %lld ranks or raise --batch-size",
                    rt->world, (long long)B, (long long)B);
    set_up(s);
    mgt_fault fault;
    mgt_fault_init(&fault, rt->rank);
    out_path(s);
    claim_out(s);
    mgt_ckpt_pos pos;
    const mgt_replica_source src = {.weights = s->resumed ? NULL : o->init_weights,
                                    .resume_dir = s->resumed ? s->out : NULL,
                                    .seed = t->seed};
    const uint64_t seed = t->seed;
    mgt_replica_start(&s->rep, &src, &pos);
    /* A resumed run keeps the checkpoint's seed; one asked for by name that differs would be
     * ignored without a word (every rank has both). */
    if (s->resumed && o->seed && seed != pos.seed)
        mgt_die_all("--seed %s: the run in %s was started with seed %" PRIu64 " (its checkpoint "
                    "says so), and a resumed run keeps it: it keys the shuffling, dropout and "
                    "augmentation of the steps to come; resume with --seed %" PRIu64
                    " or without --seed, or train seed %s as a new run into another --out",
                    o->seed, s->out, pos.seed, pos.seed, o->seed);
    mgt_err e;
    if (s->resumed && nothing_left(s, &pos)) {
        free_session(s);
        return 0;
    }
    /* After the start: a resumed run's seed is the checkpoint's, and it keys synthetic data. */
    load_data(s, pos.seed, 1, NULL);
    if (s->resumed && mgt_ckpt_check_position(&pos, s->out, s->data.train.n,
                                              B * (t->accum_steps > 1 ? t->accum_steps : 1),
                                              &e) < 0) /* every rank; a step takes B x K samples */
        mgt_die_all("%s", e.msg);
    /* From here until the folder is let go a stop signal saves the work done (the loop stops at
     * a step boundary) and ends with the folder clean: the default action would kill the
     * process with the lock in place. */
    mgt_runtime_catch_stops(rt);
    make_out_dir(s);
    prepare_out(s, pos.step, pos.seed);
    const int64_t chunk = mgt_train_repro_chunk(t);
    const mgt_place_run run = {.what = s->resumed ? "resuming" : "training",
                               .m = m,
                               .batch = B,
                               .optimizer = mgt_opt_name(t->optimizer),
                               .lr = t->lr,
                               .data = s->data.desc,
                               .out = s->out,
                               .chunk = chunk};
    mgt_place_report(&s->pl, rt, &run);
    if (s->resumed && rt->rank == 0)
        printf("  resumed from %s/checkpoint.safetensors at epoch %lld, step %lld\n", s->out,
               (long long)pos.epoch + 1, (long long)pos.step);

    /* A loader thread pays where the rank has a core to spare for it, or a GPU computes. */
    const mgt_stage_train_opts so = {.seed = pos.seed,
                                     .batch = B,
                                     .rank = rt->rank,
                                     .world = rt->world,
                                     .threaded = strcmp(s->pl.be.ops->name, "cpu") ||
                                                 mgt_runtime_cores(rt) > 1,
                                     .device_data = o->device_data,
                                     .host_batches = mgt_fault_host_batches(&fault),
                                     .augment = mgt_train_augment(t),
                                     .chunk = chunk};
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
    const mgt_fit_opts fo = {
        .regime = {.epochs = t->epochs,
                   .max_steps = o->max_steps,
                   .lr = t->lr,
                   .sched = t->sched,
                   .clip = t->clip,
                   .stop = t->stop},
        .step = {.batch = B,
                 .accum_steps = t->accum_steps,
                 .chunk = chunk,
                 .bucket_mb =
                     o->bucket_mb >= 0 ? o->bucket_mb : mgt_bucket_mb_default(s->pl.be.ops),
                 .zero = o->zero,
                 .progress = o->comm_progress && !strcmp(o->comm_progress, "thread")
                                 ? MGT_PROGRESS_THREAD
                                 : MGT_PROGRESS_TEST,
                 .cuda_graph = o->cuda_graph},
        .log = {.verbose = o->verbose,
                .launched = rt->launched,
                .profile = o->profile,
                .profile_layers = o->profile_layers,
                .precision = o->bf16   ? "bf16"
                             : o->tf32 ? "tf32"
                                       : "fp32",
                .timeline = o->timeline,
                .tensorboard = !o->no_tensorboard,
                .log_every = o->log_every,
                .debug_check = o->debug_check},
        .save_every = o->save_every,
        .resumed = s->resumed};
    mgt_fit_result res;
    mgt_fit(&env, &fo, &pos, &res);
    char how[64];
    how_it_ended(how, sizeof how, s, &res, &pos);
    if (res.stop_signal) {
        end_segment(s, pos.step, how);
        free_session(s);
        mgt_runtime_release_stops(rt);
        return 128 + res.stop_signal;
    }

    /* The test figures: the last validation's when it was on the test split at this step;
     * none when training only (benchmarks). */
    double test_loss = -1, test_acc = -1, test_top5 = -1;
    if (o->no_validation) {
    } else if (s->data.val_is_test && res.val_step == pos.step) {
        test_loss = res.val_loss;
        test_acc = res.val_acc;
        test_top5 = res.val_top5;
    } else if (mgt_splits_test(&s->data, m)) {
        const mgt_eval ev = {.m = m, .st = &s->st, .comm = &s->pl.comm, .step = pos.step};
        const mgt_eval_sums t = mgt_eval_metrics(&ev, mgt_splits_test(&s->data, m));
        test_loss = t.loss / t.samples;
        test_acc = t.correct / t.samples;
        test_top5 = t.top5 / t.samples;
    }
    mgt_replica_save_weights(&s->rep, s->out, pos.step);
    end_segment(s, pos.step, how);
    report_training(s, &res, test_loss, test_acc, test_top5, t_start);
    free_session(s);
    mgt_runtime_release_stops(rt);
    return 0;
}

/* eval and predict --run DIR: the model copy and the weights of a run folder, unless --model or
 * --weights name others. Every rank reads the folder's run.json (a shared folder, or the same
 * path everywhere, as for --weights). */
static void find_run(session *s) {
    const mgt_options *o = s->o;
    mgt_err e;
    if (!o->run)
        return;
    if (mgt_rundir_find(o->run, s->run_model, s->run_weights, sizeof s->run_model, &e) < 0 &&
        !(o->model && o->weights))
        mgt_die_all("%s", e.msg);
    s->model_file = o->model ? o->model : s->run_model;
}

/* eval and predict --run without --model: the folder's model copy must be the model its
 * checkpoint was trained with (an edited copy would load the weights if the shapes fit, and
 * compute something else). Rank 0 reads the checkpoint; a mismatch ends every rank alike. */
static void check_run_model(session *s) {
    const mgt_options *o = s->o;
    if (!o->run || o->model)
        return;
    char name[64] = "", msg[1400];
    uint64_t hash = 0;
    mgt_err e;
    const char *failed = NULL;
    if (s->rt->rank == 0) {
        int rc = mgt_ckpt_model_of(o->run, name, sizeof name, &hash, &e);
        if (rc < 0) {
            failed = e.msg;
        } else if (rc > 0 &&
                   (strcmp(name, s->m.name) || (hash && hash != mgt_ckpt_model_hash(&s->m)))) {
            snprintf(msg, sizeof msg,
                     "--run %s: its model copy %s is not the model its checkpoint was trained "
                     "with (%s%s); it was changed after training: pass --model with the model "
                     "file the run trained",
                     o->run, s->run_model, strcmp(name, s->m.name) ? "model " : "",
                     strcmp(name, s->m.name) ? name : "other layers or sizes");
            failed = msg;
        }
    }
    mgt_die_all_if_root(failed);
}

static const char *weights_of(const session *s) {
    const mgt_options *o = s->o;
    return o->weights ? o->weights : o->run ? s->run_weights : NULL;
}

/* eval and predict: the weights of --weights (or of --run's folder) on one split of --data. */
static void prepare_inference(session *s, const char *what) {
    const mgt_options *o = s->o;
    const char *weights = weights_of(s);
    if (!weights)
        mgt_die_all("%s needs --weights FILE or --run DIR (e.g. --run runs/%s, the --out folder "
                    "of mgtrain train)",
                    what, s->m.name);
    set_up(s);
    load_data(s, s->train.seed, 0, o->split);
    if (s->data.test.n < s->rt->world)
        mgt_die_all("%d ranks for %lld samples: start at most %lld ranks", s->rt->world,
                    (long long)s->data.test.n, (long long)s->data.test.n);
    snprintf(s->out, sizeof s->out, ".");
    mgt_ckpt_pos pos;
    const mgt_replica_source src = {.weights = weights, .seed = s->train.seed};
    mgt_replica_start(&s->rep, &src, &pos);
}

int mgt_cmd_eval(mgt_runtime *rt, const mgt_options *o) {
    session ss, *s = open_session(&ss, rt, o);
    find_run(s);
    load_model(s);
    check_run_model(s);
    prepare_inference(s, "eval");
    const double t0 = mgt_now();
    const mgt_eval ev = {.m = &s->m, .st = &s->st, .comm = &s->pl.comm};
    const mgt_eval_sums r = mgt_eval_metrics(&ev, &s->data.test);
    /* The same global sums on every rank: a non-finite loss is no result to print. */
    if (!isfinite(r.loss))
        mgt_die_all("eval: the loss is %s on %s: the weights (%s) give non-finite outputs on this "
                    "data; they come from a run that diverged or are damaged: evaluate other "
                    "weights",
                    isnan(r.loss) ? "NaN" : "infinite", s->data.desc, weights_of(s));
    if (rt->rank == 0) {
        char top5[40] = "";
        if (s->m.classes > 5)
            snprintf(top5, sizeof top5, " - top5_acc: %.4f", r.top5 / r.samples);
        printf("%lld samples from %s (%s split) - %.1f s - loss: %.4f - acc: %.4f%s\n",
               (long long)r.samples, s->data.desc, o->split ? o->split : "test", mgt_now() - t0,
               r.loss / r.samples, r.correct / r.samples, top5);
        fflush(stdout);
    }
    free_session(s);
    return 0;
}

int mgt_cmd_predict(mgt_runtime *rt, const mgt_options *o) {
    session ss, *s = open_session(&ss, rt, o);
    find_run(s);
    load_model(s);
    check_run_model(s);
    if (!o->output)
        mgt_die_all("predict needs --output FILE.npy");
    prepare_inference(s, "predict");
    const mgt_model *m = &s->m;
    const mgt_dataset *ds = &s->data.test;
    const mgt_eval ev = {.m = &s->m, .st = &s->st, .comm = &s->pl.comm};
    float *all = mgt_eval_outputs(&ev, ds);
    /* Rank 0 holds the outputs: non-finite ones are not written as predictions. */
    size_t bad = 0, count = rt->rank == 0 ? (size_t)ds->n * (size_t)m->classes : 0;
    while (bad < count && isfinite(all[bad]))
        bad++;
    char msg[1100];
    if (bad < count)
        snprintf(msg, sizeof msg,
                 "predict: output %zu of sample %zu is %s: the weights (%.300s) give "
                 "non-finite outputs on this data; they come from a run that diverged or are "
                 "damaged: nothing was written to %.300s",
                 bad % (size_t)m->classes, bad / (size_t)m->classes,
                 isnan(all[bad]) ? "NaN" : "infinite", weights_of(s), o->output);
    mgt_die_all_if_root(bad < count ? msg : NULL);
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
    session ss, *s = open_session(&ss, rt, o);
    load_model(s);
    if (rt->rank == 0) {
        mgt_model_summary(&s->m, stdout);
        mgt_train_summary(&s->train, stdout);
        mgt_model_summary_memory(&s->m, s->train.batch_size, stdout);
        const int64_t b = s->train.batch_size;
        const mgt_optim_cfg opt = mgt_train_optim(&s->train);
        mgt_memory_print(&s->m, b < INT32_MAX ? (int)b : INT32_MAX, o->bf16, o->tf32, &opt,
                         s->train.accum_steps, stdout);
        if (o->floor) { /* the batch of one GPU: the whole global batch on one rank */
            const char *prec = o->bf16 ? "bf16" : o->tf32 ? "tf32" : "fp32";
            printf("\n");
            mgt_floor_table(&s->m, b < INT32_MAX ? (int)b : INT32_MAX, o->bf16 ? 2 : 4,
                            mgt_rates_h100(prec), &opt, stdout);
        }
    }
    mgt_model_free(&s->m);
    free(s->model_text);
    return 0;
}

int mgt_cmd_convert(mgt_runtime *rt, const mgt_options *o) {
    if (rt->world > 1)
        mgt_die_all("mgtrain convert runs as one process, on --threads threads (default: every "
                    "core); start it without mpirun or with -np 1");
    const mgt_convert_opts co = {.src = o->convert_src,
                                 .dst = o->convert_dst,
                                 .split = o->split ? o->split : "train",
                                 .size = o->convert_size,
                                 .threads = o->convert_threads,
                                 .shard_size = o->shard_size,
                                 .skip_bad = o->skip_bad,
                                 .verbose = o->verbose,
                                 .host = rt->host};
    mgt_err e;
    if (mgt_convert(&co, &e) < 0)
        mgt_die_all("%s", e.msg);
    return 0;
}
