/* model_parse.c: model file (INI) -> mgt_model, with every error naming file:line and the key.
 *
 * Debian's libinih is built with INI_CALL_HANDLER_ON_NEW_SECTION 0, so its handler never hears
 * that a section starts: two [dense] sections in a row would arrive as one and an empty [flatten]
 * not at all. We therefore feed it through ini_parse_stream with our own line reader: the reader
 * sees every raw line, counts lines and opens a new section record at each "[...]" header; the
 * handler, which inih calls for each key = value of that line right after, files the pair under
 * the section the reader opened. The [train] section's pairs go to its reader (model.h:
 * mgt_model_section), the model knowing nothing of them.
 *
 * A block of layers repeated (a transformer's twelve blocks) is written once, between
 *   [repeat]
 *   count = 12
 *   ... the block's sections ...
 *   [end]
 * The reader keeps the block's lines and hands them to inih `count` times, each time with {i}
 * replaced by the block's index (from 0) and {input} by the name of the layer before the block
 * (for the first block, the layer above [repeat]; for the next, the last layer of the one before;
 * "input" where there is none), so that a block's names ("transformer.h.{i}.ln_1") differ from
 * block to block and its residual sum can name the block's input. An error in a repeated line is
 * reported at its line with the block's index. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "parse.h"

enum { SEC_NONE = 0, SEC_INPUT, SEC_LAYER, SEC_TRAIN };

typedef struct pstate {
    mgt_model *m;
    const char *path;
    const char *text, *end; /* what is left of the model file's bytes */
    int line;
    int kind;         /* SEC_* of the open section */
    int sec_line;
    char sec_name[64];
    mgt_layer *layer; /* open layer section */
    const mgt_model_section *train; /* [train]'s reader */
    char seen[32][32];
    int nseen;
    int had_input, had_train, failed;
    int had_mean, had_std; /* [input] normalisation keys */
    int input_line;
    char input_seen[8][16]; /* the [input] keys given */
    int ninput_seen;
    int type_count[32];
    int cap;
    mgt_err *err;
    /* [repeat]: the block's lines and their line numbers, how many times and which block is
     * being replayed (replaying: its next line), the [repeat] header's line, and the name of the
     * layer the block starts from ({input}). */
    char **blk;
    int *blk_line;
    int nblk, blk_cap, blk_count, blk_k, blk_pos, replaying, repeat_line;
    int file_line; /* lines of the file read so far (line: the one being handled) */
    char blk_input[64];
} pstate;

static const char *const input_keys[] = {"shape",   "mean",  "std", "center_crop",
                                         "context", "vocab", NULL};

static int fail(pstate *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(pstate *p, int line, const char *fmt, ...) {
    if (p->failed)
        return 0; /* keep the first error */
    p->failed = 1;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->replaying)
        mgt_errf(p->err, "%s:%d: %s (block %d of the [repeat] at line %d)", p->path, line, msg,
                 p->blk_k, p->repeat_line);
    else
        mgt_errf(p->err, "%s:%d: %s", p->path, line, msg);
    return 0;
}

static int seen_input_key(const pstate *p, const char *key) {
    for (int i = 0; i < p->ninput_seen; i++)
        if (!strcmp(p->input_seen[i], key))
            return 1;
    return 0;
}

static int seen(pstate *p, const char *key) {
    for (int i = 0; i < p->nseen; i++)
        if (!strcmp(p->seen[i], key))
            return 1;
    return 0;
}

static const char *const *required_keys(const pstate *p) {
    if (p->kind == SEC_TRAIN)
        return p->train->required;
    return NULL;
}

/* Called when a section ends (next header or end of file): its required keys must be there. */
static void close_section(pstate *p) {
    const char *const *req = required_keys(p);
    if (p->kind == SEC_LAYER)
        req = mgt_layer_required_keys(p->layer->type);
    for (int i = 0; req && req[i]; i++)
        if (!seen(p, req[i]))
            fail(p, p->sec_line, "[%s] is missing the required key '%s'", p->sec_name, req[i]);
    p->kind = SEC_NONE;
    p->nseen = 0;
}

static void open_section(pstate *p, const char *s) {
    close_section(p);
    const char *end = strchr(s, ']');
    if (!end) {
        fail(p, p->line, "section header without ']'");
        return;
    }
    size_t len = (size_t)(end - s - 1);
    if (len >= sizeof p->sec_name) {
        fail(p, p->line,
             "section name [%.40s...] is too long; sections are [input], then layers "
             "(%s), then [train]",
             s + 1, mgt_layer_type_names());
        return;
    }
    memcpy(p->sec_name, s + 1, len);
    p->sec_name[len] = 0;
    mgt_trim(p->sec_name);
    p->sec_line = p->line;
    if (!strcmp(p->sec_name, "input")) {
        if (p->had_input || p->m->nlayers) {
            fail(p, p->line, "[input] must come once, before the first layer");
            return;
        }
        p->had_input = 1;
        p->input_line = p->line;
        p->kind = SEC_INPUT;
        return;
    }
    if (!strcmp(p->sec_name, "train")) {
        if (p->had_train) {
            fail(p, p->line, "[train] is given twice; merge the two sections");
            return;
        }
        p->had_train = 1;
        p->kind = SEC_TRAIN;
        return;
    }
    int ti = mgt_layer_type_index(p->sec_name);
    if (ti < 0) {
        const char *near = mgt_layer_type_nearest(p->sec_name);
        fail(p, p->line, "unknown section [%s]%s%s%s; sections are [input], then layers (%s), "
             "then [train]",
             p->sec_name, near ? " (did you mean [" : "", near ? near : "", near ? "]?)" : "",
             mgt_layer_type_names());
        return;
    }
    if (!p->had_input) {
        fail(p, p->line, "[%s] comes before [input]; start the file with [input] shape = H,W,C",
             p->sec_name);
        return;
    }
    if (p->had_train) {
        fail(p, p->line, "[%s] comes after [train]; layers go between [input] and [train]",
             p->sec_name);
        return;
    }
    if (p->m->nlayers == MGT_MAX_LAYERS) {
        fail(p, p->line, "more than %d layers; mgtrain supports at most %d", MGT_MAX_LAYERS,
             MGT_MAX_LAYERS);
        return;
    }
    if (p->m->nlayers == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        mgt_layer *nl = realloc(p->m->layers, sizeof *nl * (size_t)cap);
        if (!nl) {
            fail(p, p->line, "out of memory");
            return;
        }
        p->m->layers = nl;
        p->cap = cap;
    }
    mgt_layer *l = &p->m->layers[p->m->nlayers];
    memset(l, 0, sizeof *l);
    l->type = mgt_layer_type_at(ti);
    l->index = p->m->nlayers++;
    l->line = p->line;
    for (int i = 0; i < 4; i++)
        l->param[i] = -1;
    for (int i = 0; i < 2; i++)
        l->buffer[i] = -1;
    mgt_layer_defaults(l);
    snprintf(l->name, sizeof l->name, "%s_%d", l->type->name, ++p->type_count[ti]);
    p->layer = l;
    p->kind = SEC_LAYER;
}

