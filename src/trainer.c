/* trainer.c: the train, eval, predict and summary commands over the data-parallel runtime. */
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tensor_io.h"
#include "comm.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shard.h"
#include "default_model.h"
#include "gpu.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"
#include "parse.h"
#include "profile.h"

#define CKPT_FORMAT "mgtrain-checkpoint-1"

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
    mgt_backend be;
    mgt_comm comm;
    mgt_optim opt;
    mgt_dataset train, val, test;
    int val_is_test, have_val, have_test;
    int synthetic;
    char data_dir[512];
    char data_desc[600];
    char device_desc[160];
    float *acc;         /* backend memory: metric sums since the last read */
    float *hx, *ht;     /* host staging: inputs, one-hot targets */
    int32_t *hl;        /* host staging: labels */
    int64_t *idx;       /* sample indices of a local batch */
    float *hw, *hbuf;   /* host copies of the arenas */
    /* Staged batches (backends with stage(), i.e. GPUs): two sets of device input buffers, set 0
     * being the model's own, and pinned one-hot targets per set. */
    /* dev_synth: synthetic batches generated on the device; dev_data: the training set's bytes
     * kept on the device (dev_pixels, dev_labels) and batches gathered there. */
    int staged, dev_synth, dev_data;
    uint8_t *dev_pixels, *dev_labels;
    uint64_t synth_keys[2]; /* dev_synth: the training set's pixel and template keys */
    float *in_x[2], *in_t[2], *sht[2];
    int32_t *in_l[2];
    int64_t *in_ids[2];
    float *hslot[2];
    size_t reduce_count; /* gradient floats + the step's metric sums */
    char out[512];
    int64_t global_step, step_in_epoch;
    int epoch;
    double ep[3];       /* this epoch so far: loss sum, correct, samples */
    int64_t fault_step;
    int fault_action;   /* 0 none, 1 exit, 2 sleep, 3 nan */
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

/* --gpus "0,2,3": the device of each local rank, validated before any work. Returns the count. */
static int parse_gpu_list(const char *list, int *ids, int max) {
    int n = mgt_parse_int_list(list, ids, max);
    if (n < 1)
        mgt_die_all("--gpus %s: expected a comma-separated list of device numbers, e.g. --gpus "
                    "0,2,3", list);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0)
            mgt_die_all("--gpus %s: device numbers start at 0", list);
        for (int k = 0; k < i; k++)
            if (ids[k] == ids[i])
                mgt_die_all("--gpus %s: device %d is listed twice; one rank per GPU", list,
                            ids[i]);
    }
    return n;
}

