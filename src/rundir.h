/* rundir.h: the run folder (--out) of a training run: what it keeps there and who may write it.
 *
 * A run folder holds ONE run: weights.safetensors, checkpoint.safetensors (and the older ones
 * --keep-checkpoints keeps, checkpoint-<step>.safetensors), best.safetensors, metrics.jsonl and
 * metrics.csv, run.json, a copy of the model file (<model>.cfg) and the TensorBoard files (tb/).
 * Rank 0 alone writes it, under these rules:
 *
 *  - One job at a time. Rank 0 holds OUT/mgtrain.lock while it writes there: the file names the
 *    owner (host, pid, start time, Slurm job id) and the owner holds an flock on it, which the
 *    kernel drops when the process dies however it dies. The file itself is removed on every
 *    ending mgtrain controls: a finished or stopped run, an error (runtime.h: mgt_die and
 *    mgt_die_all remove it), a second Ctrl-C, the communication watchdog. A second job is
 *    refused, naming the owner. A lock no live process holds (its job was killed) is taken over
 * with a notice when it names a process of this host, or this same Slurm job (requeued: Slurm never
 * runs a job id twice at once); one of another host and job cannot be checked from here, and the
 * message says how to remove it.
 *  - A new run never replaces another run's files: a folder that holds a run (its weights or a
 *    checkpoint) is refused unless the run is resumed (--resume) or replaced (--overwrite, which
 *    removes the old run's files first), and the message names a free folder.
 *  - Temporary files (NAME.tmp.<pid>, tensor_io.h) that a process killed while writing left
 *    behind are removed when the next run takes the lock.
 *  - run.json says what the run is (model, its file, data, batch, optimizer, ...) and lists its
 *    segments: each start or resume, with its first and last step, world size, times and how it
 *    ended ("finished", "stopped at --max-steps", "interrupted by SIGTERM", or "running" while it
 *    runs or if it died).
 *
 * Library code: each function returns -1 with one sentence in err; nothing here prints or exits. */
#ifndef MGT_RUNDIR_H
#define MGT_RUNDIR_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* The files of a run folder. */
#define MGT_RUN_LOCK "mgtrain.lock"
#define MGT_RUN_INFO "run.json"

typedef struct mgt_rundir {
    char dir[512];
    int lock_fd;      /* -1: the lock is not held */
    double lock_time; /* when it was taken (wall clock, seconds since the epoch) */
    void *info;       /* run.json as last written (a cJSON tree), between begin and end */
} mgt_rundir;

void mgt_rundir_init(mgt_rundir *d, const char *dir);

/* Takes OUT/mgtrain.lock for this process (host names this machine). The folder must exist. A
 * stale lock taken over leaves a sentence in notice (else notice[0] = 0). */
int mgt_rundir_lock(mgt_rundir *d, const char *host, char *notice, size_t notice_size,
                    mgt_err *err);
/* Removes the lock (if held). */
void mgt_rundir_unlock(mgt_rundir *d);

/* Whether dir holds a run a new one must not replace: 1 with the refusal's text in err (what the
 * run is, and --resume, --overwrite or a free folder), 0 if not. */
int mgt_rundir_holds_run(const char *dir, mgt_err *err);

/* 1 if dir holds a run, or is being written by one: run.json, the lock, weights or a checkpoint. */
int mgt_rundir_is_run(const char *dir);
/* 1 if `name` in the run folder dir is a file mgtrain keeps there (listed at the top; its model
 * copy is model_copy, or, when NULL, the one dir's run.json names). The files of tb/ are kept
 * too: the caller asks about the folder above. */
int mgt_rundir_keeps(const char *dir, const char *name, const char *model_copy);

/* --overwrite: removes the files of the run in the folder (as listed at the top; tb/ is kept,
 * TensorBoard shows only the new run from its first step). Needs the lock. */
int mgt_rundir_clear(mgt_rundir *d, mgt_err *err);

/* Removes the temporary files a killed writer left, named in notice (notice[0] = 0: none):
 * every NAME.tmp.<pid> of another process that is older than the lock. Needs the lock. */
int mgt_rundir_clean_temporaries(mgt_rundir *d, char *notice, size_t notice_size, mgt_err *err);

/* OUT/<name>.cfg: the model file the run trains (its text as parsed), atomically. */
int mgt_rundir_copy_model(mgt_rundir *d, const char *name, const char *text, size_t len,
                          mgt_err *err);

/* What run.json says about the run (strings are copied). flags: the command line's words that
 * define the run ("--lr=0.01", "--no-validation"; resume.h), which a resumed run takes again. */
typedef struct mgt_run_info {
    const char *model, *model_file, *model_copy, *optimizer, *backend, *data, *version;
    int world, nodes, epochs;
    int64_t global_batch;
    double lr;
    uint64_t seed;
    const char *const *flags;
    int nflags;
} mgt_run_info;

/* What a run folder's run.json records of the run, for a resume: its flags (NUL-separated
 * words, nflags of them; nflags -1 when run.json has no record of them: an older mgtrain wrote
 * it), its data as described, its model copy's file name, and the ranks of its last segment. */
typedef struct mgt_run_record {
    char flags[8192];
    int nflags;
    char data[900];
    char model_copy[80];
    int world;
} mgt_run_record;

/* Reads dir's run.json into r: 1 when there is one, 0 when there is none, -1 with err when it
 * cannot be read or is damaged. */
int mgt_rundir_read_record(const char *dir, mgt_run_record *r, mgt_err *err);

/* Writes run.json for a run that starts (resumed = 0: the segments start anew) or resumes
 * (resumed = 1: the existing segments are kept) at start_step, with a new segment "running". */
int mgt_rundir_begin(mgt_rundir *d, const mgt_run_info *ri, int resumed, int64_t start_step,
                     mgt_err *err);
/* Ends the segment begun: its last step and how it ended. */
int mgt_rundir_end(mgt_rundir *d, int64_t end_step, const char *how, mgt_err *err);
void mgt_rundir_free(mgt_rundir *d);

/* eval and predict --run DIR: the model file and weights a run folder names (its model copy,
 * weights.safetensors), into model[n] and weights[n]. */
int mgt_rundir_find(const char *dir, char *model, char *weights, size_t n, mgt_err *err);

#endif
