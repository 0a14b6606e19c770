/* mgt_images_dump: what an image set's transforms make of some of its rows, for
 * tests/cli/images.sh to compare with Pillow (tests/cli/images_data.py crops).
 *   mgt_images_dump DIR SPLIT H W TRAIN SEED EPOCH THREADS OUT [CENTER_CROP [S0 S1 R0 R1]]
 * loads SPLIT of the image set DIR for an H x W x 3 input, gathers rows 0, 1, ... (every row, at
 * most 64) through the training transform (TRAIN 1: random-resized crop with scale [S0, S1] and
 * ratio [R0, R1], torchvision's by default, and flip, drawn for SEED and EPOCH) or the
 * evaluation one (TRAIN 0; CENTER_CROP 0: the default), on
 * THREADS threads, and writes into the folder OUT: rows.npy (int64), x.npy (float32, bytes / 255
 * as gathered), norm.npy (float32, x normalised with ImageNet's mean and std on the transform's
 * threads, checked equal to mgt_dataset_normalize's), crops.npy (int32 rows of top, left, h, w,
 * flip as mgt_images_pick drew them on the original's sides, then the stored h, w and the
 * original's h, w) and meta.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/images.h"
#include "tensor_io.h"

static int write_npy(const char *dir, const char *name, const char *descr, const int64_t *shape,
                     int ndim, const void *data, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const void *parts[1] = {data};
    mgt_err e;
    if (mgt_npy_write_parts(path, descr, shape, ndim, 1, parts, &bytes, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 10) {
        fprintf(stderr, "usage: mgt_images_dump DIR SPLIT H W TRAIN SEED EPOCH THREADS OUT "
                        "[CENTER_CROP [S0 S1 R0 R1]]\n");
        return 2;
    }
    const int h = atoi(argv[3]), w = atoi(argv[4]), train = atoi(argv[5]);
    const uint64_t seed = strtoull(argv[6], NULL, 10);
    const int64_t epoch = atoll(argv[7]);
    const char *out = argv[9];
    mgt_input_tf tf = {.norm = 1,
                       .nvalues = 3,
                       .mean = {0.485f, 0.456f, 0.406f},
                       .std = {0.229f, 0.224f, 0.225f},
                       .center_crop = argc > 10 ? (float)atof(argv[10]) : 0.0f};
    mgt_dataset ds;
    mgt_err e;
    if (mgt_dataset_load_images(&ds, argv[1], argv[2], h, w, 3, 1000, &tf, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    mgt_images_threads(&ds, atoi(argv[8]));
    const int n = ds.n < 64 ? (int)ds.n : 64;
    mgt_augment a = {
        .flip = 1, .resized_crop = 1, .scale = {0.08f, 1.0f}, .ratio = {3.0f / 4.0f, 4.0f / 3.0f}};
    if (argc > 14) {
        a.scale[0] = (float)atof(argv[11]);
        a.scale[1] = (float)atof(argv[12]);
        a.ratio[0] = (float)atof(argv[13]);
        a.ratio[1] = (float)atof(argv[14]);
    }
    int64_t *rows = malloc(sizeof *rows * (size_t)n);
    const size_t elems = (size_t)h * (size_t)w * 3;
    float *x = malloc(sizeof *x * elems * (size_t)n), *xn = malloc(sizeof *xn * elems * (size_t)n);
    int32_t *labels = malloc(sizeof *labels * (size_t)n), *crops = malloc(sizeof *crops * 9 * n);
    /* rows in a shuffled order, so that a batch's samples are not the shards' order */
    for (int i = 0; i < n; i++)
        rows[i] = (int64_t)((i * 7 + 3) % n);
    /* the bytes / 255, then normalised on the transform's threads; and the separate pass over
     * the batch, which must give the same bits */
    mgt_images_gather(&ds, rows, n, train ? &a : NULL, seed, epoch, 0, x, labels);
    mgt_images_gather(&ds, rows, n, train ? &a : NULL, seed, epoch, 1, xn, labels);
    float *xs2 = malloc(sizeof *x * elems * (size_t)n);
    memcpy(xs2, x, sizeof *x * elems * (size_t)n);
    mgt_dataset_normalize(&ds, xs2, n);
    if (memcmp(xs2, xn, sizeof *x * elems * (size_t)n)) {
        fprintf(stderr, "normalised on the threads differs from mgt_dataset_normalize\n");
        return 1;
    }
    free(xs2);
    for (int i = 0; i < n; i++) {
        const mgt_augment none = {0};
        int d[4];
        mgt_images_dims(&ds, rows[i], d); /* the crop is drawn on the original's sides */
        const mgt_crop c = mgt_images_pick(train ? &a : &none, d[2], d[3], seed, epoch, rows[i]);
        const int32_t v[9] = {c.top, c.left, c.h, c.w, c.flip, d[0], d[1], d[2], d[3]};
        memcpy(crops + 9 * i, v, sizeof v);
    }
    const int64_t xs[4] = {n, h, w, 3}, rs[1] = {n}, cs[2] = {n, 9};
    int rc = write_npy(out, "rows.npy", "<i8", rs, 1, rows, sizeof *rows * (size_t)n) ||
             write_npy(out, "x.npy", "<f4", xs, 4, x, sizeof *x * elems * (size_t)n) ||
             write_npy(out, "norm.npy", "<f4", xs, 4, xn, sizeof *xn * elems * (size_t)n) ||
             write_npy(out, "crops.npy", "<i4", cs, 2, crops, sizeof *crops * 9 * (size_t)n);
    char meta[512], path[1024];
    const int len =
        snprintf(meta, sizeof meta,
                 "{\"train\": %d, \"seed\": %llu, \"epoch\": %lld, \"scale\": [%.9g, "
                 "%.9g], \"ratio\": [%.9g, %.9g], \"center_crop\": %.9g, \"mean\": "
                 "[0.485, 0.456, 0.406], \"std\": [0.229, 0.224, 0.225]}\n",
                 train, (unsigned long long)seed, (long long)epoch, a.scale[0], a.scale[1],
                 a.ratio[0], a.ratio[1], tf.center_crop > 0 ? tf.center_crop : 0.875);
    snprintf(path, sizeof path, "%s/meta.json", out);
    if (!rc && mgt_atomic_write(path, meta, (size_t)len, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        rc = 1;
    }
    free(rows);
    free(x);
    free(xn);
    free(labels);
    free(crops);
    mgt_dataset_free(&ds);
    return rc ? 1 : 0;
}
