/* checkpoint.h: the files a training run saves its state in, and the position it resumes from.
 *
 * Owns the checkpoint format (OUT/checkpoint.safetensors): which tensors it holds (the model's
 * parameters and buffers under their PyTorch names, then the optimizer's state arenas under the
 * slot names of the optimizer table), its metadata keys, and every check made when a run resumes
 * from it (format, optimizer, global batch, tensor names and sizes, numbers). Also the weights
 * file (OUT/weights.safetensors), which holds the model's tensors alone. The bytes on disk
 * (safetensors, CRC-32, atomic rename) are tensor_io.c's.
 *
 * The position (mgt_ckpt_pos) is everything a checkpoint holds besides tensors. Rank 0 reads it
 * and every rank receives it as ONE struct in one broadcast, each field in its own type: the
 * seed stays a 64-bit integer end to end (through a double, seeds above 2^53 came back
 * rounded). */
#ifndef MGT_CHECKPOINT_H
#define MGT_CHECKPOINT_H

#include <stdint.h>

#include "comm.h"
#include "model.h"
#include "monitor.h"
#include "optim.h"
#include "util.h"

/* Where a run stands: saved in a checkpoint, restored on --resume. */
typedef struct mgt_ckpt_pos {
    int64_t step;          /* optimizer steps taken */
    int64_t epoch;         /* 0-based: the epoch the next step belongs to */
    int64_t step_in_epoch; /* the next step's index within that epoch */
    int64_t optimizer_t;   /* the optimizer's own step count (Adam's bias correction) */
    uint64_t seed;         /* the run's seed: initialisation, shuffles, dropout */
    /* The epoch so far over all ranks: loss sum, correct, samples, top-5 hits (-1: not known,
     * the epoch having started under a checkpoint from before top-5 was counted). */
    double epoch_sums[4];
    /* The epoch's task sums so far (model.h: MGT_SUM_TASK on, in that order; none for a
     * cross-entropy): binary cross-entropy's counts, a regression's error sums. */
    double epoch_task[MGT_TASK_SUMS_MAX];
    double best_val_loss;  /* the lowest validation loss so far, best.safetensors' (-1: none) */
    mgt_monitor_state mon; /* the validation history's decisions so far (monitor.h) */
} mgt_ckpt_pos;

/* Host copies of the arenas a checkpoint holds, in the model's and the optimizer's layouts:
 * w[param_count], buf[buffer_count], slot[i][grad_count] for the optimizer's nslots slots (the
 * trainable tensors'). */
typedef struct mgt_ckpt_arrays {
    float *w, *buf;
    float *slot[MGT_OPT_MAX_SLOTS];
} mgt_ckpt_arrays;

/* What a checkpoint must agree on with the run that resumes it, besides the model and the
 * optimizer: the samples of one optimizer step (the global batch times the micro-batches of
 * gradient accumulation: a step's samples and their dropout masks depend on this product alone,
 * fit.c, so a checkpoint resumes with any split of it into batch size and accumulation steps),
 * and --reproducible's chunk (0: off), on which the bits of the steps after it depend. */
typedef struct mgt_ckpt_run {
    int64_t step_batch;
    int64_t chunk;
} mgt_ckpt_run;

/* Writes DIR/checkpoint.safetensors atomically (rank 0 calls it). world: ranks of the run,
 * recorded for people reading the file (a run resumes with any rank count). */
int mgt_ckpt_write(const char *dir, const mgt_model *m, const mgt_optim *opt,
                   const mgt_ckpt_run *run, const mgt_ckpt_arrays *a, const mgt_ckpt_pos *pos,
                   int world, mgt_err *err);

/* Reads DIR/checkpoint.safetensors into a and pos after checking that it is a checkpoint of
 * this model (its name, then a hash of its structure), optimizer and run, and that every field of
 * the position is within what a run can have written; each failure says what differs and what to
 * do. Nothing is trusted: a damaged or hand-made file is refused, never trained on. */
int mgt_ckpt_read(const char *dir, const mgt_model *m, const mgt_optim *opt,
                  const mgt_ckpt_run *run, mgt_ckpt_arrays *a, mgt_ckpt_pos *pos, mgt_err *err);

/* The position against the training data it resumes on: `samples` at global batch `batch` make
 * the epoch's step count, and the checkpoint's epoch, step within the epoch, step count and
 * samples seen must agree with it (another data set, or a damaged file, would not). */
int mgt_ckpt_check_position(const mgt_ckpt_pos *pos, const char *dir, int64_t samples,
                            int64_t batch, mgt_err *err);

/* A hash of what makes the model this model (layers, their outputs, every tensor's name and
 * shape), saved in checkpoints. */
uint64_t mgt_ckpt_model_hash(const mgt_model *m);

/* The model DIR/checkpoint.safetensors was saved for: its name into name[n] and its structure's
 * hash (0 when the checkpoint predates the hash). 1 when read, 0 when there is no checkpoint,
 * -1 with err when it cannot be read or is no checkpoint. */
int mgt_ckpt_model_of(const char *dir, char *name, size_t n, uint64_t *hash, mgt_err *err);

/* Sends root's position to every rank (collective). */
void mgt_ckpt_bcast_pos(mgt_comm *c, mgt_ckpt_pos *pos, int root);

/* Writes DIR/FILE (weights.safetensors, best.safetensors) atomically: the model's tensors in
 * PyTorch's names and layouts, loadable by torch's load_state_dict and by mgtrain
 * eval/predict/--init-weights; its metadata says the step and, when val_loss >= 0, the
 * validation loss the weights had. */
int mgt_ckpt_write_weights(const char *dir, const char *file, const mgt_model *m, const float *w,
                           const float *buf, int64_t step, double val_loss, mgt_err *err);

/* --keep-checkpoints K. Before a new checkpoint replaces DIR/checkpoint.safetensors, the one there
 * (saved at step prev_step) is kept as checkpoint-<prev_step>.safetensors, a second name for the
 * same file (a hard link, or a copy where the file system has none), so checkpoint.safetensors
 * is never missing. */
int mgt_ckpt_keep_previous(const char *dir, int64_t prev_step, mgt_err *err);
/* After it: only the newest keep - 1 checkpoint-<step>.safetensors stay. */
int mgt_ckpt_prune(const char *dir, int64_t keep, mgt_err *err);

#endif