/* The next raw line of the file into *line and *len (no NUL in it; the first line without a
 * UTF-8 byte-order mark), counted; 0 at the end of the file, -1 on an error (reported). The text
 * is the bytes [text, end): a NUL byte is reported as one (as a C string the line would end
 * there, and the key on it would seem to be missing), a UTF-8 byte-order mark that an editor put
 * before the first line is no part of it, and a UTF-16 file is named as such. */
static int raw_line(pstate *p, const char **line_out, size_t *len_out) {
    if (p->text == p->end)
        return 0;
    const char *line = p->text;
    const char *nl = memchr(line, '\n', (size_t)(p->end - line));
    size_t len = nl ? (size_t)(nl - line + 1) : (size_t)(p->end - line);
    p->text = line + len;
    p->line = ++p->file_line;
    const unsigned char *u = (const unsigned char *)line;
    if (p->line == 1 && len >= 2 &&
        ((u[0] == 0xFF && u[1] == 0xFE) || (u[0] == 0xFE && u[1] == 0xFF))) {
        fail(p, p->line,
             "the file is UTF-16 text (it starts with a UTF-16 byte-order mark); save "
             "it as UTF-8");
        return -1;
    }
    const char *nul = memchr(line, 0, len);
    if (nul) {
        fail(p, p->line,
             "a NUL byte (character %zu of the line): a model file is plain text; save it as "
             "UTF-8 text (UTF-16 files, binary files and damaged ones hold NUL bytes)",
             (size_t)(nul - line) + 1);
        return -1;
    }
    if (p->line == 1 && len >= 3 && !memcmp(line, "\xEF\xBB\xBF", 3)) {
        line += 3;
        len -= 3;
    }
    *line_out = line;
    *len_out = len;
    return 1;
}

/* A line's section header name ("[repeat]" -> "repeat") into name[n], or 0 if the line is no
 * header. */
static int header_of(const char *line, size_t len, char *name, size_t n) {
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t'))
        i++;
    if (i == len || line[i] != '[')
        return 0;
    const char *close = memchr(line + i, ']', len - i);
    size_t k = close ? (size_t)(close - line - i - 1) : 0;
    if (!close || k >= n)
        return 0;
    memcpy(name, line + i + 1, k);
    name[k] = 0;
    mgt_trim(name);
    return 1;
}

enum { MAX_REPEAT = 4096 };

/* [repeat] at the line just read: its count, then its block's lines up to [end], kept for
 * replaying. 0 when the block is read, -1 on an error (reported). */
static int read_repeat(pstate *p) {
    close_section(p);
    if (p->failed)
        return -1;
    p->repeat_line = p->line;
    p->blk_count = 0;
    for (int i = 0; i < p->nblk; i++) /* an earlier [repeat]'s block */
        free(p->blk[i]);
    p->nblk = 0;
    const char *line;
    size_t len;
    char name[64];
    int r, in_block = 0;
    while ((r = raw_line(p, &line, &len)) > 0) {
        const int header = header_of(line, len, name, sizeof name);
        if (header && !strcmp(name, "end")) {
            if (p->nblk == 0)
                return fail(p, p->line, "[repeat] at line %d has no layers before [end]",
                            p->repeat_line),
                       -1;
            return 0;
        }
        if (header && !strcmp(name, "repeat"))
            return fail(p, p->line,
                        "[repeat] inside the [repeat] at line %d: repeated blocks do not nest; "
                        "end the first with [end]",
                        p->repeat_line),
                   -1;
        if (header && (!strcmp(name, "input") || !strcmp(name, "train")))
            return fail(p, p->line,
                        "[%s] inside the [repeat] at line %d: a repeated block holds layers "
                        "only; end it with [end] first",
                        name, p->repeat_line),
                   -1;
        if (header)
            in_block = 1;
        if (!in_block) { /* [repeat]'s own keys: count = N, comments, blank lines */
            char text[256];
            const size_t k = len < sizeof text - 1 ? len : sizeof text - 1;
            memcpy(text, line, k);
            text[k] = 0;
            char *c = text;
            while (*c == ' ' || *c == '\t')
                c++;
            if (!*c || *c == '\n' || *c == '\r' || *c == ';' || *c == '#')
                continue;
            char *eq = strchr(c, '=');
            int count;
            if (eq)
                *eq = 0;
            mgt_trim(c);
            if (eq)
                mgt_trim(eq + 1);
            if (!eq || strcmp(c, "count"))
                return fail(p, p->line,
                            "[repeat] takes one key, count = N (the times its block is "
                            "repeated), then the block's sections and [end]"),
                       -1;
            if (mgt_parse_int(eq + 1, &count) < 0 || count < 1 || count > MAX_REPEAT)
                return fail(p, p->line,
                            "[repeat] count = %s: expected a whole number from 1 to %d, e.g. "
                            "count = 12",
                            eq + 1, MAX_REPEAT),
                       -1;
            p->blk_count = count;
            continue;
        }
        if (p->nblk == p->blk_cap) {
            const int cap = p->blk_cap ? 2 * p->blk_cap : 64;
            char **b = realloc(p->blk, sizeof *b * (size_t)cap);
            if (b)
                p->blk = b;
            int *bl = realloc(p->blk_line, sizeof *bl * (size_t)cap);
            if (bl)
                p->blk_line = bl;
            if (!b || !bl)
                return fail(p, p->line, "out of memory"), -1;
            p->blk_cap = cap;
        }
        char *copy = malloc(len + 1);
        if (!copy)
            return fail(p, p->line, "out of memory"), -1;
        memcpy(copy, line, len);
        copy[len] = 0;
        p->blk_line[p->nblk] = p->line;
        p->blk[p->nblk++] = copy;
        if (p->blk_count == 0)
            return fail(p, p->repeat_line,
                        "[repeat] needs count = N (the times its block is repeated) before the "
                        "block's first section"),
                   -1;
    }
    if (r == 0)
        fail(p, p->repeat_line, "[repeat] has no [end]: end the repeated block with [end]");
    return -1;
}