static void init_backend(job *j) {
    const char *d = j->o->device;
    const char *tr = j->o->transport ? j->o->transport : "auto";
    if (strcmp(tr, "auto") && strcmp(tr, "nccl") && strcmp(tr, "mpi"))
        mgt_die_all("--transport %s: unknown; use auto, nccl or mpi", tr);
    if (!strcmp(tr, "nccl") && !strcmp(d, "cpu"))
        mgt_die_all("--transport nccl needs the GPU backend (not --device cpu)");
    mgt_runtime *rt = j->rt;
    if (strcmp(d, "cpu") && strcmp(d, "gpu") && strcmp(d, "auto"))
        mgt_die_all("--device %s: unknown; use cpu, gpu or auto", d);
    int ids[256], nids = 0;
    if (j->o->gpus) {
        nids = parse_gpu_list(j->o->gpus, ids, 256);
        if (!strcmp(d, "cpu"))
            mgt_die_all("--gpus %s goes with --device gpu or auto, not cpu", j->o->gpus);
    }
#ifdef MGT_HAVE_CUDA
    char why[256] = "";
    int ngpu = strcmp(d, "cpu") ? mgt_gpu_count(why, sizeof why) : -1;
    if (ngpu <= 0 && (!strcmp(d, "gpu") || nids))
        mgt_die_all("%s: no usable GPU on %s (%s); run with --device cpu", nids ? "--gpus" :
                    "--device gpu", rt->host, ngpu == 0 ? "no device is visible" : why);
    if (ngpu > 0) {
        for (int i = 0; i < nids; i++)
            if (ids[i] >= ngpu)
                mgt_die_all("--gpus %s: device %d does not exist on %s: %d GPUs are visible "
                            "(numbered 0 to %d)", j->o->gpus, ids[i], rt->host, ngpu, ngpu - 1);
        int have = nids ? nids : ngpu;
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        int dev = nids ? ids[rt->local_rank] : rt->local_rank;
        /* A launcher that binds one GPU to each task (Slurm's --gpus-per-task=1) shows every
         * rank its own GPU as device 0: fine when the ranks of the node see DIFFERENT GPUs. */
        if (!nids && ngpu == 1 && rt->local_size > 1 && rt->mpi) {
            char mine[128], *all = malloc(sizeof mine * (size_t)rt->local_size);
            if (!all)
                mgt_die("out of host memory");
            mgt_gpu_describe(0, mine, sizeof mine);
            MPI_Allgather(mine, sizeof mine, MPI_CHAR, all, sizeof mine, MPI_CHAR, rt->node_comm);
            int distinct = 1;
            for (int a = 0; a < rt->local_size && distinct; a++)
                for (int b = a + 1; b < rt->local_size && distinct; b++)
                    distinct = strcmp(all + (size_t)a * sizeof mine, all + (size_t)b * sizeof mine);
            free(all);
            if (distinct) {
                have = rt->local_size;
                dev = 0;
            }
        }
        if (rt->local_size > have)
            mgt_die("rank %d on node %s: %d ranks on this node but only %d GPUs %s "
                    "(CUDA_VISIBLE_DEVICES=%s); start fewer ranks or list more GPUs",
                    rt->rank, rt->host, rt->local_size, have, nids ? "are listed in --gpus" :
                    "are visible", vis ? vis : "unset");
        mgt_err e;
        if (mgt_gpu_backend_init(&j->be, dev, j->o->tf32, &e) < 0)
            mgt_die("%s", e.msg);
        /* NCCL for more than one rank (a world of one has nothing to reduce), unless the
         * transport is named: then it runs even for one rank, so that its cost can be timed. */
        if (!strcmp(tr, "mpi") && rt->world > 1) {
            if (mgt_comm_init_mpi_staged(&j->comm, MPI_COMM_WORLD, &j->be, j->o->comm_timeout,
                                         &e) < 0)
                mgt_die("%s", e.msg);
        } else if (!strcmp(tr, "nccl") || (!strcmp(tr, "auto") && rt->world > 1)) {
            if (mgt_comm_init_nccl(&j->comm, MPI_COMM_WORLD, &j->be, j->o->comm_timeout, &e) < 0)
                mgt_die("%s", e.msg);
            j->comm.always = !strcmp(tr, "nccl");
        } else {
            mgt_comm_init_mpi(&j->comm, MPI_COMM_WORLD, j->o->comm_timeout);
        }
        char desc[128];
        mgt_gpu_describe(dev, desc, sizeof desc);
        snprintf(j->device_desc, sizeof j->device_desc, "GPU %d: %s", dev, desc);
        return;
    }
#else
    if (!strcmp(d, "gpu") || nids)
        mgt_die_all("%s: this build of mgtrain has no GPU backend (no CUDA toolkit was found "
                    "when it was built); run with --device cpu", nids ? "--gpus" : "--device gpu");
#endif
    if (j->o->tf32 && rt->rank == 0)
        fprintf(stderr, "notice: --tf32 has no effect on the CPU backend\n");
    if (!strcmp(tr, "nccl"))
        mgt_die_all("--transport nccl needs a GPU, and none is usable here; use --transport auto");
    int cores = mgt_runtime_cores(rt);
    if (mgt_cpu_backend_init(&j->be, cores) < 0)
        mgt_die("cannot start the CPU backend");
    mgt_comm_init_mpi(&j->comm, MPI_COMM_WORLD, j->o->comm_timeout);
    snprintf(j->device_desc, sizeof j->device_desc, "cpu (%d BLAS thread%s)", cores,
             cores == 1 ? "" : "s");
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
    if (mgt_model_check_batch(m, max_batch, &e) < 0) /* the same on every rank */
        mgt_die_all("%s", e.msg);
    if (mgt_model_alloc(m, &j->be, max_batch, &e) < 0)
        mgt_die("%s", e.msg);
    if (mgt_optim_init(&j->opt, &m->train, &j->be, m->param_count, &e) < 0)
        mgt_die("%s", e.msg);
    size_t in = (size_t)mgt_shape_elems(m->input);
    j->hx = malloc(sizeof(float) * in * (size_t)max_batch);
    j->ht = malloc(sizeof(float) * (size_t)m->classes * (size_t)max_batch);
    j->hl = malloc(sizeof(int32_t) * (size_t)max_batch);
    j->idx = malloc(sizeof(int64_t) * (size_t)max_batch);
    j->hw = calloc(m->param_count + 1, sizeof(float));
    j->hbuf = calloc(m->buffer_count + 1, sizeof(float));
    for (int i = 0; i < j->opt.nslots; i++)
        j->hslot[i] = calloc(m->param_count + 1, sizeof(float));
    if (!j->hx || !j->ht || !j->hl || !j->idx || !j->hw || !j->hbuf)
        mgt_die("out of host memory for a batch of %d samples", max_batch);
    const mgt_ops *o = j->be.ops;
    j->staged = o->stage && o->host_alloc;
    if (j->staged) {
        size_t xb = sizeof(float) * in * (size_t)max_batch;
        size_t tb = sizeof(float) * (size_t)m->classes * (size_t)max_batch;
        j->in_x[0] = m->x;
        j->in_l[0] = m->labels;
        j->in_t[0] = m->targets;
        j->in_x[1] = o->alloc(&j->be, xb);
        j->in_l[1] = o->alloc(&j->be, sizeof(int32_t) * (size_t)max_batch);
        j->in_t[1] = o->alloc(&j->be, tb);
        for (int i = 0; i < 2; i++) {
            j->sht[i] = o->host_alloc(&j->be, tb);
            j->in_ids[i] = o->alloc(&j->be, sizeof(int64_t) * (size_t)max_batch);
        }
        if (!j->in_x[1] || !j->in_l[1] || !j->in_t[1] || !j->sht[0] || !j->sht[1] ||
            !j->in_ids[0] || !j->in_ids[1])
            mgt_die("out of %s memory for a second batch of %d samples (input staging); a "
                    "smaller per-GPU batch needs less", o->name, max_batch);
    }
    j->reduce_count = (size_t)(m->sums - m->g) + 2;
}

