/* dataset.h: what the trainer reads samples from. Four sources:
 *  - IDX files (MNIST layout) kept as uint8 in memory, scaled to [0,1] only when a batch is
 *    gathered (60000 Fashion-MNIST images are 47 MB as bytes, 188 MB as floats);
 *  - .npy files (numpy.save) of any channel count, uint8 (scaled like IDX) or float32 (taken as
 *    they are), memory-mapped: their pages are read when a batch touches them (npy.h);
 *  - image sets (mgtrain convert: images.h): RGB images stored larger than the model's input, in
 *    shards read sample by sample, cropped and resized to the input when gathered;
 *  - synthetic data of any shape and class count, generated from (seed, index) on demand, so it
 *    costs no memory and every rank sees the same sample i.
 * A sample is h*w*c values in NHWC order; labels are class indices. */
#ifndef MGT_DATASET_H
#define MGT_DATASET_H

#include <stdint.h>

#include "../util.h"
#include "augment.h"

typedef struct mgt_images mgt_images;
typedef struct mgt_tokens mgt_tokens;

typedef struct mgt_dataset {
    int64_t n;   /* samples */
    int h, w, c; /* sample shape (an image set's: the model's input, which gather makes) */
    int classes; /* labels are in [0, classes) */
    /* The samples: bytes (IDX, uint8 .npy: scaled by 1/255 when gathered) in pixels, or float32
     * values (.npy) in fpixels, stored little-endian unless fswap; both NULL for synthetic data
     * (mgt_dataset_is_synthetic). A mapped file's pages are read-only: never written through. */
    uint8_t *pixels;
    const uint8_t *fpixels; /* n*h*w*c float32 values, possibly unaligned: read with memcpy */
    int fswap;              /* fpixels are big-endian */
    /* The labels: n bytes (IDX; .npy whose labels are all < 256), else n int32 in labels32 (a
     * .npy set with more than 256 classes); both NULL for synthetic data. */
    uint8_t *labels;
    int32_t *labels32;
    /* Float targets instead of labels (a .npy set read for a loss that scores values: mse,
     * binary_crossentropy, ...): n * target_elems float32 values, sample after sample; NULL
     * otherwise. */
    float *targets;
    int target_elems;
    uint64_t seed;    /* synthetic only */
    char source[512]; /* for messages: the images file, or "synthetic" */
    /* synthetic only: split_salt keys the pixels (the class templates use the seed alone, so the
     * train and test splits share them); sample 0 of this view is generated sample `first`. */
    uint64_t split_salt;
    int64_t first;
    /* .npy: the images file's mapping, which pixels or fpixels point into. */
    void *map;
    size_t map_len;
    /* An image set's shards and transforms (images.h); sample 0 of this view is stored image
     * `first`. NULL for the other sources. */
    mgt_images *images;
    /* An image set's view that is not a run of consecutive images (--val-split's per-class
     * parts): sample i is the set's image rows[i], and its label labels[rows[i]] (the set's
     * arrays, not offset); NULL: sample i is image first + i. The set owns the array. */
    const int64_t *rows;
    /* A token set's shards (tokens.h): a sample is a window of T + 1 tokens, its input the
     * first T (h = 1, w = T, c = 1) and its T labels the next token at each; sample 0 of this
     * view is window `first`. NULL for the other sources. */
    mgt_tokens *tokens;
    /* How samples become inputs beyond the source's own scaling: [input] mean and std (applied
     * by mgt_dataset_normalize, after augmentation) and, for image sets, center_crop. */
    mgt_input_tf tf;
    /* 1 if this struct owns its memory (load_idx: pixels and labels; load_npy: the mapping and
     * the labels; load_images: the image set and the labels); 0 for a slice or synthetic data.
     * mgt_dataset_free frees only owned memory. */
    int owned;
} mgt_dataset;

/* Reads DIR/<prefix>-images-idx3-ubyte[.gz] and DIR/<prefix>-labels-idx1-ubyte[.gz]
 * (prefix "train" or "t10k"). Checks the magic numbers, that the dimensions agree with the file
 * sizes, that both files hold the same count, that the image shape is h x w (c = 1) as the model
 * expects unless h == 0 (take the file's), and that every label is < classes (classes <= 0:
 * take max label + 1). Plain files are preferred over .gz when both exist. */
int mgt_dataset_load_idx(mgt_dataset *ds, const char *dir, const char *prefix, int h, int w,
                         int classes, mgt_err *err);

/* Reads DIR/<split>_x.npy (images: uint8 or float32, shape (N, H, W, C), or (N, H, W) for one
 * channel, or rows of values (N, F) for a model of input (1, 1, F); C order) and DIR/<split>_y.npy,
 * split "train" or "test": labels (any integer dtype, shape (N,) or (N, 1)), or with targets > 0
 * float targets of `targets` values a sample (any numeric dtype, shape (N, ...), converted to
 * float32: ds->targets). Checks each file (npy.h), that the input shape is the model's (h, w, c)
 * unless h == 0 (take the file's), that both hold N samples, and that every label is in
 * [0, classes) (classes <= 0: take max label + 1) or every target finite, naming the first bad
 * one. */
int mgt_dataset_load_npy(mgt_dataset *ds, const char *dir, const char *split, int h, int w, int c,
                         int classes, int targets, mgt_err *err);

