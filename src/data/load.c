/* load.c: which format a data folder holds (dataset.h: mgt_dataset_load).
 *
 * A folder with images.json is an image set (images.h), one with train_x.npy or test_x.npy a
 * .npy folder, any other an IDX folder: the names do not overlap, so a folder is never read half
 * in one format and half in the other. A folder that holds files of two formats is refused,
 * naming one of each: which set the user meant cannot be told (the same samples exported twice,
 * or two different data sets), and reading either one without a word could train on the wrong
 * data. IDX images have one channel, so a model with more
 * channels is refused here, before any file is read. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dataset.h"
#include "images.h"
#include "npy.h"
#include "tokens.h"

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

/* The IDX files' names, each plain or gzip (".gz"). */
static const char *const idx_stems[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
enum { NIDX = sizeof idx_stems / sizeof idx_stems[0] };

int mgt_dataset_file(const char *dir, int i, char *p, size_t n) {
    static const char *const splits[] = {"train", "test"};
    if (i < 0 || i >= 2 * NIDX + 4)
        return -1;
    if (i < 2 * NIDX) {
        snprintf(p, n, "%s/%s%s", dir, idx_stems[i / 2], i % 2 ? ".gz" : "");
        return 0;
    }
    i -= 2 * NIDX;
    if (mgt_npy_split_path(p, n, dir, splits[i / 2], i % 2 ? 'y' : 'x'))
        p[0] = 0; /* too long to be a file */
    return 0;
}

/* An IDX file of DIR (images or labels, either split, plain or gzip) into p: 1 if there is one. */
static int idx_file_in(const char *dir, char *p, size_t n) {
    for (int i = 0; i < 2 * NIDX; i++)
        if (!mgt_dataset_file(dir, i, p, n) && p[0] && exists(p))
            return 1;
    return 0;
}

/* A folder with files of two formats (an image set, .npy, IDX): -1 with one file of each of the
 * first two named. */
static int check_one_format(const char *dir, mgt_err *err) {
    char file[3][600];
    const char *name[3];
    int n = 0;
    if (mgt_images_dir(dir)) {
        snprintf(file[n], sizeof file[n], "%s/%s", dir, MGT_IMAGES_MANIFEST);
        name[n++] = "an image set";
    }
    if (mgt_dataset_dir_is_npy(dir)) {
        if (mgt_npy_split_path(file[n], sizeof file[n], dir, "train", 'x') || !exists(file[n]))
            mgt_npy_split_path(file[n], sizeof file[n], dir, "test", 'x');
        name[n++] = ".npy";
    }
    if (idx_file_in(dir, file[n], sizeof file[n]))
        name[n++] = "IDX";
    if (n < 2 && mgt_tokens_dir(dir)) {
        snprintf(file[n], sizeof file[n], "%s/*.bin", dir);
        name[n++] = "token shards";
    }
    if (n < 2)
        return 0;
    return mgt_errf(err,
                    "%s holds data in two formats, %s (%s) and %s (%s), and mgtrain cannot tell "
                    "which is meant; move one of them into a folder of its own and pass that "
                    "folder to --data",
                    dir, name[0], file[0], name[1], file[1]);
}

int mgt_dataset_dir_check(const char *dir, mgt_err *err) {
    struct stat st;
    const char *what = stat(dir, &st) != 0 ? (errno == ENOENT ? "no such folder" : strerror(errno))
                       : !S_ISDIR(st.st_mode) ? "not a folder"
                                              : NULL;
    if (!what)
        return 0;
    return mgt_errf(err,
                    "--data %s: %s; pass --data with a folder of IDX files (e.g. %s), of .npy "
                    "files (train_x.npy, train_y.npy, ...) or an image set (mgtrain convert), or "
                    "--data synthetic",
                    dir, what, "/usr/share/datasets/fashion-mnist");
}

int mgt_dataset_has_split(const char *dir, int test) {
    char p[600];
    if (mgt_tokens_dir(dir))
        return mgt_tokens_has_split(dir, test);
    if (mgt_images_dir(dir))
        return mgt_images_has_split(dir, test ? "test" : "train");
    if (mgt_dataset_dir_is_npy(dir))
        return !mgt_npy_split_path(p, sizeof p, dir, test ? "test" : "train", 'x') && exists(p);
    return idx_images_exist(dir, test ? "t10k" : "train");
}

/* The folder's own format, without the input transform. */
static int load_format(mgt_dataset *ds, const char *dir, int test, int h, int w, int c, int classes,
                       int targets, const mgt_input_tf *tf, mgt_err *err) {
    if (check_one_format(dir, err) < 0) {
        memset(ds, 0, sizeof *ds);
        return -1;
    }
    if (mgt_images_dir(dir))
        return mgt_dataset_load_images(ds, dir, test ? "test" : "train", h, w, c, classes, tf, err);
    if (mgt_tokens_dir(dir)) {
        if (h != 1 || c != 1 || classes < 2) {
            memset(ds, 0, sizeof *ds);
            return mgt_errf(err,
                            "%s holds token shards, which a language model reads: its [input] "
                            "has context and vocab (docs/transformers.md)",
                            dir);
        }
        return mgt_dataset_load_tokens(ds, dir, test, w, classes, err);
    }
    if (mgt_dataset_dir_is_npy(dir))
        return mgt_dataset_load_npy(ds, dir, test ? "test" : "train", h, w, c, classes, targets,
                                    err);
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
                     int targets, const mgt_input_tf *tf, mgt_err *err) {
    const mgt_input_tf none = {0};
    if (!tf)
        tf = &none;
    if (load_format(ds, dir, test, h, w, c, classes, targets, tf, err) < 0)
        return -1;
    ds->tf = *tf;
    return 0;
}
