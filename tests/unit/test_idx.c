/* test_idx.c: the dataset sources (src/data/idx.c, src/data/synthetic.c).
 *
 * IDX: small files written with mgt_idx_write (plain and .gz) into a temporary folder are read
 * back exactly; every kind of bad input (bad magic, truncated header or data, a gzip stream cut
 * short, trailing bytes, image/label count mismatch, a label >= classes, the wrong image shape, a
 * missing folder or file, a header declaring far more than the file holds, a pipe or a device
 * named as a data file) fails with a message carrying the words a user needs; a 20 MB gzip set
 * reads back exactly. Synthetic data:
 * deterministic, in range, labels spread over the classes and learnable across splits (a
 * nearest-class-mean classifier fitted on the train split works on the test split), batch and
 * single-sample gathers agree for shapes spanning several internal blocks. Views (slices) share
 * memory and index correctly. If Fashion-MNIST is installed, both splits load with the expected
 * counts and class balance, and the training set loads fast. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/dataset.h"
#include "data/synthetic_def.h"

/* Speeds are printed, never asserted: a loaded machine must not fail the suite. */

#include "tally.h"


/* Writes raw bytes (gzip-compressed when the name ends in .gz), for files mgt_idx_write would
 * never produce. */
static int write_raw(const char *path, const void *data, size_t len) {
    size_t l = strlen(path);
    if (l > 3 && strcmp(path + l - 3, ".gz") == 0) {
        gzFile f = gzopen(path, "wb");
        if (!f)
            return -1;
        int ok = len == 0 || gzwrite(f, data, (unsigned)len) == (int)len;
        return gzclose(f) == Z_OK && ok ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* An IDX header + data in memory: magic, dims, then `len` payload bytes. */
static size_t make_idx(uint8_t *out, uint32_t magic, int ndims, const uint32_t *dims,
                       const uint8_t *payload, size_t len) {
    size_t o = 0;
    for (int b = 3; b >= 0; b--)
        out[o++] = (uint8_t)(magic >> (8 * b));
    for (int d = 0; d < ndims; d++)
        for (int b = 3; b >= 0; b--)
            out[o++] = (uint8_t)(dims[d] >> (8 * b));
    memcpy(out + o, payload, len);
    return o + len;
}

static void join(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

static void make_dir(char *out, size_t cap, const char *root, const char *name) {
    join(out, cap, root, name);
    mkdir(out, 0755);
}

enum { N = 5, H = 4, W = 3, E = H * W };

/* A data folder holding a train split of the small test set, plain or gzip. */
static int write_split(const char *dir, const char *prefix, const uint8_t *px, const uint8_t *lb,
                       int gz, mgt_err *err) {
    char p[1100];
    const int32_t idims[3] = {N, H, W}, ldims[1] = {N};
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte%s", dir, prefix, gz ? ".gz" : "");
    if (mgt_idx_write(p, px, 3, idims, err))
        return -1;
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte%s", dir, prefix, gz ? ".gz" : "");
    return mgt_idx_write(p, lb, 1, ldims, err);
}

static void test_idx_files(tally *t, const char *root) {
    uint8_t px[N * E], lb[N] = {3, 0, 9, 1, 7};
    for (int i = 0; i < N * E; i++)
        px[i] = (uint8_t)(i * 37 + 11);
    mgt_err err = {{0}};
    mgt_dataset ds;
    char dir[512], p[1100];

    /* Round trips, plain and gzip. */
    for (int gz = 0; gz < 2; gz++) {
        make_dir(dir, sizeof dir, root, gz ? "gz" : "plain");
        CHECK(t, write_split(dir, "train", px, lb, gz, &err) == 0);
        int rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
        CHECK(t, rc == 0);
        if (rc) {
            fprintf(stderr, "  %s\n", err.msg);
            continue;
        }
        CHECK(t, ds.n == N && ds.h == H && ds.w == W && ds.c == 1 && ds.classes == 10);
        CHECK(t, memcmp(ds.pixels, px, sizeof px) == 0);
        CHECK(t, memcmp(ds.labels, lb, sizeof lb) == 0);
        CHECK(t, strstr(ds.source, dir) != NULL &&
                     strstr(ds.source, gz ? "idx3-ubyte.gz" : "idx3-ubyte") != NULL);
        CHECK(t, ds.owned == 1);

        /* Gather: NHWC floats = bytes / 255, labels as int32, any order. */
        int64_t idx[3] = {4, 0, 2};
        float x[3 * E];
        int32_t y[3];
        mgt_dataset_gather(&ds, idx, 3, x, y);
        int same = 1;
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < E; j++)
                same &= x[k * E + j] == (float)px[idx[k] * E + j] / 255.0f;
        CHECK(t, same);
        CHECK(t, y[0] == 7 && y[1] == 3 && y[2] == 9);

        /* A slice is a view: same bytes, offset indices; freeing it frees nothing. */
        mgt_dataset v = mgt_dataset_slice(&ds, 2, 2);
        CHECK(t, v.n == 2 && v.pixels == ds.pixels + 2 * E && v.labels == ds.labels + 2);
        int64_t i0 = 1;
        mgt_dataset_gather(&v, &i0, 1, x, y);
        CHECK(t, y[0] == lb[3] && x[5] == (float)px[3 * E + 5] / 255.0f);
        mgt_dataset v2 = mgt_dataset_slice(&v, 1, 100); /* clamped to the parent */
        CHECK(t, v2.n == 1 && v2.labels == ds.labels + 3);
        mgt_dataset_free(&v);
        mgt_dataset_free(&v2);
        CHECK(t, ds.pixels[0] == px[0]); /* still alive (ASan would flag a use after free) */
        mgt_dataset_free(&ds);
        CHECK(t, ds.pixels == NULL && ds.labels == NULL);
    }

    /* h == 0 takes the file's shape; classes <= 0 takes max label + 1. */
    join(dir, sizeof dir, root, "plain");
    CHECK(t, mgt_dataset_load_idx(&ds, dir, "train", 0, 0, 0, &err) == 0);
    CHECK(t, ds.h == H && ds.w == W && ds.classes == 10);
    mgt_dataset_free(&ds);

    /* Plain is preferred when both exist: give the .gz different labels. */
    make_dir(dir, sizeof dir, root, "both");
    uint8_t lb2[N] = {1, 1, 1, 1, 1};
    CHECK(t, write_split(dir, "t10k", px, lb, 0, &err) == 0);
    CHECK(t, write_split(dir, "t10k", px, lb2, 1, &err) == 0);
    CHECK(t, mgt_dataset_load_idx(&ds, dir, "t10k", H, W, 10, &err) == 0);
    CHECK(t, ds.labels && ds.labels[0] == 3 && strstr(ds.source, ".gz") == NULL);
    mgt_dataset_free(&ds);

    /* ---- bad inputs: each fails with -1, a message with the key words, and an empty ds. */
    const uint32_t idims[3] = {N, H, W}, ldims[1] = {N};
    uint8_t buf[4096];
    size_t len;
    int rc;

    /* Bad magic, images and labels. */
    make_dir(dir, sizeof dir, root, "magic");
    CHECK(t, write_split(dir, "train", px, lb, 0, &err) == 0);
    join(p, sizeof p, dir, "train-images-idx3-ubyte");
    len = make_idx(buf, 0, 3, idims, px, sizeof px);
    CHECK(t, write_raw(p, buf, len) == 0);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "bad magic 0x00000000", "expected 0x00000803", "image");
    CHECK(t, ds.pixels == NULL && ds.n == 0);
    len = make_idx(buf, 0x803, 3, idims, px, sizeof px);
    CHECK(t, write_raw(p, buf, len) == 0);
    join(p, sizeof p, dir, "train-labels-idx1-ubyte");
    len = make_idx(buf, 0x803, 1, ldims, lb, sizeof lb);
    CHECK(t, write_raw(p, buf, len) == 0);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "bad magic 0x00000803", "expected 0x00000801", "label");

    /* Truncated data, plain: the sizes are in the message. */
    make_dir(dir, sizeof dir, root, "trunc");
    CHECK(t, write_split(dir, "train", px, lb, 0, &err) == 0);
    join(p, sizeof p, dir, "train-images-idx3-ubyte");
    CHECK(t, truncate(p, 16 + 2 * E) == 0);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "truncated", "header says 5 images of 4x3 (76 bytes)",
              "holds 40 bytes", "re-download");
    /* ... in the header itself, and an empty file. */
    CHECK(t, truncate(p, 10) == 0);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "truncated", "header");
    CHECK(t, truncate(p, 0) == 0);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "truncated");
    /* ... labels. */
    CHECK(t, write_split(dir, "train", px, lb, 0, &err) == 0);
    join(p, sizeof p, dir, "train-labels-idx1-ubyte");
    CHECK(t, truncate(p, 8 + 3) == 0);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "truncated", "5 labels");

    /* Truncated, gzip: a complete stream with too little data, then a stream cut short. */
    make_dir(dir, sizeof dir, root, "truncgz");
    CHECK(t, write_split(dir, "train", px, lb, 1, &err) == 0);
    join(p, sizeof p, dir, "train-images-idx3-ubyte.gz");
    len = make_idx(buf, 0x803, 3, idims, px, 3 * E);
    CHECK(t, write_raw(p, buf, len) == 0);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "truncated", "holds 52 bytes once decompressed");
    {
        /* Incompressible data so that cutting the compressed file loses data bytes. */
        enum { BN = 50, BH = 20, BW = 20 };
        static uint8_t big[BN * BH * BW];
        for (size_t i = 0; i < sizeof big; i++)
            big[i] = (uint8_t)(mgt_rand64(99, i) >> 56);
        const int32_t bd[3] = {BN, BH, BW};
        CHECK(t, mgt_idx_write(p, big, 3, bd, &err) == 0);
        struct stat sb;
        CHECK(t, stat(p, &sb) == 0 && sb.st_size > 10000);
        CHECK(t, truncate(p, sb.st_size / 2) == 0);
        rc = mgt_dataset_load_idx(&ds, dir, "train", 0, 0, 10, &err);
        CHECK_ERR(t, rc, &err, p, "truncated", "re-download");
        /* Corrupt deflate data: flip bytes in the middle of the stream. */
        CHECK(t, mgt_idx_write(p, big, 3, bd, &err) == 0);
        FILE *f = fopen(p, "r+b");
        CHECK(t, f != NULL);
        if (f) {
            uint8_t junk[64];
            memset(junk, 0xA5, sizeof junk);
            fseek(f, 200, SEEK_SET);
            fwrite(junk, 1, sizeof junk, f);
            fclose(f);
        }
        rc = mgt_dataset_load_idx(&ds, dir, "train", 0, 0, 10, &err);
        CHECK_ERR(t, rc, &err, p, "gzip");
        CHECK(t, ds.pixels == NULL);
    }

    /* Trailing bytes: plain (appended) and gzip (more data than the header declares). */
    make_dir(dir, sizeof dir, root, "extra");
    CHECK(t, write_split(dir, "train", px, lb, 0, &err) == 0);
    join(p, sizeof p, dir, "train-images-idx3-ubyte");
    {
        FILE *f = fopen(p, "ab");
        CHECK(t, f && fwrite("garbage", 1, 7, f) == 7);
        if (f)
            fclose(f);
    }
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "7 trailing bytes", "holds 83 bytes", "expected 76");
    make_dir(dir, sizeof dir, root, "extragz");
    CHECK(t, write_split(dir, "train", px, lb, 1, &err) == 0);
    join(p, sizeof p, dir, "train-labels-idx1-ubyte.gz");
    {
        const uint32_t four[1] = {4};
        len = make_idx(buf, 0x801, 1, four, lb, sizeof lb);
    }
    CHECK(t, write_raw(p, buf, len) == 0);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "1 trailing bytes", "4 labels");

    /* Image and label counts differ. */
    make_dir(dir, sizeof dir, root, "count");
    CHECK(t, write_split(dir, "train", px, lb, 0, &err) == 0);
    join(p, sizeof p, dir, "train-labels-idx1-ubyte");
    {
        const int32_t four[1] = {4};
        CHECK(t, mgt_idx_write(p, lb, 1, four, &err) == 0);
    }
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, "5 images but", p, "4 labels");

    /* A label outside the model's classes. */
    make_dir(dir, sizeof dir, root, "label");
    uint8_t lb3[N] = {0, 1, 2, 12, 4};
    CHECK(t, write_split(dir, "train", px, lb3, 0, &err) == 0);
    join(p, sizeof p, dir, "train-labels-idx1-ubyte");
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, p, "label 12 at index 3 is not below the model's 10 classes");
    CHECK(t, mgt_dataset_load_idx(&ds, dir, "train", H, W, 13, &err) == 0);
    mgt_dataset_free(&ds);

    /* The wrong image shape for the model. */
    join(dir, sizeof dir, root, "plain");
    rc = mgt_dataset_load_idx(&ds, dir, "train", 28, 28, 10, &err);
    CHECK_ERR(t, rc, &err, "train-images-idx3-ubyte", "images are 4x3",
              "the model's [input] shape is 28x28");

    /* Missing folder, missing images, missing labels. */
    join(dir, sizeof dir, root, "nonexistent");
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, "no train-images-idx3-ubyte[.gz] in", dir, "--data synthetic");
    join(dir, sizeof dir, root, "plain");
    rc = mgt_dataset_load_idx(&ds, dir, "t10k", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, "no t10k-images-idx3-ubyte[.gz] in", dir, "--data");
    make_dir(dir, sizeof dir, root, "nolabels");
    join(p, sizeof p, dir, "train-images-idx3-ubyte");
    {
        const int32_t d3[3] = {N, H, W};
        CHECK(t, mgt_idx_write(p, px, 3, d3, &err) == 0);
    }
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    CHECK_ERR(t, rc, &err, "no train-labels-idx1-ubyte[.gz] in", dir);

    /* Headers are not trusted for memory: 1000 images of 10000x10000 (100 GB) declared by a
     * 16-byte file are reported as truncated, plain or gzip, and nothing that large is asked
     * for (a plain file's size is checked first, a gzip stream's buffer is bounded by what its
     * compressed size can expand to). */
    for (int gz = 0; gz < 2; gz++) {
        make_dir(dir, sizeof dir, root, gz ? "hugegz" : "huge");
        CHECK(t, write_split(dir, "train", px, lb, gz, &err) == 0);
        snprintf(p, sizeof p, "%s/train-images-idx3-ubyte%s", dir, gz ? ".gz" : "");
        len = make_idx(buf, 0x803, 3, (const uint32_t[]){1000, 10000, 10000}, px, 0);
        CHECK(t, write_raw(p, buf, len) == 0);
        rc = mgt_dataset_load_idx(&ds, dir, "train", 0, 0, 10, &err);
        CHECK_ERR(t, rc, &err, p, "truncated", "1000 images of 10000x10000 (100000000016 bytes)",
                  "holds 16 bytes");
    }

    /* A pipe or a device named as a data file is refused at once, never read (a pipe without a
     * writer would block forever: the alarm turns that into a failure). */
    make_dir(dir, sizeof dir, root, "fifo");
    CHECK(t, write_split(dir, "train", px, lb, 0, &err) == 0);
    join(p, sizeof p, dir, "train-images-idx3-ubyte");
    CHECK(t, unlink(p) == 0 && mkfifo(p, 0600) == 0);
    alarm(20);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    alarm(0);
    CHECK_ERR(t, rc, &err, p, "not a regular file");
    join(p, sizeof p, dir, "train-labels-idx1-ubyte");
    CHECK(t, unlink(p) == 0 && symlink("/dev/zero", p) == 0);
    join(p, sizeof p, dir, "train-images-idx3-ubyte");
    CHECK(t, unlink(p) == 0 && mgt_idx_write(p, px, 3, (const int32_t[]){N, H, W}, &err) == 0);
    alarm(20);
    rc = mgt_dataset_load_idx(&ds, dir, "train", H, W, 10, &err);
    alarm(0);
    CHECK_ERR(t, rc, &err, "train-labels-idx1-ubyte", "not a regular file");

    /* The writer reports an impossible path. */
    join(p, sizeof p, root, "nonexistent/x-idx1-ubyte.gz");
    CHECK_ERR(t, mgt_idx_write(p, lb, 1, (const int32_t[]){N}, &err), &err, p, "cannot create");
    join(p, sizeof p, root, "nonexistent/x-idx1-ubyte");
    CHECK_ERR(t, mgt_idx_write(p, lb, 1, (const int32_t[]){N}, &err), &err, p, "cannot create");
}

