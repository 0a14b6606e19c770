/* fit.h: the training loop: epochs of optimizer steps, validation and checkpoints between them.
 *
 * Every rank runs the same loop on its own part of each global batch; the step's gradients (and
 * its loss and accuracy) are summed over the ranks, bucket by bucket while backward runs
 * (reducer.h), and every rank then applies the same update, so the replicas stay equal. The loop
 * starts from, advances and saves one position (checkpoint.h's mgt_ckpt_pos), so a run stopped at
 * any checkpoint resumes where it was, with any number of ranks. Only rank 0 prints and writes
 * files. */
#ifndef MGT_FIT_H
#define MGT_FIT_H

#include <stdint.h>

#include "backend.h"
#include "checkpoint.h"
#include "clip.h"
#include "comm.h"
#include "data/dataset.h"
#include "fault.h"
#include "metrics.h"
#include "model.h"
#include "monitor.h"
#include "optim.h"
#include "reducer.h"
#include "replica.h"
#include "schedule.h"
#include "staging.h"

/* What the loop drives: set up by the caller, training batches prepared (mgt_stage_train). */
typedef struct mgt_fit_env {
    mgt_model *m;
    mgt_optim *opt;
    mgt_backend *be;
    mgt_comm *comm;
    mgt_replica *rep;
    mgt_stage *st;
    const mgt_fault *fault;
    const mgt_dataset *val; /* validated on after every epoch; NULL: no validation */
    const char *out;        /* checkpoints and metrics go here (rank 0) */
} mgt_fit_env;

/* How long a run trains, at what rate, and what it decides on its validation history. */
typedef struct mgt_regime {
    int epochs;
    int64_t max_steps;   /* stop after this many optimizer steps in all (0: no limit) */
    float lr;            /* the learning rate the schedule starts from */
    mgt_sched_cfg sched; /* the schedule and warm-up (schedule.h) */
    mgt_clip_cfg clip;   /* gradient clipping (clip.h) */
    mgt_stop_cfg stop;   /* early stopping and the best weights (monitor.h) */
} mgt_regime;

/* What an optimizer step is made of, and how its gradients travel (reducer.h). */
typedef struct mgt_pipeline {
    int64_t batch;    /* the global batch of a micro-batch */
    int accum_steps;  /* micro-batches per optimizer step (1: none) */
    int64_t chunk;    /* --reproducible: exact sums over chunks of this many samples (0: off) */
    double bucket_mb; /* bucket cap in MiB (0: one all-reduce after backward) */
    int zero;         /* ZeRO-1 */
    mgt_progress progress; /* how the CPU transport's requests progress */
    int cuda_graph;        /* replay forward and backward as CUDA graphs where they apply */
} mgt_pipeline;

/* What rank 0 shows and writes about the run (metrics.h, profile.h), and the checks between
 * steps. */
typedef struct mgt_fit_log {
    int verbose;           /* rank 0's display: metrics.h (-1: by the terminal) */
    int launched;          /* started by mpirun/srun (metrics.h) */
    int profile;           /* print per-phase times */
    int profile_layers;    /* and (device marks) per layer and direction */
    const char *precision; /* "fp32", "tf32" or "bf16": the floors the layer table compares to */
    const char *timeline;  /* Chrome-trace file of every phase, or NULL */
    int tensorboard;       /* event files in OUT/tb */
    int64_t log_every;     /* per-step rows every N global steps (0: none; metrics.h) */
    int64_t debug_check;   /* compare weight checksums across ranks every K steps (0: never) */
} mgt_fit_log;

typedef struct mgt_fit_opts {
    mgt_regime regime;
    mgt_pipeline step;
    mgt_fit_log log;
    int64_t save_every; /* also checkpoint every N steps (0: at epoch ends only) */
    int resumed;        /* from a checkpoint: the metrics files keep their history */
} mgt_fit_opts;

typedef struct mgt_fit_result {
    int64_t steps;    /* optimizer steps this run took */
    double seconds;   /* the epochs' wall time, validation and saving excluded */
    int64_t val_step; /* the position of the last validation (-1: none) */
    double val_loss, val_acc, val_top5;
    mgt_figs val_task; /* the last validation's task figures (metrics.h) */
    int stop_signal; /* the signal training stopped early for, its checkpoint saved (0: none) */
} mgt_fit_result;

/* Collective: trains from *pos to the model's last epoch or max_steps, whichever comes first,
 * checkpointing at every epoch end, every save_every steps and where it stops; or, when a stop
 * signal is caught (runtime.h: mgt_runtime_catch_stops) on any rank, to the end of that step on
 * every rank (res->stop_signal). *pos ends where the run stopped. Errors end the job. */
void mgt_fit(const mgt_fit_env *env, const mgt_fit_opts *o, mgt_ckpt_pos *pos, mgt_fit_result *res);

#endif
