/* plot.c: training curves through gnuplot (Debian's gnuplot-nox): loss and accuracy, train and
 * validation, per epoch, titled with the model, world size and global batch from run.json. The
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

int mgt_plot(const char *dir, mgt_err *err) {
    char csv[600], json[600], png[600], tmp[640];
    snprintf(csv, sizeof csv, "%s/metrics.csv", dir);
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
    FILE *g = popen("gnuplot", "w");
    if (!g)
        return mgt_errf(err, "cannot start gnuplot: %s", strerror(errno));
    fprintf(g,
            "set terminal pngcairo size 1200,500 font 'sans,11'\n"
            "set output '%s'\n"
            "set datafile separator ','\n"
            "set key autotitle columnhead\n"
            /* Whole epochs on the x axis (at most about 10 tics), points off the frame. */
            "stats '%s' using 1 nooutput\n"
            "xstep = STATS_max <= 10 ? 1 : ceil(STATS_max / 10.0)\n"
            "set autoscale fix\nset xtics 0, xstep\nset format x '%%.0f'\n"
            "if (STATS_max == STATS_min) { set xrange [STATS_min - 1 : STATS_max + 1] }\n"
            "set offsets graph 0.03, graph 0.03, graph 0.05, graph 0.05\n"
            "set multiplot layout 1,2 title '%s'\n"
            "set grid\nset xlabel 'epoch'\n"
            "set key below horizontal height 1.5\nset title 'loss'\n"
            "plot '%s' using 1:3 with linespoints lw 2 title 'train', "
            "'' using 1:5 with linespoints lw 2 title 'validation'\n"
            "set title 'accuracy'\n"
            "plot '%s' using 1:4 with linespoints lw 2 title 'train', "
            "'' using 1:6 with linespoints lw 2 title 'validation'\n"
            "unset multiplot\n",
            tmp, csv, title, csv, csv);
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