/* A gzip training set of 20 MB that compresses 2000-fold (all zeros, past deflate's usual
 * ratio) and one that hardly compresses both read back exactly. */
static void test_idx_large_gz(tally *t, const char *root) {
    enum { LN = 5000, LH = 64, LW = 64 };
    const size_t bytes = (size_t)LN * LH * LW;
    uint8_t *px = malloc(bytes), lb[LN];
    if (!px) {
        CHECK(t, !"out of memory");
        return;
    }
    for (int i = 0; i < LN; i++)
        lb[i] = (uint8_t)(i % 10);
    for (int zeros = 1; zeros >= 0; zeros--) {
        for (size_t i = 0; i < bytes; i++)
            px[i] = zeros ? 0 : (uint8_t)(i * 2654435761u >> 24);
        char dir[512], p[1100];
        mgt_err err = {{0}};
        make_dir(dir, sizeof dir, root, zeros ? "zerosgz" : "largegz");
        snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
        CHECK(t, mgt_idx_write(p, px, 3, (const int32_t[]){LN, LH, LW}, &err) == 0);
        snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", dir);
        CHECK(t, mgt_idx_write(p, lb, 1, (const int32_t[]){LN}, &err) == 0);
        mgt_dataset ds;
        int rc = mgt_dataset_load_idx(&ds, dir, "train", LH, LW, 10, &err);
        CHECK(t, rc == 0);
        if (rc == 0) {
            CHECK(t, ds.n == LN && memcmp(ds.pixels, px, bytes) == 0 &&
                         memcmp(ds.labels, lb, LN) == 0);
            mgt_dataset_free(&ds);
        } else {
            fprintf(stderr, "  %s\n", err.msg);
        }
    }
    free(px);
}

