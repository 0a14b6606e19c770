/* run_plan.c: the command line and the model file resolved into a command's plan (see
 * run_plan.h). */
#include "run_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "default_model.h"
#include "parse.h"
#include "rundir.h"
#include "tensor_io.h"

/* A model file larger than this is not one (the largest legitimate ones are a few kB). */
enum { MODEL_FILE_MAX = 16 << 20 };

static mgt_command command_of(const char *name) {
    if (!strcmp(name, "eval"))
        return MGT_CMD_EVAL;
    if (!strcmp(name, "predict"))
        return MGT_CMD_PREDICT;
    if (!strcmp(name, "summary"))
        return MGT_CMD_SUMMARY;
    if (!strcmp(name, "export"))
        return MGT_CMD_EXPORT;
    if (!strcmp(name, "generate"))
        return MGT_CMD_GENERATE;
    return MGT_CMD_TRAIN;
}

/* eval and predict --run DIR: the model copy and the weights of a run folder, unless --model or
 * --weights name others. Every rank reads the folder's run.json (a shared folder, or the same
 * path everywhere, as for --weights). */
static void find_run(mgt_run_plan *p, const mgt_options *o) {
    mgt_err e;
    mgt_out_plan *out = &p->out;
    if (!o->run)
        return;
    if (mgt_rundir_find(o->run, out->run_model, out->run_weights, sizeof out->run_model, &e) < 0 &&
        !(o->model && o->weights))
        mgt_die_all("%s", e.msg);
    p->model_file = o->model ? o->model : out->run_model;
    /* A run trained with --input-shape built its model copy for that shape: the copy alone
     * would build another model. Its run.json records the flag; one given now wins. */
    mgt_run_record *rec = o->model || o->input_shape ? NULL : calloc(1, sizeof *rec);
    if (rec && mgt_rundir_read_record(o->run, rec, &e) > 0) {
        const char *w = rec->flags, *key = "--input-shape=";
        for (int i = 0; i < rec->nflags; i++, w += strlen(w) + 1)
            if (!strncmp(w, key, strlen(key)))
                snprintf(out->run_input_shape, sizeof out->run_input_shape, "%s", w + strlen(key));
    }
    free(rec);
}

int mgt_run_plan_overrides(const mgt_options *o, mgt_train_override *out, int max) {
    const mgt_train_override named[] = {{"epochs", "epochs", o->epochs},
                                        {"batch-size", "batch_size", o->batch_size},
                                        {"optimizer", "optimizer", o->optimizer},
                                        {"lr", "learning_rate", o->lr},
                                        {"seed", "seed", o->seed},
                                        {"accum-steps", "accum_steps", o->accum_steps}};
    int n = 0;
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (named[i].value && n < max)
            out[n++] = named[i];
    for (int i = 0; i < o->ntrain_keys && n < max; i++)
        out[n++] = (mgt_train_override){o->train_keys[i].flag, o->train_keys[i].key,
                                        o->train_keys[i].value};
    return n;
}

/* The command line's [train] overrides onto t; an error names the flag instead of the key. */
static int override_all(mgt_train_cfg *t, const mgt_options *o, mgt_err *err) {
    mgt_train_override ov[32];
    const int n = mgt_run_plan_overrides(o, ov, 32);
    for (int i = 0; i < n; i++) {
        mgt_err e;
        if (mgt_train_set(t, ov[i].key, ov[i].value, &e) < 0)
            return mgt_errf(err, "--%s %s: %s", ov[i].flag, ov[i].value,
                            strchr(e.msg, ':') ? strchr(e.msg, ':') + 2 : e.msg);
    }
    return 0;
}

/* Without --model the built-in copy of examples/mlp.cfg trains: say so when an examples/mlp.cfg
 * here differs from it (it was edited, and the user may think it is what trains). */
static void note_builtin(const mgt_runtime *rt) {
    const char *file = "examples/" MGT_DEFAULT_MODEL_NAME ".cfg";
    char *text = NULL;
    mgt_err e;
    if (rt->rank != 0 ||
        mgt_read_text_file(file, "model file", MODEL_FILE_MAX, &text, NULL, &e) < 0)
        return;
    if (strcmp(text, MGT_DEFAULT_MODEL_TEXT))
        fprintf(stderr,
                "notice: %s differs from the built-in model, which is what runs without "
                "--model; pass --model %s to use the file\n",
                file, file);
    free(text);
}

/* The model file (or the built-in one) with the command line's [train] overrides, its input
 * shape and convolution algorithms. The file is read once and parsed from that text, so the copy
 * a run keeps is what it trained. */
