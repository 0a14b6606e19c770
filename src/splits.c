/* splits.c: the datasets a command reads (see splits.h). */
#include "splits.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "data/images.h"
#include "data/tokens.h"
#include "runtime.h"

static int idx_present(const char *dir, const char *stem) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, stem);
    if (access(p, R_OK) == 0)
        return 1;
    snprintf(p, sizeof p, "%s/%s.gz", dir, stem);
    return access(p, R_OK) == 0;
}

/* The test split of synthetic data holds 10000 samples, as Fashion-MNIST's does. */
enum { SYNTHETIC_TEST = 10000 };

/* Split "train" or "test" (t10k) of the data into ds. */
static void load_split(const mgt_splits *s, mgt_dataset *ds, const mgt_model *m, int test,
                       int64_t synthetic_samples) {
    const int h = m->input.h, w = m->input.w, c = m->input.c;
    /* A loss that reads targets takes a .npy folder's y as float targets, and labels of the
     * other formats as one-hot targets, or for one output as the target itself: 0 or 1. */
    const int targets = mgt_loss_is_xent(m->loss) ? 0 : m->classes;
    const int k = !targets || m->classes > 1 ? m->classes : 2;
    mgt_err e;
    if (m->vocab > 0) { /* a language model: token shards, or synthetic tokens */
        if (s->synthetic ? mgt_dataset_synthetic_tokens(ds, test ? SYNTHETIC_TEST : synthetic_samples,
                                                        w, m->vocab, s->seed, test ? 2 : 1, &e)
                         : !mgt_tokens_dir(s->dir)
                             ? mgt_errf(&e,
                                        "model %s reads token ids, but %s holds no token shards "
                                        "(NAME.bin files with train or val in the name); make "
                                        "them from text with mgtrain convert --text",
                                        m->path, s->dir)
                             : mgt_dataset_load_tokens(ds, s->dir, test, w, m->vocab, &e))
            mgt_die_all("%s", e.msg);
        return;
    }
    if (s->synthetic)
        mgt_dataset_synthetic(ds, test ? SYNTHETIC_TEST : synthetic_samples, h, w, c, k, s->seed,
                              test ? 2 : 1);
    else if (mgt_dataset_load(ds, s->dir, test, h, w, c, k, targets, &m->input_tf, &e) < 0)
        mgt_die_all("%s", e.msg);
    ds->tf = m->input_tf;
    mgt_images_threads(ds, s->threads);
}

/* The model's input transform and augmentation against the data (the same on every rank). */
static void check_transforms(const mgt_splits *s, const mgt_model *m, const mgt_augment *aug,
                             int train) {
    const mgt_input_tf *tf = &m->input_tf;
    const int images = !s->synthetic && mgt_images_dir(s->dir);
    if (tf->norm && tf->nvalues != 1 && tf->nvalues != m->input.c)
        mgt_die_all("%s: [input] mean and std give %d values for %d channels; give one per "
                    "channel, or one for all",
                    m->path, tf->nvalues, m->input.c);
    if (tf->center_crop > 0 && !images)
        mgt_die_all("%s: [input] center_crop applies to image sets (mgtrain convert), whose "
                    "stored images are larger than the input; %s is not one: remove the key",
                    m->path, s->synthetic ? "synthetic data" : s->dir);
    if (!train)
        return;
    if (m->vocab > 0 && mgt_augment_on(aug))
        mgt_die_all("%s: augmentation (augment_*) moves and flips pixels; a language model's "
                    "inputs are token ids: remove the augment_ keys",
                    m->path);
    if (aug->resized_crop && !images)
        mgt_die_all("%s: augment_resized_crop crops and resizes images stored larger than the "
                    "input, which image sets hold (mgtrain convert); for %s use augment_crop "
                    "(pad and crop) or convert a folder of images",
                    m->path, s->synthetic ? "synthetic data" : s->dir);
    if (aug->crop > 0 && images)
        mgt_die_all("%s: augment_crop (pad and crop at the input's size) is for data stored at "
                    "the input's size; %s is an image set: use augment_resized_crop = true",
                    m->path, s->dir);
}

const char *mgt_split_name(mgt_split s) {
    return s == MGT_SPLIT_TRAIN ? "train" : "test";
}

