/* trainer.c: the train, eval, predict and summary commands over the data-parallel runtime. */
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shard.h"
#include "default_model.h"
#include "fault.h"
#include "gpu.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"
#include "parse.h"
#include "placement.h"
#include "profile.h"
#include "staging.h"

void mgt_options_defaults(mgt_options *o) {
    memset(o, 0, sizeof *o);
    o->command = "train";
    o->val_split = -1;
    o->verbose = -1;
    o->comm_timeout = 300;
    o->device = "auto";
    o->synthetic_samples = 60000;
    o->device_data = 1;
}

/* Everything one command works with. */
typedef struct job {
    mgt_runtime *rt;
    const mgt_options *o;
    mgt_model m;
    mgt_placement pl;
    mgt_optim opt;
    mgt_dataset train, val, test;
    int val_is_test, have_val, have_test;
    int synthetic;
    char data_dir[512];
    char data_desc[600];
    float *acc;         /* backend memory: metric sums since the last read */
    float *hw, *hbuf;   /* host copies of the arenas */
    mgt_stage st;
    float *hslot[2];
    size_t reduce_count; /* gradient floats + the step's metric sums */
    char out[512];
    int64_t global_step, step_in_epoch;
    int epoch;
    double ep[3];       /* this epoch so far: loss sum, correct, samples */
    mgt_fault fault;
} job;

/* ---- set-up ------------------------------------------------------------------------------ */

static void override(job *j, const char *flag, const char *key, const char *value) {
    mgt_err e;
    if (value && mgt_train_set(&j->m.train, key, value, &e) < 0)
        mgt_die_all("%s %s: %s", flag, value, strchr(e.msg, ':') ? strchr(e.msg, ':') + 2 : e.msg);
}

static void load_model(job *j) {
    const mgt_options *o = j->o;
    mgt_err e;
    int rc = o->model ? mgt_model_parse(&j->m, o->model, NULL, &e)
                      : mgt_model_parse(&j->m, "examples/" MGT_DEFAULT_MODEL_NAME ".cfg",
                                        MGT_DEFAULT_MODEL_TEXT, &e);
    if (rc < 0)
        mgt_die_all("%s", e.msg);
    override(j, "--epochs", "epochs", o->epochs);
    override(j, "--batch-size", "batch_size", o->batch_size);
    override(j, "--optimizer", "optimizer", o->optimizer);
    override(j, "--lr", "learning_rate", o->lr);
    override(j, "--seed", "seed", o->seed);
    mgt_train_cfg *t = &j->m.train;
    if (t->lr < 0)
        t->lr = t->optimizer == MGT_OPT_SGD ? 0.01f : 0.001f;
}

/* The backend and transport the command's options ask for. */
static void init_backend(job *j) {
    const mgt_options *o = j->o;
    mgt_place_opts po = {.device = o->device, .gpus = o->gpus, .transport = o->transport,
                         .tf32 = o->tf32, .comm_timeout = o->comm_timeout};
    mgt_place_init(&j->pl, j->rt, &po);
}

static int idx_present(const char *dir, const char *stem) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, stem);
    if (access(p, R_OK) == 0)
        return 1;
    snprintf(p, sizeof p, "%s/%s.gz", dir, stem);
    return access(p, R_OK) == 0;
}

