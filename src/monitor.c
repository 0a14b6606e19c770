/* monitor.c: best weights, early stopping and the plateau rule (see monitor.h), with Keras'
 * rules (keras.callbacks.EarlyStopping and ReduceLROnPlateau, Keras 3):
 *
 *   EarlyStopping, each epoch:  wait += 1; if better(current, best): best = current, wait = 0;
 *                               else if wait >= patience (and not the first epoch): stop.
 *   ReduceLROnPlateau:          if in cooldown: cooldown -= 1, wait = 0;
 *                               if current < best - min_delta: best = current, wait = 0;
 *                               elif not in cooldown: wait += 1; if wait >= patience and the
 *                               rate is above lr_min: cut it (factor), cooldown = cooldown
 *                               setting, wait = 0.
 *
 * The plateau rule always watches val_loss, as ReduceLROnPlateau does by default; `monitor`
 * chooses what the best weights and early stopping watch. */
#include "monitor.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "parse.h"

static const char *const metric_names[] = {
    [MGT_MON_VAL_LOSS] = "val_loss", [MGT_MON_VAL_ACC] = "val_acc"};
_Static_assert(sizeof metric_names / sizeof metric_names[0] == MGT_MON_COUNT,
               "one name per monitored metric");

static const char *const keys[] = {"early_stop_patience", "monitor", "min_delta",
                                   "restore_best_weights"};

/* Keras' EarlyStopping: min_delta 0, restore_best_weights false; monitor val_loss. */
void mgt_stop_defaults(mgt_stop_cfg *c) {
    memset(c, 0, sizeof *c);
    c->metric = MGT_MON_VAL_LOSS;
}

const char *mgt_stop_key_at(int i) {
    return i >= 0 && i < (int)(sizeof keys / sizeof keys[0]) ? keys[i] : NULL;
}

const char *mgt_mon_metric_name(mgt_mon_metric m) {
    return metric_names[m];
}

int mgt_stop_set(mgt_stop_cfg *c, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "early_stop_patience")) {
        int x;
        if (mgt_parse_int(v, &x) < 0 || x < 0 || x > 1000000)
            return mgt_errf(err,
                            "early_stop_patience = %s: expected the epochs to wait for an "
                            "improvement, a whole number (0: off), e.g. early_stop_patience = 5",
                            v);
        c->patience = x;
        return 1;
    }
    if (!strcmp(key, "monitor")) {
        for (int i = 0; i < MGT_MON_COUNT; i++)
            if (!strcasecmp(v, metric_names[i])) {
                c->metric = (mgt_mon_metric)i;
                return 1;
            }
        return mgt_errf(err,
                        "monitor = %s: unknown; use val_loss (lower is better) or val_acc "
                        "(higher is better)",
                        v);
    }
    if (!strcmp(key, "min_delta")) {
        if (mgt_parse_float(v, &c->min_delta) < 0 || c->min_delta < 0)
            return mgt_errf(err, "min_delta = %s: expected a number >= 0, e.g. min_delta = 0.001",
                            v);
        return 1;
    }
    if (!strcmp(key, "restore_best_weights")) {
        if (mgt_parse_bool(v, &c->restore_best) < 0)
            return mgt_errf(err, "restore_best_weights = %s: expected true or false", v);
        return 1;
    }
    return 0;
}

int mgt_stop_check(const mgt_stop_cfg *c, int validating, mgt_err *err) {
    if (!validating && (c->patience > 0 || c->restore_best))
        return mgt_errf(err,
                        "%s watches %s after every epoch, but this run does not validate "
                        "(--no-validation); drop --no-validation or the %s",
                        c->patience > 0 ? "early stopping" : "restore_best_weights",
                        metric_names[c->metric],
                        c->patience > 0 ? "early stopping" : "restore_best_weights key");
    return 0;
}

int mgt_monitor_better(mgt_mon_metric m, double min_delta, double value, double best) {
    return m == MGT_MON_VAL_ACC ? value - min_delta > best : value + min_delta < best;
}

void mgt_monitor_format(const mgt_monitor_state *s, char *buf, size_t n) {
    /* %.17g: the doubles come back bit for bit, so a resumed run compares with the same best. */
    snprintf(buf, n,
             "%" PRId64 " %.17g %" PRId64 " %" PRId64 " %.17g %" PRId64 " %" PRId64 " %" PRId64,
             s->seen, s->best, s->best_epoch, s->wait, s->plateau_best, s->plateau_wait,
             s->plateau_cooldown, s->cuts);
}

