/* images.c: image sets as datasets, and their transforms (see images.h).
 *
 * The set stays on disk: each shard's images file is opened once and a sample is one pread at
 * its offset, so the process holds no more than a few samples per thread whatever the set's
 * size (the page cache, which the kernel gives back under pressure, holds what fits). Labels are
 * read into memory at the start (4 bytes a sample at most) and checked there.
 *
 * A batch's samples are independent items of a thread pool (pool.h); each thread reads and
 * transforms into its own scratch memory and writes only its sample's part of the batch, and
 * every random number a sample uses comes from (seed, epoch, row), so the batch is the same
 * bytes whatever the thread count. */
#include "images.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime.h"
#include "../tensor_io.h"
#include "npy.h"
#include "pool.h"
#include "resample.h"

#define CROP_PURPOSE 0x5252435250ULL /* "RRCRP": the resized crop's draws */
#define DRAWS_PER_ROW 64             /* 10 tries of 4, the flip, room to spare */
#define FLIP_DRAW 40

__extension__ typedef unsigned __int128 u128;

typedef struct scratch {
    uint8_t *stored, *out; /* one stored image, one input-sized image */
    mgt_resample_work rw;
} scratch;

struct mgt_images {
    char dir[512], split[8];
    int size;    /* stored side (square), or the stored short side's bound (whole) */
    int whole;   /* the whole layout: sizes per image, in `index` */
    int64_t *index; /* whole: per image of the set, MGT_IMAGES_INDEX_COLS values: its offset in
                     * its shard's images file, stored h, w, original h, w (24 MiB for ImageNet) */
    size_t max_bytes; /* the largest stored image's bytes */
    int64_t *split_rows; /* --val-split: the training rows, then the validation rows */
    float lut[3][256]; /* per channel: byte -> (byte / 255 - mean) / std, as torchvision does it */
    int classes; /* the set's (classes.txt) */
    int nshards;
    int *fd;         /* each shard's images file */
    int64_t *first;  /* [nshards + 1]: each shard's first image, then the set's count */
    int64_t *offset; /* where each shard's pixels start in its file */
    float byte[256]; /* b / 255, as uint8 data is scaled everywhere (synthetic.c) */
    int threads;
    pthread_mutex_t mu; /* the pool and scratch, made at the first gather */
    mgt_pool *pool;
    scratch *scr;
};

/* ---- the manifest --------------------------------------------------------------------------- */

int mgt_images_dir(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/" MGT_IMAGES_MANIFEST, dir);
    struct stat sb;
    return stat(p, &sb) == 0;
}

int mgt_images_keeps(const char *name) {
    if (!strcmp(name, MGT_IMAGES_MANIFEST) || !strcmp(name, "classes.txt"))
        return 1;
    const char *rest = !strncmp(name, "train", 5) ? name + 5 : !strncmp(name, "test", 4) ? name + 4
                                                                                       : NULL;
    if (!rest)
        return 0;
    if (!strcmp(rest, "_skipped.txt"))
        return 1;
    if (rest[0] != '-')
        return 0;
    for (int i = 1; i <= 5; i++)
        if (rest[i] < '0' || rest[i] > '9')
            return 0;
    rest += 6;
    return !strcmp(rest, "_x.npy") || !strcmp(rest, "_y.npy") || !strcmp(rest, "_i.npy") ||
           !strcmp(rest, ".json");
}

int mgt_images_index_ok(const mgt_npy *x, const mgt_npy *ix, int64_t n, int size, mgt_err *err) {
    if (!(x->kind == 'u' && x->itemsize == 1 && x->ndim == 1))
        return mgt_errf(err, "its images array is not 1-D uint8");
    if (!(ix->kind == 'i' && ix->itemsize == 8 && !ix->big_endian && ix->ndim == 2 &&
          ix->shape[0] == n && ix->shape[1] == MGT_IMAGES_INDEX_COLS))
        return mgt_errf(err, "its index is not int64 (%lld, %d)", (long long)n,
                        MGT_IMAGES_INDEX_COLS);
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t r[MGT_IMAGES_INDEX_COLS];
        memcpy(r, ix->data + sizeof r * (size_t)i, sizeof r);
        const int64_t h = r[1], w = r[2], oh = r[3], ow = r[4];
        if (r[0] != at || h < 1 || w < 1 || h > oh || w > ow || (h < w ? h : w) > size ||
            oh > (int64_t)1 << 30 || ow > (int64_t)1 << 30 || h * w > x->shape[0] / 3 ||
            at + h * w * 3 > x->shape[0])
            return mgt_errf(err, "index row %lld (offset %lld, %lld x %lld of %lld x %lld) does "
                                 "not fit its images",
                            (long long)i, (long long)r[0], (long long)h, (long long)w,
                            (long long)oh, (long long)ow);
        at += h * w * 3;
    }
    if (at != x->shape[0])
        return mgt_errf(err, "its images array holds %lld bytes, its index %lld",
                        (long long)x->shape[0], (long long)at);
    return 0;
}

