/* metrics.c: console lines in Keras' verbose=1 / verbose=2 styles and the metrics files. */
#include "metrics.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        char vl[32] = "null", va[32] = "null";
        if (r->val_loss >= 0) {
            snprintf(vl, sizeof vl, "%.6g", r->val_loss);
            snprintf(va, sizeof va, "%.6g", r->val_acc);
        }
        len += (size_t)snprintf(j + len, cap - len,
                                "{\"epoch\": %d, \"step\": %lld, \"loss\": %.6g, \"acc\": %.6g, "
                                "\"val_loss\": %s, \"val_acc\": %s, \"samples_per_s\": %.1f, "
                                "\"seconds\": %.3f}\n",
                                r->epoch, (long long)r->step, r->loss, r->acc, vl, va,
                                r->samples_per_s, r->seconds);
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

int mgt_metrics_epoch(mgt_metrics *mt, const mgt_epoch_row *row, mgt_err *err) {
    if (mt->nrows == mt->cap) {
        int cap = mt->cap ? 2 * mt->cap : 16;
        mgt_epoch_row *nr = realloc(mt->rows, sizeof *nr * (size_t)cap);
        if (!nr)
            return mgt_errf(err, "out of memory");
        mt->rows = nr;
        mt->cap = cap;
    }
    mt->rows[mt->nrows++] = *row;
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
    return write_files(mt, err);
}

void mgt_metrics_free(mgt_metrics *mt) {
    free(mt->rows);
    memset(mt, 0, sizeof *mt);
}
