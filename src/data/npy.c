/* npy.c: .npy files as read-only memory maps (see npy.h), and datasets of them (dataset.h).
 *
 * The header is parsed here rather than by a library: the format is a dozen lines of NumPy's
 * documentation (numpy.lib.format), and the only part that needs care is the Python dict literal,
 * of which numpy.save writes one shape: {'descr': '<f4', 'fortran_order': False, 'shape': (N, H,
 * W, C), } padded with spaces to a 64-byte boundary and ended by '\n'. The parser accepts what
 * NumPy's own reader accepts (either quote, keys in any order, a trailing comma, Python 2's 3L),
 * and, as NumPy does, refuses a header with a missing or an extra key.
 *
 * Images are memory-mapped, never read up front: a 10 GB training set costs address space, and
 * the pages a batch touches are read when it is gathered (the kernel keeps them cached while
 * memory allows and drops them otherwise). A mapped file must not be rewritten in place while a
 * job reads it (numpy.save truncates an existing file first, and reading a page past the new end
 * kills the process with SIGBUS): a new dataset goes into a new file or folder.
 *
 * Labels are small (N values), must all be checked against the model's classes anyway, and are
 * converted once into bytes (every label < 256) or int32, so a batch's labels never depend on the
 * file's integer type. */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset.h"

/* The values are read as little-endian numbers (byte-swapped when the file says '>'). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "npy.c assumes a little-endian host");

#define NPY_MAGIC "\x93NUMPY"
/* numpy.load refuses headers over 10000 bytes unless told otherwise; a 1 MiB header is no
 * array's, only a damaged length field's, and is refused before it is read. */
#define NPY_MAX_HEADER (1 << 20)

static const char SAVE_HINT[] = "save it again with numpy.save";

/* ---- the header's dict literal ----------------------------------------------------------- */

typedef struct cursor {
    const char *s, *begin, *end;
    const char *what; /* what was expected where parsing stopped */
} cursor;

static void skip_ws(cursor *c) {
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r'))
        c->s++;
}

static int accept(cursor *c, char ch) {
    skip_ws(c);
    if (c->s < c->end && *c->s == ch) {
        c->s++;
        return 1;
    }
    return 0;
}

static int expect(cursor *c, char ch, const char *what) {
    if (accept(c, ch))
        return 0;
    c->what = what;
    return -1;
}

/* A Python string literal without escapes ('...' or "..."), into out. */
static int parse_str(cursor *c, char *out, size_t cap) {
    skip_ws(c);
    if (c->s >= c->end || (*c->s != '\'' && *c->s != '"')) {
        c->what = "a quoted string";
        return -1;
    }
    const char q = *c->s++;
    size_t n = 0;
    while (c->s < c->end && *c->s != q) {
        if (*c->s == '\\' || n + 1 >= cap) {
            c->what = "a short string without escapes";
            return -1;
        }
        out[n++] = *c->s++;
    }
    if (c->s >= c->end) {
        c->what = "the end of a string";
        return -1;
    }
    c->s++;
    out[n] = '\0';
    return 0;
}

/* A non-negative Python int (Python 2's 3L too). */
static int parse_int(cursor *c, int64_t *v) {
    skip_ws(c);
    if (c->s >= c->end || *c->s < '0' || *c->s > '9') {
        c->what = "a whole number";
        return -1;
    }
    int64_t x = 0;
    while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
        const int d = *c->s++ - '0';
        if (x > (INT64_MAX - d) / 10) {
            c->what = "a dimension below 2^63";
            return -1;
        }
        x = 10 * x + d;
    }
    if (c->s < c->end && (*c->s == 'L' || *c->s == 'l'))
        c->s++;
    *v = x;
    return 0;
}

