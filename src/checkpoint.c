/* checkpoint.c: the checkpoint and weights files (see checkpoint.h for what each holds). */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/shard.h"
#include "tensor_io.h"

/* Bumped whenever a key or a tensor changes meaning: an older file is then refused by name. */
#define CKPT_FORMAT "mgtrain-checkpoint-1"

/* The metadata keys. Numbers are written as decimal text (safetensors metadata is strings). */
#define KEY_FORMAT "format"
#define KEY_MODEL "model"
#define KEY_MODEL_HASH "model_hash"
#define KEY_OPTIMIZER "optimizer"
#define KEY_OPTIMIZER_T "optimizer_t"
#define KEY_STEP "step"
#define KEY_EPOCH "epoch"
#define KEY_STEP_IN_EPOCH "step_in_epoch"
#define KEY_SEED "seed"
#define KEY_GLOBAL_BATCH "global_batch"
#define KEY_WORLD "world"
#define KEY_EPOCH_SUMS "epoch_sums"
/* The task sums, TASK_PER_KEY a key: epoch_task_sums, then epoch_task_sums_2, _3, ... */
#define KEY_EPOCH_TASK "epoch_task_sums"
#define KEY_BEST_VAL_LOSS "best_val_loss"
#define KEY_VAL_LOSS "val_loss"
#define KEY_MONITOR "validation_history" /* monitor.h's state; absent: none yet */
#define KEY_REPRO "reproducible_chunk"   /* --reproducible's chunk; 0 or absent: off */
#define KEY_FROZEN "frozen"              /* mgt_model_frozen_id; absent: none frozen */

enum { TASK_PER_KEY = 10, TASK_KEYS = (MGT_TASK_SUMS_MAX + TASK_PER_KEY - 1) / TASK_PER_KEY };
enum { MAX_META = 16 + TASK_KEYS };

/* The metadata key of the task sums from number i on. */
static void task_key(char *key, size_t n, int i) {
    if (i < TASK_PER_KEY)
        snprintf(key, n, "%s", KEY_EPOCH_TASK);
    else
        snprintf(key, n, "%s_%d", KEY_EPOCH_TASK, i / TASK_PER_KEY + 1);
}

static void put_meta(mgt_meta_entry *e, int *n, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put_meta(mgt_meta_entry *e, int *n, const char *key, const char *fmt, ...) {
    mgt_meta_entry *m = &e[(*n)++];
    snprintf(m->key, sizeof m->key, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->value, sizeof m->value, fmt, ap);
    va_end(ap);
}

static void file_path(char *path, size_t n, const char *dir, const char *name) {
    snprintf(path, n, "%s/%s", dir, name);
}

/* FNV-1a, 64 bits, over a string. */
static uint64_t fnv1a(uint64_t h, const char *s) {
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

uint64_t mgt_ckpt_model_hash(const mgt_model *m) {
    /* What makes the model this model: its input, each layer's type, name, output and activation,
     * and every tensor's name and shape; not its [train] settings, which have checks of their
     * own (or may change on resume, as the learning rate), nor the convolution algorithm. */
    char item[256];
    uint64_t h = 1469598103934665603ULL;
    snprintf(item, sizeof item, "input %d,%d,%d;", m->input.h, m->input.w, m->input.c);
    h = fnv1a(h, item);
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        snprintf(item, sizeof item, "%s %s %d,%d,%d act %d;", l->type->name, l->name, l->out.h,
                 l->out.w, l->out.c, (int)l->act);
        h = fnv1a(h, item);
    }
    const mgt_param *lists[2] = {m->params, m->buffers};
    const int counts[2] = {m->nparams, m->nbuffers};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < counts[k]; i++) {
            const mgt_param *p = &lists[k][i];
            int n = snprintf(item, sizeof item, "%s %s", k ? "buffer" : "param", p->name);
            for (int d = 0; d < p->ndim && n > 0 && (size_t)n < sizeof item; d++)
                n += snprintf(item + n, sizeof item - (size_t)n, " %lld", (long long)p->shape[d]);
            h = fnv1a(fnv1a(h, item), ";");
        }
    return h;
}