/* Line `src` of a repeated block into out[n] with {i} and {input} replaced (see the top); -1
 * when the result does not fit. */
static int expand(const pstate *p, const char *src, char *out, size_t n) {
    size_t o = 0;
    char idx[16];
    snprintf(idx, sizeof idx, "%d", p->blk_k);
    for (const char *c = src; *c;) {
        const char *put = NULL;
        size_t skip = 1;
        if (!strncmp(c, "{i}", 3))
            put = idx, skip = 3;
        else if (!strncmp(c, "{input}", 7))
            put = p->blk_input, skip = 7;
        const size_t k = put ? strlen(put) : 1;
        if (o + k + 1 > n)
            return -1;
        memcpy(out + o, put ? put : c, k);
        o += k;
        c += skip;
    }
    out[o] = 0;
    return 0;
}

/* The next line inih reads: a repeated block's, or the file's (see the top). 0 at the end, -1
 * on an error (reported); the line in *line / *len (for a block's line: in buf). */
static int next_line(pstate *p, const char **line, size_t *len, char *buf, size_t n) {
    for (;;) {
        if (p->replaying) {
            if (p->blk_pos == p->nblk) {
                p->blk_pos = 0;
                if (++p->blk_k == p->blk_count) {
                    p->replaying = 0;
                    continue;
                }
            }
            if (p->blk_pos == 0) { /* a block starts: the layer it starts from */
                const mgt_model *m = p->m;
                snprintf(p->blk_input, sizeof p->blk_input, "%s",
                         m->nlayers ? m->layers[m->nlayers - 1].name : "input");
            }
            p->line = p->blk_line[p->blk_pos];
            if (expand(p, p->blk[p->blk_pos++], buf, n) < 0)
                return fail(p, p->line, "line longer than %zu characters once {i} and {input} "
                                        "are replaced; shorten it",
                            n - 2),
                       -1;
            *line = buf;
            *len = strlen(buf);
            return 1;
        }
        const int r = raw_line(p, line, len);
        char name[64];
        if (r <= 0 || !header_of(*line, *len, name, sizeof name))
            return r;
        if (!strcmp(name, "end"))
            return fail(p, p->line, "[end] without a [repeat] above it"), -1;
        if (strcmp(name, "repeat"))
            return r;
        if (read_repeat(p) < 0)
            return -1;
        p->replaying = 1;
        p->blk_k = 0;
        p->blk_pos = 0;
    }
}

/* The line reader inih calls: counts lines, notices headers, rejects continuation lines. */
static char *reader(char *str, int num, void *stream) {
    pstate *p = stream;
    if (p->failed)
        return NULL; /* the first error is the one reported: read no further */
    const char *line;
    size_t len;
    char buf[1024];
    const int r = next_line(p, &line, &len, buf, sizeof buf);
    if (r < 0)
        return NULL;
    if (r == 0) {
        close_section(p);
        return NULL;
    }
    const char *nl = len && line[len - 1] == '\n' ? line + len - 1 : NULL;
    if (len - (nl ? 1 : 0) >= (size_t)num - 1) {
        fail(p, p->line, "line longer than %d characters; shorten it", num - 3);
        str[0] = '\n';
        str[1] = 0;
        return str;
    }
    memcpy(str, line, len);
    str[len] = 0;
    const char *s = str;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '[') {
        open_section(p, s);
    } else if (s != str && *s && *s != '\n' && *s != '\r' && *s != ';' && *s != '#') {
        fail(p, p->line, "indented line: continuation lines are not supported; remove the "
                         "leading spaces");
        str[0] = '\n';
        str[1] = 0;
    }
    return str;
}

/* [input] mean, std (per channel, or one for all) and center_crop (data/augment.h); checked
 * against the shape once the section is read (check_input). */