/* (d0, d1, ...) with an optional trailing comma; () is a 0-d array. */
static int parse_shape(cursor *c, mgt_npy *a) {
    if (expect(c, '(', "a shape tuple '('"))
        return -1;
    a->ndim = 0;
    if (accept(c, ')'))
        return 0;
    for (;;) {
        if (a->ndim == MGT_NPY_MAX_DIMS) {
            c->what = "at most 32 dimensions";
            return -1;
        }
        if (parse_int(c, &a->shape[a->ndim]))
            return -1;
        a->ndim++;
        if (accept(c, ')'))
            return 0;
        if (expect(c, ',', "',' or ')' in the shape"))
            return -1;
        if (accept(c, ')'))
            return 0;
    }
}

static int parse_bool(cursor *c, int *v) {
    skip_ws(c);
    const size_t left = (size_t)(c->end - c->s);
    if (left >= 4 && !memcmp(c->s, "True", 4)) {
        *v = 1;
        c->s += 4;
        return 0;
    }
    if (left >= 5 && !memcmp(c->s, "False", 5)) {
        *v = 0;
        c->s += 5;
        return 0;
    }
    c->what = "True or False";
    return -1;
}

/* The descr string: byte order, kind letter, size ("<f4", "|u1", ">i8", "<U10", "|O"). The size
 * is in bytes except for 'U' (characters of 4 bytes); object arrays ('|O') have none. */
static int parse_descr(const char *d, mgt_npy *a) {
    if (strlen(d) < 2 || !strchr("<>|=", d[0]) ||
        !((d[1] >= 'a' && d[1] <= 'z') || (d[1] >= 'A' && d[1] <= 'Z')))
        return -1;
    a->kind = d[1];
    if (d[1] == 'O' && d[2] == '\0') {
        a->itemsize = 8;
        return 0;
    }
    char *end;
    errno = 0;
    const long size = strtol(d + 2, &end, 10);
    if (errno || *end || end == d + 2 || size < 1 || size > 1 << 20)
        return -1;
    a->itemsize = (int)size * (d[1] == 'U' ? 4 : 1);
    a->big_endian = d[0] == '>' && size > 1;
    return 0;
}

/* Parses the dict of header text [h, h + len) into a. */
static int parse_header(const char *path, const char *h, size_t len, mgt_npy *a, mgt_err *err) {
    cursor c = {h, h, h + len, NULL};
    int seen_descr = 0, seen_order = 0, seen_shape = 0, fortran = 0;
    char key[32];
    if (expect(&c, '{', "'{'"))
        goto syntax;
    while (!accept(&c, '}')) {
        if (parse_str(&c, key, sizeof key) || expect(&c, ':', "':' after a key"))
            goto syntax;
        if (!strcmp(key, "descr") && !seen_descr) {
            skip_ws(&c);
            if (c.s < c.end && *c.s == '[')
                return mgt_errf(err,
                                "%s: a structured dtype (a record of named fields); save a plain "
                                "numeric array (x.astype(np.float32) or np.uint8)",
                                path);
            if (parse_str(&c, a->descr, sizeof a->descr))
                goto syntax;
            seen_descr = 1;
        } else if (!strcmp(key, "fortran_order") && !seen_order) {
            if (parse_bool(&c, &fortran))
                goto syntax;
            seen_order = 1;
        } else if (!strcmp(key, "shape") && !seen_shape) {
            if (parse_shape(&c, a))
                goto syntax;
            seen_shape = 1;
        } else {
            return mgt_errf(
                err,
                "%s: the .npy header has %s key '%s' (it holds exactly 'descr', "
                "'fortran_order' and 'shape'); the file is damaged: %s",
                path,
                (!strcmp(key, "descr") || !strcmp(key, "fortran_order") || !strcmp(key, "shape"))
                    ? "a repeated"
                    : "an unexpected",
                key, SAVE_HINT);
        }
        if (accept(&c, '}'))
            break;
        if (expect(&c, ',', "',' or '}' after a value"))
            goto syntax;
    }
    skip_ws(&c);
    if (c.s != c.end) { /* only padding may follow the dict */
        c.what = "only spaces after the dict";
        goto syntax;
    }
    if (!seen_descr || !seen_order || !seen_shape)
        return mgt_errf(err, "%s: the .npy header has no '%s'; the file is damaged: %s", path,
                        !seen_descr   ? "descr"
                        : !seen_order ? "fortran_order"
                                      : "shape",
                        SAVE_HINT);
    if (parse_descr(a->descr, a))
        return mgt_errf(err, "%s: unknown dtype '%s' in the .npy header; %s", path, a->descr,
                        SAVE_HINT);
    /* An object array's data is a pickle, not values: nothing to map. */
    if (a->kind == 'O')
        return mgt_errf(err,
                        "%s: dtype object (Python objects); save a numeric array: "
                        "np.asarray(x, dtype=np.float32) or np.uint8",
                        path);
    if (fortran)
        return mgt_errf(err,
                        "%s: saved in Fortran (column-major) order; save a C-ordered array: "
                        "np.save(path, np.ascontiguousarray(x))",
                        path);
    return 0;
syntax:;
    const long at = (long)(c.s - c.begin);
    return mgt_errf(err,
                    "%s: cannot read the .npy header (expected %s at byte %ld of the header, "
                    "found '%.16s'); the file is damaged or was not written by numpy.save: %s",
                    path, c.what ? c.what : "a dict", at, c.s < c.end ? c.s : "", SAVE_HINT);
}

