/* plot.c: training curves through gnuplot (Debian's gnuplot-nox): loss and accuracy, train and
 * validation, per epoch, and the learning rate, titled with the model, world size and global
 * batch from run.json. Where the run logged per-step rows (--log-every: metrics_steps.csv), the
 * loss, accuracy and rate are drawn per step too, on the same epoch axis (a step row's epoch is
 * the fraction of epochs done), the per-step training curves in a light shade behind the epoch
 * points. A metrics.csv without the lr column (an older run) gets the two panels it has. The
 * PNG is drawn to a temporary name and renamed, like every file mgtrain writes. */
#include "plot.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

/* Whether the CSV file's header names column `col`; whether the file has a data row. */
static int csv_has(const char *path, const char *col, int *rows) {
    FILE *f = fopen(path, "r");
    *rows = 0;
    if (!f)
        return 0;
    char line[512] = "";
    int found = 0;
    if (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        for (char *save = NULL, *c = strtok_r(line, ",", &save); c; c = strtok_r(NULL, ",", &save))
            found |= !strcmp(c, col);
        char row[512];
        *rows = fgets(row, sizeof row, f) != NULL;
    }
    fclose(f);
    return found;
}

/* One panel: the per-step curve (steps csv column `sc`) behind the epoch curves (epoch csv
 * columns `ec` train, `vc` validation; 0: none). Colours: gnuplot's first two line colours for
 * train and validation, a light violet for the steps. */
static void panel(FILE *g, const char *title, const char *csv, const char *steps, int sc, int ec,
                  int vc) {
    fprintf(g, "set title '%s'\nplot ", title);
    const char *sep = "";
    if (steps) {
        fprintf(g, "'%s' using 2:%d with lines lw 2 lc rgb '#cfa3ef' title '%s'", steps, sc,
                ec ? "train (per step)" : "per step");
        sep = ", ";
    }
    if (ec)
        fprintf(g, "%s'%s' using 1:%d with linespoints lw 2 lc rgb '#9400d3' title '%s'", sep, csv,
                ec, vc ? "train" : "at epoch ends");
    if (vc)
        fprintf(g, ", '' using 1:%d with linespoints lw 2 lc rgb '#009e73' title 'validation'", vc);
    fprintf(g, "\n");
}

int mgt_plot(const char *dir, mgt_err *err) {
    char csv[600], json[600], png[600], tmp[640], steps_csv[600];
    snprintf(csv, sizeof csv, "%s/metrics.csv", dir);
    snprintf(steps_csv, sizeof steps_csv, "%s/metrics_steps.csv", dir);
    snprintf(json, sizeof json, "%s/run.json", dir);
    snprintf(png, sizeof png, "%s/curves.png", dir);
    snprintf(tmp, sizeof tmp, "%s/.curves.png.tmp.%d", dir, (int)getpid());
    if (access(csv, R_OK) != 0)
        return mgt_errf(err, "%s: %s; pass the --out folder of a training run", csv,
                        strerror(errno));
    char title[256] = "mgtrain";
    char *j = slurp(json);
    cJSON *root = j ? cJSON_Parse(j) : NULL;
    if (root) {
        cJSON *m = cJSON_GetObjectItem(root, "model"), *w = cJSON_GetObjectItem(root, "world"),
              *b = cJSON_GetObjectItem(root, "global_batch");
        if (cJSON_IsString(m) && cJSON_IsNumber(w) && cJSON_IsNumber(b))
            snprintf(title, sizeof title, "%s - %d rank%s - global batch %d", m->valuestring,
                     w->valueint, w->valueint == 1 ? "" : "s", b->valueint);
        cJSON_Delete(root);
    }
    free(j);
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        return mgt_errf(err, "gnuplot is not installed; install it (apt-get install gnuplot-nox, "
                        "which ./launch/quickstart does) and run mgtrain plot again");
    int rows, step_rows;
    const int has_lr = csv_has(csv, "lr", &rows);
    const char *steps = csv_has(steps_csv, "lr", &step_rows) && step_rows ? steps_csv : NULL;
    const int panels = has_lr || steps ? 3 : 2;
    FILE *g = popen("gnuplot", "w");
    if (!g)
        return mgt_errf(err, "cannot start gnuplot: %s", strerror(errno));
    fprintf(g,
            "set terminal pngcairo size %d,500 font 'sans,11'\n"
            "set output '%s'\n"
            "set datafile separator ','\n"
            "set key autotitle columnhead\n"
            /* Whole epochs on the x axis (at most about 10 tics), points off the frame. */
            "stats '%s' using 1 nooutput\n"
            "xstep = STATS_max <= 10 ? 1 : ceil(STATS_max / 10.0)\n"
            "set autoscale fix\nset xtics 0, xstep\nset format x '%%.0f'\n"
            "if (STATS_max == STATS_min) { set xrange [STATS_min - 1 : STATS_max + 1] }\n"
            "set offsets graph 0.03, graph 0.03, graph 0.05, graph 0.05\n"
            "set multiplot layout 1,%d title '%s'\n"
            "set grid\nset xlabel 'epoch'\n"
            "set key below horizontal height 1.5\n",
            600 * panels, tmp, csv, panels, title);
    panel(g, "loss", csv, steps, 3, 3, 5);
    panel(g, "accuracy", csv, steps, 4, 4, 6);
    if (panels == 3) { /* the rate per step where logged, else at each epoch's end, from 0 up */
        fprintf(g, "set yrange [0:*]\n");
        panel(g, "learning rate", csv, steps, 5, steps ? 0 : 9, 0);
    }
    fprintf(g, "unset multiplot\n");
    int st = pclose(g);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        unlink(tmp);
        return mgt_errf(err, "gnuplot failed drawing %s (exit status %d); is %s a metrics file "
                        "written by mgtrain train?", png, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                        csv);
    }
    if (rename(tmp, png) != 0) {
        unlink(tmp);
        return mgt_errf(err, "cannot write %s: %s", png, strerror(errno));
    }
    printf("wrote %s\n", png);
    return 0;
}
