/* idx.c: reading and writing IDX files, the MNIST / Fashion-MNIST format.
 *
 * An IDX file is a big-endian header (magic 0x000008NN: unsigned bytes, NN dimensions, then NN
 * uint32 sizes) followed by the raw bytes. Files are read through zlib's gzread, which also reads
 * plain files unchanged, so train-images-idx3-ubyte and train-images-idx3-ubyte.gz go through the
 * same code. The data is read in large chunks straight into its final buffer: the 60000
 * Fashion-MNIST training images decompress in about a tenth of a second that way.
 *
 * Every way a file can disagree with itself or with the model (wrong magic, fewer or more bytes
 * than the header declares, image and label counts that differ, a label outside the model's
 * classes, an image shape the model does not take) is reported as one sentence naming the file.
 *
 * The header is not trusted for memory: a plain file's size is checked against it before anything
 * is allocated, and for a gzip stream no more is allocated than its compressed size could
 * possibly expand to. Only regular files are read: a pipe or a device named as a data file would
 * block or never end. */
#include "dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u
/* A sanity bound on the declared data size (1 TiB): larger is a damaged header, not a dataset. */
#define IDX_MAX_BYTES (1LL << 40)
/* One gzread call moves at most this much (gzread takes an unsigned int and returns an int). */
#define IDX_CHUNK (1 << 30)

static const char DATA_HINT[] =
    "pass --data with a folder of IDX files (e.g. /usr/share/datasets/fashion-mnist) or --data "
    "synthetic";

typedef struct idx_file {
    uint8_t *data;
    int64_t n;    /* first dimension */
    int h, w;     /* images only */
    int64_t size; /* header + data bytes (uncompressed) */
} idx_file;

static int ends_with(const char *s, const char *suffix) {
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads up to len bytes into buf; returns how many were read (fewer at the end of the data), or
 * -1 with a message when the file cannot be read or its gzip stream is corrupt. A gzip stream
 * that simply stops early (Z_BUF_ERROR) counts as the end of the data: the caller reports it as
 * truncation, which is what it is. */
static int64_t read_fully(gzFile f, uint8_t *buf, int64_t len, const char *path, mgt_err *err) {
    int64_t got = 0;
    while (got < len) {
        int64_t want = len - got;
        if (want > IDX_CHUNK)
            want = IDX_CHUNK;
        int r = gzread(f, buf + got, (unsigned)want);
        if (r < 0) {
            int errnum = 0;
            const char *msg = gzerror(f, &errnum);
            if (errnum == Z_BUF_ERROR)
                break;
            if (errnum == Z_ERRNO)
                return mgt_errf(err, "%s: cannot read (%s); check the file and its permissions",
                                path, strerror(errno));
            /* gzerror's text starts with the path: keep only zlib's reason. */
            size_t pl = strlen(path);
            if (strncmp(msg, path, pl) == 0 && strncmp(msg + pl, ": ", 2) == 0)
                msg += pl + 2;
            return mgt_errf(err, "%s: corrupt gzip data (%s); re-download or reinstall the dataset",
                            path, msg);
        }
        if (r == 0)
            break;
        got += r;
    }
    return got;
}

/* The messages for a file holding fewer or more bytes than its header declares (`have`: what it
 * holds, header included). */
static int size_mismatch(mgt_err *err, const char *path, const idx_file *out, int images,
                         int64_t hdr_len, int64_t bytes, int64_t have, const char *once) {
    if (have > hdr_len + bytes) /* a wrong header, or two files glued together */
        return mgt_errf(err,
                        "%s: %lld trailing bytes after the %lld %s the header declares (the file "
                        "holds %lld bytes%s, expected %lld); the file is damaged, re-download or "
                        "reinstall the dataset",
                        path, (long long)(have - hdr_len - bytes), (long long)out->n,
                        images ? "images" : "labels", (long long)have, once,
                        (long long)(hdr_len + bytes));
    if (images)
        return mgt_errf(err,
                        "%s: truncated: header says %lld images of %dx%d (%lld bytes) but the "
                        "file holds %lld bytes%s; re-download or reinstall the dataset",
                        path, (long long)out->n, out->h, out->w, (long long)(hdr_len + bytes),
                        (long long)have, once);
    return mgt_errf(err,
                    "%s: truncated: header says %lld labels (%lld bytes) but the file holds %lld "
                    "bytes%s; re-download or reinstall the dataset",
                    path, (long long)out->n, (long long)(hdr_len + bytes), (long long)have, once);
}

/* Opens a regular file for zlib; anything else (a pipe, a device, a folder) is refused before
 * it can block. *size is the size on disk. */
static gzFile open_regular(const char *path, int64_t *size, mgt_err *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0) {
        mgt_errf(err, "%s: cannot open (%s); check the path and its permissions", path,
                 strerror(errno));
        return NULL;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        mgt_errf(err, "%s is not a regular file (a pipe, device or folder); %s", path, DATA_HINT);
        close(fd);
        return NULL;
    }
    *size = sb.st_size;
    errno = 0;
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        mgt_errf(err, "%s: cannot open (%s)", path, errno ? strerror(errno) : "out of memory");
        close(fd);
    }
    return f;
}

