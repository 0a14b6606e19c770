/* train_cfg.c: the [train] section's keys, shared by model files and command-line overrides (see
 * train_cfg.h). The optimizer's own keys and names come from optim.c's tables. */
#include "train_cfg.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "parse.h"
#include "repro.h"

mgt_augment mgt_train_augment(const mgt_train_cfg *t) {
    return (mgt_augment){.flip = t->augment_flip,
                         .crop = t->augment_crop,
                         .resized_crop = t->augment_resized_crop,
                         .scale = {t->augment_scale[0], t->augment_scale[1]},
                         .ratio = {t->augment_ratio[0], t->augment_ratio[1]}};
}

/* Keras' names (mse, mae, huber: its short ones for mean_squared_error, ...). */
static const char *const loss_names[] = {[MGT_LOSS_SPARSE_CE] = "sparse_categorical_crossentropy",
                                         [MGT_LOSS_CE] = "categorical_crossentropy",
                                         [MGT_LOSS_BCE] = "binary_crossentropy",
                                         [MGT_LOSS_MSE] = "mse",
                                         [MGT_LOSS_MAE] = "mae",
                                         [MGT_LOSS_HUBER] = "huber"};
enum { NLOSSES = sizeof loss_names / sizeof loss_names[0] };
_Static_assert(NLOSSES == MGT_LOSS_HUBER + 1, "one name per loss of model.h");

/* Keras' long names of the regression losses, taken as the short ones. */
static const struct {
    const char *name;
    mgt_loss loss;
} loss_aliases[] = {{"mean_squared_error", MGT_LOSS_MSE}, {"mean_absolute_error", MGT_LOSS_MAE}};

const char *mgt_loss_name(mgt_loss l) {
    return loss_names[l];
}

/* The optimizer's defaults (Keras' own) come from its key table; the learning rate is the
 * optimizer's default unless given (set once the optimizer is known, run_plan.c). */
void mgt_train_defaults(mgt_train_cfg *t) {
    memset(t, 0, sizeof *t);
    t->optimizer = MGT_OPT_ADAM;
    t->lr = -1; /* "not given" */
    mgt_opt_defaults(&t->opt);
    t->loss = MGT_LOSS_SPARSE_CE;
    t->huber_delta = 1.0f;
    t->batch_size = 32;
    t->accum_steps = 1;
    t->epochs = 1;
    t->seed = 42;
    /* torchvision's RandomResizedCrop defaults */
    t->augment_scale[0] = 0.08f;
    t->augment_scale[1] = 1.0f;
    t->augment_ratio[0] = 3.0f / 4.0f;
    t->augment_ratio[1] = 4.0f / 3.0f;
    mgt_sched_defaults(&t->sched);
    mgt_stop_defaults(&t->stop);
}

static int positive_float(const char *v, float *out, int allow_zero, mgt_err *err, const char *key,
                          const char *example) {
    float x;
    if (mgt_parse_float(v, &x) < 0 || x < 0 || (!allow_zero && x == 0))
        return mgt_errf(err, "%s = %s: expected a %s number, e.g. %s = %s", key, v,
                        allow_zero ? "non-negative" : "positive", key, example);
    *out = x;
    return 0;
}

/* ---- the training regime: schedules, clipping, early stopping, label smoothing ----
 * Their keys are parsed by their own modules (schedule.c, clip.c, monitor.c); this block lists
 * them, hands each key to the module that takes it and checks them together. */

static int regime_keys(const char **keys, int n, int max) {
    for (int i = 0; mgt_sched_key_at(i) && n + 1 < max; i++)
        keys[n++] = mgt_sched_key_at(i);
    for (int i = 0; mgt_clip_key_at(i) && n + 1 < max; i++)
        keys[n++] = mgt_clip_key_at(i);
    for (int i = 0; mgt_stop_key_at(i) && n + 1 < max; i++)
        keys[n++] = mgt_stop_key_at(i);
    static const char *const loss_keys[] = {"label_smoothing", "huber_delta", "class_weight"};
    for (size_t i = 0; i < sizeof loss_keys / sizeof loss_keys[0] && n + 1 < max; i++)
        keys[n++] = loss_keys[i];
    return n;
}

