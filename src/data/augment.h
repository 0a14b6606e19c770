/* augment.h: per-epoch data augmentation of training samples, as CIFAR recipes do it
 * (torchvision's RandomCrop(size, padding=p) then RandomHorizontalFlip(), Keras'
 * RandomTranslation and RandomFlip("horizontal")).
 *
 * A sample's transform is a function of (seed, epoch, the sample's row in the training set) only,
 * drawn from util.h's counter-based RNG: the same sample gets the same transform in a given epoch
 * whatever the rank count, the thread count or the backend, and a resumed run redraws exactly what
 * the interrupted one would have. Validation and test data are never augmented. */
#ifndef MGT_AUGMENT_H
#define MGT_AUGMENT_H

#include <stdint.h>

/* [train] augment_flip (default false) and augment_crop (default 0: off). */
typedef struct mgt_augment {
    int flip; /* mirror left-right with probability 1/2 */
    int crop; /* p > 0: pad by p zeros on every side, then crop the original size at a random
               * offset in [0, 2p] x [0, 2p] (a shift by -p..p in each direction) */
} mgt_augment;

/* One sample's transform: out(y, x) = in(y + dy, x' + dx) with x' = w-1-x when flipped, else x;
 * zero where that falls outside the image. */
typedef struct mgt_augment_draw {
    int flip, dy, dx;
} mgt_augment_draw;

static inline int mgt_augment_on(const mgt_augment *a) {
    return a->flip || a->crop > 0;
}

/* The transform of training row `row` in epoch `epoch`. */
mgt_augment_draw mgt_augment_pick(const mgt_augment *a, uint64_t seed, int64_t epoch, int64_t row);

/* Applies d to one h x w x c sample (NHWC) from src into dst (distinct buffers). */
void mgt_augment_apply(const mgt_augment_draw *d, int h, int w, int c, const float *src,
                       float *dst);

/* Augments n gathered samples x (rows: their rows in the training set) in place; scratch holds
 * one sample (h*w*c floats). */
void mgt_augment_batch(const mgt_augment *a, uint64_t seed, int64_t epoch, const int64_t *rows,
                       int n, int h, int w, int c, float *x, float *scratch);

/* "horizontal flip, pad 4 and random crop", or "off": for the start-up block. */
const char *mgt_augment_describe(const mgt_augment *a, char *buf, int cap);

#endif
