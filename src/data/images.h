/* images.h: image sets, the folders `mgtrain convert` writes (convert.h), as datasets; and the
 * transforms that turn a stored image into the model's input.
 *
 * An image set stores each RGB picture whole, its short side resized to at most SIZE (e.g. 256),
 * with the original's sides in the shard's index, or (the square layout, mgtrain convert
 * --square) its centre SIZE x SIZE only; either is larger than the model's input (e.g. 224 x 224):
 * the stored size is not the input size. Each sample is read from its shard when a batch needs it
 * (one pread of its bytes, so host memory does not grow with the set, and the kernel's page cache
 * keeps what fits), then:
 *  - training with augment_resized_crop: torchvision's RandomResizedCrop(input, scale, ratio) of
 *    the original picture (its 10 tries of an area in `scale` x the picture and an aspect ratio
 *    log-uniform in `ratio`, drawn on the original's sides, else the centre crop of the nearest
 *    allowed ratio), mapped onto the stored picture and resized from it to the input with
 *    Pillow's bilinear filter (resample.h: mgt_resample_box), then, with augment_flip, mirrored
 *    with probability 1/2; in the square layout the crop is drawn on the stored square;
 *  - evaluation, prediction, and training without it: torchvision's Resize(floor(input /
 *    center_crop)) of the original (256 for 224 at 0.875) then CenterCrop(input), made from the
 *    stored picture in one resize (the square layout: the square resized to that side); training
 *    then flips too with augment_flip;
 *  - then bytes / 255, and [input] mean and std (augment.h), as ToTensor and Normalize, on the
 *    same thread as the crop.
 * Each sample's crop and flip are drawn from (seed, epoch, its row in the training set) by the
 * counter-based RNG (util.h), so they are the same on any rank count, loader thread count and
 * backend, and after --resume. The work of a batch is spread over a pool of threads
 * (mgt_images_threads). */
#ifndef MGT_IMAGES_H
#define MGT_IMAGES_H

#include <stdint.h>

#include "../util.h"
#include "augment.h"
#include "dataset.h"
#include "npy.h"

/* The manifest that makes a folder an image set, and its format's name ("mgtrain images 1":
 * the square layout only, read as such). */
#define MGT_IMAGES_MANIFEST "images.json"
#define MGT_IMAGES_FORMAT "mgtrain images 2"

/* The whole layout's shard index, <split>-NNNNN_i.npy: int64 rows of (where the image's bytes
 * start in the shard's 1-D uint8 images array, its stored height and width, the original's
 * height and width). */
enum { MGT_IMAGES_INDEX_COLS = 5 };
/* Whether a whole-layout shard's images array x (uint8, 1-D) and index ix (int64, (n, 5)) agree:
 * each image's bytes right after the one before, all within x, sides of at least 1, the stored
 * short side at most `size` and no side larger than the original's. 0, or -1 with why in err. */
int mgt_images_index_ok(const mgt_npy *x, const mgt_npy *ix, int64_t n, int size, mgt_err *err);

/* 1 if DIR holds an image set (its manifest). */
int mgt_images_dir(const char *dir);
/* 1 if NAME is a file mgtrain convert keeps in an image set's folder: the manifest, classes.txt,
 * a split's shards (<split>-NNNNN_x.npy, _y.npy, _i.npy, .json) and its list of skipped files
 * (<split>_skipped.txt), split being train or test; the rest of the folder is not the set's. */
int mgt_images_keeps(const char *name);
/* 1 if the image set in DIR has the split ("train" or "test"). */
int mgt_images_has_split(const char *dir, const char *split);

/* Opens the split of the image set in DIR as ds: the manifest read and checked, every shard's
 * images file opened and its header checked against the manifest, every label read and checked
 * against classes (the model's; the set's classes must not outnumber them). The samples are
 * the model's input (h, w, c = 3); tf gives the evaluation crop (center_crop) and is kept as
 * ds->tf. Errors name the file and what to do. */
