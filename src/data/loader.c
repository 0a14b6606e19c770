/* loader.c: the prefetching batch producer (see loader.h).
 *
 * Protocol, guarded by one mutex: the thread works on `want` = the next step whose slot is free;
 * a slot is free once the trainer has moved past the step it held. begin_epoch bumps a
 * generation counter so a batch of the old epoch that was being built is thrown away.
 *
 * An image set's batch is the costly one (a crop and a resize per sample, images.h): its samples
 * are spread over the set's thread pool, and the loader runs three batches ahead instead of one,
 * so a slow batch (a cold page cache, a busy core) is absorbed rather than waited for. */
#include "loader.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "augment.h"
#include "images.h"
#include "shard.h"

/* Host slots: the batch in use and those prepared ahead of it. */
enum { SLOTS_MAX = 4, SLOTS_IMAGES = 4, SLOTS_OTHER = 2 };

typedef struct slot {
    mgt_batch b;
    int ready;
    uint64_t gen;
} slot;

struct mgt_loader {
    mgt_backend *be;
    const mgt_dataset *ds;
    uint64_t seed;
    int64_t batch, steps;
    int64_t chunk; /* > 0: ranks take whole chunks of the batch (mgt_loader_chunks) */
    int rank, world;
    int threaded, ids_only;
    mgt_augment aug;    /* training augmentation (off unless mgt_loader_augment) */
    float *aug_scratch; /* one sample, for augmenting in place */
    uint64_t *templates; /* a synthetic set's class templates (NULL: made as gathered) */
    int64_t *perm, *idx;
    int slots; /* SLOTS_IMAGES or SLOTS_OTHER */
    slot s[SLOTS_MAX];

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    uint64_t gen;          /* epoch generation */
    int64_t epoch;
    int64_t next_fill;     /* next step the thread builds */
    int64_t next_take;     /* next step the trainer takes */
    int64_t perm_epoch;    /* epoch the permutation was built for (-1: none) */
};

/* Samples [lo, hi) of a batch: a part of gather_batch's. */
typedef struct {
    const mgt_dataset *ds;
    const uint64_t *templates;
    const int64_t *rows;
    float *x;
    int32_t *labels;
} gather_job;

static void gather_part(void *p, size_t lo, size_t hi) {
    const gather_job *g = p;
    const size_t elems = (size_t)g->ds->h * (size_t)g->ds->w * (size_t)g->ds->c;
    mgt_dataset_gather_with(g->ds, g->templates, g->rows + lo, (int)(hi - lo), g->x + lo * elems,
                            g->labels + lo * (size_t)mgt_dataset_labels_per_sample(g->ds));
}

/* A batch's samples: on the threads of the backend's ops where the loader has no thread of its
 * own (the fill then runs between the trainer's steps, which leaves those threads idle), in
 * parts of GATHER_PART_MIN samples or more; whole on the loader's thread otherwise. A sample is
 * a function of its row alone, so the parts make the same bytes as one gather. */
enum { GATHER_PART_MIN = 8 };

static void gather_batch(mgt_loader *l, const int64_t *rows, int n, float *x, int32_t *labels) {
    const gather_job g = {l->ds, l->templates, rows, x, labels};
    if (!l->threaded && l->be->ops->host_for)
        l->be->ops->host_for(l->be, (size_t)n, GATHER_PART_MIN, gather_part, (void *)&g);
    else
        gather_part((void *)&g, 0, (size_t)n);
}

