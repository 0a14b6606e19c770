/* test_tensor_io.c: safetensors files, .npy outputs and atomic writes (src/tensor_io.c).
 *
 * Round trip of several tensors (including a scalar, an empty and a 4-d one) and metadata with
 * characters JSON must escape; the on-disk layout (length prefix, space-padded header, tensor
 * order, data offsets, crc32 metadata); every kind of damage is refused with a message saying so
 * (a flipped data byte -> CRC mismatch, truncation at several points, garbage or non-JSON headers,
 * wrong dtype, offsets that disagree with the shape, names too long); files written by other tools
 * without a crc32 are accepted. The CRC covers the header too: every single-byte change of a
 * checkpoint is refused, a checkpoint without its crc32 is refused, files of mgtrain 0.1.0 (CRC of
 * the data only) are still checked; names given twice, tensors that overlap, leave gaps or leave
 * bytes after them, and pipes are refused. Atomicity: a write into a missing folder or under a
 * regular file fails and creates nothing; a write that fails midway (file size limit) or at the
 * rename leaves the existing file byte-for-byte as it was and no temporary file behind; a device,
 * pipe or folder is never replaced, a symbolic link to a regular file is written through. The .npy
 * header is checked byte-exactly, and numpy itself loads the file when /usr/bin/python3 has numpy.
 * Other tools' dtypes (mgt_safetensors_read_any, --init-weights): F16, BF16 and F64 tensors come
 * back as float32 with the exact values (each chosen representable in both: normal, subnormal
 * half, signed zero, infinity), I64 tensors with no data; the strict reader refuses them.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <zlib.h>

#include "tensor_io.h"

#include "tally.h"


/* Reads a whole file into a malloc'd buffer (NULL if it does not exist). */
static unsigned char *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*len + 1);
    if (b && fread(b, 1, (size_t)*len, f) != (size_t)*len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static int spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A safetensors file in memory from a literal header (padded to 8 with spaces) and raw data. */
static unsigned char *st_bytes(const char *json, const void *data, size_t dlen, size_t *len) {
    size_t jl = strlen(json), hl = (jl + 7) / 8 * 8;
    unsigned char *b = malloc(8 + hl + dlen + 1);
    if (!b)
        return NULL;
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, jl);
    memset(b + 8 + jl, ' ', hl - jl);
    if (dlen)
        memcpy(b + 8 + hl, data, dlen);
    *len = 8 + hl + dlen;
    return b;
}

/* The same file on disk. */
static int write_st(const char *path, const char *json, const void *data, size_t dlen) {
    size_t n;
    unsigned char *b = st_bytes(json, data, dlen, &n);
    int rc = b ? spit(path, b, n) : -1;
    free(b);
    return rc;
}

/* F16, BF16, F64 and I64 tensors, as PyTorch saves them (see the top). */
static void test_dtypes(tally *t, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/dtypes.safetensors", dir);
    /* half: 1.5, -2, 2^-24 (the least subnormal), -0, +inf; bfloat16: 1.5, -2^-130; f64: 0.1 and
     * 3 (0.1 rounds to the nearest float); i64: 7 */
    const unsigned char data[] = {
        0x00, 0x3e, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x80, 0x00, 0x7c, /* F16 [5], bytes 0-10 */
        0xc0, 0x3f, 0x08, 0x80,                                     /* BF16 [2], 10-14 */
        0x9a, 0x99, 0x99, 0x99, 0x99, 0x99, 0xb9, 0x3f,             /* F64 [2], 14-30 */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x40,
        0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}; /* I64 [], 30-38 */
    const char *json = "{\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[10,14]},"
                       "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[14,30]},"
                       "\"n\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[30,38]}}";
    CHECK(t, write_st(path, json, data, sizeof data) == 0);
    mgt_safetensors st;
    mgt_err e;
    CHECK(t, mgt_safetensors_read(path, &st, &e) < 0 && strstr(e.msg, "has dtype F16"));
    CHECK(t, mgt_safetensors_read_any(path, &st, &e) == 0);
    const mgt_tensor_entry *h = mgt_safetensors_find(&st, "h"), *b = mgt_safetensors_find(&st, "b"),
                           *d = mgt_safetensors_find(&st, "d"), *n = mgt_safetensors_find(&st, "n");
    CHECK(t, h && b && d && n && h->data && b->data && d->data && !n->data);
    if (h && b && d && n && h->data && b->data && d->data) {
        CHECK(t, h->data[0] == 1.5f && h->data[1] == -2.0f && h->data[2] == 0x1p-24f);
        CHECK(t, h->data[3] == 0.0f && signbit(h->data[3]) && isinf(h->data[4]) && h->data[4] > 0);
        CHECK(t, b->data[0] == 1.5f && b->data[1] == -0x1p-130f);
        CHECK(t, d->data[0] == 0.1f && d->data[1] == 3.0f);
        CHECK(t, !strcmp(n->dtype, "I64") && n->ndim == 0 && !strcmp(h->dtype, "F16"));
    }
    mgt_safetensors_free(&st);
}

