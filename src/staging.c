/* staging.c: a batch's way into backend memory (see staging.h). */
#include "staging.h"

#include <stdlib.h>
#include <string.h>

/* The most training-set bytes kept in backend memory: Fashion-MNIST's 47 MB costs less device
 * memory than a host gather costs time per step on a fast GPU; far larger sets are not worth
 * the memory. */
#define DEVICE_DATA_MAX ((size_t)1 << 30)

int mgt_stage_init(mgt_stage *s, mgt_backend *be, const mgt_model *m, mgt_err *err) {
    memset(s, 0, sizeof *s);
    const mgt_ops *o = be->ops;
    s->be = be;
    s->elems = mgt_shape_elems(m->input);
    s->classes = m->classes;
    s->one_hot = m->loss != MGT_LOSS_SPARSE_CE || m->ncw > 0;
    if (mgt_loss_is_xent(m->loss) && m->ncw > 0) {
        s->cw = m->cw;
        s->smoothing = m->label_smoothing;
    }
    s->max_batch = m->max_batch;
    const size_t mb = (size_t)s->max_batch, in = (size_t)s->elems, k = (size_t)s->classes;
    s->labels = m->labels_per_sample > 1 ? m->labels_per_sample : 1;
    const size_t nl = mb * (size_t)s->labels;
    s->x[0] = m->x;
    s->l[0] = m->labels;
    s->t[0] = m->targets;
    s->hx = malloc(sizeof(float) * in * mb);
    s->ht = malloc(sizeof(float) * k * mb);
    s->hl = malloc(sizeof(int32_t) * nl);
    s->rows = malloc(sizeof(int64_t) * mb);
    if (!s->hx || !s->ht || !s->hl || !s->rows)
        return mgt_errf(err, "out of host memory for a batch of %d samples", s->max_batch);
    s->staged = o->stage && o->host_alloc;
    if (!s->staged)
        return 0;
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        s->pinned_t[i] = o->host_alloc(be, sizeof(float) * k * mb);
        s->ids[i] = o->alloc(be, sizeof(int64_t) * mb);
        ok = ok && s->pinned_t[i] && s->ids[i];
    }
    if (!ok)
        return mgt_errf(err,
                        "out of %s memory for the staging of batches of %d samples; a "
                        "smaller per-GPU batch needs less",
                        o->name, s->max_batch);
    return 0;
}

/* The second input set, for batches copied from the host: a batch's copy overwrites one set
 * while the step before reads the other. A batch made on the device is made on the compute
 * queue, in order with the steps that read it, and needs the one set only (ResNet-50 at 256
 * images a GPU: 154 MB less). */
static int second_set(mgt_stage *s, mgt_err *err) {
    const mgt_ops *o = s->be->ops;
    const size_t mb = (size_t)s->max_batch, in = (size_t)s->elems, k = (size_t)s->classes;
    if (s->source != MGT_STAGE_HOST) {
        s->x[1] = s->x[0];
        s->l[1] = s->l[0];
        s->t[1] = s->t[0];
        return 0;
    }
    if (s->x[1] && s->x[1] != s->x[0])
        return 0;
    s->x[1] = o->alloc(s->be, sizeof(float) * in * mb);
    s->l[1] = o->alloc(s->be, sizeof(int32_t) * mb * (size_t)s->labels);
    s->t[1] = o->alloc(s->be, sizeof(float) * k * mb);
    if (!s->x[1] || !s->l[1] || !s->t[1])
        return mgt_errf(err,
                        "out of %s memory for a second batch of %d samples (input staging); a "
                        "smaller per-GPU batch needs less",
                        o->name, s->max_batch);
    return 0;
}

/* The training set's bytes in backend memory, where batches are then gathered. Returns 0 when
 * the set is not kept there (too large, synthetic, or no gather op): batches then come from the
 * host. */
static int place_train_data(mgt_stage *s, const mgt_dataset *ds, mgt_err *err) {
    const mgt_ops *o = s->be->ops;
    const size_t elems = (size_t)ds->h * (size_t)ds->w * (size_t)ds->c, n = (size_t)ds->n;
    const size_t bytes = elems * n + n;
    /* byte samples with byte labels only: not a float32 .npy set, nor more than 256 classes,
     * nor normalised ones (the device's gather only scales), nor targets other than one-hot */
    if (!o->gather_u8 || !ds->pixels || !ds->labels || ds->tf.norm || bytes > DEVICE_DATA_MAX ||
        n == 0 || (s->one_hot && s->classes < 2) || s->cw)
        return 0;
    s->dev_pixels = o->alloc(s->be, elems * n);
    s->dev_labels = o->alloc(s->be, n);
    if (!s->dev_pixels || !s->dev_labels)
        return mgt_errf(err,
                        "out of %s memory for the training set (%.0f MiB); train with "
                        "--device-data off",
                        o->name, (double)bytes / 1048576.0);
    o->to_device(s->be, s->dev_pixels, ds->pixels, elems * n);
    o->to_device(s->be, s->dev_labels, ds->labels, n);
    return 1;
}

