/* dataset.h: what the trainer reads samples from. Two sources:
 *  - IDX files (MNIST layout) kept as uint8 in memory, scaled to [0,1] only when a batch is
 *    gathered (60000 Fashion-MNIST images are 47 MB as bytes, 188 MB as floats);
 *  - synthetic data of any shape and class count, generated from (seed, index) on demand, so it
 *    costs no memory and every rank sees the same sample i.
 * A sample is h*w*c values in NHWC order; labels are class indices. */
#ifndef MGT_DATASET_H
#define MGT_DATASET_H

#include <stdint.h>

#include "../util.h"

typedef struct mgt_dataset {
    int64_t n;        /* samples */
    int h, w, c;      /* sample shape */
    int classes;      /* labels are in [0, classes) */
    uint8_t *pixels;  /* n*h*w*c bytes (IDX); NULL for synthetic */
    uint8_t *labels;  /* n bytes (IDX); NULL for synthetic */
    uint64_t seed;    /* synthetic only */
    char source[512]; /* for messages: the images file, or "synthetic" */
    /* synthetic only: split_salt keys the pixels (the class templates use the seed alone, so the
     * train and test splits share them); sample 0 of this view is generated sample `first`. */
    uint64_t split_salt;
    int64_t first;
    /* 1 if pixels/labels were allocated for this struct (load_idx); 0 for a slice or synthetic
     * data. mgt_dataset_free frees only owned memory. */
    int owned;
} mgt_dataset;

/* Reads DIR/<prefix>-images-idx3-ubyte[.gz] and DIR/<prefix>-labels-idx1-ubyte[.gz]
 * (prefix "train" or "t10k"). Checks the magic numbers, that the dimensions agree with the file
 * sizes, that both files hold the same count, that the image shape is h x w (c = 1) as the model
 * expects unless h == 0 (take the file's), and that every label is < classes (classes <= 0:
 * take max label + 1). Plain files are preferred over .gz when both exist. */
int mgt_dataset_load_idx(mgt_dataset *ds, const char *dir, const char *prefix, int h, int w,
                         int classes, mgt_err *err);

/* n samples of shape (h, w, c) with labels in [0, classes); split_salt tells the train and test
 * splits apart. Pixels are uniform in [0,1); the label is a function of the pixels (the class
 * whose fixed random template is closest), so a model can learn it. */
void mgt_dataset_synthetic(mgt_dataset *ds, int64_t n, int h, int w, int c, int classes,
                           uint64_t seed, uint64_t split_salt);

/* The two streams a synthetic dataset's values come from (util.h's mgt_rand64 keys): value j of
 * generated sample i is byte j % 8 of mgt_rand64(pixel_key, i * ceil(elems / 8) + j / 8), mapped
 * to (byte + 0.5) / 256, and class c's template is row c of template_key alike; the label is the
 * class whose template, centred as 2 * byte - 255, has the largest integer dot product with the
 * sample centred alike (ties to the lowest class). A backend that generates batches itself
 * (backend.h: synthetic) follows this definition. */
void mgt_dataset_synthetic_keys(const mgt_dataset *ds, uint64_t *pixel_key, uint64_t *template_key);

/* Copies samples idx[0..count) into x (count*h*w*c floats, NHWC, scaled to [0,1]) and their
 * labels into labels (int32). */
void mgt_dataset_gather(const mgt_dataset *ds, const int64_t *idx, int count, float *x,
                        int32_t *labels);

/* A view of samples [first, first+count) of ds: shares the memory (for --val-split). */
mgt_dataset mgt_dataset_slice(const mgt_dataset *ds, int64_t first, int64_t count);

void mgt_dataset_free(mgt_dataset *ds); /* frees only what load_idx allocated */

/* Writes an IDX file (for tests and tools): magic 0x0803 (images, dims n,h,w) or 0x0801 (labels,
 * dims n); gzip-compressed when path ends in ".gz". */
int mgt_idx_write(const char *path, const uint8_t *data, int ndims, const int32_t *dims,
                  mgt_err *err);

#endif