/* FNV-1a over the parameter arena as this rank holds it. */
static uint64_t weights_checksum(job *j) {
    mgt_model *m = &j->m;
    j->be.ops->to_host(&j->be, j->hw, m->w, m->param_count * sizeof(float));
    const unsigned char *p = (const unsigned char *)j->hw;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < m->param_count * sizeof(float); i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static void check_same_weights(job *j, const char *when) {
    uint64_t mine = weights_checksum(j), root = mine;
    mgt_bcast(&j->comm, &root, sizeof root, 0, "weight checksum");
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
    /* Rank 0 creates it; a folder that cannot be made ends every rank alike. */
    char tmp[512], msg[700];
    const char *failed = NULL;
    snprintf(tmp, sizeof tmp, "%s", j->out);
    for (char *p = tmp + 1; j->rt->rank == 0 && !failed; p++) {
        int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
                snprintf(msg, sizeof msg,
                         "cannot create output folder %s: %s; pass --out with "
                         "a writable folder",
                         tmp, strerror(errno));
                failed = msg;
            }
            if (end)
                break;
            *p = '/';
        }
    }
    mgt_die_all_if_root(failed);
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
                     j->be.ops->name, j->data_desc, MGT_VERSION);
    snprintf(path, sizeof path, "%s/run.json", j->out);
    mgt_err e;
    if (mgt_atomic_write(path, s, (size_t)n, &e) < 0)
        mgt_die("%s", e.msg);
}

/* ---- state in and out -------------------------------------------------------------------- */

static void put_meta(mgt_meta_entry *e, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void put_meta(mgt_meta_entry *e, const char *key, const char *fmt, ...) {
    snprintf(e->key, sizeof e->key, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->value, sizeof e->value, fmt, ap);
    va_end(ap);
}

/* Batchnorm running statistics are per replica while training; before anything is saved (or
 * validated) every rank takes the average, so all replicas hold the same model. */
static void average_buffers(job *j) {
    mgt_model *m = &j->m;
    if (!m->buffer_count || j->rt->world == 1)
        return;
    const mgt_ops *o = j->be.ops;
    o->to_host(&j->be, j->hbuf, m->buf, m->buffer_count * sizeof(float));
    double *d = malloc(sizeof(double) * m->buffer_count);
    if (!d)
        mgt_die("out of host memory");
    for (size_t i = 0; i < m->buffer_count; i++)
        d[i] = j->hbuf[i];
    mgt_allreduce_host_f64(&j->comm, d, m->buffer_count, "batchnorm statistics average");
    for (size_t i = 0; i < m->buffer_count; i++)
        j->hbuf[i] = (float)(d[i] / j->rt->world);
    free(d);
    o->to_device(&j->be, m->buf, j->hbuf, m->buffer_count * sizeof(float));
}

static void fetch_state(job *j) {
    mgt_model *m = &j->m;
    const mgt_ops *o = j->be.ops;
    o->to_host(&j->be, j->hw, m->w, m->param_count * sizeof(float));
    o->to_host(&j->be, j->hbuf, m->buf, m->buffer_count * sizeof(float));
    for (int i = 0; i < j->opt.nslots; i++)
        o->to_host(&j->be, j->hslot[i], j->opt.slot[i], m->param_count * sizeof(float));
    for (size_t i = 0; i < m->param_count; i++)
        if (!isfinite(j->hw[i]))
            mgt_die("the weights hold non-finite values at step %lld; nothing was saved and the "
                    "last good checkpoint in %s is kept; lower --lr and resume",
                    (long long)j->global_step, j->out);
}

/* Collective. Rank 0 writes OUT/checkpoint.safetensors atomically. */
static void save_checkpoint(job *j) {
    average_buffers(j);
    if (j->rt->rank != 0)
        return;
    mgt_model *m = &j->m;
    fetch_state(j);
    int cap = m->nparams + m->nbuffers + 2;
    mgt_tensor_entry *t = calloc((size_t)cap, sizeof *t);
    if (!t)
        mgt_die("out of host memory");
    int nt = mgt_model_weights_entries(m, j->hw, j->hbuf, t, cap);
    for (int i = 0; i < j->opt.nslots; i++) {
        snprintf(t[nt].name, sizeof t[nt].name, "%s", j->opt.slot_name[i]);
        t[nt].ndim = 1;
        t[nt].shape[0] = (int64_t)m->param_count;
        t[nt].data = j->hslot[i];
        nt++;
    }
    mgt_meta_entry meta[16];
    int nm = 0;
    put_meta(&meta[nm++], "format", CKPT_FORMAT);
    put_meta(&meta[nm++], "model", "%s", m->name);
    put_meta(&meta[nm++], "optimizer", "%s", mgt_opt_name(m->train.optimizer));
    put_meta(&meta[nm++], "optimizer_t", "%lld", (long long)j->opt.t);
    put_meta(&meta[nm++], "step", "%lld", (long long)j->global_step);
    put_meta(&meta[nm++], "epoch", "%d", j->epoch);
    put_meta(&meta[nm++], "step_in_epoch", "%lld", (long long)j->step_in_epoch);
    put_meta(&meta[nm++], "seed", "%llu", (unsigned long long)m->train.seed);
    put_meta(&meta[nm++], "global_batch", "%lld", (long long)m->train.batch_size);
    put_meta(&meta[nm++], "world", "%d", j->rt->world);
    put_meta(&meta[nm++], "epoch_sums", "%.17g %.17g %.17g", j->ep[0], j->ep[1], j->ep[2]);
    char path[600];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", j->out);
    mgt_err e;
    if (mgt_safetensors_write(path, t, nt, meta, nm, &e) < 0)
        mgt_die("%s", e.msg);
    free(t);
}

static void save_weights(job *j) {
    average_buffers(j);
    if (j->rt->rank != 0)
        return;
    mgt_model *m = &j->m;
    fetch_state(j);
    int cap = m->nparams + m->nbuffers;
    mgt_tensor_entry *t = calloc((size_t)cap + 1, sizeof *t);
    if (!t)
        mgt_die("out of host memory");
    int nt = mgt_model_weights_entries(m, j->hw, j->hbuf, t, cap);
    mgt_meta_entry meta[4];
    int nm = 0;
    put_meta(&meta[nm++], "format", "pt");
    put_meta(&meta[nm++], "model", "%s", m->name);
    put_meta(&meta[nm++], "step", "%lld", (long long)j->global_step);
    char path[600];
    snprintf(path, sizeof path, "%s/weights.safetensors", j->out);
    mgt_err e;
    if (mgt_safetensors_write(path, t, nt, meta, nm, &e) < 0)
        mgt_die("%s", e.msg);
    free(t);
}

static int64_t meta_int(const mgt_safetensors *st, const char *path, const char *key) {
    const char *v = mgt_safetensors_meta(st, key);
    char *end;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || *end)
        mgt_die("%s: checkpoint metadata '%s' is missing or not a number; the file is not a "
                "checkpoint of this mgtrain version", path, key);
    return x;
}

