/* tokens.c: token sets as datasets of windows (see tokens.h). */
#include "tokens.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tensor_io.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tokens.c reads little-endian files");

enum { MAX_SHARDS = 4096 };

typedef struct shard {
    char path[512];
    void *map;
    size_t len;
    const uint8_t *tok; /* the first token */
    int64_t ntok;
    int width;     /* bytes a token: 2 or 4 */
    int64_t first; /* its first window's number among all shards' */
    int64_t windows;
} shard;

struct mgt_tokens {
    int nshards;
    shard *s;
    int t, vocab, llmc;
    int64_t ntok;
    uint64_t key; /* synthetic: the stream's key (no shards) */
};

/* The split a file name belongs to: "train" in it, 0; "val", 1; neither, -1. A .bin file only. */
static int split_of(const char *name) {
    const size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 4, ".bin"))
        return -1;
    if (strstr(name, "train"))
        return 0;
    if (strstr(name, "val"))
        return 1;
    return -1;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of DIR's shards of the split, sorted (names[n]: malloc'ed, free each and names). */
static int list_shards(const char *dir, int test, char ***names_out) {
    *names_out = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char **names = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (split_of(e->d_name) != test)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, sizeof *nn * (size_t)cap);
            if (!nn)
                break;
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name)))
            break;
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, (size_t)n, sizeof *names, by_name);
    *names_out = names;
    return n;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

int mgt_tokens_has_split(const char *dir, int test) {
    char **names;
    const int n = list_shards(dir, test, &names);
    free_names(names, n);
    return n > 0;
}

int mgt_tokens_dir(const char *dir) {
    return mgt_tokens_has_split(dir, 0) || mgt_tokens_has_split(dir, 1);
}

void mgt_tokens_free(mgt_tokens *t) {
    if (!t)
        return;
    for (int i = 0; i < t->nshards; i++)
        if (t->s[i].map)
            munmap(t->s[i].map, t->s[i].len);
    free(t->s);
    free(t);
}

/* The largest token of a shard (every one read once: a damaged or foreign file is found before
 * training rather than as a wrong embedding row), and where it first is. */
static uint32_t max_token(const shard *s, int64_t *at) {
    uint32_t mx = 0;
    *at = 0;
    if (s->width == 2) {
        const uint16_t *p = (const uint16_t *)(const void *)s->tok;
        for (int64_t i = 0; i < s->ntok; i++)
            if (p[i] > mx)
                mx = p[i], *at = i;
    } else {
        for (int64_t i = 0; i < s->ntok; i++) {
            uint32_t v;
            memcpy(&v, s->tok + 4 * i, 4);
            if (v > mx)
                mx = v, *at = i;
        }
    }
    return mx;
}

