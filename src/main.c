/* main.c: the command line. Parses flags and hands over to the trainer; no logic of its own.
 *
 *   mgtrain [train] [flags]     mgtrain eval|predict|summary [flags]     mgtrain plot RUN_DIR
 *
 * MPI starts first so a bad flag ends every rank of the job the same way. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"
#include "parse.h"
#include "plot.h"
#include "runtime.h"
#include "trainer.h"

enum { C_TRAIN = 1, C_EVAL = 2, C_PREDICT = 4, C_SUMMARY = 8, C_ALL = 15 };

typedef struct flag {
    const char *name;
    const char *arg; /* NULL: no value */
    int commands;
    const char *def;
    const char *help;
} flag;

static const flag flags[] = {
    {"model", "FILE", C_ALL, "the built-in MLP (examples/mlp.cfg)", "model file (INI)"},
    {"data", "DIR|synthetic", C_TRAIN | C_EVAL | C_PREDICT, MGT_DEFAULT_DATA,
     "folder of IDX files (train-*, t10k-*), or synthetic data"},
    {"epochs", "N", C_TRAIN, "[train] epochs", "epochs to train"},
    {"batch-size", "N", C_ALL, "[train] batch_size", "GLOBAL batch, split over the ranks"},
    {"optimizer", "NAME", C_TRAIN, "[train] optimizer", NULL /* the names, from optim.c */},
    {"lr", "X", C_TRAIN, "[train] learning_rate", "learning rate"},
    {"seed", "N", C_TRAIN, "[train] seed", "seed of initialisation, shuffling and dropout"},
    {"max-steps", "N", C_TRAIN, "0 (no limit)", "stop after N optimizer steps in all"},
    {"out", "DIR", C_TRAIN, "runs/<model name>", "where weights, checkpoint and metrics go"},
    {"init-weights", "FILE", C_TRAIN, "none (random)", "start from these weights (names and "
                                                       "shapes checked)"},
    {"val-split", "F", C_TRAIN, "none (validate on t10k)", "hold out the last fraction F of the "
                                                          "training data for validation"},
    {"no-validation", NULL, C_TRAIN, "off", "train only: skip validation and the final test "
                                            "evaluation (benchmarks)"},
    {"save-every", "N", C_TRAIN, "0 (epoch ends only)", "also checkpoint every N steps"},
    {"resume", NULL, C_TRAIN, "off", "continue from OUT/checkpoint.safetensors (any rank count)"},
    {"profile", NULL, C_TRAIN, "off", "print per-rank mean/p95 ms of each step phase"},
    {"no-tensorboard", NULL, C_TRAIN, "off (written)",
     "write no TensorBoard event files to OUT/tb"},
    {"timeline", "FILE", C_TRAIN, "none", "write a Chrome-trace JSON of every step phase"},
    {"verbose", "0|1|2", C_TRAIN, "1 on a terminal, 2 otherwise", "0 quiet, 1 progress bar, 2 "
                                                                  "epoch lines"},
    {"device", "cpu|gpu|auto", C_TRAIN | C_EVAL | C_PREDICT, "auto", "compute backend"},
    {"gpus", "LIST", C_TRAIN | C_EVAL | C_PREDICT, "local rank i -> GPU i",
     "GPU ids by local rank, e.g. 0,2,3"},
    {"tf32", NULL, C_TRAIN | C_EVAL | C_PREDICT, "off (fp32)", "let cuDNN and cuBLAS use TF32"},
    {"conv-algo", "auto|direct|winograd", C_TRAIN | C_EVAL | C_PREDICT, "[conv2d] algo (auto)",
     "convolution algorithm of every conv2d layer: direct never uses Winograd (exact zeros stay "
     "zero, as in PyTorch), winograd where a layer is 3x3 stride 1"},
    {"transport", "auto|nccl|mpi", C_TRAIN, "auto (nccl for GPUs, when ranks > 1)",
     "gradient all-reduce; nccl also runs it for one rank (to time it), mpi on GPUs copies "
     "through host memory"},
    {"device-data", "auto|off", C_TRAIN, "auto", "GPUs: keep a training set of up to 1 GiB on "
     "each GPU and gather batches there; off: gather on the host and copy each batch"},
    {"comm-timeout", "SECONDS", C_TRAIN | C_EVAL | C_PREDICT, "300",
     "end the job if a collective waits longer (a peer died)"},
    {"debug-check", "K", C_TRAIN, "0 (off)", "compare weight checksums across ranks every K "
                                             "steps"},
    {"synthetic-samples", "N", C_TRAIN, "60000", "training samples of --data synthetic"},
    {"reproducible", NULL, C_TRAIN, "off",
     "the same weights, bit for bit, on any number of ranks: exact sums of fixed chunks of the "
     "batch (for debugging scale-out, audited runs, CI baselines; slower, CPU only)"},
    {"repro-chunk", "N", C_TRAIN, "8",
     "--reproducible's chunk in samples: larger is faster, but no more ranks than chunks do work"},
    {"weights", "FILE", C_EVAL | C_PREDICT, "none (required)", "weights.safetensors to use"},
    {"split", "train|test", C_EVAL | C_PREDICT, "test", "which split of --data"},
    {"output", "FILE", C_PREDICT, "none (required)", "where predict writes its .npy"},
    {"help", NULL, C_ALL, "", "show this help"},
};
enum { NFLAGS = sizeof flags / sizeof flags[0] };

