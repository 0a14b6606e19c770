/* tensor_io.c: safetensors files (weights, checkpoints), .npy outputs, atomic writes and whole-file
 * reads.
 *
 * All three writers go through one small "atomic file" helper: the bytes are streamed into
 * PATH.tmp.<pid> in the same folder (so no large concatenated buffer is ever built), which is
 * then flushed, fsync'ed, closed, renamed onto PATH, and the folder fsync'ed. A crash at any point
 * leaves either the old PATH or the new one; any failure removes the temporary file and leaves
 * PATH untouched, and the error names PATH and the system's reason.
 *
 * safetensors layout: an 8-byte little-endian header length, a JSON header (built and parsed with
 * cJSON) padded with spaces to a multiple of 8 bytes, then the raw little-endian float32 data.
 * The header maps each tensor to {"dtype":"F32","shape":[...],"data_offsets":[b,e]} (offsets
 * relative to the data section) and "__metadata__" to string pairs, to which the writer adds
 * "crc32" and "crc32_covers": the CRC-32 of the canonical header and the data (tensor_io.h says
 * exactly what is covered and when the reader requires it). The reader validates everything
 * before handing out pointers into the one buffer holding the data. */
#include "tensor_io.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor_io.c writes host floats as little-endian data: port it for big-endian hosts"
#endif

/* Headers larger than this are damage, not tensors (the safetensors reference reader uses the
 * same bound). */
#define ST_MAX_HEADER (100u << 20)
/* Largest byte count kept exact by a JSON number (a double). */
#define ST_MAX_BYTES (1LL << 53)

static const char *errstr(int e) {
    return e ? strerror(e) : "I/O error";
}

/* "PATH: cannot write (REASON); WHAT TO DO". EFBIG is the process's file-size limit (SIGXFSZ is
 * ignored, runtime.h), which a user sets and may not remember. */
static int write_error(mgt_err *err, const char *path, int e) {
    struct rlimit rl;
    if (e == EFBIG && getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        return mgt_errf(err,
                        "%s: cannot write (%s): this process may write files of at most %llu "
                        "bytes (ulimit -f %llu); raise the limit",
                        path, errstr(e), (unsigned long long)rl.rlim_cur,
                        (unsigned long long)rl.rlim_cur / 1024);
    return mgt_errf(err, "%s: cannot write (%s); check free space and permissions", path,
                    errstr(e));
}

/* ---- atomic file ------------------------------------------------------------------------ */

typedef struct afile {
    FILE *f;
    const char *path;      /* as the caller named it, for messages */
    char target[PATH_MAX]; /* what is written: path, or the file a symbolic link at path names */
    char tmp[PATH_MAX + 32];
} afile;

/* The folder a path names a file in: "." for a bare name. */
static void dir_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

static const char *kind_of(mode_t m) {
    return S_ISDIR(m)                 ? "a folder"
           : S_ISCHR(m) || S_ISBLK(m) ? "a device"
           : S_ISFIFO(m)              ? "a pipe"
           : S_ISSOCK(m)              ? "a socket"
                                      : "not a regular file";
}

/* The check of mgt_output_check; on success `target` holds the file to replace (for a symbolic
 * link to a regular file, the file it names). */
static int output_target(const char *path, const char *what, char *target, size_t cap,
                         mgt_err *err) {
    const char *sep = what ? " " : "";
    what = what ? what : "";
    size_t n = strlen(path);
    if (n == 0 || n >= cap)
        return mgt_errf(err, "%s%s%.80s: the path is empty or too long; choose a shorter path",
                        what, sep, path);
    memcpy(target, path, n + 1);
    struct stat sb;
    if (lstat(path, &sb) == 0) {
        if (S_ISLNK(sb.st_mode)) {
            char *real = realpath(path, NULL);
            int ok = real && stat(real, &sb) == 0 && S_ISREG(sb.st_mode) && strlen(real) < cap;
            if (ok)
                snprintf(target, cap, "%s", real);
            free(real);
            if (!ok)
                return mgt_errf(err,
                                "%s%s%s is a symbolic link to something that is not a regular "
                                "file (or to nothing); mgtrain writes regular files only: name a "
                                "regular file or a new path",
                                what, sep, path);
        } else if (!S_ISREG(sb.st_mode)) {
            return mgt_errf(err,
                            "%s%s%s is %s, not a regular file: mgtrain writes a new file and "
                            "renames it onto the path, which would replace it; name a regular "
                            "file or a new path",
                            what, sep, path, kind_of(sb.st_mode));
        }
    }
    return 0; /* a new name: whether its folder can take it, creating the file tells */
}

int mgt_output_check(const char *path, const char *what, mgt_err *err) {
    char target[PATH_MAX];
    return output_target(path, what, target, sizeof target, err);
}

static int af_open(afile *a, const char *path, mgt_err *err) {
    a->f = NULL;
    a->path = path;
    a->tmp[0] = 0;
    if (output_target(path, NULL, a->target, sizeof a->target, err) < 0)
        return -1;
    int n = snprintf(a->tmp, sizeof a->tmp, "%s.tmp.%ld", a->target, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof a->tmp)
        return mgt_errf(err, "%s: path too long; choose a shorter output path", path);
    int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return mgt_errf(err,
                        "%s: cannot write: creating its temporary file %s failed (%s); "
                        "check that the folder exists and is writable",
                        path, a->tmp, strerror(errno));
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        int e = errno;
        close(fd);
        unlink(a->tmp);
        return mgt_errf(err, "%s: cannot write (%s)", path, errstr(e));
    }
    return 0;
}