static int set_input_tf(pstate *p, const char *key, const char *val) {
    mgt_input_tf *tf = &p->m->input_tf;
    if (!strcmp(key, "center_crop")) {
        /* At least 1/20: evaluation resizes a stored image to input / center_crop, which a
         * smaller fraction would make over 20 times the input (and, near 0, beyond any size). */
        float x;
        if (mgt_parse_float(val, &x) < 0 || !(x >= 0.05f) || x > 1)
            return fail(p, p->line,
                        "[input] center_crop = %s: expected the central fraction of a stored "
                        "image that evaluation resizes to the input, from 0.05 to 1, e.g. "
                        "center_crop = 0.875 (224 of 256)",
                        val);
        tf->center_crop = x;
        return 1;
    }
    /* Inputs are on the 0-1 scale (uint8 / 255), or near it (.npy floats): a mean beyond +-1000
     * or a std outside [0.0001, 1000] is a mistake (a value of the 0-255 scale, a typo), and
     * would take (x - mean) / std towards what a float cannot hold. */
    const int mean = !strcmp(key, "mean");
    float v[MGT_NORM_MAX_C];
    const int n = mgt_parse_float_list(val, v, MGT_NORM_MAX_C);
    int ok = n >= 1;
    for (int i = 0; ok && i < n; i++)
        ok = mean ? v[i] >= -1000 && v[i] <= 1000 : v[i] >= 0.0001f && v[i] <= 1000;
    if (!ok)
        return fail(p, p->line,
                    "[input] %s = %s: expected one number per channel (or one for all, at most "
                    "%d), each from %s to 1000, on the 0-1 scale of the inputs, e.g. %s",
                    key, val, MGT_NORM_MAX_C, mean ? "-1000" : "0.0001",
                    mean ? "mean = 0.485, 0.456, 0.406" : "std = 0.229, 0.224, 0.225");
    memcpy(mean ? tf->mean : tf->std, v, sizeof(float) * (size_t)n);
    *(mean ? &p->had_mean : &p->had_std) = 1;
    if (tf->nvalues && tf->nvalues != n)
        return fail(p, p->line,
                    "[input] mean and std give %d and %d values; give both one per channel (or "
                    "one each)",
                    mean ? n : tf->nvalues, mean ? tf->nvalues : n);
    tf->nvalues = n;
    return 1;
}

/* The most tokens a vocabulary may hold: ids travel as float32 values, whole numbers up to 2^24
 * exactly (model.h). */
#define MAX_VOCAB (1 << 24)

/* [input] context = T and vocab = V: a sequence of T token ids (model.h). */
static int set_tokens(pstate *p, const char *key, const char *val) {
    int v;
    const int vocab = !strcmp(key, "vocab");
    if (mgt_parse_int(val, &v) < 0 || v < (vocab ? 2 : 1) || v > MAX_VOCAB)
        return fail(p, p->line,
                    vocab ? "[input] vocab = %s: expected the number of distinct tokens, a whole "
                            "number from 2 to 16777216, e.g. vocab = 256 (bytes) or 50257 (GPT-2)"
                          : "[input] context = %s: expected the tokens a sample holds, a whole "
                            "number from 1 to 16777216, e.g. context = 1024",
                    val);
    if (vocab)
        p->m->vocab = v;
    else
        p->m->input = (mgt_shape){1, v, 1, 1};
    return 1;
}

/* An input shape: "H,W,C" (images, NHWC) or "F" (F values a sample: tabular rows, (1, 1, F)).
 * Returns the rank (3 or 1), or -1. */
static int parse_shape(const char *val, mgt_shape *s) {
    int v[4];
    const int n = mgt_parse_int_list(val, v, 4);
    for (int i = 0; i < n; i++)
        if (v[i] < 1)
            return -1;
    if (n == 3)
        *s = (mgt_shape){v[0], v[1], v[2], 0};
    else if (n == 1)
        *s = (mgt_shape){1, 1, v[0], 0};
    else
        return -1;
    return n;
}

static int set_input(pstate *p, const char *key, const char *val) {
    if (!strcmp(key, "context") || !strcmp(key, "vocab"))
        return set_tokens(p, key, val);
    if (strcmp(key, "shape"))
        return set_input_tf(p, key, val);
    const int rank = parse_shape(val, &p->m->input);
    if (rank < 0)
        return fail(p, p->line,
                    "[input] shape = %s: expected three positive whole numbers H,W,C (images, "
                    "e.g. shape = 28,28,1) or one, F (F values a sample, e.g. shape = 30)",
                    val);
    p->m->input_rank = rank;
    if (mgt_shape_elems(p->m->input) > MGT_MAX_TENSOR_ELEMS)
        return fail(p, p->line,
                    "[input] shape = %s: model too large: %lld values per sample, "
                    "more than the %lld one tensor may hold",
                    val, (long long)mgt_shape_elems(p->m->input), (long long)MGT_MAX_TENSOR_ELEMS);
    return 1;
}

static int set_train(pstate *p, const char *key, const char *val) {
    mgt_err e;
    if (p->train->set(p->train->ctx, key, val, &e) < 0)
        return fail(p, p->line, "[train] %s", e.msg);
    return 1;
}