/* Loads what the command needs: train (and validation) for train, one split otherwise. */
static void load_data(job *j, int want_train, const char *eval_split) {
    const mgt_options *o = j->o;
    mgt_model *m = &j->m;
    const char *dir = o->data;
    int synthetic = dir && !strcmp(dir, "synthetic");
    if (!dir) {
        dir = MGT_DEFAULT_DATA;
        if (!idx_present(dir, "train-images-idx3-ubyte")) {
            synthetic = 1;
            if (j->rt->rank == 0)
                fprintf(stderr, "notice: no Fashion-MNIST in %s (apt-get install "
                        "dataset-fashion-mnist); using SYNTHETIC data instead\n", dir);
        }
    }
    if (!synthetic && m->input.c != 1)
        mgt_die_all("%s: IDX images have 1 channel but the model's [input] shape has %d; use "
                    "--data synthetic or a 1-channel model", dir, m->input.c);
    mgt_err e;
    uint64_t seed = m->train.seed;
    int h = m->input.h, w = m->input.w, c = m->input.c, k = m->classes;
    if (want_train) {
        if (synthetic)
            mgt_dataset_synthetic(&j->train, o->synthetic_samples, h, w, c, k, seed, 1);
        else if (mgt_dataset_load_idx(&j->train, dir, "train", h, w, k, &e) < 0)
            mgt_die_all("%s", e.msg);
        if (o->val_split > 0) {
            /* Keras' validation_split: the LAST fraction of the training data, before shuffling. */
            int64_t nv = (int64_t)((double)j->train.n * o->val_split);
            if (nv < 1 || nv >= j->train.n)
                mgt_die_all("--val-split %g leaves %lld validation samples of %lld; use a "
                            "fraction between 0 and 1", o->val_split, (long long)nv,
                            (long long)j->train.n);
            j->val = mgt_dataset_slice(&j->train, j->train.n - nv, nv);
            mgt_dataset full = j->train;
            j->train = mgt_dataset_slice(&full, 0, full.n - nv);
            j->train.pixels = full.pixels; /* keep ownership with the first slice */
            j->train.labels = full.labels;
            j->have_val = 1;
        }
    }
    if (!want_train || !j->have_val) {
        int test_split = !eval_split || !strcmp(eval_split, "test");
        if (eval_split && strcmp(eval_split, "test") && strcmp(eval_split, "train"))
            mgt_die_all("--split %s: unknown; use train or test", eval_split);
        if (synthetic)
            mgt_dataset_synthetic(&j->test, test_split ? 10000 : o->synthetic_samples, h, w, c, k,
                                  seed, test_split ? 2 : 1);
        else if (mgt_dataset_load_idx(&j->test, dir, test_split ? "t10k" : "train", h, w, k,
                                      &e) < 0)
            mgt_die_all("%s", e.msg);
        j->have_test = 1;
        if (want_train) {
            j->val = j->test;
            j->have_val = 1;
            j->val_is_test = 1;
        }
    }
    j->synthetic = synthetic;
    snprintf(j->data_dir, sizeof j->data_dir, "%s", dir);
    if (synthetic)
        snprintf(j->data_desc, sizeof j->data_desc, "synthetic %dx%dx%d, %d classes", h, w, c, k);
    else
        snprintf(j->data_desc, sizeof j->data_desc, "%s", dir);
}

static void alloc_all(job *j) {
    mgt_model *m = &j->m;
    int world = j->rt->world;
    int64_t b = m->train.batch_size;
    int max_batch = (int)((b + world - 1) / world);
    mgt_err e;
    if (mgt_model_alloc(m, &j->pl.be, max_batch, &e) < 0)
        mgt_die("%s", e.msg);
    if (mgt_optim_init(&j->opt, &m->train, &j->pl.be, m->param_count, &e) < 0)
        mgt_die("%s", e.msg);
    j->hw = calloc(m->param_count + 1, sizeof(float));
    j->hbuf = calloc(m->buffer_count + 1, sizeof(float));
    for (int i = 0; i < j->opt.nslots; i++)
        j->hslot[i] = calloc(m->param_count + 1, sizeof(float));
    if (!j->hw || !j->hbuf)
        mgt_die("out of host memory for a copy of the weights");
    if (mgt_stage_init(&j->st, &j->pl.be, m, &e) < 0)
        mgt_die("%s", e.msg);
    j->reduce_count = (size_t)(m->sums - m->g) + 2;
}