/* Drops the temporary file; PATH is untouched. */
static void af_abort(afile *a) {
    if (a->f)
        fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
}

static int af_write(afile *a, const void *p, size_t len, mgt_err *err) {
    errno = 0;
    if (len && fwrite(p, 1, len, a->f) != len) {
        int e = errno;
        af_abort(a);
        return write_error(err, a->path, e);
    }
    return 0;
}

/* Makes the temporary file durable, puts it in place, and makes the rename durable. */
static int af_commit(afile *a, mgt_err *err) {
    errno = 0;
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) {
        int e = errno;
        af_abort(a);
        return write_error(err, a->path, e);
    }
    FILE *f = a->f;
    a->f = NULL;
    if (fclose(f) != 0) {
        int e = errno;
        unlink(a->tmp);
        return write_error(err, a->path, e);
    }
    if (rename(a->tmp, a->target) != 0) {
        int e = errno;
        unlink(a->tmp);
        return mgt_errf(err, "%s: cannot write: renaming %s onto it failed (%s)", a->path, a->tmp,
                        errstr(e));
    }

    /* The folder entry: without this fsync the rename itself may not survive a crash. */
    char dir[PATH_MAX];
    dir_of(a->target, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) { /* EINVAL: fs without folder fsync */
        int e = errno;
        if (fd >= 0)
            close(fd);
        return mgt_errf(err,
                        "%s: written, but syncing its folder %s failed (%s); the new file "
                        "may not survive a crash",
                        a->path, dir, errstr(e));
    }
    close(fd);
    return 0;
}

int mgt_atomic_write(const char *path, const void *data, size_t len, mgt_err *err) {
    afile a;
    if (af_open(&a, path, err) || af_write(&a, data, len, err))
        return -1;
    return af_commit(&a, err);
}

/* ---- safetensors ------------------------------------------------------------------------ */

/* The CRC metadata (tensor_io.h says what they mean). */
#define ST_CRC_KEY "crc32"
#define ST_COVERS_KEY "crc32_covers"
#define ST_COVERS "header,data"
#define ST_CRC_ZERO "00000000"

/* A tensor's position in the data, for sorting by offset. */
typedef struct span {
    int64_t begin, end;
    int index;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) /* an empty tensor before a full one at the same place */
        return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static uint32_t crc_update(uint32_t crc, const void *p, size_t len) {
    const unsigned char *b = p;
    while (len > 0) { /* crc32() takes a uInt length */
        size_t n = len > (1u << 30) ? (1u << 30) : len;
        crc = (uint32_t)crc32(crc, b, (uInt)n);
        b += n;
        len -= n;
    }
    return crc;
}

/* Elements of a shape, or -1 if it is invalid or its bytes exceed ST_MAX_BYTES. */
static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return -1;
        if (shape[d] > 0 && n > ST_MAX_BYTES / 4 / shape[d])
            return -1;
        n *= shape[d];
    }
    return n;
}