/* The model's tensors (PyTorch's state_dict order), then `extra` free entries for the caller. */
static mgt_tensor_entry *model_entries(const mgt_model *m, const float *w, const float *buf,
                                       int extra, int *nt, mgt_err *err) {
    const int cap = m->nparams + m->nbuffers;
    mgt_tensor_entry *t = calloc((size_t)(cap + extra) + 1, sizeof *t);
    if (!t) {
        mgt_errf(err, "out of host memory for the list of %d tensors", cap + extra);
        return NULL;
    }
    *nt = mgt_model_weights_entries(m, w, buf, t, cap);
    return t;
}

int mgt_ckpt_write(const char *dir, const mgt_model *m, const mgt_optim *opt,
                   const mgt_ckpt_run *run, const mgt_ckpt_arrays *a, const mgt_ckpt_pos *pos,
                   int world, mgt_err *err) {
    int nt;
    mgt_tensor_entry *t = model_entries(m, a->w, a->buf, opt->nslots, &nt, err);
    if (!t)
        return -1;
    for (int i = 0; i < opt->nslots; i++) {
        snprintf(t[nt].name, sizeof t[nt].name, "%s", opt->slot_name[i]);
        t[nt].ndim = 1;
        t[nt].shape[0] = (int64_t)m->grad_count;
        t[nt].data = a->slot[i];
        nt++;
    }
    mgt_meta_entry meta[MAX_META];
    int nm = 0;
    put_meta(meta, &nm, KEY_FORMAT, "%s", CKPT_FORMAT);
    put_meta(meta, &nm, KEY_MODEL, "%s", m->name);
    put_meta(meta, &nm, KEY_MODEL_HASH, "%016" PRIx64, mgt_ckpt_model_hash(m));
    put_meta(meta, &nm, KEY_OPTIMIZER, "%s", mgt_opt_name(opt->cfg.optimizer));
    put_meta(meta, &nm, KEY_OPTIMIZER_T, "%" PRId64, pos->optimizer_t);
    put_meta(meta, &nm, KEY_STEP, "%" PRId64, pos->step);
    put_meta(meta, &nm, KEY_EPOCH, "%" PRId64, pos->epoch);
    put_meta(meta, &nm, KEY_STEP_IN_EPOCH, "%" PRId64, pos->step_in_epoch);
    put_meta(meta, &nm, KEY_SEED, "%" PRIu64, pos->seed);
    put_meta(meta, &nm, KEY_GLOBAL_BATCH, "%" PRId64, run->step_batch);
    put_meta(meta, &nm, KEY_WORLD, "%d", world);
    put_meta(meta, &nm, KEY_REPRO, "%" PRId64, run->chunk);
    char frozen[64];
    mgt_model_frozen_id(m, frozen, sizeof frozen);
    put_meta(meta, &nm, KEY_FROZEN, "%s", frozen);
    /* %.17g: every double comes back bit for bit, so a resumed epoch reports the same loss. */
    put_meta(meta, &nm, KEY_EPOCH_SUMS, "%.17g %.17g %.17g %.17g", pos->epoch_sums[0],
             pos->epoch_sums[1], pos->epoch_sums[2], pos->epoch_sums[3]);
    const int ntask = mgt_model_task_sums(m);
    for (int i = 0; i < ntask; i += TASK_PER_KEY) {
        char key[64], v[256] = "";
        task_key(key, sizeof key, i);
        for (int j = i; j < ntask && j < i + TASK_PER_KEY; j++)
            snprintf(v + strlen(v), sizeof v - strlen(v), "%s%.17g", j > i ? " " : "",
                     pos->epoch_task[j]);
        put_meta(meta, &nm, key, "%s", v);
    }
    put_meta(meta, &nm, KEY_BEST_VAL_LOSS, "%.17g", pos->best_val_loss);
    char history[256];
    mgt_monitor_format(&pos->mon, history, sizeof history);
    put_meta(meta, &nm, KEY_MONITOR, "%s", history);
    char path[600];
    file_path(path, sizeof path, dir, "checkpoint.safetensors");
    int rc = mgt_safetensors_write(path, t, nt, meta, nm, err);
    free(t);
    return rc;
}

