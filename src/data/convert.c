/* convert.c: an image folder into a sharded image set (see convert.h).
 *
 * The work: walk SRC (every file, sorted), cut the file list into shards of a fixed number of
 * files, keep the shards a previous run finished from the same files, and decode the others on a
 * pool of threads. Images are claimed one at a time in file order, so all threads work on the
 * same shard (two at most, bounding memory to two shards' bytes) and a one-shard tree uses every
 * core; each image's bytes depend on its file alone, and a shard is written, by the thread that
 * finishes it, as its files' images in file order, so no thread count changes a byte. The main
 * thread only draws the progress.
 *
 * A file that cannot be read or decoded stops the conversion (the shards finished so far stay,
 * so the same command goes on from them once the file is fixed or removed), or with --skip-bad is
 * left out of its shard and listed. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "convert.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../metrics.h"
#include "../outputs.h"
#include "../rundir.h"
#include "../runtime.h"
#include "../tensor_io.h"
#include "decode.h"
#include "images.h"
#include "npy.h"
#include "resample.h"

enum {
    MAX_DEPTH = 64,   /* folders below a class folder, at most */
    IN_FLIGHT = 2,    /* shards decoded at once */
    SHOW_SKIPPED = 20 /* skipped files named in the summary (all are in <split>_skipped.txt) */
};

/* ---- the source tree ----------------------------------------------------------------------- */

/* One file of SRC: its path (SRC/class/...), where its folder's part ends, its class, and what
 * identifies its content for resuming. */
typedef struct src_file {
    char *path;
    size_t dirlen; /* path[0, dirlen) is its folder, without the final '/' */
    int label;
    int64_t size; /* -1: not a regular file */
    int64_t mtime_ns;
    const char *kind; /* not a regular file: what it is, for the message */
} src_file;

typedef struct tree {
    src_file *f;
    int64_t n, cap;
    char **classes;
    int nclasses;
    int64_t loose; /* files directly in SRC, in no class folder */
} tree;

static int add_file(tree *t, const char *path, size_t dirlen, int label, const struct stat *sb,
                    const char *kind, mgt_err *err) {
    if (t->n == t->cap) {
        const int64_t cap = t->cap ? 2 * t->cap : 1024;
        src_file *f = realloc(t->f, sizeof *f * (size_t)cap);
        if (!f)
            return mgt_errf(err, "out of memory listing %lld files", (long long)t->n);
        t->f = f;
        t->cap = cap;
    }
    src_file *s = &t->f[t->n];
    if (!(s->path = strdup(path)))
        return mgt_errf(err, "out of memory listing %lld files", (long long)t->n);
    s->dirlen = dirlen;
    s->label = label;
    s->kind = kind;
    s->size = sb && S_ISREG(sb->st_mode) ? (int64_t)sb->st_size : -1;
    s->mtime_ns = sb ? (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec : 0;
    t->n++;
    return 0;
}

static const char *kind_of(mode_t m) {
    return S_ISFIFO(m)                ? "not a regular file (a FIFO)"
           : S_ISSOCK(m)              ? "not a regular file (a socket)"
           : S_ISCHR(m) || S_ISBLK(m) ? "not a regular file (a device)"
                                      : "not a regular file";
}

/* Every file below the folder `path` (of class `label`), recursively. `up` holds the folders
 * on the way down (a symbolic link back to one of them would never end). */
static int walk(tree *t, const char *path, int label, int depth, const struct stat *up,
                mgt_err *err) {
    DIR *dh = opendir(path);
    if (!dh)
        return mgt_errf(err, "%s: cannot list this folder (%s); check its permissions", path,
                        strerror(errno));
    struct stat chain[MAX_DEPTH + 1];
    memcpy(chain, up, sizeof *up * (size_t)(depth + 1));
    const size_t plen = strlen(path);
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(dh));) {
        if (e->d_name[0] == '.') /* ".", "..", and hidden files (.DS_Store) */
            continue;
        char *p = malloc(plen + strlen(e->d_name) + 2);
        if (!p) {
            rc = mgt_errf(err, "out of memory listing %s", path);
            break;
        }
        sprintf(p, "%s/%s", path, e->d_name);
        struct stat sb;
        if (stat(p, &sb) != 0) {
            rc = add_file(t, p, plen, label, NULL,
                          errno == ENOENT ? "a broken symbolic link" : "cannot be read", err);
        } else if (S_ISDIR(sb.st_mode)) {
            for (int d = 0; d <= depth && rc == 0; d++)
                if (chain[d].st_dev == sb.st_dev && chain[d].st_ino == sb.st_ino)
                    rc = mgt_errf(err,
                                  "%s: a symbolic link loop (it leads back to a folder above "
                                  "it); remove the link",
                                  p);
            if (rc == 0 && depth + 1 >= MAX_DEPTH)
                rc = mgt_errf(err, "%s: more than %d folders deep below its class folder", p,
                              MAX_DEPTH);
            if (rc == 0) {
                chain[depth + 1] = sb;
                rc = walk(t, p, label, depth + 1, chain, err);
            }
        } else {
            rc = add_file(t, p, plen, label, &sb, S_ISREG(sb.st_mode) ? NULL : kind_of(sb.st_mode),
                          err);
        }
        free(p);
    }
    closedir(dh);
    return rc;
}

/* The next character of a file name as Python sees it (os.scandir's str, decoded from UTF-8 with
 * the surrogateescape handler): a code point of a well-formed UTF-8 sequence, or, for a byte that
 * starts none, U+DC00 + the byte. Advances *p. */
static uint32_t py_char(const unsigned char **p, const unsigned char *end) {
    const unsigned char *s = *p;
    const unsigned b = s[0];
    int n = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3
                       : b >= 0xF0 && b <= 0xF4                                  ? 4
                                                                                 : 0;
    /* the second byte's range (no overlong forms, no surrogates, nothing past U+10FFFF) */
    const unsigned lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
    if (n > 1 && (end - s < n || s[1] < lo || s[1] > hi))
        n = 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            n = 0;
    if (n == 0) {
        *p = s + 1;
        return 0xDC00 + b;
    }
    *p = s + n;
    if (n == 1)
        return b;
    uint32_t c = b & (0x7F >> n);
    for (int i = 1; i < n; i++)
        c = c << 6 | (s[i] & 0x3F);
    return c;
}

/* Python's order of two names (str comparison: code point by code point, a prefix first). */
static int py_cmp(const char *a, size_t an, const char *b, size_t bn) {
    const unsigned char *p = (const unsigned char *)a, *pe = p + an;
    const unsigned char *q = (const unsigned char *)b, *qe = q + bn;
    while (p < pe && q < qe) {
        const uint32_t x = py_char(&p, pe), y = py_char(&q, qe);
        if (x != y)
            return x < y ? -1 : 1;
    }
    return p < pe ? 1 : q < qe ? -1 : 0;
}

/* torchvision's order (ImageFolder's make_dataset: sorted(os.walk(...)), then sorted(files)):
 * folders by path, then files by name within a folder, each compared as Python compares str. */
