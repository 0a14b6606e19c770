/* metrics.c: console lines in Keras' verbose=1 / verbose=2 styles, the metrics files and the
 * TensorBoard scalars. */
#include "metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "parse.h"
#include "tensor_io.h"

/* Is the person watching a terminal? mpirun hands its ranks a pseudo-terminal as stdout even when
 * its own output goes to a file, so a rank started by a launcher (launched) that is on a pty also
 * asks its parent (mpirun; slurmstepd under srun has no terminal). A process not started by a
 * launcher trusts its own stdout: under script, tmux or a terminal emulator the parent's stdout
 * need not be a terminal. */
static int on_terminal(int launched) {
    if (!isatty(STDOUT_FILENO))
        return 0;
    if (!launched)
        return 1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/1", (int)getppid());
    int fd = open(path, O_WRONLY | O_NOCTTY);
    if (fd < 0)
        return 1;
    int tty = isatty(fd);
    close(fd);
    return tty;
}

void mgt_metrics_init(mgt_metrics *mt, int verbose, int epochs, const char *dir, int launched,
                      int classes) {
    memset(mt, 0, sizeof *mt);
    mt->top5 = classes > 5;
    mt->tb.fd = -1;
    mt->steps_fd[0] = mt->steps_fd[1] = -1;
    mt->verbose = verbose < 0 ? (on_terminal(launched) ? 1 : 2) : verbose;
    mt->epochs = epochs;
    mt->launched = launched;
    snprintf(mt->dir, sizeof mt->dir, "%s", dir);
}

void mgt_metrics_set_task(mgt_metrics *mt, mgt_task task) {
    mt->task = task;
}

mgt_task mgt_task_of(const mgt_model *m) {
    return m->loss == MGT_LOSS_BCE               ? MGT_TASK_BINARY
           : mgt_loss_is_regression(m->loss)     ? MGT_TASK_REGRESSION
                                                 : MGT_TASK_CLASSES;
}

static double ratio(double a, double b) {
    return b > 0 ? a / b : 0;
}

void mgt_figs_label(const double *sums, int label, double *precision, double *recall, double *f1) {
    const double *c = sums + (label < 0 ? 0 : MGT_SUM_LABELS + 3 * label);
    const double tp = c[MGT_SUM_TP], fp = c[MGT_SUM_FP], fn = c[MGT_SUM_FN];
    *precision = ratio(tp, tp + fp);
    *recall = ratio(tp, tp + fn);
    *f1 = ratio(2 * tp, 2 * tp + fp + fn);
}

void mgt_figs_of(mgt_task task, int outputs, const double *sums, double samples, mgt_figs *f) {
    memset(f, 0, sizeof *f);
    if (task == MGT_TASK_BINARY) {
        f->n = 3;
        mgt_figs_label(sums, -1, &f->v[0], &f->v[1], &f->v[2]);
        f->labels = outputs > 1 && outputs <= MGT_LABEL_SUMS_MAX ? outputs : 0;
        for (int j = 0; j < f->labels; j++) {
            double p, r;
            mgt_figs_label(sums, j, &p, &r, &f->f1[j]);
        }
    } else if (task == MGT_TASK_REGRESSION) {
        const double values = samples * (double)outputs;
        f->n = 2;
        f->v[0] = ratio(sums[MGT_SUM_ABS], values);
        f->v[1] = sqrt(ratio(sums[MGT_SUM_SQ], values));
    }
}

/* The figures' names, as the lines, files and TensorBoard name them. */
static const char *const binary_names[3] = {"precision", "recall", "f1"};
static const char *const regression_names[2] = {"mae", "rmse"};

static const char *fig_name(mgt_task task, int i) {
    return task == MGT_TASK_BINARY ? binary_names[i] : regression_names[i];
}

void mgt_figs_line(mgt_task task, const mgt_figs *f, const char *prefix, char *buf, size_t n) {
    for (int i = 0; i < f->n; i++) {
        const size_t len = strlen(buf);
        snprintf(buf + len, n - len, " - %s%s: %.4f", prefix, fig_name(task, i), f->v[i]);
    }
}

