/* staging.h: how a batch gets into backend memory, and which buffers the step then reads.
 *
 * The stager owns a run's input memory and hands each batch to the step as an mgt_input (model.h):
 * the buffers forward and the loss read, named explicitly, never by rewriting the model.
 *
 * Training batches come from the loader thread (data/loader.h) and take one of three ways:
 *   - host: the loader gathers samples into host buffers, which are copied in (CPU backend, or
 *     --device-data off, or a set too large to keep on the device);
 *   - device data: the training set's bytes are copied to the device once (up to 1 GiB) and only
 *     the batch's sample ids travel; a kernel gathers and scales the samples (gather_u8);
 *   - device synthetic: synthetic samples are generated on the device from the ids alone.
 * On a backend with staging (backend.h: stage, a GPU) the copies run on the copy queue into one
 * of two input sets, used in turn, while the previous step computes; set 0 is the model's own
 * input memory (mgt_model_alloc), set 1 is allocated here. Elsewhere a batch is copied into set
 * 0 on the compute queue. Evaluation and prediction upload into set 0.
 *
 * Per step: mgt_stage_next (the loader's batch, host side), then mgt_stage_put (into backend
 * memory; the returned input is valid until mgt_stage_done), the step's ops, mgt_stage_done. */
#ifndef MGT_STAGING_H
#define MGT_STAGING_H

#include <stdint.h>

#include "backend.h"
#include "data/dataset.h"
#include "data/augment.h"
#include "data/loader.h"
#include "model.h"
#include "util.h"

typedef enum {
    MGT_STAGE_HOST = 0,     /* samples gathered on the host and copied in */
    MGT_STAGE_DEVICE_DATA,  /* the training set kept in backend memory, gathered there */
    MGT_STAGE_DEVICE_SYNTH, /* synthetic samples generated in backend memory */
} mgt_stage_source;

typedef struct mgt_stage {
    mgt_backend *be;
    int64_t elems; /* input values per sample */
    int classes;
    int labels;    /* integer labels a sample: 1, or a sequence model's positions */
    /* The loss reads targets ([n][classes] floats): one-hot of the labels (categorical
     * cross-entropy), or the values a loss scores (binary cross-entropy, mse, ...), which are
     * a dataset's float targets where it has them (dataset.h), else made of its labels: one-hot
     * for several outputs, the label itself for one (0 or 1 for binary cross-entropy). */
    int one_hot;
    /* Class weights (model.h: cw) of a cross-entropy, and its label smoothing: the one-hot
     * targets of training batches are then the smoothed ones times the sample's class weight
     * (the loss reads them as they are: categorical cross-entropy of weighted targets is the
     * weighted loss); evaluation's are not weighted (Keras weighs the training loss only). */
    const float *cw;
    float smoothing;
    int max_batch; /* samples per rank and step, at most */
    int staged;    /* the backend stages batches on its copy queue (two sets) */
    /* Input sets in backend memory: inputs, labels, one-hot targets, and (staged) sample ids. */
    float *x[2], *t[2];
    int32_t *l[2];
    int64_t *ids[2];
    float *pinned_t[2]; /* staged: one-hot targets made on the host, per set */
    /* Host buffers for uploads on the compute queue: inputs, one-hot targets, labels, rows. */
    float *hx, *ht;
    int32_t *hl;
    int64_t *rows;
    /* Training batches: their source, the data kept on the device, the loader. */
    mgt_stage_source source;
    const mgt_dataset *train;
    uint8_t *dev_pixels, *dev_labels;
    uint64_t synth_keys[2]; /* device synthetic: the pixel and template keys */
    mgt_loader *loader;
    int slot; /* the set of the batch being staged */
    /* Called (when set) as a batch goes in: mark(ctx, 0) once the compute queue waits for its
     * copy, mark(ctx, 1) once the device has made it (profile.h's data marks). */
    void (*mark)(void *ctx, int what);
    void *mark_ctx;
} mgt_stage;

/* Input memory for batches of up to m->max_batch samples (after mgt_model_alloc). */
int mgt_stage_init(mgt_stage *s, mgt_backend *be, const mgt_model *m, mgt_err *err);

/* How training batches are made (mgt_stage_train). */
typedef struct mgt_stage_train_opts {
    uint64_t seed; /* shuffles */
    int64_t batch; /* global batch */
    int rank, world;
    int threaded;     /* the loader runs on its own thread */
    int device_data;  /* may keep the training set in backend memory (--device-data auto) */
    int host_batches; /* batches must pass through host buffers (the NaN fault hook) */
    mgt_augment augment; /* training augmentation, done on the host (no device kernel for it) */
    int64_t chunk;       /* > 0: ranks take whole chunks of each batch (--reproducible) */
} mgt_stage_train_opts;

/* Prepares training batches from ds: chooses their way in (see the top), starts the loader. */
int mgt_stage_train(mgt_stage *s, const mgt_dataset *ds, const mgt_stage_train_opts *o,
                    mgt_err *err);
/* Starts epoch `epoch` at step `first_step`: both sets are drained and free again. */
void mgt_stage_begin_epoch(mgt_stage *s, int64_t epoch, int64_t first_step);
/* The next training batch as the loader made it (host side; x and labels NULL when the batch is
 * made on the device). Waits until the previous batch's copies are done, as the loader is about
 * to reuse their host buffers. */
const mgt_batch *mgt_stage_next(mgt_stage *s);
/* Puts that batch into backend memory and returns the buffers the step reads. */
mgt_input mgt_stage_put(mgt_stage *s, const mgt_batch *bt);
/* The step's ops that read the batch are all issued: its set may be refilled once they ran. */
void mgt_stage_done(mgt_stage *s);

/* Rows [first, first + n) of ds (n <= max_batch) copied into set 0 on the compute queue
 * (evaluation, prediction), with their targets where the loss reads them. */
mgt_input mgt_stage_rows(mgt_stage *s, const mgt_dataset *ds, int64_t first, int n);

void mgt_stage_free(mgt_stage *s);

#endif
