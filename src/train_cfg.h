/* train_cfg.h: the model file's [train] section: how the model is trained. Its keys come from the
 * model file, then from the command line's overrides (plan.c), and are checked together once all
 * are set. The optimizer's, the schedule's, clipping's and early stopping's own keys are parsed by
 * their modules (optim.c, schedule.c, clip.c, monitor.c); this module lists them, hands each key
 * to the module that takes it, and reads a model file with its [train] section: the model
 * (model.h) knows nothing of [train]. */
#ifndef MGT_TRAIN_CFG_H
#define MGT_TRAIN_CFG_H

#include <stdint.h>
#include <stdio.h>

#include "clip.h"
#include "data/augment.h"
#include "model.h"
#include "monitor.h"
#include "optim.h"
#include "schedule.h"
#include "util.h"

/* [train]: everything the command line may override. */
typedef struct mgt_train_cfg {
    mgt_opt_kind optimizer;
    float lr;             /* < 0: the optimizer's default (optim.h) */
    mgt_opt_settings opt; /* the optimizer's other keys (optim.c's key table) */
    mgt_loss loss;
    int64_t batch_size; /* GLOBAL batch (of a micro-batch, with accumulation) */
    int accum_steps;    /* micro-batches per optimizer step (gradient accumulation; 1: none) */
    int epochs;
    uint64_t seed;
    int augment_flip, augment_crop; /* training augmentation (data/augment.h); 0: off */
    /* Image sets' random-resized crop (data/images.h): on/off, its scale and ratio ranges. */
    int augment_resized_crop;
    float augment_scale[2], augment_ratio[2];
    /* The training regime's keys: the learning-rate schedule and warm-up, gradient clipping,
     * early stopping and the best weights, label smoothing (schedule.h, clip.h, monitor.h). */
    mgt_sched_cfg sched;
    mgt_clip_cfg clip;
    mgt_stop_cfg stop;
    float label_smoothing; /* Keras' label_smoothing of the cross-entropy losses, in [0, 1] */
    float huber_delta;     /* huber's delta (Keras' default 1) */
    /* class_weight (--class-weight): the weights of the classes, or binary cross-entropy's
     * negative and positive weights (model.h: cw); nclass_weight 0: none. */
    float class_weight[MGT_CW_MAX];
    int nclass_weight;
    /* reproducible (--reproducible): the same weights, bit for bit, on any rank count, from
     * chunks of repro_chunk samples (repro.h; 0: not given, the default chunk). */
    int reproducible;
    int64_t repro_chunk;
    /* freeze (--freeze): the layers to freeze, comma-separated glob patterns of their names
     * (model.h: mgt_model_freeze); "" for none. */
    char freeze[512];
} mgt_train_cfg;

void mgt_train_defaults(mgt_train_cfg *t);
int mgt_train_set(mgt_train_cfg *t, const char *key, const char *value, mgt_err *err);
/* The keys [train] accepts, NULL-terminated in keys[max]; returns their count. */
int mgt_train_keys(const char **keys, int max);
/* The [train] keys checked against each other, once the model file and the command line have
 * set them all; validating: the run validates after every epoch. */
int mgt_train_check(const mgt_train_cfg *t, int validating, mgt_err *err);
/* The training augmentation the [train] keys ask for (data/augment.h). */
mgt_augment mgt_train_augment(const mgt_train_cfg *t);
const char *mgt_loss_name(mgt_loss l);

/* Reads a model file (or, when text != NULL, that text under the name `path`): the model and its
 * [train] section into t (from the defaults), the model's loss as [train] says. */
int mgt_model_file_parse(mgt_model *m, mgt_train_cfg *t, const char *path, const char *text,
                         mgt_err *err);
/* The same for the len bytes at text, as read from a file (a NUL byte among them is an error). */
int mgt_model_file_parse_len(mgt_model *m, mgt_train_cfg *t, const char *path, const char *text,
                             size_t len, mgt_err *err);
/* The model's loss, label smoothing, Huber's delta and class weights as t says (again after the
 * command line's overrides), checked against the model's last layer (mgt_model_check_output). */
int mgt_train_apply_loss(const mgt_train_cfg *t, mgt_model *m, mgt_err *err);

/* The optimizer t describes, its learning rate the optimizer's default where none is given. */
mgt_optim_cfg mgt_train_optim(const mgt_train_cfg *t);
/* --reproducible's chunk: repro_chunk or the default under reproducible, 0 when the mode is off. */
int64_t mgt_train_repro_chunk(const mgt_train_cfg *t);
/* The setting of t that acts on validation figures, which --reproducible cannot honour (repro.h),
 * named for a message; NULL when there is none. */
const char *mgt_train_validation_decider(const mgt_train_cfg *t);

/* The summary's line about training: loss, optimizer, global batch and epochs. */
void mgt_train_summary(const mgt_train_cfg *t, FILE *f);

#endif