/* Counts the bytes left in f (the data past what the header declares). */
static int64_t count_rest(gzFile f, const char *path, mgt_err *err) {
    uint8_t scratch[65536];
    int64_t total = 0;
    for (;;) {
        int64_t r = read_fully(f, scratch, (int64_t)sizeof scratch, path, err);
        if (r < 0)
            return -1;
        total += r;
        if (r < (int64_t)sizeof scratch)
            return total;
    }
}

/* Reads one IDX file: images (3 dims n,h,w) or labels (1 dim n), checking the magic and that the
 * file holds exactly the bytes its header declares. */
static int idx_read(const char *path, int images, idx_file *out, mgt_err *err) {
    memset(out, 0, sizeof *out);
    const char *what = images ? "images" : "labels";
    const char *once = ends_with(path, ".gz") ? " once decompressed" : "";
    const uint32_t magic_want = images ? IDX_IMAGES_MAGIC : IDX_LABELS_MAGIC;
    const int ndims = images ? 3 : 1;
    const int64_t hdr_len = 4 + 4 * (int64_t)ndims;

    int64_t disk = 0;
    gzFile f = open_regular(path, &disk, err);
    if (!f)
        return -1;
    /* A big input buffer: fewer read() calls and inflate restarts; no bigger than the file. */
    gzbuffer(f, disk < (1 << 20) ? (unsigned)disk + 64 : 1u << 20);

    uint8_t hdr[16];
    int64_t got = read_fully(f, hdr, hdr_len, path, err);
    if (got < 0)
        goto fail;
    if (got >= 4 && be32(hdr) != magic_want) {
        mgt_errf(err,
                 "%s: bad magic 0x%08x (expected 0x%08x for an IDX %s file); check that "
                 "this is the right file",
                 path, be32(hdr), magic_want, images ? "image" : "label");
        goto fail;
    }
    if (got < hdr_len) {
        mgt_errf(err,
                 "%s: truncated: an IDX %s header needs %lld bytes but the file holds %lld "
                 "bytes%s; re-download or reinstall the dataset",
                 path, images ? "image" : "label", (long long)hdr_len, (long long)got, once);
        goto fail;
    }

    /* The sizes: each must be positive and their product sane before anything is allocated. */
    uint32_t dims[3] = {0, 0, 0};
    for (int d = 0; d < ndims; d++) {
        dims[d] = be32(hdr + 4 + 4 * d);
        if (dims[d] == 0 || dims[d] > (uint32_t)INT32_MAX) {
            mgt_errf(err,
                     "%s: header declares dimension %d of size %u; the file is damaged, "
                     "re-download or reinstall the dataset",
                     path, d, dims[d]);
            goto fail;
        }
    }
    out->n = dims[0];
    out->h = images ? (int)dims[1] : 1;
    out->w = images ? (int)dims[2] : 1;
    int64_t bytes = out->n;
    if (images) {
        int64_t per = (int64_t)dims[1] * dims[2];
        bytes = per > IDX_MAX_BYTES / out->n ? IDX_MAX_BYTES + 1 : out->n * per;
    }
    if (bytes > IDX_MAX_BYTES) {
        mgt_errf(err,
                 "%s: header declares an implausible size (%u x %u x %u); the file is "
                 "damaged, re-download or reinstall the dataset",
                 path, dims[0], dims[1], dims[2]);
        goto fail;
    }

    if (gzdirect(f)) {
        /* A plain file: its size must be what the header says before anything is allocated. */
        if (disk != hdr_len + bytes) {
            size_mismatch(err, path, out, images, hdr_len, bytes, disk, "");
            goto fail;
        }
        out->data = malloc((size_t)bytes);
        if (!out->data) {
            mgt_errf(err, "%s: out of memory for %lld bytes of %s", path, (long long)bytes, what);
            goto fail;
        }
        got = read_fully(f, out->data, bytes, path, err);
    } else {
        /* A gzip stream: deflate expands at most 1032-fold, so a file of `disk` bytes cannot
         * hold more than about 1032 * disk. Asking for no more than that keeps a damaged header
         * from reserving memory the data cannot fill; a short read is reported below. */
        int64_t most = disk > (IDX_MAX_BYTES >> 10) ? IDX_MAX_BYTES : 1032 * disk + (1 << 20);
        int64_t cap = bytes < most ? bytes : most;
        out->data = malloc((size_t)cap);
        if (!out->data) {
            mgt_errf(err, "%s: out of memory for %lld bytes of %s", path, (long long)cap, what);
            goto fail;
        }
        got = read_fully(f, out->data, cap, path, err);
    }
    if (got < 0)
        goto fail;
    if (got < bytes) {
        size_mismatch(err, path, out, images, hdr_len, bytes, hdr_len + got, once);
        goto fail;
    }
    int64_t extra = count_rest(f, path, err);
    if (extra < 0)
        goto fail;
    if (extra > 0) {
        size_mismatch(err, path, out, images, hdr_len, bytes, hdr_len + bytes + extra, once);
        goto fail;
    }
    out->size = hdr_len + bytes;
    gzclose(f);
    return 0;

fail:
    gzclose(f);
    free(out->data);
    out->data = NULL;
    return -1;
}