/* Checks the writer's input: names, shapes, data, and that no name or key is used twice. */
static int check_write_args(const char *path, const mgt_tensor_entry *t, int nt,
                            const mgt_meta_entry *meta, int nmeta, mgt_err *err) {
    if (nt < 0 || nmeta < 0 || (nt > 0 && !t) || (nmeta > 0 && !meta))
        return mgt_errf(err, "%s: invalid tensor or metadata list", path);
    int64_t total = 0;
    for (int i = 0; i < nt; i++) {
        const char *nm = t[i].name;
        if (memchr(nm, 0, sizeof t[i].name) == NULL || nm[0] == 0 ||
            strcmp(nm, "__metadata__") == 0)
            return mgt_errf(err, "%s: tensor %d has an empty, unterminated or reserved name", path,
                            i);
        if (t[i].ndim < 0 || t[i].ndim > MGT_MAX_DIMS)
            return mgt_errf(err, "%s: tensor %s has %d dimensions (at most %d are supported)", path,
                            nm, t[i].ndim, MGT_MAX_DIMS);
        int64_t n = numel_of(t[i].ndim, t[i].shape);
        if (n < 0 || total > ST_MAX_BYTES - 4 * n)
            return mgt_errf(err, "%s: tensor %s has a negative or too large shape", path, nm);
        if (n > 0 && !t[i].data)
            return mgt_errf(err, "%s: tensor %s has no data", path, nm);
        total += 4 * n;
        for (int k = 0; k < i; k++)
            if (strcmp(t[k].name, nm) == 0)
                return mgt_errf(err, "%s: tensor name %s is used twice", path, nm);
    }
    for (int i = 0; i < nmeta; i++) {
        if (memchr(meta[i].key, 0, sizeof meta[i].key) == NULL ||
            memchr(meta[i].value, 0, sizeof meta[i].value) == NULL)
            return mgt_errf(err, "%s: metadata entry %d is not NUL-terminated", path, i);
        for (int k = 0; k < i; k++)
            if (strcmp(meta[k].key, meta[i].key) == 0)
                return mgt_errf(err, "%s: metadata key %s is used twice", path, meta[i].key);
    }
    return 0;
}