/* ---- files --------------------------------------------------------------------------------- */

/* Reads exactly len bytes at off (fewer only at the end of the file: returns how many). */
static int64_t read_at(int fd, void *buf, size_t len, off_t off) {
    size_t got = 0;
    while (got < len) {
        const ssize_t r = pread(fd, (char *)buf + got, len - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

/* "(5, 32, 32, 3)", "(5,)": a shape as Python prints it. */
static void shape_str(const mgt_npy *a, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < a->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)a->shape[d]);
    if (o < cap)
        snprintf(buf + o, cap - o, a->ndim == 1 ? ",)" : ")");
}

const char *mgt_npy_dtype_name(const mgt_npy *a, char *buf, size_t cap) {
    const char *base = a->kind == 'f'   ? "float"
                       : a->kind == 'i' ? "int"
                       : a->kind == 'u' ? "uint"
                       : a->kind == 'c' ? "complex"
                                        : NULL;
    if (a->kind == 'b' && a->itemsize == 1)
        snprintf(buf, cap, "bool");
    else if (a->kind == 'O')
        snprintf(buf, cap, "object (Python objects)");
    else if (a->kind == 'U' || a->kind == 'S')
        snprintf(buf, cap, "%s (strings)", a->descr);
    else if (base)
        snprintf(buf, cap, "%s%d%s", base, 8 * a->itemsize, a->big_endian ? " big-endian" : "");
    else
        snprintf(buf, cap, "%s", a->descr);
    return buf;
}

int mgt_npy_open(mgt_npy *a, const char *path, mgt_err *err) {
    memset(a, 0, sizeof *a);
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. It changes
     * nothing for a regular file, and anything else is refused next. */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return mgt_errf(err, "%s: cannot open (%s); check the path and its permissions", path,
                        strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        mgt_errf(err, "%s: cannot read its size (%s)", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        mgt_errf(err,
                 "%s: not a regular file (%s); give a folder of .npy files saved by numpy.save",
                 path,
                 S_ISDIR(st.st_mode)                          ? "a folder"
                 : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                 : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                              : "a socket or other special file");
        goto fail;
    }
    const int64_t size = (int64_t)st.st_size;

    uint8_t pre[12];
    const int64_t got = read_at(fd, pre, sizeof pre, 0);
    if (got < 0) {
        mgt_errf(err, "%s: cannot read (%s); check the file and its permissions", path,
                 strerror(errno));
        goto fail;
    }
    if (got < 6 || memcmp(pre, NPY_MAGIC, 6) != 0) {
        mgt_errf(err,
                 "%s: not a .npy file (it does not start with \\x93NUMPY); write it with "
                 "numpy.save (np.save('%s', x))",
                 path, strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
        goto fail;
    }
    if (got >= 8 && (pre[6] < 1 || pre[6] > 3 || pre[7] != 0)) {
        mgt_errf(err, "%s: .npy format version %d.%d; mgtrain reads versions 1.0, 2.0 and 3.0: %s",
                 path, pre[6], pre[7], SAVE_HINT);
        goto fail;
    }
    a->version = got >= 8 ? pre[6] : 0;
    const int64_t lenbytes = a->version == 1 ? 2 : 4, hstart = 8 + lenbytes;
    if (got < hstart) {
        mgt_errf(err, "%s: truncated: %lld bytes, fewer than a .npy header needs; %s", path,
                 (long long)size, SAVE_HINT);
        goto fail;
    }
    const int64_t hlen = a->version == 1
                             ? (int64_t)(pre[8] | pre[9] << 8)
                             : (int64_t)((uint32_t)pre[8] | (uint32_t)pre[9] << 8 |
                                         (uint32_t)pre[10] << 16 | (uint32_t)pre[11] << 24);
    if (hlen > NPY_MAX_HEADER) {
        mgt_errf(err,
                 "%s: the header claims %lld bytes, far more than any array's header; the "
                 "file is damaged: %s",
                 path, (long long)hlen, SAVE_HINT);
        goto fail;
    }
    if (hstart + hlen > size) {
        mgt_errf(err,
                 "%s: truncated: the header claims %lld bytes but the file holds only %lld bytes "
                 "in all; %s",
                 path, (long long)hlen, (long long)size, SAVE_HINT);
        goto fail;
    }
    char *h = malloc((size_t)hlen + 1);
    if (!h) {
        mgt_errf(err, "%s: out of memory for its header", path);
        goto fail;
    }
    const int64_t hgot = read_at(fd, h, (size_t)hlen, (off_t)hstart);
    if (hgot != hlen) {
        mgt_errf(err, "%s: cannot read its header (%s)", path,
                 hgot < 0 ? strerror(errno) : "the file shrank while it was read");
        free(h);
        goto fail;
    }
    const int bad = parse_header(path, h, (size_t)hlen, a, err);
    free(h);
    if (bad)
        goto fail;

    /* The shape times the item size must be exactly what follows the header. */
    a->offset = hstart + hlen;
    const int64_t room = size - a->offset;
    int64_t count = 1;
    for (int d = 0; d < a->ndim; d++) {
        const int64_t s = a->shape[d];
        if (s != 0 && count > INT64_MAX / a->itemsize / s) {
            mgt_errf(err,
                     "%s: the header's shape is impossibly large for the file (%lld bytes); "
                     "the file is damaged: %s",
                     path, (long long)size, SAVE_HINT);
            goto fail;
        }
        count *= s;
    }
    a->count = count;
    const int64_t need = count * a->itemsize;
    if (need != room) {
        char dims[400];
        shape_str(a, dims, sizeof dims);
        mgt_errf(err,
                 "%s: %s: shape %s of %s needs %lld bytes of data but the file holds %lld "
                 "after its header; %s",
                 path, need > room ? "truncated" : "trailing bytes", dims, a->descr,
                 (long long)need, (long long)room, SAVE_HINT);
        goto fail;
    }
    if (size > 0 && (uint64_t)size > SIZE_MAX) {
        mgt_errf(err, "%s: too large to map on this machine", path);
        goto fail;
    }
    if (need > 0) {
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            mgt_errf(err, "%s: cannot map it into memory (%s)", path, strerror(errno));
            goto fail;
        }
        a->map = m;
        a->map_len = (size_t)size;
        a->data = (const uint8_t *)m + a->offset;
    }
    close(fd); /* the mapping keeps the file */
    return 0;
fail:
    close(fd);
    return -1;
}

void mgt_npy_close(mgt_npy *a) {
    if (a->map)
        munmap(a->map, a->map_len);
    memset(a, 0, sizeof *a);
}

/* ---- datasets ------------------------------------------------------------------------------ */

static int64_t read_int(const uint8_t *p, const mgt_npy *a, int *too_big) {
    uint8_t b[8];
    for (int k = 0; k < a->itemsize; k++)
        b[k] = p[a->big_endian ? a->itemsize - 1 - k : k];
    *too_big = 0;
    switch (a->itemsize) {
    case 1:
        return a->kind == 'i' ? (int64_t)(int8_t)b[0] : (int64_t)b[0];
    case 2: {
        uint16_t v;
        memcpy(&v, b, 2);
        return a->kind == 'i' ? (int64_t)(int16_t)v : (int64_t)v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, b, 4);
        return a->kind == 'i' ? (int64_t)(int32_t)v : (int64_t)v;
    }
    default: {
        uint64_t v;
        memcpy(&v, b, 8);
        if (a->kind == 'u' && v > (uint64_t)INT64_MAX) {
            *too_big = 1;
            return INT64_MAX;
        }
        return (int64_t)v;
    }
    }
}

/* The inputs of a split: images (N, H, W, C) or (N, H, W), or rows of values (N, F), uint8 or
 * float32, matching the model (a row of F values is a sample of shape (1, 1, F)). */
static int check_images(const char *path, const mgt_npy *x, int h, int w, int c, mgt_err *err) {
    char dt[64], sh[400];
    shape_str(x, sh, sizeof sh);
    const int rows = h == 1 && w == 1; /* the model reads rows of c values */
    if (!((x->kind == 'u' && x->itemsize == 1) || (x->kind == 'f' && x->itemsize == 4)))
        return mgt_errf(err,
                        "%s: dtype %s; save the %s as uint8 (0-255, scaled by 1/255 as IDX "
                        "is) or float32 (taken as they are): x.astype(np.float32)",
                        path, mgt_npy_dtype_name(x, dt, sizeof dt), rows ? "rows" : "images");
    if (x->ndim == 2 ? !(rows || h <= 0) : x->ndim != 3 && x->ndim != 4) {
        if (rows)
            return mgt_errf(err,
                            "%s: shape %s; the model reads rows of %d values: save an array of "
                            "shape (N, %d), e.g. x.reshape(len(x), -1)",
                            path, sh, c, c);
        return mgt_errf(err,
                        "%s: shape %s; images need shape (N, H, W, C) or (N, H, W) for one "
                        "channel (rows of values: (N, F) for a model of [input] shape = F): "
                        "reshape, e.g. x.reshape(-1, %d, %d, %d) for the model's input",
                        path, sh, h > 0 ? h : 28, w > 0 ? w : 28, c > 0 ? c : 1);
    }
    if (x->shape[0] < 1)
        return mgt_errf(err, "%s: shape %s holds no samples; save a non-empty array", path, sh);
    const int64_t xh = x->ndim == 2 ? 1 : x->shape[1], xw = x->ndim == 2 ? 1 : x->shape[2];
    const int64_t xc = x->ndim == 4 ? x->shape[3] : x->ndim == 2 ? x->shape[1] : 1;
    if (xh < 1 || xw < 1 || xc < 1 || xh > INT_MAX || xw > INT_MAX || xc > INT_MAX)
        return mgt_errf(err,
                        "%s: shape %s: an image needs a height, width and channel count of "
                        "at least 1 (a row at least one value)",
                        path, sh);
    if (h > 0 && x->ndim == 2 && xc != c)
        return mgt_errf(err,
                        "%s: rows of %lld values but the model's [input] shape is %d; use a "
                        "model whose input matches the data",
                        path, (long long)xc, c);
    if (h > 0 && (xh != h || xw != w || xc != c)) {
        /* Channels-first data (PyTorch's layout) is the common way to get here. */
        const int chw = x->ndim == 4 && x->shape[1] == c && x->shape[2] == h && x->shape[3] == w;
        if (rows)
            return mgt_errf(err,
                            "%s: images of %lldx%lldx%lld (H, W, C) but the model reads rows "
                            "of %d values ([input] shape = %d); flatten them (x.reshape(len(x), "
                            "-1)) or use a model of [input] shape = H,W,C",
                            path, (long long)xh, (long long)xw, (long long)xc, c, c);
        return mgt_errf(err,
                        "%s: images are %lldx%lldx%lld (H, W, C) but the model's [input] shape "
                        "is %d,%d,%d; %s",
                        path, (long long)xh, (long long)xw, (long long)xc, h, w, c,
                        chw ? "the array looks channels-first (N, C, H, W): save "
                              "x.transpose(0, 2, 3, 1)"
                            : "use a model whose input matches the data");
    }
    return 0;
}

/* One value of a numeric array (bool, integers, float16/32/64) as a float32. -1 for a dtype that
 * holds no number. */
static int read_float(const uint8_t *p, const mgt_npy *a, float *out) {
    uint8_t b[8];
    if (a->itemsize > 8)
        return -1;
    for (int k = 0; k < a->itemsize; k++)
        b[k] = p[a->big_endian ? a->itemsize - 1 - k : k];
    if (a->kind == 'f' && a->itemsize == 4) {
        memcpy(out, b, 4);
        return 0;
    }
    if (a->kind == 'f' && a->itemsize == 8) {
        double d;
        memcpy(&d, b, 8);
        *out = (float)d;
        return 0;
    }
    if (a->kind == 'f' && a->itemsize == 2) { /* IEEE half */
        const unsigned h = (unsigned)b[0] | (unsigned)b[1] << 8, e = (h >> 10) & 31, f = h & 1023;
        const float v = e == 0    ? ldexpf((float)f, -24)
                        : e == 31 ? (f ? NAN : INFINITY)
                                  : ldexpf((float)(f | 1024), (int)e - 25);
        *out = h & 0x8000 ? -v : v;
        return 0;
    }
    if (a->kind == 'b' && a->itemsize == 1) {
        *out = b[0] ? 1.0f : 0.0f;
        return 0;
    }
    if ((a->kind == 'i' || a->kind == 'u') &&
        (a->itemsize == 1 || a->itemsize == 2 || a->itemsize == 4 || a->itemsize == 8)) {
        int too_big;
        const int64_t v = read_int(p, a, &too_big);
        *out = too_big ? (float)UINT64_MAX : (float)v;
        return 0;
    }
    return -1;
}

/* The targets of a split for the losses that read float values (mse, binary_crossentropy, ...):
 * any numeric dtype, shape (N, ...) with `elems` values a sample ((N,) for one), converted once
 * into float32 in ds->targets. Every value must be finite. */
static int load_targets(mgt_dataset *ds, const char *path, const mgt_npy *y, const char *xpath,
                        int64_t n, int elems, mgt_err *err) {
    char dt[64], sh[400];
    shape_str(y, sh, sizeof sh);
    float probe;
    if (y->count > 0 ? read_float(y->data, y, &probe) < 0
                     : !strchr("biuf", y->kind))
        return mgt_errf(err,
                        "%s: dtype %s; the loss reads numbers: save the targets as float32 "
                        "(y.astype(np.float32))",
                        path, mgt_npy_dtype_name(y, dt, sizeof dt));
    int64_t per = 1;
    for (int d = 1; d < y->ndim; d++)
        per *= y->shape[d];
    if (y->ndim < 1 || y->shape[0] != n) {
        if (y->ndim >= 1)
            return mgt_errf(err,
                            "%s holds %lld samples but %s holds %lld targets; save the inputs and "
                            "targets of the same samples",
                            xpath, (long long)n, path, (long long)y->shape[0]);
        return mgt_errf(err, "%s: shape %s; targets need shape (N, ...)", path, sh);
    }
    if (per != elems)
        return mgt_errf(err,
                        "%s: shape %s gives %lld values a sample, but the model's last layer "
                        "gives %d; save targets of the output's shape, (N, %d)%s",
                        path, sh, (long long)per, elems, elems,
                        elems == 1 ? " or (N,)" : "");
    if (n < 1 || (uint64_t)n > SIZE_MAX / sizeof(float) / (size_t)elems)
        return mgt_errf(err, "%s: %lld targets cannot be held in memory", path, (long long)n);
    float *t = malloc(sizeof(float) * (size_t)n * (size_t)elems);
    if (!t)
        return mgt_errf(err, "%s: out of memory for %lld targets", path, (long long)n);
    for (int64_t i = 0; i < n * elems; i++) {
        read_float(y->data + i * y->itemsize, y, &t[i]);
        if (!isfinite(t[i])) {
            const float v = t[i];
            free(t);
            return mgt_errf(err,
                            "%s: target %lld of sample %lld is %s%s; fix the targets (every "
                            "one must be a finite float32)",
                            path, (long long)(i % elems), (long long)(i / elems),
                            isnan(v) ? "NaN" : "infinite",
                            y->kind == 'f' && y->itemsize == 8 && !isnan(v) ? " as a float32"
                                                                            : "");
        }
    }
    ds->targets = t;
    ds->target_elems = elems;
    return 0;
}

/* The labels of a split: integers, shape (N,) or (N, 1), each in [0, classes). Converted into
 * ds->labels (bytes) or ds->labels32. */
static int load_labels(mgt_dataset *ds, const char *path, const mgt_npy *y, const char *xpath,
                       int64_t n, int classes, mgt_err *err) {
    char dt[64], sh[400];
    shape_str(y, sh, sizeof sh);
    if (!((y->kind == 'i' || y->kind == 'u') &&
          (y->itemsize == 1 || y->itemsize == 2 || y->itemsize == 4 || y->itemsize == 8)))
        return mgt_errf(err,
                        "%s: dtype %s; labels are class indices: save them as integers "
                        "(y.astype(np.int64))",
                        path, mgt_npy_dtype_name(y, dt, sizeof dt));
    if (y->ndim == 2 && y->shape[1] > 1)
        return mgt_errf(err,
                        "%s: shape %s; one class index per sample is needed, shape (N,): for "
                        "one-hot labels save y.argmax(axis=1)",
                        path, sh);
    if (y->ndim != 1 && !(y->ndim == 2 && y->shape[1] == 1))
        return mgt_errf(err, "%s: shape %s; labels need shape (N,) (or (N, 1)): save y.ravel()",
                        path, sh);
    if (y->shape[0] != n)
        return mgt_errf(err,
                        "%s holds %lld samples but %s holds %lld labels; save the images and "
                        "labels of the same samples",
                        xpath, (long long)n, path, (long long)y->shape[0]);
    if (n < 1 || (uint64_t)n > SIZE_MAX / sizeof(int32_t)) /* checked with the images already */
        return mgt_errf(err, "%s: %lld labels cannot be held in memory", path, (long long)n);
    int64_t maxl = 0;
    for (int64_t i = 0; i < n; i++) {
        int too_big;
        const int64_t l = read_int(y->data + i * y->itemsize, y, &too_big);
        if (l < 0)
            return mgt_errf(err,
                            "%s: label %lld at index %lld is negative; labels are class indices "
                            "from 0 to the number of classes - 1",
                            path, (long long)l, (long long)i);
        if (too_big || l >= INT32_MAX)
            return mgt_errf(err,
                            "%s: label %s%lld at index %lld is too large for a class index; fix "
                            "the labels",
                            path, too_big ? "above " : "", (long long)l, (long long)i);
        if (classes > 0 && l >= classes)
            return mgt_errf(err,
                            "%s: label %lld at index %lld is not below the model's %d classes; "
                            "use a model with at least %lld outputs or fix the labels",
                            path, (long long)l, (long long)i, classes, (long long)l + 1);
        if (l > maxl)
            maxl = l;
    }
    const int bytes = maxl < 256;
    void *buf = malloc((size_t)n * (bytes ? 1 : sizeof(int32_t)));
    if (!buf)
        return mgt_errf(err, "%s: out of memory for %lld labels", path, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        int too_big;
        const int64_t l = read_int(y->data + i * y->itemsize, y, &too_big);
        if (bytes)
            ((uint8_t *)buf)[i] = (uint8_t)l;
        else
            ((int32_t *)buf)[i] = (int32_t)l;
    }
    if (bytes)
        ds->labels = buf;
    else
        ds->labels32 = buf;
    ds->classes = classes > 0 ? classes : (int)maxl + 1;
    return 0;
}

int mgt_npy_split_path(char *out, size_t cap, const char *dir, const char *split, char xy) {
    const int len = snprintf(out, cap, "%s/%s_%c.npy", dir, split, xy);
    return len < 0 || (size_t)len >= cap ? -1 : 0;
}

int mgt_dataset_load_npy(mgt_dataset *ds, const char *dir, const char *split, int h, int w, int c,
                         int classes, int targets, mgt_err *err) {
    memset(ds, 0, sizeof *ds);
    char xpath[sizeof ds->source], ypath[sizeof ds->source];
    if (mgt_npy_split_path(xpath, sizeof xpath, dir, split, 'x') ||
        mgt_npy_split_path(ypath, sizeof ypath, dir, split, 'y'))
        return mgt_errf(err, "%s: path too long for a data folder", dir);
    struct stat st;
    for (int k = 0; k < 2; k++) {
        const char *p = k ? ypath : xpath;
        if (stat(p, &st) != 0 && errno == ENOENT) {
            if (!strcmp(split, "test"))
                return mgt_errf(err,
                                "no %s in %s: save a test split as test_x.npy and test_y.npy "
                                "beside train_x.npy, or validate on part of the training data "
                                "with --val-split 0.1",
                                strrchr(p, '/') + 1, dir);
            return mgt_errf(err,
                            "no %s in %s: a .npy data folder holds %s_x.npy (images, N x H x W "
                            "x C) and %s_y.npy (integer labels, N) for each split",
                            strrchr(p, '/') + 1, dir, split, split);
        }
    }
    mgt_npy x, y;
    if (mgt_npy_open(&x, xpath, err))
        return -1;
    if (check_images(xpath, &x, h, w, c, err))
        goto fail_x;
    if (mgt_npy_open(&y, ypath, err))
        goto fail_x;
    if (targets > 0 ? load_targets(ds, ypath, &y, xpath, x.shape[0], targets, err)
                    : load_labels(ds, ypath, &y, xpath, x.shape[0], classes, err)) {
        mgt_npy_close(&y);
        goto fail_x;
    }
    mgt_npy_close(&y);

    ds->n = x.shape[0];
    ds->h = x.ndim == 2 ? 1 : (int)x.shape[1];
    ds->w = x.ndim == 2 ? 1 : (int)x.shape[2];
    ds->c = x.ndim == 4 ? (int)x.shape[3] : x.ndim == 2 ? (int)x.shape[1] : 1;
    if (targets > 0)
        ds->classes = classes;
    if (x.kind == 'u')
        ds->pixels = (uint8_t *)x.data; /* read-only pages: never written through */
    else {
        ds->fpixels = x.data;
        ds->fswap = x.big_endian;
    }
    ds->map = x.map;
    ds->map_len = x.map_len;
    ds->owned = 1;
    snprintf(ds->source, sizeof ds->source, "%s", xpath);
    return 0;
fail_x: /* nothing of ds is owned yet: it is left empty */
    mgt_npy_close(&x);
    memset(ds, 0, sizeof *ds);
    return -1;
}
