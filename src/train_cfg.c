/* train_cfg.c: the [train] section's keys, shared by model files and command-line overrides. */
#include <string.h>
#include <strings.h>

#include "model.h"
#include "parse.h"

static const char *opt_names[] = {"sgd", "rmsprop", "adam"};
static const char *loss_names[] = {"sparse_categorical_crossentropy",
                                   "categorical_crossentropy"};

const char *mgt_opt_name(mgt_opt_kind k) { return opt_names[k]; }
const char *mgt_loss_name(mgt_loss l) { return loss_names[l]; }

/* Keras' defaults: learning rate 0.01 for SGD and 0.001 otherwise (set when the optimizer is
 * chosen unless learning_rate was given), RMSprop rho 0.9, Adam 0.9 / 0.999, epsilon 1e-7. */
void mgt_train_defaults(mgt_train_cfg *t) {
    memset(t, 0, sizeof *t);
    t->optimizer = MGT_OPT_ADAM;
    t->lr = -1; /* "not given" */
    t->rho = 0.9f;
    t->beta1 = 0.9f;
    t->beta2 = 0.999f;
    t->epsilon = 1e-7f;
    t->loss = MGT_LOSS_SPARSE_CE;
    t->batch_size = 32;
    t->epochs = 1;
    t->seed = 42;
}

static int positive_float(const char *v, float *out, int allow_zero, mgt_err *err,
                          const char *key, const char *example) {
    float x;
    if (mgt_parse_float(v, &x) < 0 || x < 0 || (!allow_zero && x == 0))
        return mgt_errf(err, "%s = %s: expected a %s number, e.g. %s = %s", key, v,
                        allow_zero ? "non-negative" : "positive", key, example);
    *out = x;
    return 0;
}

int mgt_train_set(mgt_train_cfg *t, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "optimizer")) {
        for (int i = 0; i < 3; i++)
            if (!strcasecmp(v, opt_names[i])) {
                t->optimizer = (mgt_opt_kind)i;
                return 0;
            }
        const char *near = mgt_nearest(v, opt_names, 3);
        return mgt_errf(err, "optimizer = %s: unknown%s%s%s; use sgd, rmsprop or adam", v,
                        near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
    }
    if (!strcmp(key, "loss")) {
        for (int i = 0; i < 2; i++)
            if (!strcasecmp(v, loss_names[i])) {
                t->loss = (mgt_loss)i;
                return 0;
            }
        return mgt_errf(err, "loss = %s: unknown; use sparse_categorical_crossentropy (integer "
                        "labels) or categorical_crossentropy (one-hot)", v);
    }
    if (!strcmp(key, "learning_rate"))
        return positive_float(v, &t->lr, 0, err, key, "0.001");
    if (!strcmp(key, "momentum")) {
        if (positive_float(v, &t->momentum, 1, err, key, "0.9") < 0)
            return -1;
        if (t->momentum >= 1)
            return mgt_errf(err, "momentum = %s: must be below 1, e.g. momentum = 0.9", v);
        return 0;
    }
    if (!strcmp(key, "nesterov")) {
        if (mgt_parse_bool(v, &t->nesterov) < 0)
            return mgt_errf(err, "nesterov = %s: expected true or false", v);
        return 0;
    }
    float *f = !strcmp(key, "rho") ? &t->rho : !strcmp(key, "beta_1") ? &t->beta1
             : !strcmp(key, "beta_2") ? &t->beta2 : NULL;
    if (f) {
        float x;
        if (mgt_parse_float(v, &x) < 0 || x < 0 || x >= 1)
            return mgt_errf(err, "%s = %s: expected a number in [0, 1), e.g. %s = 0.9", key, v,
                            key);
        *f = x;
        return 0;
    }
    if (!strcmp(key, "epsilon"))
        return positive_float(v, &t->epsilon, 0, err, key, "1e-7");
    if (!strcmp(key, "weight_decay"))
        return positive_float(v, &t->weight_decay, 1, err, key, "0.0001");
    if (!strcmp(key, "batch_size")) {
        int64_t x;
        if (mgt_parse_i64(v, &x) < 0 || x < 1 || x > (1 << 24))
            return mgt_errf(err, "batch_size = %s: expected a whole number from 1 to 16777216 "
                            "(the global batch, summed over all ranks), e.g. batch_size = 256", v);
        t->batch_size = x;
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
    return mgt_errf(err, "unknown key %s", key);
}
