/* metrics.c: console lines in Keras' verbose=1 / verbose=2 styles, the metrics files and the
 * TensorBoard scalars. */
#include "metrics.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rundir.h"
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

void mgt_metrics_init(mgt_metrics *mt, int verbose, int epochs, const char *dir, int launched) {
    memset(mt, 0, sizeof *mt);
    mt->tb.fd = -1;
    mt->verbose = verbose < 0 ? (on_terminal(launched) ? 1 : 2) : verbose;
    mt->epochs = epochs;
    snprintf(mt->dir, sizeof mt->dir, "%s", dir);
}

void mgt_metrics_progress(mgt_metrics *mt, int epoch, int64_t step, int64_t steps, double eta_s,
                          double loss, double acc, int force) {
    if (mt->verbose != 1)
        return;
    double now = mgt_now();
    if (!force && now - mt->last_draw < 0.1)
        return;
    mt->last_draw = now;
    if (!mt->bar_open) {
        printf("Epoch %d/%d\n", epoch + 1, mt->epochs);
        mt->bar_open = 1;
    }
    enum { W = 30 };
    char bar[W + 1];
    int done = steps ? (int)(W * step / steps) : W;
    for (int i = 0; i < W; i++)
        bar[i] = i < done ? '=' : '.';
    if (done < W && done > 0)
        bar[done - 1] = '>';
    if (done < W)
        bar[done] = '.';
    bar[W] = 0;
    int width = snprintf(NULL, 0, "%lld", (long long)steps);
    printf("\r%*lld/%lld [%s] - ETA: %.0fs - loss: %.4f - acc: %.4f\033[K", width,
           (long long)step, (long long)steps, bar, eta_s, loss, acc);
    fflush(stdout);
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
    size_t clen = (size_t)snprintf(c, cap, "epoch,step,loss,acc,val_loss,val_acc,"
                                           "samples_per_s,seconds\n");
    for (int i = 0; i < mt->nrows; i++) {
        const mgt_epoch_row *r = &mt->rows[i];
        char vl[32] = "null", va[32] = "null", l[32], a[32], sps[32], sec[32];
        if (r->val_loss >= 0) {
            exact(vl, sizeof vl, r->val_loss);
            exact(va, sizeof va, r->val_acc);
        }
        exact(l, sizeof l, r->loss);
        exact(a, sizeof a, r->acc);
        exact(sps, sizeof sps, r->samples_per_s);
        exact(sec, sizeof sec, r->seconds);
        len += (size_t)snprintf(j + len, cap - len,
                                "{\"epoch\": %d, \"step\": %lld, \"loss\": %s, \"acc\": %s, "
                                "\"val_loss\": %s, \"val_acc\": %s, \"samples_per_s\": %s, "
                                "\"seconds\": %s}\n",
                                r->epoch, (long long)r->step, l, a, vl, va, sps, sec);
        if (r->val_loss >= 0) {
            snprintf(vl, sizeof vl, "%.6g", r->val_loss);
            snprintf(va, sizeof va, "%.6g", r->val_acc);
        }
        clen += (size_t)snprintf(c + clen, cap - clen, "%d,%lld,%.6g,%.6g,%s,%s,%.1f,%.3f\n",
                                 r->epoch, (long long)r->step, r->loss, r->acc,
                                 r->val_loss >= 0 ? vl : "", r->val_loss >= 0 ? va : "",
                                 r->samples_per_s, r->seconds);
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
    const char *tags[] = {"epoch/loss",          "epoch/accuracy", "epoch/samples_per_s",
                          "epoch/learning_rate", "epoch/val_loss", "epoch/val_accuracy"};
    double values[] = {r->loss, r->acc, r->samples_per_s, r->lr, r->val_loss, r->val_acc};
    int n = r->val_loss >= 0 ? 6 : 4;
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
        char val[96] = "";
        if (row->val_loss >= 0)
            snprintf(val, sizeof val, " - val_loss: %.4f - val_acc: %.4f", row->val_loss,
                     row->val_acc);
        if (mt->verbose == 1 && mt->bar_open)
            printf("\r\033[K");
        printf("Epoch %d/%d - %.0fs - loss: %.4f - acc: %.4f%s\n", row->epoch, mt->epochs,
               row->seconds, row->loss, row->acc, val);
        fflush(stdout);
        mt->bar_open = 0;
    }
    if (write_files(mt, err) < 0)
        return -1;
    return mt->tb.fd >= 0 ? epoch_scalars(mt, row, err) : 0;
}

void mgt_metrics_free(mgt_metrics *mt) {
    mgt_tb_close(&mt->tb);
    free(mt->rows);
    memset(mt, 0, sizeof *mt);
    mt->tb.fd = -1;
}