/* One shard mapped and checked: its format, its token count against its size, its tokens. */
static int open_shard(shard *s, const char *dir, const char *name, int vocab, mgt_err *err) {
    snprintf(s->path, sizeof s->path, "%s/%s", dir, name);
    const int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        const int e = errno;
        if (fd >= 0)
            close(fd);
        return mgt_errf(err, "cannot open token shard %s: %s", s->path, strerror(e));
    }
    s->len = (size_t)st.st_size;
    if (s->len < 4) {
        close(fd);
        return mgt_errf(err, "token shard %s is empty or damaged (%zu bytes); write it again",
                        s->path, s->len);
    }
    s->map = mmap(NULL, s->len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return mgt_errf(err, "cannot map token shard %s: %s", s->path, strerror(errno));
    }
    int32_t head[3];
    memcpy(head, s->map, s->len >= sizeof head ? sizeof head : 4);
    if (head[0] == MGT_TOKENS_MAGIC) { /* llm.c */
        const size_t hb = MGT_TOKENS_HEADER * sizeof(int32_t);
        if (s->len < hb)
            return mgt_errf(err,
                            "token shard %s: its llm.c header is cut short (%zu of %zu "
                            "bytes); write it again",
                            s->path, s->len, hb);
        if (head[1] != 1 && head[1] != 2)
            return mgt_errf(err,
                            "token shard %s: llm.c header version %d; mgtrain reads version 1 "
                            "(uint16 tokens) and 2 (uint32 tokens)",
                            s->path, head[1]);
        s->width = head[1] == 1 ? 2 : 4;
        s->ntok = head[2];
        if (head[2] < 0 || s->len != hb + (size_t)head[2] * (size_t)s->width)
            return mgt_errf(err,
                            "token shard %s: its header says %d tokens (%zu bytes with the "
                            "header) but the file has %zu bytes: it is cut short or damaged; "
                            "write it again",
                            s->path, head[2], hb + (size_t)(head[2] > 0 ? head[2] : 0) * s->width,
                            s->len);
        s->tok = (const uint8_t *)s->map + hb;
    } else { /* nanoGPT's raw uint16 */
        if (s->len % 2)
            return mgt_errf(err,
                            "token shard %s has an odd size (%zu bytes): neither llm.c's shard "
                            "(magic %d) nor nanoGPT's uint16 tokens; write it again",
                            s->path, s->len, MGT_TOKENS_MAGIC);
        s->width = 2;
        s->ntok = (int64_t)(s->len / 2);
        s->tok = s->map;
    }
    int64_t at;
    const uint32_t mx = max_token(s, &at);
    if (s->ntok > 0 && mx >= (uint32_t)vocab)
        return mgt_errf(err,
                        "token shard %s holds token %u (token %lld of the file), but the model's "
                        "vocab is %d: the shard was made with another tokenizer; raise [input] "
                        "vocab or convert the text again",
                        s->path, mx, (long long)at, vocab);
    return 0;
}

int mgt_dataset_load_tokens(mgt_dataset *ds, const char *dir, int test, int context, int vocab,
                            mgt_err *err) {
    memset(ds, 0, sizeof *ds);
    char **names;
    const int n = list_shards(dir, test, &names);
    if (n == 0) {
        free_names(names, n);
        return mgt_errf(err,
                        "%s has no %s token shards: files NAME.bin with '%s' in the name (llm.c's "
                        "shards or nanoGPT's %s.bin); make them with mgtrain convert --text",
                        dir, test ? "validation" : "training", test ? "val" : "train",
                        test ? "val" : "train");
    }
    mgt_tokens *t = calloc(1, sizeof *t);
    if (t)
        t->s = calloc((size_t)(n < MAX_SHARDS ? n : MAX_SHARDS), sizeof *t->s);
    if (!t || !t->s) {
        free_names(names, n);
        mgt_tokens_free(t);
        return mgt_errf(err, "out of host memory for %d token shards", n);
    }
    if (n > MAX_SHARDS) {
        free_names(names, n);
        mgt_tokens_free(t);
        return mgt_errf(err,
                        "%s holds %d token shards, more than the %d mgtrain reads; join "
                        "some of them",
                        dir, n, MAX_SHARDS);
    }
    t->t = context;
    t->vocab = vocab;
    int64_t windows = 0;
    for (int i = 0; i < n; i++) {
        shard *s = &t->s[t->nshards++];
        if (open_shard(s, dir, names[i], vocab, err) < 0) {
            free_names(names, n);
            mgt_tokens_free(t);
            return -1;
        }
        t->llmc |= s->tok != s->map;
        s->first = windows;
        s->windows = s->ntok > 1 ? (s->ntok - 1) / context : 0;
        windows += s->windows;
        t->ntok += s->ntok;
    }
    free_names(names, n);
    if (windows == 0) {
        mgt_tokens_free(t);
        return mgt_errf(err,
                        "the %s token shards of %s hold fewer than context + 1 = %d tokens each: "
                        "no sample fits; use more text or a shorter context",
                        test ? "validation" : "training", dir, context + 1);
    }
    ds->n = windows;
    ds->h = 1, ds->w = context, ds->c = 1;
    ds->classes = vocab;
    ds->tokens = t;
    ds->owned = 1;
    snprintf(ds->source, sizeof ds->source, "%s", dir);
    return 0;
}