static cJSON *read_manifest(const char *dir, mgt_err *err) {
    char p[600], *text = NULL;
    snprintf(p, sizeof p, "%s/" MGT_IMAGES_MANIFEST, dir);
    if (mgt_read_text_file(p, "image set manifest", 1 << 28, &text, NULL, err) < 0)
        return NULL;
    cJSON *m = cJSON_Parse(text);
    free(text);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(m, "format");
    if (!cJSON_IsString(f) ||
        (strcmp(f->valuestring, MGT_IMAGES_FORMAT) && strcmp(f->valuestring, "mgtrain images 1"))) {
        cJSON_Delete(m);
        mgt_errf(err,
                 "%s: not a manifest of mgtrain convert (format '%s'); convert the image folder "
                 "again with mgtrain convert",
                 p, MGT_IMAGES_FORMAT);
        return NULL;
    }
    return m;
}

int mgt_images_has_split(const char *dir, const char *split) {
    mgt_err e;
    cJSON *m = read_manifest(dir, &e);
    const cJSON *s =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "splits"), split);
    const int has = cJSON_IsObject(s);
    cJSON_Delete(m);
    return has;
}

/* A number of the manifest within [lo, hi], or -1 with err. */
static int manifest_int(const cJSON *obj, const char *key, double lo, double hi, const char *where,
                        int64_t *out, mgt_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        v->valuedouble != floor(v->valuedouble))
        return mgt_errf(err,
                        "%s: '%s' is missing or out of range; the manifest is damaged: convert "
                        "the image folder again",
                        where, key);
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* ---- opening ----------------------------------------------------------------------------- */

/* Room for `need` more open files (a set of many shards keeps one per shard). */
static int files_for(int need, const char *dir, mgt_err *err) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    const rlim_t want = (rlim_t)need + 256;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < want)
            return mgt_errf(err,
                            "%s: its %d shards need %d open files but this process may open "
                            "%llu; raise the limit (ulimit -n %d) or convert with a larger "
                            "--shard-size",
                            dir, need, need, (unsigned long long)rl.rlim_cur, need + 256);
    }
    return 0;
}

/* Shard k's images file (and, whole layout, its index, read into im->index): checked against the
 * manifest, kept open. */
static int open_shard(mgt_images *im, int k, const char *name, int64_t n, mgt_err *err) {
    char p[700], pi[700];
    snprintf(p, sizeof p, "%s/%s_x.npy", im->dir, name);
    mgt_npy a, ix;
    if (mgt_npy_open(&a, p, err) < 0)
        return -1;
    int ok = 0;
    mgt_err why = {{0}};
    if (!im->whole) {
        ok = a.kind == 'u' && a.itemsize == 1 && a.ndim == 4 && a.shape[0] == n &&
             a.shape[1] == im->size && a.shape[2] == im->size && a.shape[3] == 3;
        snprintf(why.msg, sizeof why.msg, "%lld images of %dx%dx3 bytes", (long long)n, im->size,
                 im->size);
        im->max_bytes = (size_t)im->size * (size_t)im->size * 3;
    } else {
        snprintf(pi, sizeof pi, "%s/%s_i.npy", im->dir, name);
        if (mgt_npy_open(&ix, pi, err) < 0) {
            mgt_npy_close(&a);
            return -1;
        }
        ok = mgt_images_index_ok(&a, &ix, n, im->size, &why) == 0;
        for (int64_t i = 0; ok && i < n; i++) {
            int64_t *r = im->index + MGT_IMAGES_INDEX_COLS * (im->first[k] + i);
            memcpy(r, ix.data + sizeof(int64_t) * MGT_IMAGES_INDEX_COLS * (size_t)i,
                   sizeof(int64_t) * MGT_IMAGES_INDEX_COLS);
            const size_t bytes = (size_t)(r[1] * r[2] * 3);
            if (bytes > im->max_bytes)
                im->max_bytes = bytes;
        }
        mgt_npy_close(&ix);
    }
    const int64_t offset = a.offset;
    mgt_npy_close(&a);
    if (!ok)
        return mgt_errf(err,
                        "%s: not the shard the manifest names (%s); the image set is damaged or "
                        "was changed: convert it again",
                        p, why.msg);
    im->fd[k] = open(p, O_RDONLY | O_CLOEXEC);
    if (im->fd[k] < 0)
        return mgt_errf(err, "%s: cannot open (%s)", p, strerror(errno));
    im->offset[k] = offset;
    return 0;
}