/* Columns of the terminal the bar is drawn on: COLUMNS when set (as Python's
 * shutil.get_terminal_size reads it), else the terminal's size, else 80. A launcher's ranks
 * write to a pseudo-terminal of the launcher's, which has no size: then the size of the
 * launcher's own output (see on_terminal). */
static int term_width(int launched) {
    const char *c = getenv("COLUMNS");
    int w;
    if (c && mgt_parse_int(c, &w) == 0 && w > 0)
        return w;
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    if (launched) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/1", (int)getppid());
        int fd = open(path, O_WRONLY | O_NOCTTY);
        if (fd >= 0) {
            const int got = ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 0;
            close(fd);
            if (got)
                return got;
        }
    }
    return 80;
}

void mgt_bar_cells(char *cells, int width, int64_t done_of, int64_t total) {
    const int done = total ? (int)(width * done_of / total) : width;
    for (int i = 0; i < width; i++)
        cells[i] = i < done - 1 || (i == done - 1 && done == width) ? '='
                   : i == done - 1                                  ? '>'
                                                                    : '.';
    cells[width > 0 ? width : 0] = 0;
}

/* Keras' line, "120/235 [=====>....] - ETA: 1s - loss: 0.6415 - acc: 0.7760", fitted to the
 * width: the bar narrows from 30 to 10 columns, then the top-5 accuracy, the accuracy, the ETA
 * (or status), the bar and the loss go, in that order, and what is left is cut. */
void mgt_metrics_bar_line(char *out, size_t n, int width, const mgt_bar *b, const char *status) {
    const int room = width > 1 ? width - 1 : 1;
    char count[48], eta[48], loss[32], acc[32], top5[40] = "";
    const int digits = snprintf(NULL, 0, "%lld", (long long)b->steps);
    snprintf(count, sizeof count, "%*lld/%lld", digits, (long long)b->step, (long long)b->steps);
    if (status)
        snprintf(eta, sizeof eta, " - %s", status);
    else
        snprintf(eta, sizeof eta, " - ETA: %.0fs", b->eta_s);
    snprintf(loss, sizeof loss, " - loss: %.4f", b->loss);
    snprintf(acc, sizeof acc, " - %s: %.4f", b->mae ? "mae" : "acc", b->acc);
    if (b->has_top5)
        snprintf(top5, sizeof top5, " - top5_acc: %.4f", b->top5);
    const int fixed = (int)strlen(count);
    int show_top5 = b->has_top5, show_acc = 1, show_eta = 1, show_loss = 1, bar = 30;
    for (;;) {
        const int tail = (show_eta ? (int)strlen(eta) : 0) + (show_loss ? (int)strlen(loss) : 0) +
                         (show_acc ? (int)strlen(acc) : 0) + (show_top5 ? (int)strlen(top5) : 0);
        const int need = fixed + tail + (bar ? bar + 3 : 0); /* " [" bar "]" */
        if (need <= room)
            break;
        if (bar > 10)
            bar = need - room >= bar - 10 ? 10 : bar - (need - room);
        else if (show_top5)
            show_top5 = 0;
        else if (show_acc)
            show_acc = 0;
        else if (show_eta)
            show_eta = 0;
        else if (bar)
            bar = 0;
        else if (show_loss)
            show_loss = 0;
        else
            break;
    }
    char cells[32]; /* bar <= 30 */
    mgt_bar_cells(cells, bar, b->step, b->steps);
    char line[256];
    snprintf(line, sizeof line, "%s%s%s%s%s%s%s%s", count, bar ? " [" : "", cells, bar ? "]" : "",
             show_eta ? eta : "", show_loss ? loss : "", show_acc ? acc : "",
             show_top5 ? top5 : "");
    snprintf(out, n, "%.*s", room, line);
}

static void draw_bar(mgt_metrics *mt, const char *status) {
    if (!mt->bar_open) {
        printf("Epoch %d/%d\n", mt->bar.epoch + 1, mt->epochs);
        mt->bar_open = 1;
    }
    char line[256];
    mgt_metrics_bar_line(line, sizeof line, term_width(mt->launched), &mt->bar, status);
    printf("\r%s\033[K", line);
    fflush(stdout);
}

