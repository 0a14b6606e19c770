/* load.c: which format a data folder holds (dataset.h: mgt_dataset_load).
 *
 * A folder with images.json is an image set (images.h), one with train_x.npy or test_x.npy a
 * .npy folder, any other an IDX folder: the names do not overlap, so a folder is never read half
 * in one format and half in the other. IDX images have one channel, so a model with more
 * channels is refused here, before any file is read. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dataset.h"
#include "images.h"
#include "npy.h"

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 || errno != ENOENT;
}

int mgt_dataset_dir_is_npy(const char *dir) {
    char p[600];
    return (!mgt_npy_split_path(p, sizeof p, dir, "train", 'x') && exists(p)) ||
           (!mgt_npy_split_path(p, sizeof p, dir, "test", 'x') && exists(p));
}

/* DIR's IDX images of the split, plain or gzip. */
static int idx_images_exist(const char *dir, const char *prefix) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, prefix);
    if (exists(p))
        return 1;
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    return exists(p);
}

int mgt_dataset_has_split(const char *dir, int test) {
    char p[600];
    if (mgt_images_dir(dir))
        return mgt_images_has_split(dir, test ? "test" : "train");
    if (mgt_dataset_dir_is_npy(dir))
        return !mgt_npy_split_path(p, sizeof p, dir, test ? "test" : "train", 'x') && exists(p);
    return idx_images_exist(dir, test ? "t10k" : "train");
}

/* The folder's own format, without the input transform. */
static int load_format(mgt_dataset *ds, const char *dir, int test, int h, int w, int c, int classes,
                       const mgt_input_tf *tf, mgt_err *err) {
    if (mgt_images_dir(dir))
        return mgt_dataset_load_images(ds, dir, test ? "test" : "train", h, w, c, classes, tf, err);
    if (mgt_dataset_dir_is_npy(dir))
        return mgt_dataset_load_npy(ds, dir, test ? "test" : "train", h, w, c, classes, err);
    if (c != 1) {
        memset(ds, 0, sizeof *ds);
        return mgt_errf(err,
                        "%s: IDX images have 1 channel but the model's [input] shape has %d; use "
                        "--data synthetic, a 1-channel model, a folder of .npy files "
                        "(train_x.npy, train_y.npy, test_x.npy, test_y.npy) for images with "
                        "channels, or an image set (mgtrain convert)",
                        dir, c);
    }
    const char *prefix = test ? "t10k" : "train";
    if (mgt_dataset_load_idx(ds, dir, prefix, h, w, classes, err) == 0)
        return 0;
    /* No images at all: the folder may be meant as a .npy folder, so name that format too. */
    if (!idx_images_exist(dir, prefix) && err) {
        const size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len,
                 "; for .npy data the folder holds %s_x.npy and %s_y.npy; for a folder of JPEG "
                 "or PNG images, convert it first (mgtrain convert)",
                 test ? "test" : "train", test ? "test" : "train");
    }
    return -1;
}

int mgt_dataset_load(mgt_dataset *ds, const char *dir, int test, int h, int w, int c, int classes,
                     const mgt_input_tf *tf, mgt_err *err) {
    const mgt_input_tf none = {0};
    if (!tf)
        tf = &none;
    if (load_format(ds, dir, test, h, w, c, classes, tf, err) < 0)
        return -1;
    ds->tf = *tf;
    return 0;
}