void mgt_splits_load(mgt_splits *s, const mgt_splits_opts *o, const mgt_model *m, uint64_t seed,
                     int rank, int train) {
    memset(s, 0, sizeof *s);
    s->seed = seed;
    const char *dir = o->source == MGT_DATA_FOLDER ? o->dir : "synthetic";
    s->synthetic = o->source == MGT_DATA_SYNTHETIC;
    if (o->source == MGT_DATA_DEFAULT) {
        dir = MGT_DEFAULT_DATA;
        if (!idx_present(dir, "train-images-idx3-ubyte")) {
            s->synthetic = 1;
            if (rank == 0)
                fprintf(stderr,
                        "notice: no Fashion-MNIST in %s (apt-get install "
                        "dataset-fashion-mnist); using SYNTHETIC data instead\n",
                        dir);
        }
    }
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    s->threads = o->threads;
    if (train) {
        load_split(s, &s->train, m, 0, o->synthetic_samples);
        check_transforms(s, m, &o->augment, 1); /* the data is there: is it what they take? */
        if (o->val_split > 0 && s->train.images) {
            /* An image set is in class order: the same share of every class (images.h). */
            mgt_err e;
            mgt_dataset val;
            if (mgt_images_val_split(&s->train, o->val_split, seed, &val, &e) < 0)
                mgt_die_all("%s: %s", s->dir, e.msg);
            s->val = val;
            s->have_val = 1;
        } else if (o->val_split > 0) {
            /* Keras' validation_split: the LAST fraction of the training data, before shuffling. */
            const int64_t n = s->train.n, nv = (int64_t)((double)n * o->val_split);
            if (nv < 1 || nv >= n)
                mgt_die_all("--val-split %g leaves %lld validation samples of %lld; use a "
                            "fraction between 0 and 1",
                            o->val_split, (long long)nv, (long long)n);
            mgt_dataset full = s->train;
            s->val = mgt_dataset_slice(&full, n - nv, nv);
            s->train = mgt_dataset_slice(&full, 0, n - nv);
            s->train.owned = full.owned; /* the first slice frees the whole set */
            s->have_val = 1;
        }
    }
    if (!train || (!s->have_val && !o->no_validation)) {
        load_split(s, &s->test, m, train || o->split == MGT_SPLIT_TEST, o->synthetic_samples);
        if (!train)
            check_transforms(s, m, &o->augment, 0);
        s->have_test = 1;
        if (train) {
            s->val = s->test;
            s->have_val = 1;
            s->val_is_test = 1;
        }
    }
    if (s->synthetic)
        snprintf(s->desc, sizeof s->desc, "synthetic %dx%dx%d, %d classes", m->input.h, m->input.w,
                 m->input.c, m->classes);
    else
        snprintf(s->desc, sizeof s->desc, "%s", dir);
    const mgt_dataset *any = train ? &s->train : &s->test;
    char what[160];
    if (any->tokens)
        snprintf(s->desc + strlen(s->desc), sizeof s->desc - strlen(s->desc), " (%s)",
                 mgt_tokens_describe(any, what, sizeof what));
    if (any->images) { /* how the stored images become inputs */
        char eval[96];
        snprintf(s->desc + strlen(s->desc), sizeof s->desc - strlen(s->desc),
                 " (%s); evaluation: %s", mgt_images_describe(any, what, sizeof what),
                 mgt_images_eval_describe(any, m->input_tf.center_crop, eval, sizeof eval));
        if (train && o->val_split > 0)
            snprintf(s->desc + strlen(s->desc), sizeof s->desc - strlen(s->desc),
                     "; validation: %lld held out, the same share of every class",
                     (long long)s->val.n);
    }
    if (train && mgt_augment_on(&o->augment)) /* training batches only */
        snprintf(s->desc + strlen(s->desc), sizeof s->desc - strlen(s->desc), "; augmented: %s",
                 mgt_augment_describe(&o->augment, what, sizeof what));
    if (m->input_tf.norm)
        snprintf(s->desc + strlen(s->desc), sizeof s->desc - strlen(s->desc), "; %s",
                 mgt_input_describe(&m->input_tf, what, sizeof what));
}

const mgt_dataset *mgt_splits_test(mgt_splits *s, const mgt_model *m) {
    if (!s->have_test && !s->synthetic && !mgt_dataset_has_split(s->dir, 1))
        return NULL; /* a folder without a test split, validated with --val-split */
    if (!s->have_test) {
        load_split(s, &s->test, m, 1, 0);
        s->have_test = 1;
    }
    return &s->test;
}

void mgt_splits_free(mgt_splits *s) {
    mgt_dataset_free(&s->train);
    if (!s->val_is_test)
        mgt_dataset_free(&s->val);
    mgt_dataset_free(&s->test);
}