/* Rank 0: fills the host arrays and the position from OUT/checkpoint.safetensors. */
static void read_checkpoint(job *j, int64_t pos[4]) {
    mgt_model *m = &j->m;
    char path[600];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", j->out);
    if (access(path, F_OK) != 0)
        mgt_die("--resume: no checkpoint at %s; start without --resume, or pass the --out "
                "folder of the run to resume", path);
    mgt_safetensors st;
    mgt_err e;
    if (mgt_safetensors_read(path, &st, &e) < 0)
        mgt_die("%s", e.msg);
    const char *fmt = mgt_safetensors_meta(&st, "format");
    if (!fmt || strcmp(fmt, CKPT_FORMAT))
        mgt_die("%s is not an mgtrain checkpoint (format %s); pass the folder of a run saved by "
                "mgtrain train", path, fmt ? fmt : "missing");
    const char *opt = mgt_safetensors_meta(&st, "optimizer");
    if (!opt || strcmp(opt, mgt_opt_name(m->train.optimizer)))
        mgt_die("%s was saved with optimizer %s but this run uses %s; resume with --optimizer %s",
                path, opt ? opt : "?", mgt_opt_name(m->train.optimizer), opt ? opt : "?");
    int64_t gb = meta_int(&st, path, "global_batch");
    if (gb != m->train.batch_size)
        mgt_die("%s was saved with global batch %lld but this run uses %lld; resume with "
                "--batch-size %lld (any number of ranks is fine)", path, (long long)gb,
                (long long)m->train.batch_size, (long long)gb);
    if (mgt_model_take_weights(m, &st, path, j->hw, j->hbuf, &e) < 0)
        mgt_die("%s", e.msg);
    for (int i = 0; i < j->opt.nslots; i++) {
        const mgt_tensor_entry *t = mgt_safetensors_find(&st, j->opt.slot_name[i]);
        if (!t || t->ndim != 1 || (size_t)t->shape[0] != m->param_count)
            mgt_die("%s: optimizer state '%s' is missing or has the wrong size; the checkpoint "
                    "belongs to another model or optimizer setting", path, j->opt.slot_name[i]);
        memcpy(j->hslot[i], t->data, m->param_count * sizeof(float));
    }
    pos[0] = meta_int(&st, path, "step");
    pos[1] = meta_int(&st, path, "epoch");
    pos[2] = meta_int(&st, path, "step_in_epoch");
    pos[3] = meta_int(&st, path, "optimizer_t");
    m->train.seed = (uint64_t)meta_int(&st, path, "seed");
    const char *sums = mgt_safetensors_meta(&st, "epoch_sums");
    if (!sums || sscanf(sums, "%lf %lf %lf", &j->ep[0], &j->ep[1], &j->ep[2]) != 3)
        mgt_die("%s: checkpoint metadata 'epoch_sums' is missing", path);
    mgt_safetensors_free(&st);
}