int mgt_monitor_parse(const char *text, mgt_monitor_state *s, mgt_err *err) {
    mgt_monitor_state t;
    int end = 0;
    if (sscanf(text,
               "%" SCNd64 " %lf %" SCNd64 " %" SCNd64 " %lf %" SCNd64 " %" SCNd64 " %" SCNd64 " %n",
               &t.seen, &t.best, &t.best_epoch, &t.wait, &t.plateau_best, &t.plateau_wait,
               &t.plateau_cooldown, &t.cuts, &end) != 8 ||
        text[end] || t.seen < 0 || t.best_epoch < 0 || t.best_epoch > t.seen || t.wait < 0 ||
        t.wait > t.seen || t.plateau_wait < 0 || t.plateau_wait > t.seen ||
        t.plateau_cooldown < 0 || t.cuts < 0 || t.cuts > t.seen || isnan(t.best) ||
        isnan(t.plateau_best))
        return mgt_errf(err, "the validation history '%s' is damaged", text);
    *s = t;
    return 0;
}

/* The plateau rule (see the top) on this epoch's val_loss. Returns 1 when it cut the rate. */
static int plateau_epoch(const mgt_sched *sched, mgt_monitor_state *s, double val_loss) {
    const mgt_sched_cfg *c = &sched->cfg;
    if (c->kind != MGT_LR_PLATEAU)
        return 0;
    if (s->plateau_cooldown > 0) {
        s->plateau_cooldown--;
        s->plateau_wait = 0;
    }
    if (s->seen == 0 ||
        mgt_monitor_better(MGT_MON_VAL_LOSS, c->plateau_min_delta, val_loss, s->plateau_best)) {
        s->plateau_best = val_loss;
        s->plateau_wait = 0;
        return 0;
    }
    if (s->plateau_cooldown > 0)
        return 0;
    s->plateau_wait++;
    if (s->plateau_wait < c->plateau_patience || !mgt_sched_can_cut(sched, s->cuts))
        return 0;
    s->cuts++;
    s->plateau_cooldown = c->plateau_cooldown;
    s->plateau_wait = 0;
    return 1;
}

mgt_monitor_verdict mgt_monitor_decide(const mgt_stop_cfg *c, const mgt_sched *sched,
                                       mgt_monitor_state *s, int64_t epoch, double val_loss,
                                       double val_acc) {
    mgt_monitor_verdict v = {0, 0, 0};
    const double value = c->metric == MGT_MON_VAL_ACC ? val_acc : val_loss;
    v.cut = plateau_epoch(sched, s, val_loss);
    s->wait++;
    if (s->best_epoch == 0 ? !isnan(value)
                           : mgt_monitor_better(c->metric, c->min_delta, value, s->best)) {
        s->best = value;
        s->best_epoch = epoch;
        s->wait = 0;
        v.improved = 1;
    } else if (c->patience > 0 && s->wait >= c->patience && s->seen > 0) {
        v.stop = 1;
    }
    s->seen++;
    return v;
}

mgt_monitor_verdict mgt_monitor_epoch(const mgt_monitor *mon, mgt_monitor_state *s, int64_t epoch,
                                      double val_loss, double val_acc) {
    return mgt_monitor_decide(&mon->cfg, mon->sched, s, epoch, val_loss, val_acc);
}

void mgt_monitor_say(const mgt_monitor *mon, const mgt_monitor_state *s, int64_t epoch,
                     int64_t step, mgt_monitor_verdict v) {
    const char *name = metric_names[mon->cfg.metric];
    if (mon->print && v.cut)
        printf("Epoch %lld: val_loss has not improved for %d epochs; learning rate cut to %.6g\n",
               (long long)epoch, mon->sched->cfg.plateau_patience,
               (double)mgt_sched_lr(mon->sched, step, s->cuts));
    if (mon->print && v.stop)
        printf("Epoch %lld: early stopping: %s has not improved for %lld epochs (best %.4f at "
               "epoch %lld)\n",
               (long long)epoch, name, (long long)s->wait, s->best, (long long)s->best_epoch);
    if (mon->print && (v.cut || v.stop))
        fflush(stdout);
}

int mgt_monitor_stopped(const mgt_monitor *mon, const mgt_monitor_state *s) {
    return mon->cfg.patience > 0 && s->best_epoch > 0 && s->seen > 1 &&
           s->wait >= mon->cfg.patience;
}

int mgt_monitor_restores(const mgt_monitor *mon, const mgt_monitor_state *s) {
    return mon->cfg.restore_best && s->best_epoch != 0;
}

void mgt_monitor_say_restored(const mgt_monitor *mon, const mgt_monitor_state *s,
                              const char *path) {
    if (!mon->print)
        return;
    printf("Restored the weights of the best epoch, %lld (%s %.4f), from %s\n",
           (long long)s->best_epoch, metric_names[mon->cfg.metric], s->best, path);
    fflush(stdout);
}
