/* test_npy.c: the .npy reader and .npy datasets (src/data/npy.c, src/data/load.c, the gather of
 * src/data/synthetic.c).
 *
 * Files are written byte by byte here (no numpy: the end-to-end test in tests/cli/npy.sh reads
 * numpy's own files), so headers NumPy would never write can be made too. Checked:
 *  - uint8 and float32 images, (N, H, W, C) and (N, H, W), read back exactly through the gather
 *    (bytes / 255; float32 bit for bit, big-endian and unaligned data included), memory-mapped;
 *  - format versions 1.0, 2.0 and 3.0, and the header spellings NumPy's reader accepts;
 *  - every integer label dtype and byte order, (N,) and (N, 1), labels above 255, classes and
 *    shape taken from the file when the model gives none, slices of each kind of set;
 *  - every bad input fails with a message naming the file, what is wrong and what to do: bad
 *    magic, version, header length, header syntax, keys, Fortran order, structured and unknown
 *    dtypes, wrong image or label dtypes and shapes, model shape mismatch (channels-first named),
 *    count mismatch, labels out of range, truncated data, trailing bytes, impossible shapes, a
 *    FIFO (refused without blocking), a folder, a device, missing files;
 *  - the format dispatch of mgt_dataset_load (IDX or .npy) and its messages;
 *  - a sparse 10 GiB images file loads in well under a second without reading it. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/npy.h"
#include "tally.h"
#include "util.h"

enum { N = 5, H = 4, W = 3, C = 2, E = H * W * C };

/* Writes a .npy file: magic, version major.minor, the header dict padded with spaces and ended by
 * '\n' so that the data starts at a multiple of `align` (numpy.save: 64; 0: no padding, no
 * newline), then the data. decl_hlen >= 0 replaces the header length written in the prefix. */
static int write_npy_ex(const char *path, int major, int minor, const char *dict, size_t align,
                        long decl_hlen, const void *data, size_t len) {
    const size_t pre = major == 1 ? 10 : 12;
    char hdr[4096];
    size_t hl = strlen(dict);
    memcpy(hdr, dict, hl);
    if (align) {
        size_t total = (pre + hl + 1 + align - 1) / align * align;
        memset(hdr + hl, ' ', total - pre - hl - 1);
        hl = total - pre;
        hdr[hl - 1] = '\n';
    }
    const unsigned long dl = decl_hlen >= 0 ? (unsigned long)decl_hlen : hl;
    unsigned char p[12] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major, (unsigned char)minor};
    for (size_t b = 0; b < pre - 8; b++)
        p[8 + b] = (unsigned char)(dl >> (8 * b));
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(p, 1, pre, f) == pre && fwrite(hdr, 1, hl, f) == hl &&
             (len == 0 || fwrite(data, 1, len, f) == len);
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int write_npy(const char *path, const char *descr, const char *shape, const void *data,
                     size_t len) {
    char dict[512];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
             shape);
    return write_npy_ex(path, 1, 0, dict, 64, -1, data, len);
}