static int handler(void *user, const char *section, const char *key, const char *value) {
    (void)section;
    pstate *p = user;
    if (p->failed)
        return 1;
    if (p->kind == SEC_NONE)
        return fail(p, p->line,
                    "'%s = %s' is outside any section; keys belong under [input], "
                    "a layer or [train]",
                    key, value);
    const char *const *keys = p->kind == SEC_INPUT   ? input_keys
                              : p->kind == SEC_TRAIN ? p->train->keys
                                                     : p->layer->type->keys;
    int ok = 0;
    for (int i = 0; keys && keys[i]; i++)
        ok |= !strcmp(keys[i], key);
    if (p->kind == SEC_LAYER)
        ok |= !strcmp(key, "name") || !strcmp(key, "input") || !strcmp(key, "inputs") ||
              (p->layer->type->has_act && !strcmp(key, "activation")) || !strcmp(key, "trainable");
    if (!ok) {
        const char *cands[68] = {0};
        int nc = 0;
        for (int i = 0; keys && keys[i] && nc < 64; i++)
            cands[nc++] = keys[i];
        if (p->kind == SEC_LAYER) {
            cands[nc++] = "name";
            cands[nc++] = p->layer->type->merge ? "inputs" : "input";
            if (p->layer->type->has_act)
                cands[nc++] = "activation";
            cands[nc++] = "trainable";
        }
        const char *near = mgt_nearest(key, cands, nc);
        char list[900] = "";
        for (int i = 0; i < nc; i++) {
            strncat(list, cands[i], sizeof list - strlen(list) - 3);
            if (i + 1 < nc)
                strncat(list, ", ", sizeof list - strlen(list) - 1);
        }
        return fail(p, p->line, "[%s] has no key '%s'%s%s%s; its keys are: %s", p->sec_name, key,
                    near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "", list);
    }
    if (seen(p, key))
        return fail(p, p->line, "[%s] %s is given twice in one section", p->sec_name, key);
    if (p->nseen < 32)
        snprintf(p->seen[p->nseen++], sizeof p->seen[0], "%s", key);
    if (p->kind == SEC_INPUT && p->ninput_seen < 8)
        snprintf(p->input_seen[p->ninput_seen++], sizeof p->input_seen[0], "%s", key);
    if (p->kind == SEC_INPUT)
        return set_input(p, key, value);
    if (p->kind == SEC_TRAIN)
        return set_train(p, key, value);
    mgt_layer *l = p->layer;
    mgt_err e;
    if (!strcmp(key, "name")) {
        if (mgt_check_name(value, &e) < 0)
            return fail(p, p->line, "[%s] name = %s: %s", p->sec_name, value, e.msg);
        if (!strcmp(value, "input"))
            return fail(p, p->line,
                        "[%s] name = input: 'input' names the model's input in "
                        "input/inputs keys; choose another name",
                        p->sec_name);
        snprintf(l->name, sizeof l->name, "%s", value);
        return 1;
    }
    if (!strcmp(key, "input") || !strcmp(key, "inputs")) {
        /* Resolved once the whole file is read (build): names may be given before the layers
         * they name are all known, and errors then report every kind of bad name the same way. */
        if (l->inputs_text[0])
            return fail(p, p->line, "[%s] has both input and inputs; give one of them",
                        p->sec_name);
        if (strlen(value) >= sizeof l->inputs_text)
            return fail(p, p->line, "[%s] %s: the list is longer than %zu characters", p->sec_name,
                        key, sizeof l->inputs_text - 1);
        snprintf(l->inputs_text, sizeof l->inputs_text, "%s", value);
        l->inputs_line = p->line;
        return 1;
    }
    if (!strcmp(key, "trainable")) { /* Keras' layer.trainable (model.h: mgt_layer.frozen) */
        int trainable;
        if (mgt_parse_bool(value, &trainable) < 0)
            return fail(p, p->line, "[%s] trainable = %s: expected true or false", p->sec_name,
                        value);
        l->frozen = !trainable;
        return 1;
    }
    if (!strcmp(key, "activation")) {
        if (mgt_parse_act(value, &l->act) < 0)
            return fail(p, p->line,
                        "[%s] activation = %s: unknown; use relu, sigmoid, tanh, softmax, gelu, "
                        "gelu_tanh or none",
                        p->sec_name, value);
        return 1;
    }
    if (l->type->set(l, key, value, &e) < 0)
        return fail(p, p->line, "[%s] %s = %s: %s", p->sec_name, key, value, e.msg);
    return 1;
}

/* Layer i's inputs from its input/inputs key: each name a layer above it, or "input" for the
 * model's input; without the key, the previous layer (the model's input for the first). */
static int resolve_inputs(pstate *p, mgt_layer *l) {
    mgt_model *m = p->m;
    const mgt_layer_type *t = l->type;
    l->ninputs = 0;
    if (!l->inputs_text[0]) {
        if (t->merge)
            return mgt_errf(p->err,
                            "%s:%d: [%s] %s needs its inputs: inputs = A, B (two or "
                            "more layers above it, or input for the model's input)",
                            p->path, l->line, t->name, l->name);
        l->inputs[l->ninputs++] = l->index - 1;
        return 0;
    }
    char text[sizeof l->inputs_text];
    snprintf(text, sizeof text, "%s", l->inputs_text);
    const int line = l->inputs_line;
    for (char *tok = text, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next)
            *next++ = 0;
        mgt_trim(tok);
        if (!*tok)
            return mgt_errf(p->err,
                            "%s:%d: [%s] %s: an empty name in the input list '%s'; "
                            "separate layer names by single commas",
                            p->path, line, t->name, l->name, l->inputs_text);
        if (l->ninputs == MGT_MAX_INPUTS)
            return mgt_errf(p->err,
                            "%s:%d: [%s] %s: more than %d inputs; merge them in steps "
                            "(an [%s] of [%s] layers)",
                            p->path, line, t->name, l->name, MGT_MAX_INPUTS, t->name, t->name);
        int at = -2;
        if (!strcmp(tok, "input"))
            at = -1;
        for (int j = 0; j < m->nlayers && at == -2; j++)
            if (!strcmp(m->layers[j].name, tok))
                at = j;
        if (at == l->index)
            return mgt_errf(p->err,
                            "%s:%d: [%s] %s takes its own output as an input; a layer "
                            "takes layers above it",
                            p->path, line, t->name, l->name);
        if (at > l->index)
            return mgt_errf(p->err,
                            "%s:%d: [%s] %s takes '%s', which comes later (line %d): "
                            "layers run in file order, so a layer may only take layers above it "
                            "(this also rules out cycles); move [%s] %s below it",
                            p->path, line, t->name, l->name, tok, m->layers[at].line, t->name,
                            l->name);
        if (at == -2) {
            const char **names = malloc(sizeof *names * (size_t)(l->index + 1));
            const char *near = NULL;
            if (names) {
                for (int j = 0; j < l->index; j++)
                    names[j] = m->layers[j].name;
                names[l->index] = "input";
                near = mgt_nearest(tok, names, l->index + 1);
            }
            mgt_errf(p->err,
                     "%s:%d: [%s] %s takes '%s', but no layer above it has that name%s%s%s; "
                     "name a layer above (its name = ..., or the default <type>_<n>) or input "
                     "for the model's input",
                     p->path, line, t->name, l->name, tok, near ? " (did you mean '" : "",
                     near ? near : "", near ? "'?)" : "");
            free(names);
            return -1;
        }
        l->inputs[l->ninputs++] = at;
    }
    if (t->merge && l->ninputs < 2)
        return mgt_errf(p->err,
                        "%s:%d: [%s] %s merges two or more inputs but is given %d; "
                        "list them: inputs = A, B",
                        p->path, line, t->name, l->name, l->ninputs);
    if (!t->merge && l->ninputs != 1)
        return mgt_errf(p->err,
                        "%s:%d: [%s] %s takes one input but is given %d; only [add] and "
                        "[concat] merge several",
                        p->path, line, t->name, l->name, l->ninputs);
    return 0;
}