void mgt_metrics_progress(mgt_metrics *mt, int epoch, int64_t step, int64_t steps, double eta_s,
                          double loss, double acc, double top5, int force) {
    if (mt->verbose != 1)
        return;
    double now = mgt_now();
    if (!force && now - mt->last_draw < 0.1)
        return;
    mt->last_draw = now;
    mt->bar = (mgt_bar){epoch,       step, steps, eta_s, loss, acc, mt->top5 && top5 >= 0, top5,
                        mt->task == MGT_TASK_REGRESSION};
    draw_bar(mt, NULL);
}

void mgt_metrics_validating(mgt_metrics *mt) {
    if (mt->verbose == 1 && mt->bar_open)
        draw_bar(mt, "validating");
}

/* x with the fewest significant digits (up to 17) that read back as x exactly. */
static void exact(char *buf, size_t n, double x) {
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

/* A text that grows as rows are added to it. */
typedef struct text {
    char *s;
    size_t len, cap;
    int failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    for (int tries = 0; tries < 2 && !t->failed; tries++) {
        va_start(ap, fmt);
        const int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        const size_t cap = 2 * (t->cap + (size_t)n + 256);
        char *grown = realloc(t->s, cap);
        if (!grown) {
            t->failed = 1;
            return;
        }
        t->s = grown;
        t->cap = cap;
    }
}

/* The task's figures of a row for the JSON line (every digit: exact) and the CSV row (6). */
static void put_figs(text *j, text *c, mgt_task task, const mgt_figs *f, const mgt_figs *vf,
                     int validated) {
    const int n = task == MGT_TASK_BINARY ? 3 : task == MGT_TASK_REGRESSION ? 2 : 0;
    for (int v = 0; v < 2; v++) {
        const mgt_figs *g = v ? vf : f;
        const int have = v ? validated && vf->n == n : f->n == n;
        for (int i = 0; i < n; i++) {
            char x[32] = "null";
            if (have)
                exact(x, sizeof x, g->v[i]);
            put(j, ", \"%s%s\": %s", v ? "val_" : "", fig_name(task, i), x);
            if (have)
                put(c, ",%.6g", g->v[i]);
            else
                put(c, ",");
        }
    }
    if (task != MGT_TASK_BINARY || (!f->labels && !(validated && vf->labels)))
        return;
    for (int v = 0; v < 2; v++) { /* each label's F1, as arrays */
        const mgt_figs *g = v ? vf : f;
        put(j, ", \"%sf1_per_label\": ", v ? "val_" : "");
        if (!g->labels || (v && !validated)) {
            put(j, "null");
            continue;
        }
        for (int k = 0; k < g->labels; k++) {
            char x[32];
            exact(x, sizeof x, g->f1[k]);
            put(j, "%s%s", k ? ", " : "[", x);
        }
        put(j, "]");
    }
}

static int write_files(mgt_metrics *mt, mgt_err *err) {
    text j = {0}, c = {0};
    /* Top-5 goes after lr in both files, then the task's figures (binary: precision, recall,
     * f1; regression: mae, rmse; each then as val_*), so the columns before them are the same
     * for every model. */
    put(&c, "epoch,step,loss,acc,val_loss,val_acc,samples_per_s,seconds,lr%s",
        mt->top5 ? ",top5_acc,val_top5_acc" : "");
    if (mt->task != MGT_TASK_CLASSES) {
        const int n = mt->task == MGT_TASK_BINARY ? 3 : 2;
        for (int v = 0; v < 2; v++)
            for (int i = 0; i < n; i++)
                put(&c, ",%s%s", v ? "val_" : "", fig_name(mt->task, i));
    }
    put(&c, "\n");
    const int no_acc = mt->task == MGT_TASK_REGRESSION;
    for (int i = 0; i < mt->nrows; i++) {
        const mgt_epoch_row *r = &mt->rows[i];
        char vl[32] = "null", va[32] = "null", l[32], a[32] = "null", sps[32], sec[32], lr[32];
        char t5[32] = "null", vt5[32] = "null", jt5[96] = "", ct5[80] = "";
        if (r->val_loss >= 0) {
            exact(vl, sizeof vl, r->val_loss);
            if (!no_acc)
                exact(va, sizeof va, r->val_acc);
        }
        if (mt->top5) {
            if (r->top5 >= 0)
                exact(t5, sizeof t5, r->top5);
            if (r->val_loss >= 0 && r->val_top5 >= 0)
                exact(vt5, sizeof vt5, r->val_top5);
            snprintf(jt5, sizeof jt5, ", \"top5_acc\": %s, \"val_top5_acc\": %s", t5, vt5);
            char a6[32] = "", b6[32] = "";
            if (r->top5 >= 0)
                snprintf(a6, sizeof a6, "%.6g", r->top5);
            if (r->val_loss >= 0 && r->val_top5 >= 0)
                snprintf(b6, sizeof b6, "%.6g", r->val_top5);
            snprintf(ct5, sizeof ct5, ",%s,%s", a6, b6);
        }
        exact(l, sizeof l, r->loss);
        if (!no_acc)
            exact(a, sizeof a, r->acc);
        exact(sps, sizeof sps, r->samples_per_s);
        exact(sec, sizeof sec, r->seconds);
        exact(lr, sizeof lr, r->lr);
        put(&j,
            "{\"epoch\": %d, \"step\": %lld, \"loss\": %s, \"acc\": %s, "
            "\"val_loss\": %s, \"val_acc\": %s, \"samples_per_s\": %s, "
            "\"seconds\": %s, \"lr\": %s%s",
            r->epoch, (long long)r->step, l, a, vl, va, sps, sec, lr, jt5);
        char cacc[32] = "", cvl[32] = "", cva[32] = "";
        if (!no_acc)
            snprintf(cacc, sizeof cacc, "%.6g", r->acc);
        if (r->val_loss >= 0) {
            snprintf(cvl, sizeof cvl, "%.6g", r->val_loss);
            if (!no_acc)
                snprintf(cva, sizeof cva, "%.6g", r->val_acc);
        }
        put(&c, "%d,%lld,%.6g,%s,%s,%s,%.1f,%.3f,%.6g%s", r->epoch, (long long)r->step, r->loss,
            cacc, cvl, cva, r->samples_per_s, r->seconds, r->lr, ct5);
        put_figs(&j, &c, mt->task, &r->task, &r->val_task, r->val_loss >= 0);
        put(&j, "}\n");
        put(&c, "\n");
    }
    int rc = -1;
    if (j.failed || c.failed || !j.s || !c.s) {
        mgt_errf(err, "out of memory writing metrics");
    } else {
        char path[600];
        snprintf(path, sizeof path, "%s/metrics.jsonl", mt->dir);
        rc = mgt_atomic_write(path, j.s, j.len, err);
        snprintf(path, sizeof path, "%s/metrics.csv", mt->dir);
        if (rc == 0)
            rc = mgt_atomic_write(path, c.s, c.len, err);
    }
    free(j.s);
    free(c.s);
    return rc;
}

int mgt_metrics_tb(mgt_metrics *mt, mgt_profile *prof, int64_t start_step, mgt_err *err) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/tb", mt->dir);
    /* START at the first step this run will log: a resumed run keeps what the earlier run logged
     * up to its checkpoint, and TensorBoard drops what it logged after (redone now), as it drops
     * an older run into the same folder altogether when this one starts at step 0. */
    if (mgt_tb_open(&mt->tb, dir, start_step + 1, err) < 0)
        return -1;
    prof->tb = &mt->tb;
    return 0;
}

