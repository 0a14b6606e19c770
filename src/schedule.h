/* schedule.h: the learning rate of every optimizer step, as Keras' LearningRateSchedule and
 * ReduceLROnPlateau and PyTorch's lr_scheduler give it, with the linear warm-up of Goyal et al.
 * ("Accurate, Large Minibatch SGD", the recipe Horovod's docs use when scaling to many GPUs).
 *
 * The rate is a pure function of the optimizer step (and, for `plateau`, of how many times the
 * validation history has cut it, which the checkpoint carries: monitor.h): no state advances
 * step by step, so a resumed run, or a run on any number of ranks, uses the same rate at the
 * same step. Durations given in epochs become steps through the steps per epoch, which depend
 * on the training set and the GLOBAL batch only.
 *
 *   lr(t) = warm(t) * decayed(t),   t = optimizer steps taken before this one (0-based)
 *   warm(t) = (t + 1) / W for t < W (W = warmup_steps, or warmup_epochs in steps), else 1:
 *             the first step takes lr / W, step W - 1 the full rate, and no step is wasted at 0
 *   constant:     lr
 *   step:         lr * rate^k, k = the number of decay points at or before t: every P epochs
 *                 (lr_decay_epochs = P, PyTorch's StepLR) or at the listed epochs
 *                 (lr_decay_epochs = 30,60,80, MultiStepLR)
 *   exponential:  lr * rate^(t / P), P = lr_decay_epochs in steps (Keras' ExponentialDecay)
 *   cosine:       lr_min + (lr - lr_min) * (1 + cos(pi * u / D)) / 2, u = min(t - W, D) counted
 *                 from the end of the warm-up, D = lr_decay_epochs in steps if given, else the
 *                 rest of training (Keras' CosineDecay with warm-up, PyTorch's
 *                 CosineAnnealingLR)
 *   plateau:      lr * factor^cuts (ReduceLROnPlateau on val_loss; cuts: monitor.h)
 * step, exponential and plateau never go below lr_min. Computed in double, rounded once to
 * float (the rate the optimizer uses and the one logged). */
#ifndef MGT_SCHEDULE_H
#define MGT_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef enum {
    MGT_LR_CONSTANT = 0,
    MGT_LR_STEP,
    MGT_LR_COSINE,
    MGT_LR_EXPONENTIAL,
    MGT_LR_PLATEAU,
    MGT_LR_COUNT
} mgt_lr_kind;

enum { MGT_LR_MAX_POINTS = 16 };

/* The [train] keys of the schedule (train_cfg.c parses them; defaults in mgt_sched_defaults). */
typedef struct mgt_sched_cfg {
    mgt_lr_kind kind; /* lr_schedule */
    int npoints;      /* lr_decay_epochs: 0 (not given), 1 (a period) or a list */
    float points[MGT_LR_MAX_POINTS];
    float decay_rate;        /* lr_decay_rate (step, exponential) */
    float lr_min;            /* lr_min */
    int64_t warmup_steps;    /* warmup_steps */
    float warmup_epochs;     /* warmup_epochs (used when warmup_steps is 0) */
    int plateau_patience;    /* lr_plateau_patience */
    float plateau_factor;    /* lr_plateau_factor */
    int plateau_cooldown;    /* lr_plateau_cooldown */
    float plateau_min_delta; /* lr_plateau_min_delta */
} mgt_sched_cfg;

void mgt_sched_defaults(mgt_sched_cfg *c);
/* The kind named `name` (case-insensitive), or -1; the name of a kind; every name, for help and
 * messages ("constant, step, cosine, exponential or plateau"), into buf. */
int mgt_sched_find(const char *name);
const char *mgt_sched_name(mgt_lr_kind k);
const char *mgt_sched_names(char *buf, size_t n);
/* One [train] key of the schedule: 1 if taken, 0 if `key` is not the schedule's, -1 on a bad
 * value (the message names the key and an example). */
int mgt_sched_set(mgt_sched_cfg *c, const char *key, const char *value, mgt_err *err);
/* The schedule's keys, for the list of [train] keys (NULL past the last). */
const char *mgt_sched_key_at(int i);
/* Checks the keys against each other once all are known (a step schedule needs its epochs, a
 * plateau schedule needs validation); validating: the run validates after every epoch. */
int mgt_sched_check(const mgt_sched_cfg *c, int validating, mgt_err *err);

/* A schedule resolved for one run. */
typedef struct mgt_sched {
    mgt_sched_cfg cfg;
    double base;             /* the learning_rate */
    int64_t steps_per_epoch; /* optimizer steps in one epoch */
    int64_t warmup;          /* W, in steps */
    double cosine_steps;     /* D */
} mgt_sched;

void mgt_sched_init(mgt_sched *s, const mgt_sched_cfg *cfg, float base_lr, int64_t steps_per_epoch,
                    int epochs);
/* The rate of the step after `step` steps; cuts: the plateau's reductions so far. */
float mgt_sched_lr(const mgt_sched *s, int64_t step, int64_t cuts);
/* Whether the plateau rule may cut the rate again (it is still above lr_min). */
int mgt_sched_can_cut(const mgt_sched *s, int64_t cuts);

#endif