static const char *commands[] = {"train", "eval", "predict", "summary", "plot", "help"};

static int command_bit(const char *cmd) {
    return !strcmp(cmd, "train") ? C_TRAIN : !strcmp(cmd, "eval") ? C_EVAL
         : !strcmp(cmd, "predict") ? C_PREDICT : C_SUMMARY;
}

static void usage(const char *cmd) {
    int bit = cmd ? command_bit(cmd) : C_TRAIN;
    if (!cmd) {
        printf("mgtrain %s: data-parallel neural-network training, one MPI rank per device\n\n"
               "usage: mpirun -np N mgtrain [COMMAND] [FLAGS]\n\n"
               "commands:\n"
               "  train     train a model (the default; with no arguments at all: the built-in\n"
               "            MLP on Fashion-MNIST for one epoch)\n"
               "  eval      loss and accuracy of saved weights on a dataset split\n"
               "  predict   write the last layer's outputs for a split to a .npy file\n"
               "  summary   print the model's layer table\n"
               "  plot      mgtrain plot RUN_DIR: draw RUN_DIR/curves.png from metrics.csv\n\n"
               "flags of train (see 'mgtrain COMMAND --help' for the others):\n",
               MGT_VERSION);
    } else {
        printf("usage: mgtrain %s [FLAGS]\n\nflags:\n", cmd);
    }
    for (int i = 0; i < NFLAGS; i++) {
        if (!(flags[i].commands & bit))
            continue;
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", flags[i].name, flags[i].arg ? " " : "",
                 flags[i].arg ? flags[i].arg : "");
        char names[128];
        printf("  %-30s %s", left,
               flags[i].help ? flags[i].help : mgt_opt_names(names, sizeof names));
        if (flags[i].def[0])
            printf(" (default: %s)", flags[i].def);
        printf("\n");
    }
}

/* The flag the user most likely meant, for "unknown flag" messages. */
static const char *suggest(const char *given, int bit) {
    const char *names[NFLAGS];
    int n = 0;
    for (int i = 0; i < NFLAGS; i++)
        if (flags[i].commands & bit)
            names[n++] = flags[i].name;
    return mgt_nearest(given, names, n);
}

static int64_t need_i64(const char *flag_name, const char *v, int64_t min) {
    int64_t x;
    if (mgt_parse_i64(v, &x) < 0 || x < min)
        mgt_die_all("--%s %s: expected a whole number of at least %lld", flag_name, v,
                    (long long)min);
    return x;
}

static double need_double(const char *flag_name, const char *v, double min, double max) {
    float x;
    if (mgt_parse_float(v, &x) < 0 || x < min || x > max)
        mgt_die_all("--%s %s: expected a number from %g to %g", flag_name, v, min, max);
    return x;
}