/* The task's figures as scalars, tags[prefix + name], at most 3 + MGT_LABEL_SUMS_MAX of them,
 * into tags and values from n; returns the new n. Per-label F1: prefix f1/label_J. */
enum { TAG_MAX = 96 };
static int task_scalars(mgt_task task, const mgt_figs *f, const char *prefix, int n,
                        char (*tags)[TAG_MAX], double *values) {
    for (int i = 0; i < f->n; i++, n++) {
        snprintf(tags[n], TAG_MAX, "%s%s", prefix, fig_name(task, i));
        values[n] = f->v[i];
    }
    for (int k = 0; k < f->labels; k++, n++) {
        snprintf(tags[n], TAG_MAX, "%sf1/label_%d", prefix, k);
        values[n] = f->f1[k];
    }
    return n;
}

/* The epoch's row as scalars at its global step ('/' groups the tags in TensorBoard's UI). */
static int epoch_scalars(mgt_metrics *mt, const mgt_epoch_row *r, mgt_err *err) {
    enum { MAX = 8 + 2 * (3 + MGT_LABEL_SUMS_MAX) };
    char(*tagbuf)[TAG_MAX] = malloc(sizeof *tagbuf * MAX);
    const char *tags[MAX];
    double values[MAX];
    if (!tagbuf)
        return mgt_errf(err, "out of memory writing TensorBoard scalars");
    const char *fixed[6] = {"epoch/loss",          "epoch/accuracy", "epoch/samples_per_s",
                            "epoch/learning_rate", "epoch/val_loss", "epoch/val_accuracy"};
    const double fv[6] = {r->loss, r->acc, r->samples_per_s, r->lr, r->val_loss, r->val_acc};
    int n = 0;
    for (int i = 0; i < (r->val_loss >= 0 ? 6 : 4); i++) {
        if (mt->task == MGT_TASK_REGRESSION && (i == 1 || i == 5))
            continue; /* no accuracy */
        snprintf(tagbuf[n], TAG_MAX, "%s", fixed[i]);
        values[n++] = fv[i];
    }
    if (mt->top5 && r->top5 >= 0) {
        snprintf(tagbuf[n], TAG_MAX, "epoch/top5_accuracy");
        values[n++] = r->top5;
    }
    if (mt->top5 && r->val_loss >= 0 && r->val_top5 >= 0) {
        snprintf(tagbuf[n], TAG_MAX, "epoch/val_top5_accuracy");
        values[n++] = r->val_top5;
    }
    n = task_scalars(mt->task, &r->task, "epoch/", n, tagbuf, values);
    if (r->val_loss >= 0)
        n = task_scalars(mt->task, &r->val_task, "epoch/val_", n, tagbuf, values);
    for (int i = 0; i < n; i++)
        tags[i] = tagbuf[i];
    const int rc = mgt_tb_scalars(&mt->tb, r->step, n, tags, values, err);
    free(tagbuf);
    return rc;
}