/* The data folder DIR in whichever format it holds: an image set when DIR has images.json
 * (images.h), .npy files when DIR has train_x.npy or test_x.npy, IDX files otherwise (those need
 * c == 1). test = 0 reads the training split, 1 the test split (IDX: t10k-*, .npy: test_*).
 * targets > 0: the model's loss reads that many float targets a sample, which a .npy folder's y
 * files give (the other formats' labels are made into targets when batches are staged).
 * tf (kept as ds->tf; NULL: none) is the model's [input] transform. */
int mgt_dataset_load(mgt_dataset *ds, const char *dir, int test, int h, int w, int c, int classes,
                     int targets, const mgt_input_tf *tf, mgt_err *err);
/* 1 if DIR has the images of the split (test = 0: training, 1: test) in its format. */
int mgt_dataset_has_split(const char *dir, int test);
/* -1, with what to pass instead, if DIR is no folder at all (a typo of --data): said before the
 * run folder is looked at, as the first mistake on the command line. */
int mgt_dataset_dir_check(const char *dir, mgt_err *err);
/* 1 if DIR holds .npy data (train_x.npy or test_x.npy). */
int mgt_dataset_dir_is_npy(const char *dir);
/* The i-th name a data file of DIR may have (IDX, plain and .gz, then .npy), as DIR/NAME into
 * p[n] (empty when it does not fit); -1 past the last. */
int mgt_dataset_file(const char *dir, int i, char *p, size_t n);

/* 1 for generated (synthetic) data: no samples in memory. */
static inline int mgt_dataset_is_synthetic(const mgt_dataset *ds) {
    return !ds->pixels && !ds->fpixels && !ds->images && !ds->tokens;
}

/* The integer labels a sample has: one, or a token window's T. */
static inline int mgt_dataset_labels_per_sample(const mgt_dataset *ds) {
    return ds->tokens ? ds->w : 1;
}

/* n samples of shape (h, w, c) with labels in [0, classes); split_salt tells the train and test
 * splits apart. Each sample's label is drawn first and its values are that class's fixed random
 * template plus noise, in (0, 1) (synthetic_def.h), so a model can learn the label. */
void mgt_dataset_synthetic(mgt_dataset *ds, int64_t n, int h, int w, int c, int classes,
                           uint64_t seed, uint64_t split_salt);

/* The two keys a synthetic dataset is made from (util.h's mgt_rand64 keys): the split's noise
 * stream (its label stream derives from it) and the class templates' stream, shared by the
 * splits. synthetic_def.h says how sample i comes from them; a backend that generates batches
 * itself (backend.h: synthetic) follows it. */
void mgt_dataset_synthetic_keys(const mgt_dataset *ds, uint64_t *pixel_key, uint64_t *template_key);

/* Copies samples idx[0..count) into x (count*h*w*c floats, NHWC: bytes scaled to [0,1], float32
 * values as stored; an image set's images through its evaluation transform) and their labels
 * into labels (int32). Not normalised: see mgt_dataset_normalize. */
void mgt_dataset_gather(const mgt_dataset *ds, const int64_t *idx, int count, float *x,
                        int32_t *labels);
/* The float targets of samples idx[0..count) into t (count * target_elems values); a set with
 * targets only (ds->targets). */
static inline void mgt_dataset_gather_targets(const mgt_dataset *ds, const int64_t *idx, int count,
                                              float *t) {
    const size_t k = (size_t)ds->target_elems;
    for (int i = 0; i < count; i++)
        for (size_t j = 0; j < k; j++)
            t[(size_t)i * k + j] = ds->targets[(size_t)idx[i] * k + j];
}
/* [input] mean and std on n gathered (and augmented) samples, in place (augment.h). */
static inline void mgt_dataset_normalize(const mgt_dataset *ds, float *x, int n) {
    mgt_input_normalize(&ds->tf, x, n, (int64_t)ds->h * ds->w * ds->c, ds->c);
}

/* mgt_dataset_gather, a synthetic set's class templates taken from `templates` where it is not
 * NULL (mgt_synthetic_templates: its two 64-bit hashes per 8 values halve to one, the noise's;
 * the same bytes). 256 samples of 28x28 on one core of a 2-core EPYC: 132 -> 95 us. */
void mgt_dataset_gather_with(const mgt_dataset *ds, const uint64_t *templates,
                             const int64_t *idx, int count, float *x, int32_t *labels);
/* A synthetic set's class templates as gathered (template draw w of class L at L * words + w,
 * words = ceil(h w c / 8)): mgt_synthetic_templates_count of them, 0 for other sets and where
 * they would take more than MGT_SYN_TEMPLATES_MAX bytes (10 classes of 28x28: 7.8 KB; 1000 of
 * 224x224x3: 150 MB, made as gathered instead). */
#define MGT_SYN_TEMPLATES_MAX ((size_t)4 << 20)
size_t mgt_synthetic_templates_count(const mgt_dataset *ds);
void mgt_synthetic_templates(const mgt_dataset *ds, uint64_t *out);

/* A view of samples [first, first+count) of ds: shares the memory (for --val-split). */
mgt_dataset mgt_dataset_slice(const mgt_dataset *ds, int64_t first, int64_t count);

void mgt_dataset_free(mgt_dataset *ds); /* frees only what load_idx or load_npy allocated */

/* Writes an IDX file (for tests and tools): magic 0x0803 (images, dims n,h,w) or 0x0801 (labels,
 * dims n); gzip-compressed when path ends in ".gz". */
int mgt_idx_write(const char *path, const uint8_t *data, int ndims, const int32_t *dims,
                  mgt_err *err);

#endif
