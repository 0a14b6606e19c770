/* pretrained.c: weights from elsewhere into a model, by name through a name map (see
 * pretrained.h). */
#include "pretrained.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_io.h"

enum { MAP_MAX_LINES = 8192, MAP_MAX_STARS = 8, MAP_FILE_MAX = 1 << 20 };

typedef struct rule {
    char from[128], to[128]; /* to "-": drop */
    int line;
    int used;
} rule;

typedef struct name_map {
    rule *r;
    int n;
} name_map;

static int count_stars(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += *s == '*';
    return n;
}

/* The map file: one rule a line (see pretrained.h). */
static int map_read(const char *path, name_map *map, mgt_err *err) {
    char *text;
    size_t len;
    memset(map, 0, sizeof *map);
    if (mgt_read_text_file(path, "name map", MAP_FILE_MAX, &text, &len, err) < 0)
        return -1;
    map->r = calloc(MAP_MAX_LINES, sizeof *map->r);
    if (!map->r) {
        free(text);
        return mgt_errf(err, "out of memory reading the name map %s", path);
    }
    int line = 0, rc = 0;
    for (char *s = text, *next; s && *s && !rc; s = next) {
        next = strchr(s, '\n');
        if (next)
            *next++ = 0;
        line++;
        char *hash = strchr(s, '#');
        if (hash)
            *hash = 0;
        char a[160], b[160], extra[8];
        const int got = sscanf(s, "%159s %159s %7s", a, b, extra);
        if (got <= 0)
            continue;
        if (got != 2)
            rc = mgt_errf(err,
                          "%s:%d: expected two names, FROM TO (TO - drops the tensor), e.g. "
                          "layer1.0.conv1.* conv2_block1_1_conv.*",
                          path, line);
        else if (strlen(a) >= sizeof map->r->from || strlen(b) >= sizeof map->r->to)
            rc = mgt_errf(err, "%s:%d: a name longer than %zu characters", path, line,
                          sizeof map->r->from - 1);
        else if (strcmp(b, "-") && count_stars(a) != count_stars(b))
            rc = mgt_errf(err,
                          "%s:%d: %s has %d '*' but %s has %d; each '*' of TO is what the "
                          "matching '*' of FROM took",
                          path, line, a, count_stars(a), b, count_stars(b));
        else if (count_stars(a) > MAP_MAX_STARS)
            rc = mgt_errf(err, "%s:%d: more than %d '*' in %s", path, line, MAP_MAX_STARS, a);
        else if (map->n == MAP_MAX_LINES)
            rc = mgt_errf(err, "%s: more than %d renames", path, MAP_MAX_LINES);
        else {
            rule *r = &map->r[map->n++];
            snprintf(r->from, sizeof r->from, "%s", a);
            snprintf(r->to, sizeof r->to, "%s", b);
            r->line = line;
        }
    }
    free(text);
    if (rc) {
        free(map->r);
        map->r = NULL;
    }
    return rc;
}

/* Whether name matches pattern p whole ('*': any run of characters), each '*''s run into
 * cap[k] (start and length). */
static int glob_match(const char *p, const char *name, const char **cap, size_t *cap_len, int k) {
    if (!*p)
        return !*name;
    if (*p == '*') {
        for (const char *t = name;; t++) {
            cap[k] = name;
            cap_len[k] = (size_t)(t - name);
            if (glob_match(p + 1, t, cap, cap_len, k + 1))
                return 1;
            if (!*t)
                return 0;
        }
    }
    return *p == *name && glob_match(p + 1, name + 1, cap, cap_len, k);
}

/* The name a file's tensor takes: 1 renamed or kept (out), 0 dropped. */
static int map_name(name_map *map, const char *name, char *out, size_t n) {
    const char *cap[MAP_MAX_STARS];
    size_t cap_len[MAP_MAX_STARS];
    for (int i = 0; i < map->n; i++) {
        rule *r = &map->r[i];
        if (!glob_match(r->from, name, cap, cap_len, 0))
            continue;
        r->used = 1;
        if (!strcmp(r->to, "-"))
            return 0;
        size_t at = 0;
        int k = 0;
        for (const char *t = r->to; *t && at + 1 < n; t++) {
            if (*t != '*') {
                out[at++] = *t;
                continue;
            }
            for (size_t j = 0; j < cap_len[k] && at + 1 < n; j++)
                out[at++] = cap[k][j];
            k++;
        }
        out[at] = 0;
        return 1;
    }
    snprintf(out, n, "%s", name);
    return 1;
}

static void shape_text(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < ndim && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? "," : "", (long long)shape[i]);
}