int mgt_safetensors_write(const char *path, const mgt_tensor_entry *t, int nt,
                          const mgt_meta_entry *meta, int nmeta, mgt_err *err) {
    if (check_write_args(path, t, nt, meta, nmeta, err))
        return -1;

    /* The header: tensors in the given order, then the metadata and the CRC-32 of the canonical
     * header (crc32 = "00000000" in it) followed by the data. Every cJSON call may fail on
     * memory; `ok` collects that and is checked once at the end. */
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    int64_t off = 0;
    for (int i = 0; ok && i < nt; i++) {
        int64_t bytes = 4 * numel_of(t[i].ndim, t[i].shape);
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        ok = e && cJSON_AddStringToObject(e, "dtype", "F32") && shape && offs;
        for (int d = 0; ok && d < t[i].ndim; d++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    cJSON *m = ok ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    ok = m != NULL;
    for (int i = 0; ok && i < nmeta; i++)
        if (strcmp(meta[i].key, ST_CRC_KEY) && strcmp(meta[i].key, ST_COVERS_KEY)) /* ours win */
            ok = cJSON_AddStringToObject(m, meta[i].key, meta[i].value) != NULL;
    cJSON *crc_item = ok ? cJSON_AddStringToObject(m, ST_CRC_KEY, ST_CRC_ZERO) : NULL;
    ok = crc_item && cJSON_AddStringToObject(m, ST_COVERS_KEY, ST_COVERS) != NULL;
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    if (json) {
        uint32_t crc = crc_update((uint32_t)crc32(0L, Z_NULL, 0), json, strlen(json));
        for (int i = 0; i < nt; i++)
            crc = crc_update(crc, t[i].data, (size_t)(4 * numel_of(t[i].ndim, t[i].shape)));
        char crchex[9];
        snprintf(crchex, sizeof crchex, "%08x", (unsigned)crc);
        free(json);
        json = cJSON_SetValuestring(crc_item, crchex) ? cJSON_PrintUnformatted(root) : NULL;
    }
    cJSON_Delete(root);
    if (!json)
        return mgt_errf(err, "%s: out of memory building the safetensors header", path);

    /* Length prefix + header padded with spaces to a multiple of 8, so the data is aligned. */
    size_t jlen = strlen(json), hlen = (jlen + 7) / 8 * 8;
    unsigned char prefix[8];
    for (int b = 0; b < 8; b++)
        prefix[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
    static const char spaces[] = "       "; /* the at most 7 padding bytes */

    afile a;
    int rc = af_open(&a, path, err);
    rc = rc || af_write(&a, prefix, 8, err) || af_write(&a, json, jlen, err) ||
         af_write(&a, spaces, hlen - jlen, err);
    free(json);
    for (int i = 0; !rc && i < nt; i++)
        rc = af_write(&a, t[i].data, (size_t)(4 * numel_of(t[i].ndim, t[i].shape)), err);
    return rc ? -1 : af_commit(&a, err);
}

/* An integral JSON number in [0, ST_MAX_BYTES], or -1. */
static int64_t json_count(const cJSON *v) {
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= (double)ST_MAX_BYTES) || d != (double)(int64_t)d)
        return -1;
    return (int64_t)d;
}

/* Fills *e from one header entry, checking dtype, shape and offsets against the data size;
 * *where is the entry's place in the data. */
/* The bytes of one element of a dtype the safetensors format names; 0 for an unknown one. */
static int dtype_bytes(const char *dt) {
    static const struct {
        const char *name;
        int bytes;
    } types[] = {{"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
                 {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
                 {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dt, types[i].name))
            return types[i].bytes;
    return 0;
}

static int parse_tensor(const char *path, const cJSON *it, int64_t dlen, const char *blob, int any,
                        mgt_tensor_entry *e, span *where, mgt_err *err) {
    const char *nm = it->string;
    if (strlen(nm) >= sizeof e->name)
        return mgt_errf(err,
                        "%s: tensor name \"%.40s...\" is %zu bytes, longer than the %zu "
                        "supported",
                        path, nm, strlen(nm), sizeof e->name - 1);
    snprintf(e->name, sizeof e->name, "%s", nm);
    if (!cJSON_IsObject(it))
        return mgt_errf(err, "%s: header entry %s is not an object; the file is damaged", path, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
        return mgt_errf(err,
                        "%s: tensor %s lacks a dtype, shape or data_offsets; the file is "
                        "damaged",
                        path, nm);
    const int esize = any ? dtype_bytes(dt->valuestring) : 4;
    if (!any && strcmp(dt->valuestring, "F32") != 0)
        return mgt_errf(err,
                        "%s: tensor %s has dtype %.16s; only F32 is supported (convert the "
                        "file to float32)",
                        path, nm, dt->valuestring);
    if (!esize)
        return mgt_errf(err,
                        "%s: tensor %s has dtype %.16s, which safetensors does not name; the "
                        "file is damaged",
                        path, nm, dt->valuestring);
    snprintf(e->dtype, sizeof e->dtype, "%s", dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > MGT_MAX_DIMS)
        return mgt_errf(err, "%s: tensor %s has %d dimensions (at most %d are supported)", path, nm,
                        nd, MGT_MAX_DIMS);
    e->ndim = nd;
    int64_t numel = 1;
    for (int d = 0; d < nd; d++) {
        int64_t v = json_count(cJSON_GetArrayItem(sh, d));
        if (v < 0 || (v > 0 && numel > ST_MAX_BYTES / 8 / v))
            return mgt_errf(err, "%s: tensor %s has an invalid shape; the file is damaged", path,
                            nm);
        e->shape[d] = v;
        numel *= v;
    }
    int64_t b = cJSON_GetArraySize(of) == 2 ? json_count(cJSON_GetArrayItem(of, 0)) : -1;
    int64_t en = cJSON_GetArraySize(of) == 2 ? json_count(cJSON_GetArrayItem(of, 1)) : -1;
    if (b < 0 || en < b || en > dlen)
        return mgt_errf(err,
                        "%s: tensor %s: data_offsets are invalid or outside the %lld-byte "
                        "data section; the file is truncated or damaged",
                        path, nm, (long long)dlen);
    if (en - b != esize * numel)
        return mgt_errf(err,
                        "%s: tensor %s: data_offsets [%lld, %lld] hold %lld bytes but its "
                        "shape needs %lld; the file is damaged",
                        path, nm, (long long)b, (long long)en, (long long)(en - b),
                        (long long)(esize * numel));
    where->begin = b;
    where->end = en;
    if (strcmp(e->dtype, "F32")) { /* read_any: converted, or no data (convert_tensors) */
        e->data = NULL;
        return 0;
    }
    if (b % 4 != 0)
        return mgt_errf(err,
                        "%s: tensor %s starts at byte %lld of the data, not a multiple of 4; "
                        "rewrite the file with aligned tensors",
                        path, nm, (long long)b);
    e->data = (const float *)(const void *)(blob + b);
    return 0;
}

/* IEEE half and bfloat16 bits to float. */
static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24); /* zero and subnormals */
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400), (int)exp - 25);
    return sign ? -v : v;
}