/* Rank 0 initialises, loads or resumes; everything is broadcast; every rank checks. */
static void start_state(job *j, const char *weights, int resume) {
    mgt_model *m = &j->m;
    const mgt_ops *o = j->be.ops;
    int64_t pos[4] = {0, 0, 0, 0};
    double sums_seed[4] = {0, 0, 0, 0};
    if (j->rt->rank == 0) {
        mgt_err e;
        if (resume)
            read_checkpoint(j, pos);
        else if (weights) {
            if (mgt_model_load_weights(m, weights, j->hw, j->hbuf, &e) < 0)
                mgt_die("%s", e.msg);
        } else
            mgt_model_init_host(m, m->train.seed, j->hw, j->hbuf);
        memcpy(sums_seed, j->ep, sizeof j->ep);
        sums_seed[3] = (double)m->train.seed;
    }
    mgt_bcast(&j->comm, j->hw, m->param_count * sizeof(float), 0, "weight broadcast");
    mgt_bcast(&j->comm, j->hbuf, m->buffer_count * sizeof(float), 0, "buffer broadcast");
    for (int i = 0; i < j->opt.nslots; i++)
        mgt_bcast(&j->comm, j->hslot[i], m->param_count * sizeof(float), 0,
                  "optimizer state broadcast");
    mgt_bcast(&j->comm, pos, sizeof pos, 0, "position broadcast");
    mgt_bcast(&j->comm, sums_seed, sizeof sums_seed, 0, "position broadcast");
    o->to_device(&j->be, m->w, j->hw, m->param_count * sizeof(float));
    o->to_device(&j->be, m->buf, j->hbuf, m->buffer_count * sizeof(float));
    for (int i = 0; i < j->opt.nslots; i++)
        o->to_device(&j->be, j->opt.slot[i], j->hslot[i], m->param_count * sizeof(float));
    j->global_step = pos[0];
    j->epoch = (int)pos[1];
    j->step_in_epoch = pos[2];
    j->opt.t = pos[3];
    memcpy(j->ep, sums_seed, sizeof j->ep);
    m->train.seed = (uint64_t)sums_seed[3];
    check_same_weights(j, "after the initial broadcast");
}

/* ---- the loops ----------------------------------------------------------------------------- */

/* One-hot targets of n labels into t (categorical loss). */
static void one_hot(const mgt_model *m, const int32_t *labels, int n, float *t) {
    memset(t, 0, sizeof(float) * (size_t)m->classes * (size_t)n);
    for (int i = 0; i < n; i++)
        t[(size_t)i * (size_t)m->classes + (size_t)labels[i]] = 1.0f;
}

/* The MGT_FAULT "nan" hook poisons a training batch's inputs. */
static void fault_poison(job *j, float *x, int n) {
    if (j->fault_action == 3 && j->global_step >= j->fault_step)
        for (size_t i = 0, e = (size_t)n * (size_t)mgt_shape_elems(j->m.input); i < e; i++)
            x[i] = NAN;
}

/* Copies a batch from host memory to the backend: inputs, labels and (categorical loss) one-hot
 * targets, on the compute queue (evaluation, prediction, and training on the CPU). */
static void upload_batch(job *j, float *x, const int32_t *labels, int n) {
    mgt_model *m = &j->m;
    const mgt_ops *o = j->be.ops;
    size_t in = (size_t)mgt_shape_elems(m->input);
    o->to_device(&j->be, m->x, x, sizeof(float) * in * (size_t)n);
    o->to_device(&j->be, m->labels, labels, sizeof(int32_t) * (size_t)n);
    if (m->train.loss == MGT_LOSS_CE) {
        one_hot(m, labels, n, j->ht);
        o->to_device(&j->be, m->targets, j->ht, sizeof(float) * (size_t)m->classes * (size_t)n);
    }
}

/* A training batch through the backend's staging (see backend.h): the copies into input set
 * `slot` run on the copy queue, and the model reads that set for this step. */
static void stage_batch(job *j, int slot, const mgt_batch *bt) {
    mgt_model *m = &j->m;
    size_t in = (size_t)mgt_shape_elems(m->input), n = (size_t)bt->n;
    int ce = m->train.loss == MGT_LOSS_CE;
    const mgt_ops *o = j->be.ops;
    if (j->dev_synth || j->dev_data) { /* only the rows travel; the batch is made on the device */
        void *dst = j->in_ids[slot];
        const void *src = bt->ids;
        size_t bytes = sizeof(int64_t) * n;
        o->stage(&j->be, slot, 1, &dst, &src, &bytes);
        float *t = ce ? j->in_t[slot] : NULL;
        if (j->dev_data) {
            o->gather_u8(&j->be, bt->n, (int64_t)in, m->classes, j->dev_pixels, j->dev_labels,
                         j->in_ids[slot], j->in_x[slot], j->in_l[slot], t);
        } else {
            o->synthetic(&j->be, bt->n, (int64_t)in, m->classes, j->synth_keys[0],
                         j->synth_keys[1], j->train.first, j->in_ids[slot], j->in_x[slot],
                         j->in_l[slot], t);
        }
        m->x = j->in_x[slot];
        m->labels = j->in_l[slot];
        m->targets = j->in_t[slot];
        return;
    }
    if (ce)
        one_hot(m, bt->labels, bt->n, j->sht[slot]);
    void *dst[3] = {j->in_x[slot], j->in_l[slot], j->in_t[slot]};
    const void *src[3] = {bt->x, bt->labels, j->sht[slot]};
    size_t bytes[3] = {sizeof(float) * in * n, sizeof(int32_t) * n,
                       ce ? sizeof(float) * (size_t)m->classes * n : 0};
    o->stage(&j->be, slot, 3, dst, src, bytes);
    m->x = j->in_x[slot];
    m->labels = j->in_l[slot];
    m->targets = j->in_t[slot];
}