static int by_place(const void *pa, const void *pb) {
    const src_file *a = pa, *b = pb;
    const int c = py_cmp(a->path, a->dirlen, b->path, b->dirlen);
    if (c)
        return c;
    const char *na = a->path + a->dirlen + 1, *nb = b->path + b->dirlen + 1;
    return py_cmp(na, strlen(na), nb, strlen(nb));
}

/* Class folders as ImageFolder's find_classes sorts them: sorted() of Python str. */
static int by_name(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    return py_cmp(x, strlen(x), y, strlen(y));
}

static void tree_free(tree *t) {
    for (int64_t i = 0; i < t->n; i++)
        free(t->f[i].path);
    free(t->f);
    for (int i = 0; i < t->nclasses; i++)
        free(t->classes[i]);
    free(t->classes);
    memset(t, 0, sizeof *t);
}

/* SRC's class folders (sorted), then every file of each. */
static int list_tree(tree *t, const char *src, mgt_err *err) {
    memset(t, 0, sizeof *t);
    struct stat top;
    if (stat(src, &top) != 0)
        return mgt_errf(err, "%s: %s; give the folder of class folders (SRC/cat/1.jpg, ...)", src,
                        strerror(errno));
    if (!S_ISDIR(top.st_mode))
        return mgt_errf(err,
                        "%s is not a folder; give the folder that holds one folder per class "
                        "(SRC/cat/1.jpg, SRC/dog/2.png, ...)",
                        src);
    DIR *dh = opendir(src);
    if (!dh)
        return mgt_errf(err, "%s: cannot list this folder (%s)", src, strerror(errno));
    int cap = 0;
    for (struct dirent *e; (e = readdir(dh));) {
        if (e->d_name[0] == '.')
            continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", src, e->d_name);
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            t->loose++;
            continue;
        }
        if (t->nclasses == cap) {
            cap = cap ? 2 * cap : 64;
            char **c = realloc(t->classes, sizeof *c * (size_t)cap);
            if (!c) {
                closedir(dh);
                return mgt_errf(err, "out of memory listing %s", src);
            }
            t->classes = c;
        }
        if (!(t->classes[t->nclasses] = strdup(e->d_name))) {
            closedir(dh);
            return mgt_errf(err, "out of memory listing %s", src);
        }
        t->nclasses++;
    }
    closedir(dh);
    if (t->nclasses == 0)
        return mgt_errf(err,
                        "%s has no class folders: it must hold one folder per class, each with "
                        "that class's images (SRC/cat/1.jpg, SRC/dog/2.png, ...), as Keras' "
                        "flow_from_directory and torchvision's ImageFolder read them",
                        src);
    qsort(t->classes, (size_t)t->nclasses, sizeof *t->classes, by_name);
    for (int c = 0; c < t->nclasses; c++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", src, t->classes[c]);
        const int64_t before = t->n;
        struct stat chain[1];
        if (stat(p, &chain[0]) != 0)
            return mgt_errf(err, "%s: %s", p, strerror(errno));
        if (walk(t, p, c, 0, chain, err) < 0)
            return -1;
        if (t->n == before)
            return mgt_errf(err,
                            "%s: a class folder with no files; add its images or remove the "
                            "folder (classes are numbered from the folders)",
                            p);
        qsort(t->f + before, (size_t)(t->n - before), sizeof *t->f, by_place);
    }
    return 0;
}

/* ---- the image set's files ----------------------------------------------------------------- */

/* 64-bit FNV-1a over bytes, continuing from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* A shard's signature: the stored size and layout and, for each of its files, the path below SRC, the
 * class, the size and the modification time. */
static uint64_t shard_hash(const tree *t, size_t srclen, int size, int square, int64_t first,
                           int64_t n) {
    uint64_t h = fnv(0xcbf29ce484222325ULL, &size, sizeof size);
    if (square) /* (the whole layout's hash is the square one's of old sets, which they are not) */
        h = fnv(h, "square", 6);
    for (int64_t i = first; i < first + n; i++) {
        const src_file *f = &t->f[i];
        const char *rel = f->path + srclen;
        h = fnv(h, rel, strlen(rel) + 1);
        h = fnv(h, t->classes[f->label], strlen(t->classes[f->label]) + 1);
        h = fnv(h, &f->size, sizeof f->size);
        h = fnv(h, &f->mtime_ns, sizeof f->mtime_ns);
    }
    return mgt_mix64(h);
}

static void shard_path(char *out, size_t cap, const char *dst, const char *split, int64_t k,
                       const char *suffix) {
    snprintf(out, cap, "%s/%s-%05lld%s", dst, split, (long long)k, suffix);
}

/* Whether shard k of DST is finished and made from these files: its record names the same
 * signature and file count, and its arrays have the shapes the record says. Fills *images and
 * appends its skipped files to `skipped` (a cJSON array, unless NULL) when so. Without skip_bad
 * a shard that left files out is not what this run would make. */
static int shard_done(const char *dst, const char *split, int64_t k, uint64_t hash, int64_t files,
                      int size, int square, int skip_bad, int64_t *images, int64_t *bytes,
                      cJSON *skipped) {
    char path[PATH_MAX], *text = NULL;
    shard_path(path, sizeof path, dst, split, k, ".json");
    mgt_err e;
    if (access(path, F_OK) != 0 ||
        mgt_read_text_file(path, "shard record", 1 << 26, &text, NULL, &e) < 0)
        return 0;
    cJSON *j = cJSON_Parse(text);
    free(text);
    char want[32];
    snprintf(want, sizeof want, "%016" PRIx64, hash);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "signature");
    const cJSON *nf = cJSON_GetObjectItemCaseSensitive(j, "files");
    const cJSON *ni = cJSON_GetObjectItemCaseSensitive(j, "images");
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(j, "skipped");
    int ok = cJSON_IsString(h) && !strcmp(h->valuestring, want) && cJSON_IsNumber(nf) &&
             nf->valuedouble == (double)files && cJSON_IsNumber(ni) && ni->valuedouble >= 0 &&
             ni->valuedouble <= (double)files && cJSON_IsArray(sk) &&
             (double)cJSON_GetArraySize(sk) == (double)files - ni->valuedouble &&
             (skip_bad || cJSON_GetArraySize(sk) == 0);
    for (const cJSON *s = ok ? sk->child : NULL; s; s = s->next)
        ok = ok && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "path")) &&
             cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "error"));
    const int64_t n = ok ? (int64_t)ni->valuedouble : 0;
    mgt_npy a[3];
    int opened = 0;
    for (; ok && opened < (square ? 2 : 3); opened++) {
        shard_path(path, sizeof path, dst, split, k,
                   opened == 0 ? "_x.npy" : opened == 1 ? "_y.npy" : "_i.npy");
        ok = mgt_npy_open(&a[opened], path, &e) == 0;
        if (!ok)
            break;
    }
    if (ok)
        ok = a[1].kind == 'i' && a[1].itemsize == 4 && a[1].ndim == 1 && a[1].shape[0] == n &&
             (square ? a[0].kind == 'u' && a[0].itemsize == 1 && a[0].ndim == 4 &&
                           a[0].shape[0] == n && a[0].shape[1] == size &&
                           a[0].shape[2] == size && a[0].shape[3] == 3
                     : mgt_images_index_ok(&a[0], &a[2], n, size, &e) == 0);
    if (ok)
        *bytes = a[0].count;
    while (opened-- > 0)
        mgt_npy_close(&a[opened]);
    if (ok) {
        *images = n;
        for (const cJSON *s = sk->child; skipped && s; s = s->next)
            cJSON_AddItemToArray(skipped, cJSON_Duplicate(s, 1));
    }
    cJSON_Delete(j);
    return ok;
}