/* Shard k's labels, appended to ds's (bytes or int32, by the set's class count). */
static int read_labels(mgt_dataset *ds, const mgt_images *im, int k, const char *name, int64_t n,
                       int classes, mgt_err *err) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s_y.npy", im->dir, name);
    mgt_npy a;
    if (mgt_npy_open(&a, p, err) < 0)
        return -1;
    int rc = 0;
    if (!(a.kind == 'i' && a.itemsize == 4 && !a.big_endian && a.ndim == 1 && a.shape[0] == n))
        rc = mgt_errf(err,
                      "%s: not the labels the manifest names (%lld int32); the image set is "
                      "damaged or was changed: convert it again",
                      p, (long long)n);
    const int64_t at = im->first[k];
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        int32_t l;
        memcpy(&l, a.data + 4 * i, 4);
        if (l < 0 || l >= im->classes)
            rc = mgt_errf(err,
                          "%s: label %d at index %lld is not one of the set's %d classes; "
                          "the image set is damaged: convert it again",
                          p, l, (long long)i, im->classes);
        else if (l >= classes)
            rc = mgt_errf(err,
                          "%s: label %d at index %lld is not below the model's %d classes; "
                          "use a model with %d outputs (the set's classes.txt has %d)",
                          p, l, (long long)i, classes, im->classes, im->classes);
        else if (ds->labels)
            ds->labels[at + i] = (uint8_t)l;
        else
            ds->labels32[at + i] = l;
    }
    mgt_npy_close(&a);
    return rc;
}

/* A load that failed gives back what it took and leaves the dataset empty. (Not through
 * mgt_dataset_free, which hands an image set back here: a source does not call the dataset API
 * that dispatches to it.) */
static void unload(mgt_dataset *ds) {
    mgt_images_free(ds->images);
    free(ds->labels);
    free(ds->labels32);
    memset(ds, 0, sizeof *ds);
}