/* FNV-1a over the parameter arena as this rank holds it. */
static uint64_t weights_checksum(job *j) {
    mgt_model *m = &j->m;
    j->pl.be.ops->to_host(&j->pl.be, j->hw, m->w, m->param_count * sizeof(float));
    const unsigned char *p = (const unsigned char *)j->hw;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < m->param_count * sizeof(float); i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static void check_same_weights(job *j, const char *when) {
    uint64_t mine = weights_checksum(j), root = mine;
    mgt_bcast(&j->pl.comm, &root, sizeof root, 0, "weight checksum");
    if (mine != root)
        mgt_die("weights differ from rank 0's %s (checksum %016llx, rank 0 has %016llx): the "
                "replicas are out of step; please report this with the command line",
                when, (unsigned long long)mine, (unsigned long long)root);
}

static void make_out_dir(job *j) {
    const mgt_options *o = j->o;
    if (o->out)
        snprintf(j->out, sizeof j->out, "%s", o->out);
    else
        snprintf(j->out, sizeof j->out, "runs/%s", j->m.name);
    if (j->rt->rank != 0)
        return;
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", j->out);
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
static void write_run_info(job *j) {
    if (j->rt->rank != 0)
        return;
    char s[2048], path[600];
    int n = snprintf(s, sizeof s,
                     "{\"model\": \"%s\", \"model_file\": \"%s\", \"world\": %d, "
                     "\"nodes\": %d, \"global_batch\": %lld, \"optimizer\": \"%s\", "
                     "\"learning_rate\": %g, \"epochs\": %d, \"seed\": %llu, \"backend\": "
                     "\"%s\", \"data\": \"%s\", \"version\": \"%s\"}\n",
                     j->m.name, j->m.path, j->rt->world, j->rt->nodes,
                     (long long)j->m.train.batch_size, mgt_opt_name(j->m.train.optimizer),
                     j->m.train.lr, j->m.train.epochs, (unsigned long long)j->m.train.seed,
                     j->pl.be.ops->name, j->data_desc, MGT_VERSION);
    snprintf(path, sizeof path, "%s/run.json", j->out);
    mgt_err e;
    if (mgt_atomic_write(path, s, (size_t)n, &e) < 0)
        mgt_die("%s", e.msg);
}

/* ---- state in and out -------------------------------------------------------------------- */

/* Batchnorm running statistics are per replica while training; before anything is saved (or
 * validated) every rank takes the average, so all replicas hold the same model. */
static void average_buffers(job *j) {
    mgt_model *m = &j->m;
    if (!m->buffer_count || j->rt->world == 1)
        return;
    const mgt_ops *o = j->pl.be.ops;
    o->to_host(&j->pl.be, j->hbuf, m->buf, m->buffer_count * sizeof(float));
    double *d = malloc(sizeof(double) * m->buffer_count);
    if (!d)
        mgt_die("out of host memory");
    for (size_t i = 0; i < m->buffer_count; i++)
        d[i] = j->hbuf[i];
    mgt_allreduce_host_f64(&j->pl.comm, d, m->buffer_count, "batchnorm statistics average");
    for (size_t i = 0; i < m->buffer_count; i++)
        j->hbuf[i] = (float)(d[i] / j->rt->world);
    free(d);
    o->to_device(&j->pl.be, m->buf, j->hbuf, m->buffer_count * sizeof(float));
}

static void fetch_state(job *j) {
    mgt_model *m = &j->m;
    const mgt_ops *o = j->pl.be.ops;
    o->to_host(&j->pl.be, j->hw, m->w, m->param_count * sizeof(float));
    o->to_host(&j->pl.be, j->hbuf, m->buf, m->buffer_count * sizeof(float));
    for (int i = 0; i < j->opt.nslots; i++)
        o->to_host(&j->pl.be, j->hslot[i], j->opt.slot[i], m->param_count * sizeof(float));
    for (size_t i = 0; i < m->param_count; i++)
        if (!isfinite(j->hw[i]))
            mgt_die("the weights hold non-finite values at step %lld; nothing was saved and the "
                    "last good checkpoint in %s is kept; lower --lr and resume",
                    (long long)j->global_step, j->out);
}

/* The host copies of the state, as the checkpoint module reads and writes them. */
static mgt_ckpt_arrays host_arrays(job *j) {
    mgt_ckpt_arrays a = {.w = j->hw, .buf = j->hbuf};
    for (int i = 0; i < j->opt.nslots; i++)
        a.slot[i] = j->hslot[i];
    return a;
}

/* Collective. Rank 0 writes OUT/checkpoint.safetensors atomically. */
static void save_checkpoint(job *j) {
    average_buffers(j);
    if (j->rt->rank != 0)
        return;
    fetch_state(j);
    mgt_ckpt_pos pos = {.step = j->global_step, .epoch = j->epoch,
                        .step_in_epoch = j->step_in_epoch, .optimizer_t = j->opt.t,
                        .seed = j->m.train.seed};
    memcpy(pos.epoch_sums, j->ep, sizeof j->ep);
    mgt_ckpt_arrays a = host_arrays(j);
    mgt_err e;
    if (mgt_ckpt_write(j->out, &j->m, &j->opt, &a, &pos, j->rt->world, &e) < 0)
        mgt_die("%s", e.msg);
}

static void save_weights(job *j) {
    average_buffers(j);
    if (j->rt->rank != 0)
        return;
    fetch_state(j);
    mgt_err e;
    if (mgt_ckpt_write_weights(j->out, &j->m, j->hw, j->hbuf, j->global_step, &e) < 0)
        mgt_die("%s", e.msg);
}

/* Rank 0 initialises, loads or resumes; everything is broadcast; every rank checks. */
static void start_state(job *j, const char *weights, int resume) {
    mgt_model *m = &j->m;
    const mgt_ops *o = j->pl.be.ops;
    mgt_ckpt_pos pos = {.seed = m->train.seed};
    if (j->rt->rank == 0) {
        mgt_err e;
        mgt_ckpt_arrays a = host_arrays(j);
        if (resume) {
            if (mgt_ckpt_read(j->out, m, &j->opt, &a, &pos, &e) < 0)
                mgt_die("%s", e.msg);
        } else if (weights) {
            if (mgt_model_load_weights(m, weights, j->hw, j->hbuf, &e) < 0)
                mgt_die("%s", e.msg);
        } else
            mgt_model_init_host(m, m->train.seed, j->hw, j->hbuf);
    }
    mgt_bcast(&j->pl.comm, j->hw, m->param_count * sizeof(float), 0, "weight broadcast");
    mgt_bcast(&j->pl.comm, j->hbuf, m->buffer_count * sizeof(float), 0, "buffer broadcast");
    for (int i = 0; i < j->opt.nslots; i++)
        mgt_bcast(&j->pl.comm, j->hslot[i], m->param_count * sizeof(float), 0,
                  "optimizer state broadcast");
    mgt_ckpt_bcast_pos(&j->pl.comm, &pos, 0);
    o->to_device(&j->pl.be, m->w, j->hw, m->param_count * sizeof(float));
    o->to_device(&j->pl.be, m->buf, j->hbuf, m->buffer_count * sizeof(float));
    for (int i = 0; i < j->opt.nslots; i++)
        o->to_device(&j->pl.be, j->opt.slot[i], j->hslot[i], m->param_count * sizeof(float));
    j->global_step = pos.step;
    j->epoch = (int)pos.epoch;
    j->step_in_epoch = pos.step_in_epoch;
    j->opt.t = pos.optimizer_t;
    memcpy(j->ep, pos.epoch_sums, sizeof j->ep);
    m->train.seed = pos.seed;
    check_same_weights(j, "after the initial broadcast");
}

/* ---- the loops ----------------------------------------------------------------------------- */

/* Loss sum, correct count and sample count over ds, sharded contiguously across ranks, reduced.
 * With outputs != NULL also keeps this rank's outputs (rows of `classes`) in dataset order. */
static void evaluate(job *j, const mgt_dataset *ds, double res[3], float *outputs, int labels) {
    mgt_model *m = &j->m;
    const mgt_ops *o = j->pl.be.ops;
    mgt_range r = mgt_shard_range(ds->n, j->rt->rank, j->rt->world);
    o->zero(&j->pl.be, m->sums, 2 * sizeof(float));
    double part[3] = {0, 0, (double)r.count};
    float hs[2];
    for (int64_t done = 0; done < r.count;) {
        int n = (int)(r.count - done < m->max_batch ? r.count - done : m->max_batch);
        mgt_step s = {.in = mgt_stage_rows(&j->st, ds, r.first + done, n),
                      .be = &j->pl.be, .n = n, .training = 0, .global_step = j->global_step,
                      .first_sample = r.first + done, .global_n = ds->n, .seed = m->train.seed,
                      .comm = &j->pl.comm};
        float *out = mgt_model_forward(m, &s);
        if (labels) {
            mgt_model_loss_backward(m, &s, 0);
            /* Per-batch float sums are folded into doubles so long evaluations stay exact. */
            o->to_host(&j->pl.be, hs, m->sums, sizeof hs);
            part[0] += hs[0];
            part[1] += hs[1];
            o->zero(&j->pl.be, m->sums, 2 * sizeof(float));
        } else {
            mgt_model_finish_output(m, &s, out);
        }
        if (outputs)
            o->to_host(&j->pl.be, outputs + (size_t)done * (size_t)m->classes, out,
                       sizeof(float) * (size_t)n * (size_t)m->classes);
        done += n;
    }
    mgt_allreduce_host_f64(&j->pl.comm, part, 3, "evaluation metrics");
    memcpy(res, part, sizeof part);
}

static void free_job(job *j) {
    if (j->acc)
        j->pl.be.ops->free(&j->pl.be, j->acc);
    mgt_stage_free(&j->st);
    mgt_optim_free(&j->opt, &j->pl.be);
    mgt_model_free(&j->m);
    mgt_dataset_free(&j->train);
    if (!j->val_is_test)
        mgt_dataset_free(&j->val);
    mgt_dataset_free(&j->test);
    free(j->hw);
    free(j->hbuf);
    free(j->hslot[0]);
    free(j->hslot[1]);
    mgt_place_free(&j->pl);
}

int mgt_cmd_train(mgt_runtime *rt, const mgt_options *o) {
    double t_start = mgt_now();
    job jb = {.rt = rt, .o = o}, *j = &jb;
    load_model(j);
    mgt_model *m = &j->m;
    int64_t B = m->train.batch_size;
    if (B < rt->world)
        mgt_die_all("%d ranks but the global batch is %lld: every rank needs at least one sample "
                    "per step; start at most %lld ranks or raise --batch-size", rt->world,
                    (long long)B, (long long)B);
    init_backend(j);
    mgt_fault_init(&j->fault, rt->rank);
    make_out_dir(j);
    alloc_all(j);
    start_state(j, o->resume ? NULL : o->init_weights, o->resume);
    /* After the start: a resumed run's seed is the checkpoint's, and it keys synthetic data. */
    load_data(j, 1, NULL);
    write_run_info(j);
    mgt_place_run run = {.what = o->resume ? "resuming" : "training", .m = m,
                         .data = j->data_desc, .out = j->out};
    mgt_place_report(&j->pl, rt, &run);
    if (o->resume && rt->rank == 0)
        printf("  resumed from %s/checkpoint.safetensors at epoch %d, step %lld\n", j->out,
               j->epoch + 1, (long long)j->global_step);

    const mgt_ops *ops = j->pl.be.ops;
    int64_t n = j->train.n, steps = mgt_shard_steps(n, B);
    mgt_err e;
    /* A loader thread pays where the rank has a core to spare for it, or a GPU computes. */
    int threaded = strcmp(ops->name, "cpu") || mgt_runtime_cores(rt) > 1;
    mgt_stage_train_opts so = {.seed = m->train.seed, .batch = B, .rank = rt->rank,
                               .world = rt->world, .threaded = threaded,
                               .device_data = o->device_data,
                               .host_batches = mgt_fault_host_batches(&j->fault)};
    if (mgt_stage_train(&j->st, &j->train, &so, &e) < 0)
        mgt_die("%s", e.msg);
    int epochs = m->train.epochs;
    int64_t limit = o->max_steps > 0 ? o->max_steps : INT64_MAX;
    int64_t total = (int64_t)epochs * steps - (int64_t)j->epoch * steps - j->step_in_epoch;
    if (limit - j->global_step < total)
        total = limit - j->global_step;
    mgt_profile prof;
    if (mgt_profile_init(&prof, o->profile || o->timeline, total > 0 ? total : 1, &j->pl.be, &e) < 0)
        mgt_die("%s", e.msg);
    mgt_metrics mt;
    mgt_metrics_init(&mt, rt->rank == 0 ? o->verbose : 0, epochs, j->out, rt->launched);
    double last_val[3] = {-1, 0, 0};
    int64_t last_val_step = -1, trained = 0;
    double train_seconds = 0;
    float hs[2];
    int64_t read_every = strcmp(ops->name, "cpu") ? 20 : 1, read_at = j->global_step, pending = 0;
    j->acc = ops->alloc(&j->pl.be, 16 * sizeof(float));
    if (!j->acc)
        mgt_die("out of %s memory for the metric sums", ops->name);

    for (; j->epoch < epochs && j->global_step < limit; j->epoch++) {
        mgt_stage_begin_epoch(&j->st, j->epoch, j->step_in_epoch);
        double t_epoch = mgt_now();
        int64_t seen_before = (int64_t)j->ep[2], first_step = j->step_in_epoch;
        for (; j->step_in_epoch < steps && j->global_step < limit; j->step_in_epoch++) {
            mgt_fault_point(&j->fault, j->global_step);
            int64_t step = j->step_in_epoch;
            mgt_profile_begin_step(&prof, j->global_step);
            const mgt_batch *bt = mgt_stage_next(&j->st);
            if (bt->step != step)
                mgt_die("data loader delivered step %lld for step %lld; please report this",
                        (long long)bt->step, (long long)step);
            int64_t b = bt->global_n;
            mgt_range r = {bt->first, bt->n};
            if (bt->x) /* NULL when the batch is made on the device */
                mgt_fault_poison(&j->fault, j->global_step, bt->x,
                                 (size_t)bt->n * (size_t)mgt_shape_elems(m->input));
            mgt_input in = mgt_stage_put(&j->st, bt);
            ops->zero(&j->pl.be, m->sums, 2 * sizeof(float));
            mgt_profile_phase(&prof, MGT_PH_DATA);
            mgt_step s = {.in = in, .be = &j->pl.be, .n = (int)r.count, .training = 1,
                          .global_step = j->global_step, .first_sample = r.first, .global_n = b,
                          .seed = m->train.seed, .comm = &j->pl.comm};
            mgt_model_forward(m, &s);
            mgt_profile_phase(&prof, MGT_PH_FORWARD);
            mgt_model_loss_backward(m, &s, 1);
            mgt_profile_phase(&prof, MGT_PH_BACKWARD);
            /* The one collective of the step: gradient sums and the step's loss/accuracy sums. */
            mgt_allreduce_sum(&j->pl.comm, m->g, j->reduce_count, "gradient all-reduce");
            mgt_profile_phase(&prof, MGT_PH_ALLREDUCE);
            /* Metrics stay in backend memory and are read once per interval (every step on the
             * CPU, where it is free; a GPU would otherwise wait on the host every step). */
            ops->add(&j->pl.be, 2, m->sums, j->acc);
            pending += b;
            int64_t next = j->global_step + 1;
            if (next - read_at >= read_every || step + 1 == steps || next >= limit ||
                (o->save_every > 0 && next % o->save_every == 0) ||
                (o->debug_check > 0 && next % o->debug_check == 0)) {
                ops->to_host(&j->pl.be, hs, j->acc, sizeof hs);
                ops->zero(&j->pl.be, j->acc, 2 * sizeof(float));
                if (!isfinite(hs[0]))
                    mgt_die_all("the loss became %s at step %lld%s (epoch %d): training stopped, "
                                "nothing was saved over the last checkpoint; lower --lr or check "
                                "the data", isnan(hs[0]) ? "NaN" : "infinite", (long long)next,
                                read_every > 1 ? " or just before" : "", j->epoch + 1);
                j->ep[0] += hs[0];
                j->ep[1] += hs[1];
                j->ep[2] += (double)pending;
                pending = 0;
                read_at = next;
            }
            mgt_optim_step(&j->opt, &j->pl.be, m->w, m->g, b);
            mgt_stage_done(&j->st);
            mgt_profile_phase(&prof, MGT_PH_UPDATE);
            mgt_profile_end_step(&prof);
            j->global_step++;
            trained++;
            if (o->debug_check > 0 && j->global_step % o->debug_check == 0) {
                check_same_weights(j, "during training (debug check)");
                mgt_profile_gap(&prof);
            }
            if (rt->rank == 0 && mt.verbose == 1 && j->ep[2] > 0) {
                double el = mgt_now() - t_epoch;
                double eta = el / (double)(step + 1 - first_step) * (double)(steps - step - 1);
                mgt_metrics_progress(&mt, j->epoch, step + 1, steps, eta, j->ep[0] / j->ep[2],
                                     j->ep[1] / j->ep[2], step + 1 == steps);
            }
            if (o->save_every > 0 && j->global_step % o->save_every == 0) {
                j->step_in_epoch++; /* the position saved is the NEXT step */
                save_checkpoint(j);
                j->step_in_epoch--;
                mgt_profile_gap(&prof);
            }
        }
        mgt_profile_gap(&prof); /* evaluation and saving are no step's */
        double secs = mgt_now() - t_epoch;
        train_seconds += secs;
        int finished = j->step_in_epoch == steps;
        average_buffers(j);
        if (!o->no_validation) {
            double vres[3] = {0, 0, 0};
            evaluate(j, &j->val, vres, NULL, 1);
            last_val[0] = vres[0] / vres[2];
            last_val[1] = vres[1] / vres[2];
            last_val_step = j->global_step;
        }
        mgt_epoch_row row = {
            .epoch = j->epoch + 1, .step = j->global_step, .loss = j->ep[0] / j->ep[2],
            .acc = j->ep[1] / j->ep[2], .val_loss = last_val[0], .val_acc = last_val[1],
            .samples_per_s = secs > 0 ? (j->ep[2] - (double)seen_before) / secs : 0,
            .seconds = secs};
        if (rt->rank == 0 && mgt_metrics_epoch(&mt, &row, &e) < 0)
            mgt_die("%s", e.msg);
        if (finished) {
            j->step_in_epoch = 0;
            memset(j->ep, 0, sizeof j->ep);
            j->epoch++;
            save_checkpoint(j);
            j->epoch--;
        } else {
            save_checkpoint(j);
            break;
        }
    }
    if (mgt_profile_report(&prof, &j->pl.comm, o->timeline, &e) < 0)
        mgt_die("%s", e.msg);
    double test[3] = {-1, -1, -1};
    if (o->no_validation) {
        /* Training only (benchmarks): no test evaluation either. */
    } else if (j->val_is_test && last_val_step == j->global_step) {
        test[0] = last_val[0];
        test[1] = last_val[1];
    } else {
        if (!j->have_test) {
            if (j->synthetic)
                mgt_dataset_synthetic(&j->test, 10000, m->input.h, m->input.w, m->input.c,
                                      m->classes, m->train.seed, 2);
            else if (mgt_dataset_load_idx(&j->test, j->data_dir, "t10k", m->input.h, m->input.w,
                                          m->classes, &e) < 0)
                mgt_die_all("%s", e.msg);
            j->have_test = 1;
        }
        double r3[3];
        evaluate(j, &j->test, r3, NULL, 1);
        test[0] = r3[0] / r3[2];
        test[1] = r3[1] / r3[2];
    }
    save_weights(j);
    if (rt->rank == 0) {
        if (test[0] >= 0)
            printf("Test loss: %.4f - test acc: %.4f\n", test[0], test[1]);
        printf("Trained %lld steps in %.1f s (%.0f samples/s); total %.1f s; weights: "
               "%s/weights.safetensors\n", (long long)trained, train_seconds,
               train_seconds > 0 ? (double)trained * (double)B / train_seconds : 0.0,
               mgt_now() - t_start, j->out);
#ifdef MGT_HAVE_CUDA
        if (!strcmp(j->pl.be.ops->name, "gpu"))
            printf("Peak GPU memory: %.1f MiB on rank 0 (mgtrain's own allocations, the CUDA "
                   "context excluded)\n", (double)mgt_gpu_peak_bytes(&j->pl.be) / 1048576.0);
#endif
        fflush(stdout);
    }
    mgt_metrics_free(&mt);
    mgt_profile_free(&prof);
    free_job(j);
    return 0;
}

static void prepare_inference(job *j, const char *what) {
    const mgt_options *o = j->o;
    if (!o->weights)
        mgt_die_all("%s needs --weights FILE (e.g. runs/%s/weights.safetensors from mgtrain "
                    "train)", what, j->m.name);
    init_backend(j);
    load_data(j, 0, o->split);
    if (j->test.n < j->rt->world)
        mgt_die_all("%d ranks for %lld samples: start at most %lld ranks", j->rt->world,
                    (long long)j->test.n, (long long)j->test.n);
    snprintf(j->out, sizeof j->out, ".");
    alloc_all(j);
    start_state(j, o->weights, 0);
}

int mgt_cmd_eval(mgt_runtime *rt, const mgt_options *o) {
    job jb = {.rt = rt, .o = o}, *j = &jb;
    load_model(j);
    prepare_inference(j, "eval");
    double r[3];
    double t0 = mgt_now();
    evaluate(j, &j->test, r, NULL, 1);
    if (rt->rank == 0) {
        printf("%lld samples from %s (%s split) - %.1f s - loss: %.4f - acc: %.4f\n",
               (long long)r[2], j->data_desc, o->split ? o->split : "test", mgt_now() - t0,
               r[0] / r[2], r[1] / r[2]);
        fflush(stdout);
    }
    free_job(j);
    return 0;
}

int mgt_cmd_predict(mgt_runtime *rt, const mgt_options *o) {
    job jb = {.rt = rt, .o = o}, *j = &jb;
    load_model(j);
    if (!o->output)
        mgt_die_all("predict needs --output FILE.npy");
    prepare_inference(j, "predict");
    mgt_model *m = &j->m;
    int world = rt->world, k = m->classes;
    mgt_range r = mgt_shard_range(j->test.n, rt->rank, world);
    float *mine = malloc(sizeof(float) * (size_t)(r.count ? r.count : 1) * (size_t)k);
    float *all = rt->rank == 0 ? malloc(sizeof(float) * (size_t)j->test.n * (size_t)k) : NULL;
    size_t *counts = rt->rank == 0 ? malloc(sizeof(size_t) * (size_t)world) : NULL;
    if (!mine || (rt->rank == 0 && (!all || !counts)))
        mgt_die("out of host memory for %lld predictions", (long long)j->test.n);
    for (int q = 0; rt->rank == 0 && q < world; q++)
        counts[q] = (size_t)mgt_shard_range(j->test.n, q, world).count * (size_t)k;
    double res[3];
    evaluate(j, &j->test, res, mine, 0);
    /* Rank order = dataset order, because each rank's shard is one contiguous range. */
    mgt_gatherv(&j->pl.comm, mine, (size_t)r.count * (size_t)k, all, counts, 0, "prediction gather");
    if (rt->rank == 0) {
        mgt_err e;
        if (mgt_npy_write(o->output, all, j->test.n, k, &e) < 0)
            mgt_die("%s", e.msg);
        printf("wrote %s: %lld x %d float32 (%s of the last layer)\n", o->output,
               (long long)j->test.n, k, m->layers[m->nlayers - 1].act == MGT_ACT_SOFTMAX
                                            ? "softmax probabilities"
                                            : "logits");
        fflush(stdout);
    }
    free(mine);
    free(all);
    free(counts);
    free_job(j);
    return 0;
}

int mgt_cmd_summary(mgt_runtime *rt, const mgt_options *o) {
    job jb = {.rt = rt, .o = o}, *j = &jb;
    load_model(j);
    if (rt->rank == 0)
        mgt_model_summary(&j->m, stdout);
    mgt_model_free(&j->m);
    return 0;
}