/* Gathers the whole dataset into x/y in batches. */
static void gather_all(const mgt_dataset *ds, float *x, int32_t *y) {
    const int64_t elems = (int64_t)ds->h * ds->w * ds->c;
    int64_t idx[256];
    for (int64_t i0 = 0; i0 < ds->n; i0 += 256) {
        int cnt = ds->n - i0 < 256 ? (int)(ds->n - i0) : 256;
        for (int k = 0; k < cnt; k++)
            idx[k] = i0 + k;
        mgt_dataset_gather(ds, idx, cnt, x + i0 * elems, y + i0);
    }
}

/* The gather writes what synthetic_def.h defines, value by value: for a sample of 30x30x3 (337
 * whole draws, several blocks of the batched path, and a last partial draw of 4 values). */
static void test_synthetic_definition(tally *t) {
    enum { H = 30, W = 30, C = 3, E = H * W * C, N = 3 };
    mgt_dataset ds;
    mgt_dataset_synthetic(&ds, 100, H, W, C, 7, 5, 1);
    const int64_t idx[N] = {99, 0, 41};
    static float x[N * E];
    int32_t y[N];
    mgt_dataset_gather(&ds, idx, N, x, y);
    uint64_t pkey, tkey;
    mgt_dataset_synthetic_keys(&ds, &pkey, &tkey);
    const uint64_t words = (E + 7) / 8;
    int same = 1;
    for (int s = 0; s < N; s++) {
        const int32_t label = mgt_syn_label(mgt_syn_label_key(pkey), (uint64_t)idx[s], 7);
        same &= y[s] == label;
        for (int j = 0; j < E; j++) {
            const uint64_t w = (uint64_t)j / 8;
            const float v = mgt_syn_value(mgt_rand64(tkey, (uint64_t)label * words + w),
                                          mgt_rand64(pkey, (uint64_t)idx[s] * words + w), j % 8);
            same &= memcmp(&v, &x[s * E + j], sizeof v) == 0;
        }
    }
    CHECK(t, same);
}

