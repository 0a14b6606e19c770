/* metrics.c: console lines in Keras' verbose=1 / verbose=2 styles, the metrics files and the
 * TensorBoard scalars. */
#include "metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
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
    snprintf(acc, sizeof acc, " - acc: %.4f", b->acc);
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
    mt->bar = (mgt_bar){epoch, step, steps, eta_s, loss, acc, mt->top5 && top5 >= 0, top5};
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

static int write_files(mgt_metrics *mt, mgt_err *err) {
    size_t cap = 256 + (size_t)mt->nrows * 512, len = 0;
    char *j = malloc(cap), *c = malloc(cap);
    if (!j || !c) {
        free(j);
        free(c);
        return mgt_errf(err, "out of memory writing metrics");
    }
    /* Top-5 goes last in both files, so the columns before it are the same with or without. */
    size_t clen = (size_t)snprintf(c, cap,
                                   "epoch,step,loss,acc,val_loss,val_acc,"
                                   "samples_per_s,seconds,lr%s\n",
                                   mt->top5 ? ",top5_acc,val_top5_acc" : "");
    for (int i = 0; i < mt->nrows; i++) {
        const mgt_epoch_row *r = &mt->rows[i];
        char vl[32] = "null", va[32] = "null", l[32], a[32], sps[32], sec[32], lr[32];
        char t5[32] = "null", vt5[32] = "null", jt5[96] = "", ct5[80] = "";
        if (r->val_loss >= 0) {
            exact(vl, sizeof vl, r->val_loss);
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
        exact(a, sizeof a, r->acc);
        exact(sps, sizeof sps, r->samples_per_s);
        exact(sec, sizeof sec, r->seconds);
        exact(lr, sizeof lr, r->lr);
        len += (size_t)snprintf(j + len, cap - len,
                                "{\"epoch\": %d, \"step\": %lld, \"loss\": %s, \"acc\": %s, "
                                "\"val_loss\": %s, \"val_acc\": %s, \"samples_per_s\": %s, "
                                "\"seconds\": %s, \"lr\": %s%s}\n",
                                r->epoch, (long long)r->step, l, a, vl, va, sps, sec, lr, jt5);
        if (r->val_loss >= 0) {
            snprintf(vl, sizeof vl, "%.6g", r->val_loss);
            snprintf(va, sizeof va, "%.6g", r->val_acc);
        }
        clen += (size_t)snprintf(c + clen, cap - clen,
                                 "%d,%lld,%.6g,%.6g,%s,%s,%.1f,%.3f,%.6g%s\n", r->epoch,
                                 (long long)r->step, r->loss, r->acc, r->val_loss >= 0 ? vl : "",
                                 r->val_loss >= 0 ? va : "", r->samples_per_s, r->seconds, r->lr,
                                 ct5);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", mt->dir);
    int rc = mgt_atomic_write(path, j, len, err);
    snprintf(path, sizeof path, "%s/metrics.csv", mt->dir);
    if (rc == 0)
        rc = mgt_atomic_write(path, c, clen, err);
    free(j);
    free(c);
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

/* The epoch's row as scalars at its global step ('/' groups the tags in TensorBoard's UI). */
static int epoch_scalars(mgt_metrics *mt, const mgt_epoch_row *r, mgt_err *err) {
    const char *tags[8] = {"epoch/loss",          "epoch/accuracy", "epoch/samples_per_s",
                           "epoch/learning_rate", "epoch/val_loss", "epoch/val_accuracy"};
    double values[8] = {r->loss, r->acc, r->samples_per_s, r->lr, r->val_loss, r->val_acc};
    int n = r->val_loss >= 0 ? 6 : 4;
    if (mt->top5 && r->top5 >= 0) {
        tags[n] = "epoch/top5_accuracy";
        values[n++] = r->top5;
    }
    if (mt->top5 && r->val_loss >= 0 && r->val_top5 >= 0) {
        tags[n] = "epoch/val_top5_accuracy";
        values[n++] = r->val_top5;
    }
    return mgt_tb_scalars(&mt->tb, r->step, n, tags, values, err);
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
                     !row_number(j, "loss", 0, &r->loss) && !row_number(j, "acc", 0, &r->acc) &&
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
        char val[128] = "", t5[40] = "";
        if (mt->top5 && row->top5 >= 0)
            snprintf(t5, sizeof t5, " - top5_acc: %.4f", row->top5);
        if (row->val_loss >= 0)
            snprintf(val, sizeof val, " - val_loss: %.4f - val_acc: %.4f", row->val_loss,
                     row->val_acc);
        if (row->val_loss >= 0 && mt->top5 && row->val_top5 >= 0)
            snprintf(val + strlen(val), sizeof val - strlen(val), " - val_top5_acc: %.4f",
                     row->val_top5);
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
        printf("Epoch %d/%d - %.0fs - loss: %.4f - acc: %.4f%s%s%s\n", row->epoch, mt->epochs,
               row->seconds, row->loss, row->acc, t5, val, lm);
        fflush(stdout);
        mt->bar_open = 0;
    }
    if (write_files(mt, err) < 0)
        return -1;
    return mt->tb.fd >= 0 ? epoch_scalars(mt, row, err) : 0;
}

/* ---- per-step rows ---- */

static const char *const step_files[2] = {"metrics_steps.jsonl", "metrics_steps.csv"};
static const char step_header[] = "step,epoch,loss,acc,lr,samples_per_s\n";
static const char step_header_top5[] = "step,epoch,loss,acc,lr,samples_per_s,top5_acc\n";

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
        if (keep_rows(path, i == 1 ? (mt->top5 ? step_header_top5 : step_header) : NULL, start_step,
                      err) < 0)
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
    char e[32], l[32], a[32], lr[32], sps[32], t5[32], jt5[64] = "", ct5[40] = "", line[512];
    exact(e, sizeof e, r->epoch);
    exact(l, sizeof l, r->loss);
    exact(a, sizeof a, r->acc);
    exact(lr, sizeof lr, r->lr);
    exact(sps, sizeof sps, r->samples_per_s);
    if (mt->top5) {
        exact(t5, sizeof t5, r->top5);
        snprintf(jt5, sizeof jt5, ", \"top5_acc\": %s", t5);
        snprintf(ct5, sizeof ct5, ",%.6g", r->top5);
    }
    int n = snprintf(line, sizeof line,
                     "{\"step\": %" PRId64 ", \"epoch\": %s, \"loss\": %s, \"acc\": %s, "
                     "\"lr\": %s, \"samples_per_s\": %s%s}\n",
                     r->step, e, l, a, lr, sps, jt5);
    if (mt->steps_fd[0] >= 0 &&
        append(mt->steps_fd[0], step_files[0], mt->dir, line, (size_t)n, err) < 0)
        return -1;
    n = snprintf(line, sizeof line, "%" PRId64 ",%.6g,%.6g,%.6g,%.6g,%.1f%s\n", r->step, r->epoch,
                 r->loss, r->acc, r->lr, r->samples_per_s, ct5);
    if (mt->steps_fd[1] >= 0 &&
        append(mt->steps_fd[1], step_files[1], mt->dir, line, (size_t)n, err) < 0)
        return -1;
    if (mt->tb.fd < 0)
        return 0;
    const char *tags[] = {"step/loss", "step/accuracy", "step/learning_rate", "step/samples_per_s",
                          "step/top5_accuracy"};
    const double values[] = {r->loss, r->acc, r->lr, r->samples_per_s, r->top5};
    return mgt_tb_scalars(&mt->tb, r->step, mt->top5 ? 5 : 4, tags, values, err);
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