static int write_raw(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = len == 0 || fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static void path_in(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

static void fresh_dir(char *out, size_t cap, const char *root, const char *name) {
    char cmd[1200];
    path_in(out, cap, root, name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: cannot clear %s\n", out);
    mkdir(out, 0755);
}

/* The small test set: N samples of H x W x C, bytes and floats, labels. */
typedef struct fixture {
    uint8_t px[N * E];
    float fx[N * E];
    int64_t lb[N];
} fixture;

static void make_fixture(fixture *fx) {
    for (int i = 0; i < N * E; i++) {
        fx->px[i] = (uint8_t)(i * 37 + 11);
        /* Values a scaling would change: negative, above 1, tiny, huge. */
        fx->fx[i] = (float)(i % 7 - 3) * 1.37f + (i % 11 == 0 ? 1e30f : 0.0f) +
                    (i % 13 == 0 ? 1e-30f : 0.0f);
    }
    const int64_t l[N] = {3, 0, 4, 1, 2};
    memcpy(fx->lb, l, sizeof l);
}

static const char SHAPE4[] = "(5, 4, 3, 2)";
static const char SHAPE_N[] = "(5,)";

/* Writes DIR/<split>_x.npy (bytes or floats) and DIR/<split>_y.npy (int64). */
static void write_split(tally *t, const char *dir, const char *split, const fixture *fx,
                        int floats) {
    char p[1100];
    snprintf(p, sizeof p, "%s/%s_x.npy", dir, split);
    CHECK(t, floats ? write_npy(p, "<f4", SHAPE4, fx->fx, sizeof fx->fx) == 0
                    : write_npy(p, "|u1", SHAPE4, fx->px, sizeof fx->px) == 0);
    snprintf(p, sizeof p, "%s/%s_y.npy", dir, split);
    CHECK(t, write_npy(p, "<i8", SHAPE_N, fx->lb, sizeof fx->lb) == 0);
}

/* Gathers rows idx of ds and checks values and labels against the fixture. */
static int gather_matches(const mgt_dataset *ds, const fixture *fx, int floats) {
    const int64_t idx[4] = {4, 0, 2, 4};
    float x[4 * E];
    int32_t y[4];
    mgt_dataset_gather(ds, idx, 4, x, y);
    for (int k = 0; k < 4; k++) {
        if (y[k] != fx->lb[idx[k]])
            return 0;
        for (int j = 0; j < E; j++) {
            const float want =
                floats ? fx->fx[idx[k] * E + j] : (float)fx->px[idx[k] * E + j] / 255.0f;
            if (memcmp(&x[k * E + j], &want, sizeof want) != 0)
                return 0;
        }
    }
    return 1;
}

static void test_valid(tally *t, const char *root) {
    fixture fx;
    make_fixture(&fx);
    mgt_err err = {{0}};
    mgt_dataset ds;
    char dir[512], p[1100];

    for (int floats = 0; floats < 2; floats++) {
        fresh_dir(dir, sizeof dir, root, floats ? "f32" : "u8");
        write_split(t, dir, "train", &fx, floats);
        int rc = mgt_dataset_load_npy(&ds, dir, "train", H, W, C, 5, 0, &err);
        CHECK(t, rc == 0);
        if (rc) {
            fprintf(stderr, "  %s\n", err.msg);
            continue;
        }
        CHECK(t, ds.n == N && ds.h == H && ds.w == W && ds.c == C && ds.classes == 5);
        CHECK(t, ds.owned == 1 && ds.map != NULL && strstr(ds.source, "train_x.npy") != NULL);
        /* The samples are the file's pages, right after the 128-byte prefix and header. */
        CHECK(t, floats ? (const uint8_t *)ds.fpixels == (const uint8_t *)ds.map + 128
                        : ds.pixels == (uint8_t *)ds.map + 128);
        CHECK(t, floats ? ds.pixels == NULL && !ds.fswap : ds.fpixels == NULL);
        CHECK(t, ds.labels != NULL && ds.labels32 == NULL && !mgt_dataset_is_synthetic(&ds));
        CHECK(t, gather_matches(&ds, &fx, floats));

        /* A slice (--val-split) views the same mapping at an offset; freeing it frees nothing. */
        mgt_dataset v = mgt_dataset_slice(&ds, 2, 3);
        int64_t i0 = 1;
        float x[E];
        int32_t y;
        mgt_dataset_gather(&v, &i0, 1, x, &y);
        CHECK(t, v.n == 3 && v.owned == 0 && y == fx.lb[3]);
        CHECK(t, floats ? memcmp(x, fx.fx + 3 * E, sizeof x) == 0
                        : x[5] == (float)fx.px[3 * E + 5] / 255.0f);
        mgt_dataset_free(&v);
        CHECK(t, gather_matches(&ds, &fx, floats)); /* still mapped */
        mgt_dataset_free(&ds);
        CHECK(t, ds.pixels == NULL && ds.fpixels == NULL && ds.map == NULL && ds.labels == NULL);

        /* The model's shape may be left to the file (h == 0), and the classes (max label + 1). */
        CHECK(t, mgt_dataset_load_npy(&ds, dir, "train", 0, 0, 0, 0, 0, &err) == 0);
        CHECK(t, ds.h == H && ds.w == W && ds.c == C && ds.classes == 5);
        mgt_dataset_free(&ds);
    }

    /* (N, H, W) is one channel. */
    fresh_dir(dir, sizeof dir, root, "nhw");
    path_in(p, sizeof p, dir, "train_x.npy");
    CHECK(t, write_npy(p, "|u1", "(5, 4, 6)", fx.px, N * 24) == 0);
    path_in(p, sizeof p, dir, "train_y.npy");
    CHECK(t, write_npy(p, "<i8", SHAPE_N, fx.lb, sizeof fx.lb) == 0);
    CHECK(t, mgt_dataset_load_npy(&ds, dir, "train", 4, 6, 1, 5, 0, &err) == 0);
    CHECK(t, ds.c == 1 && ds.h == 4 && ds.w == 6);
    mgt_dataset_free(&ds);

    /* Big-endian float32 ('>f4') is converted while gathering. */
    fresh_dir(dir, sizeof dir, root, "be");
    write_split(t, dir, "train", &fx, 1);
    uint32_t swapped[N * E];
    memcpy(swapped, fx.fx, sizeof swapped);
    for (int i = 0; i < N * E; i++)
        swapped[i] = __builtin_bswap32(swapped[i]);
    path_in(p, sizeof p, dir, "train_x.npy");
    CHECK(t, write_npy(p, ">f4", SHAPE4, swapped, sizeof swapped) == 0);
    CHECK(t, mgt_dataset_load_npy(&ds, dir, "train", H, W, C, 5, 0, &err) == 0);
    CHECK(t, ds.fswap == 1 && gather_matches(&ds, &fx, 1));
    mgt_dataset_free(&ds);

    /* Versions 2.0 and 3.0 (4-byte header length), and headers NumPy's reader accepts though
     * numpy.save would not write them: double quotes, keys in another order, no trailing comma,
     * Python 2's 5L, no padding or newline at all (so the float data is unaligned). */
    const char *dicts[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (5, 4, 3, 2), }",
        "{\"shape\": (5L, 4L, 3L, 2L), \"fortran_order\": False, \"descr\": \"<f4\"}",
        "{ 'fortran_order' : False , 'descr' : '<f4' , 'shape' : ( 5 , 4 , 3 , 2 , ) }",
    };
    const int versions[] = {2, 3, 1};
    const size_t aligns[] = {64, 16, 0};
    for (int k = 0; k < 3; k++) {
        fresh_dir(dir, sizeof dir, root, "ver");
        write_split(t, dir, "train", &fx, 1);
        path_in(p, sizeof p, dir, "train_x.npy");
        CHECK(t,
              write_npy_ex(p, versions[k], 0, dicts[k], aligns[k], -1, fx.fx, sizeof fx.fx) == 0);
        int rc = mgt_dataset_load_npy(&ds, dir, "train", H, W, C, 5, 0, &err);
        CHECK(t, rc == 0);
        if (rc)
            fprintf(stderr, "  header %d: %s\n", k, err.msg);
        CHECK(t, gather_matches(&ds, &fx, 1));
        if (k == 2) /* 10 + the dict's length: not a multiple of 4 */
            CHECK(t, ((uintptr_t)ds.fpixels & 3) != 0);
        mgt_dataset_free(&ds);
    }

    /* Every integer label dtype, either byte order, (N,) or (N, 1). */
    const char *ydescr[] = {"|i1", "|u1", "<i2", "<u2", "<i4", "<u4",
                            "<i8", "<u8", ">i2", ">u4", ">i8", "<i4"};
    const char *yshape[] = {"(5,)", "(5,)", "(5,)", "(5,)", "(5,)", "(5,)",
                            "(5,)", "(5,)", "(5,)", "(5,)", "(5,)", "(5, 1)"};
    fresh_dir(dir, sizeof dir, root, "labels");
    write_split(t, dir, "train", &fx, 0);
    for (int k = 0; k < 12; k++) {
        const int size = ydescr[k][2] - '0', big = ydescr[k][0] == '>';
        uint8_t raw[N * 8];
        for (int i = 0; i < N; i++)
            for (int b = 0; b < size; b++)
                raw[i * size + (big ? size - 1 - b : b)] = (uint8_t)(fx.lb[i] >> (8 * b));
        path_in(p, sizeof p, dir, "train_y.npy");
        CHECK(t, write_npy(p, ydescr[k], yshape[k], raw, (size_t)(N * size)) == 0);
        int rc = mgt_dataset_load_npy(&ds, dir, "train", H, W, C, 5, 0, &err);
        CHECK(t, rc == 0);
        if (rc)
            fprintf(stderr, "  labels %s %s: %s\n", ydescr[k], yshape[k], err.msg);
        CHECK(t, gather_matches(&ds, &fx, 0));
        mgt_dataset_free(&ds);
    }

    /* Labels above 255 (more classes than a byte holds) are kept as int32. */
    const int64_t wide[N] = {999, 0, 256, 70000, 5};
    path_in(p, sizeof p, dir, "train_y.npy");
    CHECK(t, write_npy(p, "<i8", SHAPE_N, wide, sizeof wide) == 0);
    CHECK(t, mgt_dataset_load_npy(&ds, dir, "train", H, W, C, 70001, 0, &err) == 0);
    CHECK(t, ds.labels == NULL && ds.labels32 != NULL && ds.classes == 70001);
    int64_t idx[3] = {3, 0, 2};
    float x[3 * E];
    int32_t y[3];
    mgt_dataset_gather(&ds, idx, 3, x, y);
    CHECK(t, y[0] == 70000 && y[1] == 999 && y[2] == 256);
    mgt_dataset v = mgt_dataset_slice(&ds, 2, 3);
    mgt_dataset_gather(&v, idx + 2, 1, x, y); /* row 2 of the view: row 4 of the set */
    CHECK(t, y[0] == 5 && v.labels32 == ds.labels32 + 2);
    mgt_dataset_free(&ds);
    CHECK(t, mgt_dataset_load_npy(&ds, dir, "train", H, W, C, 0, 0, &err) == 0);
    CHECK(t, ds.classes == 70001);
    mgt_dataset_free(&ds);
}

/* rc of loading DIR's train split for a model of shape (H, W, C) and 5 classes. */
static int load(const char *dir, mgt_err *err) {
    mgt_dataset ds;
    const int rc = mgt_dataset_load_npy(&ds, dir, "train", H, W, C, 5, 0, err);
    if (rc == 0)
        mgt_dataset_free(&ds);
    else if (ds.map || ds.pixels || ds.fpixels || ds.labels || ds.labels32)
        return 99; /* a failed load must leave nothing behind */
    return rc;
}

static void test_errors(tally *t, const char *root) {
    fixture fx;
    make_fixture(&fx);
    mgt_err err = {{0}};
    char dir[512], xp[1100], yp[1100];
    fresh_dir(dir, sizeof dir, root, "bad");
    path_in(xp, sizeof xp, dir, "train_x.npy");
    path_in(yp, sizeof yp, dir, "train_y.npy");
    const char *const good_x = "{'descr': '|u1', 'fortran_order': False, 'shape': (5, 4, 3, 2), }";
#define RESET() write_split(t, dir, "train", &fx, 0)

    /* The prefix. */
    RESET();
    CHECK(t, write_raw(xp, "PK\x03\x04 not numpy at all", 22) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "not a .npy file", "numpy.save");
    CHECK(t, write_raw(xp, "", 0) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "not a .npy file");
    CHECK(t, write_raw(xp, "\x93NUMPY\x01\x00\x10", 9) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "truncated", "9 bytes", "numpy.save");
    CHECK(t, write_npy_ex(xp, 4, 0, good_x, 64, -1, fx.px, sizeof fx.px) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "format version 4.0", "1.0, 2.0 and 3.0");
    CHECK(t, write_npy_ex(xp, 1, 1, good_x, 64, -1, fx.px, sizeof fx.px) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "format version 1.1");
    /* A header length that runs past the end of the file, or that no array has. */
    CHECK(t, write_npy_ex(xp, 1, 0, good_x, 64, 60000, fx.px, sizeof fx.px) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "truncated", "header claims 60000 bytes");
    CHECK(t, write_npy_ex(xp, 2, 0, good_x, 64, 0x7fffffff, fx.px, sizeof fx.px) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "header claims 2147483647 bytes", "damaged");

    /* The header's dict. */
    const struct {
        const char *dict, *words[3];
    } bad[] = {
        {"not a dict at all", {"cannot read the .npy header", "expected '{'", "numpy.save"}},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (5, 4, 3, 2), } junk",
         {"cannot read the .npy header", "only spaces after the dict", "junk"}},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (5, 4, 3, 2)",
         {"cannot read the .npy header", "',' or '}'", NULL}},
        {"{'descr': '|u1', 'fortran_order': Nope, 'shape': (5, 4, 3, 2)}",
         {"expected True or False", NULL, NULL}},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (5, -4, 3, 2)}",
         {"expected a whole number", NULL, NULL}},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (5, 4, 3, 2), 'extra': 1}",
         {"unexpected key 'extra'", "exactly 'descr', 'fortran_order' and 'shape'", NULL}},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (5, 4, 3, 2), 'shape': (5,)}",
         {"a repeated key 'shape'", NULL, NULL}},
        {"{'descr': '|u1', 'fortran_order': False}", {"has no 'shape'", "damaged", NULL}},
        {"{'descr': '|u1', 'fortran_order': True, 'shape': (5, 4, 3, 2), }",
         {"Fortran", "np.ascontiguousarray(x)", NULL}},
        {"{'descr': [('r', '|u1'), ('g', '|u1')], 'fortran_order': False, 'shape': (5,), }",
         {"structured dtype", "plain", NULL}},
        {"{'descr': 'zz', 'fortran_order': False, 'shape': (5, 4, 3, 2), }",
         {"unknown dtype 'zz'", NULL, NULL}},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        CHECK(t, write_npy_ex(xp, 1, 0, bad[k].dict, 64, -1, fx.px, sizeof fx.px) == 0);
        const int rc = load(dir, &err);
        CHECK_ERR(t, rc, &err, xp, bad[k].words[0], bad[k].words[1] ? bad[k].words[1] : "",
                  bad[k].words[2] ? bad[k].words[2] : "");
    }

    /* The data's size against the shape. */
    CHECK(t, write_npy(xp, "|u1", SHAPE4, fx.px, sizeof fx.px - 1) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "truncated",
              "shape (5, 4, 3, 2) of |u1 needs 120 bytes", "holds 119");
    CHECK(t, write_npy(xp, "|u1", SHAPE4, fx.fx, sizeof fx.px + 7) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "trailing bytes", "holds 127");
    CHECK(t, write_npy(xp, "|u1", "(4611686018427387904, 4611686018427387904, 1, 1)", fx.px,
                       sizeof fx.px) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "impossibly large");
    CHECK(t, write_npy(xp, "|u1", "(99999999999999999999, 1, 1, 1)", fx.px, sizeof fx.px) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "below 2^63");

    /* Image dtypes and shapes. */
    const struct {
        const char *descr, *shape, *words[3];
        size_t bytes;
    } badx[] = {
        {"<f8", SHAPE4, {"dtype float64", "uint8", "x.astype(np.float32)"}, 8 * N * E},
        {"|i1", SHAPE4, {"dtype int8", "float32", NULL}, N * E},
        {"<f2", SHAPE4, {"dtype float16", NULL, NULL}, 2 * N * E},
        {"|b1", SHAPE4, {"dtype bool", NULL, NULL}, N * E},
        {"<i8", SHAPE4, {"dtype int64", NULL, NULL}, 8 * N * E},
        {"<U3", SHAPE4, {"<U3 (strings)", NULL, NULL}, 12 * N * E},
        {"|O", SHAPE4, {"dtype object (Python objects)", "numeric", NULL}, 100},
        {"|u1",
         "(5, 24)",
         {"shape (5, 24)", "(N, H, W, C) or (N, H, W)", "x.reshape(-1, 4, 3, 2)"},
         N * E},
        {"|u1", "(120,)", {"shape (120,)", "reshape", NULL}, N * E},
        {"|u1", "(0, 4, 3, 2)", {"holds no samples", NULL, NULL}, 0},
        {"|u1", "(5, 4, 0, 2)", {"at least 1", NULL, NULL}, 0},
        {"|u1",
         "(5, 6, 2, 2)",
         {"images are 6x2x2 (H, W, C)", "[input] shape is 4,3,2", "a model whose input matches"},
         N * E},
        {"|u1", "(5, 4, 3)", {"images are 4x3x1", NULL, NULL}, N * 12},
        {"|u1", "(5, 2, 4, 3)", {"channels-first", "x.transpose(0, 2, 3, 1)", NULL}, N * E},
    };
    static const uint8_t zeros[16 * N * E];
    for (size_t k = 0; k < sizeof badx / sizeof badx[0]; k++) {
        RESET();
        CHECK(t, write_npy(xp, badx[k].descr, badx[k].shape, zeros, badx[k].bytes) == 0);
        CHECK_ERR(t, load(dir, &err), &err, xp, badx[k].words[0],
                  badx[k].words[1] ? badx[k].words[1] : "",
                  badx[k].words[2] ? badx[k].words[2] : "");
    }

    /* Label dtypes, shapes, counts and values. */
    const int64_t onehot[N * 5] = {0};
    const float fl[N] = {0};
    const uint8_t bl[N] = {0};
    const int64_t four[4] = {0}, three_d[N] = {0};
    RESET();
    CHECK(t, write_npy(yp, "<f4", SHAPE_N, fl, sizeof fl) == 0);
    CHECK_ERR(t, load(dir, &err), &err, yp, "dtype float32", "integers", "y.astype(np.int64)");
    CHECK(t, write_npy(yp, "|b1", SHAPE_N, bl, sizeof bl) == 0);
    CHECK_ERR(t, load(dir, &err), &err, yp, "dtype bool");
    CHECK(t, write_npy(yp, "<i8", "(5, 5)", onehot, sizeof onehot) == 0);
    CHECK_ERR(t, load(dir, &err), &err, yp, "shape (5, 5)", "y.argmax(axis=1)");
    CHECK(t, write_npy(yp, "<i8", "(5, 1, 1)", three_d, sizeof three_d) == 0);
    CHECK_ERR(t, load(dir, &err), &err, yp, "shape (5, 1, 1)", "(N,)", "y.ravel()");
    CHECK(t, write_npy(yp, "<i8", "(4,)", four, sizeof four) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "holds 5 samples but", yp, "holds 4 labels");
    const int64_t high[N] = {0, 1, 9, 2, 7}, neg[N] = {0, 1, 2, -1, 3};
    CHECK(t, write_npy(yp, "<i8", SHAPE_N, high, sizeof high) == 0);
    CHECK_ERR(t, load(dir, &err), &err, yp, "label 9 at index 2 is not below the model's 5 classes",
              "at least 10 outputs");
    CHECK(t, write_npy(yp, "<i8", SHAPE_N, neg, sizeof neg) == 0);
    CHECK_ERR(t, load(dir, &err), &err, yp, "label -1 at index 3 is negative");
    const uint64_t huge[N] = {0, 1, 2, 3, 0x8000000000000000ull};
    CHECK(t, write_npy(yp, "<u8", SHAPE_N, huge, sizeof huge) == 0);
    CHECK_ERR(t, load(dir, &err), &err, yp, "at index 4 is too large for a class index");

    /* Files that are not regular files are refused, a FIFO without waiting for a writer (the
     * alarm ends the test, failing it, if the open blocks). */
    RESET();
    unlink(xp);
    CHECK(t, mkfifo(xp, 0644) == 0);
    alarm(20);
    CHECK_ERR(t, load(dir, &err), &err, xp, "not a regular file (a FIFO)");
    alarm(0);
    unlink(xp);
    CHECK(t, mkdir(xp, 0755) == 0);
    CHECK_ERR(t, load(dir, &err), &err, xp, "not a regular file (a folder)");
    rmdir(xp);
    mgt_npy a;
    CHECK_ERR(t, mgt_npy_open(&a, "/dev/zero", &err), &err, "/dev/zero", "(a device)");
    CHECK_ERR(t, mgt_npy_open(&a, "/nonexistent/x.npy", &err), &err, "/nonexistent/x.npy",
              "cannot open", "No such file");

    /* Missing files. */
    RESET();
    unlink(yp);
    CHECK_ERR(t, load(dir, &err), &err, "no train_y.npy in", dir, "train_x.npy (images");
    mgt_dataset ds;
    CHECK_ERR(t, mgt_dataset_load_npy(&ds, dir, "test", H, W, C, 5, 0, &err), &err, "no test_x.npy in",
              "test_y.npy", "--val-split");