static void test_synthetic(tally *t) {
    enum { SN = 4000, SE = 784, SC = 10 };
    mgt_dataset tr, te;
    mgt_dataset_synthetic(&tr, SN, 28, 28, 1, SC, 42, 1);
    mgt_dataset_synthetic(&te, SN, 28, 28, 1, SC, 42, 2);
    CHECK(t, tr.n == SN && tr.h == 28 && tr.w == 28 && tr.c == 1 && tr.classes == SC);
    CHECK(t, tr.pixels == NULL && tr.labels == NULL && strcmp(tr.source, "synthetic") == 0);
    float *x = malloc((size_t)SN * SE * sizeof *x), *xt = malloc((size_t)SN * SE * sizeof *xt);
    int32_t *y = malloc(SN * sizeof *y), *yt = malloc(SN * sizeof *yt);
    if (!x || !xt || !y || !yt) {
        CHECK(t, !"out of memory");
        goto out;
    }
    gather_all(&tr, x, y);
    gather_all(&te, xt, yt);

    /* Range, mean, and the pixels are not constant. */
    double sum = 0;
    int inrange = 1;
    for (int64_t i = 0; i < (int64_t)SN * SE; i++) {
        inrange &= x[i] > 0.0f && x[i] < 1.0f;
        sum += x[i];
    }
    CHECK(t, inrange);
    CHECK(t, sum / ((double)SN * SE) > 0.49 && sum / ((double)SN * SE) < 0.51);
    CHECK(t, x[0] != x[1] || x[1] != x[2]);
    CHECK(t, memcmp(x, xt, SE * sizeof *x) != 0); /* the splits differ */

    /* Labels: in range, all classes present, roughly balanced. */
    int cnt[SC] = {0}, labok = 1;
    for (int i = 0; i < SN; i++) {
        labok &= y[i] >= 0 && y[i] < SC;
        if (labok)
            cnt[y[i]]++;
    }
    CHECK(t, labok);
    int minc = SN, maxc = 0;
    for (int c = 0; c < SC; c++) {
        minc = cnt[c] < minc ? cnt[c] : minc;
        maxc = cnt[c] > maxc ? cnt[c] : maxc;
    }
    printf("synthetic labels: %d..%d samples per class (of %d)\n", minc, maxc, SN / SC);
    CHECK(t, minc > SN / SC / 3 && maxc < 3 * SN / SC);

    /* Deterministic, and independent of batch composition and order. */
    {
        int64_t idx[5] = {3999, 17, 0, 17, 2500};
        float xb[5 * SE];
        int32_t yb[5];
        mgt_dataset_gather(&tr, idx, 5, xb, yb);
        int same = 1;
        for (int k = 0; k < 5; k++)
            same &= yb[k] == y[idx[k]] && memcmp(xb + k * SE, x + idx[k] * SE, SE * sizeof *x) == 0;
        CHECK(t, same);
        mgt_dataset again;
        mgt_dataset_synthetic(&again, SN, 28, 28, 1, SC, 42, 1);
        mgt_dataset_gather(&again, idx, 5, xb, yb);
        CHECK(t, yb[0] == y[3999] && memcmp(xb, x + 3999 * SE, SE * sizeof *x) == 0);
    }

    /* Learnable, with the class structure shared by the splits: class means of the train split
     * (centred at 0.5) classify the test split far above chance (0.1). */
    {
        double *mean = calloc((size_t)SC * SE, sizeof *mean);
        if (!mean) {
            CHECK(t, !"out of memory");
            goto out;
        }
        for (int i = 0; i < SN; i++)
            for (int j = 0; j < SE; j++)
                mean[y[i] * SE + j] += x[(int64_t)i * SE + j] - 0.5;
        int correct = 0;
        for (int i = 0; i < SN; i++) {
            int best = 0;
            double bv = -1e300;
            for (int c = 0; c < SC; c++) {
                double d = 0, nn = 0;
                for (int j = 0; j < SE; j++) {
                    d += mean[c * SE + j] * (xt[(int64_t)i * SE + j] - 0.5);
                    nn += mean[c * SE + j] * mean[c * SE + j];
                }
                d /= nn > 0 ? sqrt(nn) : 1;
                if (d > bv) {
                    bv = d;
                    best = c;
                }
            }
            correct += best == yt[i];
        }
        free(mean);
        printf("synthetic: nearest class mean (train split) classifies %.1f%% of the test split\n",
               100.0 * correct / SN);
        CHECK(t, correct > 3 * SN / SC); /* 3x chance: a linear model can do far better */
    }

    /* Gather speed: 256 samples of 784; the best of 5 rounds, to ignore a busy machine. */
    {
        int64_t idx[256];
        for (int k = 0; k < 256; k++)
            idx[k] = (k * 7919) % SN;
        double ms = 1e9;
        for (int round = 0; round < 5; round++) {
            const int reps = 40;
            double t0 = mgt_now();
            for (int r = 0; r < reps; r++)
                mgt_dataset_gather(&tr, idx, 256, x, y);
            double m = (mgt_now() - t0) / reps * 1e3;
            ms = m < ms ? m : ms;
        }
        printf("synthetic gather of 256 x 784: %.3f ms\n", ms);
    }

    /* Odd sizes: partial last draws, many classes; a batch gives what single samples do. */
    {
        static const int shapes[][5] = {/* h, w, c, classes, count */
                                        {5, 5, 3, 17, 40},
                                        {32, 32, 3, 20, 70},
                                        {1, 1, 1, 2, 33},
                                        {3, 7, 1, 1, 5}};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int h = shapes[s][0], w = shapes[s][1], c = shapes[s][2], k = shapes[s][3],
                      cntn = shapes[s][4], e = h * w * c;
            mgt_dataset d;
            mgt_dataset_synthetic(&d, 1000, h, w, c, k, 7, 3);
            int64_t idx[70];
            for (int i = 0; i < cntn; i++)
                idx[i] = (i * 13) % 1000;
            mgt_dataset_gather(&d, idx, cntn, x, y);
            int same = 1, inr = 1, maxl = 0;
            for (int i = 0; i < cntn; i++) {
                mgt_dataset_gather(&d, &idx[i], 1, xt, yt);
                same &= yt[0] == y[i] && memcmp(xt, x + (int64_t)i * e, e * sizeof *x) == 0;
                inr &= y[i] >= 0 && y[i] < k;
                maxl = y[i] > maxl ? y[i] : maxl;
            }
            CHECK(t, same);
            CHECK(t, inr);
            if (cntn >= 3 * k) /* the labels spread over the classes */
                CHECK(t, maxl >= k / 2);
            /* the class templates made once give the same bytes (the loader's gather) */
            const size_t nt = mgt_synthetic_templates_count(&d);
            uint64_t *tpl = malloc(sizeof *tpl * (nt ? nt : 1));
            CHECK(t, tpl && nt == (size_t)k * (size_t)((e + 7) / 8));
            if (tpl && nt) {
                mgt_synthetic_templates(&d, tpl);
                mgt_dataset_gather_with(&d, tpl, idx, cntn, xt, yt);
                CHECK(t, memcmp(xt, x, (size_t)cntn * e * sizeof *x) == 0 &&
                             memcmp(yt, y, (size_t)cntn * sizeof *y) == 0);
            }
            free(tpl);
        }
    }

    /* No table where the templates would take more than MGT_SYN_TEMPLATES_MAX bytes (made as
     * gathered), nor for a set with samples in memory. */
    {
        mgt_dataset big, small;
        mgt_dataset_synthetic(&big, 10, 224, 224, 3, 1000, 7, 3);
        mgt_dataset_synthetic(&small, 10, 28, 28, 1, 10, 7, 3);
        CHECK(t, mgt_synthetic_templates_count(&big) == 0);
        CHECK(t, mgt_synthetic_templates_count(&small) == 980);
        uint8_t px[784] = {0};
        small.pixels = px;
        CHECK(t, mgt_synthetic_templates_count(&small) == 0);
    }

    /* Slices of synthetic data: sample i of the view is sample first + i. */
    {
        mgt_dataset v = mgt_dataset_slice(&tr, 1000, 500);
        CHECK(t, v.n == 500 && v.first == 1000);
        mgt_dataset v2 = mgt_dataset_slice(&v, 10, 1000); /* clamped */
        CHECK(t, v2.n == 490 && v2.first == 1010);
        int64_t i = 5;
        float xv[SE];
        int32_t yv;
        mgt_dataset_gather(&v2, &i, 1, xv, &yv);
        gather_all(&tr, x, y);
        CHECK(t, yv == y[1015] && memcmp(xv, x + 1015 * SE, sizeof xv) == 0);
        mgt_dataset_free(&v2);
        mgt_dataset_free(&v);
    }
    mgt_dataset_free(&tr);
    mgt_dataset_free(&te);