int mgt_stage_train(mgt_stage *s, const mgt_dataset *ds, const mgt_stage_train_opts *o,
                    mgt_err *err) {
    const mgt_ops *ops = s->be->ops;
    s->train = ds;
    s->source = MGT_STAGE_HOST;
    /* Batches are made on the device only where they can be staged there, and never when the
     * host must see them (the NaN fault hook, or augmentation and normalisation, which the host
     * does). */
    if (s->staged && !o->host_batches && !mgt_augment_on(&o->augment) && !ds->tf.norm) {
        if (mgt_dataset_is_synthetic(ds) && ops->synthetic && !(s->one_hot && s->classes < 2) &&
            !s->cw) {
            s->source = MGT_STAGE_DEVICE_SYNTH;
            mgt_dataset_synthetic_keys(ds, &s->synth_keys[0], &s->synth_keys[1]);
        } else if (o->device_data) {
            int placed = place_train_data(s, ds, err);
            if (placed < 0)
                return -1;
            if (placed)
                s->source = MGT_STAGE_DEVICE_DATA;
        }
    }
    if (s->staged && second_set(s, err) < 0)
        return -1;
    s->loader = mgt_loader_create(s->be, ds, o->seed, o->batch, o->rank, o->world, s->max_batch,
                                  o->threaded, s->source != MGT_STAGE_HOST, err);
    if (s->loader && o->chunk > 0)
        mgt_loader_chunks(s->loader, o->chunk);
    return s->loader && mgt_loader_augment(s->loader, &o->augment, err) == 0 ? 0 : -1;
}

void mgt_stage_begin_epoch(mgt_stage *s, int64_t epoch, int64_t first_step) {
    if (s->staged) /* the loader refills both sets now; evaluation may have used set 0 */
        for (int k = 0; k < 2; k++) {
            s->be->ops->stage_wait(s->be, k);
            s->be->ops->stage_release(s->be, k);
        }
    mgt_loader_begin_epoch(s->loader, epoch, first_step);
}

const mgt_batch *mgt_stage_next(mgt_stage *s) {
    /* The loader refills the previous batch's host buffers once it is asked for the next: their
     * copies must be done by then (this also bounds how far the host runs ahead). */
    if (s->staged)
        s->be->ops->stage_wait(s->be, s->slot ^ 1);
    return mgt_loader_next(s->loader);
}

/* The targets of n samples into t (staging.h: one_hot): the set's float targets of rows ids, or
 * one-hot labels, or (one output) the labels themselves. */
static void make_targets(const mgt_stage *s, const mgt_dataset *ds, const int64_t *ids,
                         const int32_t *labels, int n, int training, float *t) {
    const int classes = s->classes;
    if (ds->targets) {
        mgt_dataset_gather_targets(ds, ids, n, t);
        return;
    }
    if (classes == 1) {
        for (int i = 0; i < n; i++)
            t[i] = (float)labels[i];
        return;
    }
    if (s->cw) { /* smoothed one-hot targets, weighted in training (staging.h) */
        const float off = s->smoothing / (float)classes, on = 1.0f - s->smoothing + off;
        for (int i = 0; i < n; i++) {
            const float w = training ? s->cw[labels[i]] : 1.0f;
            for (int j = 0; j < classes; j++)
                t[(size_t)i * (size_t)classes + (size_t)j] = w * (j == labels[i] ? on : off);
        }
        return;
    }
    memset(t, 0, sizeof(float) * (size_t)classes * (size_t)n);
    for (int i = 0; i < n; i++)
        t[(size_t)i * (size_t)classes + (size_t)labels[i]] = 1.0f;
}

/* Host inputs and labels into set 0 on the compute queue, with targets if the loss reads them.
 * Where host memory is the backend's (no staging ops: the CPU), the ops read the host buffers
 * themselves: they stay as they are until the next batch is asked for, and the ops of this one
 * have all run by then (the MLP at batch 256 copied 0.8 MB a step for nothing). */
