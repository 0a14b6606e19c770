/* replica.h: the training state every rank holds a full copy of, and what keeps the copies equal.
 *
 * The state is the model's parameter and buffer arenas and the optimizer's state slots, in backend
 * memory. Rank 0 initialises it (from the seed), loads it (a weights file) or resumes it (a
 * checkpoint, with the position); every rank then receives it, and compares a checksum of its
 * weights with rank 0's, then and every K steps with --debug-check. BatchNorm's running statistics
 * are per replica while training (each normalises with its own batch): they are averaged over the
 * ranks before a validation or a save, so that every replica then holds the same model.
 *
 * Host copies of the three arenas live here, for broadcasts, checksums and files. */
#ifndef MGT_REPLICA_H
#define MGT_REPLICA_H

#include <stdint.h>

#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "model.h"
#include "optim.h"
#include "util.h"

/* The replica's checkpoints: how many rank 0 keeps (checkpoint.h: mgt_ckpt_keep_previous; 1:
 * checkpoint.safetensors alone), and the run they must agree with to be resumed. */
typedef struct mgt_replica_files {
    int64_t keep_checkpoints;
    mgt_ckpt_run run;
} mgt_replica_files;

typedef struct mgt_replica {
    mgt_model *m;
    mgt_optim *opt;
    mgt_backend *be;
    mgt_comm *comm;
    mgt_ckpt_arrays host; /* host copies of the weights, buffers and optimizer slots */
    mgt_replica_files files;
    int64_t saved_step;   /* the step of OUT/checkpoint.safetensors (-1: none known) */
    char *weights_report; /* rank 0: pretrained.h's table of the weights it started from */
} mgt_replica;

/* After mgt_model_alloc and mgt_optim_init: the host copies. files NULL: a replica that saves
 * and resumes no checkpoint (eval, predict). */
int mgt_replica_init(mgt_replica *r, mgt_model *m, mgt_optim *opt, mgt_backend *be, mgt_comm *comm,
                     const mgt_replica_files *files, mgt_err *err);

/* Where rank 0 takes the state from (mgt_replica_start). */
typedef struct mgt_replica_source {
    const char *weights; /* a weights file; NULL: initialise from the seed */
    /* The weights read as pretrained.h says, through this name map (NULL: none), leaving what
     * does not match at its initial value where partial is set; where neither pretrained nor a
     * map is asked for, the file must hold exactly the model's tensors. flag names the file. */
    int pretrained, partial;
    const char *map, *flag;
    const char *resume_dir; /* the folder of a checkpoint to resume (then weights is unused) */
    uint64_t seed;          /* the run's seed, unless the checkpoint has one */
} mgt_replica_source;

/* Collective: rank 0 takes the state from src, every rank receives it and the position (all
 * zero but the seed unless resuming: pos->seed is then the run's seed from here on), the
 * optimizer's step count is set from it, and the replicas' weights are checked equal. */
void mgt_replica_start(mgt_replica *r, const mgt_replica_source *src, mgt_ckpt_pos *pos);

/* Collective: ends the job when this rank's weights differ from rank 0's (`when` says when). */
void mgt_replica_check(mgt_replica *r, const char *when);

/* Collective: every replica's batchnorm running statistics become their average over the ranks. */
void mgt_replica_average_buffers(mgt_replica *r);

/* Collective: rank 0 writes DIR/checkpoint.safetensors at position pos (buffers averaged first).
 * Non-finite weights end the job before anything is written, keeping the last good checkpoint. */
void mgt_replica_save_checkpoint(mgt_replica *r, const char *dir, const mgt_ckpt_pos *pos);

/* Collective: rank 0 writes DIR/weights.safetensors after `step` steps (as the checkpoint). */
void mgt_replica_save_weights(mgt_replica *r, const char *dir, int64_t step);

/* Collective: rank 0 reads a weights file (names and shapes checked), every replica takes its
 * weights and buffers (the optimizer's state stays). */
void mgt_replica_load_weights(mgt_replica *r, const char *path);

/* Collective: rank 0 writes DIR/best.safetensors, the weights at `step`, the best so far by the
 * monitored metric (monitor.h), with their validation loss val_loss in its metadata. */
void mgt_replica_save_best(mgt_replica *r, const char *dir, int64_t step, double val_loss);

void mgt_replica_free(mgt_replica *r);

#endif