static void load_model(mgt_run_plan *p, mgt_model *m, const mgt_options *o, const mgt_runtime *rt) {
    mgt_train_cfg *t = &p->train;
    mgt_err e;
    int rc;
    if (!p->model_file)
        p->model_file = o->model;
    if (p->model_file) {
        if (mgt_read_text_file(p->model_file, "model file", MODEL_FILE_MAX, &p->model_text,
                               &p->model_len, &e) < 0)
            mgt_die_all("%s; pass --model with a model file such as examples/mlp.cfg", e.msg);
        rc = mgt_model_file_parse_len(m, t, p->model_file, p->model_text, p->model_len, &e);
    } else {
        rc = mgt_model_file_parse(m, t, "examples/" MGT_DEFAULT_MODEL_NAME ".cfg",
                                  MGT_DEFAULT_MODEL_TEXT, &e);
        snprintf(m->path, sizeof m->path, "built-in model");
        note_builtin(rt);
    }
    if (rc < 0 || override_all(t, o, &e) < 0)
        mgt_die_all("%s", e.msg);
    if (o->conv_algo && mgt_conv2d_set_algo(m, o->conv_algo, &e) < 0)
        mgt_die_all("--conv-algo %s: %s", o->conv_algo, e.msg);
    const char *shape = o->input_shape ? o->input_shape
                        : p->out.run_input_shape[0] ? p->out.run_input_shape : NULL;
    if (shape && mgt_model_set_input_shape(m, shape, &e) < 0)
        mgt_die_all("--input-shape %s: %s", shape, e.msg);
    if (t->freeze[0] && mgt_model_freeze(m, t->freeze, &e) < 0) {
        int flag = 0; /* the flag's value, or the model file's key */
        for (int i = 0; i < o->ntrain_keys; i++)
            flag |= !strcmp(o->train_keys[i].key, "freeze");
        mgt_die_all("%s%s: %s", flag ? "--freeze " : "[train] freeze = ", t->freeze, e.msg);
    }
    if (t->lr < 0)
        t->lr = mgt_optimizer_of(t->optimizer)->default_lr;
    if (mgt_train_apply_loss(t, m, &e) < 0)
        mgt_die_all("%s", e.msg);
}

int mgt_run_plan_train_cfg(mgt_train_cfg *t, const char *path, const char *text, size_t len,
                           const mgt_options *o, mgt_err *err) {
    mgt_model m;
    memset(&m, 0, sizeof m);
    int rc = mgt_model_file_parse_len(&m, t, path, text, len, err);
    mgt_model_free(&m);
    if (rc < 0 || override_all(t, o, err) < 0)
        return -1;
    if (t->lr < 0)
        t->lr = mgt_optimizer_of(t->optimizer)->default_lr;
    return 0;
}

/* eval and predict --run without --model: the folder's model copy must be the model its
 * checkpoint was trained with (an edited copy would load the weights if the shapes fit, and
 * compute something else). Rank 0 reads the checkpoint; a mismatch ends every rank alike. */
static void check_run_model(const mgt_run_plan *p, const mgt_model *m, const mgt_options *o,
                            const mgt_runtime *rt) {
    if (!o->run || o->model)
        return;
    char name[64] = "", msg[1400];
    uint64_t hash = 0;
    mgt_err e;
    const char *failed = NULL;
    if (rt->rank == 0) {
        int rc = mgt_ckpt_model_of(o->run, name, sizeof name, &hash, &e);
        if (rc < 0) {
            failed = e.msg;
        } else if (rc > 0 && (strcmp(name, m->name) || (hash && hash != mgt_ckpt_model_hash(m)))) {
            snprintf(msg, sizeof msg,
                     "--run %s: its model copy %s is not the model its checkpoint was trained "
                     "with (%s%s); it was changed after training: pass --model with the model "
                     "file the run trained",
                     o->run, p->out.run_model, strcmp(name, m->name) ? "model " : "",
                     strcmp(name, m->name) ? name : "other layers or sizes");
            failed = msg;
        }
    }
    mgt_die_all_if_root(failed);
}

/* --gpus "0,2,3": the device of each local rank. */
static void gpu_list(mgt_place_opts *po, const char *list) {
    int *ids = po->gpu_ids;
    int n = mgt_parse_int_list(list, ids, MGT_MAX_GPU_IDS);
    if (n < 1)
        mgt_die_all("--gpus %s: expected a comma-separated list of device numbers, e.g. --gpus "
                    "0,2,3",
                    list);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0)
            mgt_die_all("--gpus %s: device numbers start at 0", list);
        for (int k = 0; k < i; k++)
            if (ids[k] == ids[i])
                mgt_die_all("--gpus %s: device %d is listed twice; one rank per GPU", list, ids[i]);
    }
    po->ngpu_ids = n;
    po->gpus_given = list;
}