static mgt_input upload(mgt_stage *s, const mgt_dataset *ds, const int64_t *ids, const float *x,
                        const int32_t *labels, int n, int training) {
    const mgt_ops *o = s->be->ops;
    const int host = o->stage == NULL;
    if (s->one_hot)
        make_targets(s, ds, ids, labels, n, training, s->ht);
    if (host)
        return (mgt_input){x, labels, s->one_hot ? s->ht : NULL};
    o->to_device(s->be, s->x[0], x, sizeof(float) * (size_t)s->elems * (size_t)n);
    o->to_device(s->be, s->l[0], labels, sizeof(int32_t) * (size_t)n * (size_t)s->labels);
    if (s->one_hot)
        o->to_device(s->be, s->t[0], s->ht, sizeof(float) * (size_t)s->classes * (size_t)n);
    return (mgt_input){s->x[0], s->l[0], s->one_hot ? s->t[0] : NULL};
}

mgt_input mgt_stage_put(mgt_stage *s, const mgt_batch *bt) {
    if (!s->staged)
        return upload(s, s->train, bt->ids, bt->x, bt->labels, bt->n, 1);
    const mgt_ops *o = s->be->ops;
    const int k = s->slot;
    const size_t n = (size_t)bt->n, in = (size_t)s->elems, cls = (size_t)s->classes;
    float *t = s->one_hot ? s->t[k] : NULL;
    if (s->source != MGT_STAGE_HOST) { /* only the rows travel; the batch is made on the device */
        void *dst = s->ids[k];
        const void *src = bt->ids;
        const size_t bytes = sizeof(int64_t) * n;
        o->stage(s->be, k, 1, &dst, &src, &bytes);
        if (s->mark)
            s->mark(s->mark_ctx, 0);
        if (s->source == MGT_STAGE_DEVICE_DATA)
            o->gather_u8(s->be, bt->n, (int64_t)in, s->classes, s->dev_pixels, s->dev_labels,
                         s->ids[k], s->x[k], s->l[k], t);
        else
            o->synthetic(s->be, bt->n, (int64_t)in, s->classes, s->synth_keys[0], s->synth_keys[1],
                         s->train->first, s->ids[k], s->x[k], s->l[k], t);
        if (s->mark)
            s->mark(s->mark_ctx, 1);
    } else {
        if (t)
            make_targets(s, s->train, bt->ids, bt->labels, bt->n, 1, s->pinned_t[k]);
        void *dst[3] = {s->x[k], s->l[k], s->t[k]};
        const void *src[3] = {bt->x, bt->labels, s->pinned_t[k]};
        const size_t bytes[3] = {sizeof(float) * in * n, sizeof(int32_t) * n * (size_t)s->labels,
                                 t ? sizeof(float) * cls * n : 0};
        o->stage(s->be, k, 3, dst, src, bytes);
        if (s->mark)
            s->mark(s->mark_ctx, 0);
    }
    return (mgt_input){s->x[k], s->l[k], t};
}

void mgt_stage_done(mgt_stage *s) {
    if (!s->staged)
        return;
    s->be->ops->stage_release(s->be, s->slot);
    s->slot ^= 1;
}

mgt_input mgt_stage_rows(mgt_stage *s, const mgt_dataset *ds, int64_t first, int n) {
    for (int i = 0; i < n; i++)
        s->rows[i] = first + i;
    mgt_dataset_gather(ds, s->rows, n, s->hx, s->hl);
    mgt_dataset_normalize(ds, s->hx, n);
    return upload(s, ds, s->rows, s->hx, s->hl, n, 0);
}

void mgt_stage_free(mgt_stage *s) {
    mgt_backend *be = s->be;
    if (!be) /* never initialised */
        return;
    const mgt_ops *o = be->ops;
    mgt_loader_destroy(s->loader);
    o->free(be, s->dev_pixels);
    o->free(be, s->dev_labels);
    if (s->x[1] != s->x[0]) { /* a second set of its own */
        o->free(be, s->x[1]);
        o->free(be, s->l[1]);
        o->free(be, s->t[1]);
    }
    for (int i = 0; i < 2; i++) {
        if (s->pinned_t[i])
            o->host_free(be, s->pinned_t[i]);
        o->free(be, s->ids[i]);
    }
    free(s->hx);
    free(s->ht);
    free(s->hl);
    free(s->rows);
    memset(s, 0, sizeof *s);
}