/* 1 if `key` is the regime's (taken, or -1 on a bad value), 0 if not. */
static int regime_set(mgt_train_cfg *t, const char *key, const char *v, mgt_err *err) {
    int rc = mgt_sched_set(&t->sched, key, v, err);
    if (!rc)
        rc = mgt_clip_set(&t->clip, key, v, err);
    if (!rc)
        rc = mgt_stop_set(&t->stop, key, v, err);
    if (!rc && !strcmp(key, "label_smoothing")) {
        float x;
        if (mgt_parse_float(v, &x) < 0 || x < 0 || x > 1)
            return mgt_errf(err,
                            "label_smoothing = %s: expected a number from 0 (off) to 1, e.g. "
                            "label_smoothing = 0.1",
                            v);
        t->label_smoothing = x;
        return 1;
    }
    if (!rc && !strcmp(key, "huber_delta")) {
        float x;
        if (mgt_parse_float(v, &x) < 0 || !(x > 0))
            return mgt_errf(err,
                            "huber_delta = %s: expected a positive number (where Huber's loss "
                            "turns from squared to linear), e.g. huber_delta = 1",
                            v);
        t->huber_delta = x;
        return 1;
    }
    if (!rc && !strcmp(key, "class_weight")) {
        float w[MGT_CW_MAX + 1];
        const int n = mgt_parse_float_list(v, w, MGT_CW_MAX + 1);
        int ok = n >= 1 && n <= MGT_CW_MAX;
        for (int i = 0; ok && i < n; i++)
            ok = w[i] > 0;
        if (!ok)
            return mgt_errf(err,
                            "class_weight = %s: expected up to %d positive numbers, one a "
                            "class in class order (binary_crossentropy: the negative's and the "
                            "positive's), e.g. class_weight = 1, 5",
                            v, MGT_CW_MAX);
        memcpy(t->class_weight, w, sizeof(float) * (size_t)n);
        t->nclass_weight = n;
        return 1;
    }
    return rc;
}

int mgt_train_check(const mgt_train_cfg *t, int validating, mgt_err *err) {
    if (t->repro_chunk && !t->reproducible)
        return mgt_errf(err, "repro_chunk (--repro-chunk) sets the chunk of reproducible "
                             "training; add reproducible = true (--reproducible), or drop it");
    if (mgt_loss_is_regression(t->loss) && t->stop.metric == MGT_MON_VAL_ACC)
        return mgt_errf(err, "monitor = val_acc: a regression (loss = %s) has no accuracy; "
                             "monitor val_loss",
                        mgt_loss_name(t->loss));
    if (mgt_sched_check(&t->sched, validating, err) < 0 ||
        mgt_stop_check(&t->stop, validating, err) < 0)
        return -1;
    return 0;
}

int mgt_train_keys(const char **keys, int max) {
    static const char *const before[] = {"optimizer", "learning_rate"};
    static const char *const after[] = {
        "loss",          "batch_size",    "accum_steps",  "epochs",
        "seed",          "augment_flip",  "augment_crop", "augment_resized_crop",
        "augment_scale", "augment_ratio", "reproducible", "repro_chunk",
        "freeze"};
    int n = 0;
    for (size_t i = 0; i < sizeof before / sizeof before[0] && n + 1 < max; i++)
        keys[n++] = before[i];
    for (int i = 0; mgt_opt_key_at(i) && n + 1 < max; i++) /* the optimizers' own */
        keys[n++] = mgt_opt_key_at(i)->key;
    for (size_t i = 0; i < sizeof after / sizeof after[0] && n + 1 < max; i++)
        keys[n++] = after[i];
    n = regime_keys(keys, n, max);
    keys[n] = NULL;
    return n;
}

/* An optimizer key's value, checked as its table entry says. */
static int set_opt_key(mgt_opt_settings *o, const mgt_opt_key *k, const char *v, mgt_err *err) {
    char *at = (char *)o + k->offset;
    if (k->kind == MGT_OPT_KEY_BOOL) {
        if (mgt_parse_bool(v, (int *)at) < 0)
            return mgt_errf(err, "%s = %s: expected true or false", k->key, v);
        return 0;
    }
    if (k->kind == MGT_OPT_KEY_FRACTION) {
        float x;
        if (mgt_parse_float(v, &x) < 0 || x < 0 || x >= 1)
            return mgt_errf(err, "%s = %s: expected a number in [0, 1), e.g. %s = %s", k->key, v,
                            k->key, k->example);
        *(float *)at = x;
        return 0;
    }
    if (positive_float(v, (float *)at, k->kind != MGT_OPT_KEY_POSITIVE, err, k->key, k->example) <
        0)
        return -1;
    if (k->kind == MGT_OPT_KEY_BELOW_ONE && *(float *)at >= 1)
        return mgt_errf(err, "%s = %s: must be below 1, e.g. %s = %s", k->key, v, k->key,
                        k->example);
    return 0;
}