#undef RESET
}

/* mgt_dataset_load: .npy where train_x.npy or test_x.npy is, IDX otherwise. */
static void test_dispatch(tally *t, const char *root) {
    fixture fx;
    make_fixture(&fx);
    mgt_err err = {{0}};
    mgt_dataset ds;
    char dir[512];
    fresh_dir(dir, sizeof dir, root, "dispatch");
    write_split(t, dir, "train", &fx, 0);
    write_split(t, dir, "test", &fx, 1);
    CHECK(t, mgt_dataset_dir_is_npy(dir));
    CHECK(t, mgt_dataset_load(&ds, dir, 0, H, W, C, 5, 0, NULL, &err) == 0 && ds.pixels != NULL);
    mgt_dataset_free(&ds);
    CHECK(t, mgt_dataset_load(&ds, dir, 1, H, W, C, 5, 0, NULL, &err) == 0 && ds.fpixels != NULL);
    mgt_dataset_free(&ds);

    /* An IDX folder: one channel only; a multi-channel model is told about .npy. */
    fresh_dir(dir, sizeof dir, root, "idx");
    const int32_t idims[3] = {N, H, W}, ldims[1] = {N};
    const uint8_t lb[N] = {1, 2, 3, 4, 0};
    char p[1100];
    path_in(p, sizeof p, dir, "train-images-idx3-ubyte");
    CHECK(t, mgt_idx_write(p, fx.px, 3, idims, &err) == 0);
    path_in(p, sizeof p, dir, "train-labels-idx1-ubyte");
    CHECK(t, mgt_idx_write(p, lb, 1, ldims, &err) == 0);
    CHECK(t, !mgt_dataset_dir_is_npy(dir));
    CHECK(t, mgt_dataset_load(&ds, dir, 0, H, W, 1, 5, 0, NULL, &err) == 0 && ds.c == 1);
    mgt_dataset_free(&ds);
    CHECK_ERR(t, mgt_dataset_load(&ds, dir, 0, H, W, 3, 5, 0, NULL, &err), &err,
              "IDX images have 1 channel but the model's [input] shape has 3", "train_x.npy");
    /* Neither format: the IDX message, and the .npy names. */
    CHECK_ERR(t, mgt_dataset_load(&ds, dir, 1, H, W, 1, 5, 0, NULL, &err), &err,
              "no t10k-images-idx3-ubyte[.gz] in", "test_x.npy and test_y.npy");
}