static int add_row(mgt_metrics *mt, const mgt_epoch_row *row, mgt_err *err) {
    if (mt->nrows == mt->cap) {
        int cap = mt->cap ? 2 * mt->cap : 16;
        mgt_epoch_row *nr = realloc(mt->rows, sizeof *nr * (size_t)cap);
        if (!nr)
            return mgt_errf(err, "out of memory");
        mt->rows = nr;
        mt->cap = cap;
    }
    mt->rows[mt->nrows++] = *row;
    return 0;
}

/* A number of a JSON row; `null` (no validation) reads as -1, as the rows hold it. */
static int row_number(const cJSON *j, const char *key, int nullable, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (nullable && cJSON_IsNull(v)) {
        *out = -1;
        return 0;
    }
    if (!cJSON_IsNumber(v))
        return -1;
    *out = v->valuedouble;
    return 0;
}

/* One line of metrics.jsonl as a row (the numbers come back as written: all their digits). */
static int parse_row(const char *line, mgt_epoch_row *r) {
    cJSON *j = cJSON_Parse(line);
    double epoch = 0, step = 0;
    memset(r, 0, sizeof *r);
    int rc = j && !row_number(j, "epoch", 0, &epoch) && !row_number(j, "step", 0, &step) &&
                     !row_number(j, "loss", 0, &r->loss) && !row_number(j, "acc", 1, &r->acc) &&
                     !row_number(j, "val_loss", 1, &r->val_loss) &&
                     !row_number(j, "val_acc", 1, &r->val_acc) &&
                     !row_number(j, "samples_per_s", 0, &r->samples_per_s) &&
                     !row_number(j, "seconds", 0, &r->seconds) && epoch >= 1 && epoch <= INT_MAX &&
                     step >= 0 && step <= 9e15
                 ? 0
                 : -1;
    double lr = 0;
    if (!rc && !row_number(j, "lr", 0, &lr))
        r->lr = lr;
    /* Rows from before top-5 was written, or of a run of 5 classes or fewer, have none. */
    if (rc || row_number(j, "top5_acc", 1, &r->top5) < 0)
        r->top5 = -1;
    if (rc || row_number(j, "val_top5_acc", 1, &r->val_top5) < 0)
        r->val_top5 = -1;
    if (!rc) /* the task's figures, as written (a key missing or null: none) */
        for (int v = 0; v < 2; v++) {
            mgt_figs *f = v ? &r->val_task : &r->task;
            const char *const *names = cJSON_GetObjectItemCaseSensitive(j, v ? "val_mae" : "mae")
                                           ? regression_names
                                           : binary_names;
            const int n = names == regression_names ? 2 : 3;
            for (int i = 0; i < n; i++) {
                char key[32];
                snprintf(key, sizeof key, "%s%s", v ? "val_" : "", names[i]);
                const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
                if (!cJSON_IsNumber(x))
                    break;
                f->v[i] = x->valuedouble;
                if (i == n - 1)
                    f->n = n;
            }
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, v ? "val_f1_per_label"
                                                                    : "f1_per_label");
            const int k = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
            for (int i = 0; i < k && i < MGT_LABEL_SUMS_MAX; i++) {
                const cJSON *x = cJSON_GetArrayItem(a, i);
                f->f1[i] = cJSON_IsNumber(x) ? x->valuedouble : 0;
            }
            f->labels = k <= MGT_LABEL_SUMS_MAX ? k : 0;
        }
    r->epoch = (int)epoch;
    r->step = (int64_t)step;
    cJSON_Delete(j);
    return rc;
}