int mgt_ckpt_write_weights(const char *dir, const char *file, const mgt_model *m, const float *w,
                           const float *buf, int64_t step, double val_loss, mgt_err *err) {
    int nt;
    mgt_tensor_entry *t = model_entries(m, w, buf, 0, &nt, err);
    if (!t)
        return -1;
    mgt_meta_entry meta[4];
    int nm = 0;
    put_meta(meta, &nm, KEY_FORMAT, "pt");
    put_meta(meta, &nm, KEY_MODEL, "%s", m->name);
    put_meta(meta, &nm, KEY_STEP, "%" PRId64, step);
    if (val_loss >= 0)
        put_meta(meta, &nm, KEY_VAL_LOSS, "%.17g", val_loss);
    char path[600];
    file_path(path, sizeof path, dir, file);
    int rc = mgt_safetensors_write(path, t, nt, meta, nm, err);
    free(t);
    return rc;
}

/* A whole-number metadata value; signed keys must also fit an int64_t. */
static int meta_u64(const mgt_safetensors *st, const char *path, const char *key, int is_signed,
                    uint64_t *out, mgt_err *err) {
    const char *v = mgt_safetensors_meta(st, key);
    char *end = NULL;
    errno = 0;
    uint64_t x = 0;
    if (v && *v && (is_signed || *v != '-'))
        x = is_signed ? (uint64_t)strtoll(v, &end, 10) : strtoull(v, &end, 10);
    if (!v || !end || *end || errno)
        return mgt_errf(err,
                        "%s: checkpoint metadata '%s' is missing or not a number; the file "
                        "is not a checkpoint of this mgtrain version",
                        path, key);
    *out = x;
    return 0;
}