int mgt_train_set(mgt_train_cfg *t, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "optimizer")) {
        const int k = mgt_opt_find(v);
        if (k >= 0) {
            t->optimizer = (mgt_opt_kind)k;
            return 0;
        }
        const char *names[MGT_OPT_COUNT];
        for (int i = 0; i < MGT_OPT_COUNT; i++)
            names[i] = mgt_optimizer_of((mgt_opt_kind)i)->name;
        const char *near = mgt_nearest(v, names, MGT_OPT_COUNT);
        char list[256];
        return mgt_errf(err, "optimizer = %s: unknown%s%s%s; use %s", v,
                        near ? " (did you mean " : "", near ? near : "", near ? "?)" : "",
                        mgt_opt_names(list, sizeof list));
    }
    if (!strcmp(key, "loss")) {
        for (int i = 0; i < NLOSSES; i++)
            if (!strcasecmp(v, loss_names[i])) {
                t->loss = (mgt_loss)i;
                return 0;
            }
        for (size_t i = 0; i < sizeof loss_aliases / sizeof loss_aliases[0]; i++)
            if (!strcasecmp(v, loss_aliases[i].name)) {
                t->loss = loss_aliases[i].loss;
                return 0;
            }
        return mgt_errf(err,
                        "loss = %s: unknown; use sparse_categorical_crossentropy (integer "
                        "labels), categorical_crossentropy (one-hot), binary_crossentropy (one "
                        "or more 0/1 labels a sample), mse, mae or huber (regression)",
                        v);
    }
    if (!strcmp(key, "learning_rate"))
        return positive_float(v, &t->lr, 0, err, key, "0.001");
    const mgt_opt_key *k = mgt_opt_key_find(key);
    if (k)
        return set_opt_key(&t->opt, k, v, err);
    if (!strcmp(key, "batch_size")) {
        int64_t x;
        if (mgt_parse_i64(v, &x) < 0 || x < 1 || x > (1 << 24))
            return mgt_errf(err,
                            "batch_size = %s: expected a whole number from 1 to 16777216 "
                            "(the global batch, summed over all ranks), e.g. batch_size = 256",
                            v);
        t->batch_size = x;
        return 0;
    }
    if (!strcmp(key, "accum_steps")) { /* gradient accumulation (fit.c) */
        int x;
        if (mgt_parse_int(v, &x) < 0 || x < 1 || x > 65536)
            return mgt_errf(err,
                            "accum_steps = %s: expected a whole number from 1 to 65536 (the "
                            "micro-batches of batch_size per optimizer step), e.g. "
                            "accum_steps = 4",
                            v);
        t->accum_steps = x;
        return 0;
    }
    if (!strcmp(key, "epochs")) {
        int x;
        if (mgt_parse_int(v, &x) < 0 || x < 1)
            return mgt_errf(err, "epochs = %s: expected a whole number of at least 1", v);
        t->epochs = x;
        return 0;
    }
    if (!strcmp(key, "seed")) {
        int64_t x;
        if (mgt_parse_i64(v, &x) < 0 || x < 0)
            return mgt_errf(err, "seed = %s: expected a non-negative whole number", v);
        t->seed = (uint64_t)x;
        return 0;
    }
    /* Data augmentation (data/augment.h), applied to training batches only. */
    if (!strcmp(key, "augment_flip")) {
        if (mgt_parse_bool(v, &t->augment_flip) < 0)
            return mgt_errf(err, "augment_flip = %s: expected true or false", v);
        return 0;
    }
    if (!strcmp(key, "augment_crop")) {
        int x;
        if (mgt_parse_int(v, &x) < 0 || x < 0 || x > 4096)
            return mgt_errf(err,
                            "augment_crop = %s: expected the padding in pixels, a whole "
                            "number from 0 (off) to 4096, e.g. augment_crop = 4",
                            v);
        t->augment_crop = x;
        return 0;
    }
    if (!strcmp(key, "augment_resized_crop")) {
        if (mgt_parse_bool(v, &t->augment_resized_crop) < 0)
            return mgt_errf(err, "augment_resized_crop = %s: expected true or false", v);
        return 0;
    }
    if (!strcmp(key, "augment_scale") || !strcmp(key, "augment_ratio")) {
        const int scale = key[8] == 's';
        float r[2];
        /* The ratio within [0.01, 100]: a crop's sides come from sqrt(area * ratio), rounded to
         * whole pixels, and a crop 100 times wider than high is no picture any more. */
        if (mgt_parse_float_list(v, r, 2) != 2 || !(r[0] > 0) || r[1] < r[0] ||
            (scale && r[1] > 1) || (!scale && (r[0] < 0.01f || r[1] > 100)))
            return mgt_errf(err, "%s = %s: expected two numbers MIN, MAX with %s, e.g. %s = %s",
                            key, v,
                            scale ? "0 < MIN <= MAX <= 1 (fractions of the image's area)"
                                  : "0.01 <= MIN <= MAX <= 100 (width over height)",
                            key, scale ? "0.08, 1" : "0.75, 1.3333");
        memcpy(scale ? t->augment_scale : t->augment_ratio, r, sizeof r);
        return 0;
    }
    /* --reproducible (repro.h): the same bits on any rank count, in chunks of repro_chunk. */
    if (!strcmp(key, "reproducible")) {
        if (mgt_parse_bool(v, &t->reproducible) < 0)
            return mgt_errf(err, "reproducible = %s: expected true or false", v);
        return 0;
    }
    if (!strcmp(key, "repro_chunk")) {
        int64_t x;
        if (mgt_parse_i64(v, &x) < 0 || x < 1 || x > (1 << 24))
            return mgt_errf(err,
                            "repro_chunk = %s: expected the samples of a chunk, a whole number "
                            "from 1 to 16777216, e.g. repro_chunk = 8",
                            v);
        t->repro_chunk = x;
        return 0;
    }
    if (!strcmp(key, "freeze")) { /* applied to the model once every override is in */
        if (!v[0] || strlen(v) >= sizeof t->freeze)
            return mgt_errf(err,
                            "freeze = %.40s%s: expected layer names or glob patterns, "
                            "comma-separated, at most %zu characters, e.g. freeze = conv*, bn1",
                            v, strlen(v) > 40 ? "..." : "", sizeof t->freeze - 1);
        snprintf(t->freeze, sizeof t->freeze, "%s", v);
        return 0;
    }
    const int rc = regime_set(t, key, v, err);
    if (rc)
        return rc < 0 ? -1 : 0;
    return mgt_errf(err, "unknown key %s", key);
}