int mgt_dataset_load_images(mgt_dataset *ds, const char *dir, const char *split, int h, int w,
                            int c, int classes, const mgt_input_tf *tf, mgt_err *err);

/* The threads that transform a batch (the caller's included; 1: the caller alone). Not while
 * a gather runs: the pool is made again for a new count at the next gather. */
void mgt_images_threads(mgt_dataset *ds, int threads);

/* Rows rows[0..n) of the image set ds into x (n inputs, bytes / 255, and with `normalize` the
 * [input] mean and std of ds->tf applied: the same bits as mgt_dataset_normalize after, made on
 * the transform's threads) and their labels into labels: through the training transform a
 * (augment_resized_crop, augment_flip) drawn for epoch `epoch` under `seed`, or the evaluation
 * transform when a is NULL. A shard that cannot be read ends the job (this rank's I/O:
 * runtime.h's mgt_die). */
void mgt_images_gather(const mgt_dataset *ds, const int64_t *rows, int n, const mgt_augment *a,
                       uint64_t seed, int64_t epoch, int normalize, float *x, int32_t *labels);

/* --val-split on an image set (ds as loaded): the same share of every class held out for
 * validation, as Keras' validation_split does per class in flow_from_directory: int(fraction x
 * the class's images) of each class, chosen by a permutation of the class seeded with `seed`
 * (the same on every rank and run for one seed). ds becomes the training part and *val the held
 * out part, views of the same set in its order (ds keeps owning it). -1 with err when either
 * part would be empty. */
int mgt_images_val_split(mgt_dataset *ds, double fraction, uint64_t seed, mgt_dataset *val,
                         mgt_err *err);

/* Row `row`'s stored bytes into buf (at least mgt_images_max_bytes), its sides into d as
 * mgt_images_dims gives them: the read a sample's transform starts with (for bench/data's
 * per-part costs). 0, or -1 with err. */
int mgt_images_read(const mgt_dataset *ds, int64_t row, uint8_t *buf, int d[4], mgt_err *err);
size_t mgt_images_max_bytes(const mgt_dataset *ds);

/* Row `row`'s sides: stored height and width, then the original's (the stored ones in the square
 * layout). */
void mgt_images_dims(const mgt_dataset *ds, int64_t row, int d[4]);

/* One training sample's crop and flip: rows [top, top + h) and columns [left, left + w) of the
 * stored sh x sw image, mirrored when flip. */
typedef struct mgt_crop {
    int top, left, h, w, flip;
} mgt_crop;

/* The crop of training row `row` in epoch `epoch` from a picture of sh x sw (the original's sides;
 * the square layout's stored ones) (a->resized_crop; a->flip for the flip), as
 * torchvision's RandomResizedCrop.get_params draws it, each try's uniform numbers and the
 * offsets taken from (seed, epoch, row): try t uses draws 4t .. 4t + 3 of the row's 64 (the
 * area's and the log-ratio's uniforms, 53 bits each, then the top and left offsets, each the
 * high half of a draw times the offsets' count), draw 40's top bit is the flip. */
mgt_crop mgt_images_pick(const mgt_augment *a, int sh, int sw, uint64_t seed, int64_t epoch,
                         int64_t row);

/* The evaluation resize of an s x s stored image for an h x w input: the side it is resized to
 * (floor(max(h, w) / center_crop), at least max(h, w)). */
int mgt_images_eval_side(int h, int w, float center_crop);

/* The stored images' side, or the bound on their short side (SIZE of mgtrain convert). */
int mgt_images_side(const mgt_dataset *ds);

/* "images stored whole, short side at most 256 in 10 shards, 12000 of 10 classes" (or "stored at
 * 256x256"), for the start-up block. */
const char *mgt_images_describe(const mgt_dataset *ds, char *buf, int cap);

/* "resized to 256x256, centre 224x224" (square) or "short side resized to 256, centre 224x224"
 * (whole), for the start-up block. */
const char *mgt_images_eval_describe(const mgt_dataset *ds, float center_crop, char *buf, int cap);

void mgt_images_free(mgt_images *im);

#endif