/* A file's tensor: its name after the map, and what became of it. */
enum { F_UNUSED = 0, F_LOADED, F_DROPPED, F_COUNTER };
typedef struct ftensor {
    char name[128];
    int fate;
} ftensor;

/* One of the model's tensors and what became of it: loaded, or left with a reason. */
typedef struct mtensor {
    const mgt_param *p;
    float *dst;
    int loaded;
    const mgt_tensor_entry *file; /* the file's tensor of its name (NULL: none) */
} mtensor;

/* The tensors of the model, parameters and buffers, layer by layer. */
static int model_tensors(const mgt_model *m, float *w, float *buf, mtensor **out) {
    const int n = m->nparams + m->nbuffers;
    mtensor *t = calloc((size_t)n + 1, sizeof *t);
    if (!t)
        return -1;
    int k = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        for (int j = 0; j < 4; j++)
            if (l->param[j] >= 0)
                t[k++] = (mtensor){&m->params[l->param[j]], w, 0, NULL};
        for (int j = 0; j < 2; j++)
            if (l->buffer[j] >= 0)
                t[k++] = (mtensor){&m->buffers[l->buffer[j]], buf, 0, NULL};
    }
    *out = t;
    return k;
}

static int same_shape(const mgt_tensor_entry *e, const mgt_param *p) {
    if (e->ndim != p->ndim)
        return 0;
    for (int i = 0; i < p->ndim; i++)
        if (e->shape[i] != p->shape[i])
            return 0;
    return 1;
}

/* Why model tensor t was left at its initial value. */
static void left_reason(const mtensor *t, char *buf, size_t n) {
    char a[96], b[96];
    shape_text(t->p->shape, t->p->ndim, b, sizeof b);
    if (!t->file) {
        snprintf(buf, n, "%s [%s]: not in the file", t->p->name, b);
        return;
    }
    if (!t->file->data) {
        snprintf(buf, n, "%s [%s]: the file's is %s", t->p->name, b, t->file->dtype);
        return;
    }
    shape_text(t->file->shape, t->file->ndim, a, sizeof a);
    snprintf(buf, n, "%s [%s]: the file's is [%s]", t->p->name, b, a);
}

/* The table (pretrained.h), into a memory stream. */
static char *table(const mgt_pretrained_opts *o, const mtensor *mt, int nm, const ftensor *ft,
                   const mgt_safetensors *st) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    int loaded = 0, left = 0, unused = 0, dropped = 0, counters = 0;
    size_t values = 0;
    for (int i = 0; i < nm; i++) {
        loaded += mt[i].loaded;
        left += !mt[i].loaded;
        values += mt[i].loaded ? mt[i].p->count : 0;
    }
    for (int i = 0; i < st->nt; i++) {
        unused += ft[i].fate == F_UNUSED;
        dropped += ft[i].fate == F_DROPPED;
        counters += ft[i].fate == F_COUNTER;
    }
    fprintf(f, "  weights: %s%s%s\n", o->path, o->map ? " through " : "", o->map ? o->map : "");
    fprintf(f, "    %-22s %5d of the model's %d tensors (%zu values)\n", "loaded", loaded, nm,
            values);
    fprintf(f, "    %-22s %5d%s\n", "left at initial value", left, left ? ":" : "");
    char why[320];
    for (int i = 0; i < nm; i++)
        if (!mt[i].loaded) {
            left_reason(&mt[i], why, sizeof why);
            fprintf(f, "      %s\n", why);
        }
    fprintf(f, "    %-22s %5d of the file's %d tensors%s\n", "unused in the file", unused, st->nt,
            unused ? ":" : "");
    for (int i = 0; i < st->nt; i++)
        if (ft[i].fate == F_UNUSED) {
            char sh[96];
            shape_text(st->t[i].shape, st->t[i].ndim, sh, sizeof sh);
            if (strcmp(ft[i].name, st->t[i].name))
                fprintf(f, "      %s [%s] (as %s)\n", st->t[i].name, sh, ft[i].name);
            else
                fprintf(f, "      %s [%s]\n", st->t[i].name, sh);
        }
    if (dropped || counters)
        fprintf(f, "    %-22s %5d (%d by the name map, %d batchnorm step counters)\n",
                "ignored in the file", dropped + counters, dropped, counters);
    fclose(f);
    return text;
}