/* Finds DIR/NAME, or DIR/NAME.gz when only that exists. */
static int find_idx(const char *dir, const char *prefix, const char *kind, char *path, size_t cap,
                    mgt_err *err) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return mgt_errf(err, "no %s-%s[.gz] in %s (no such folder): %s", prefix, kind, dir,
                        DATA_HINT);
    int len = snprintf(path, cap, "%s/%s-%s", dir, prefix, kind);
    if (len < 0 || (size_t)len + 3 >= cap)
        return mgt_errf(err, "%s: path too long for a data folder: %s", dir, DATA_HINT);
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
        return 0; /* idx_read refuses it if it is not a regular file */
    strcat(path, ".gz");
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
        return 0;
    return mgt_errf(err, "no %s-%s[.gz] in %s: %s", prefix, kind, dir, DATA_HINT);
}

int mgt_dataset_load_idx(mgt_dataset *ds, const char *dir, const char *prefix, int h, int w,
                         int classes, mgt_err *err) {
    memset(ds, 0, sizeof *ds);
    char ipath[sizeof ds->source], lpath[sizeof ds->source];
    if (find_idx(dir, prefix, "images-idx3-ubyte", ipath, sizeof ipath, err) ||
        find_idx(dir, prefix, "labels-idx1-ubyte", lpath, sizeof lpath, err))
        return -1;

    idx_file im, lb;
    if (idx_read(ipath, 1, &im, err))
        return -1;
    if (h != 0 && (im.h != h || im.w != w)) {
        mgt_errf(err,
                 "%s: images are %dx%d but the model's [input] shape is %dx%d; use a model "
                 "whose input matches the data",
                 ipath, im.h, im.w, h, w);
        free(im.data);
        return -1;
    }
    if (idx_read(lpath, 0, &lb, err)) {
        free(im.data);
        return -1;
    }
    if (lb.n != im.n) {
        mgt_errf(err,
                 "%s: %lld images but %s holds %lld labels; use image and label files of "
                 "the same dataset",
                 ipath, (long long)im.n, lpath, (long long)lb.n);
        goto fail;
    }

    /* Labels: every one below the model's class count, or (classes <= 0) define the count. */
    int maxl = 0;
    for (int64_t i = 0; i < lb.n; i++) {
        int l = lb.data[i];
        if (classes > 0 && l >= classes) {
            mgt_errf(err,
                     "%s: label %d at index %lld is not below the model's %d classes; use "
                     "a model with at least %d outputs or fix the labels",
                     lpath, l, (long long)i, classes, l + 1);
            goto fail;
        }
        if (l > maxl)
            maxl = l;
    }

    ds->n = im.n;
    ds->h = im.h;
    ds->w = im.w;
    ds->c = 1;
    ds->classes = classes > 0 ? classes : maxl + 1;
    ds->pixels = im.data;
    ds->labels = lb.data;
    ds->owned = 1;
    snprintf(ds->source, sizeof ds->source, "%s", ipath);
    return 0;

fail:
    free(im.data);
    free(lb.data);
    return -1;
}