/* ---- the workers --------------------------------------------------------------------------- */

typedef struct buffer {
    int64_t shard; /* the shard it holds (-1: free) */
    int64_t first, count, done;
    uint8_t **img;     /* count images, each its own memory (NULL: left out) */
    int64_t (*dims)[4]; /* each one's stored height and width, and the original's */
    int32_t *labels;
    char **bad; /* per file: why it was left out, or NULL */
} buffer;

typedef struct job {
    const mgt_convert_opts *o;
    const tree *t;
    size_t srclen;
    int64_t per_shard, nshards;
    uint64_t *hash;
    int64_t *todo, ntodo; /* the shards to make, in order */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    buffer buf[IN_FLIGHT];
    int64_t next_t, next_i; /* the next image to claim: todo shard next_t, its file next_i */
    int64_t converted;      /* images finished (for the progress) */
    int64_t shards_written;
    int stop;         /* an error: claim nothing more */
    int64_t err_file; /* the file of the first error (-1: none) */
    mgt_err err;
    int running; /* workers not yet finished */
} job;

typedef struct worker {
    job *j;
    uint8_t *file;
    size_t file_cap;
    mgt_rgb img;
    mgt_resample_work rw;
} worker;

/* The file's bytes into w->file; -1 with why in err. */
static int read_file(worker *w, const src_file *f, size_t *len, mgt_err *err) {
    if (f->kind)
        return mgt_errf(err, "%s", f->kind);
    FILE *fp = fopen(f->path, "rb");
    if (!fp)
        return mgt_errf(err, "cannot open it (%s)", strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || sb.st_size < 0) {
        fclose(fp);
        return mgt_errf(err, "cannot read its size (%s)", strerror(errno));
    }
    /* Its first bytes and its size say whether it can be an image, before it is read whole. */
    uint8_t head[MGT_DECODE_HEAD];
    const size_t hn = fread(head, 1, sizeof head, fp);
    if (mgt_decode_sniff(head, hn, (int64_t)sb.st_size, err) < 0) {
        fclose(fp);
        return -1;
    }
    rewind(fp);
    const size_t n = (size_t)sb.st_size;
    if (n + 1 > w->file_cap) {
        uint8_t *p = realloc(w->file, n + 1);
        if (!p) {
            fclose(fp);
            return mgt_errf(err, "out of memory for its %zu bytes", n);
        }
        w->file = p;
        w->file_cap = n + 1;
    }
    const size_t got = fread(w->file, 1, n, fp);
    const int e = ferror(fp) ? errno : 0;
    fclose(fp);
    if (got != n)
        return mgt_errf(err, "cannot read it (%s)", e ? strerror(e) : "it shrank while read");
    *len = n;
    return 0;
}

/* Decoded and resized into *out (memory of its own) with its sides in dims (stored h, w, then
 * the original's). Square layout: its short side resized to `size` and its centre size x size
 * kept, torchvision's Resize(size) then CenterCrop(size). Whole layout: the whole picture, its
 * short side resized to `size` (torchvision's Resize(size)) where it is longer, else as it is. */
static int convert_one(worker *w, const src_file *f, int size, int square, uint8_t **out,
                       int64_t dims[4], mgt_err *err) {
    size_t len = 0;
    if (read_file(w, f, &len, err) < 0 || mgt_decode(w->file, len, &w->img, err) < 0)
        return -1;
    const int iw = w->img.w, ih = w->img.h;
    /* torchvision's long side, int(size * long / short): at most 2^24 (an aspect ratio of
     * 65536:1 at 256), so it is an int */
    const double lng = (double)size * (iw <= ih ? ih : iw) / (iw <= ih ? iw : ih);
    if (lng > (double)(1 << 24))
        return mgt_errf(err, "a %d x %d image, too narrow to resize to a %d-pixel short side", iw,
                        ih, size);
    int rw = size, rh = size;
    if (iw <= ih)
        rh = (int)lng;
    else
        rw = (int)lng;
    int x0 = (int)nearbyint((rw - size) / 2.0), y0 = (int)nearbyint((rh - size) / 2.0);
    int ow = size, oh = size;
    if (!square) { /* the whole of it, resized only where its short side is longer than size */
        if ((iw < ih ? iw : ih) <= size)
            rw = iw, rh = ih;
        x0 = y0 = 0, ow = rw, oh = rh;
    }
    if (!(*out = malloc((size_t)ow * (size_t)oh * 3)))
        return mgt_errf(err, "out of memory for its %d x %d stored pixels", ow, oh);
    if (mgt_resample_u8(w->img.px, iw, ih, (size_t)iw * 3, 3, rw, rh, x0, y0, ow, oh, *out,
                        &w->rw) < 0) {
        free(*out);
        *out = NULL;
        return mgt_errf(err, "out of memory resizing it");
    }
    dims[0] = oh, dims[1] = ow, dims[2] = ih, dims[3] = iw;
    return 0;
}