int mgt_dataset_load_images(mgt_dataset *ds, const char *dir, const char *split, int h, int w,
                            int c, int classes, const mgt_input_tf *tf, mgt_err *err) {
    memset(ds, 0, sizeof *ds);
    cJSON *m = read_manifest(dir, err);
    if (!m)
        return -1;
    char where[600];
    snprintf(where, sizeof where, "%s/" MGT_IMAGES_MANIFEST, dir);
    int64_t size = 0, nclasses = 0, channels = 0;
    const cJSON *sp =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "splits"), split);
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(sp, "shards");
    int rc = 0;
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(sp, "source");
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(sp, "complete")))
        rc = mgt_errf(err,
                      "%s: this image set is incomplete (the conversion of its %s split was "
                      "stopped before the end): run convert again, the same command (mgtrain "
                      "convert %s %s --size %.0f%s), which goes on from the shards it "
                      "finished",
                      dir, split, cJSON_IsString(from) ? from->valuestring : "SRC", dir,
                      cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "size")),
                      strcmp(split, "train") ? " --split test" : "");
    else if (manifest_int(m, "size", 1, 1 << 16, where, &size, err) < 0 ||
        manifest_int(m, "classes", 1, 1 << 30, where, &nclasses, err) < 0 ||
        manifest_int(m, "channels", 3, 3, where, &channels, err) < 0)
        rc = -1;
    else if (!cJSON_IsObject(sp))
        rc = mgt_errf(err,
                      "%s has no %s split; convert one into it: mgtrain convert %s_TREE %s "
                      "--split %s --size %lld%s",
                      dir, split, !strcmp(split, "test") ? "TEST" : "TRAIN", dir, split,
                      (long long)size,
                      !strcmp(split, "test") ? " (or validate on the training data with "
                                               "--val-split F)"
                                             : "");
    else if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) < 1)
        rc = mgt_errf(err, "%s: the %s split lists no shards; convert it again", where, split);
    else if (c != 3)
        rc = mgt_errf(err,
                      "%s holds RGB images (3 channels) but the model's [input] shape has %d; use "
                      "[input] shape = %d,%d,3",
                      dir, c, h, w);
    else if (nclasses > classes)
        rc = mgt_errf(err,
                      "%s holds %lld classes (classes.txt) but the model's last layer has %d "
                      "outputs; give it %lld units",
                      dir, (long long)nclasses, classes, (long long)nclasses);
    if (rc < 0) {
        cJSON_Delete(m);
        return -1;
    }
    mgt_images *im = calloc(1, sizeof *im);
    const int ns = cJSON_GetArraySize(shards);
    if (im)
        pthread_mutex_init(&im->mu, NULL);
    if (!im || !(im->fd = malloc(sizeof *im->fd * (size_t)ns)) ||
        !(im->first = calloc((size_t)ns + 1, sizeof *im->first)) ||
        !(im->offset = calloc((size_t)ns, sizeof *im->offset))) {
        mgt_images_free(im);
        cJSON_Delete(m);
        return mgt_errf(err, "out of memory for an image set of %d shards", ns);
    }
    snprintf(im->dir, sizeof im->dir, "%s", dir);
    snprintf(im->split, sizeof im->split, "%s", split);
    im->size = (int)size;
    im->classes = (int)nclasses;
    im->threads = 1;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(m, "layout");
    im->whole = cJSON_IsString(lay) && !strcmp(lay->valuestring, "whole");
    for (int b = 0; b < 256; b++)
        im->byte[b] = (float)b / 255.0f;
    /* [input] mean and std folded into one table per channel: the same float operations as
     * mgt_input_normalize, (b / 255 - mean) / std, so the same bits, done per sample on the
     * transform's threads instead of over the batch on one */
    for (int ch = 0; ch < 3; ch++)
        for (int b = 0; b < 256; b++) {
            const int v = tf->nvalues == 1 ? 0 : ch;
            im->lut[ch][b] = tf->norm ? (im->byte[b] - tf->mean[v]) / tf->std[v] : im->byte[b];
        }
    for (int k = 0; k < ns; k++)
        im->fd[k] = -1;
    im->nshards = ns;
    ds->images = im;
    ds->owned = 1;
    /* The shards' counts first: the labels go to their places. */
    int k = 0;
    for (const cJSON *s = shards->child; s && rc == 0; s = s->next, k++) {
        int64_t n = 0;
        rc = manifest_int(s, "images", 0, 1e12, where, &n, err);
        im->first[k + 1] = im->first[k] + n;
    }
    const int64_t total = rc == 0 ? im->first[ns] : 0;
    if (rc == 0 && total < 1)
        rc = mgt_errf(err, "%s: the %s split holds no images", dir, split);
    if (rc == 0 && files_for(ns, dir, err) < 0)
        rc = -1;
    if (rc == 0 && im->whole &&
        !(im->index = malloc(sizeof(int64_t) * MGT_IMAGES_INDEX_COLS * (size_t)total)))
        rc = mgt_errf(err, "out of memory for the index of %lld images", (long long)total);
    if (rc == 0) {
        if (nclasses <= 256)
            ds->labels = malloc((size_t)total);
        else
            ds->labels32 = malloc(sizeof(int32_t) * (size_t)total);
        if (!ds->labels && !ds->labels32)
            rc = mgt_errf(err, "out of memory for %lld labels", (long long)total);
    }
    k = 0;
    for (const cJSON *s = shards->child; s && rc == 0; s = s->next, k++) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "name");
        if (!cJSON_IsString(name) || strchr(name->valuestring, '/') ||
            strlen(name->valuestring) > 64) {
            rc = mgt_errf(err, "%s: shard %d has no valid name; convert the image set again", where,
                          k);
            break;
        }
        const int64_t n = im->first[k + 1] - im->first[k];
        rc = open_shard(im, k, name->valuestring, n, err);
        if (rc == 0)
            rc = read_labels(ds, im, k, name->valuestring, n, classes, err);
    }
    cJSON_Delete(m);
    if (rc < 0) {
        unload(ds);
        return -1;
    }
    ds->n = total;
    ds->h = h;
    ds->w = w;
    ds->c = 3;
    ds->classes = classes;
    ds->tf = *tf;
    snprintf(ds->source, sizeof ds->source, "%s (%s split)", dir, split);
    return 0;
}

