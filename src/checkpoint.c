/* checkpoint.c: the checkpoint and weights files (see checkpoint.h for what each holds). */
#include "checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensor_io.h"

/* Bumped whenever a key or a tensor changes meaning: an older file is then refused by name. */
#define CKPT_FORMAT "mgtrain-checkpoint-1"

/* The metadata keys. Numbers are written as decimal text (safetensors metadata is strings). */
#define KEY_FORMAT "format"
#define KEY_MODEL "model"
#define KEY_OPTIMIZER "optimizer"
#define KEY_OPTIMIZER_T "optimizer_t"
#define KEY_STEP "step"
#define KEY_EPOCH "epoch"
#define KEY_STEP_IN_EPOCH "step_in_epoch"
#define KEY_SEED "seed"
#define KEY_GLOBAL_BATCH "global_batch"
#define KEY_WORLD "world"
#define KEY_EPOCH_SUMS "epoch_sums"
#define KEY_MONITOR "validation_history" /* monitor.h's state; absent: none yet */

enum { MAX_META = 16 };

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
                   const mgt_ckpt_arrays *a, const mgt_ckpt_pos *pos, int world, mgt_err *err) {
    int nt;
    mgt_tensor_entry *t = model_entries(m, a->w, a->buf, opt->nslots, &nt, err);
    if (!t)
        return -1;
    for (int i = 0; i < opt->nslots; i++) {
        snprintf(t[nt].name, sizeof t[nt].name, "%s", opt->slot_name[i]);
        t[nt].ndim = 1;
        t[nt].shape[0] = (int64_t)m->param_count;
        t[nt].data = a->slot[i];
        nt++;
    }
    mgt_meta_entry meta[MAX_META];
    int nm = 0;
    put_meta(meta, &nm, KEY_FORMAT, "%s", CKPT_FORMAT);
    put_meta(meta, &nm, KEY_MODEL, "%s", m->name);
    put_meta(meta, &nm, KEY_OPTIMIZER, "%s", mgt_opt_name(m->train.optimizer));
    put_meta(meta, &nm, KEY_OPTIMIZER_T, "%" PRId64, pos->optimizer_t);
    put_meta(meta, &nm, KEY_STEP, "%" PRId64, pos->step);
    put_meta(meta, &nm, KEY_EPOCH, "%" PRId64, pos->epoch);
    put_meta(meta, &nm, KEY_STEP_IN_EPOCH, "%" PRId64, pos->step_in_epoch);
    put_meta(meta, &nm, KEY_SEED, "%" PRIu64, pos->seed);
    put_meta(meta, &nm, KEY_GLOBAL_BATCH, "%" PRId64, m->train.batch_size);
    put_meta(meta, &nm, KEY_WORLD, "%d", world);
    /* %.17g: every double comes back bit for bit, so a resumed epoch reports the same loss. */
    put_meta(meta, &nm, KEY_EPOCH_SUMS, "%.17g %.17g %.17g", pos->epoch_sums[0], pos->epoch_sums[1],
             pos->epoch_sums[2]);
    char history[256];
    mgt_monitor_format(&pos->mon, history, sizeof history);
    put_meta(meta, &nm, KEY_MONITOR, "%s", history);
    char path[600];
    file_path(path, sizeof path, dir, "checkpoint.safetensors");
    int rc = mgt_safetensors_write(path, t, nt, meta, nm, err);
    free(t);
    return rc;
}

int mgt_ckpt_write_weights(const char *dir, const mgt_model *m, const float *w, const float *buf,
                           int64_t step, mgt_err *err) {
    return mgt_ckpt_write_weights_file(dir, "weights.safetensors", m, w, buf, step, err);
}