/* Where the ranks compute and how their gradients travel: the requests that can be refused
 * without looking at the machine are refused here (placement.c refuses the rest). */
static void place(mgt_run_plan *p, const mgt_options *o) {
    mgt_place_opts *po = &p->place;
    const char *tr = o->transport ? o->transport : "auto", *d = o->device;
    if (strcmp(tr, "auto") && strcmp(tr, "nccl") && strcmp(tr, "mpi") && strcmp(tr, "shm"))
        mgt_die_all("--transport %s: unknown; use auto, nccl, mpi or shm", tr);
    if (!strcmp(tr, "nccl") && !strcmp(d, "cpu"))
        mgt_die_all("--transport nccl needs the GPU backend (not --device cpu)");
    if (!strcmp(tr, "shm") && !strcmp(d, "gpu"))
        mgt_die_all("--transport shm is for the CPU backend (--device cpu); GPUs use nccl");
    if (strcmp(d, "cpu") && strcmp(d, "gpu") && strcmp(d, "auto"))
        mgt_die_all("--device %s: unknown; use cpu, gpu or auto", d);
    if (o->gpus) {
        gpu_list(po, o->gpus);
        if (!strcmp(d, "cpu"))
            mgt_die_all("--gpus %s goes with --device gpu or auto, not cpu", o->gpus);
    }
    po->device = !strcmp(d, "cpu")   ? MGT_DEVICE_CPU
                 : !strcmp(d, "gpu") ? MGT_DEVICE_GPU
                                     : MGT_DEVICE_AUTO;
    po->transport = !strcmp(tr, "nccl")  ? MGT_TRANSPORT_NCCL
                    : !strcmp(tr, "mpi") ? MGT_TRANSPORT_MPI
                    : !strcmp(tr, "shm") ? MGT_TRANSPORT_SHM
                                         : MGT_TRANSPORT_AUTO;
    po->share_gpu = o->share_gpu;
    po->tf32 = o->tf32;
    po->bf16 = o->bf16;
    po->algo_cache = o->algo_cache;
    po->comm_timeout = o->comm_timeout;
    /* --reproducible: OpenBLAS's results depend on its thread count, and cuDNN's choice of
     * convolution algorithm on timings. */
    const int exact = p->command == MGT_CMD_TRAIN && p->train.reproducible;
    po->one_thread = exact;
    po->deterministic = exact;
}

/* The data and its splits. */
static void data(mgt_run_plan *p, const mgt_options *o) {
    mgt_splits_opts *d = &p->data;
    d->source = !o->data                        ? MGT_DATA_DEFAULT
                : !strcmp(o->data, "synthetic") ? MGT_DATA_SYNTHETIC
                                                : MGT_DATA_FOLDER;
    d->dir = d->source == MGT_DATA_FOLDER ? o->data : NULL;
    d->val_split = o->val_split;
    d->synthetic_samples = o->synthetic_samples;
    d->threads = o->loader_threads;
    d->no_validation = p->command == MGT_CMD_TRAIN && o->no_validation;
    d->augment = mgt_train_augment(&p->train);
    if (o->split && strcmp(o->split, "test") && strcmp(o->split, "train"))
        mgt_die_all("--split %s: unknown; use train or test", o->split);
    d->split = o->split && !strcmp(o->split, "train") ? MGT_SPLIT_TRAIN : MGT_SPLIT_TEST;
}