/* The finished shard in b into DST: images, labels, then its record (which marks it done). */
static int write_shard(job *j, buffer *b, mgt_err *err) {
    const mgt_convert_opts *o = j->o;
    const int64_t k = b->shard;
    int64_t n = 0;
    const void **parts = malloc(sizeof *parts * (size_t)(b->count ? b->count : 1));
    size_t *lens = malloc(sizeof *lens * (size_t)(b->count ? b->count : 1));
    int32_t *labels = malloc(sizeof *labels * (size_t)(b->count ? b->count : 1));
    cJSON *rec = cJSON_CreateObject(), *skipped = cJSON_CreateArray();
    int rc = 0;
    if (!parts || !lens || !labels || !rec || !skipped) {
        rc = mgt_errf(err, "out of memory writing a shard");
        goto done;
    }
    int64_t *index = malloc(sizeof(int64_t) * MGT_IMAGES_INDEX_COLS * (size_t)(b->count + 1));
    int64_t at = 0;
    for (int64_t i = 0; index && i < b->count; i++) {
        if (b->bad[i]) {
            cJSON *s = cJSON_CreateObject();
            cJSON_AddStringToObject(s, "path", j->t->f[b->first + i].path);
            cJSON_AddStringToObject(s, "error", b->bad[i]);
            cJSON_AddItemToArray(skipped, s);
            continue;
        }
        const int64_t *d = b->dims[i];
        const int64_t row[MGT_IMAGES_INDEX_COLS] = {at, d[0], d[1], d[2], d[3]};
        memcpy(index + MGT_IMAGES_INDEX_COLS * n, row, sizeof row);
        parts[n] = b->img[i];
        lens[n] = (size_t)(d[0] * d[1] * 3);
        at += (int64_t)lens[n];
        labels[n++] = b->labels[i];
    }
    char path[PATH_MAX], sig[32];
    /* square: (n, size, size, 3); whole: the images' bytes one after the other, and the index */
    const int64_t xshape[4] = {n, o->size, o->size, 3}, flat[1] = {at};
    const int64_t ishape[2] = {n, MGT_IMAGES_INDEX_COLS};
    shard_path(path, sizeof path, o->dst, o->split, k, "_x.npy");
    if (!index)
        rc = mgt_errf(err, "out of memory writing a shard");
    else if (mgt_npy_write_parts(path, "|u1", o->square ? xshape : flat, o->square ? 4 : 1, (int)n,
                                 parts, lens, err) < 0)
        rc = -1;
    if (rc == 0 && !o->square) {
        const void *ip[1] = {index};
        const size_t il[1] = {sizeof(int64_t) * MGT_IMAGES_INDEX_COLS * (size_t)n};
        shard_path(path, sizeof path, o->dst, o->split, k, "_i.npy");
        rc = mgt_npy_write_parts(path, "<i8", ishape, 2, 1, ip, il, err);
    }
    free(index);
    if (rc < 0)
        goto done;
    const void *lp[1] = {labels};
    const size_t ll[1] = {sizeof(int32_t) * (size_t)n};
    shard_path(path, sizeof path, o->dst, o->split, k, "_y.npy");
    if (mgt_npy_write_parts(path, "<i4", &n, 1, 1, lp, ll, err) < 0) {
        rc = -1;
        goto done;
    }
    snprintf(sig, sizeof sig, "%016" PRIx64, j->hash[k]);
    cJSON_AddNumberToObject(rec, "shard", (double)k);
    cJSON_AddStringToObject(rec, "signature", sig);
    cJSON_AddNumberToObject(rec, "files", (double)b->count);
    cJSON_AddNumberToObject(rec, "images", (double)n);
    cJSON_AddNumberToObject(rec, "size", o->size);
    cJSON_AddStringToObject(rec, "layout", o->square ? "square" : "whole");
    cJSON_AddItemToObject(rec, "skipped", skipped);
    skipped = NULL;
    char *text = cJSON_Print(rec);
    shard_path(path, sizeof path, o->dst, o->split, k, ".json");
    rc = text ? mgt_atomic_write(path, text, strlen(text), err)
              : mgt_errf(err, "out of memory writing a shard record");
    free(text);
done:
    cJSON_Delete(skipped);
    cJSON_Delete(rec);
    free(parts);
    free(lens);
    free(labels);
    return rc;
}

/* Whether todo shard t has a buffer (taking a free one for it); under the lock. */
static buffer *buffer_for(job *j, int64_t t) {
    buffer *b = &j->buf[t % IN_FLIGHT];
    if (b->shard == j->todo[t])
        return b;
    if (b->shard != -1)
        return NULL; /* still held by the shard IN_FLIGHT before */
    const int64_t k = j->todo[t];
    b->shard = k;
    b->first = k * j->per_shard;
    b->count = j->t->n - b->first < j->per_shard ? j->t->n - b->first : j->per_shard;
    b->done = 0;
    for (int64_t i = 0; i < b->count; i++) {
        free(b->bad[i]);
        b->bad[i] = NULL;
        free(b->img[i]);
        b->img[i] = NULL;
    }
    return b;
}

static void fail(job *j, int64_t file, const mgt_err *e) {
    if (j->err_file < 0 || file < j->err_file) {
        j->err_file = file;
        j->err = *e;
    }
    j->stop = 1;
    pthread_cond_broadcast(&j->cv);
}

static void *work(void *arg) {
    worker *w = arg;
    job *j = w->j;
    const mgt_convert_opts *o = j->o;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        buffer *b = NULL;
        while (!j->stop && j->next_t < j->ntodo && !(b = buffer_for(j, j->next_t)))
            pthread_cond_wait(&j->cv, &j->mu);
        if (!j->stop && mgt_stop_signal()) { /* a stop signal: claim nothing more */
            j->stop = 1;
            pthread_cond_broadcast(&j->cv);
        }
        if (j->stop || j->next_t >= j->ntodo)
            break;
        const int64_t i = j->next_i;
        if (++j->next_i == b->count) {
            j->next_t++;
            j->next_i = 0;
            pthread_cond_broadcast(&j->cv); /* the next shard may find its buffer free */
        }
        pthread_mutex_unlock(&j->mu);

        const src_file *f = &j->t->f[b->first + i];
        mgt_err e;
        const int bad = convert_one(w, f, o->size, o->square, &b->img[i], b->dims[i], &e) < 0;
        b->labels[i] = f->label;

        pthread_mutex_lock(&j->mu);
        if (bad && !o->skip_bad) {
            mgt_err full;
            mgt_errf(&full,
                     "%s: %s; remove or replace the file, or pass --skip-bad to leave out such "
                     "files and list them (the shards converted so far are kept: the same "
                     "command goes on from them)",
                     f->path, e.msg);
            fail(j, b->first + i, &full);
            continue;
        }
        if (bad && !(b->bad[i] = strdup(e.msg))) {
            mgt_errf(&e, "out of memory");
            fail(j, b->first + i, &e);
            continue;
        }
        j->converted++;
        if (++b->done < b->count)
            continue;
        /* The shard's last image: write it, then give its buffer back. */
        pthread_mutex_unlock(&j->mu);
        const int wrc = write_shard(j, b, &e);
        pthread_mutex_lock(&j->mu);
        if (wrc < 0)
            fail(j, b->first, &e);
        else
            j->shards_written++;
        b->shard = -1;
        pthread_cond_broadcast(&j->cv);
    }
    j->running--;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* ---- progress ------------------------------------------------------------------------------ */

static void progress(const mgt_convert_opts *o, int verbose, int64_t done, int64_t total, double t0,
                     int *last_decile, int force) {
    /* the rate once it means something (a second in), and at the end */
    const double el = mgt_now() - t0, rate = el > 1 || force ? (double)done / el : 0;
    if (verbose == 1) {
        char cells[32];
        mgt_bar_cells(cells, 30, done, total);
        const double eta = rate > 0 ? (double)(total - done) / rate : 0;
        char tail[64] = "";
        if (rate > 0)
            snprintf(tail, sizeof tail, " - ETA: %.0fs - %.0f images/s", eta, rate);
        printf("\r%s: %lld/%lld [%s]%s\033[K", o->split, (long long)done, (long long)total, cells,
               tail);
        if (force)
            printf("\n");
        fflush(stdout);
    } else if (verbose == 2) {
        const int decile = total ? (int)(10 * done / total) : 10;
        if (decile > *last_decile || force) {
            *last_decile = decile;
            char tail[40] = "";
            if (rate > 0)
                snprintf(tail, sizeof tail, ", %.0f images/s", rate);
            printf("%s: %lld/%lld images (%d%%)%s\n", o->split, (long long)done, (long long)total,
                   total ? (int)(100 * done / total) : 100, tail);
            fflush(stdout);
        }
    }
}

/* ---- the command --------------------------------------------------------------------------- */