int mgt_metrics_resume(mgt_metrics *mt, int64_t step, char *notice, size_t notice_size,
                       mgt_err *err) {
    notice[0] = 0;
    char path[600], *text = NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", mt->dir);
    mgt_err e;
    if (mgt_read_text_file(path, "metrics file", (size_t)1 << 30, &text, NULL, &e) < 0) {
        snprintf(notice, notice_size, "notice: %s; the metrics history starts again here", e.msg);
        return 0;
    }
    int bad = 0, line_no = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        line_no++;
        mgt_epoch_row r;
        if (!*line)
            continue;
        if (parse_row(line, &r) < 0) {
            if (!bad++)
                snprintf(notice, notice_size,
                         "notice: %s:%d is not a row of metrics; it and any other such line are "
                         "left out",
                         path, line_no);
            continue;
        }
        if (r.step <= step && add_row(mt, &r, err) < 0) {
            free(text);
            return -1;
        }
    }
    free(text);
    return write_files(mt, err);
}

int mgt_metrics_epoch(mgt_metrics *mt, const mgt_epoch_row *row, mgt_err *err) {
    if (add_row(mt, row, err) < 0)
        return -1;
    if (mt->verbose >= 1) {
        char val[320] = "", t5[40] = "";
        if (mt->top5 && row->top5 >= 0)
            snprintf(t5, sizeof t5, " - top5_acc: %.4f", row->top5);
        char acc[40] = "", figs[160] = "";
        const int no_acc = mt->task == MGT_TASK_REGRESSION;
        if (!no_acc)
            snprintf(acc, sizeof acc, " - acc: %.4f", row->acc);
        mgt_figs_line(mt->task, &row->task, "", figs, sizeof figs);
        if (row->val_loss >= 0) {
            snprintf(val, sizeof val, " - val_loss: %.4f", row->val_loss);
            if (!no_acc)
                snprintf(val + strlen(val), sizeof val - strlen(val), " - val_acc: %.4f",
                         row->val_acc);
        }
        if (row->val_loss >= 0 && mt->top5 && row->val_top5 >= 0)
            snprintf(val + strlen(val), sizeof val - strlen(val), " - val_top5_acc: %.4f",
                     row->val_top5);
        if (row->val_loss >= 0)
            mgt_figs_line(mt->task, &row->val_task, "val_", val, sizeof val);
        char lm[96] = "";
        const char *bits = mt->lm == MGT_LM_BYTES ? "bpb" : "bpt";
        if (mt->lm) /* perplexity and bits per token (byte) of the training and validation loss */
            snprintf(lm, sizeof lm, " - ppl: %.3f - %s: %.4f", exp(row->loss), bits,
                     row->loss / log(2.0));
        if (mt->lm && row->val_loss >= 0)
            snprintf(lm + strlen(lm), sizeof lm - strlen(lm), " - val_ppl: %.3f - val_%s: %.4f",
                     exp(row->val_loss), bits, row->val_loss / log(2.0));
        if (mt->verbose == 1 && mt->bar_open)
            printf("\r\033[K");
        printf("Epoch %d/%d - %.0fs - loss: %.4f%s%s%s%s%s\n", row->epoch, mt->epochs,
               row->seconds, row->loss, acc, t5, figs, val, lm);
        fflush(stdout);
        mt->bar_open = 0;
    }
    if (write_files(mt, err) < 0)
        return -1;
    return mt->tb.fd >= 0 ? epoch_scalars(mt, row, err) : 0;
}

