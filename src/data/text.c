/* text.c: text files into byte-level token shards (see text.h). */
#include "text.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../tensor_io.h"
#include "tokens.h"

/* The most bytes a split may hold: an llm.c shard counts its tokens in an int32. */
#define MAX_SPLIT ((size_t)2147483647)

typedef struct buf {
    uint16_t *tok;
    size_t n, cap;
} buf;

static int put(buf *b, const unsigned char *p, size_t n, mgt_err *err) {
    if (b->n + n > MAX_SPLIT)
        return mgt_errf(err, "the text is larger than 2^31 bytes, the most one shard holds; "
                             "convert it in parts into separate folders");
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 20;
        while (cap < b->n + n)
            cap *= 2;
        uint16_t *t = realloc(b->tok, cap * sizeof *t);
        if (!t)
            return mgt_errf(err, "out of host memory for %zu tokens", b->n + n);
        b->tok = t;
        b->cap = cap;
    }
    for (size_t i = 0; i < n; i++)
        b->tok[b->n + i] = p[i];
    b->n += n;
    return 0;
}

/* One file's bytes into the two splits: the validation part starts at the first line start at
 * or after (1 - val_fraction) of the file (a file of one line goes to training whole). */
static int add_file(const char *path, double val_fraction, buf *train, buf *val, int *binary,
                    mgt_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (mgt_read_text_file(path, "text file", MAX_SPLIT, &text, &len, err) < 0)
        return -1;
    *binary = memchr(text, 0, len) != NULL;
    if (*binary) {
        free(text);
        return 0;
    }
    size_t cut = len - (size_t)((double)len * val_fraction);
    while (cut < len && cut > 0 && text[cut - 1] != '\n')
        cut++;
    const int rc = put(train, (const unsigned char *)text, cut, err) < 0 ||
                           put(val, (const unsigned char *)text + cut, len - cut, err) < 0
                       ? -1
                       : 0;
    free(text);
    return rc;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The file each of names[0 .. k) is (device and inode), to tell a second name of one from
 * another file. */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
} file_id;

/* SRC's files: itself, or a folder's regular files in name order (names: free each and it). A
 * file reached by two names (a link beside its target: Debian's fortunes has NAME.u8 -> NAME) is
 * read once, by the first name in that order; *links counts the others. */
static int list_files(const char *src, char ***out, int *n, int *links, mgt_err *err) {
    struct stat st;
    *out = NULL;
    *n = 0;
    if (stat(src, &st) != 0)
        return mgt_errf(err, "cannot read %s: %s; pass a text file or a folder of them", src,
                        strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        char **one = malloc(sizeof *one);
        if (!one || !(one[0] = strdup(src))) {
            free(one);
            return mgt_errf(err, "out of host memory");
        }
        *out = one;
        *n = 1;
        return 0;
    }
    DIR *d = opendir(src);
    if (!d)
        return mgt_errf(err, "cannot open folder %s: %s", src, strerror(errno));
    char **names = NULL;
    int cap = 0, k = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char p[4096];
        if (e->d_name[0] == '.' || snprintf(p, sizeof p, "%s/%s", src, e->d_name) >= (int)sizeof p)
            continue;
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (k == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, sizeof *nn * (size_t)cap);
            if (!nn)
                break;
            names = nn;
        }
        if (!(names[k] = strdup(p)))
            break;
        k++;
    }
    closedir(d);
    if (k > 1)
        qsort(names, (size_t)k, sizeof *names, by_name);
    /* In name order, the names of a file seen before go (quadratic in the files: a folder of
     * text files holds tens or hundreds). */
    file_id *ids = malloc(sizeof *ids * (size_t)(k ? k : 1));
    int kept = 0;
    for (int i = 0; i < k; i++) {
        int seen = 0;
        if (ids && stat(names[i], &st) == 0) {
            for (int j = 0; j < kept && !seen; j++)
                seen = ids[j].dev == st.st_dev && ids[j].ino == st.st_ino;
            if (!seen)
                ids[kept] = (file_id){st.st_dev, st.st_ino};
        }
        if (seen) {
            free(names[i]);
            (*links)++;
        } else {
            names[kept++] = names[i];
        }
    }
    free(ids);
    k = kept;
    *out = names;
    *n = k;
    if (k == 0)
        return mgt_errf(err, "%s holds no files to read; pass a text file or a folder of them",
                        src);
    return 0;
}

/* DST/name, refused where it exists and overwrite is not set. */
static int out_path(const mgt_text_opts *o, const char *name, char *p, size_t n, mgt_err *err) {
    if (snprintf(p, n, "%s/%s", o->dst, name) >= (int)n)
        return mgt_errf(err, "the output folder's path is too long: %s", o->dst);
    struct stat st;
    if (stat(p, &st) == 0)
        return mgt_errf(err, "%s already exists; convert into a new folder, or remove it first", p);
    return 0;
}

int mgt_text_convert(const mgt_text_opts *o, mgt_text_result *r, mgt_err *err) {
    memset(r, 0, sizeof *r);
    if (!(o->val_fraction >= 0 && o->val_fraction <= 0.5))
        return mgt_errf(err, "--val-fraction %g: expected a fraction from 0 to 0.5",
                        o->val_fraction);
    char ptrain[4096], pval[4096];
    if (out_path(o, "train.bin", ptrain, sizeof ptrain, err) < 0 ||
        out_path(o, "val.bin", pval, sizeof pval, err) < 0)
        return -1;
    char **files;
    int n;
    if (list_files(o->src, &files, &n, &r->links, err) < 0) {
        free(files);
        return -1;
    }
    buf train = {0}, val = {0};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int binary = 0;
        rc = add_file(files[i], o->val_fraction, &train, &val, &binary, err);
        if (rc == 0 && binary) {
            r->skipped++;
            if (o->verbose)
                fprintf(stderr, "convert --text: left out %s: it holds NUL bytes (not text)\n",
                        files[i]);
        } else if (rc == 0) {
            r->files++;
        }
    }
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
    if (rc == 0 && r->files == 0)
        rc = mgt_errf(err, "%s holds no text: every file holds NUL bytes", o->src);
    if (rc == 0 && (mkdir(o->dst, 0777) != 0 && errno != EEXIST))
        rc = mgt_errf(err, "cannot make the folder %s: %s", o->dst, strerror(errno));
    if (rc == 0)
        rc = mgt_tokens_write(ptrain, train.tok, (int64_t)train.n, err);
    if (rc == 0)
        rc = mgt_tokens_write(pval, val.tok, (int64_t)val.n, err);
    r->train_tokens = (int64_t)train.n;
    r->val_tokens = (int64_t)val.n;
    free(train.tok);
    free(val.tok);
    return rc;
}
