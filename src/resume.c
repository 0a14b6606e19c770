/* resume.c: what a resumed run takes from its run folder, and what it may change (resume.h). */
#include "resume.h"

#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "default_model.h"
#include "model.h"
#include "splits.h" /* MGT_DEFAULT_DATA */
#include "tensor_io.h"
#include "train_cfg.h"

/* The flags a resume may change, and those of one start alone (resume.h); every other flag
 * defines the run. */
static const char *const may_change[] = {"epochs", "save-every", "keep-checkpoints", "log-every",
                                         "no-tensorboard"};
static const char *const this_start[] = {
    "resume",     "overwrite",      "out",        "init-weights",   "max-steps",    "verbose",
    "profile",    "profile-layers", "timeline",   "debug-check",    "comm-timeout", "device",
    "gpus",       "share-gpu",      "transport",  "bucket-mb",      "zero",         "comm-progress",
    "cuda-graph", "device-data",    "algo-cache", "loader-threads", "help",         "version"};

static int listed(const char *name, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], name))
            return 1;
    return 0;
}

mgt_flag_class mgt_resume_flag_class(const char *name) {
    if (listed(name, may_change, sizeof may_change / sizeof *may_change))
        return MGT_FLAG_MAY_CHANGE;
    if (listed(name, this_start, sizeof this_start / sizeof *this_start))
        return MGT_FLAG_THIS_START;
    return MGT_FLAG_DEFINES;
}

/* The run folder o trains into, as run_plan.c names it: --out, or runs/<model name>. */
static void out_of(const mgt_options *o, char *out, size_t n) {
    char name[64];
    if (o->out)
        snprintf(out, n, "%s", o->out);
    else if (mgt_model_name_of(o->model ? o->model : MGT_DEFAULT_MODEL_NAME, name, sizeof name) ==
             0)
        snprintf(out, n, "runs/%s", name);
    else
        out[0] = 0;
}

/* "--name=value" (a switch: "--name") into buf at *used; NULL when it does not fit. */
static char *word(char *buf, size_t n, size_t *used, const char *name, const char *value) {
    const int w = value ? snprintf(buf + *used, n - *used, "--%s=%s", name, value)
                        : snprintf(buf + *used, n - *used, "--%s", name);
    if (w < 0 || (size_t)w + 1 > n - *used)
        return NULL;
    char *at = buf + *used;
    *used += (size_t)w + 1;
    return at;
}

/* The words "mgtrain train" + the recorded flags (+ given's) into r, parsed into c. */
static int parse_words(mgt_resume *r, const mgt_options *given, mgt_cli *c, mgt_err *err) {
    size_t used = 0;
    int n = 0;
    const int cap = (int)(sizeof r->words / sizeof *r->words);
    if (r->rec.nflags + (given ? given->ngiven : 0) + 3 > cap)
        return mgt_errf(err, "more than %d flags in all", cap - 3);
    r->words[n++] = "mgtrain";
    r->words[n++] = "train";
    const char *f = r->rec.flags;
    for (int i = 0; i < r->rec.nflags; i++, f += strlen(f) + 1)
        r->words[n++] = (char *)f;
    for (int i = 0; given && i < given->ngiven; i++) {
        char *w = word(r->buf, sizeof r->buf, &used, given->given[i].name, given->given[i].value);
        if (!w)
            return mgt_errf(err, "the command line is too long to resume with");
        r->words[n++] = w;
    }
    r->words[n] = NULL;
    return mgt_cli_parse(n, r->words, c, err);
}