static float bf16_to_float(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* read_any: the F16, BF16 and F64 tensors into float32 (st->converted); the offsets were
 * checked by the parse. */
static int convert_tensors(const char *path, mgt_safetensors *st, const span *where, mgt_err *err) {
    size_t total = 0;
    for (int i = 0; i < st->nt; i++) {
        const char *dt = st->t[i].dtype;
        if (!strcmp(dt, "F16") || !strcmp(dt, "BF16") || !strcmp(dt, "F64"))
            total += (size_t)(where[i].end - where[i].begin) / (size_t)dtype_bytes(dt);
    }
    if (!total)
        return 0;
    st->converted = malloc(total * sizeof(float));
    if (!st->converted)
        return mgt_errf(err, "%s: out of memory converting %zu values to float32", path, total);
    float *out = st->converted;
    for (int i = 0; i < st->nt; i++) {
        const char *dt = st->t[i].dtype;
        const unsigned char *p = (const unsigned char *)st->blob + where[i].begin;
        const int eb = dtype_bytes(dt);
        const size_t n = (size_t)(where[i].end - where[i].begin) / (size_t)eb;
        if (strcmp(dt, "F16") && strcmp(dt, "BF16") && strcmp(dt, "F64"))
            continue;
        st->t[i].data = out;
        for (size_t j = 0; j < n; j++, p += eb) {
            if (eb == 8) {
                double d;
                memcpy(&d, p, sizeof d);
                out[j] = (float)d;
            } else {
                const uint16_t h = (uint16_t)(p[0] | p[1] << 8);
                out[j] = dt[0] == 'B' ? bf16_to_float(h) : half_to_float(h);
            }
        }
        out += n;
    }
    return 0;
}

static int parse_meta(const char *path, const cJSON *it, mgt_meta_entry *m, mgt_err *err) {
    if (!cJSON_IsString(it))
        return mgt_errf(err, "%s: metadata %s is not a string; the file is damaged", path,
                        it->string);
    if (strlen(it->string) >= sizeof m->key)
        return mgt_errf(err,
                        "%s: metadata key \"%.40s...\" is too long (%zu bytes, at most %zu "
                        "are supported)",
                        path, it->string, strlen(it->string), sizeof m->key - 1);
    if (strlen(it->valuestring) >= sizeof m->value)
        return mgt_errf(err,
                        "%s: metadata value of %s is too long (%zu bytes, at most %zu are "
                        "supported)",
                        path, it->string, strlen(it->valuestring), sizeof m->value - 1);
    snprintf(m->key, sizeof m->key, "%s", it->string);
    snprintf(m->value, sizeof m->value, "%s", it->valuestring);
    return 0;
}

/* A name that appears twice among n (cJSON keeps both copies of a repeated key), or NULL. */
static const char *first_repeat(const char **names, int n) {
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

/* The tensors' data must tile the data section exactly, as the safetensors reference reader
 * requires: sorted by offset, each starting where the previous one ended, the last ending at
 * the end of the data. Overlapping tensors would alias each other's values; gaps and trailing
 * bytes are damage. */
static int check_tiling(const char *path, const mgt_safetensors *st, span *order, int64_t dlen,
                        mgt_err *err) {
    qsort(order, (size_t)st->nt, sizeof *order, cmp_span);
    int64_t at = 0;
    for (int i = 0; i < st->nt; i++) {
        const mgt_tensor_entry *e = &st->t[order[i].index];
        int64_t b = order[i].begin, en = order[i].end;
        if (b < at)
            return mgt_errf(err,
                            "%s: tensor %s (data bytes %lld to %lld) overlaps tensor %s; the "
                            "file is damaged",
                            path, e->name, (long long)b, (long long)en,
                            st->t[order[i - 1].index].name);
        if (b > at)
            return mgt_errf(err,
                            "%s: data bytes %lld to %lld belong to no tensor; the file is "
                            "damaged",
                            path, (long long)at, (long long)b);
        at = en;
    }
    if (at != dlen)
        return mgt_errf(err, "%s: %lld bytes of data follow the last tensor; the file is damaged",
                        path, (long long)(dlen - at));
    return 0;
}

/* Parses and checks the header against the loaded data (st->blob, dlen bytes): every entry, no
 * name twice, the tensors tiling the data. When the metadata says the CRC covers the header,
 * *hcrc is the CRC-32 of the canonical header (the tree printed by cJSON without spaces, with
 * the crc32 value replaced by ST_CRC_ZERO) and *covered is set. */
static int parse_header(const char *path, const char *hdr, size_t hlen, int64_t dlen, int any,
                        mgt_safetensors *st, uint32_t *hcrc, int *covered, mgt_err *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    if (!root) {
        return mgt_errf(err,
                        "%s: the header is not a valid JSON object (error at byte %ld of "
                        "%zu); the file is damaged or not a safetensors file",
                        path, (long)(end ? end - hdr : 0), hlen);
    }
    for (const char *p = end; p < hdr + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(root);
            return mgt_errf(err,
                            "%s: byte %ld of the header follows its JSON object and is not "
                            "padding (a space); the file is damaged",
                            path, (long)(p - hdr));
        }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mgt_errf(err,
                        "%s: the header is valid JSON but not a JSON object; the file is "
                        "damaged or not a safetensors file",
                        path);
    }
    int nt = 0, nmeta = 0, nall = 0;
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        nt += strcmp(it->string, "__metadata__") != 0;
        nall++;
    }
    if (md && !cJSON_IsObject(md)) {
        cJSON_Delete(root);
        return mgt_errf(err, "%s: __metadata__ is not an object; the file is damaged", path);
    }
    nmeta = md ? cJSON_GetArraySize(md) : 0;
    st->t = calloc((size_t)nt + 1, sizeof *st->t);
    st->meta = calloc((size_t)nmeta + 1, sizeof *st->meta);
    const char **names = malloc(sizeof *names * ((size_t)(nall > nmeta ? nall : nmeta) + 1));
    span *order = malloc(sizeof *order * ((size_t)nt + 1));
    int rc = 0;
    if (!st->t || !st->meta || !names || !order)
        rc = mgt_errf(err, "%s: out of memory reading the header", path);
    int n = 0;
    cJSON_ArrayForEach(it, root) {
        if (rc)
            break;
        names[n++] = it->string;
        if (strcmp(it->string, "__metadata__") == 0)
            continue;
        order[st->nt].index = st->nt;
        rc = parse_tensor(path, it, dlen, st->blob, any, &st->t[st->nt], &order[st->nt], err);
        st->nt += rc == 0;
    }
    const char *twice = rc ? NULL : first_repeat(names, n);
    if (twice)
        rc = mgt_errf(err, "%s: the header names %.80s twice; the file is damaged", path, twice);
    if (!rc && any) { /* before check_tiling sorts the spans */
        span *by_index = malloc(sizeof *by_index * ((size_t)nt + 1));
        rc = by_index ? 0 : mgt_errf(err, "%s: out of memory reading the header", path);
        for (int i = 0; !rc && i < st->nt; i++)
            by_index[order[i].index] = order[i];
        if (!rc)
            rc = convert_tensors(path, st, by_index, err);
        free(by_index);
    }
    if (!rc)
        rc = check_tiling(path, st, order, dlen, err);
    n = 0;
    if (!rc && md) {
        cJSON_ArrayForEach(it, md) {
            names[n++] = it->string;
            if ((rc = parse_meta(path, it, &st->meta[st->nmeta], err)))
                break;
            st->nmeta++;
        }
        twice = rc ? NULL : first_repeat(names, n);
        if (twice)
            rc = mgt_errf(err, "%s: the metadata names %.80s twice; the file is damaged", path,
                          twice);
    }
    const char *covers = rc ? NULL : mgt_safetensors_meta(st, ST_COVERS_KEY);
    *covered = covers != NULL;
    if (covers && strcmp(covers, ST_COVERS))
        rc = mgt_errf(err,
                      "%s: metadata %s = \"%.40s\" is not one this reader knows; the file "
                      "is damaged or from a newer mgtrain",
                      path, ST_COVERS_KEY, covers);
    cJSON *crc_item = md ? cJSON_GetObjectItemCaseSensitive(md, ST_CRC_KEY) : NULL;
    if (!rc && covers && crc_item) {
        char *canon =
            cJSON_SetValuestring(crc_item, ST_CRC_ZERO) ? cJSON_PrintUnformatted(root) : NULL;
        if (!canon)
            rc = mgt_errf(err, "%s: out of memory reading the header", path);
        else
            *hcrc = crc_update((uint32_t)crc32(0L, Z_NULL, 0), canon, strlen(canon));
        free(canon);
    }
    free(names);
    free(order);
    cJSON_Delete(root);
    return rc;
}