/* The pool and the threads' scratch memory, given back (made again at the next gather). */
static void drop_threads(mgt_images *im) {
    mgt_pool_destroy(im->pool);
    im->pool = NULL;
    for (int i = 0; im->scr && i < im->threads; i++) {
        free(im->scr[i].stored);
        free(im->scr[i].out);
        mgt_resample_work_free(&im->scr[i].rw);
    }
    free(im->scr);
    im->scr = NULL;
}

void mgt_images_threads(mgt_dataset *ds, int threads) {
    mgt_images *im = ds->images;
    if (!im)
        return;
    threads = threads < 1 ? 1 : threads;
    pthread_mutex_lock(&im->mu);
    if (threads != im->threads)
        drop_threads(im);
    im->threads = threads;
    pthread_mutex_unlock(&im->mu);
}

void mgt_images_free(mgt_images *im) {
    if (!im)
        return;
    drop_threads(im);
    for (int k = 0; im->fd && k < im->nshards; k++)
        if (im->fd[k] >= 0)
            close(im->fd[k]);
    pthread_mutex_destroy(&im->mu);
    free(im->fd);
    free(im->first);
    free(im->offset);
    free(im->index);
    free(im->split_rows);
    free(im);
}

int mgt_images_side(const mgt_dataset *ds) {
    return ds->images ? ds->images->size : 0;
}

const char *mgt_images_describe(const mgt_dataset *ds, char *buf, int cap) {
    const mgt_images *im = ds->images;
    char how[64];
    if (im->whole)
        snprintf(how, sizeof how, "whole, short side at most %d", im->size);
    else
        snprintf(how, sizeof how, "at %dx%d", im->size, im->size);
    snprintf(buf, (size_t)cap, "images stored %s in %d shard%s, %lld of %d classes", how,
             im->nshards, im->nshards == 1 ? "" : "s", (long long)im->first[im->nshards],
             im->classes);
    return buf;
}

const char *mgt_images_eval_describe(const mgt_dataset *ds, float center_crop, char *buf,
                                     int cap) {
    const int side = mgt_images_eval_side(ds->h, ds->w, center_crop);
    if (ds->images->whole)
        snprintf(buf, (size_t)cap, "short side resized to %d, centre %dx%d", side, ds->h, ds->w);
    else
        snprintf(buf, (size_t)cap, "resized to %dx%d, centre %dx%d", side, side, ds->h, ds->w);
    return buf;
}

/* ---- the transforms ------------------------------------------------------------------------ */