const mgt_options *mgt_resume_options(mgt_resume *r, const mgt_options *o, const mgt_runtime *rt) {
    memset(r, 0, sizeof *r);
    r->rec.nflags = -1;
    if (!o->resume)
        return o;
    out_of(o, r->out, sizeof r->out);
    char msg[1400];
    const char *failed = NULL;
    if (rt->rank == 0 && r->out[0]) {
        char ckpt[700];
        mgt_err e;
        snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", r->out);
        if (access(ckpt, F_OK) == 0 && mgt_rundir_read_record(r->out, &r->rec, &e) < 0) {
            snprintf(msg, sizeof msg, "--resume: %s", e.msg);
            failed = msg;
        }
    }
    mgt_die_all_if_root(failed);
    if (rt->world > 1)
        MPI_Bcast(&r->rec, (int)sizeof r->rec, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (r->rec.nflags < 0)
        return o; /* nothing to resume, or an older folder: the flags given now */
    mgt_err e;
    if (parse_words(r, NULL, &r->run, &e) < 0)
        mgt_die_all("--resume: %s/%s records flags this mgtrain does not take (%s); resume with "
                    "the mgtrain that trained it, or train a new run into another --out",
                    r->out, MGT_RUN_INFO, e.msg);
    if (parse_words(r, o, &r->merged, &e) < 0)
        mgt_die_all("%s", e.msg);
    r->on = 1;
    return &r->merged.o;
}

/* ---- comparing values ----------------------------------------------------------------------- */

/* The same value: the same text, the same numbers (a comma-separated list: each), or for a path
 * the same file. */
static int same_value(const char *a, const char *b, int path) {
    if (!a || !b)
        return !a && !b;
    if (!strcmp(a, b))
        return 1;
    if (path) {
        struct stat sa, sb;
        return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
               sa.st_ino == sb.st_ino;
    }
    for (;;) {
        char *ea, *eb;
        const double x = strtod(a, &ea), y = strtod(b, &eb);
        if (ea == a || eb == b || x != y)
            return 0;
        while (*ea == ' ' || *ea == '\t')
            ea++;
        while (*eb == ' ' || *eb == '\t')
            eb++;
        if (!*ea || !*eb)
            return !*ea && !*eb;
        if (*ea != ',' || *eb != ',')
            return 0;
        a = ea + 1;
        b = eb + 1;
    }
}

/* The differences, "; "-separated, into a fixed buffer. */
typedef struct diffs {
    char text[3000];
    int n;
    int flags, file; /* how many are the flags', the model file's */
} diffs;

static void add(diffs *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(diffs *d, const char *fmt, ...) {
    size_t used = strlen(d->text);
    if (used + 8 >= sizeof d->text)
        return;
    if (d->n++)
        used += (size_t)snprintf(d->text + used, sizeof d->text - used, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->text + used, sizeof d->text - used, fmt, ap);
    va_end(ap);
}

/* The last value of flag `name` among o's given flags; *found 0 when not given. */
static const char *given_value(const mgt_options *o, const char *name, int *found) {
    const char *v = NULL;
    *found = 0;
    for (int i = 0; i < o->ngiven; i++)
        if (!strcmp(o->given[i].name, name)) {
            v = o->given[i].value;
            *found = 1;
        }
    return v;
}

/* A flag that sets a [train] key (run_plan.h's overrides): compared as the key, resolved. */
static int is_train_flag(const char *name) {
    int takes = 0;
    if (mgt_cli_flag(name, NULL, &takes, NULL) < 0)
        return 0;
    char w[96];
    snprintf(w, sizeof w, takes ? "--%s=1" : "--%s", name);
    char *argv[] = {"mgtrain", "train", w, NULL};
    mgt_cli c;
    mgt_err e;
    mgt_train_override ov[4];
    return mgt_cli_parse(3, argv, &c, &e) == 0 && mgt_run_plan_overrides(&c.o, ov, 4) > 0;
}

/* The flags given now that define the run and set no [train] key, against the run's. */
static void compare_flags(diffs *d, const mgt_resume *r, const mgt_options *given) {
    for (int i = 0; i < given->ngiven; i++) {
        const char *name = given->given[i].name;
        int earlier = 0;
        for (int k = i + 1; k < given->ngiven; k++) /* the last one given counts */
            earlier |= !strcmp(given->given[k].name, name);
        if (earlier || mgt_resume_flag_class(name) != MGT_FLAG_DEFINES || is_train_flag(name) ||
            !strcmp(name, "model"))
            continue;
        int takes = 0, path = 0, in_run;
        const char *def = "";
        mgt_cli_flag(name, &def, &takes, &path);
        const char *now = given->given[i].value, *was = given_value(&r->run.o, name, &in_run);
        if (in_run && (!takes || same_value(was, now, path)))
            continue;
        /* Not given at the start: the default, the help text's first word, or where that
         * names a model file key ("[conv2d] algo (auto)") the word in brackets after it. */
        char first[64] = "";
        const char *open = def[0] == '[' ? strrchr(def, '(') : NULL;
        sscanf(open ? open + 1 : def, "%63[^ )]", first);
        if (!in_run && takes && same_value(first, now, path))
            continue;
        d->flags++;
        if (in_run)
            add(d, "--%s %s (the run: %s)", name, now ? now : "", was ? was : "");
        else if (takes)
            add(d, "--%s %s (the run: without it, %s)", name, now, def);
        else
            add(d, "--%s (the run: without it)", name);
    }
}

/* ---- the model file ------------------------------------------------------------------------- */

/* One key = value of a model file, with the index of its section (two [dense] sections are two). */
typedef struct entry {
    int sec;
    char section[48], key[48], value[200];
} entry;

typedef struct ini_text {
    const char *text, *end;
    int sec;
    char section[48];
    entry *e;
    int n, cap;
} ini_text;

static char *ini_line(char *str, int num, void *stream) {
    ini_text *t = stream;
    if (t->text >= t->end)
        return NULL;
    const char *nl = memchr(t->text, '\n', (size_t)(t->end - t->text));
    size_t len = nl ? (size_t)(nl - t->text + 1) : (size_t)(t->end - t->text);
    if (len > (size_t)num - 1)
        len = (size_t)num - 1;
    memcpy(str, t->text, len);
    str[len] = 0;
    t->text += len;
    const char *s = str + strspn(str, " \t");
    if (*s == '[') {
        t->sec++;
        const size_t close = strcspn(s + 1, "]");
        snprintf(t->section, sizeof t->section, "%.*s", (int)close, s + 1);
    }
    return str;
}

static int ini_pair(void *user, const char *section, const char *key, const char *value) {
    (void)section;
    ini_text *t = user;
    if (t->n == t->cap) {
        entry *grown = realloc(t->e, sizeof *grown * (size_t)(t->cap = t->cap ? 2 * t->cap : 32));
        if (!grown)
            return 0;
        t->e = grown;
    }
    entry *e = &t->e[t->n++];
    e->sec = t->sec;
    snprintf(e->section, sizeof e->section, "%s", t->section);
    snprintf(e->key, sizeof e->key, "%s", key);
    snprintf(e->value, sizeof e->value, "%s", value);
    return 1;
}

/* The key = value pairs of a model file's text, in order. */
static ini_text read_pairs(const char *text, size_t len) {
    ini_text t = {.text = text, .end = text + len};
    ini_parse_stream(ini_line, &t, ini_pair, &t);
    return t;
}

static const entry *find_entry(const ini_text *t, int sec, const char *key) {
    const entry *found = NULL;
    for (int i = 0; i < t->n; i++)
        if (t->e[i].sec == sec && !strcmp(t->e[i].key, key))
            found = &t->e[i];
    return found;
}

/* Every key of the model files but [train]'s, the run's copy against the file now. */
static void compare_model(diffs *d, const ini_text *was, const ini_text *now) {
    int told = -1; /* the last section said to be another */
    const int before = d->n;
    for (int pass = 0; pass < 2; pass++) {
        const ini_text *a = pass ? now : was, *b = pass ? was : now;
        for (int i = 0; i < a->n; i++) {
            const entry *x = &a->e[i];
            if (!strcmp(x->section, "train") || x->sec == told)
                continue;
            const entry *y = find_entry(b, x->sec, x->key);
            if (y && pass)
                continue; /* said in the first pass */
            if (y && strcmp(x->section, y->section)) {
                add(d, "section %d of the model file: [%s] (the run: [%s])", x->sec, y->section,
                    x->section);
                told = x->sec;
            } else if (!y) {
                add(d, "[%s] %s = %s %s", x->section, x->key, x->value,
                    pass ? "(the run: not set)" : "in the run, not set now");
            } else if (!same_value(x->value, y->value, 0)) {
                add(d, "[%s] %s = %s (the run: %s)", x->section, x->key, y->value, x->value);
            }
        }
    }
    d->file += d->n - before;
}

/* ---- the [train] keys, resolved ------------------------------------------------------------- */

/* The [train] assignments, in order: the model file's section, then the flags' overrides. */
typedef struct assign {
    const char *key, *value, *flag; /* flag NULL: the model file's */
} assign;

static int assignments(const ini_text *t, const mgt_options *o, assign *out, int max) {
    int n = 0;
    for (int i = 0; i < t->n && n < max; i++)
        if (!strcmp(t->e[i].section, "train"))
            out[n++] = (assign){t->e[i].key, t->e[i].value, NULL};
    mgt_train_override ov[32];
    const int k = mgt_run_plan_overrides(o, ov, 32);
    for (int i = 0; i < k && n < max; i++)
        out[n++] = (assign){ov[i].key, ov[i].value, ov[i].flag};
    return n;
}

static const assign *last_of(const assign *a, int n, const char *key) {
    const assign *found = NULL;
    for (int i = 0; i < n; i++)
        if (!strcmp(a[i].key, key))
            found = &a[i];
    return found;
}

/* Whether setting `key` to `value` changes t (setting the same value leaves every byte). */
static int changes(const mgt_train_cfg *t, const char *key, const char *value) {
    mgt_train_cfg probe;
    memcpy(&probe, t, sizeof probe);
    mgt_err e;
    if (mgt_train_set(&probe, key, value, &e) < 0)
        return 1;
    return memcmp(&probe, t, sizeof probe) != 0;
}

static void compare_train(diffs *d, const mgt_train_cfg *was_t, const assign *was, int nwas,
                          const mgt_train_cfg *now_t, const assign *now, int nnow) {
    for (int pass = 0; pass < 2; pass++) {
        const assign *a = pass ? was : now;
        const int na = pass ? nwas : nnow;
        for (int i = 0; i < na; i++) {
            const char *key = a[i].key;
            if (last_of(a, na, key) != &a[i] || !strcmp(key, "epochs"))
                continue; /* the last assignment counts; epochs may change */
            const assign *x = last_of(now, nnow, key), *y = last_of(was, nwas, key);
            if (pass && x)
                continue; /* said in the first pass */
            const int differ =
                (x && changes(was_t, key, x->value)) || (y && changes(now_t, key, y->value));
            if (!differ)
                continue;
            char name[80];
            *(x && x->flag ? &d->flags : &d->file) += 1;
            if (x && x->flag)
                snprintf(name, sizeof name, "--%s %s", x->flag, x->value);
            else if (x)
                snprintf(name, sizeof name, "[train] %s = %s", key, x->value);
            else
                snprintf(name, sizeof name, "[train] %s unset now", key);
            add(d, "%s (the run: %s)", name, y ? y->value : "the default");
        }
    }
}

/* The run's model copy, its text (rank 0). NULL when the folder has none. */
static char *read_copy(const mgt_resume *r, size_t *len, char *path, size_t n) {
    char *text = NULL;
    mgt_err e;
    snprintf(path, n, "%s/%s", r->out, r->rec.model_copy);
    if (!r->rec.model_copy[0] ||
        mgt_read_text_file(path, "model copy", 16 << 20, &text, len, &e) < 0)
        return NULL;
    return text;
}

/* Rank 0: whether the checkpoint is of model m (its name and structure's hash). Another model is
 * named by the checkpoint's own check first, and its settings are no matter. */
static int same_model(const mgt_resume *r, const mgt_model *m) {
    char name[64];
    uint64_t hash = 0;
    mgt_err e;
    return mgt_ckpt_model_of(r->out, name, sizeof name, &hash, &e) == 1 && !strcmp(name, m->name) &&
           (!hash || hash == mgt_ckpt_model_hash(m));
}

void mgt_resume_check(const mgt_resume *r, const mgt_options *given, const mgt_run_plan *p,
                      const mgt_model *m, const mgt_runtime *rt) {
    if (!r->on)
        return;
    char msg[4400];
    const char *failed = NULL;
    if (rt->rank == 0 && same_model(r, m)) {
        diffs d = {.text = "", .n = 0};
        compare_flags(&d, r, given);
        size_t clen = 0;
        char copy_path[700];
        char *copy = read_copy(r, &clen, copy_path, sizeof copy_path);
        if (copy) {
            const char *now_text = p->model_text ? p->model_text : MGT_DEFAULT_MODEL_TEXT;
            const size_t now_len = p->model_text ? p->model_len : strlen(MGT_DEFAULT_MODEL_TEXT);
            ini_text was = read_pairs(copy, clen), now = read_pairs(now_text, now_len);
            compare_model(&d, &was, &now);
            mgt_train_cfg was_t;
            mgt_err e;
            if (mgt_run_plan_train_cfg(&was_t, copy_path, copy, clen, &r->run.o, &e) == 0) {
                assign wa[160], na[160];
                const int nw = assignments(&was, &r->run.o, wa, 160);
                const int nn = assignments(&now, &r->merged.o, na, 160);
                compare_train(&d, &was_t, wa, nw, &p->train, na, nn);
            } else {
                add(&d, "the run's model copy %s no longer reads (%s)", copy_path, e.msg);
            }
            free(was.e);
            free(now.e);
            free(copy);
        }
        if (d.n) {
            char hint[1000] = "";
            if (d.flags)
                snprintf(hint, sizeof hint,
                         "give the flags as the run had them, or leave them out (the run's are "
                         "taken: %s/%s lists them)",
                         r->out, MGT_RUN_INFO);
            if (d.file)
                snprintf(hint + strlen(hint), sizeof hint - strlen(hint),
                         "%sresume with the model file the run trained (--model %s/%s)",
                         d.flags ? "; " : "", r->out, r->rec.model_copy);
            snprintf(msg, sizeof msg,
                     "--resume: the run in %s was trained with other settings, and a resumed run "
                     "continues it as it was: %s; %s, or train a new run into another --out",
                     r->out, d.text, hint);
            failed = msg;
        }
    }
    mgt_die_all_if_root(failed);
}

/* A description of the data without the folder it names first (the same folder may be spelled
 * otherwise; --data compares it by identity). */
static const char *content(const char *desc, const char *dir) {
    const size_t n = strlen(dir);
    return !strncmp(desc, dir, n) ? desc + n : desc;
}

void mgt_resume_check_data(const mgt_resume *r, const mgt_options *given, const char *desc,
                           const mgt_runtime *rt) {
    (void)given;
    if (!r->on || !r->rec.data[0])
        return;
    char msg[2400];
    const char *failed = NULL;
    if (rt->rank == 0) {
        int in_run;
        const char *was_dir = given_value(&r->run.o, "data", &in_run);
        const char *now_dir = r->merged.o.data;
        const char *was = content(r->rec.data, was_dir ? was_dir : MGT_DEFAULT_DATA),
                   *now = content(desc, now_dir ? now_dir : MGT_DEFAULT_DATA);
        if (strcmp(was, now)) {
            snprintf(msg, sizeof msg,
                     "--resume: the data is not what the run in %s trained on: now %s, the run's "
                     "%s; resume on the run's data, or train a new run into another --out",
                     r->out, desc, r->rec.data);
            failed = msg;
        }
    }
    mgt_die_all_if_root(failed);
}

int mgt_resume_record(const mgt_options *o, const char **words, int max, char *buf, size_t n) {
    size_t used = 0;
    int count = 0;
    for (int i = 0; i < o->ngiven && count < max; i++) {
        const char *name = o->given[i].name;
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= !strcmp(o->given[k].name, name);
        if (seen || mgt_resume_flag_class(name) == MGT_FLAG_THIS_START)
            continue;
        int found;
        const char *w = word(buf, n, &used, name, given_value(o, name, &found));
        if (w)
            words[count++] = w;
    }
    return count;
}

void mgt_resume_report(const mgt_resume *r, const mgt_options *given, const mgt_runtime *rt) {
    if (rt->rank != 0 || !r->on)
        return;
    printf("  resumed with the run's flags (%s/%s):", r->out, MGT_RUN_INFO);
    const char *f = r->rec.flags;
    for (int i = 0; i < r->rec.nflags; i++, f += strlen(f) + 1)
        printf(" %s", f);
    if (!r->rec.nflags)
        printf(" none");
    printf("\n");
    char changed[1200] = "";
    for (int i = 0; i < given->ngiven; i++) {
        const char *name = given->given[i].name, *now = given->given[i].value;
        const mgt_flag_class cls = mgt_resume_flag_class(name);
        int in_run, later = 0;
        for (int k = i + 1; k < given->ngiven; k++)
            later |= !strcmp(given->given[k].name, name);
        const char *was = given_value(&r->run.o, name, &in_run);
        if (later || cls == MGT_FLAG_DEFINES || !strcmp(name, "resume") || !strcmp(name, "out") ||
            (in_run && same_value(was, now, 0)))
            continue;
        const size_t used = strlen(changed);
        snprintf(changed + used, sizeof changed - used, "%s--%s%s%s%s%s%s", used ? ", " : "", name,
                 now ? " " : "", now ? now : "", cls == MGT_FLAG_THIS_START ? " (this start)" : "",
                 cls == MGT_FLAG_MAY_CHANGE ? (in_run ? " (the run: " : " (the run: without it")
                                            : "",
                 cls == MGT_FLAG_MAY_CHANGE ? (in_run ? (was ? was : "on") : "") : "");
        if (cls == MGT_FLAG_MAY_CHANGE) {
            const size_t u = strlen(changed);
            snprintf(changed + u, sizeof changed - u, ")");
        }
    }
    if (r->rec.world && r->rec.world != rt->world) {
        const size_t used = strlen(changed);
        snprintf(changed + used, sizeof changed - used, "%s%d ranks (the run's last start: %d)",
                 used ? ", " : "", rt->world, r->rec.world);
    }
    if (changed[0])
        printf("  changed on this resume: %s\n", changed);
    fflush(stdout);
}