/* The parts of training: the step, the loop, the run folder and what is logged. */
static void training(mgt_run_plan *p, const mgt_model *m, const mgt_options *o,
                     const mgt_runtime *rt) {
    const mgt_train_cfg *t = &p->train;
    const int64_t chunk = p->command == MGT_CMD_TRAIN ? mgt_train_repro_chunk(t) : 0;
    p->validate = !o->no_validation;
    p->step = (mgt_step_plan){
        .pipeline = {.batch = t->batch_size,
                     .accum_steps = t->accum_steps,
                     .chunk = chunk,
                     .bucket_mb = o->bucket_mb,
                     .zero = o->zero,
                     .progress = o->comm_progress && !strcmp(o->comm_progress, "thread")
                                     ? MGT_PROGRESS_THREAD
                                     : MGT_PROGRESS_TEST,
                     .cuda_graph = o->cuda_graph},
        .repro = {.chunk = chunk,
                  .batch = t->batch_size,
                  .accum_steps = t->accum_steps,
                  .zero = o->zero,
                  .validation_decider = mgt_train_validation_decider(t)},
        .optim = mgt_train_optim(t),
        .seed = t->seed,
        .seed_given = o->seed,
        .device_data = o->device_data};
    p->loop = (mgt_regime){.epochs = t->epochs,
                           .max_steps = o->max_steps,
                           .lr = t->lr,
                           .sched = t->sched,
                           .clip = t->clip,
                           .stop = t->stop};
    p->log = (mgt_fit_log){.verbose = o->verbose,
                           .launched = rt->launched,
                           .profile = o->profile,
                           .profile_layers = o->profile_layers,
                           .precision = o->bf16   ? "bf16"
                                        : o->tf32 ? "tf32"
                                                  : "fp32",
                           .timeline = o->timeline,
                           .tensorboard = !o->no_tensorboard,
                           .log_every = o->log_every,
                           .debug_check = o->debug_check};
    mgt_out_plan *out = &p->out;
    if (p->command != MGT_CMD_TRAIN)
        snprintf(out->dir, sizeof out->dir, ".");
    else if (o->out)
        snprintf(out->dir, sizeof out->dir, "%s", o->out);
    else
        snprintf(out->dir, sizeof out->dir, "runs/%s", m->name);
    out->resume = o->resume;
    out->overwrite = o->overwrite;
    out->keep_checkpoints = o->keep_checkpoints;
    out->save_every = o->save_every;
    out->init_weights = o->init_weights;
    out->init_partial = o->init_partial;
    out->name_map = o->name_map;
    if (o->init_partial && !o->init_weights && p->command == MGT_CMD_TRAIN)
        mgt_die_all("--init-partial goes with --init-weights FILE: it keeps the initial values "
                    "of the model's tensors that FILE does not match");
    out->output = o->output;
}

/* eval and predict: the weights of --weights (or of --run's folder), and predict's output. */
static void inference(mgt_run_plan *p, const mgt_model *m, const mgt_options *o) {
    const char *what = p->command == MGT_CMD_PREDICT  ? "predict"
                       : p->command == MGT_CMD_EXPORT ? "export"
                       : p->command == MGT_CMD_GENERATE ? "generate"
                                                      : "eval";
    if (p->command == MGT_CMD_PREDICT && !o->output)
        mgt_die_all("predict needs --output FILE.npy");
    if (p->command == MGT_CMD_EXPORT && !o->output)
        mgt_die_all("export needs --output FILE.onnx");
    p->out.keep_bn = o->keep_bn;
    p->out.weights = o->weights ? o->weights : o->run ? p->out.run_weights : NULL;
    if (!p->out.weights)
        mgt_die_all("%s needs --weights FILE or --run DIR (e.g. --run runs/%s, the --out folder "
                    "of mgtrain train)",
                    what, m->name);
}

void mgt_run_plan_make(mgt_run_plan *p, mgt_model *m, const mgt_options *o, const mgt_runtime *rt) {
    memset(p, 0, sizeof *p);
    p->command = command_of(o->command);
    const int inferring = p->command == MGT_CMD_EVAL || p->command == MGT_CMD_PREDICT ||
                          p->command == MGT_CMD_EXPORT || p->command == MGT_CMD_GENERATE;
    if (inferring)
        find_run(p, o);
    load_model(p, m, o, rt);
    if (inferring)
        check_run_model(p, m, o, rt);
    if (p->command == MGT_CMD_SUMMARY) {
        training(p, m, o, rt);
        p->place.tf32 = o->tf32; /* the precision the estimates assume */
        p->place.bf16 = o->bf16;
        p->floor = o->floor;
        return;
    }
    if (p->command == MGT_CMD_TRAIN) {
        mgt_err e;
        if (mgt_train_check(&p->train, !o->no_validation, &e) < 0)
            mgt_die_all("%s", e.msg);
        const int64_t b = p->train.batch_size;
        if (b < rt->world)
            mgt_die_all("%d ranks but the global batch is %lld: every rank needs at least one "
                        "sample per step; start at most %lld ranks or raise --batch-size",
                        rt->world, (long long)b, (long long)b);
    }
    training(p, m, o, rt);
    if (inferring)
        inference(p, m, o);
    place(p, o);
    data(p, o);
}

void mgt_run_plan_free(mgt_run_plan *p) {
    free(p->model_text);
    p->model_text = NULL;
}
