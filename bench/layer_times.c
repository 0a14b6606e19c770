/* layer_times.c: where one CPU training step of a model spends its time, layer by layer.
 *
 *   mgt_layer_times [--model FILE] [--batch N] [--threads T] [--reps R] [--warmup W]
 *                   [--conv-algo auto|direct|winograd]
 *
 * Builds the model on the CPU backend with T threads (default: the cores this process may use,
 * as a one-rank mgtrain does), fills the batch with synthetic values, and runs W untimed and R
 * timed training steps: forward layer by layer, the loss, backward layer by layer, the
 * optimizer's update. Each layer's time includes its activation (forward) and the activation's
 * gradient (backward), as mgt_model_forward and mgt_model_loss_backward run them. The table gives
 * the median ms over the R steps of every layer's forward and backward, the loss and the update,
 * and the whole step, with the process's CPU seconds per wall second over the timed steps (T
 * when all threads are busy all the time; less when lanes wait or threads sleep).
 *
 * Built for measuring: under `valgrind --tool=callgrind` (--reps 1 --warmup 0) the same steps
 * give instruction counts per function, which do not depend on the machine's load. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "bench_args.h"
#include "model.h"
#include "optim.h"
#include "runtime.h"
#include "train_cfg.h"
#include "util.h"

/* CPU seconds of every thread of the process so far. */
static double cpu_seconds(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0.0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A part's start: wall and CPU clocks. */
typedef struct {
    double wall, cpu;
} mark;

static mark mark_now(void) {
    return (mark){mgt_now(), cpu_seconds()};
}

/* ms since m on both clocks, into out[0] (wall) and out[1] (CPU). */
static void mark_end(mark m, double *out) {
    const double cpu = cpu_seconds();
    out[0] = 1e3 * (mgt_now() - m.wall);
    out[1] = 1e3 * (cpu - m.cpu);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of column `col` of a reps x cols table (sorts a copy). */
static double median_of(const double *t, int reps, int cols, int col, double *tmp) {
    for (int r = 0; r < reps; r++)
        tmp[r] = t[(size_t)r * cols + col];
    qsort(tmp, (size_t)reps, sizeof *tmp, cmp_double);
    return reps % 2 ? tmp[reps / 2] : 0.5 * (tmp[reps / 2 - 1] + tmp[reps / 2]);
}

/* One training step, timing each part on both clocks: forward of layer i is part 2i, its
 * backward part 2i + 1, the loss part 2L, the update part 2L + 1; part p's wall ms go to
 * ms[2p] and its CPU ms to ms[2p + 1]. The pieces are those mgt_model_forward and
 * mgt_model_loss_backward run, one at a time (a layer backward skips is timed at ~0). */
static void timed_step(mgt_model *m, mgt_optim *opt, const mgt_step *s, double *ms) {
    const int L = m->nlayers;
    for (int i = 0; i < L; i++) {
        const mark t = mark_now();
        mgt_model_layer_forward(m, i, s);
        mark_end(t, ms + 4 * i);
    }
    mark t = mark_now();
    mgt_model_loss(m, s, 1);
    mark_end(t, ms + 4 * L);
    for (int i = L - 1; i >= 0; i--) {
        t = mark_now();
        mgt_model_layer_backward(m, i, s);
        mark_end(t, ms + 4 * i + 2);
    }
    t = mark_now();
    mgt_optim_step(opt, s->be, m->w, m->g, s->n);
    mark_end(t, ms + 4 * L + 2);
}

int main(int argc, char **argv) {
    mgt_cpu_blas_choose(argv); /* OpenBLAS's kernel as mgtrain picks it (src/cpu/cpu_blas.c) */
    mgt_runtime rt;
    mgt_runtime_init(&rt, &argc, &argv);
    const char *model = "examples/convnet.cfg", *algo = NULL;
    long batch = 0, threads = 0, reps = 5, warmup = 1;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"batch", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 't'}, {"reps", required_argument, 0, 'r'},
        {"warmup", required_argument, 0, 'w'},  {"conv-algo", required_argument, 0, 'a'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'm':
            model = optarg;
            break;
        case 'b':
            batch = bench_need_long("--batch", optarg, 1);
            break;
        case 't':
            threads = bench_need_long("--threads", optarg, 1);
            break;
        case 'r':
            reps = bench_need_long("--reps", optarg, 1);
            break;
        case 'w':
            warmup = bench_need_long("--warmup", optarg, 0);
            break;
        case 'a':
            algo = optarg;
            break;
        case 'h':
            printf("usage: mgt_layer_times [--model FILE (examples/convnet.cfg)] [--batch N (the "
                   "model's)] [--threads T (the cores this process may use)] [--reps R (5)] "
                   "[--warmup W (1)] [--conv-algo auto|direct|winograd]\n");
            mgt_runtime_finalize(&rt);
            return 0;
        default:
            mgt_die_all("unknown flag; see mgt_layer_times --help");
        }
    }
    if (threads == 0)
        threads = mgt_runtime_cores(&rt);

    mgt_err err = {{0}};
    static mgt_model m; /* large (fixed tables): not on the stack */
    mgt_train_cfg train;
    if (mgt_model_file_parse(&m, &train, model, NULL, &err) < 0)
        mgt_die_all("%s", err.msg);
    if (algo && mgt_conv2d_set_algo(&m, algo, &err) < 0)
        mgt_die_all("--conv-algo %s: %s", algo, err.msg);
    if (batch == 0)
        batch = train.batch_size;
    mgt_backend be = {0};
    if (mgt_cpu_backend_init(&be, (int)threads) < 0)
        mgt_die("cannot start the CPU backend");
    if (mgt_model_alloc(&m, &be, (int)batch, &err) < 0)
        mgt_die("%s", err.msg);
    mgt_optim opt;
    const mgt_optim_cfg optim = mgt_train_optim(&train);
    if (mgt_optim_init(&opt, &optim, &be, m.param_count, &err) < 0)
        mgt_die("%s", err.msg);
    mgt_model_init_host(&m, train.seed, m.w, m.buf);
    const size_t in = (size_t)mgt_shape_elems(m.input);
    for (size_t i = 0; i < (size_t)batch * in; i++) /* pixels in [0, 1), as the data sets give */
        m.x[i] = mgt_uniform(0x5eedULL, i);
    for (long i = 0; i < batch; i++)
        m.labels[i] = (int32_t)(mgt_uniform(0x1abe1ULL, (uint64_t)i) * (float)m.classes);

    const int L = m.nlayers, cols = 2 * (2 * L + 2);
    double *t = calloc((size_t)reps * cols, sizeof *t), *tmp = calloc((size_t)reps, sizeof *tmp);
    double *step = calloc((size_t)reps, sizeof *step), *row = calloc((size_t)cols, sizeof *row);
    if (!t || !tmp || !step || !row)
        mgt_die("out of host memory for %ld x %d timings", reps, cols);
    double wall = 0.0, cpu = 0.0;
    for (long r = -warmup; r < reps; r++) {
        mgt_step s = {.in = {m.x, m.labels, m.targets},
                      .be = &be,
                      .n = (int)batch,
                      .training = 1,
                      .global_step = r + warmup,
                      .global_n = batch,
                      .seed = train.seed,
                      .whole_grads = 1}; /* one rank, as mgtrain's reducer says it */
        memset(row, 0, sizeof(double) * (size_t)cols);
        const mark m0 = mark_now();
        timed_step(&m, &opt, &s, row);
        double total[2];
        mark_end(m0, total);
        if (r < 0)
            continue;
        memcpy(t + (size_t)r * cols, row, sizeof(double) * (size_t)cols);
        step[r] = total[0];
        wall += total[0];
        cpu += total[1];
    }

    const int R = (int)reps;
    char kernel[160];
    mgt_cpu_blas_notice(kernel, sizeof kernel);
    printf("%s, batch %ld, %ld thread(s), %ld timed step(s) after %ld: median ms of wall time "
           "and of CPU time (all threads); %s\n",
           m.path, batch, threads, reps, warmup, kernel);
    printf("%-14s %-10s %-12s %10s %10s %10s %10s\n", "layer", "type", "output", "fwd wall",
           "fwd cpu", "bwd wall", "bwd cpu");
    for (int i = 0; i < L; i++) {
        const mgt_layer *l = &m.layers[i];
        char shape[48];
        snprintf(shape, sizeof shape, "%dx%dx%d", l->out.h, l->out.w, l->out.c);
        printf("%-14s %-10s %-12s %10.3f %10.3f %10.3f %10.3f\n", l->name, l->type->name, shape,
               median_of(t, R, cols, 4 * i, tmp), median_of(t, R, cols, 4 * i + 1, tmp),
               median_of(t, R, cols, 4 * i + 2, tmp), median_of(t, R, cols, 4 * i + 3, tmp));
    }
    printf("%-14s %-10s %-12s %10.3f %10.3f\n", "loss", "", "", median_of(t, R, cols, 4 * L, tmp),
           median_of(t, R, cols, 4 * L + 1, tmp));
    printf("%-14s %-10s %-12s %10s %10s %10.3f %10.3f\n", "update", mgt_opt_name(train.optimizer),
           "", "", "", median_of(t, R, cols, 4 * L + 2, tmp),
           median_of(t, R, cols, 4 * L + 3, tmp));
    qsort(step, (size_t)reps, sizeof *step, cmp_double);
    printf("step: median %.3f ms (min %.3f, max %.3f), %.1f samples/s; CPU s per wall s %.2f\n",
           R % 2 ? step[R / 2] : 0.5 * (step[R / 2 - 1] + step[R / 2]), step[0], step[R - 1],
           (double)batch * (double)reps / (wall / 1e3), wall > 0 ? cpu / wall : 0.0);
    free(t);
    free(tmp);
    free(step);
    free(row);
    mgt_optim_free(&opt, &be);
    mgt_model_free(&m);
    mgt_backend_destroy(&be);
    mgt_runtime_finalize(&rt);
    return 0;
}