/* DST/classes.txt's names (NULL when there is none); -1 when it is unreadable. */
static int read_classes(const char *dst, char ***names, int *n, mgt_err *err) {
    char path[PATH_MAX], *text = NULL;
    *names = NULL;
    *n = 0;
    snprintf(path, sizeof path, "%s/classes.txt", dst);
    if (access(path, F_OK) != 0)
        return 0;
    if (mgt_read_text_file(path, "class list", 1 << 26, &text, NULL, err) < 0)
        return -1;
    int cap = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(*names, sizeof *p * (size_t)cap);
            if (!p) {
                free(text);
                return mgt_errf(err, "out of memory reading %s", path);
            }
            *names = p;
        }
        (*names)[(*n)++] = strdup(line);
    }
    free(text);
    return 0;
}

/* The class numbers: classes.txt's where DST holds another split already (SRC's classes must
 * all be there), else SRC's own, whose classes.txt is handed back in *classes_txt (NULL: none to
 * write) for the caller to write. Relabels the files. Writes nothing. */
static int settle_classes(tree *t, const mgt_convert_opts *o, const cJSON *manifest,
                          char **classes_txt, mgt_err *err) {
    *classes_txt = NULL;
    char **known = NULL;
    int nk = 0, others = 0;
    const cJSON *splits = cJSON_GetObjectItemCaseSensitive(manifest, "splits");
    for (const cJSON *s = cJSON_IsObject(splits) ? splits->child : NULL; s; s = s->next)
        others += strcmp(s->string, o->split) != 0;
    if (others && read_classes(o->dst, &known, &nk, err) < 0)
        return -1;
    if (others && !known)
        return mgt_errf(err,
                        "%s/classes.txt is missing though %s holds a converted split; "
                        "convert into another folder",
                        o->dst, o->dst);
    int rc = 0;
    if (!known) {
        size_t len = 0;
        for (int c = 0; c < t->nclasses; c++) {
            if (strchr(t->classes[c], '\n'))
                return mgt_errf(err,
                                "%s/%s: a class folder whose name holds a line break; rename "
                                "it",
                                o->src, t->classes[c]);
            len += strlen(t->classes[c]) + 1;
        }
        char *text = malloc(len + 1), *p = text;
        if (!text)
            return mgt_errf(err, "out of memory");
        for (int c = 0; c < t->nclasses; c++)
            p += sprintf(p, "%s\n", t->classes[c]);
        *classes_txt = text; /* written once the manifest says the split is under way */
        return 0;
    }
    int *map = malloc(sizeof *map * (size_t)t->nclasses);
    for (int c = 0; map && c < t->nclasses && rc == 0; c++) {
        map[c] = -1;
        for (int k = 0; k < nk; k++)
            if (known[k] && !strcmp(known[k], t->classes[c]))
                map[c] = k;
        if (map[c] < 0)
            rc = mgt_errf(err,
                          "%s/%s: class '%s' is not in %s/classes.txt (the classes of the split "
                          "converted there first, numbered in that order); convert the training "
                          "tree first, or into another folder",
                          o->src, t->classes[c], t->classes[c], o->dst);
    }
    if (!map)
        rc = mgt_errf(err, "out of memory");
    for (int64_t i = 0; rc == 0 && i < t->n; i++)
        t->f[i].label = map[t->f[i].label];
    if (rc == 0) { /* the names by their numbers in classes.txt */
        for (int c = 0; c < t->nclasses; c++)
            free(t->classes[c]);
        free(t->classes);
        t->classes = known;
        t->nclasses = nk;
        known = NULL;
    }
    for (int k = 0; known && k < nk; k++)
        free(known[k]);
    free(known);
    free(map);
    return rc;
}

/* The manifest's other splits and its stored size must agree with this conversion. Returns the
 * parsed manifest (a new one when DST has none), or NULL with err. */