static void fill(mgt_loader *l, slot *s, int64_t epoch, int64_t step) {
    int64_t n = l->ds->n;
    int64_t b = mgt_shard_batch_size(n, l->batch, step);
    mgt_range r = l->chunk ? mgt_shard_chunks(b, l->chunk, l->rank, l->world)
                           : mgt_shard_range(b, l->rank, l->world);
    const int64_t *rows = l->perm + step * l->batch + r.first;
    memcpy(s->b.ids, rows, sizeof(int64_t) * (size_t)r.count);
    if (!l->ids_only) {
        const mgt_dataset *ds = l->ds;
        if (ds->images) { /* cropped, resized and normalised as they are read, on the set's
                           * threads: no part of a sample's work runs once per batch */
            mgt_images_gather(ds, rows, (int)r.count, &l->aug, l->seed, epoch, 1, s->b.x,
                              s->b.labels);
        } else {
            gather_batch(l, rows, (int)r.count, s->b.x, s->b.labels);
            mgt_augment_batch(&l->aug, l->seed, epoch, rows, (int)r.count, ds->h, ds->w, ds->c,
                              s->b.x, l->aug_scratch);
            mgt_dataset_normalize(ds, s->b.x, (int)r.count);
        }
    }
    s->b.n = (int)r.count;
    s->b.first = r.first;
    s->b.global_n = b;
    s->b.step = step;
}