/* The training set's bytes on the device, where batches are then gathered (--device-data auto,
 * a backend with gather_u8, up to 1 GiB: Fashion-MNIST's 47 MB costs less device memory than a
 * host gather costs time per step on a fast GPU). Not with the NaN fault hook, which poisons
 * host buffers. */
static void place_train_data(job *j) {
    const mgt_ops *o = j->be.ops;
    const mgt_dataset *ds = &j->train;
    size_t elems = (size_t)ds->h * (size_t)ds->w * (size_t)ds->c, n = (size_t)ds->n;
    size_t bytes = elems * n + n;
    if (!j->staged || !o->gather_u8 || !j->o->device_data || !ds->pixels || j->fault_action == 3 ||
        bytes > ((size_t)1 << 30) || n == 0)
        return;
    j->dev_pixels = o->alloc(&j->be, elems * n);
    j->dev_labels = o->alloc(&j->be, n);
    if (!j->dev_pixels || !j->dev_labels)
        mgt_die("out of %s memory for the training set (%.0f MiB); train with --device-data off",
                o->name, (double)bytes / 1048576.0);
    o->to_device(&j->be, j->dev_pixels, ds->pixels, elems * n);
    o->to_device(&j->be, j->dev_labels, ds->labels, n);
    j->dev_data = 1;
}

/* After a staged step is queued: the set is free once the queued ops have run, and the model
 * reads set 0 again (evaluation uploads into it). */
static void unstage_batch(job *j, int slot) {
    j->be.ops->stage_release(&j->be, slot);
    j->m.x = j->in_x[0];
    j->m.labels = j->in_l[0];
    j->m.targets = j->in_t[0];
}

/* Gathers samples ids[0..n) of ds and uploads them (evaluation and prediction). */
static void load_batch(job *j, const mgt_dataset *ds, const int64_t *ids, int n) {
    mgt_dataset_gather(ds, ids, n, j->hx, j->hl);
    upload_batch(j, j->hx, j->hl, n);
}

/* Loss sum, correct count and sample count over ds, sharded contiguously across ranks, reduced.
 * With outputs != NULL also keeps this rank's outputs (rows of `classes`) in dataset order. */
static void evaluate(job *j, const mgt_dataset *ds, double res[3], float *outputs, int labels) {
    mgt_model *m = &j->m;
    const mgt_ops *o = j->be.ops;
    mgt_range r = mgt_shard_range(ds->n, j->rt->rank, j->rt->world);
    o->zero(&j->be, m->sums, 2 * sizeof(float));
    double part[3] = {0, 0, (double)r.count};
    float hs[2];
    for (int64_t done = 0; done < r.count;) {
        int n = (int)(r.count - done < m->max_batch ? r.count - done : m->max_batch);
        for (int i = 0; i < n; i++)
            j->idx[i] = r.first + done + i;
        load_batch(j, ds, j->idx, n);
        mgt_step s = {.be = &j->be, .n = n, .training = 0, .global_step = j->global_step,
                      .first_sample = r.first + done, .global_n = ds->n, .seed = m->train.seed,
                      .comm = &j->comm};
        float *out = mgt_model_forward(m, &s);
        if (labels) {
            mgt_model_loss_backward(m, &s, 0);
            /* Per-batch float sums are folded into doubles so long evaluations stay exact. */
            o->to_host(&j->be, hs, m->sums, sizeof hs);
            part[0] += hs[0];
            part[1] += hs[1];
            o->zero(&j->be, m->sums, 2 * sizeof(float));
        } else {
            mgt_model_finish_output(m, &s, out);
        }
        if (outputs)
            o->to_host(&j->be, outputs + (size_t)done * (size_t)m->classes, out,
                       sizeof(float) * (size_t)n * (size_t)m->classes);
        done += n;
    }
    mgt_allreduce_host_f64(&j->comm, part, 3, "evaluation metrics");
    memcpy(res, part, sizeof part);
}

static void parse_fault(job *j) {
    /* Test hook: MGT_FAULT=RANK:STEP:exit|sleep|nan makes one rank fail at an optimizer step. */
    const char *f = getenv("MGT_FAULT");
    if (!f)
        return;
    int rank;
    long long step;
    char what[16];
    if (sscanf(f, "%d:%lld:%15s", &rank, &step, what) != 3)
        mgt_die_all("MGT_FAULT=%s: expected RANK:STEP:exit|sleep|nan", f);
    if (rank != j->rt->rank)
        return;
    j->fault_step = step;
    j->fault_action = !strcmp(what, "exit") ? 1 : !strcmp(what, "sleep") ? 2 : 3;
}