/* Entries of dir whose name contains ".tmp.". */
static int count_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static mgt_tensor_entry tensor(const char *name, const float *data, int ndim, int64_t d0,
                               int64_t d1, int64_t d2, int64_t d3) {
    mgt_tensor_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.name, sizeof e.name, "%s", name);
    e.ndim = ndim;
    e.shape[0] = d0;
    e.shape[1] = d1;
    e.shape[2] = d2;
    e.shape[3] = d3;
    e.data = data;
    return e;
}

static void test_roundtrip(tally *t, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    float w[12], b[4] = {0.5f, -1.25f, 3e-30f, -0.0f}, s = 42.0f, q[24];
    for (int i = 0; i < 12; i++)
        w[i] = (float)i * 0.1f - 0.3f;
    for (int i = 0; i < 24; i++)
        q[i] = (float)(i * i) / 7.0f;
    mgt_tensor_entry ts[5] = {
        tensor("layer0.weight", w, 2, 3, 4, 0, 0), tensor("layer0.bias", b, 1, 4, 0, 0, 0),
        tensor("scalar", &s, 0, 0, 0, 0, 0),       tensor("empty", NULL, 2, 0, 5, 0, 0),
        tensor("conv/4d", q, 4, 2, 3, 2, 2),
    };
    mgt_meta_entry meta[3];
    memset(meta, 0, sizeof meta);
    snprintf(meta[0].key, sizeof meta[0].key, "step");
    snprintf(meta[0].value, sizeof meta[0].value, "123");
    snprintf(meta[1].key, sizeof meta[1].key, "config");
    snprintf(meta[1].value, sizeof meta[1].value, "a \"quoted\" \\ value\nwith\ttabs, é");
    snprintf(meta[2].key, sizeof meta[2].key, "empty");
    mgt_err err = {{0}};
    int rc = mgt_safetensors_write(path, ts, 5, meta, 3, &err);
    CHECK(t, rc == 0);
    if (rc) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    CHECK(t, count_tmp(dir) == 0);

    mgt_safetensors st;
    rc = mgt_safetensors_read(path, &st, &err);
    CHECK(t, rc == 0);
    if (rc) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    CHECK(t, st.nt == 5);
    for (int i = 0; i < st.nt && i < 5; i++) { /* the file's order is the given order */
        CHECK(t, strcmp(st.t[i].name, ts[i].name) == 0);
        CHECK(t, st.t[i].ndim == ts[i].ndim);
        int64_t n = 1;
        for (int d = 0; d < ts[i].ndim; d++) {
            CHECK(t, st.t[i].shape[d] == ts[i].shape[d]);
            n *= ts[i].shape[d];
        }
        CHECK(t, n == 0 || memcmp(st.t[i].data, ts[i].data, (size_t)n * 4) == 0);
        CHECK(t, ((uintptr_t)st.t[i].data & 3) == 0);
    }
    const mgt_tensor_entry *e = mgt_safetensors_find(&st, "layer0.bias");
    CHECK(t, e && e->ndim == 1 && e->shape[0] == 4 && e->data[1] == -1.25f);
    CHECK(t, mgt_safetensors_find(&st, "nope") == NULL);
    const char *v = mgt_safetensors_meta(&st, "step");
    CHECK(t, v && strcmp(v, "123") == 0);
    v = mgt_safetensors_meta(&st, "config");
    CHECK(t, v && strcmp(v, meta[1].value) == 0);
    v = mgt_safetensors_meta(&st, "empty");
    CHECK(t, v && v[0] == 0);
    v = mgt_safetensors_meta(&st, "crc32");
    int hex = v && strlen(v) == 8;
    for (int i = 0; hex && i < 8; i++)
        hex = (v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f');
    CHECK(t, hex);
    CHECK(t, mgt_safetensors_meta(&st, "nope") == NULL);
    v = mgt_safetensors_meta(&st, "crc32_covers");
    CHECK(t, v && strcmp(v, "header,data") == 0);
    CHECK(t, st.nmeta == 5);
    mgt_safetensors_free(&st);
    CHECK(t, st.t == NULL && st.blob == NULL && st.nt == 0);

    /* The raw layout. */
    long len = 0;
    unsigned char *raw = slurp(path, &len);
    CHECK(t, raw != NULL);
    if (!raw)
        return;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)raw[i] << (8 * i);
    const long data_bytes = 4 * (12 + 4 + 1 + 0 + 24);
    CHECK(t, hl % 8 == 0 && (long)(8 + hl) + data_bytes == len);
    CHECK(t, raw[8] == '{');
    char *hdr = malloc(hl + 1);
    if (hdr) {
        memcpy(hdr, raw + 8, hl);
        hdr[hl] = 0;
        char *end = hdr + hl;
        while (end > hdr && end[-1] == ' ')
            *--end = 0;
        CHECK(t, end > hdr && end[-1] == '}' && (size_t)(end - hdr) + 8 > hl);
        const char *p0 = strstr(hdr, "\"layer0.weight\""), *p1 = strstr(hdr, "\"layer0.bias\"");
        const char *pm = strstr(hdr, "\"__metadata__\"");
        CHECK(t, p0 && p1 && pm && p0 < p1 && p1 < pm);
        CHECK(t, strstr(hdr, "\"dtype\":\"F32\"") != NULL);
        CHECK(t, strstr(hdr, "\"shape\":[3,4]") != NULL);
        CHECK(t, strstr(hdr, "\"data_offsets\":[0,48]") != NULL);
        CHECK(t, strstr(hdr, "\"data_offsets\":[48,64]") != NULL);
        CHECK(t, strstr(hdr, "\"shape\":[],\"data_offsets\":[64,68]") != NULL);
        free(hdr);
    }
    CHECK(t, memcmp(raw + 8 + hl, w, sizeof w) == 0);

    /* Damage: one flipped data byte is caught by the CRC; restoring it makes the file good. */
    raw[8 + hl + 5] ^= 0x10;
    CHECK(t, spit(path, raw, (size_t)len) == 0);
    rc = mgt_safetensors_read(path, &st, &err);
    CHECK_ERR(t, rc, &err, path, "CRC mismatch", "damaged");
    CHECK(t, st.t == NULL && st.blob == NULL);
    raw[8 + hl + 5] ^= 0x10;
    CHECK(t, spit(path, raw, (size_t)len) == 0);
    CHECK(t, mgt_safetensors_read(path, &st, &err) == 0);
    mgt_safetensors_free(&st);

    /* Truncation: inside the length prefix, inside the header, inside the data. */
    CHECK(t, spit(path, raw, 5) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "truncated");
    CHECK(t, spit(path, raw, 8 + hl / 2) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "truncated");
    CHECK(t, spit(path, raw, (size_t)len - 4) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "truncated");
    CHECK(t, spit(path, raw, 0) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "truncated");
    free(raw);

    /* Not a safetensors file at all, and a header that is not JSON. */
    const char text[] = "hello, this is not a safetensors file at all\n";
    CHECK(t, spit(path, text, sizeof text - 1) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path);
    CHECK(t, write_st(path, "not json at all!", NULL, 0) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "not a valid JSON");
    CHECK(t, write_st(path, "[1,2,3]", NULL, 0) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "not a JSON object");
    CHECK(t, write_st(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}",
                      "abcd", 4) == 0); /* a missing closing brace */
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "not a valid JSON");

    /* A file from another writer: no metadata, no crc32; accepted. */
    const float two[2] = {1.5f, -2.0f};
    CHECK(t, write_st(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", two,
                      8) == 0);
    rc = mgt_safetensors_read(path, &st, &err);
    CHECK(t, rc == 0 && st.nt == 1 && st.nmeta == 0 && st.t[0].data[1] == -2.0f);
    mgt_safetensors_free(&st);

    /* Wrong dtype, offsets that disagree with the shape or leave the data, bad shapes. */
    CHECK(t, write_st(path, "{\"x\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", two,
                      8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "F16", "only F32");
    CHECK(t, write_st(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", two,
                      8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "shape needs 12");
    CHECK(t, write_st(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                      two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "outside");
    CHECK(t, write_st(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
                      two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "invalid shape");
    CHECK(t, write_st(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "data_offsets");
    CHECK(t,
          write_st(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}",
                   two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "dimensions");
    CHECK(t, write_st(path,
                      "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"__metadata__\":{\"crc32\":\"zzzzzzzz\"}}",
                      two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "crc32");
    CHECK(t, write_st(path,
                      "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"__metadata__\":{\"n\":3}}",
                      two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "not a string");

    /* Names and metadata longer than the entries hold are refused, not cut. */
    char json[1024], longname[201];
    memset(longname, 'n', 200);
    longname[200] = 0;
    snprintf(json, sizeof json, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             longname);
    CHECK(t, write_st(path, json, two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "longer than the 127");
    longname[127] = 0; /* exactly 127 is fine */
    snprintf(json, sizeof json, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             longname);
    CHECK(t, write_st(path, json, two, 8) == 0);
    rc = mgt_safetensors_read(path, &st, &err);
    CHECK(t, rc == 0 && st.nt == 1 && strlen(st.t[0].name) == 127);
    mgt_safetensors_free(&st);
    longname[80] = 0;
    snprintf(json, sizeof json,
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"__metadata__\":{\"%s\":\"v\"}}",
             longname);
    CHECK(t, write_st(path, json, two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "key", "too long");
    char longval[301];
    memset(longval, 'v', 300);
    longval[300] = 0;
    snprintf(json, sizeof json,
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"__metadata__\":{\"k\":\"%s\"}}",
             longval);
    CHECK(t, write_st(path, json, two, 8) == 0);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "value of k", "too long");

    /* Missing file. */
    snprintf(path, sizeof path, "%s/absent.safetensors", dir);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "No such file");

    /* The writer refuses bad input without touching the file. */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(t, mgt_safetensors_write(path, ts, 2, NULL, 0, &err) == 0);
    long before_len = 0, after_len = 0;
    unsigned char *before = slurp(path, &before_len);
    mgt_tensor_entry dup[2] = {ts[0], ts[0]};
    CHECK_ERR(t, mgt_safetensors_write(path, dup, 2, NULL, 0, &err), &err, path, "twice");
    mgt_tensor_entry five = tensor("x", w, 5, 1, 1, 1, 1);
    CHECK_ERR(t, mgt_safetensors_write(path, &five, 1, NULL, 0, &err), &err, path, "dimensions");
    mgt_tensor_entry neg = tensor("x", w, 1, -3, 0, 0, 0);
    CHECK_ERR(t, mgt_safetensors_write(path, &neg, 1, NULL, 0, &err), &err, path, "shape");
    unsigned char *after = slurp(path, &after_len);
    CHECK(t, before && after && before_len == after_len &&
                 memcmp(before, after, (size_t)before_len) == 0);
    free(before);
    free(after);
    CHECK(t, count_tmp(dir) == 0);

    /* No tensors at all is a valid file. */
    CHECK(t, mgt_safetensors_write(path, NULL, 0, meta, 1, &err) == 0);
    rc = mgt_safetensors_read(path, &st, &err);
    CHECK(t, rc == 0 && st.nt == 0 && mgt_safetensors_meta(&st, "step") != NULL);
    mgt_safetensors_free(&st);
}

/* PARSE_ERR(T, JSON, DATA, DLEN, WORDS...): the file is refused with all the words. */
#define PARSE_ERR(T, json, data, dlen, ...)                                                        \
    do {                                                                                           \
        size_t n_;                                                                                 \
        unsigned char *b_ = st_bytes((json), (data), (dlen), &n_);                                 \
        mgt_safetensors st_;                                                                       \
        mgt_err e_ = {{0}};                                                                        \
        CHECK_ERR((T), b_ ? mgt_safetensors_parse("mem", b_, n_, &st_, &e_) : 0, &e_, "mem",       \
                  __VA_ARGS__);                                                                    \
        free(b_);                                                                                  \
    } while (0)

/* What the reader refuses that the safetensors reference reader refuses too, and what the CRC
 * covers: every byte of a file mgtrain wrote. */
static void test_integrity(tally *t, const char *dir) {
    const float four[4] = {1, 2, 3, 4};
    mgt_err err = {{0}};
    mgt_safetensors st;

    /* The same name twice (cJSON keeps both; the first used to win), in tensors or metadata. */
    PARSE_ERR(t,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
              four, 16, "names a twice");
    PARSE_ERR(t,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"__metadata__\":{\"step\":\"1\",\"step\":\"2\"}}",
              four, 16, "metadata names step twice");
    /* Overlapping tensors, a gap, bytes after the last tensor, data but no tensor. */
    PARSE_ERR(t,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
              four, 16, "tensor b", "overlaps tensor a");
    PARSE_ERR(t,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
              four, 16, "bytes 4 to 8 belong to no tensor");
    PARSE_ERR(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", four, 16,
              "8 bytes of data follow the last tensor");
    PARSE_ERR(t, "{}", four, 16, "16 bytes of data follow the last tensor");
    /* Something other than padding after the JSON object. */
    PARSE_ERR(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}} x", four, 16,
              "follows its JSON object");
    /* Tensors in any order, and empty ones anywhere, tile the data fine. */
    size_t n;
    unsigned char *b = st_bytes("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                                "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                                "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                                four, 16, &n);
    CHECK(t, b && mgt_safetensors_parse("mem", b, n, &st, &err) == 0 && st.nt == 3 &&
                 st.t[0].data[1] == 4.0f && st.t[2].data[0] == 1.0f);
    mgt_safetensors_free(&st);
    free(b);

    /* Every single-byte change anywhere in a file mgtrain wrote is refused: in the length
     * prefix, the header (names, shapes, offsets, metadata: the CRC covers them), the padding
     * and the data. Three changes per byte; all but the last leave the file's length alone. */
    char path[600];
    snprintf(path, sizeof path, "%s/every.safetensors", dir);
    const float w[6] = {0.5f, -1, 2, 3.25f, 0, 7};
    mgt_tensor_entry ts[2] = {tensor("dense_1.weight", w, 2, 2, 2, 0, 0),
                              tensor("dense_1.bias", w + 4, 1, 2, 0, 0, 0)};
    mgt_meta_entry meta[2] = {{"format", "mgtrain-checkpoint-1"}, {"step", "1234"}};
    CHECK(t, mgt_safetensors_write(path, ts, 2, meta, 2, &err) == 0);
    long len = 0;
    unsigned char *raw = slurp(path, &len);
    CHECK(t, raw != NULL);
    if (!raw)
        return;
    CHECK(t, mgt_safetensors_parse(path, raw, (size_t)len, &st, &err) == 0);
    mgt_safetensors_free(&st);
    int missed = 0;
    static const unsigned char flips[3] = {0x01, 0x80, 0xff};
    for (long i = 0; i < len; i++)
        for (int k = 0; k < 3; k++) {
            raw[i] ^= flips[k];
            if (mgt_safetensors_parse(path, raw, (size_t)len, &st, &err) == 0) {
                missed++;
                mgt_safetensors_free(&st);
                fprintf(stderr, "  byte %ld ^ 0x%02x went unnoticed\n", i, flips[k]);
            }
            raw[i] ^= flips[k];
        }
    CHECK(t, missed == 0);
    printf("integrity: all %ld single-byte changes (x3) of a %ld-byte checkpoint are refused\n",
           len, len);

    /* A checkpoint whose crc32 was removed (the header rewritten without it) and then damaged
     * is refused; a weights file from another tool without one loads. */
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)raw[i] << (8 * i);
    char *hdr = calloc(hl + 1, 1), *cut;
    if (hdr) {
        memcpy(hdr, raw + 8, hl);
        cut = strstr(hdr, ",\"crc32\":"); /* the writer puts crc32 and crc32_covers last */
        CHECK(t, cut != NULL);
        if (cut) {
            strcpy(cut, "}}");
            PARSE_ERR(t, hdr, raw + 8 + hl, (size_t)len - 8 - hl, "no crc32",
                      "mgtrain-checkpoint-1");
            char *fmt = strstr(hdr, "mgtrain-checkpoint-1");
            memcpy(fmt, "pt\"", 3);
            memmove(fmt + 3, fmt + 21, strlen(fmt + 21) + 1);
            b = st_bytes(hdr, raw + 8 + hl, (size_t)len - 8 - hl, &n);
            CHECK(t, b && mgt_safetensors_parse("mem", b, n, &st, &err) == 0 && st.nt == 2);
            mgt_safetensors_free(&st);
            free(b);
        }
        free(hdr);
    }
    free(raw);

    /* Files of mgtrain 0.1.0: crc32 over the data alone, still checked. */
    char json[256];
    uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const unsigned char *)four, 16);
    snprintf(json, sizeof json,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"__metadata__\":{\"format\":\"mgtrain-checkpoint-1\",\"crc32\":\"%08x\"}}",
             (unsigned)crc);
    b = st_bytes(json, four, 16, &n);
    CHECK(t, b && mgt_safetensors_parse("mem", b, n, &st, &err) == 0 && st.nt == 1);
    mgt_safetensors_free(&st);
    if (b)
        b[n - 1] ^= 1;
    CHECK_ERR(t, b ? mgt_safetensors_parse("mem", b, n, &st, &err) : 0, &err, "CRC mismatch",
              "the data's CRC-32");
    free(b);
    PARSE_ERR(t,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"__metadata__\":{\"crc32\":\"00000000\",\"crc32_covers\":\"everything\"}}",
              four, 16, "crc32_covers", "not one this reader knows");

    /* A pipe named as a weights file is refused at once (the alarm turns a hang into a
     * failure). */
    snprintf(path, sizeof path, "%s/weights.fifo", dir);
    CHECK(t, mkfifo(path, 0600) == 0);
    alarm(20);
    CHECK_ERR(t, mgt_safetensors_read(path, &st, &err), &err, path, "not a regular file");
    alarm(0);
}

static void test_atomic(tally *t, const char *dir) {
    char path[1100], sub[512];
    mgt_err err = {{0}};
    struct stat sb;

    /* Plain round trip and overwrite. */
    snprintf(path, sizeof path, "%s/blob.bin", dir);
    CHECK(t, mgt_atomic_write(path, "first version", 13, &err) == 0);
    CHECK(t, mgt_atomic_write(path, "second", 6, &err) == 0);
    long len = 0;
    unsigned char *b = slurp(path, &len);
    CHECK(t, b && len == 6 && memcmp(b, "second", 6) == 0);
    free(b);
    CHECK(t, mgt_atomic_write(path, "", 0, &err) == 0 && stat(path, &sb) == 0 && sb.st_size == 0);

    /* Into a folder that does not exist: an error naming PATH and the reason; nothing created. */
    snprintf(sub, sizeof sub, "%s/no/such/dir", dir);
    snprintf(path, sizeof path, "%s/w.safetensors", sub);
    float x[3] = {1, 2, 3};
    mgt_tensor_entry e = tensor("x", x, 1, 3, 0, 0, 0);
    CHECK_ERR(t, mgt_safetensors_write(path, &e, 1, NULL, 0, &err), &err, path, strerror(ENOENT));
    CHECK_ERR(t, mgt_atomic_write(path, "x", 1, &err), &err, path, strerror(ENOENT));
    CHECK_ERR(t, mgt_npy_write(path, x, 1, 3, &err), &err, path, strerror(ENOENT));
    snprintf(sub, sizeof sub, "%s/no", dir);
    CHECK(t, stat(sub, &sb) != 0);

    /* Under a regular file (root ignores permissions, so this is the unwritable folder). */
    snprintf(sub, sizeof sub, "%s/plainfile", dir);
    CHECK(t, spit(sub, "x", 1) == 0);
    snprintf(path, sizeof path, "%s/w.safetensors", sub);
    CHECK_ERR(t, mgt_safetensors_write(path, &e, 1, NULL, 0, &err), &err, path, strerror(ENOTDIR));
    CHECK(t, stat(sub, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 1);

    /* A write failing midway (a file size limit: EFBIG) leaves the existing file as it was. */
    snprintf(path, sizeof path, "%s/keep.safetensors", dir);
    CHECK(t, mgt_safetensors_write(path, &e, 1, NULL, 0, &err) == 0);
    long old_len = 0;
    unsigned char *old = slurp(path, &old_len);
    enum { BIG = 1 << 18 };
    float *big = calloc(BIG, sizeof *big);
    struct rlimit saved, lim;
    if (big && getrlimit(RLIMIT_FSIZE, &saved) == 0) {
        void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
        lim = saved;
        lim.rlim_cur = 64 * 1024;
        CHECK(t, setrlimit(RLIMIT_FSIZE, &lim) == 0);
        mgt_tensor_entry be = tensor("big", big, 1, BIG, 0, 0, 0);
        int rc = mgt_safetensors_write(path, &be, 1, NULL, 0, &err);
        CHECK_ERR(t, rc, &err, path, strerror(EFBIG));
        rc = mgt_npy_write(path, big, 1, BIG, &err);
        CHECK_ERR(t, rc, &err, path, strerror(EFBIG));
        rc = mgt_atomic_write(path, big, BIG * sizeof *big, &err);
        CHECK_ERR(t, rc, &err, path, strerror(EFBIG));
        CHECK(t, setrlimit(RLIMIT_FSIZE, &saved) == 0);
        signal(SIGXFSZ, prev);
    }
    free(big);
    long now_len = 0;
    unsigned char *now = slurp(path, &now_len);
    CHECK(t, old && now && old_len == now_len && memcmp(old, now, (size_t)old_len) == 0);
    free(old);
    free(now);
    mgt_safetensors st;
    CHECK(t, mgt_safetensors_read(path, &st, &err) == 0 && st.nt == 1);
    mgt_safetensors_free(&st);

    /* PATH is a folder: refused before anything is written; the folder stays. */
    snprintf(sub, sizeof sub, "%s/afolder", dir);
    CHECK(t, mkdir(sub, 0755) == 0);
    snprintf(path, sizeof path, "%s/afolder/inside", dir);
    CHECK(t, spit(path, "x", 1) == 0);
    CHECK_ERR(t, mgt_atomic_write(sub, "data", 4, &err), &err, sub, "is a folder",
              "not a regular file");
    CHECK(t, stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode) && stat(path, &sb) == 0);

    /* Only regular files are replaced: a device, a pipe and a link to a folder are refused
     * (the rename would put a regular file in their place), a link to a regular file keeps
     * the link and replaces its target, a dangling link is refused. */
    snprintf(path, sizeof path, "%s/devnull", dir); /* the test's own device, where root */
    if (mknod(path, S_IFCHR | 0666, makedev(1, 3)) == 0) {
        CHECK_ERR(t, mgt_atomic_write(path, "x", 1, &err), &err, path, "a device");
        CHECK(t, stat(path, &sb) == 0 && S_ISCHR(sb.st_mode));
    }
    CHECK_ERR(t, mgt_output_check("/dev/null", "--timeline", &err), &err,
              "--timeline /dev/null is a device");
    snprintf(path, sizeof path, "%s/fifo", dir);
    CHECK(t, mkfifo(path, 0600) == 0);
    CHECK_ERR(t, mgt_npy_write(path, x, 1, 3, &err), &err, path, "a pipe");
    CHECK(t, stat(path, &sb) == 0 && S_ISFIFO(sb.st_mode));
    snprintf(sub, sizeof sub, "%s/real.bin", dir);
    CHECK(t, spit(sub, "old", 3) == 0);
    snprintf(path, sizeof path, "%s/link.bin", dir);
    CHECK(t, symlink(sub, path) == 0);
    CHECK(t, mgt_output_check(path, NULL, &err) == 0);
    CHECK(t, mgt_atomic_write(path, "new!", 4, &err) == 0);
    b = slurp(sub, &len);
    CHECK(t, b && len == 4 && memcmp(b, "new!", 4) == 0);
    free(b);
    CHECK(t, lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode));
    snprintf(path, sizeof path, "%s/dirlink", dir);
    snprintf(sub, sizeof sub, "%s/afolder", dir);
    CHECK(t, symlink(sub, path) == 0);
    CHECK_ERR(t, mgt_atomic_write(path, "x", 1, &err), &err, path, "symbolic link");
    snprintf(path, sizeof path, "%s/dangling", dir);
    CHECK(t, symlink("/nonexistent/target", path) == 0);
    CHECK_ERR(t, mgt_atomic_write(path, "x", 1, &err), &err, path, "symbolic link");
    CHECK(t, mgt_output_check("brand-new-name.bin", NULL, &err) == 0);

    CHECK(t, count_tmp(dir) == 0);
}

static void test_npy(tally *t, const char *dir) {
    char path[512];
    mgt_err err = {{0}};
    snprintf(path, sizeof path, "%s/out.npy", dir);
    const float a[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 65504.0f};
    CHECK(t, mgt_npy_write(path, a, 2, 3, &err) == 0);

    /* What numpy 1.24 writes for a (2, 3) float32 array: 128 header bytes, '\n' last. */
    unsigned char want[128];
    const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    memcpy(want, "\x93NUMPY\x01\x00\x76\x00", 10);
    memcpy(want + 10, dict, sizeof dict - 1);
    memset(want + 10 + sizeof dict - 1, ' ', 128 - 10 - (sizeof dict - 1));
    want[127] = '\n';
    long len = 0;
    unsigned char *b = slurp(path, &len);
    CHECK(t, b && len == 128 + 24);
    CHECK(t, b && memcmp(b, want, 128) == 0);
    CHECK(t, b && memcmp(b + 128, a, 24) == 0);
    free(b);

    /* Other shapes: total header a multiple of 64, ending in '\n'. */
    static const int64_t shapes[][2] = {{0, 1234567}, {1, 1}, {10000, 10}, {0, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t r = shapes[i][0], c = shapes[i][1];
        float *data = calloc((size_t)(r * c) + 1, sizeof *data);
        CHECK(t, data && mgt_npy_write(path, data, r, c, &err) == 0);
        free(data);
        b = slurp(path, &len);
        if (!b) {
            CHECK(t, !"npy file missing");
            continue;
        }
        unsigned hl = b[8] | (unsigned)b[9] << 8;
        char shape[64];
        snprintf(shape, sizeof shape, "'shape': (%lld, %lld), }", (long long)r, (long long)c);
        CHECK(t, (10 + hl) % 64 == 0 && b[10 + hl - 1] == '\n');
        CHECK(t, len == (long)(10 + hl) + 4 * (long)(r * c));
        b[10 + hl - 1] = 0;
        CHECK(t, strstr((char *)b + 10, shape) != NULL);
        free(b);
    }
    CHECK_ERR(t, mgt_npy_write(path, a, -1, 3, &err), &err, path, "shape");

    /* numpy itself, when there is one. */
    if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        printf("npy: /usr/bin/python3 with numpy not found, numpy load check skipped\n");
        return;
    }
    CHECK(t, mgt_npy_write(path, a, 2, 3, &err) == 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import numpy, sys; a = numpy.load(sys.argv[1]); "
             "assert a.shape == (2, 3) and a.dtype == numpy.float32, a; "
             "assert (a == numpy.array([[1, -2.5, 3.25], [0, 1e-3, 65504]], "
             "dtype=numpy.float32)).all(), a\" '%s'",
             path);
    CHECK(t, system(cmd) == 0);
    printf("npy: numpy loads the file\n");
}

int main(void) {
    tally T = {0, 0}, *t = &T;
    char dir[] = "/tmp/mgt_test_ckpt_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip(t, dir);
    test_integrity(t, dir);
    test_atomic(t, dir);
    test_npy(t, dir);
    test_dtypes(t, dir);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", dir);

    printf("test_tensor_io: %d checks passed", T.pass);
    if (T.fail)
        printf(", %d FAILED", T.fail);
    printf("\n");
    return T.fail ? 1 : 0;
}
