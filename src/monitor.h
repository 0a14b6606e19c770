/* monitor.h: what the validation history decides after each epoch: the best weights so far
 * (OUT/best.safetensors, Keras' ModelCheckpoint(save_best_only=True)), early stopping (Keras'
 * EarlyStopping, with restore_best_weights) and the plateau schedule's cuts of the learning rate
 * (Keras' ReduceLROnPlateau on val_loss; schedule.h turns the cuts into a rate).
 *
 * The rules are Keras', epoch by epoch, on the global validation figures (every rank has the
 * same), and only at the end of a whole epoch: a run stopped by --max-steps inside an epoch
 * validates there but decides nothing, so that the resumed run decides once, at that epoch's
 * end, as an uninterrupted run would. Their whole state is mgt_monitor_state, which the
 * checkpoint carries: a resumed run continues the same history, so it stops at the same epoch
 * and uses the same rates as an uninterrupted one.
 *
 * "Better" (mgt_monitor_better) is the one rule for every "best so far": the saved best weights,
 * early stopping's patience and restoring. */
#ifndef MGT_MONITOR_H
#define MGT_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "schedule.h"
#include "util.h"

typedef enum { MGT_MON_VAL_LOSS = 0, MGT_MON_VAL_ACC, MGT_MON_COUNT } mgt_mon_metric;

/* The [train] keys of early stopping and the best weights (monitor.c parses them). */
typedef struct mgt_stop_cfg {
    int patience;          /* early_stop_patience (--early-stop): epochs without improvement
                              before stopping; 0: no early stopping */
    mgt_mon_metric metric; /* monitor: what "best" means (val_loss lower, val_acc higher) */
    float min_delta;       /* min_delta: an improvement must exceed this */
    int restore_best;      /* restore_best_weights: end with the best epoch's weights */
} mgt_stop_cfg;

void mgt_stop_defaults(mgt_stop_cfg *c);
/* One [train] key: 1 if taken, 0 if `key` is not early stopping's, -1 on a bad value. */
int mgt_stop_set(mgt_stop_cfg *c, const char *key, const char *value, mgt_err *err);
const char *mgt_stop_key_at(int i); /* NULL past the last */
/* Early stopping and restoring need validation. */
int mgt_stop_check(const mgt_stop_cfg *c, int validating, mgt_err *err);
const char *mgt_mon_metric_name(mgt_mon_metric m);

/* The history's state after the epochs so far, in the checkpoint (checkpoint.h). Every field is
 * 8 bytes (the position is broadcast as raw bytes). All zero: no epoch seen. */
typedef struct mgt_monitor_state {
    int64_t seen;             /* whole epochs validated */
    double best;              /* the monitored figure of the best epoch */
    int64_t best_epoch;       /* 1-based; 0: none yet */
    int64_t wait;             /* epochs since, without improvement (EarlyStopping.wait) */
    double plateau_best;      /* the plateau rule's best val_loss */
    int64_t plateau_wait;     /* its epochs without improvement */
    int64_t plateau_cooldown; /* epochs of cooldown left */
    int64_t cuts;             /* cuts of the learning rate so far */
} mgt_monitor_state;

/* Whether `value` beats `best` by more than min_delta (lower for val_loss, higher for val_acc;
 * never for NaN). */
int mgt_monitor_better(mgt_mon_metric m, double min_delta, double value, double best);

/* The state as checkpoint metadata text, and back (range-checked; -1 with a message). */
void mgt_monitor_format(const mgt_monitor_state *s, char *buf, size_t n);
int mgt_monitor_parse(const char *text, mgt_monitor_state *s, mgt_err *err);

/* One run's decisions. The monitor only decides and says what it decided: the training loop
 * saves and restores the weights it names (best.safetensors). */
typedef struct mgt_monitor {
    mgt_stop_cfg cfg;
    const mgt_sched *sched; /* its plateau settings and cuts */
    int print;              /* rank 0 with epoch lines on: say what was decided */
} mgt_monitor;

/* What an epoch's validation decided. */
typedef struct mgt_monitor_verdict {
    int improved; /* the best so far: its weights are the new best.safetensors */
    int cut;      /* the plateau rule cut the learning rate */
    int stop;     /* early stopping: train no further */
} mgt_monitor_verdict;

/* The rules alone (see monitor.c): the state after whole epoch `epoch` (1-based) with these
 * validation figures, and what they decided. */
mgt_monitor_verdict mgt_monitor_decide(const mgt_stop_cfg *c, const mgt_sched *sched,
                                       mgt_monitor_state *s, int64_t epoch, double val_loss,
                                       double val_acc);
/* After whole epoch `epoch` (1-based), validated, at global step `step`: the rules with the run's
 * settings. The caller saves the best weights on v.improved, then says what was decided
 * (mgt_monitor_say). */
mgt_monitor_verdict mgt_monitor_epoch(const mgt_monitor *mon, mgt_monitor_state *s, int64_t epoch,
                                      double val_loss, double val_acc);
/* Prints the verdict's cut and stop (when mon->print). */
void mgt_monitor_say(const mgt_monitor *mon, const mgt_monitor_state *s, int64_t epoch,
                     int64_t step, mgt_monitor_verdict v);
/* Whether a resumed run's history has already stopped it (it then trains nothing). */
int mgt_monitor_stopped(const mgt_monitor *mon, const mgt_monitor_state *s);
/* After training: whether the run ends with the best epoch's weights (restore_best_weights, and
 * a best epoch seen). The caller loads them into every replica, then says so
 * (mgt_monitor_say_restored, with the file they came from). */
int mgt_monitor_restores(const mgt_monitor *mon, const mgt_monitor_state *s);
void mgt_monitor_say_restored(const mgt_monitor *mon, const mgt_monitor_state *s, const char *path);

#endif