static void *run(void *arg) {
    mgt_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        /* Wait until there is an epoch, a step left in it, and a free slot for it. */
        while (!l->stop && (l->next_fill >= l->steps || l->next_fill - l->next_take >= l->slots ||
                            l->s[l->next_fill % l->slots].ready))
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop)
            break;
        int64_t step = l->next_fill, epoch = l->epoch;
        uint64_t gen = l->gen;
        slot *s = &l->s[step % l->slots];
        int need_perm = l->perm_epoch != epoch;
        pthread_mutex_unlock(&l->mu);
        if (need_perm)
            mgt_shard_permutation(l->seed, epoch, l->ds->n, l->perm);
        fill(l, s, epoch, step);
        pthread_mutex_lock(&l->mu);
        if (need_perm && gen == l->gen)
            l->perm_epoch = epoch;
        if (gen == l->gen) { /* not overtaken by begin_epoch */
            s->ready = 1;
            s->gen = gen;
            l->next_fill++;
            pthread_cond_broadcast(&l->cv);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

mgt_loader *mgt_loader_create(mgt_backend *be, const mgt_dataset *ds, uint64_t seed, int64_t batch,
                              int rank, int world, int max_local, int threaded, int ids_only,
                              mgt_err *err) {
    mgt_loader *l = calloc(1, sizeof *l);
    if (!l) {
        mgt_errf(err, "out of host memory for the data loader");
        return NULL;
    }
    l->be = be;
    l->ds = ds;
    l->seed = seed;
    l->batch = batch;
    l->rank = rank;
    l->world = world;
    l->threaded = threaded;
    l->ids_only = ids_only;
    l->steps = 0;
    l->perm_epoch = -1;
    l->slots = ds->images && threaded && !ids_only ? SLOTS_IMAGES : SLOTS_OTHER;
    l->perm = malloc(sizeof(int64_t) * (size_t)(ds->n ? ds->n : 1));
    size_t in = (size_t)ds->h * (size_t)ds->w * (size_t)ds->c;
    int ok = l->perm != NULL;
    for (int i = 0; i < l->slots && ok; i++) {
        size_t xb = sizeof(float) * in * (size_t)max_local;
        size_t lb = sizeof(int32_t) * (size_t)max_local * (size_t)mgt_dataset_labels_per_sample(ds);
        size_t ib = sizeof(int64_t) * (size_t)max_local;
        l->s[i].b.ids = be->ops->host_alloc ? be->ops->host_alloc(be, ib) : malloc(ib);
        ok = l->s[i].b.ids != NULL;
        if (ids_only)
            continue;
        l->s[i].b.x = be->ops->host_alloc ? be->ops->host_alloc(be, xb) : malloc(xb);
        l->s[i].b.labels = be->ops->host_alloc ? be->ops->host_alloc(be, lb) : malloc(lb);
        ok = ok && l->s[i].b.x && l->s[i].b.labels;
    }
    /* A synthetic set's class templates, made once (dataset.h); without the memory, as gathered */
    const size_t ntpl = ids_only ? 0 : mgt_synthetic_templates_count(ds);
    if (ok && ntpl && (l->templates = malloc(sizeof(uint64_t) * ntpl)) != NULL)
        mgt_synthetic_templates(ds, l->templates);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    if (ok && !threaded) {
        l->stop = -1; /* no thread to join */
        return l;
    }
    if (!ok || pthread_create(&l->thread, NULL, run, l) != 0) {
        mgt_errf(err, "cannot start the data loader (out of memory or threads) for batches of %d "
                      "samples",
                 max_local);
        l->stop = -1; /* no thread to join */
        mgt_loader_destroy(l);
        return NULL;
    }
    return l;
}

int mgt_loader_augment(mgt_loader *l, const mgt_augment *a, mgt_err *err) {
    if (!mgt_augment_on(a))
        return 0;
    if (l->ids_only)
        return mgt_errf(err, "augmentation needs batches gathered on the host; this loader hands "
                             "out sample rows only");
    const mgt_dataset *ds = l->ds;
    float *scratch = malloc(sizeof(float) * (size_t)ds->h * (size_t)ds->w * (size_t)ds->c);
    if (!scratch)
        return mgt_errf(err, "out of host memory for data augmentation");
    /* Before the first epoch the thread is idle; the lock publishes the fields to it. */
    pthread_mutex_lock(&l->mu);
    free(l->aug_scratch);
    l->aug_scratch = scratch;
    l->aug = *a;
    pthread_mutex_unlock(&l->mu);
    return 0;
}

void mgt_loader_chunks(mgt_loader *l, int64_t chunk) {
    pthread_mutex_lock(&l->mu); /* publishes the field to the idle thread, as above */
    l->chunk = chunk;
    pthread_mutex_unlock(&l->mu);
}

void mgt_loader_begin_epoch(mgt_loader *l, int64_t epoch, int64_t first_step) {
    pthread_mutex_lock(&l->mu);
    l->gen++;
    l->epoch = epoch;
    l->steps = mgt_shard_steps(l->ds->n, l->batch);
    l->next_fill = l->next_take = first_step;
    for (int i = 0; i < l->slots; i++)
        l->s[i].ready = 0;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

const mgt_batch *mgt_loader_next(mgt_loader *l) {
    if (!l->threaded) {
        if (l->perm_epoch != l->epoch) {
            mgt_shard_permutation(l->seed, l->epoch, l->ds->n, l->perm);
            l->perm_epoch = l->epoch;
        }
        slot *s = &l->s[0];
        fill(l, s, l->epoch, l->next_take++);
        return &s->b;
    }
    pthread_mutex_lock(&l->mu);
    /* The slot of the previous step is free again. */
    if (l->next_take > 0) {
        slot *prev = &l->s[(l->next_take - 1) % l->slots];
        if (prev->ready && prev->b.step == l->next_take - 1)
            prev->ready = 0;
        pthread_cond_broadcast(&l->cv);
    }
    slot *s = &l->s[l->next_take % l->slots];
    while (!(s->ready && s->gen == l->gen && s->b.step == l->next_take))
        pthread_cond_wait(&l->cv, &l->mu);
    l->next_take++;
    pthread_mutex_unlock(&l->mu);
    return &s->b;
}

void mgt_loader_destroy(mgt_loader *l) {
    if (!l)
        return;
    if (l->stop != -1) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    for (int i = 0; i < l->slots; i++) {
        void *bufs[] = {l->s[i].b.x, l->s[i].b.labels, l->s[i].b.ids};
        for (int k = 0; k < 3; k++) {
            if (!bufs[k])
                continue;
            if (l->be->ops->host_free)
                l->be->ops->host_free(l->be, bufs[k]);
            else
                free(bufs[k]);
        }
    }
    free(l->aug_scratch);
    free(l->templates);
    free(l->perm);
    free(l);
}
