/* schedule.c: learning-rate schedules and warm-up (see schedule.h), their [train] keys and their
 * checks. */
#include "schedule.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "parse.h"

static const char *const kind_names[] = {[MGT_LR_CONSTANT] = "constant",
                                         [MGT_LR_STEP] = "step",
                                         [MGT_LR_COSINE] = "cosine",
                                         [MGT_LR_EXPONENTIAL] = "exponential",
                                         [MGT_LR_PLATEAU] = "plateau"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == MGT_LR_COUNT,
               "one name per schedule kind");

static const char *const keys[] = {
    "lr_schedule",         "lr_decay_epochs",     "lr_decay_rate",       "lr_min",
    "warmup_steps",        "warmup_epochs",       "lr_plateau_patience", "lr_plateau_factor",
    "lr_plateau_cooldown", "lr_plateau_min_delta"};

/* PyTorch's StepLR gamma (0.1); Keras' ReduceLROnPlateau: factor 0.1, patience 10, cooldown 0,
 * min_delta 1e-4, min_lr 0. */
void mgt_sched_defaults(mgt_sched_cfg *c) {
    memset(c, 0, sizeof *c);
    c->kind = MGT_LR_CONSTANT;
    c->decay_rate = 0.1f;
    c->plateau_patience = 10;
    c->plateau_factor = 0.1f;
    c->plateau_min_delta = 1e-4f;
}

int mgt_sched_find(const char *name) {
    for (int i = 0; i < MGT_LR_COUNT; i++)
        if (!strcasecmp(name, kind_names[i]))
            return i;
    return -1;
}

const char *mgt_sched_name(mgt_lr_kind k) {
    return kind_names[k];
}

const char *mgt_sched_names(char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < MGT_LR_COUNT && at < n; i++) {
        const char *sep = i == 0 ? "" : i == MGT_LR_COUNT - 1 ? " or " : ", ";
        at += (size_t)snprintf(buf + at, n - at, "%s%s", sep, kind_names[i]);
    }
    return buf;
}

const char *mgt_sched_key_at(int i) {
    return i >= 0 && i < (int)(sizeof keys / sizeof keys[0]) ? keys[i] : NULL;
}

/* "30" or "30,60,80": positive epochs, strictly increasing. */
static int parse_points(mgt_sched_cfg *c, const char *v, mgt_err *err) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        float x;
        /* At most 1e6 epochs, as warmup_epochs: times the steps of an epoch, a whole number of
         * steps (llround) that an int64 holds. */
        if (n == MGT_LR_MAX_POINTS || mgt_parse_float(mgt_trim(tok), &x) < 0 || !(x > 0) ||
            x > 1e6f || (n > 0 && x <= c->points[n - 1]))
            return mgt_errf(err,
                            "lr_decay_epochs = %s: expected a number of epochs in (0, 1e+06] "
                            "(decay every so many epochs, e.g. lr_decay_epochs = 30) or up to %d "
                            "increasing epochs to decay at (e.g. lr_decay_epochs = 30,60,80)",
                            v, MGT_LR_MAX_POINTS);
        c->points[n++] = x;
    }
    if (n == 0)
        return mgt_errf(err, "lr_decay_epochs is empty: give e.g. lr_decay_epochs = 30");
    c->npoints = n;
    return 0;
}

static int number(const char *key, const char *v, float lo, int lo_open, float hi, int hi_open,
                  const char *example, float *out, mgt_err *err) {
    float x;
    if (mgt_parse_float(v, &x) < 0 || x < lo || (lo_open && x == lo) || x > hi ||
        (hi_open && x == hi))
        return mgt_errf(err, "%s = %s: expected a number in %c%g, %g%c, e.g. %s = %s", key, v,
                        lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']', key, example);
    *out = x;
    return 0;
}

static int whole(const char *key, const char *v, int64_t max, const char *example, int64_t *out,
                 mgt_err *err) {
    int64_t x;
    if (mgt_parse_i64(v, &x) < 0 || x < 0 || x > max)
        return mgt_errf(err, "%s = %s: expected a whole number from 0 to %lld, e.g. %s = %s", key,
                        v, (long long)max, key, example);
    *out = x;
    return 0;
}

int mgt_sched_set(mgt_sched_cfg *c, const char *key, const char *v, mgt_err *err) {
    int64_t i = 0;
    int rc;
    if (!strcmp(key, "lr_schedule")) {
        const int k = mgt_sched_find(v);
        if (k < 0) {
            const char *near = mgt_nearest(v, kind_names, MGT_LR_COUNT);
            char list[128];
            return mgt_errf(err, "lr_schedule = %s: unknown%s%s%s; use %s", v,
                            near ? " (did you mean " : "", near ? near : "", near ? "?)" : "",
                            mgt_sched_names(list, sizeof list));
        }
        c->kind = (mgt_lr_kind)k;
        return 1;
    }
    if (!strcmp(key, "lr_decay_epochs"))
        rc = parse_points(c, v, err);
    else if (!strcmp(key, "lr_decay_rate"))
        rc = number(key, v, 0, 1, 1, 0, "0.1", &c->decay_rate, err);
    else if (!strcmp(key, "lr_min"))
        rc = number(key, v, 0, 0, 1e6f, 0, "1e-5", &c->lr_min, err);
    else if (!strcmp(key, "warmup_steps"))
        rc = whole(key, v, (int64_t)1 << 40, "500", &c->warmup_steps, err);
    else if (!strcmp(key, "warmup_epochs"))
        rc = number(key, v, 0, 0, 1e6f, 0, "5", &c->warmup_epochs, err);
    else if (!strcmp(key, "lr_plateau_patience")) {
        rc = whole(key, v, 1000000, "10", &i, err);
        c->plateau_patience = (int)i;
    } else if (!strcmp(key, "lr_plateau_factor"))
        rc = number(key, v, 0, 1, 1, 1, "0.1", &c->plateau_factor, err);
    else if (!strcmp(key, "lr_plateau_cooldown")) {
        rc = whole(key, v, 1000000, "2", &i, err);
        c->plateau_cooldown = (int)i;
    } else if (!strcmp(key, "lr_plateau_min_delta"))
        rc = number(key, v, 0, 0, 1e30f, 0, "0.0001", &c->plateau_min_delta, err);
    else
        return 0;
    return rc < 0 ? -1 : 1;
}