static cJSON *read_manifest(const mgt_convert_opts *o, mgt_err *err) {
    char path[PATH_MAX], *text = NULL;
    snprintf(path, sizeof path, "%s/" MGT_IMAGES_MANIFEST, o->dst);
    if (access(path, F_OK) != 0)
        return cJSON_CreateObject();
    if (mgt_read_text_file(path, "image set manifest", 1 << 28, &text, NULL, err) < 0)
        return NULL;
    cJSON *m = cJSON_Parse(text);
    free(text);
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(m, "size");
    if (!m || !cJSON_IsNumber(size)) {
        cJSON_Delete(m);
        mgt_errf(err,
                 "%s: not an image set manifest written by mgtrain convert; convert into "
                 "another folder",
                 path);
        return NULL;
    }
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(m, "layout");
    const int square = !cJSON_IsString(lay) || !strcmp(lay->valuestring, "square");
    if (square != !!o->square) {
        mgt_errf(err,
                 "%s holds images stored %s; convert %s to add a split to it, or into another "
                 "folder",
                 o->dst, square ? "square (--square)" : "whole", square ? "with --square" : "without --square");
        cJSON_Delete(m);
        return NULL;
    }
    if (size->valuedouble != o->size) {
        mgt_errf(err,
                 "%s holds images stored at %.0f x %.0f; convert with --size %.0f to add a split "
                 "to it, or into another folder",
                 o->dst, size->valuedouble, size->valuedouble, size->valuedouble);
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

/* NAME without a temporary's ".tmp.<pid>" tail (tensor_io.h's writers), into base[n]; the pid
 * in *pid (0: NAME is no temporary). */
static void temp_base(const char *name, char *base, size_t n, long *pid) {
    *pid = 0;
    snprintf(base, n, "%s", name);
    const char *t = strstr(name, ".tmp.");
    if (!t || !t[5])
        return;
    char *end;
    const long v = strtol(t + 5, &end, 10);
    if (*end || v <= 0)
        return;
    *pid = v;
    base[t - name < (long)n ? t - name : (long)n - 1] = 0;
}

/* 1 if NAME is a file mgtrain convert writes in DST (images.h) or its lock. */
static int ours(const char *name) {
    return mgt_images_keeps(name) || !strcmp(name, MGT_RUN_LOCK);
}

/* Removes what a killed run of this command left in DST, and nothing else: temporaries of the
 * set's own files written by another process (the lock is ours, so that process is gone), and
 * this split's shards past the last (from a larger tree converted before). */
static void tidy(const mgt_convert_opts *o, int64_t nshards) {
    DIR *dh = opendir(o->dst);
    if (!dh)
        return;
    const size_t sl = strlen(o->split);
    for (struct dirent *e; (e = readdir(dh));) {
        char base[NAME_MAX + 1];
        long pid;
        temp_base(e->d_name, base, sizeof base, &pid);
        if (!mgt_images_keeps(base) || pid == (long)getpid())
            continue;
        const int shard = !strncmp(base, o->split, sl) && base[sl] == '-';
        if (!pid && !(shard && strtoll(base + sl + 1, NULL, 10) >= nshards))
            continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", o->dst, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISREG(sb.st_mode))
            unlink(p);
    }
    closedir(dh);
}

/* What DST holds, checked before anything is written: nothing (or no folder yet), or an image set
 * whose split, if it has this one, was converted from this same SRC (the command then goes on
 * from its shards). A folder of anything else (data of another kind, a set converted from
 * another tree, files this command did not write) is refused, and so is a DST inside SRC, which
 * would be read as a class folder; nothing is created in either case. src_real: SRC resolved. */
static int check_dst(const mgt_convert_opts *o, const char *src_real, mgt_err *err) {
    char dst_real[PATH_MAX];
    mgt_path_resolve(o->dst, dst_real, sizeof dst_real);
    const size_t n = strlen(src_real);
    if (!strncmp(src_real, dst_real, n) && (dst_real[n] == 0 || dst_real[n] == '/'))
        return mgt_errf(err,
                        "%s is %s %s: it would be read as a class folder; give a DST outside "
                        "the image folder",
                        o->dst, dst_real[n] ? "inside" : "the same folder as", o->src);
    struct stat sb;
    if (stat(o->dst, &sb) != 0)
        return 0; /* made below */
    if (!S_ISDIR(sb.st_mode))
        return mgt_errf(err, "%s exists and is not a folder; give a folder for DST", o->dst);
    DIR *dh = opendir(o->dst);
    if (!dh)
        return mgt_errf(err, "%s: cannot list this folder (%s); give a readable DST", o->dst,
                        strerror(errno));
    /* Without a manifest, only a lock or a temporary may be there (a run killed before its
     * first write); with one, files of other names are the user's, left alone. */
    char other[NAME_MAX + 1] = "";
    int nother = 0, manifest = 0;
    for (struct dirent *e; (e = readdir(dh));) {
        char base[NAME_MAX + 1];
        long pid;
        temp_base(e->d_name, base, sizeof base, &pid);
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || (pid && ours(base)) ||
            !strcmp(e->d_name, MGT_RUN_LOCK))
            continue;
        manifest |= !strcmp(e->d_name, MGT_IMAGES_MANIFEST);
        if (nother++ == 0)
            snprintf(other, sizeof other, "%s", e->d_name);
    }
    closedir(dh);
    if (!manifest && nother)
        return mgt_errf(err,
                        "%s is not empty (it holds %s%s) and is not an image set: mgtrain convert "
                        "writes only into an empty or new folder, or goes on with a set it "
                        "converted there; give another DST",
                        o->dst, other, nother > 1 ? " and more" : "");
    if (!manifest)
        return 0;
    char path[PATH_MAX], *text = NULL;
    snprintf(path, sizeof path, "%s/" MGT_IMAGES_MANIFEST, o->dst);
    if (mgt_read_text_file(path, "image set manifest", 1 << 28, &text, NULL, err) < 0)
        return -1;
    cJSON *m = cJSON_Parse(text);
    free(text);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(m, "format");
    const cJSON *sp =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "splits"), o->split);
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(sp, "source");
    const cJSON *done = cJSON_GetObjectItemCaseSensitive(sp, "complete");
    int rc = 0;
    if (!cJSON_IsString(f) || strncmp(f->valuestring, "mgtrain images ", 15))
        rc = mgt_errf(err,
                      "%s is not an image set manifest written by mgtrain convert; give another "
                      "DST (an empty or new folder)",
                      path);
    else if (sp && (!cJSON_IsString(from) || strcmp(from->valuestring, src_real)))
        rc = mgt_errf(err,
                      "%s holds a %s split converted from %s%s; converting %s over it would "
                      "replace it: give another DST, or remove %s first to convert anew",
                      o->dst, o->split, cJSON_IsString(from) ? from->valuestring : "another folder",
                      cJSON_IsFalse(done) ? " (unfinished)" : "", o->src, o->dst);
    cJSON_Delete(m);
    return rc;
}

/* The manifest as it stands with this split marked unfinished: written before anything else of
 * the split (classes.txt, shards), so that a set whose conversion stops or is killed says so to
 * training (images.h) and to the next conversion, which checks that it comes from the same SRC. */
static int mark_unfinished(const mgt_convert_opts *o, cJSON *manifest, const char *src_real,
                           mgt_err *err) {
    cJSON *splits = cJSON_GetObjectItemCaseSensitive(manifest, "splits");
    if (!cJSON_IsObject(splits)) {
        cJSON_DeleteItemFromObjectCaseSensitive(manifest, "splits");
        splits = cJSON_AddObjectToObject(manifest, "splits");
    }
    cJSON *sp = cJSON_GetObjectItemCaseSensitive(splits, o->split);
    if (!cJSON_IsObject(sp)) {
        cJSON_DeleteItemFromObjectCaseSensitive(splits, o->split);
        sp = cJSON_AddObjectToObject(splits, o->split);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(sp, "source");
    cJSON_DeleteItemFromObjectCaseSensitive(sp, "complete");
    cJSON_AddStringToObject(sp, "source", src_real);
    cJSON_AddFalseToObject(sp, "complete");
    if (!cJSON_GetObjectItemCaseSensitive(manifest, "format"))
        cJSON_AddStringToObject(manifest, "format", MGT_IMAGES_FORMAT);
    if (!cJSON_GetObjectItemCaseSensitive(manifest, "size"))
        cJSON_AddNumberToObject(manifest, "size", o->size);
    if (!cJSON_GetObjectItemCaseSensitive(manifest, "layout"))
        cJSON_AddStringToObject(manifest, "layout", o->square ? "square" : "whole");
    char path[PATH_MAX], *text = cJSON_Print(manifest);
    snprintf(path, sizeof path, "%s/" MGT_IMAGES_MANIFEST, o->dst);
    const int rc = text ? mgt_atomic_write(path, text, strlen(text), err)
                        : mgt_errf(err, "out of memory writing %s", path);
    free(text);
    return rc;
}

static int make_dir(const char *dir, mgt_err *err) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1;; p++) {
        const int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return mgt_errf(err, "cannot create the folder %s: %s; give a writable DST", tmp,
                                strerror(errno));
            if (end)
                break;
            *p = '/';
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mgt_errf(err, "%s exists and is not a folder; give a folder for DST", dir);
    return 0;
}