int mgt_dataset_synthetic_tokens(mgt_dataset *ds, int64_t n, int context, int vocab, uint64_t seed,
                                 uint64_t split_salt, mgt_err *err) {
    memset(ds, 0, sizeof *ds);
    mgt_tokens *t = calloc(1, sizeof *t);
    if (!t)
        return mgt_errf(err, "out of host memory");
    t->t = context;
    t->vocab = vocab;
    t->key = mgt_key3(seed, 0x544f4b53ULL /* "TOKS" */, split_salt);
    t->ntok = n * context + 1;
    ds->n = n;
    ds->h = 1, ds->w = context, ds->c = 1;
    ds->classes = vocab;
    ds->tokens = t;
    ds->owned = 1;
    ds->seed = seed;
    snprintf(ds->source, sizeof ds->source, "synthetic");
    return 0;
}

/* Token p of shard s. */
static inline uint32_t token_at(const shard *s, int64_t p) {
    if (s->width == 2) {
        uint16_t v;
        memcpy(&v, s->tok + 2 * p, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, s->tok + 4 * p, 4);
    return v;
}

/* The shard holding window w (binary search on the shards' first windows). */
static const shard *shard_of(const mgt_tokens *t, int64_t w) {
    int lo = 0, hi = t->nshards - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (t->s[mid].first <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &t->s[lo];
}

void mgt_tokens_gather(const mgt_dataset *ds, const int64_t *idx, int count, float *x,
                       int32_t *labels) {
    const mgt_tokens *t = ds->tokens;
    const int T = t->t;
    for (int k = 0; k < count; k++) {
        const int64_t w = idx[k] + ds->first;
        float *xs = x + (size_t)k * T;
        int32_t *ls = labels + (size_t)k * T;
        if (!t->nshards) { /* synthetic: token p of the stream from (key, p) */
            const int64_t p0 = w * T;
            uint32_t prev = (uint32_t)(mgt_rand64(t->key, (uint64_t)p0) % (uint64_t)t->vocab);
            for (int i = 0; i < T; i++) {
                const uint32_t next =
                    (uint32_t)(mgt_rand64(t->key, (uint64_t)(p0 + i + 1)) % (uint64_t)t->vocab);
                xs[i] = (float)prev;
                ls[i] = (int32_t)next;
                prev = next;
            }
            continue;
        }
        const shard *s = shard_of(t, w);
        const int64_t p0 = (w - s->first) * T;
        uint32_t prev = token_at(s, p0);
        for (int i = 0; i < T; i++) {
            const uint32_t next = token_at(s, p0 + i + 1);
            xs[i] = (float)prev;
            ls[i] = (int32_t)next;
            prev = next;
        }
    }
}

const char *mgt_tokens_describe(const mgt_dataset *ds, char *buf, size_t n) {
    const mgt_tokens *t = ds->tokens;
    if (!t->nshards)
        snprintf(buf, n, "synthetic tokens, vocab %d", t->vocab);
    else
        snprintf(buf, n, "%d shard%s, %lld tokens (%s), vocab %d", t->nshards,
                 t->nshards == 1 ? "" : "s", (long long)t->ntok,
                 t->llmc ? "llm.c shards" : "uint16 tokens", t->vocab);
    return buf;
}

int mgt_tokens_write(const char *path, const uint16_t *tok, int64_t n, mgt_err *err) {
    if (n < 0 || n > INT32_MAX)
        return mgt_errf(err, "%s: %lld tokens, more than an llm.c shard's header can count", path,
                        (long long)n);
    const size_t hb = MGT_TOKENS_HEADER * sizeof(int32_t), bytes = hb + (size_t)n * 2;
    uint8_t *buf = calloc(1, bytes);
    if (!buf)
        return mgt_errf(err, "out of host memory for %s (%zu bytes)", path, bytes);
    const int32_t head[3] = {MGT_TOKENS_MAGIC, 1, (int32_t)n};
    memcpy(buf, head, sizeof head);
    if (n)
        memcpy(buf + hb, tok, (size_t)n * 2);
    const int rc = mgt_atomic_write(path, buf, bytes, err);
    free(buf);
    return rc;
}