int main(int argc, char **argv) {
    mgt_runtime rt;
    mgt_runtime_init(&rt, &argc, &argv);
    mgt_options o;
    mgt_options_defaults(&o);

    int first = 1, chunk_given = 0;
    if (argc > 1 && argv[1][0] != '-') {
        int known = 0;
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            known |= !strcmp(argv[1], commands[i]);
        if (!known) {
            const char *near = mgt_nearest(argv[1], commands, 6);
            mgt_die_all("unknown command '%s'%s%s%s; commands are train, eval, predict, "
                        "summary, plot (see mgtrain --help)", argv[1],
                        near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
        }
        o.command = argv[1];
        first = 2;
    }
    if (!strcmp(o.command, "help")) {
        if (rt.rank == 0)
            usage(argc > 2 ? argv[2] : NULL);
        mgt_runtime_finalize(&rt);
        return 0;
    }
    if (!strcmp(o.command, "plot")) {
        int rc = 0;
        if (argc == 3 && !strcmp(argv[2], "--help")) {
            if (rt.rank == 0)
                printf("usage: mgtrain plot RUN_DIR\n\nwrites RUN_DIR/curves.png (loss and "
                       "accuracy, train and validation, per epoch) from RUN_DIR/metrics.csv "
                       "with gnuplot\n");
        } else if (argc != 3) {
            mgt_die_all("usage: mgtrain plot RUN_DIR (the --out folder of a training run)");
        } else if (rt.rank == 0) {
            mgt_err e;
            if (mgt_plot(argv[2], &e) < 0)
                mgt_die("%s", e.msg);
        }
        mgt_runtime_finalize(&rt);
        return rc;
    }
    int bit = command_bit(o.command);

    /* Flags must be spelled out: getopt_long would take "--epoch" for "--epochs", and a typo
     * that happens to be a prefix would silently mean something. */
    for (int i = first; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) || !argv[i][2])
            continue;
        char name[64];
        snprintf(name, sizeof name, "%s", argv[i] + 2);
        char *eq = strchr(name, '=');
        if (eq)
            *eq = 0;
        int known = 0;
        for (int k = 0; k < NFLAGS && !known; k++)
            known = !strcmp(flags[k].name, name);
        if (!known) {
            const char *near = suggest(name, bit);
            mgt_die_all("unknown flag --%s for mgtrain %s%s%s%s (see mgtrain %s --help)", name,
                        o.command, near ? "; did you mean --" : "", near ? near : "",
                        near ? "?" : "", o.command);
        }
        for (int k = 0; k < NFLAGS; k++)
            if (!strcmp(flags[k].name, name) && flags[k].arg && !eq)
                i++; /* skip the flag's value */
    }

    struct option lopts[NFLAGS + 1];
    for (int i = 0; i < NFLAGS; i++)
        lopts[i] = (struct option){flags[i].name, flags[i].arg ? required_argument : no_argument,
                                   NULL, 1000 + i};
    lopts[NFLAGS] = (struct option){0, 0, 0, 0};
    opterr = 0;
    optind = first;
    int c, li;
    while ((c = getopt_long(argc, argv, ":", lopts, &li)) != -1) {
        if (c == '?' || c == ':') {
            const char *bad = argv[optind - 1];
            if (c == ':')
                mgt_die_all("%s needs a value (see mgtrain %s --help)", bad, o.command);
            char name[64];
            snprintf(name, sizeof name, "%s", bad[0] == '-' && bad[1] == '-' ? bad + 2 : bad);
            char *eq = strchr(name, '=');
            if (eq)
                *eq = 0;
            const char *near = suggest(name, bit);
            mgt_die_all("unknown flag %s for mgtrain %s%s%s%s (see mgtrain %s --help)", bad,
                        o.command, near ? "; did you mean --" : "", near ? near : "",
                        near ? "?" : "", o.command);
        }
        const flag *f = &flags[c - 1000];
        if (!(f->commands & bit))
            mgt_die_all("--%s does not apply to mgtrain %s (see mgtrain %s --help)", f->name,
                        o.command, o.command);
        const char *v = optarg;
        const char *n = f->name;
        if (!strcmp(n, "help")) {
            if (rt.rank == 0)
                usage(first == 2 ? o.command : NULL);
            mgt_runtime_finalize(&rt);
            return 0;
        }
        if (!strcmp(n, "model")) o.model = v;
        else if (!strcmp(n, "data")) o.data = v;
        else if (!strcmp(n, "epochs")) o.epochs = v;
        else if (!strcmp(n, "batch-size")) o.batch_size = v;
        else if (!strcmp(n, "optimizer")) o.optimizer = v;
        else if (!strcmp(n, "lr")) o.lr = v;
        else if (!strcmp(n, "seed")) o.seed = v;
        else if (!strcmp(n, "max-steps")) o.max_steps = need_i64(n, v, 0);
        else if (!strcmp(n, "out")) o.out = v;
        else if (!strcmp(n, "init-weights")) o.init_weights = v;
        else if (!strcmp(n, "val-split")) o.val_split = need_double(n, v, 1e-6, 0.999);
        else if (!strcmp(n, "save-every")) o.save_every = need_i64(n, v, 0);
        else if (!strcmp(n, "resume")) o.resume = 1;
        else if (!strcmp(n, "no-validation")) o.no_validation = 1;
        else if (!strcmp(n, "profile")) o.profile = 1;
        else if (!strcmp(n, "no-tensorboard")) o.no_tensorboard = 1;
        else if (!strcmp(n, "timeline")) o.timeline = v;
        else if (!strcmp(n, "verbose")) o.verbose = (int)need_i64(n, v, 0);
        else if (!strcmp(n, "device")) o.device = v;
        else if (!strcmp(n, "gpus")) o.gpus = v;
        else if (!strcmp(n, "tf32")) o.tf32 = 1;
        else if (!strcmp(n, "conv-algo")) o.conv_algo = v;
        else if (!strcmp(n, "transport")) o.transport = v;
        else if (!strcmp(n, "device-data")) {
            if (strcmp(v, "auto") && strcmp(v, "off"))
                mgt_die_all("--device-data %s: use auto or off", v);
            o.device_data = !strcmp(v, "auto");
        }
        else if (!strcmp(n, "comm-timeout")) o.comm_timeout = need_double(n, v, 1, 1e7);
        else if (!strcmp(n, "debug-check")) o.debug_check = need_i64(n, v, 0);
        else if (!strcmp(n, "synthetic-samples")) o.synthetic_samples = need_i64(n, v, 1);
        else if (!strcmp(n, "reproducible")) o.reproducible = 1;
        else if (!strcmp(n, "repro-chunk")) o.repro_chunk = need_i64(n, v, 1), chunk_given = 1;
        else if (!strcmp(n, "weights")) o.weights = v;
        else if (!strcmp(n, "split")) o.split = v;
        else if (!strcmp(n, "output")) o.output = v;
    }
    if (o.verbose > 2)
        mgt_die_all("--verbose %d: use 0 (quiet), 1 (progress bar) or 2 (epoch lines)", o.verbose);
    if (optind < argc)
        mgt_die_all("unexpected argument '%s' (flags start with --; see mgtrain %s --help)",
                    argv[optind], o.command);
    if (chunk_given && !o.reproducible)
        mgt_die_all("--repro-chunk sets --reproducible's chunk; add --reproducible, or drop "
                    "--repro-chunk");
    if (o.resume && o.init_weights)
        mgt_die_all("--resume and --init-weights exclude each other: a resumed run takes its "
                    "weights from the checkpoint");

    int rc;
    switch (bit) {
    case C_EVAL: rc = mgt_cmd_eval(&rt, &o); break;
    case C_PREDICT: rc = mgt_cmd_predict(&rt, &o); break;
    case C_SUMMARY: rc = mgt_cmd_summary(&rt, &o); break;
    default: rc = mgt_cmd_train(&rt, &o); break;
    }
    mgt_runtime_finalize(&rt);
    return rc;
}