int mgt_sched_check(const mgt_sched_cfg *c, int validating, mgt_err *err) {
    if (c->warmup_steps > 0 && c->warmup_epochs > 0)
        return mgt_errf(err, "warmup_steps = %lld and warmup_epochs = %g both given: keep one",
                        (long long)c->warmup_steps, c->warmup_epochs);
    if ((c->kind == MGT_LR_STEP || c->kind == MGT_LR_EXPONENTIAL) && c->npoints == 0)
        return mgt_errf(err,
                        "lr_schedule = %s needs lr_decay_epochs, the epochs per decay by "
                        "lr_decay_rate (%g), e.g. lr_decay_epochs = 30%s",
                        kind_names[c->kind], c->decay_rate,
                        c->kind == MGT_LR_STEP ? " (or a list of epochs: 30,60,80)" : "");
    if ((c->kind == MGT_LR_EXPONENTIAL || c->kind == MGT_LR_COSINE) && c->npoints > 1)
        return mgt_errf(err,
                        "lr_decay_epochs: a list of epochs is for lr_schedule = step; %s takes "
                        "one number of epochs",
                        kind_names[c->kind]);
    if ((c->kind == MGT_LR_CONSTANT || c->kind == MGT_LR_PLATEAU) && c->npoints > 0)
        return mgt_errf(err,
                        "lr_decay_epochs is given but lr_schedule = %s does not use it; set "
                        "lr_schedule = step, exponential or cosine",
                        kind_names[c->kind]);
    if (c->kind == MGT_LR_PLATEAU && !validating)
        return mgt_errf(err, "lr_schedule = plateau lowers the rate when the validation loss "
                             "stops improving, but this run does not validate (--no-validation); "
                             "drop --no-validation or choose another lr_schedule");
    return 0;
}

void mgt_sched_init(mgt_sched *s, const mgt_sched_cfg *cfg, float base_lr, int64_t steps_per_epoch,
                    int epochs) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->base = base_lr;
    s->steps_per_epoch = steps_per_epoch > 0 ? steps_per_epoch : 1;
    const double spe = (double)s->steps_per_epoch;
    s->warmup = cfg->warmup_steps > 0 ? cfg->warmup_steps : llround(cfg->warmup_epochs * spe);
    const double rest = (double)epochs * spe - (double)s->warmup;
    s->cosine_steps = cfg->npoints ? cfg->points[0] * spe : rest;
    if (s->cosine_steps < 1)
        s->cosine_steps = 1; /* a warm-up as long as training: the rate ends at lr_min */
}

/* The rate without warm-up, before the lr_min floor. */
static double decayed(const mgt_sched *s, int64_t t, int64_t cuts) {
    const mgt_sched_cfg *c = &s->cfg;
    const double spe = (double)s->steps_per_epoch;
    switch (c->kind) {
    case MGT_LR_STEP: {
        int64_t k = 0;
        if (c->npoints == 1) {
            const int64_t period = llround(c->points[0] * spe);
            k = t / (period > 0 ? period : 1);
        } else {
            for (int i = 0; i < c->npoints; i++)
                k += t >= llround(c->points[i] * spe);
        }
        return s->base * pow(c->decay_rate, (double)k);
    }
    case MGT_LR_EXPONENTIAL:
        return s->base * pow(c->decay_rate, (double)t / (c->points[0] * spe));
    case MGT_LR_COSINE: {
        double u = (double)(t - s->warmup);
        u = u < 0 ? 0 : u > s->cosine_steps ? s->cosine_steps : u;
        const double lo = c->lr_min;
        return lo + (s->base - lo) * 0.5 * (1.0 + cos(M_PI * u / s->cosine_steps));
    }
    case MGT_LR_PLATEAU:
        return s->base * pow(c->plateau_factor, (double)cuts);
    case MGT_LR_CONSTANT:
    default:
        return s->base;
    }
}

float mgt_sched_lr(const mgt_sched *s, int64_t step, int64_t cuts) {
    double lr = decayed(s, step, cuts);
    if (s->cfg.kind != MGT_LR_CONSTANT && lr < s->cfg.lr_min)
        lr = s->cfg.lr_min;
    if (step < s->warmup)
        lr *= (double)(step + 1) / (double)s->warmup;
    return (float)lr;
}

int mgt_sched_can_cut(const mgt_sched *s, int64_t cuts) {
    /* ReduceLROnPlateau cuts while the rate is above min_lr (compared in float32). */
    const double lr = decayed(s, 0, cuts);
    return cuts < 100000 && (float)(lr < s->cfg.lr_min ? s->cfg.lr_min : lr) > s->cfg.lr_min;
}