/* A 10 GiB images file (sparse: no disk used) loads without reading it: a few milliseconds and
 * a few MB of memory (its labels), and its last sample gathers (zeros). */
static void test_large(tally *t, const char *root) {
    mgt_err err = {{0}};
    char dir[512], p[1100];
    fresh_dir(dir, sizeof dir, root, "large");
    const int64_t n = (10LL << 30) / (32 * 32 * 3);
    char shape[64];
    snprintf(shape, sizeof shape, "(%lld, 32, 32, 3)", (long long)n);
    path_in(p, sizeof p, dir, "train_x.npy");
    int ok = write_npy(p, "|u1", shape, NULL, 0) == 0 && truncate(p, 128 + n * 3072) == 0;
    uint8_t *y = calloc((size_t)n, 1);
    snprintf(shape, sizeof shape, "(%lld,)", (long long)n);
    path_in(p, sizeof p, dir, "train_y.npy");
    ok = ok && y && write_npy(p, "|u1", shape, y, (size_t)n) == 0;
    free(y);
    CHECK(t, ok);
    if (!ok)
        return;
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    const double t0 = mgt_now();
    mgt_dataset ds;
    const int rc = mgt_dataset_load_npy(&ds, dir, "train", 32, 32, 3, 10, 0, &err);
    const double secs = mgt_now() - t0;
    CHECK(t, rc == 0);
    if (rc) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    int64_t last = n - 1;
    float *x = malloc(sizeof(float) * 3072);
    int32_t l = -1;
    mgt_dataset_gather(&ds, &last, 1, x, &l);
    getrusage(RUSAGE_SELF, &r1);
    const long grown_kb = r1.ru_maxrss - r0.ru_maxrss;
    printf("  10 GiB .npy (%lld samples of 32x32x3): loaded in %.3f s, peak memory +%ld MB\n",
           (long long)n, secs, grown_kb / 1024);
    CHECK(t, ds.n == n && x && x[3071] == 0.0f && l == 0);
    /* The labels (3.5 MB, read and converted) are all the memory a load costs; 10 GiB read up
     * front would show here as 10000 MB. */
    CHECK(t, grown_kb < 64 * 1024);
    free(x);
    mgt_dataset_free(&ds);
}

int main(void) {
    tally T = {0, 0}, *t = &T;
    char root[] = "/tmp/mgt_test_npy_XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_valid(t, root);
    test_errors(t, root);
    test_dispatch(t, root);
    test_large(t, root);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", root);
    printf("test_npy: %d checks passed", T.pass);
    if (T.fail)
        printf(", %d FAILED", T.fail);
    printf("\n");
    return T.fail ? 1 : 0;
}