/* ---- per-step rows ---- */

static const char *const step_files[2] = {"metrics_steps.jsonl", "metrics_steps.csv"};
/* The step files' CSV header: top-5 and the task's figures after the common columns. */
static void step_header(const mgt_metrics *mt, char *h, size_t n) {
    snprintf(h, n, "step,epoch,loss,acc,lr,samples_per_s%s", mt->top5 ? ",top5_acc" : "");
    const int k = mt->task == MGT_TASK_BINARY ? 3 : mt->task == MGT_TASK_REGRESSION ? 2 : 0;
    for (int i = 0; i < k; i++)
        snprintf(h + strlen(h), n - strlen(h), ",%s", fig_name(mt->task, i));
    snprintf(h + strlen(h), n - strlen(h), "\n");
}

/* The step a whole row names (JSON lines start {"step": N, CSV rows N,), or -1. */
static int64_t row_step(const char *line, int csv) {
    long long v;
    int used = 0;
    if (csv ? sscanf(line, "%lld,%n", &v, &used) : sscanf(line, "{\"step\": %lld,%n", &v, &used))
        return used > 0 ? (int64_t)v : -1;
    return -1;
}

/* Rewrites a step file (atomically) with its header (CSV) and its whole rows up to step `upto`. */
static int keep_rows(const char *path, const char *header, int64_t upto, mgt_err *err) {
    const int csv = header != NULL;
    const size_t hlen = csv ? strlen(header) : 0;
    size_t len = 0;
    char *text = NULL;
    FILE *f = upto > 0 ? fopen(path, "rb") : NULL;
    if (!f && upto > 0 && errno != ENOENT)
        return mgt_errf(err, "cannot read %s: %s; move it away to start its rows afresh", path,
                        strerror(errno));
    if (f) {
        if (fseek(f, 0, SEEK_END) == 0) {
            const long n = ftell(f);
            text = n >= 0 ? malloc((size_t)n + 1) : NULL;
            if (text && (fseek(f, 0, SEEK_SET) != 0 || fread(text, 1, (size_t)n, f) != (size_t)n)) {
                free(text);
                text = NULL;
            }
            len = text ? (size_t)n : 0;
        }
        const int failed = !text;
        fclose(f);
        if (failed)
            return mgt_errf(err, "cannot read %s: %s; move it away to start its rows afresh", path,
                            strerror(errno ? errno : EIO));
        text[len] = 0;
    }
    char *out = malloc(len + hlen + 1);
    if (!out) {
        free(text);
        return mgt_errf(err, "out of memory reading %s", path);
    }
    size_t at = 0;
    if (csv) {
        memcpy(out, header, hlen);
        at = hlen;
    }
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (!nl)
            break; /* a part of a row, cut by a crash */
        const int64_t st = row_step(line, csv);
        if (st >= 0 && st <= upto) {
            memcpy(out + at, line, (size_t)(nl - line) + 1);
            at += (size_t)(nl - line) + 1;
        }
        line = nl + 1;
    }
    const int rc = mgt_atomic_write(path, out, at, err);
    free(out);
    free(text);
    return rc;
}

int mgt_metrics_steps_open(mgt_metrics *mt, int64_t start_step, mgt_err *err) {
    for (int i = 0; i < 2; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", mt->dir, step_files[i]);
        char header[160];
        step_header(mt, header, sizeof header);
        if (keep_rows(path, i == 1 ? header : NULL, start_step, err) < 0)
            return -1;
        mt->steps_fd[i] = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (mt->steps_fd[i] < 0)
            return mgt_errf(err, "cannot open %s: %s", path, strerror(errno));
    }
    return 0;
}