/* Verifies the CRC (see tensor_io.h for what it covers and when it is required). */
static int check_crc(const char *path, const mgt_safetensors *st, int64_t dlen, uint32_t hcrc,
                     int covered, mgt_err *err) {
    const char *want = mgt_safetensors_meta(st, ST_CRC_KEY);
    const char *format = mgt_safetensors_meta(st, "format");
    if (!want) {
        if (covered || (format && !strncmp(format, "mgtrain", 7)))
            return mgt_errf(err,
                            "%s: no %s in a file mgtrain wrote (format %.40s): it was removed or "
                            "the header is damaged; restore the file from a backup",
                            path, ST_CRC_KEY, format ? format : "?");
        return 0;
    }
    int hex = strlen(want) == 8;
    for (int i = 0; hex && i < 8; i++)
        hex = isxdigit((unsigned char)want[i]) != 0;
    unsigned long v = hex ? strtoul(want, NULL, 16) : 0;
    if (!hex)
        return mgt_errf(err,
                        "%s: metadata crc32 \"%.16s\" is not 8 hex digits; the file is "
                        "damaged",
                        path, want);
    uint32_t got =
        crc_update(covered ? hcrc : (uint32_t)crc32(0L, Z_NULL, 0), st->blob, (size_t)dlen);
    if (got != (uint32_t)v)
        return mgt_errf(err,
                        "%s: CRC mismatch: the file is damaged (the %s's CRC-32 is %08x, "
                        "the header says %s); restore it from a backup or write it again",
                        path, covered ? "header and data" : "data", (unsigned)got, want);
    return 0;
}