static void fault_point(job *j) {
    if (!j->fault_action || j->global_step != j->fault_step)
        return;
    if (j->fault_action == 1) {
        fprintf(stderr, "rank %d: MGT_FAULT: exiting at step %lld\n", j->rt->rank,
                (long long)j->global_step);
        fflush(stderr);
        _exit(3);
    }
    if (j->fault_action == 2) {
        fprintf(stderr, "rank %d: MGT_FAULT: stopping at step %lld\n", j->rt->rank,
                (long long)j->global_step);
        fflush(stderr);
        for (;;)
            pause();
    }
}

static void startup_block(job *j, const char *what) {
    mgt_runtime *rt = j->rt;
    mgt_model *m = &j->m;
    char mine[256];
    snprintf(mine, sizeof mine, "rank %d: %s, node %d, local rank %d, %s", rt->rank, rt->host,
             rt->node, rt->local_rank, j->device_desc);
    char *all = rt->rank == 0 ? malloc(sizeof mine * (size_t)rt->world) : NULL;
    size_t *counts = rt->rank == 0 ? malloc(sizeof(size_t) * (size_t)rt->world) : NULL;
    for (int r = 0; rt->rank == 0 && r < rt->world; r++)
        counts[r] = sizeof mine;
    mgt_gather_host(&j->comm, mine, sizeof mine, all, counts, 0, "start-up gather");
    if (rt->rank == 0) {
        int64_t b = m->train.batch_size;
        size_t params = 0;
        for (int i = 0; i < m->nparams; i++)
            params += m->params[i].count;
        printf("mgtrain %s: %s %s (%s)\n", MGT_VERSION, what, m->name, m->path);
        printf("  world: %d rank%s on %d node%s, up to %d per node; backend %s, transport %s\n",
               rt->world, rt->world > 1 ? "s" : "", rt->nodes, rt->nodes > 1 ? "s" : "",
               rt->max_local_size, j->be.ops->name, j->comm.ops->name);
        for (int r = 0; r < rt->world; r++)
            printf("  %s\n", all + (size_t)r * sizeof mine);
        printf("  data: %s\n", j->data_desc);
        printf("  batch: global %lld, per rank %lld%s\n", (long long)b,
               (long long)(b / rt->world), b % rt->world ? " or one more" : "");
        printf("  model: %zu trainable parameters; %s, learning rate %g; out: %s\n", params,
               mgt_opt_name(m->train.optimizer), m->train.lr, j->out);
        fflush(stdout);
    }
    free(all);
    free(counts);
}

