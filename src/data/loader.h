/* loader.h: a thread that prepares this rank's next training batch while the current step
 * computes, so the step never waits on gathering samples (or on the disk).
 *
 * Two host slots: the thread fills the slot of step s+1 while the trainer uses step s (four for
 * an image set, whose batches it prepares three steps ahead on the set's threads). Which
 * samples a step reads is pure index math (shard.h), so the thread computes the epoch's
 * permutation and this rank's part of each global batch by itself; the trainer only says which
 * epoch and step come next. Host buffers come from the backend (pinned memory on a GPU, so the
 * copy to the device can run asynchronously). */
#ifndef MGT_LOADER_H
#define MGT_LOADER_H

#include <stdint.h>

#include "../backend.h"
#include "augment.h"
#include "dataset.h"

typedef struct mgt_loader mgt_loader;

typedef struct mgt_batch {
    float *x;          /* n samples, NHWC, gathered (dataset.h), augmented (NULL: ids_only) */
    int32_t *labels;   /* n labels (NULL with ids_only) */
    int64_t *ids;      /* the n samples' rows in the dataset */
    int n;             /* this rank's samples */
    int64_t first;     /* position of this rank's first sample within the global batch */
    int64_t global_n;  /* samples in the global batch */
    int64_t step;      /* step within the epoch */
} mgt_batch;

/* A loader for `ds` split over `world` ranks with global batch `batch`; max_local is the most
 * samples a rank gets in one step. threaded = 0 builds each batch in the caller's thread when it
 * is asked for, its samples split over the backend's host_for threads where it has them (a rank
 * whose cores all compute: a second thread would only preempt the compute and make the ranks
 * wait for each other at the all-reduce). ids_only = 1 hands out the sample rows only
 * (a backend that generates synthetic samples itself). Returns NULL (with err) when memory or the
 * thread cannot be had. */
mgt_loader *mgt_loader_create(mgt_backend *be, const mgt_dataset *ds, uint64_t seed, int64_t batch,
                              int rank, int world, int max_local, int threaded, int ids_only,
                              mgt_err *err);
/* Augments every training batch from now on (augment.h: keyed by the seed, the epoch and each
 * sample's row). Call before the first begin_epoch; a loader made with ids_only refuses. */
int mgt_loader_augment(mgt_loader *l, const mgt_augment *a, mgt_err *err);
/* From now on each rank takes whole chunks of `chunk` samples of every global batch
 * (shard.h: mgt_shard_chunks; --reproducible). Call before the first begin_epoch. */
void mgt_loader_chunks(mgt_loader *l, int64_t chunk);
/* Starts producing epoch `epoch` from step `first_step` (ends any epoch in progress). */
void mgt_loader_begin_epoch(mgt_loader *l, int64_t epoch, int64_t first_step);
/* The next step's batch, waiting for it if the thread is behind. Valid until the next call. */
const mgt_batch *mgt_loader_next(mgt_loader *l);
void mgt_loader_destroy(mgt_loader *l);

#endif