/* The 8-byte length prefix against the file's size; the header length in *hlen. */
static int check_prefix(const char *path, const unsigned char *pre, int64_t size, uint64_t *hlen,
                        mgt_err *err) {
    if (size < 8)
        return mgt_errf(err,
                        "%s is truncated: %lld bytes, fewer than the 8-byte header length; the "
                        "file is damaged or not a safetensors file",
                        path, (long long)size);
    *hlen = 0;
    for (int b = 0; b < 8; b++)
        *hlen |= (uint64_t)pre[b] << (8 * b);
    if (*hlen > (uint64_t)(size - 8))
        return mgt_errf(err,
                        "%s is truncated: its header length says %llu bytes but only %lld bytes "
                        "follow; the file is damaged or not a safetensors file",
                        path, (unsigned long long)*hlen, (long long)(size - 8));
    if (*hlen > ST_MAX_HEADER)
        return mgt_errf(err,
                        "%s: header of %llu bytes is implausibly large; the file is damaged or "
                        "not a safetensors file",
                        path, (unsigned long long)*hlen);
    return 0;
}

/* Everything after the bytes are in memory: the header, the tiling, the CRC. */
static int parse_loaded(const char *path, const char *hdr, size_t hlen, int64_t dlen, int any,
                        mgt_safetensors *st, mgt_err *err) {
    uint32_t hcrc = 0;
    int covered = 0;
    if (parse_header(path, hdr, hlen, dlen, any, st, &hcrc, &covered, err) ||
        check_crc(path, st, dlen, hcrc, covered, err)) {
        mgt_safetensors_free(st);
        return -1;
    }
    return 0;
}

int mgt_safetensors_parse(const char *name, const void *bytes, size_t size, mgt_safetensors *st,
                          mgt_err *err) {
    memset(st, 0, sizeof *st);
    uint64_t hlen = 0;
    const unsigned char *b = bytes;
    if (check_prefix(name, b, (int64_t)size, &hlen, err))
        return -1;
    const int64_t dlen = (int64_t)size - 8 - (int64_t)hlen;
    st->blob = malloc(dlen > 0 ? (size_t)dlen : 1); /* aligned for the floats */
    if (!st->blob)
        return mgt_errf(err, "%s: out of memory for %lld bytes", name, (long long)size);
    if (dlen > 0)
        memcpy(st->blob, b + 8 + hlen, (size_t)dlen);
    return parse_loaded(name, (const char *)b + 8, (size_t)hlen, dlen, 0, st, err);
}