/* Shapes and parameters from the input shape on, layer by layer (again after --input-shape). */
/* A tensor of the model and the layer that declared it, for the check below. */
typedef struct owned_name {
    const char *name;
    const mgt_layer *layer;
} owned_name;

static int cmp_owned(const void *a, const void *b) {
    const owned_name *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->layer->index - y->layer->index;
}

/* Every tensor name once: a weights file or checkpoint names each tensor, and a layer named so
 * that one of its tensors takes another layer's name (name = s.depthwise beside a separable
 * convolution s) could be trained but never saved. Found here, with the model, so that summary
 * says it and no step runs first. Sorted, for models of thousands of layers. */
static int check_tensor_names(const mgt_model *m, const char *path, mgt_err *err) {
    const int n = m->nparams + m->nbuffers;
    owned_name *t = malloc(sizeof *t * (size_t)(n ? n : 1));
    if (!t)
        return mgt_errf(err, "out of host memory checking the model's tensor names");
    int k = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        for (int j = 0; j < 4; j++)
            if (l->param[j] >= 0)
                t[k++] = (owned_name){m->params[l->param[j]].name, l};
        for (int j = 0; j < 2; j++)
            if (l->buffer[j] >= 0)
                t[k++] = (owned_name){m->buffers[l->buffer[j]].name, l};
    }
    qsort(t, (size_t)k, sizeof *t, cmp_owned);
    int rc = 0;
    for (int i = 1; i < k && !rc; i++)
        if (!strcmp(t[i - 1].name, t[i].name))
            rc = mgt_errf(err,
                          "%s:%d: [%s] %s: its tensor '%s' has the name of a tensor of layer %s "
                          "(line %d): a weights file names each tensor once; rename one of the "
                          "two layers",
                          path, t[i].layer->line, t[i].layer->type->name, t[i].layer->name,
                          t[i].name, t[i - 1].layer->name, t[i - 1].layer->line);
    free(t);
    return rc;
}

static int build_layers(mgt_model *m, const char *path, mgt_err *err) {
    mgt_err e;
    m->nparams = m->nbuffers = 0;
    m->param_count = m->buffer_count = 0;
    m->add_failed = 0;
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        for (int j = 0; j < 4; j++)
            l->param[j] = -1;
        for (int j = 0; j < 2; j++)
            l->buffer[j] = -1;
        l->tied = -1;
        l->in = mgt_layer_input_shape(m, l, 0);
        if (mgt_act_bwd_reads_x(l->act) && strcmp(l->type->name, "dense") &&
            strcmp(l->type->name, "activation"))
            return mgt_errf(err,
                            "%s:%d: [%s] %s: activation = %s is supported on [dense] and "
                            "[activation] layers; put it on a [dense] layer, or in an "
                            "[activation] layer after this one",
                            path, l->line, l->type->name, l->name, mgt_act_name(l->act));
        if (l->type->build(m, l, &e) < 0)
            return mgt_errf(err, "%s:%d: [%s] %s: %s", path, l->line, l->type->name, l->name,
                            e.msg);
        if (m->add_failed)
            return mgt_errf(err, "out of host memory declaring the tensors of layer %s", l->name);
        if (l->out.h < 1 || l->out.w < 1 || l->out.c < 1 ||
            mgt_shape_elems(l->out) > MGT_MAX_TENSOR_ELEMS)
            return mgt_errf(err,
                            "%s:%d: [%s] %s: model too large: its output holds %lld "
                            "values per sample, more than the %lld one tensor may hold",
                            path, l->line, l->type->name, l->name,
                            (long long)mgt_shape_elems(l->out), (long long)MGT_MAX_TENSOR_ELEMS);
    }
    mgt_layer *last = &m->layers[m->nlayers - 1];
    const int per_position = last->out.seq && last->out.h == 1 && last->out.c >= 2;
    for (int i = 0; i < m->nlayers - 1; i++)
        if (m->layers[i].act == MGT_ACT_SOFTMAX && m->layers[i].out.h * m->layers[i].out.w != 1)
            return mgt_errf(err,
                            "%s:%d: softmax on %s needs a flat input (after [flatten] "
                            "or [dense])",
                            path, m->layers[i].line, m->layers[i].name);
    if (per_position && last->act == MGT_ACT_SOFTMAX)
        return mgt_errf(err,
                        "%s:%d: the last layer (%s) of a sequence model gives logits at every "
                        "position: remove its activation = softmax (the loss applies it)",
                        path, last->line, last->name);
    /* classes: set again by the loss's checks (mgt_model_check_output) once it is known */
    m->classes = last->out.c;
    m->labels_per_sample = per_position ? last->out.w : 1;
    mgt_model_layout(m); /* the frozen layers' tensors after the trainable ones */
    return check_tensor_names(m, path, err);
}