/* Runs the workers over the shards to make, drawing the progress; then the first error if any. */
static int run_workers(job *j, int threads, int verbose, mgt_err *err) {
    const mgt_convert_opts *o = j->o;
    int64_t total = 0;
    for (int64_t t = 0; t < j->ntodo; t++) {
        const int64_t first = j->todo[t] * j->per_shard;
        total += j->t->n - first < j->per_shard ? j->t->n - first : j->per_shard;
    }
    /* No shard holds more than the tree's files. */
    const size_t per = (size_t)(j->per_shard < j->t->n ? j->per_shard : j->t->n);
    for (int b = 0; b < IN_FLIGHT; b++) {
        j->buf[b].shard = -1;
        j->buf[b].img = calloc(per, sizeof(uint8_t *));
        j->buf[b].dims = calloc(per, sizeof *j->buf[b].dims);
        j->buf[b].labels = malloc(sizeof(int32_t) * per);
        j->buf[b].bad = calloc(per, sizeof(char *));
        if (!j->buf[b].img || !j->buf[b].dims || !j->buf[b].labels || !j->buf[b].bad)
            return mgt_errf(err,
                            "out of memory for two shards of %lld images; pass a smaller "
                            "--shard-size",
                            (long long)per);
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->err_file = -1;
    worker *w = calloc((size_t)threads, sizeof *w);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    int started = 0;
    for (int i = 0; w && th && i < threads; i++) {
        w[i].j = j;
        pthread_mutex_lock(&j->mu);
        j->running++;
        pthread_mutex_unlock(&j->mu);
        if (pthread_create(&th[i], NULL, work, &w[i]) != 0) {
            pthread_mutex_lock(&j->mu);
            j->running--;
            pthread_mutex_unlock(&j->mu);
            break;
        }
        started++;
    }
    if (started == 0) {
        free(w);
        free(th);
        return mgt_errf(err, "cannot start a decoding thread");
    }
    const double t0 = mgt_now();
    int decile = 0;
    pthread_mutex_lock(&j->mu);
    while (j->running > 0) {
        const int64_t done = j->converted;
        pthread_mutex_unlock(&j->mu);
        progress(o, verbose, done, total, t0, &decile, 0);
        pthread_mutex_lock(&j->mu);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100000000; /* ten redraws a second */
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        if (j->running > 0)
            pthread_cond_timedwait(&j->cv, &j->mu, &until);
        if (!j->stop && mgt_stop_signal()) {
            j->stop = 1; /* the workers finish the image and the shard they write, no more */
            pthread_cond_broadcast(&j->cv);
        }
    }
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (!j->stop)
        progress(o, verbose, j->converted, total, t0, &decile, 1);
    else if (verbose == 1)
        printf("\n");
    for (int i = 0; i < started; i++) {
        free(w[i].file);
        free(w[i].img.px);
        mgt_resample_work_free(&w[i].rw);
    }
    free(w);
    free(th);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    if (j->stop) {
        if (j->err_file >= 0)
            *err = j->err;
        else
            mgt_errf(err,
                     "interrupted by %s: %lld of %lld shards written this time, kept; run the "
                     "same command again to go on from them",
                     mgt_signal_name(mgt_stop_signal()), (long long)j->shards_written,
                     (long long)j->ntodo);
        return -1;
    }
    return 0;
}

static int default_threads(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The manifest with this split's shards, written atomically; the skipped list beside it. */
static int finish(const mgt_convert_opts *o, const tree *t, const job *j, const int64_t *images,
                  cJSON *manifest, cJSON *skipped, mgt_err *err) {
    char path[PATH_MAX], full[PATH_MAX];
    cJSON *split = cJSON_CreateObject(), *shards = cJSON_CreateArray();
    int64_t total = 0;
    for (int64_t k = 0; k < j->nshards; k++) {
        cJSON *s = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof name, "%s-%05lld", o->split, (long long)k);
        cJSON_AddStringToObject(s, "name", name);
        cJSON_AddNumberToObject(s, "images", (double)images[k]);
        cJSON_AddItemToArray(shards, s);
        total += images[k];
    }
    cJSON_AddStringToObject(split, "source", realpath(o->src, full) ? full : o->src);
    cJSON_AddTrueToObject(split, "complete");
    cJSON_AddNumberToObject(split, "files", (double)t->n);
    cJSON_AddNumberToObject(split, "images", (double)total);
    cJSON_AddNumberToObject(split, "skipped", (double)cJSON_GetArraySize(skipped));
    cJSON_AddItemToObject(split, "shards", shards);
    cJSON_DeleteItemFromObjectCaseSensitive(manifest, "format");
    cJSON_DeleteItemFromObjectCaseSensitive(manifest, "size");
    cJSON_DeleteItemFromObjectCaseSensitive(manifest, "channels");
    cJSON_DeleteItemFromObjectCaseSensitive(manifest, "classes");
    cJSON_DeleteItemFromObjectCaseSensitive(manifest, "layout");
    cJSON *splits = cJSON_DetachItemFromObjectCaseSensitive(manifest, "splits");
    if (!cJSON_IsObject(splits)) {
        cJSON_Delete(splits);
        splits = cJSON_CreateObject();
    }
    cJSON_DeleteItemFromObjectCaseSensitive(splits, o->split);
    cJSON_AddItemToObject(splits, o->split, split);
    cJSON_AddStringToObject(manifest, "format", MGT_IMAGES_FORMAT);
    cJSON_AddNumberToObject(manifest, "size", o->size);
    cJSON_AddStringToObject(manifest, "layout", o->square ? "square" : "whole");
    cJSON_AddNumberToObject(manifest, "channels", 3);
    cJSON_AddNumberToObject(manifest, "classes", t->nclasses);
    cJSON_AddItemToObject(manifest, "splits", splits);

    /* The skipped files first (the manifest marks the split done). */
    int rc = 0;
    snprintf(path, sizeof path, "%s/%s_skipped.txt", o->dst, o->split);
    if (cJSON_GetArraySize(skipped) > 0) {
        size_t cap = 1, len = 0;
        for (const cJSON *s = skipped->child; s; s = s->next)
            cap += strlen(cJSON_GetObjectItem(s, "path")->valuestring) +
                   strlen(cJSON_GetObjectItem(s, "error")->valuestring) + 4;
        char *text = malloc(cap);
        for (const cJSON *s = skipped->child; text && s; s = s->next)
            len +=
                (size_t)sprintf(text + len, "%s: %s\n", cJSON_GetObjectItem(s, "path")->valuestring,
                                cJSON_GetObjectItem(s, "error")->valuestring);
        rc = text ? mgt_atomic_write(path, text, len, err) : mgt_errf(err, "out of memory");
        free(text);
    } else {
        unlink(path);
    }
    char *text = rc == 0 ? cJSON_Print(manifest) : NULL;
    snprintf(path, sizeof path, "%s/" MGT_IMAGES_MANIFEST, o->dst);
    if (rc == 0)
        rc = text ? mgt_atomic_write(path, text, strlen(text), err)
                  : mgt_errf(err, "out of memory writing %s", path);
    free(text);
    return rc;
}

int mgt_convert(const mgt_convert_opts *o, mgt_err *err) {
    const double t0 = mgt_now();
    if (o->size < 8 || o->size > 4096)
        return mgt_errf(err,
                        "--size %d: give the stored side in pixels, from 8 to 4096 (e.g. 256 "
                        "for a 224 x 224 model input)",
                        o->size);
    if (strcmp(o->split, "train") && strcmp(o->split, "test"))
        return mgt_errf(err, "--split %s: use train or test", o->split);
    tree t;
    char src_real[PATH_MAX];
    int rc = list_tree(&t, o->src, err);
    if (rc == 0 && !realpath(o->src, src_real))
        rc = mgt_errf(err, "%s: %s", o->src, strerror(errno));
    if (rc == 0)
        rc = check_dst(o, src_real, err);
    if (rc == 0)
        rc = make_dir(o->dst, err);
    if (rc < 0) {
        tree_free(&t);
        return -1;
    }
    mgt_rundir lock;
    mgt_rundir_init(&lock, o->dst);
    char notice[2048];
    if (mgt_rundir_lock(&lock, o->host, notice, sizeof notice, err) < 0) {
        tree_free(&t);
        return -1;
    }
    if (notice[0])
        fprintf(stderr, "%s\n", notice);
    const int verbose = o->verbose >= 0 ? o->verbose : isatty(STDOUT_FILENO) ? 1 : 2;
    if (t.loose && verbose)
        fprintf(stderr,
                "notice: %lld file%s directly in %s %s in no class folder and %s left out\n",
                (long long)t.loose, t.loose == 1 ? "" : "s", o->src, t.loose == 1 ? "is" : "are",
                t.loose == 1 ? "is" : "are");
    cJSON *manifest = read_manifest(o, err), *skipped = cJSON_CreateArray();
    char *classes_txt = NULL, classes_path[PATH_MAX];
    snprintf(classes_path, sizeof classes_path, "%s/classes.txt", o->dst);
    if (!manifest || settle_classes(&t, o, manifest, &classes_txt, err) < 0 ||
        mark_unfinished(o, manifest, src_real, err) < 0 ||
        (classes_txt &&
         mgt_atomic_write(classes_path, classes_txt, strlen(classes_txt), err) < 0)) {
        free(classes_txt);
        cJSON_Delete(manifest);
        cJSON_Delete(skipped);
        rc = -1;
        goto out;
    }
    free(classes_txt);

    job j;
    memset(&j, 0, sizeof j);
    j.o = o;
    j.t = &t;
    j.srclen = strlen(o->src);
    /* about 256 MiB a shard: a square image's bytes, or a 4:3 photo's in the whole layout */
    const int64_t image_bytes = (int64_t)o->size * o->size * 3 * (o->square ? 3 : 4) / 3;
    j.per_shard = o->shard_size > 0 ? o->shard_size : ((int64_t)256 << 20) / image_bytes;
    if (j.per_shard < 1)
        j.per_shard = 1;
    j.nshards = (t.n + j.per_shard - 1) / j.per_shard;
    j.hash = malloc(sizeof *j.hash * (size_t)j.nshards);
    j.todo = malloc(sizeof *j.todo * (size_t)j.nshards);
    int64_t *images = calloc((size_t)j.nshards, sizeof *images);
    int64_t *bytes = calloc((size_t)j.nshards, sizeof *bytes);
    if (!j.hash || !j.todo || !images || !bytes) {
        rc = mgt_errf(err, "out of memory for %lld shards", (long long)j.nshards);
        goto out_job;
    }
    int64_t kept = 0, kept_images = 0;
    for (int64_t k = 0; k < j.nshards; k++) {
        const int64_t first = k * j.per_shard;
        const int64_t n = t.n - first < j.per_shard ? t.n - first : j.per_shard;
        j.hash[k] = shard_hash(&t, j.srclen, o->size, o->square, first, n);
        if (shard_done(o->dst, o->split, k, j.hash[k], n, o->size, o->square, o->skip_bad,
                       &images[k], &bytes[k], NULL)) {
            kept++;
            kept_images += n;
        } else {
            j.todo[j.ntodo++] = k;
        }
    }
    tidy(o, j.nshards);
    const int threads = o->threads > 0 ? o->threads : default_threads();
    if (verbose) {
        printf("%s: %lld files of %d classes in %s -> %s, stored at %dx%d, %lld shard%s of up to "
               "%lld images",
               o->split, (long long)t.n, t.nclasses, o->src, o->dst, o->size, o->size,
               (long long)j.nshards, j.nshards == 1 ? "" : "s", (long long)j.per_shard);
        if (kept)
            printf("; %lld shard%s (%lld files) already done, kept", (long long)kept,
                   kept == 1 ? "" : "s", (long long)kept_images);
        printf("; %d thread%s\n", threads, threads == 1 ? "" : "s");
        fflush(stdout);
    }
    if (j.ntodo > 0 && run_workers(&j, threads, verbose, err) < 0) {
        rc = -1;
        goto out_job;
    }
    /* Every shard's record, in order, for the counts and the skipped files. */
    for (int64_t k = 0; k < j.nshards; k++) {
        const int64_t first = k * j.per_shard;
        const int64_t n = t.n - first < j.per_shard ? t.n - first : j.per_shard;
        if (!shard_done(o->dst, o->split, k, j.hash[k], n, o->size, o->square, o->skip_bad,
                        &images[k], &bytes[k],
                        skipped)) {
            rc = mgt_errf(err,
                          "%s: shard %lld was written but does not read back; check the "
                          "disk, then run the same command again",
                          o->dst, (long long)k);
            goto out_job;
        }
    }
    int64_t stored = 0, stored_bytes = 0;
    for (int64_t k = 0; k < j.nshards; k++)
        stored += images[k], stored_bytes += bytes[k];
    if (stored == 0) { /* --skip-bad left out every file: a set of nothing is refused */
        const cJSON *first = skipped->child;
        rc = mgt_errf(err,
                      "%s: none of its %lld files is a readable JPEG or PNG image (the first, "
                      "%s: %s); an image set needs at least one",
                      o->src, (long long)t.n,
                      first ? cJSON_GetObjectItem(first, "path")->valuestring : "?",
                      first ? cJSON_GetObjectItem(first, "error")->valuestring : "?");
        goto out_job;
    }
    rc = finish(o, &t, &j, images, manifest, skipped, err);
    if (rc == 0 && verbose) {
        const double secs = mgt_now() - t0;
        const int nskip = cJSON_GetArraySize(skipped);
        printf("%s: %lld images of %d classes in %s (%.2f GiB), %.1f s", o->split,
               (long long)stored, t.nclasses, o->dst,
               (double)stored_bytes / 1073741824.0, secs);
        if (j.ntodo > 0 && secs > 0)
            printf(", %.0f images/s", (double)(t.n - kept_images) / secs);
        printf("\n");
        if (nskip) {
            printf("skipped %d unreadable file%s, listed in %s/%s_skipped.txt:\n", nskip,
                   nskip == 1 ? "" : "s", o->dst, o->split);
            int shown = 0;
            for (const cJSON *s = skipped->child; s && shown < SHOW_SKIPPED; s = s->next, shown++)
                printf("  %s: %s\n", cJSON_GetObjectItem(s, "path")->valuestring,
                       cJSON_GetObjectItem(s, "error")->valuestring);
            if (nskip > shown)
                printf("  ... and %d more\n", nskip - shown);
        }
        fflush(stdout);
    }
out_job:
    for (int b = 0; b < IN_FLIGHT; b++) {
        for (int64_t i = 0; j.buf[b].bad && i < j.per_shard && i < t.n; i++)
            free(j.buf[b].bad[i]);
        for (int64_t i = 0; j.buf[b].img && i < j.per_shard && i < t.n; i++)
            free(j.buf[b].img[i]);
        free(j.buf[b].bad);
        free(j.buf[b].img);
        free(j.buf[b].dims);
        free(j.buf[b].labels);
    }
    free(j.hash);
    free(j.todo);
    free(images);
    free(bytes);
    cJSON_Delete(manifest);
    cJSON_Delete(skipped);
out:
    mgt_rundir_unlock(&lock);
    tree_free(&t);
    return rc;
}