static int read_file(const char *path, int any, mgt_safetensors *st, mgt_err *err) {
    memset(st, 0, sizeof *st);
    /* Not blocking: a pipe named as a weights file is refused below instead of waiting for a
     * writer. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return mgt_errf(err, "%s: cannot open (%s); check the path", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return mgt_errf(err,
                        "%s is not a regular file (a pipe, device or folder); pass a "
                        "safetensors file",
                        path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return mgt_errf(err, "%s: cannot read (%s)", path, strerror(errno));
    }
    char *hdr = NULL;
    int rc = -1;
    unsigned char pre[8];
    uint64_t hlen = 0;
    const int64_t size = sb.st_size;
    if (size >= 8 && fread(pre, 1, 8, f) != 8) {
        mgt_errf(err, "%s is truncated or unreadable (%s)", path, errstr(errno));
        goto out;
    }
    if (check_prefix(path, pre, size, &hlen, err))
        goto out;
    const int64_t dlen = size - 8 - (int64_t)hlen;
    hdr = malloc(hlen + 1);
    st->blob = malloc(dlen > 0 ? (size_t)dlen : 1);
    if (!hdr || !st->blob) {
        mgt_errf(err, "%s: out of memory for %lld bytes", path, (long long)size);
        goto out;
    }
    errno = 0;
    if (fread(hdr, 1, hlen, f) != hlen ||
        (dlen > 0 && fread(st->blob, 1, (size_t)dlen, f) != (size_t)dlen)) {
        mgt_errf(err, "%s is truncated or unreadable (%s)", path, errstr(errno));
        goto out;
    }
    rc = parse_loaded(path, hdr, hlen, dlen, any, st, err);
out:
    fclose(f);
    free(hdr);
    if (rc)
        mgt_safetensors_free(st);
    return rc ? -1 : 0;
}

int mgt_safetensors_read(const char *path, mgt_safetensors *st, mgt_err *err) {
    return read_file(path, 0, st, err);
}

int mgt_safetensors_read_any(const char *path, mgt_safetensors *st, mgt_err *err) {
    return read_file(path, 1, st, err);
}

const mgt_tensor_entry *mgt_safetensors_find(const mgt_safetensors *st, const char *name) {
    for (int i = 0; i < st->nt; i++)
        if (strcmp(st->t[i].name, name) == 0)
            return &st->t[i];
    return NULL;
}

const char *mgt_safetensors_meta(const mgt_safetensors *st, const char *key) {
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[i].key, key) == 0)
            return st->meta[i].value;
    return NULL;
}

void mgt_safetensors_free(mgt_safetensors *st) {
    if (!st)
        return;
    free(st->t);
    free(st->meta);
    free(st->blob);
    free(st->converted);
    memset(st, 0, sizeof *st);
}

/* ---- .npy ------------------------------------------------------------------------------- */

int mgt_npy_write_parts(const char *path, const char *descr, const int64_t *shape, int ndim,
                        int nparts, const void *const *parts, const size_t *lens, mgt_err *err) {
    /* Format 1.0: magic, version, uint16 LE header length, then the dict padded with spaces and
     * ended by '\n' so that the data starts at a multiple of 64 bytes. */
    char buf[512], dims[400];
    size_t o = 0;
    for (int d = 0; d < ndim && d < 8; d++)
        o += (size_t)snprintf(dims + o, sizeof dims - o, "%lld, ", (long long)shape[d]);
    if (ndim > 1) /* (N, H, W, C), but (N,) for one dimension */
        dims[o - 2] = 0;
    else
        dims[o ? o - 1 : 0] = 0;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    int n = snprintf(buf + 10, sizeof buf - 10,
                     "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims);
    size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64;
    memset(buf + 10 + n, ' ', total - 10 - (size_t)n - 1);
    buf[total - 1] = '\n';
    size_t hl = total - 10;
    buf[8] = (char)(hl & 0xff);
    buf[9] = (char)(hl >> 8);

    afile a;
    if (af_open(&a, path, err) || af_write(&a, buf, total, err))
        return -1;
    for (int i = 0; i < nparts; i++)
        if (af_write(&a, parts[i], lens[i], err))
            return -1;
    return af_commit(&a, err);
}

int mgt_npy_write(const char *path, const float *data, int64_t rows, int64_t cols, mgt_err *err) {
    if (rows < 0 || cols < 0 || (cols > 0 && rows > ST_MAX_BYTES / 4 / cols))
        return mgt_errf(err, "%s: invalid array shape (%lld, %lld)", path, (long long)rows,
                        (long long)cols);
    const int64_t bytes = 4 * rows * cols;
    if (bytes > 0 && !data)
        return mgt_errf(err, "%s: no data for a (%lld, %lld) array", path, (long long)rows,
                        (long long)cols);
    const int64_t shape[2] = {rows, cols};
    const void *parts[1] = {data};
    const size_t lens[1] = {(size_t)bytes};
    return mgt_npy_write_parts(path, "<f4", shape, 2, 1, parts, lens, err);
}

int mgt_read_text_file(const char *path, const char *what, size_t max_bytes, char **text,
                       size_t *len, mgt_err *err) {
    *text = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return mgt_errf(err, "cannot open %s %s: %s", what, path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return mgt_errf(err, "%s %s is not a regular file (a folder, pipe or device)", what, path);
    }
    if ((uint64_t)sb.st_size > max_bytes) {
        close(fd);
        return mgt_errf(err, "%s %s has %lld bytes, more than the %zu it may have", what, path,
                        (long long)sb.st_size, max_bytes);
    }
    char *t = malloc((size_t)sb.st_size + 1);
    size_t got = 0;
    while (t && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, t + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    int read_errno = errno;
    close(fd);
    if (!t)
        return mgt_errf(err, "out of memory reading %s %s", what, path);
    if (got != (size_t)sb.st_size) {
        free(t);
        return mgt_errf(err, "cannot read %s %s: %s", what, path,
                        got < (size_t)sb.st_size ? "it was cut short while read"
                                                 : strerror(read_errno));
    }
    t[got] = 0;
    *text = t;
    if (len)
        *len = got;
    return 0;
}