static int meta_i64(const mgt_safetensors *st, const char *path, const char *key, int64_t *out,
                    mgt_err *err) {
    uint64_t x = 0;
    if (meta_u64(st, path, key, 1, &x, err) < 0)
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* Another model's checkpoint is named as such before anything else is compared: its optimizer,
 * batch or tensors differ too, and each of those would point at the wrong fix. The structure
 * hash catches a model file of the same name that was edited since (files older than the hash
 * are left to the tensor checks). */
static int check_model(const mgt_safetensors *st, const char *path, const mgt_model *m,
                       mgt_err *err) {
    const char *saved = mgt_safetensors_meta(st, KEY_MODEL);
    if (!saved || strcmp(saved, m->name))
        return mgt_errf(err,
                        "%s is a checkpoint of model %s, but this run's model is %s (%s); resume "
                        "with --model and the model file of %s (its run folder keeps a copy), "
                        "or train %s into another --out",
                        path, saved ? saved : "?", m->name, m->path, saved ? saved : "?", m->name);
    const char *hash = mgt_safetensors_meta(st, KEY_MODEL_HASH);
    char mine[17];
    snprintf(mine, sizeof mine, "%016" PRIx64, mgt_ckpt_model_hash(m));
    if (hash && strcmp(hash, mine))
        return mgt_errf(err,
                        "%s is a checkpoint of another model named %s: its layers or their sizes "
                        "differ from %s's; resume with the model file the run was started with "
                        "(its run folder keeps a copy), or train into another --out",
                        path, m->name, m->path);
    return 0;
}

/* A whole-number metadata value within [lo, hi]. */
static int meta_range(const mgt_safetensors *st, const char *path, const char *key, int64_t lo,
                      int64_t hi, int64_t *out, mgt_err *err) {
    if (meta_i64(st, path, key, out, err) < 0)
        return -1;
    if (*out < lo || *out > hi)
        return mgt_errf(err,
                        "%s: checkpoint metadata %s = %lld is out of range (%lld to %lld); the "
                        "file was not written by mgtrain as it is: resume from another checkpoint "
                        "or train into another --out",
                        path, key, (long long)*out, (long long)lo, (long long)hi);
    return 0;
}

/* The position's fields, each within what a run can have written, whatever the data: the step
 * counts are not negative, the optimizer has not stepped more often than training, the epoch's
 * sums are finite with correct predictions among the samples seen, which are at most the epoch's
 * steps times the samples of a step. mgt_ckpt_check_position then checks them against the data. */
static int read_position(const mgt_safetensors *st, const char *path, const mgt_ckpt_run *run,
                         const mgt_model *m, mgt_ckpt_pos *pos, mgt_err *err) {
    const int ntask = mgt_model_task_sums(m);
    int64_t world;
    if (meta_range(st, path, KEY_STEP, 0, INT64_MAX / 2, &pos->step, err) < 0 ||
        meta_range(st, path, KEY_EPOCH, 0, pos->step, &pos->epoch, err) < 0 ||
        meta_range(st, path, KEY_STEP_IN_EPOCH, 0, pos->step, &pos->step_in_epoch, err) < 0 ||
        meta_range(st, path, KEY_OPTIMIZER_T, 0, pos->step, &pos->optimizer_t, err) < 0 ||
        meta_range(st, path, KEY_WORLD, 1, INT32_MAX, &world, err) < 0 ||
        meta_u64(st, path, KEY_SEED, 0, &pos->seed, err) < 0)
        return -1;
    const char *sums = mgt_safetensors_meta(st, KEY_EPOCH_SUMS);
    double *s = pos->epoch_sums;
    char rest = 0;
    /* Three numbers in checkpoints from before top-5 was counted: that epoch's top-5 is not
     * known (-1), the next epochs' are. */
    const int got = sums ? sscanf(sums, "%lf %lf %lf %lf %c", &s[0], &s[1], &s[2], &s[3], &rest) : 0;
    if (got == 3)
        s[3] = -1;
    else if (got != 4)
        return mgt_errf(err, "%s: checkpoint metadata 'epoch_sums' is missing or malformed", path);
    /* The counts are whole numbers of samples, or for a sequence model fractions of them (a
     * sample's share is its positions' mean: model.h). */
    const double most = (double)pos->step_in_epoch * (double)run->step_batch;
    /* binary cross-entropy counts an output right or wrong, one per label of a sample, and no
     * top-5 (cross-entropy's: among the samples, at least the correct ones) */
    const double per = m->loss == MGT_LOSS_BCE ? (double)m->classes : 1.0;
    const int top5 = mgt_loss_is_xent(m->loss);
    if (!isfinite(s[0]) || !isfinite(s[1]) || !isfinite(s[2]) || !isfinite(s[3]) || s[0] < 0 ||
        s[1] < 0 || s[1] > s[2] * per || s[2] > most || s[2] != floor(s[2]) ||
        (s[3] != -1 && top5 && (s[3] < s[1] || s[3] > s[2])))
        return mgt_errf(err,
                        "%s: checkpoint metadata epoch_sums = %s is out of range (a finite loss "
                        "sum, correct predictions among at most %.0f samples); resume from "
                        "another checkpoint or train into another --out",
                        path, sums, most);
    /* The task's sums: finite, the counts whole numbers (model.h); each key as written. */
    for (int i = 0; i < ntask; i += TASK_PER_KEY) {
        char key[64];
        task_key(key, sizeof key, i);
        const char *v = mgt_safetensors_meta(st, key);
        int used = 0, ok = v != NULL;
        for (int j = i; ok && j < ntask && j < i + TASK_PER_KEY; j++) {
            double *x = &pos->epoch_task[j];
            int k = 0;
            ok = sscanf(v + used, "%lf%n", x, &k) == 1 && isfinite(*x) && *x >= 0;
            used += k;
        }
        if (ok)
            ok = sscanf(v + used, " %c", &rest) != 1;
        if (!ok)
            return mgt_errf(err,
                            "%s: checkpoint metadata '%s' is missing or malformed (the epoch's "
                            "sums of this model's loss); resume from another checkpoint or "
                            "train into another --out",
                            path, key);
    }
    /* The best validation loss so far (checkpoints before best.safetensors have none). */
    const char *best = mgt_safetensors_meta(st, KEY_BEST_VAL_LOSS);
    pos->best_val_loss = -1;
    if (best &&
        (sscanf(best, "%lf %c", &pos->best_val_loss, &rest) != 1 || !isfinite(pos->best_val_loss) ||
         (pos->best_val_loss < 0 && pos->best_val_loss != -1)))
        return mgt_errf(err,
                        "%s: checkpoint metadata best_val_loss = %s is out of range (a finite "
                        "loss, or -1 for none); resume from another checkpoint or train into "
                        "another --out",
                        path, best);
    /* Early stopping's and the plateau schedule's decisions so far (older checkpoints: none). */
    const char *mon = mgt_safetensors_meta(st, KEY_MONITOR);
    memset(&pos->mon, 0, sizeof pos->mon);
    if (mon && mgt_monitor_parse(mon, &pos->mon, err) < 0)
        return mgt_errf(err,
                        "%s: checkpoint metadata '%s' ('%s') is damaged; resume from an "
                        "intact checkpoint",
                        path, KEY_MONITOR, mon);
    return 0;
}

/* The checks, in the order a user would want to hear about them: not a checkpoint at all,
 * another model, another optimizer, another global batch, then tensors, then the numbers. */
static int read_checked(const mgt_safetensors *st, const char *path, const mgt_model *m,
                        const mgt_optim *opt, const mgt_ckpt_run *run, mgt_ckpt_arrays *a,
                        mgt_ckpt_pos *pos, mgt_err *err) {
    const char *fmt = mgt_safetensors_meta(st, KEY_FORMAT);
    if (!fmt || strcmp(fmt, CKPT_FORMAT))
        return mgt_errf(err,
                        "%s is not an mgtrain checkpoint (format %s); pass the folder of a "
                        "run saved by mgtrain train",
                        path, fmt ? fmt : "missing");
    if (check_model(st, path, m, err) < 0)
        return -1;
    const char *name = mgt_opt_name(opt->cfg.optimizer);
    const char *saved = mgt_safetensors_meta(st, KEY_OPTIMIZER);
    if (!saved || strcmp(saved, name))
        return mgt_errf(err,
                        "%s was saved with optimizer %s but this run uses %s; resume with "
                        "--optimizer %s",
                        path, saved ? saved : "?", name, saved ? saved : "?");
    int64_t gb;
    if (meta_i64(st, path, KEY_GLOBAL_BATCH, &gb, err) < 0)
        return -1;
    if (gb != run->step_batch)
        return mgt_errf(err,
                        "%s was saved with global batch %lld but this run uses %lld; resume "
                        "with --batch-size %lld (any number of ranks is fine; with "
                        "--accum-steps K, a batch size of %lld / K)",
                        path, (long long)gb, (long long)run->step_batch, (long long)gb,
                        (long long)gb);
    /* --reproducible: the bits of the steps after the checkpoint depend on the mode and its
     * chunk, so a resumed run keeps both (any rank count). Checkpoints from before the key are
     * of the default mode. */
    int64_t chunk = 0;
    if (mgt_safetensors_meta(st, KEY_REPRO) &&
        meta_range(st, path, KEY_REPRO, 0, (int64_t)1 << 24, &chunk, err) < 0)
        return -1;
    if (chunk != run->chunk) {
        if (!chunk)
            return mgt_errf(err,
                            "%s was saved without --reproducible; resume it without "
                            "--reproducible (and without reproducible = true in [train])",
                            path);
        return mgt_errf(err,
                        "%s was saved with --reproducible --repro-chunk %lld; resume with "
                        "--reproducible --repro-chunk %lld (any number of ranks is fine) to "
                        "continue it bit for bit",
                        path, (long long)chunk, (long long)chunk);
    }
    /* The optimizer's state covers the trainable tensors only: the same layers must be frozen
     * (checkpoints from before the key froze none). */
    char frozen[64];
    mgt_model_frozen_id(m, frozen, sizeof frozen);
    const char *was = mgt_safetensors_meta(st, KEY_FROZEN);
    if (strcmp(was ? was : "0 0000000000000000", frozen)) {
        const int n_was = was ? atoi(was) : 0, n_now = atoi(frozen);
        return mgt_errf(err,
                        "%s was saved with %d frozen layer%s, but this run freezes %s%d; resume "
                        "with the run's --freeze (and trainable = false keys) as they were, or "
                        "start a new run from its weights with --init-weights",
                        path, n_was, n_was == 1 ? "" : "s",
                        n_was == n_now ? "another set of " : "", n_now);
    }
    if (mgt_model_take_weights(m, st, path, a->w, a->buf, err) < 0)
        return -1;
    for (int i = 0; i < opt->nslots; i++) {
        const mgt_tensor_entry *t = mgt_safetensors_find(st, opt->slot_name[i]);
        if (!t || t->ndim != 1 || (size_t)t->shape[0] != m->grad_count)
            return mgt_errf(err,
                            "%s: optimizer state '%s' is missing or has the wrong size; the "
                            "checkpoint belongs to another model or optimizer setting",
                            path, opt->slot_name[i]);
        memcpy(a->slot[i], t->data, m->grad_count * sizeof(float));
    }
    return read_position(st, path, run, m, pos, err);
}

int mgt_ckpt_read(const char *dir, const mgt_model *m, const mgt_optim *opt,
                  const mgt_ckpt_run *run, mgt_ckpt_arrays *a, mgt_ckpt_pos *pos, mgt_err *err) {
    char path[600];
    file_path(path, sizeof path, dir, "checkpoint.safetensors");
    if (access(path, F_OK) != 0)
        return mgt_errf(err,
                        "--resume: no checkpoint at %s; start without --resume, or pass the "
                        "--out folder of the run to resume",
                        path);
    mgt_safetensors st;
    if (mgt_safetensors_read(path, &st, err) < 0)
        return -1;
    int rc = read_checked(&st, path, m, opt, run, a, pos, err);
    mgt_safetensors_free(&st);
    return rc;
}

int mgt_ckpt_model_of(const char *dir, char *name, size_t n, uint64_t *hash, mgt_err *err) {
    char path[600];
    file_path(path, sizeof path, dir, "checkpoint.safetensors");
    if (access(path, F_OK) != 0)
        return 0;
    mgt_safetensors st;
    if (mgt_safetensors_read(path, &st, err) < 0)
        return -1;
    const char *fmt = mgt_safetensors_meta(&st, KEY_FORMAT);
    const char *model = mgt_safetensors_meta(&st, KEY_MODEL);
    const char *h = mgt_safetensors_meta(&st, KEY_MODEL_HASH);
    int rc = 1;
    if (!fmt || strcmp(fmt, CKPT_FORMAT) || !model)
        rc = mgt_errf(err, "%s is not an mgtrain checkpoint (format %s)", path,
                      fmt ? fmt : "missing");
    else {
        snprintf(name, n, "%s", model);
        *hash = h ? strtoull(h, NULL, 16) : 0;
    }
    mgt_safetensors_free(&st);
    return rc;
}

int mgt_ckpt_check_position(const mgt_ckpt_pos *pos, const char *dir, int64_t samples,
                            int64_t batch, mgt_err *err) {
    const int64_t steps = mgt_shard_steps(samples, batch);
    /* Where the epoch count and the step within the epoch put the step count, with this data. */
    const int over = pos->epoch > (INT64_MAX - pos->step_in_epoch) / steps;
    const int64_t at = over ? -1 : pos->epoch * steps + pos->step_in_epoch;
    const double seen =
        pos->step_in_epoch == steps ? (double)samples : (double)pos->step_in_epoch * (double)batch;
    if (pos->step_in_epoch > steps || at != pos->step || pos->epoch_sums[2] != seen)
        return mgt_errf(err,
                        "%s/checkpoint.safetensors: its position (epoch %lld, step %lld of the "
                        "epoch, %lld steps in all, %.0f samples seen in the epoch) does not fit "
                        "this data: %lld training samples at global batch %lld make %lld steps "
                        "an epoch; resume with the data (--data, --val-split, "
                        "--synthetic-samples) the run was started with",
                        dir, (long long)pos->epoch + 1, (long long)pos->step_in_epoch,
                        (long long)pos->step, pos->epoch_sums[2], (long long)samples,
                        (long long)batch, (long long)steps);
    return 0;
}

static void numbered_path(char *path, size_t n, const char *dir, int64_t step) {
    snprintf(path, n, "%s/checkpoint-%" PRId64 ".safetensors", dir, step);
}

int mgt_ckpt_keep_previous(const char *dir, int64_t prev_step, mgt_err *err) {
    char cur[600], kept[640];
    file_path(cur, sizeof cur, dir, "checkpoint.safetensors");
    numbered_path(kept, sizeof kept, dir, prev_step);
    if (unlink(kept) != 0 && errno != ENOENT)
        return mgt_errf(err, "cannot replace %s: %s", kept, strerror(errno));
    if (link(cur, kept) == 0 || errno == ENOENT) /* none yet: nothing to keep */
        return 0;
    /* No hard links here (some network and FUSE file systems): a copy of the bytes. */
    char *bytes;
    size_t len;
    if (mgt_read_text_file(cur, "checkpoint", SIZE_MAX / 2, &bytes, &len, err) < 0)
        return -1;
    int rc = mgt_atomic_write(kept, bytes, len, err);
    free(bytes);
    return rc;
}

/* Newest first. */
static int by_step_desc(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int mgt_ckpt_prune(const char *dir, int64_t keep, mgt_err *err) {
    DIR *dh = opendir(dir);
    if (!dh)
        return mgt_errf(err, "cannot list %s: %s", dir, strerror(errno));
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct dirent *e; (e = readdir(dh));) {
        long long step;
        char tail[16];
        if (sscanf(e->d_name, "checkpoint-%lld%15s", &step, tail) != 2 ||
            strcmp(tail, ".safetensors") || step < 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *more = realloc(steps, cap * sizeof *steps);
            if (!more) {
                rc = mgt_errf(err, "out of memory listing %s", dir);
                break;
            }
            steps = more;
        }
        steps[n++] = step;
    }
    closedir(dh);
    if (n)
        qsort(steps, n, sizeof *steps, by_step_desc);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if ((int64_t)i < keep - 1)
            continue;
        char path[640];
        numbered_path(path, sizeof path, dir, steps[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            rc = mgt_errf(err, "cannot remove the old checkpoint %s: %s", path, strerror(errno));
    }
    free(steps);
    return rc;
}

void mgt_ckpt_bcast_pos(mgt_comm *c, mgt_ckpt_pos *pos, int root) {
    /* Every field is 8 bytes: the struct has no padding, so its bytes are its values. */
    _Static_assert(sizeof(mgt_ckpt_pos) == (18 + MGT_TASK_SUMS_MAX) * sizeof(int64_t),
                   "mgt_ckpt_pos has padding");
    mgt_bcast(c, pos, sizeof *pos, root, "position broadcast");
}