static void free_job(job *j) {
    if (j->acc)
        j->be.ops->free(&j->be, j->acc);
    if (j->dev_data) {
        j->be.ops->free(&j->be, j->dev_pixels);
        j->be.ops->free(&j->be, j->dev_labels);
    }
    if (j->staged) {
        j->be.ops->free(&j->be, j->in_x[1]);
        j->be.ops->free(&j->be, j->in_l[1]);
        j->be.ops->free(&j->be, j->in_t[1]);
        for (int i = 0; i < 2; i++) {
            j->be.ops->host_free(&j->be, j->sht[i]);
            j->be.ops->free(&j->be, j->in_ids[i]);
        }
    }
    mgt_optim_free(&j->opt, &j->be);
    mgt_model_free(&j->m);
    mgt_dataset_free(&j->train);
    if (!j->val_is_test)
        mgt_dataset_free(&j->val);
    mgt_dataset_free(&j->test);
    free(j->hx);
    free(j->ht);
    free(j->hl);
    free(j->idx);
    free(j->hw);
    free(j->hbuf);
    free(j->hslot[0]);
    free(j->hslot[1]);
    mgt_comm_destroy(&j->comm);
    mgt_backend_destroy(&j->be);
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
    parse_fault(j);
    load_data(j, 1, NULL);
    make_out_dir(j);
    write_run_info(j);
    alloc_all(j);
    start_state(j, o->resume ? NULL : o->init_weights, o->resume);
    startup_block(j, o->resume ? "resuming" : "training");
    if (o->resume && rt->rank == 0)
        printf("  resumed from %s/checkpoint.safetensors at epoch %d, step %lld\n", j->out,
               j->epoch + 1, (long long)j->global_step);

    const mgt_ops *ops = j->be.ops;
    int64_t n = j->train.n, steps = mgt_shard_steps(n, B);
    mgt_err e;
    /* A loader thread pays where the rank has a core to spare for it, or a GPU computes. */
    int threaded = strcmp(ops->name, "cpu") || mgt_runtime_cores(rt) > 1;
    /* Synthetic batches are generated on the device when it can (not with the NaN fault hook,
     * which poisons host buffers). */
    j->dev_synth = j->staged && j->synthetic && ops->synthetic && j->fault_action != 3;
    if (j->dev_synth)
        mgt_dataset_synthetic_keys(&j->train, &j->synth_keys[0], &j->synth_keys[1]);
    place_train_data(j);
    mgt_loader *loader = mgt_loader_create(&j->be, &j->train, m->train.seed, B, rt->rank, rt->world,
                                           m->max_batch, threaded, j->dev_synth || j->dev_data, &e);
    if (!loader)
        mgt_die("%s", e.msg);
    int epochs = m->train.epochs;
    int64_t limit = o->max_steps > 0 ? o->max_steps : INT64_MAX;
    int64_t total = (int64_t)epochs * steps - (int64_t)j->epoch * steps - j->step_in_epoch;
    if (limit - j->global_step < total)
        total = limit - j->global_step;
    mgt_profile prof;
    if (mgt_profile_init(&prof, o->profile || o->timeline, total > 0 ? total : 1, &j->be, &e) < 0)
        mgt_die("%s", e.msg);
    mgt_metrics mt;
    mgt_metrics_init(&mt, rt->rank == 0 ? o->verbose : 0, epochs, j->out, rt->launched);
    double last_val[3] = {-1, 0, 0};
    int64_t last_val_step = -1, trained = 0;
    double train_seconds = 0;
    float hs[2];
    int64_t read_every = strcmp(ops->name, "cpu") ? 20 : 1, read_at = j->global_step, pending = 0;
    j->acc = ops->alloc(&j->be, 16 * sizeof(float));
    if (!j->acc)
        mgt_die("out of %s memory for the metric sums", ops->name);

    for (; j->epoch < epochs && j->global_step < limit; j->epoch++) {
        if (j->staged) /* the loader refills both slots now; evaluation may have used set 0 */
            for (int k = 0; k < 2; k++) {
                ops->stage_wait(&j->be, k);
                ops->stage_release(&j->be, k);
            }
        mgt_loader_begin_epoch(loader, j->epoch, j->step_in_epoch);
        double t_epoch = mgt_now();
        int64_t seen_before = (int64_t)j->ep[2], first_step = j->step_in_epoch;
        for (; j->step_in_epoch < steps && j->global_step < limit; j->step_in_epoch++) {
            fault_point(j);
            int64_t step = j->step_in_epoch;
            mgt_profile_begin_step(&prof, j->global_step);
            int slot = (int)(j->global_step & 1);
            /* The loader refills the previous step's host buffers once we ask for the next
             * batch: their copies must be done by then (this also bounds how far the host runs
             * ahead of the device). */
            if (j->staged)
                ops->stage_wait(&j->be, slot ^ 1);
            const mgt_batch *bt = mgt_loader_next(loader);
            if (bt->step != step)
                mgt_die("data loader delivered step %lld for step %lld; please report this",
                        (long long)bt->step, (long long)step);
            int64_t b = bt->global_n;
            mgt_range r = {bt->first, bt->n};
            if (bt->x) /* NULL when the batch is made on the device */
                fault_poison(j, bt->x, bt->n);
            if (j->staged)
                stage_batch(j, slot, bt);
            else
                upload_batch(j, bt->x, bt->labels, bt->n);
            ops->zero(&j->be, m->sums, 2 * sizeof(float));
            mgt_profile_phase(&prof, MGT_PH_DATA);
            mgt_step s = {.be = &j->be, .n = (int)r.count, .training = 1,
                          .global_step = j->global_step, .first_sample = r.first, .global_n = b,
                          .seed = m->train.seed, .comm = &j->comm};
            mgt_model_forward(m, &s);
            mgt_profile_phase(&prof, MGT_PH_FORWARD);
            mgt_model_loss_backward(m, &s, 1);
            mgt_profile_phase(&prof, MGT_PH_BACKWARD);
            /* The one collective of the step: gradient sums and the step's loss/accuracy sums. */
            mgt_allreduce_sum(&j->comm, m->g, j->reduce_count, "gradient all-reduce");
            mgt_profile_phase(&prof, MGT_PH_ALLREDUCE);
            /* Metrics stay in backend memory and are read once per interval (every step on the
             * CPU, where it is free; a GPU would otherwise wait on the host every step). */
            ops->add(&j->be, 2, m->sums, j->acc);
            pending += b;
            int64_t next = j->global_step + 1;
            if (next - read_at >= read_every || step + 1 == steps || next >= limit ||
                (o->save_every > 0 && next % o->save_every == 0) ||
                (o->debug_check > 0 && next % o->debug_check == 0)) {
                ops->to_host(&j->be, hs, j->acc, sizeof hs);
                ops->zero(&j->be, j->acc, 2 * sizeof(float));
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
            mgt_optim_step(&j->opt, &j->be, m->w, m->g, b);
            if (j->staged)
                unstage_batch(j, slot);
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
    mgt_loader_destroy(loader);
    if (mgt_profile_report(&prof, &j->comm, o->timeline, &e) < 0)
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
        if (!strcmp(j->be.ops->name, "gpu"))
            printf("Peak GPU memory: %.1f MiB on rank 0 (mgtrain's own allocations, the CUDA "
                   "context excluded)\n", (double)mgt_gpu_peak_bytes(&j->be) / 1048576.0);
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
    mgt_gatherv(&j->comm, mine, (size_t)r.count * (size_t)k, all, counts, 0, "prediction gather");
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
