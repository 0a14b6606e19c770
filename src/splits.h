/* splits.h: the datasets a command reads, as --data, --val-split and --split chose them.
 *
 * Training reads the training split and validates on the last --val-split fraction of it (Keras'
 * validation_split: taken before shuffling) or, by default, on the test split. Evaluation and
 * prediction read one split (--split, default test). --data is a folder of IDX files or
 * "synthetic"; by default the packaged Fashion-MNIST, or synthetic data (with a notice) where it
 * is not installed. Synthetic data is keyed by the model's seed: load after the seed is final
 * (a resumed run's is the checkpoint's). Errors are the same on every rank and end the job. */
#ifndef MGT_SPLITS_H
#define MGT_SPLITS_H

#include <stdint.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "model.h"

/* Where --data looks by default (Debian's dataset-fashion-mnist package). */
#define MGT_DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

typedef struct mgt_splits {
    mgt_dataset train, val, test;
    int have_val, have_test;
    int val_is_test; /* val is a copy of test, not its own data */
    int synthetic;
    uint64_t seed;  /* keys synthetic data */
    char dir[512];  /* the IDX folder */
    char desc[900]; /* the data, for the start-up block and run.json */
    int threads;    /* an image set's transform threads (images.h) */
} mgt_splits;

/* Where the data comes from: the default folder (synthetic data, with a notice, where it is not
 * installed), a folder, or synthetic data. */
typedef enum { MGT_DATA_DEFAULT = 0, MGT_DATA_FOLDER, MGT_DATA_SYNTHETIC } mgt_data_source;
/* Which split eval and predict read. */
typedef enum { MGT_SPLIT_TEST = 0, MGT_SPLIT_TRAIN } mgt_split;

typedef struct mgt_splits_opts {
    mgt_data_source source;
    const char *dir;           /* MGT_DATA_FOLDER: the folder */
    double val_split;          /* > 0: validate on this last fraction of the training data */
    int64_t synthetic_samples; /* training samples of synthetic data */
    int threads;               /* threads transforming an image set's batches (0: by the cores) */
    int no_validation;         /* training without validation: no test split is read */
    mgt_split split;           /* eval, predict: the split they read */
    mgt_augment augment;       /* the training batches' augmentation: fits the data? (described) */
} mgt_splits_opts;

/* "train", "test". */
const char *mgt_split_name(mgt_split s);

/* Training (train = 1): the training and validation splits; otherwise the split o->split. Shapes
 * and classes come from the model; seed keys synthetic data (the run's: a resumed run's is its
 * checkpoint's); rank 0 says when the default folder is missing. */
void mgt_splits_load(mgt_splits *s, const mgt_splits_opts *o, const mgt_model *m, uint64_t seed,
                     int rank, int train);
/* The test split, loaded now if training validated on a fraction of the training data; NULL
 * when the data folder has none (a .npy folder with train_* files only). */
const mgt_dataset *mgt_splits_test(mgt_splits *s, const mgt_model *m);
void mgt_splits_free(mgt_splits *s);

#endif