/* The first problem of a strict load, as one message. */
static int strict_error(const mgt_model *m, const mgt_pretrained_opts *o, const mtensor *mt, int nm,
                        const ftensor *ft, const mgt_safetensors *st, mgt_err *err) {
    int left = 0, unused = 0;
    for (int i = 0; i < nm; i++)
        left += !mt[i].loaded;
    for (int i = 0; i < st->nt; i++)
        unused += ft[i].fate == F_UNUSED;
    const char *hint = strcmp(o->flag, "--init-weights")
                           ? "; pass a --name-map that renames the file's tensors to the model's"
                           : "; pass --init-partial to keep the initial values of what does not "
                             "match (a new head), or a --name-map that renames the file's tensors";
    char more[96] = "";
    if (left + unused > 1)
        snprintf(more, sizeof more, " (and %d more: see the table above)", left + unused - 1);
    for (int i = 0; i < nm; i++) {
        const mtensor *t = &mt[i];
        if (t->loaded)
            continue;
        if (t->file && t->file->data) {
            char a[96], b[96];
            shape_text(t->file->shape, t->file->ndim, a, sizeof a);
            shape_text(t->p->shape, t->p->ndim, b, sizeof b);
            return mgt_errf(err, "%s: tensor '%s' has shape [%s] but model %s needs [%s]%s%s",
                            o->path, t->p->name, a, m->name, b, more, hint);
        }
        return mgt_errf(err, "%s has no %stensor '%s', which model %s needs%s%s", o->path,
                        t->file ? "float " : "", t->p->name, m->name, more, hint);
    }
    for (int i = 0; i < st->nt; i++)
        if (ft[i].fate == F_UNUSED)
            return mgt_errf(err, "%s holds tensor '%s'%s%s%s, which model %s does not have%s%s",
                            o->path, st->t[i].name, strcmp(ft[i].name, st->t[i].name) ? " (" : "",
                            strcmp(ft[i].name, st->t[i].name) ? ft[i].name : "",
                            strcmp(ft[i].name, st->t[i].name) ? " by the map)" : "", m->name, more,
                            hint);
    return 0;
}

int mgt_pretrained_load(const mgt_model *m, const mgt_pretrained_opts *o, float *w, float *buf,
                        char **report, mgt_err *err) {
    *report = NULL;
    name_map map = {0};
    if (o->map && map_read(o->map, &map, err) < 0)
        return -1;
    mgt_safetensors st;
    if (mgt_safetensors_read_any(o->path, &st, err) < 0) {
        free(map.r);
        return -1;
    }
    mtensor *mt = NULL;
    ftensor *ft = calloc((size_t)st.nt + 1, sizeof *ft);
    const int nm = model_tensors(m, w, buf, &mt);
    int rc = 0;
    if (!ft || nm < 0) {
        rc = mgt_errf(err, "out of host memory reading %s", o->path);
        goto out;
    }
    for (int i = 0; i < st.nt; i++) {
        const mgt_tensor_entry *e = &st.t[i];
        const size_t len = strlen(e->name);
        if (!map_name(&map, e->name, ft[i].name, sizeof ft[i].name))
            ft[i].fate = F_DROPPED;
        else if (!e->data && len >= 20 && !strcmp(e->name + len - 20, ".num_batches_tracked"))
            ft[i].fate = F_COUNTER;
    }
    int loaded = 0;
    for (int k = 0; k < nm && !rc; k++) {
        mtensor *t = &mt[k];
        for (int i = 0; i < st.nt && !t->file; i++)
            if (ft[i].fate == F_UNUSED && !strcmp(ft[i].name, t->p->name)) {
                t->file = &st.t[i];
                if (!t->file->data || !same_shape(t->file, t->p))
                    continue;
                for (size_t j = 0; j < t->p->count && !rc; j++)
                    if (!isfinite(t->file->data[j]))
                        rc = mgt_errf(err,
                                      "%s: tensor '%s' holds %s at index %zu: the weights are "
                                      "damaged or come from a run that diverged; pass weights "
                                      "with finite values",
                                      o->path, t->file->name,
                                      isnan(t->file->data[j]) ? "a NaN" : "an infinity", j);
                memcpy(t->dst + t->p->offset, t->file->data, t->p->count * sizeof(float));
                t->loaded = 1;
                ft[i].fate = F_LOADED;
                loaded++;
            }
    }
    if (rc)
        goto out;
    *report = table(o, mt, nm, ft, &st);
    if (!loaded)
        rc = mgt_errf(err,
                      "%s: no tensor of the file has the name and shape of one of model %s's "
                      "(its first is '%s', the model's '%s'); pass the --name-map that renames "
                      "the file's tensors to the model's",
                      o->path, m->name, st.nt ? st.t[0].name : "none", nm ? mt[0].p->name : "none");
    else if (!o->partial)
        rc = strict_error(m, o, mt, nm, ft, &st, err);
out:
    free(map.r);
    free(mt);
    free(ft);
    mgt_safetensors_free(&st);
    return rc ? -1 : 0;
}