/* [input] gives an image shape, or a context and a vocabulary (token ids), not both. */
static int check_input_kind(pstate *p) {
    const mgt_model *m = p->m;
    const int shape = seen_input_key(p, "shape"), ctx = seen_input_key(p, "context");
    const int vocab = m->vocab > 0;
    const char *why = NULL;
    if (shape && (ctx || vocab))
        why = "gives both shape (an image) and context/vocab (token ids); keep the one the "
              "model reads";
    else if (!shape && ctx != vocab)
        why = ctx ? "has context but no vocab; token ids need both, e.g. context = 256 and "
                    "vocab = 256"
                  : "has vocab but no context; token ids need both, e.g. context = 256 and "
                    "vocab = 256";
    else if (!shape && !ctx)
        why = "is missing the required key 'shape' (H,W,C of an image; or context and vocab "
              "for token ids)";
    else if (ctx && p->m->input_tf.norm)
        why = "normalises token ids (mean, std); they are indices, not values: remove mean "
              "and std";
    if (why)
        return mgt_errf(p->err, "%s:%d: [input] %s", p->path, p->input_line, why);
    return 0;
}

/* Shapes, parameters and whole-model checks, after the file has been read. */
static int build(pstate *p) {
    mgt_model *m = p->m;
    if (!p->had_input)
        return mgt_errf(p->err, "%s: no [input] section; start the file with [input] and "
                        "shape = H,W,C (or shape = F)", p->path);
    if (m->nlayers == 0)
        return mgt_errf(p->err, "%s: no layers between [input] and [train]", p->path);
    if (!p->had_train) {
        char keys[256] = "";
        const char *const *req = p->train->required;
        for (int i = 0; req[i]; i++)
            snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%s%s",
                     i == 0       ? ""
                     : req[i + 1] ? ", "
                                  : " and ",
                     req[i]);
        return mgt_errf(p->err, "%s: no [train] section; add one with %s", p->path, keys);
    }
    if (p->had_mean != p->had_std)
        return mgt_errf(p->err,
                        "%s: [input] has %s but no %s; normalisation needs both (torchvision's "
                        "Normalize(mean, std)), e.g. mean = 0.485, 0.456, 0.406 and std = 0.229, "
                        "0.224, 0.225",
                        p->path, p->had_mean ? "mean" : "std", p->had_mean ? "std" : "mean");
    m->input_tf.norm = p->had_mean;
    if (check_input_kind(p) < 0)
        return -1;
    for (int i = 0; i < m->nlayers; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(m->layers[i].name, m->layers[j].name))
                return mgt_errf(p->err,
                                "%s:%d: layer name '%s' is already used by the layer at "
                                "line %d; names must be unique",
                                p->path, m->layers[i].line, m->layers[i].name, m->layers[j].line);
    for (int i = 0; i < m->nlayers; i++)
        if (resolve_inputs(p, &m->layers[i]) < 0)
            return -1;
    /* Every output but the last feeds a later layer: a branch nothing takes would be computed
     * for nothing, and is most likely a name missing from an inputs list. */
    for (int i = 0; i < m->nlayers; i++)
        m->layers[i].consumers = 0;
    for (int i = 0; i < m->nlayers; i++)
        for (int k = 0; k < m->layers[i].ninputs; k++)
            if (m->layers[i].inputs[k] >= 0)
                m->layers[m->layers[i].inputs[k]].consumers++;
    for (int i = 0; i < m->nlayers - 1; i++) {
        const mgt_layer *l = &m->layers[i];
        if (!l->consumers)
            return mgt_errf(p->err,
                            "%s:%d: the output of [%s] %s is used by no layer: only the "
                            "last layer is the model's output; name it in a later layer's input "
                            "or inputs, or remove the section",
                            p->path, l->line, l->type->name, l->name);
    }
    return build_layers(m, p->path, p->err);
}

int mgt_model_check_output(mgt_model *m, mgt_err *err) {
    mgt_layer *last = &m->layers[m->nlayers - 1];
    const char *loss = m->loss == MGT_LOSS_BCE    ? "binary_crossentropy"
                       : m->loss == MGT_LOSS_MSE  ? "mse"
                       : m->loss == MGT_LOSS_MAE  ? "mae"
                       : m->loss == MGT_LOSS_HUBER ? "huber"
                                                   : "cross-entropy";
    const int per_position = m->labels_per_sample > 1; /* a sequence model's logits (build) */
    if (mgt_loss_is_xent(m->loss)) {
        if (!per_position && (last->out.h != 1 || last->out.w != 1 || last->out.c < 2))
            return mgt_errf(err,
                            "%s:%d: the last layer (%s) gives %dx%dx%d per sample; for "
                            "classification it must give one score per class, e.g. [dense] "
                            "units = 10 (one output: loss = binary_crossentropy or mse)",
                            m->path, last->line, last->name, last->out.h, last->out.w,
                            last->out.c);
        if (last->act != MGT_ACT_NONE && last->act != MGT_ACT_SOFTMAX)
            return mgt_errf(err,
                            "%s:%d: the last layer (%s) has a %s activation; with "
                            "cross-entropy it must be softmax or none (logits)",
                            m->path, last->line, last->name, mgt_act_name(last->act));
    } else if (m->loss == MGT_LOSS_BCE && last->act != MGT_ACT_NONE &&
               last->act != MGT_ACT_SIGMOID) {
        return mgt_errf(err,
                        "%s:%d: the last layer (%s) has a %s activation; with %s it must be "
                        "sigmoid or none (logits)",
                        m->path, last->line, last->name, mgt_act_name(last->act), loss);
    } else if (mgt_loss_is_regression(m->loss) && last->act == MGT_ACT_SOFTMAX &&
               (last->out.h != 1 || last->out.w != 1)) {
        return mgt_errf(err, "%s:%d: softmax on %s needs a flat input (after [flatten] or [dense])",
                        m->path, last->line, last->name);
    }
    if (per_position && (m->ncw || !mgt_loss_is_xent(m->loss)))
        return mgt_errf(err,
                        "model %s scores every position of a sequence against the next token: "
                        "train it with loss = sparse_categorical_crossentropy, without "
                        "class_weight",
                        m->name);
    if (m->ncw && mgt_loss_is_regression(m->loss))
        return mgt_errf(err,
                        "class_weight weighs the classes of a classification; %s is a regression "
                        "loss: remove class_weight",
                        loss);
    if (m->ncw && m->loss == MGT_LOSS_BCE && m->ncw != 2)
        return mgt_errf(err,
                        "class_weight gives %d weights; binary_crossentropy takes two, the "
                        "negative's and the positive's, e.g. class_weight = 1, 5",
                        m->ncw);
    if (m->ncw && mgt_loss_is_xent(m->loss) && m->ncw != last->out.c)
        return mgt_errf(err,
                        "class_weight gives %d weights for the %d classes of %s; give one a "
                        "class, in class order",
                        m->ncw, last->out.c, m->path);
    /* the loss computes softmax or sigmoid with it, from the logits (and predict applies it) */
    last->fused_act = (mgt_loss_is_xent(m->loss) && last->act == MGT_ACT_SOFTMAX) ||
                      (m->loss == MGT_LOSS_BCE && last->act == MGT_ACT_SIGMOID);
    /* a class's score per output (at every position of a sequence), or every value scored */
    m->classes = mgt_loss_is_xent(m->loss) ? last->out.c : (int)mgt_shape_elems(last->out);
    m->nsums = MGT_SUM_TASK + mgt_model_task_sums(m) + 1;
    return 0;
}