/* One row with one write (looping only on a partial write or EINTR). */
static int append(int fd, const char *name, const char *dir, const char *text, size_t len,
                  mgt_err *err) {
    size_t done = 0;
    while (done < len) {
        const ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return mgt_errf(err, "cannot write %s/%s: %s; free space there", dir, name,
                            strerror(w < 0 ? errno : EIO));
        done += (size_t)w;
    }
    return 0;
}

int mgt_metrics_step(mgt_metrics *mt, const mgt_step_row *r, mgt_err *err) {
    char e[32], l[32], a[32] = "null", ca[32] = "", lr[32], sps[32], t5[32], jt5[64] = "",
                    ct5[40] = "", jf[160] = "", cf[80] = "", line[768];
    exact(e, sizeof e, r->epoch);
    exact(l, sizeof l, r->loss);
    if (mt->task != MGT_TASK_REGRESSION) {
        exact(a, sizeof a, r->acc);
        snprintf(ca, sizeof ca, "%.6g", r->acc);
    }
    exact(lr, sizeof lr, r->lr);
    exact(sps, sizeof sps, r->samples_per_s);
    if (mt->top5) {
        exact(t5, sizeof t5, r->top5);
        snprintf(jt5, sizeof jt5, ", \"top5_acc\": %s", t5);
        snprintf(ct5, sizeof ct5, ",%.6g", r->top5);
    }
    for (int i = 0; i < r->task.n; i++) { /* the task's figures (micro), after the others */
        char x[32];
        exact(x, sizeof x, r->task.v[i]);
        snprintf(jf + strlen(jf), sizeof jf - strlen(jf), ", \"%s\": %s",
                 fig_name(mt->task, i), x);
        snprintf(cf + strlen(cf), sizeof cf - strlen(cf), ",%.6g", r->task.v[i]);
    }
    int n = snprintf(line, sizeof line,
                     "{\"step\": %" PRId64 ", \"epoch\": %s, \"loss\": %s, \"acc\": %s, "
                     "\"lr\": %s, \"samples_per_s\": %s%s%s}\n",
                     r->step, e, l, a, lr, sps, jt5, jf);
    if (mt->steps_fd[0] >= 0 &&
        append(mt->steps_fd[0], step_files[0], mt->dir, line, (size_t)n, err) < 0)
        return -1;
    n = snprintf(line, sizeof line, "%" PRId64 ",%.6g,%.6g,%s,%.6g,%.1f%s%s\n", r->step,
                 r->epoch, r->loss, ca, r->lr, r->samples_per_s, ct5, cf);
    if (mt->steps_fd[1] >= 0 &&
        append(mt->steps_fd[1], step_files[1], mt->dir, line, (size_t)n, err) < 0)
        return -1;
    if (mt->tb.fd < 0)
        return 0;
    char names[8][TAG_MAX];
    const char *tags[8] = {"step/loss"};
    double values[8] = {r->loss};
    int k = 1;
    if (mt->task != MGT_TASK_REGRESSION) {
        tags[k] = "step/accuracy";
        values[k++] = r->acc;
    }
    tags[k] = "step/learning_rate";
    values[k++] = r->lr;
    tags[k] = "step/samples_per_s";
    values[k++] = r->samples_per_s;
    if (mt->top5) {
        tags[k] = "step/top5_accuracy";
        values[k++] = r->top5;
    }
    for (int i = 0; i < r->task.n; i++) {
        snprintf(names[i], TAG_MAX, "step/%s", fig_name(mt->task, i));
        tags[k] = names[i];
        values[k++] = r->task.v[i];
    }
    return mgt_tb_scalars(&mt->tb, r->step, k, tags, values, err);
}

void mgt_metrics_free(mgt_metrics *mt) {
    mgt_tb_close(&mt->tb);
    for (int i = 0; i < 2; i++)
        if (mt->steps_fd[i] >= 0)
            close(mt->steps_fd[i]);
    free(mt->rows);
    memset(mt, 0, sizeof *mt);
    mt->tb.fd = -1;
    mt->steps_fd[0] = mt->steps_fd[1] = -1;
}