int mgt_idx_write(const char *path, const uint8_t *data, int ndims, const int32_t *dims,
                  mgt_err *err) {
    if (ndims < 1 || ndims > 255)
        return mgt_errf(err, "%s: an IDX file has 1 to 255 dimensions, not %d", path, ndims);
    uint8_t hdr[4 + 4 * 255];
    hdr[0] = hdr[1] = 0;
    hdr[2] = 0x08; /* unsigned bytes */
    hdr[3] = (uint8_t)ndims;
    int64_t total = 1;
    for (int d = 0; d < ndims; d++) {
        if (dims[d] < 0)
            return mgt_errf(err, "%s: dimension %d is negative (%d)", path, d, (int)dims[d]);
        uint32_t v = (uint32_t)dims[d];
        hdr[4 + 4 * d] = (uint8_t)(v >> 24);
        hdr[5 + 4 * d] = (uint8_t)(v >> 16);
        hdr[6 + 4 * d] = (uint8_t)(v >> 8);
        hdr[7 + 4 * d] = (uint8_t)v;
        total = dims[d] == 0 || total <= IDX_MAX_BYTES / dims[d] ? total * dims[d] : -1;
        if (total < 0)
            return mgt_errf(err, "%s: dimensions too large for an IDX file", path);
    }
    size_t hlen = 4 + 4 * (size_t)ndims;

    if (ends_with(path, ".gz")) {
        errno = 0;
        gzFile f = gzopen(path, "wb");
        if (!f)
            return mgt_errf(err, "%s: cannot create (%s)", path,
                            errno ? strerror(errno) : "out of memory");
        int ok = gzwrite(f, hdr, (unsigned)hlen) == (int)hlen;
        for (int64_t off = 0; ok && off < total; off += IDX_CHUNK) {
            unsigned n = (unsigned)(total - off < IDX_CHUNK ? total - off : IDX_CHUNK);
            ok = gzwrite(f, data + off, n) == (int)n;
        }
        int saved = errno;
        int closed = gzclose(f);
        if (!ok || closed != Z_OK) {
            unlink(path);
            return mgt_errf(err, "%s: cannot write (%s)", path,
                            saved ? strerror(saved) : "zlib error");
        }
        return 0;
    }

    FILE *f = fopen(path, "wb");
    if (!f)
        return mgt_errf(err, "%s: cannot create (%s)", path, strerror(errno));
    int ok = fwrite(hdr, 1, hlen, f) == hlen &&
             (total == 0 || fwrite(data, 1, (size_t)total, f) == (size_t)total);
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        unlink(path);
        return mgt_errf(err, "%s: cannot write (%s)", path, strerror(saved));
    }
    return 0;
}
