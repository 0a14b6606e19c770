/* augment.h: per-epoch data augmentation of training samples, as CIFAR recipes do it
 * (torchvision's RandomCrop(size, padding=p) then RandomHorizontalFlip(), Keras'
 * RandomTranslation and RandomFlip("horizontal")), or as ImageNet recipes do it on image sets
 * (RandomResizedCrop then RandomHorizontalFlip: images.h draws and applies those); and the
 * per-channel normalisation of every sample ([input] mean and std).
 *
 * A sample's transform is a function of (seed, epoch, the sample's row in the training set) only,
 * drawn from util.h's counter-based RNG: the same sample gets the same transform in a given epoch
 * whatever the rank count, the thread count or the backend, and a resumed run redraws exactly what
 * the interrupted one would have. Validation and test data are never augmented. */
#ifndef MGT_AUGMENT_H
#define MGT_AUGMENT_H

#include <stdint.h>

/* [train] augment_flip (default false), augment_crop (default 0: off), and for image sets
 * augment_resized_crop (default false) with augment_scale and augment_ratio. */
typedef struct mgt_augment {
    int flip; /* mirror left-right with probability 1/2 */
    int crop; /* p > 0: pad by p zeros on every side, then crop the original size at a random
               * offset in [0, 2p] x [0, 2p] (a shift by -p..p in each direction) */
    /* Image sets: torchvision's RandomResizedCrop(input, scale, ratio) of the stored image,
     * resized to the model's input (images.h); scale and ratio are [min, max]. */
    int resized_crop;
    float scale[2], ratio[2];
} mgt_augment;

/* [input] mean and std: torchvision's Normalize after ToTensor, on the 0-1 scale: every sample's
 * channel ch becomes (x - mean[ch]) / std[ch], x being the value training would otherwise see
 * (uint8 data scaled by 1/255 first), in float32 as torchvision computes it. One value applies to
 * every channel. center_crop: image sets' evaluation crop (images.h). */
#define MGT_NORM_MAX_C 16
typedef struct mgt_input_tf {
    int norm;    /* mean and std are given */
    int nvalues; /* how many: 1, or the input's channels */
    float mean[MGT_NORM_MAX_C], std[MGT_NORM_MAX_C];
    float center_crop; /* 0: not given (0.875) */
} mgt_input_tf;

/* Normalises n samples of `elems` values (NHWC, c channels) in place; nothing without norm. */
void mgt_input_normalize(const mgt_input_tf *tf, float *x, int n, int64_t elems, int c);
/* "normalised (mean 0.485, 0.456, 0.406; std 0.229, 0.224, 0.225)" or "", for the start-up
 * block. */
const char *mgt_input_describe(const mgt_input_tf *tf, char *buf, int cap);

/* One sample's transform: out(y, x) = in(y + dy, x' + dx) with x' = w-1-x when flipped, else x;
 * zero where that falls outside the image. */
typedef struct mgt_augment_draw {
    int flip, dy, dx;
} mgt_augment_draw;

static inline int mgt_augment_on(const mgt_augment *a) {
    return a->flip || a->crop > 0 || a->resized_crop;
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

/* "horizontal flip, pad 4 and random crop", "random-resized crop (scale 0.08-1, ratio 0.75-1.33)
 * and horizontal flip", or "off": for the start-up block. */
const char *mgt_augment_describe(const mgt_augment *a, char *buf, int cap);

#endif