int mgt_ckpt_write_weights_file(const char *dir, const char *name, const mgt_model *m,
                                const float *w, const float *buf, int64_t step, mgt_err *err) {
    int nt;
    mgt_tensor_entry *t = model_entries(m, w, buf, 0, &nt, err);
    if (!t)
        return -1;
    mgt_meta_entry meta[4];
    int nm = 0;
    put_meta(meta, &nm, KEY_FORMAT, "pt");
    put_meta(meta, &nm, KEY_MODEL, "%s", m->name);
    put_meta(meta, &nm, KEY_STEP, "%" PRId64, step);
    char path[600];
    file_path(path, sizeof path, dir, name);
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
    if (v && *v && *v != '-')
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

/* The checks, in the order a user would want to hear about them: not a checkpoint at all,
 * another optimizer, another global batch, then tensors (another model), then the numbers. */
static int read_checked(const mgt_safetensors *st, const char *path, const mgt_model *m,
                        const mgt_optim *opt, mgt_ckpt_arrays *a, mgt_ckpt_pos *pos, mgt_err *err) {
    const char *fmt = mgt_safetensors_meta(st, KEY_FORMAT);
    if (!fmt || strcmp(fmt, CKPT_FORMAT))
        return mgt_errf(err,
                        "%s is not an mgtrain checkpoint (format %s); pass the folder of a "
                        "run saved by mgtrain train",
                        path, fmt ? fmt : "missing");
    const char *name = mgt_opt_name(m->train.optimizer);
    const char *saved = mgt_safetensors_meta(st, KEY_OPTIMIZER);
    if (!saved || strcmp(saved, name))
        return mgt_errf(err,
                        "%s was saved with optimizer %s but this run uses %s; resume with "
                        "--optimizer %s",
                        path, saved ? saved : "?", name, saved ? saved : "?");
    int64_t gb;
    if (meta_i64(st, path, KEY_GLOBAL_BATCH, &gb, err) < 0)
        return -1;
    if (gb != m->train.batch_size)
        return mgt_errf(err,
                        "%s was saved with global batch %lld but this run uses %lld; resume "
                        "with --batch-size %lld (any number of ranks is fine)",
                        path, (long long)gb, (long long)m->train.batch_size, (long long)gb);
    if (mgt_model_take_weights(m, st, path, a->w, a->buf, err) < 0)
        return -1;
    for (int i = 0; i < opt->nslots; i++) {
        const mgt_tensor_entry *t = mgt_safetensors_find(st, opt->slot_name[i]);
        if (!t || t->ndim != 1 || (size_t)t->shape[0] != m->param_count)
            return mgt_errf(err,
                            "%s: optimizer state '%s' is missing or has the wrong size; the "
                            "checkpoint belongs to another model or optimizer setting",
                            path, opt->slot_name[i]);
        memcpy(a->slot[i], t->data, m->param_count * sizeof(float));
    }
    if (meta_i64(st, path, KEY_STEP, &pos->step, err) < 0 ||
        meta_i64(st, path, KEY_EPOCH, &pos->epoch, err) < 0 ||
        meta_i64(st, path, KEY_STEP_IN_EPOCH, &pos->step_in_epoch, err) < 0 ||
        meta_i64(st, path, KEY_OPTIMIZER_T, &pos->optimizer_t, err) < 0 ||
        meta_u64(st, path, KEY_SEED, 0, &pos->seed, err) < 0)
        return -1;
    const char *sums = mgt_safetensors_meta(st, KEY_EPOCH_SUMS);
    double *s = pos->epoch_sums;
    if (!sums || sscanf(sums, "%lf %lf %lf", &s[0], &s[1], &s[2]) != 3)
        return mgt_errf(err, "%s: checkpoint metadata 'epoch_sums' is missing", path);
    const char *mon = mgt_safetensors_meta(st, KEY_MONITOR);
    memset(&pos->mon, 0, sizeof pos->mon);
    if (mon && mgt_monitor_parse(mon, &pos->mon, err) < 0)
        return mgt_errf(err,
                        "%s: checkpoint metadata '%s' ('%s') is damaged; resume from an "
                        "intact checkpoint",
                        path, KEY_MONITOR, mon);
    return 0;
}

int mgt_ckpt_read(const char *dir, const mgt_model *m, const mgt_optim *opt, mgt_ckpt_arrays *a,
                  mgt_ckpt_pos *pos, mgt_err *err) {
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
    int rc = read_checked(&st, path, m, opt, a, pos, err);
    mgt_safetensors_free(&st);
    return rc;
}

void mgt_ckpt_bcast_pos(mgt_comm *c, mgt_ckpt_pos *pos, int root) {
    /* Every field is 8 bytes: the struct has no padding, so its bytes are its values. */
    _Static_assert(sizeof(mgt_ckpt_pos) == 16 * sizeof(int64_t), "mgt_ckpt_pos has padding");
    mgt_bcast(c, pos, sizeof *pos, root, "position broadcast");
}