static double uniform53(uint64_t r) {
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

/* An integer in [0, m) from a draw: the high half of r * m. */
static int below(uint64_t r, int m) {
    return (int)(((u128)r * (uint64_t)m) >> 64);
}

mgt_crop mgt_images_pick(const mgt_augment *a, int sh, int sw, uint64_t seed, int64_t epoch,
                         int64_t row) {
    const uint64_t key = mgt_key3(seed, CROP_PURPOSE, (uint64_t)epoch);
    const uint64_t base = (uint64_t)row * DRAWS_PER_ROW;
    mgt_crop c = {0, 0, sh, sw, 0};
    if (a->flip)
        c.flip = (int)(mgt_rand64(key, base + FLIP_DRAW) >> 63);
    if (!a->resized_crop)
        return c;
    /* torchvision.transforms.RandomResizedCrop.get_params, in double; Python's round() rounds
     * half to even, as nearbyint does. */
    const double area = (double)sh * (double)sw;
    const double lr0 = log(a->ratio[0]), lr1 = log(a->ratio[1]);
    for (int t = 0; t < 10; t++) {
        const uint64_t d = base + 4 * (uint64_t)t;
        const double target =
            area * (a->scale[0] + (a->scale[1] - a->scale[0]) * uniform53(mgt_rand64(key, d)));
        const double aspect = exp(lr0 + (lr1 - lr0) * uniform53(mgt_rand64(key, d + 1)));
        const int w = (int)nearbyint(sqrt(target * aspect));
        const int h = (int)nearbyint(sqrt(target / aspect));
        if (0 < w && w <= sw && 0 < h && h <= sh) {
            c.h = h;
            c.w = w;
            c.top = below(mgt_rand64(key, d + 2), sh - h + 1);
            c.left = below(mgt_rand64(key, d + 3), sw - w + 1);
            return c;
        }
    }
    /* No try fitted: the centre crop of the whole image, its ratio clamped into the range. */
    const double in_ratio = (double)sw / (double)sh;
    if (in_ratio < a->ratio[0]) {
        c.w = sw;
        c.h = (int)nearbyint(c.w / (double)a->ratio[0]);
    } else if (in_ratio > a->ratio[1]) {
        c.h = sh;
        c.w = (int)nearbyint(c.h * (double)a->ratio[1]);
    }
    c.top = (sh - c.h) / 2;
    c.left = (sw - c.w) / 2;
    return c;
}

int mgt_images_eval_side(int h, int w, float center_crop) {
    const int big = h > w ? h : w;
    const double cc = center_crop > 0 ? center_crop : 0.875;
    const int side = (int)floor((double)big / cc + 1e-9);
    return side > big ? side : big;
}

/* One gather: the batch and how it is transformed. */
typedef struct gather_job {
    const mgt_dataset *ds;
    const int64_t *rows;
    const mgt_augment *a; /* NULL: evaluation */
    uint64_t seed;
    int64_t epoch;
    float *x;
    int32_t *labels;
    int normalize; /* [input] mean and std applied (the table) */
    int failed;    /* a shard could not be read: its message is in err */
    mgt_err err;
    pthread_mutex_t *err_mu;
} gather_job;

/* The stored image `at` of the set into buf; its sides into d: stored h, w, original h, w. */
static int read_stored(const mgt_images *im, int64_t at, uint8_t *buf, int d[4], mgt_err *err) {
    int lo = 0, hi = im->nshards - 1; /* the shard whose range holds `at` */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (im->first[mid] <= at)
            lo = mid;
        else
            hi = mid - 1;
    }
    size_t bytes = (size_t)im->size * (size_t)im->size * 3;
    off_t off = (off_t)(im->offset[lo] + (at - im->first[lo]) * (int64_t)bytes);
    d[0] = d[1] = d[2] = d[3] = im->size;
    if (im->whole) {
        const int64_t *r = im->index + MGT_IMAGES_INDEX_COLS * at;
        d[0] = (int)r[1], d[1] = (int)r[2], d[2] = (int)r[3], d[3] = (int)r[4];
        bytes = (size_t)(r[1] * r[2] * 3);
        off = (off_t)(im->offset[lo] + r[0]);
    }
    size_t got = 0;
    while (got < bytes) {
        const ssize_t r = pread(im->fd[lo], buf + got, bytes - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return mgt_errf(err,
                            "%s/%s-%05d_x.npy: cannot read image %lld of the shard (%s); check "
                            "the disk and the file",
                            im->dir, im->split, lo, (long long)(at - im->first[lo]),
                            r < 0 ? strerror(errno) : "the file is shorter than its header says");
        got += (size_t)r;
    }
    return 0;
}

/* The eval transform's geometry for an input of h x w from a picture of oh x ow (the original's
 * sides): torchvision's Resize(side) (the short side to side, the long one int(side * long /
 * short)) into *rw x *rh, then CenterCrop(h, w) at (*left, *top), rounded as Python's round. */
static void eval_geometry(int side, int oh, int ow, int h, int w, int *rh, int *rw, int *top,
                          int *left) {
    if (ow <= oh)
        *rw = side, *rh = (int)((double)side * oh / ow);
    else
        *rh = side, *rw = (int)((double)side * ow / oh);
    *top = (int)nearbyint((*rh - h) / 2.0);
    *left = (int)nearbyint((*rw - w) / 2.0);
}

static void gather_fail(gather_job *g, const mgt_err *e) {
    pthread_mutex_lock(g->err_mu);
    if (!g->failed)
        g->err = *e;
    g->failed = 1;
    pthread_mutex_unlock(g->err_mu);
}

static void gather_one(void *ctx, int64_t i, int k) {
    gather_job *g = ctx;
    const mgt_dataset *ds = g->ds;
    mgt_images *im = ds->images;
    scratch *s = &im->scr[k];
    const int64_t row = g->rows[i];
    const int H = ds->h, W = ds->w;
    mgt_err e;
    int d[4];
    const int64_t at = ds->rows ? ds->rows[row] : ds->first + row;
    if (read_stored(im, at, s->stored, d, &e) < 0) {
        gather_fail(g, &e);
        return;
    }
    /* The stored picture and the original it was resized from (the same in the square layout,
     * whose crop is drawn on what is stored). */
    const int sh = d[0], sw = d[1], oh = d[2], ow = d[3];
    const mgt_augment none = {0};
    const mgt_crop c = mgt_images_pick(g->a ? g->a : &none, oh, ow, g->seed, g->epoch, row);
    int rc;
    if (g->a && g->a->resized_crop) {
        /* torchvision's crop of the original, mapped onto the stored picture (the identity where
         * nothing was resized), resized to the input: the one resize since the original is the
         * stored one's */
        const double fy = (double)sh / oh, fx = (double)sw / ow;
        const double box[4] = {c.left * fx, c.top * fy, (c.left + c.w) * fx, (c.top + c.h) * fy};
        rc = mgt_resample_box(s->stored, sw, sh, (size_t)sw * 3, 3, box, W, H, s->out, &s->rw);
    } else { /* resized so that the input is its centre, and that centre */
        const int side = mgt_images_eval_side(H, W, ds->tf.center_crop);
        int rh = side, rw = side, top, left;
        if (im->whole)
            eval_geometry(side, oh, ow, H, W, &rh, &rw, &top, &left);
        else
            top = (int)nearbyint((side - H) / 2.0), left = (int)nearbyint((side - W) / 2.0);
        rc = mgt_resample_u8(s->stored, sw, sh, (size_t)sw * 3, 3, rw, rh, left, top, W, H, s->out,
                             &s->rw);
    }
    if (rc < 0) {
        mgt_errf(&e, "out of memory resizing an image");
        gather_fail(g, &e);
        return;
    }
    /* bytes / 255, normalised (the table), flipped: into the batch, on this thread */
    float *x = g->x + (size_t)i * (size_t)H * (size_t)W * 3;
    const float(*t)[256] = g->normalize ? im->lut : NULL;
    for (int y = 0; y < H; y++) {
        const uint8_t *in = s->out + (size_t)y * (size_t)W * 3;
        float *o = x + (size_t)y * (size_t)W * 3;
        for (int px = 0; px < W; px++) {
            const uint8_t *p = in + (size_t)(c.flip ? W - 1 - px : px) * 3;
            if (t) {
                o[3 * px] = t[0][p[0]], o[3 * px + 1] = t[1][p[1]], o[3 * px + 2] = t[2][p[2]];
            } else {
                o[3 * px] = im->byte[p[0]], o[3 * px + 1] = im->byte[p[1]];
                o[3 * px + 2] = im->byte[p[2]];
            }
        }
    }
    const int64_t li = ds->rows ? at : row; /* a slice's labels are offset, a map's are not */
    g->labels[i] = ds->labels ? ds->labels[li] : ds->labels32[li];
}

int mgt_images_read(const mgt_dataset *ds, int64_t row, uint8_t *buf, int d[4], mgt_err *err) {
    return read_stored(ds->images, ds->rows ? ds->rows[row] : ds->first + row, buf, d, err);
}

size_t mgt_images_max_bytes(const mgt_dataset *ds) {
    return ds->images->max_bytes;
}

void mgt_images_dims(const mgt_dataset *ds, int64_t row, int d[4]) {
    const mgt_images *im = ds->images;
    d[0] = d[1] = d[2] = d[3] = im->size;
    if (im->whole)
        for (int j = 0; j < 4; j++)
            d[j] = (int)im->index[MGT_IMAGES_INDEX_COLS * (ds->rows ? ds->rows[row] : ds->first + row) +
                                  1 + j];
}

#define VAL_PURPOSE 0x56414C53ULL /* "VALS": which images --val-split holds out */

/* A row and the key that orders it within its class. */
typedef struct val_key {
    int32_t label;
    uint64_t key;
    int64_t row;
} val_key;

static int by_class_key(const void *pa, const void *pb) {
    const val_key *a = pa, *b = pb;
    if (a->label != b->label)
        return a->label < b->label ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return a->row < b->row ? -1 : a->row > b->row;
}

static int by_row(const void *pa, const void *pb) {
    const int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

int mgt_images_val_split(mgt_dataset *ds, double fraction, uint64_t seed, mgt_dataset *val,
                         mgt_err *err) {
    mgt_images *im = ds->images;
    const int64_t n = ds->n;
    if (!im || ds->rows || ds->first != 0)
        return mgt_errf(err, "--val-split applies to a whole image set");
    val_key *k = malloc(sizeof *k * (size_t)n);
    int64_t *map = malloc(sizeof *map * (size_t)n);
    if (!k || !map) {
        free(k);
        free(map);
        return mgt_errf(err, "out of memory splitting %lld images", (long long)n);
    }
    for (int64_t r = 0; r < n; r++) {
        const int32_t l = ds->labels ? ds->labels[r] : ds->labels32[r];
        k[r] = (val_key){l, mgt_rand64(mgt_key3(seed, VAL_PURPOSE, (uint64_t)l), (uint64_t)r), r};
    }
    /* Per class, its images in the seed's order; the first int(fraction * count) of them are
     * held out (Keras' flow_from_directory holds out int(split * count) of each class). */
    qsort(k, (size_t)n, sizeof *k, by_class_key);
    int64_t nv = 0, nt = 0;
    for (int64_t lo = 0, hi; lo < n; lo = hi) {
        for (hi = lo; hi < n && k[hi].label == k[lo].label; hi++)
            ;
        const int64_t hold = (int64_t)(fraction * (double)(hi - lo));
        for (int64_t i = lo; i < hi; i++)
            k[i].label = i - lo < hold ? -1 : 0; /* -1: validation */
        nv += hold;
    }
    /* The training rows first, then the validation rows, each in the set's order. */
    for (int64_t i = 0; i < n; i++)
        if (k[i].label == 0)
            map[nt++] = k[i].row;
    for (int64_t i = 0, j = nt; i < n; i++)
        if (k[i].label < 0)
            map[j++] = k[i].row;
    free(k);
    if (nv < 1 || nt < 1) {
        free(map);
        return mgt_errf(err,
                        "--val-split %g holds out %lld of the %lld images (int(%g x the images of "
                        "each class)); use a fraction that leaves images on both sides",
                        fraction, (long long)nv, (long long)n, fraction);
    }
    qsort(map, (size_t)nt, sizeof *map, by_row);
    qsort(map + nt, (size_t)nv, sizeof *map, by_row);
    free(im->split_rows);
    im->split_rows = map;
    *val = *ds;
    val->owned = 0;
    val->rows = map + nt;
    val->n = nv;
    ds->rows = map;
    ds->n = nt;
    return 0;
}

/* The pool and each thread's scratch memory, once. */
static int prepare(const mgt_dataset *ds, mgt_err *err) {
    mgt_images *im = ds->images;
    pthread_mutex_lock(&im->mu);
    int rc = 0;
    if (!im->scr) {
        im->pool = mgt_pool_create(im->threads);
        const int n = mgt_pool_size(im->pool);
        im->scr = calloc((size_t)im->threads, sizeof *im->scr);
        for (int i = 0; im->scr && i < n; i++) {
            im->scr[i].stored = malloc(im->max_bytes);
            im->scr[i].out = malloc((size_t)ds->h * (size_t)ds->w * 3);
            if (!im->scr[i].stored || !im->scr[i].out)
                rc = -1;
        }
        if (!im->pool || !im->scr || rc < 0)
            rc = mgt_errf(err, "out of memory for the image transforms' %d threads", im->threads);
    }
    pthread_mutex_unlock(&im->mu);
    return rc;
}

void mgt_images_gather(const mgt_dataset *ds, const int64_t *rows, int n, const mgt_augment *a,
                       uint64_t seed, int64_t epoch, int normalize, float *x, int32_t *labels) {
    mgt_err e;
    if (prepare(ds, &e) < 0)
        mgt_die("%s", e.msg);
    pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
    gather_job g = {.ds = ds,
                    .rows = rows,
                    .a = a,
                    .seed = seed,
                    .epoch = epoch,
                    .x = x,
                    .labels = labels,
                    .normalize = normalize && ds->tf.norm,
                    .err_mu = &err_mu};
    mgt_pool_run(ds->images->pool, n, gather_one, &g);
    if (g.failed)
        mgt_die("%s", g.err.msg);
}