int mgt_model_set_input_shape(mgt_model *m, const char *hwc, mgt_err *err) {
    if (m->vocab > 0)
        return mgt_errf(err, "model %s reads token ids; its [input] context sets their number",
                        m->name);
    mgt_shape in;
    const int rank = parse_shape(hwc, &in);
    if (rank < 0)
        return mgt_errf(err, "expected three positive whole numbers H,W,C, e.g. 224,224,3, or "
                             "one, F (values a sample)");
    m->input = in;
    m->input_rank = rank;
    if (build_layers(m, m->path, err) < 0)
        return -1;
    return mgt_model_check_output(m, err);
}

int mgt_model_name_of(const char *path, char *name, size_t n) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    const char *dot = strrchr(b, '.');
    size_t len = dot && dot != b ? (size_t)(dot - b) : strlen(b);
    if (len == 0 || len >= n)
        return -1;
    memcpy(name, b, len);
    name[len] = 0;
    return 0;
}

/* The model's name (the file name without its extension) and path, which must fit their
 * buffers whole: the name makes the default output folder runs/<name>. */
static int model_name(mgt_model *m, const char *path, mgt_err *err) {
    if (strlen(path) >= sizeof m->path)
        return mgt_errf(err,
                        "model file %.40s...: the path has %zu characters, more than the "
                        "%zu supported; use a shorter path",
                        path, strlen(path), sizeof m->path - 1);
    if (mgt_model_name_of(path, m->name, sizeof m->name) < 0)
        return mgt_errf(err,
                        "model file %s: its name gives the model's name, which must have 1 "
                        "to %zu characters; rename the file",
                        path, sizeof m->name - 1);
    snprintf(m->path, sizeof m->path, "%s", path);
    return 0;
}

/* Reads a model file whole into *text (NUL-terminated; free it): a regular file only (a pipe
 * would block until someone wrote to it, a device would never end). */
static int read_model(const char *path, char **text, size_t *len, mgt_err *err) {
    *text = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return mgt_errf(err,
                        "cannot open model file %s: %s; pass --model with a model file such as "
                        "examples/mlp.cfg",
                        path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return mgt_errf(err,
                        "model file %s is not a regular file (a folder, pipe or device); pass "
                        "--model with a model file such as examples/mlp.cfg",
                        path);
    }
    size_t cap = (size_t)sb.st_size + 1, n = 0;
    char *t = malloc(cap + 1);
    for (ssize_t r = 1; t && r > 0;) {
        if (n == cap) {
            char *bigger = realloc(t, 2 * cap + 1);
            if (!bigger) {
                free(t);
                t = NULL;
                break;
            }
            t = bigger;
            cap *= 2;
        }
        r = read(fd, t + n, cap - n);
        if (r < 0 && errno == EINTR)
            r = 1;
        else if (r < 0) {
            int e = errno;
            free(t);
            close(fd);
            return mgt_errf(err, "cannot read model file %s: %s", path, strerror(e));
        } else
            n += (size_t)r;
    }
    close(fd);
    if (!t)
        return mgt_errf(err, "out of memory reading model file %s", path);
    t[n] = 0;
    *text = t;
    *len = n;
    return 0;
}

int mgt_model_parse(mgt_model *m, const char *path, const char *text,
                    const mgt_model_section *train, mgt_err *err) {
    if (text)
        return mgt_model_parse_len(m, path, text, strlen(text), train, err);
    char *file = NULL;
    size_t len = 0;
    memset(m, 0, sizeof *m);
    if (model_name(m, path, err) < 0 || read_model(path, &file, &len, err) < 0)
        return -1;
    int rc = mgt_model_parse_len(m, path, file, len, train, err);
    free(file);
    return rc;
}

int mgt_model_parse_len(mgt_model *m, const char *path, const char *text, size_t len,
                        const mgt_model_section *train, mgt_err *err) {
    memset(m, 0, sizeof *m);
    if (model_name(m, path, err) < 0)
        return -1;
    pstate p = {.m = m, .path = path, .text = text, .end = text + len, .train = train, .err = err};
    int rc = ini_parse_stream(reader, &p, handler, &p);
    for (int i = 0; i < p.nblk; i++)
        free(p.blk[i]);
    free(p.blk);
    free(p.blk_line);
    if (p.failed)
        goto bad;
    if (rc != 0) {
        mgt_errf(err, "%s:%d: cannot read this line; expected [section], key = value or a "
                 "# comment", path, rc);
        goto bad;
    }
    if (build(&p) == 0)
        return 0;
bad:
    free(m->layers);
    free(m->params);
    free(m->buffers);
    m->layers = NULL;
    m->params = m->buffers = NULL;
    m->nlayers = m->nparams = m->nbuffers = 0;
    return -1;
}