/* The model file's [train] section, as model_parse.c hands it over. */
static const char *const required_keys[] = {"optimizer", "loss", "batch_size", NULL};

static int set_key(void *t, const char *key, const char *value, mgt_err *err) {
    return mgt_train_set(t, key, value, err);
}

/* The model file at path, or the text at text (len bytes when len != NULL, else a C string). */
static int parse_file(mgt_model *m, mgt_train_cfg *t, const char *path, const char *text,
                      const size_t *len, mgt_err *err) {
    const char *keys[64]; /* the optimizers' included */
    mgt_train_keys(keys, 64);
    const mgt_model_section train = {
        .keys = keys, .required = required_keys, .set = set_key, .ctx = t};
    mgt_train_defaults(t);
    if ((len ? mgt_model_parse_len(m, path, text, *len, &train, err)
             : mgt_model_parse(m, path, text, &train, err)) < 0)
        return -1;
    if (mgt_train_apply_loss(t, m, err) < 0) {
        mgt_model_free(m); /* a failed parse leaves nothing behind, as mgt_model_parse's own */
        return -1;
    }
    return 0;
}

int mgt_model_file_parse(mgt_model *m, mgt_train_cfg *t, const char *path, const char *text,
                         mgt_err *err) {
    return parse_file(m, t, path, text, NULL, err);
}

int mgt_model_file_parse_len(mgt_model *m, mgt_train_cfg *t, const char *path, const char *text,
                             size_t len, mgt_err *err) {
    return parse_file(m, t, path, text, &len, err);
}

int mgt_train_apply_loss(const mgt_train_cfg *t, mgt_model *m, mgt_err *err) {
    m->loss = t->loss;
    m->label_smoothing = t->label_smoothing;
    m->huber_delta = t->huber_delta;
    m->ncw = t->nclass_weight;
    memcpy(m->cw, t->class_weight, sizeof m->cw);
    return mgt_model_check_output(m, err);
}

mgt_optim_cfg mgt_train_optim(const mgt_train_cfg *t) {
    return (mgt_optim_cfg){.optimizer = t->optimizer,
                           .lr = t->lr >= 0 ? t->lr : mgt_optimizer_of(t->optimizer)->default_lr,
                           .opt = t->opt};
}

int64_t mgt_train_repro_chunk(const mgt_train_cfg *t) {
    if (!t->reproducible)
        return 0;
    return t->repro_chunk > 0 ? t->repro_chunk : MGT_REPRO_CHUNK_DEFAULT;
}

const char *mgt_train_validation_decider(const mgt_train_cfg *t) {
    return t->stop.patience > 0              ? "early stopping (early_stop_patience)"
           : t->stop.restore_best            ? "restore_best_weights"
           : t->sched.kind == MGT_LR_PLATEAU ? "the plateau schedule (lr_schedule = plateau)"
                                             : NULL;
}

void mgt_train_summary(const mgt_train_cfg *t, FILE *f) {
    fprintf(f, "Loss: %s, optimizer: %s, global batch: %lld, epochs: %d\n", mgt_loss_name(t->loss),
            mgt_opt_name(t->optimizer), (long long)t->batch_size, t->epochs);
}