out:
    free(x);
    free(xt);
    free(y);
    free(yt);
}

static void test_fashion_mnist(tally *t) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        printf("fashion-mnist: %s not installed, skipped\n", dir);
        return;
    }
    mgt_err err = {{0}};
    mgt_dataset tr, te;
    double t0 = mgt_now();
    int rc = mgt_dataset_load_idx(&tr, dir, "train", 28, 28, 10, &err);
    double dt = mgt_now() - t0;
    CHECK(t, rc == 0);
    if (rc) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    /* About 0.25 s here, all of it zlib's inflate (zcat takes as long). */
    printf("fashion-mnist: loaded 60000 training images in %.3f s\n", dt);
    CHECK(t, mgt_dataset_load_idx(&te, dir, "t10k", 28, 28, 10, &err) == 0);
    CHECK(t, tr.n == 60000 && te.n == 10000 && tr.h == 28 && tr.w == 28 && tr.c == 1);
    int ctr[10] = {0}, cte[10] = {0}, ok = 1;
    for (int64_t i = 0; i < tr.n; i++) {
        ok &= tr.labels[i] < 10;
        ctr[tr.labels[i] % 10]++;
    }
    for (int64_t i = 0; i < te.n; i++) {
        ok &= te.labels[i] < 10;
        cte[te.labels[i] % 10]++;
    }
    CHECK(t, ok);
    int balanced = 1;
    for (int c = 0; c < 10; c++)
        balanced &= ctr[c] == 6000 && cte[c] == 1000;
    CHECK(t, balanced);
    /* A sanity look at the pixels: mostly dark background, some bright. */
    int64_t zeros = 0;
    int maxp = 0;
    for (int64_t i = 0; i < tr.n * 784; i++) {
        zeros += tr.pixels[i] == 0;
        maxp = tr.pixels[i] > maxp ? tr.pixels[i] : maxp;
    }
    CHECK(t, zeros > tr.n * 784 / 5 && maxp == 255);
    /* The model's 10 classes are enough; 9 are not. */
    mgt_dataset bad;
    rc = mgt_dataset_load_idx(&bad, dir, "t10k", 28, 28, 9, &err);
    CHECK_ERR(t, rc, &err, "t10k-labels-idx1-ubyte.gz: label 9 at index", "9 classes");
    mgt_dataset_free(&tr);
    mgt_dataset_free(&te);
}

int main(void) {
    tally T = {0, 0}, *t = &T;
    char root[] = "/tmp/mgt_test_idx_XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_idx_files(t, root);
    test_idx_large_gz(t, root);
    test_synthetic(t);
    test_synthetic_definition(t);
    test_fashion_mnist(t);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", root);

    printf("test_idx: %d checks passed", T.pass);
    if (T.fail)
        printf(", %d FAILED", T.fail);
    printf("\n");
    return T.fail ? 1 : 0;
}
