/* cli.c: the flag table, the help text and the parser (cli.h).
 *
 * Flags must be spelled out: getopt_long alone would take "--epoch" for "--epochs", so a typo
 * that happens to be a prefix would silently mean something. A first pass over argv therefore
 * names every "--flag" that is not in the table, and every single-dash word other than -h
 * (mgtrain takes no short flags), before getopt_long reads the values. Values are checked here
 * when the check needs nothing but the string; [train] overrides are checked with the model
 * file's keys, and the values that name a choice (--device, --transport, --split, ...) are
 * resolved, when the command's plan is made (run_plan.c). */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "optim.h"
#include "parse.h"
#include "splits.h" /* MGT_DEFAULT_DATA, for the help text */

/* C_ALL: the commands that run a model; convert has flags of its own, export some of both. */
enum {
    C_TRAIN = 1,
    C_EVAL = 2,
    C_PREDICT = 4,
    C_SUMMARY = 8,
    C_ALL = 15,
    C_CONVERT = 16,
    C_EXPORT = 32,
    C_GENERATE = 64
};

typedef struct flag {
    const char *name;
    const char *arg; /* NULL: no value */
    int commands;
    const char *def;
    const char *help;
} flag;

/* One row per flag, kept as written (clang-format would re-wrap the rows). */
/* clang-format off */
static const flag flags[] = {
    {"model", "FILE", C_ALL | C_EXPORT | C_GENERATE, "the built-in MLP (examples/mlp.cfg)", "model file (INI)"},
    {"data", "DIR|synthetic", C_TRAIN | C_EVAL | C_PREDICT, MGT_DEFAULT_DATA,
     "folder of IDX files (train-*, t10k-*, plain or .gz), of .npy files (train_x.npy, "
     "train_y.npy, test_x.npy, test_y.npy), an image set (mgtrain convert) or token shards "
     "(*train*.bin, *val*.bin: a language model's), or synthetic data"},
    {"epochs", "N", C_TRAIN, "[train] epochs", "epochs to train"},
    {"batch-size", "N", C_ALL, "[train] batch_size", "GLOBAL batch, split over the ranks"},
    {"optimizer", "NAME", C_TRAIN, "[train] optimizer", NULL /* the names, from optim.c */},
    {"lr", "X", C_TRAIN, "[train] learning_rate", "learning rate"},
    {"seed", "N", C_TRAIN | C_GENERATE, "[train] seed", "seed of initialisation, shuffling and dropout (generate: of sampling)"},
    {"lr-schedule", "NAME", C_TRAIN, "[train] lr_schedule (constant)",
     "learning-rate schedule: constant, step, cosine, exponential or plateau"},
    {"warmup-steps", "N", C_TRAIN, "[train] warmup_steps (0)",
     "linear learning-rate warm-up over the first N steps"},
    {"warmup-epochs", "E", C_TRAIN, "[train] warmup_epochs (0)",
     "linear learning-rate warm-up over the first E epochs"},
    {"clip-norm", "X", C_TRAIN, "[train] clip_norm (0: off)",
     "clip the mean gradient's global L2 norm to X"},
    {"clip-value", "X", C_TRAIN, "[train] clip_value (0: off)",
     "clip each mean-gradient element to [-X, X]"},
    {"label-smoothing", "S", C_TRAIN, "[train] label_smoothing (0)",
     "cross-entropy against (1 - S) * target + S / classes (binary: + S / 2)"},
    {"class-weight", "W,...", C_TRAIN, "[train] class_weight (none)",
     "weigh each sample's loss by its class's weight, one a class in class order "
     "(binary_crossentropy: the negative's and the positive's, e.g. 1,5), as Keras' class_weight"},
    {"early-stop", "PATIENCE", C_TRAIN, "[train] early_stop_patience (0: off)",
     "stop when [train] monitor (val_loss) has not improved for PATIENCE epochs"},
    {"log-every", "N", C_TRAIN, "0 (epoch rows only)",
     "also write a metrics row (step, loss, acc, lr, samples/s) every N steps to "
     "OUT/metrics_steps.jsonl/.csv and TensorBoard"},
    {"max-steps", "N", C_TRAIN, "0 (no limit)", "stop after N optimizer steps in all"},
    {"freeze", "PATTERNS", C_TRAIN | C_SUMMARY, "[train] freeze (none)",
     "freeze the layers whose names match these comma-separated glob patterns ('!' exempts: "
     "'*,!fc' freezes all but fc): their weights do not move and get no gradient, a batchnorm "
     "uses its moving statistics"},
    {"out", "DIR", C_TRAIN, "runs/<model name>", "where weights, checkpoint and metrics go"},
    {"init-weights", "FILE", C_TRAIN, "none (random)",
     "start from these weights (safetensors: mgtrain's, PyTorch's, torchvision's, timm's); every "
     "tensor of the model must match one of FILE by name and shape, and every tensor of FILE be "
     "used, unless --init-partial"},
    {"init-partial", NULL, C_TRAIN, "off (all must match)",
     "with --init-weights: the model's tensors that FILE does not match (a new head) keep their "
     "initial values, and FILE's tensors that match none are left unused; a table says which"},
    {"name-map", "FILE", C_TRAIN | C_EVAL | C_PREDICT | C_EXPORT, "none (names as they are)",
     "rename the tensors of --init-weights or --weights as FILE says, one 'FROM TO' a line ('*' "
     "matches any run of characters, TO - drops): examples/*.map map torchvision's and timm's "
     "names to the model files beside them"},
    {"val-split", "F", C_TRAIN, "none (validate on t10k)", "hold out the last fraction F of the "
                                                          "training data for validation (an "
                                                          "image set: F of every class, chosen "
                                                          "by --seed)"},
    {"no-validation", NULL, C_TRAIN, "off", "train only: skip validation and the final test "
                                            "evaluation (benchmarks)"},
    {"save-every", "N", C_TRAIN, "0 (epoch ends only)", "also checkpoint every N steps"},
    {"resume", NULL, C_TRAIN, "off", "continue the run in OUT from its checkpoint, with the "
                                     "settings it was started with (any rank count); --resume "
                                     "auto: resume if there is one, else start"},
    {"overwrite", NULL, C_TRAIN | C_PREDICT, "off (refused)",
     "train into a folder that holds another run, removing its files first; replace an "
     "existing --timeline or --output file"},
    {"keep-checkpoints", "K", C_TRAIN, "1", "keep the last K checkpoints (the older ones as "
                                            "OUT/checkpoint-<step>.safetensors)"},
    {"profile", NULL, C_TRAIN, "off", "print per-rank mean/p95 ms of each step phase"},
    {"profile-layers", NULL, C_TRAIN, "off",
     "--profile, and on a GPU a table per layer and direction: device time, cuDNN algorithm, "
     "achieved GB/s and TFLOP/s against the layer's bytes and FLOPs"},
    {"floor", NULL, C_SUMMARY, "off",
     "each layer's FLOPs and bytes, and the least time they take on an H100 (with --precision "
     "and --tf32)"},
    {"no-tensorboard", NULL, C_TRAIN, "off (written)",
     "write no TensorBoard event files to OUT/tb"},
    {"timeline", "FILE", C_TRAIN, "none", "write a Chrome-trace JSON of every step phase"},
    {"verbose", "0|1|2", C_TRAIN | C_CONVERT, "1 on a terminal, 2 otherwise",
     "0 nothing but errors, 1 progress bar, 2 epoch lines (convert: a line every 10%)"},
    {"device", "cpu|gpu|auto", C_TRAIN | C_EVAL | C_PREDICT, "auto", "compute backend"},
    {"gpus", "LIST", C_TRAIN | C_EVAL | C_PREDICT, "local rank i -> GPU i",
     "GPU ids by local rank, e.g. 0,2,3"},
    {"share-gpu", NULL, C_TRAIN, "off (one rank per GPU)",
     "FOR TESTS ONLY: let ranks share GPUs (local rank i -> GPU i mod their count) through "
     "NCCL's route for it (NCCL_MULTI_RANK_GPU_ENABLE from 2.30, else a host id per rank and "
     "sockets); slower than one rank per GPU, to check multi-rank training on fewer GPUs"},
    {"tf32", NULL, C_ALL, "off (fp32)", "let cuDNN and cuBLAS use TF32"},
    {"precision", "fp32|bf16", C_ALL, "fp32",
     "GPUs: bf16 = mixed precision: activations stored in bfloat16, dense layers and "
     "convolutions on them with fp32 accumulation; weights, optimizer state and statistics stay "
     "fp32"},
    {"conv-algo", "auto|direct|winograd", C_TRAIN | C_EVAL | C_PREDICT, "[conv2d] algo (auto)",
     "convolution algorithm of every conv2d layer: direct never uses Winograd (exact zeros stay "
     "zero, as in PyTorch), winograd where a layer is 3x3 stride 1"},
    {"algo-cache", "FILE", C_TRAIN | C_EVAL | C_PREDICT, "none (measured each run)",
     "GPUs: take the convolution algorithms an earlier run measured on this GPU and cuDNN from "
     "FILE, and save this run's choices there"},
    {"cuda-graph", "on|off", C_TRAIN, "on",
     "GPUs: once warm, replay each step's forward and backward as CUDA graphs (off: launch every "
     "op each step)"},
    {"input-shape", "H,W,C", C_ALL | C_EXPORT, "[input] shape",
     "build the model for inputs of this shape, e.g. 224,224,3 (every layer's shape follows)"},
    {"transport", "auto|nccl|mpi|shm", C_TRAIN, "auto (nccl for GPUs, when ranks > 1)",
     "gradient all-reduce; shm: CPU ranks of one node sum straight from each other's memory; "
     "nccl and shm also run for one rank (to time them); mpi on GPUs copies through host "
     "memory"},
    {"device-data", "auto|off", C_TRAIN, "auto", "GPUs: keep a training set of up to 1 GiB on "
     "each GPU and gather batches there; off: gather on the host and copy each batch"},
    {"comm-timeout", "SECONDS", C_TRAIN | C_EVAL | C_PREDICT, "300",
     "end the job if a collective waits longer (a peer died)"},
    {"debug-check", "K", C_TRAIN, "0 (off)", "compare weight checksums across ranks every K "
                                             "steps"},
    {"accum-steps", "K", C_TRAIN, "[train] accum_steps (1)",
     "gradient accumulation: K micro-batches of --batch-size per optimizer step"},
    {"bucket-mb", "X", C_TRAIN, "GPU 25, CPU 0.25 (the first bucket 1)",
     "gradients travel in buckets of up to X MiB while backward runs; 0: one all-reduce after "
     "backward"},
    {"zero", "0|1", C_TRAIN, "0", "1: ZeRO stage 1, each rank keeps the optimizer state of its "
                                  "1/N of the parameters"},
    {"comm-progress", "test|thread", C_TRAIN, "test",
     "CPU: how the gradient buckets progress during backward: tests between layers, or a thread"},
    {"synthetic-samples", "N", C_TRAIN, "60000", "training samples of --data synthetic"},
    {"reproducible", NULL, C_TRAIN, "[train] reproducible (off)",
     "the same weights, bit for bit, on any number of ranks: exact sums over fixed chunks of the "
     "batch (debugging scale-out, audited runs, CI baselines; slower, CPU only)"},
    {"repro-chunk", "N", C_TRAIN, "[train] repro_chunk (8)",
     "--reproducible's chunk in samples: larger is faster, but no more ranks than chunks do work"},
    {"weights", "FILE", C_EVAL | C_PREDICT | C_EXPORT | C_GENERATE, "none (required)",
     "weights.safetensors to use"},
    {"run", "DIR", C_EVAL | C_PREDICT | C_EXPORT | C_GENERATE, "none", "a training run's --out folder: its model file "
                                              "copy and weights.safetensors"},
    {"split", "train|test", C_EVAL | C_PREDICT | C_CONVERT, "test (convert: train)",
     "which split of --data; convert: the split DST gets (a test or validation tree: test)"},
    {"loader-threads", "N", C_TRAIN | C_EVAL | C_PREDICT,
     "GPU: the rank's cores but one; CPU: 1",
     "threads per rank that crop and resize an image set's samples (mgtrain convert) a few "
     "batches ahead"},
    {"size", "N", C_CONVERT, "256",
     "convert: the stored resolution: each whole picture with its short side resized to N "
     "where it is longer (torchvision's Resize(N)), or with --square its centre N x N; train "
     "at a smaller input (e.g. 224 of 256)"},
    {"square", NULL, C_CONVERT, "off (the whole picture)",
     "convert: store each image's centre N x N only (Resize(N) then CenterCrop(N)): less disk, "
     "but training's crops see only that square"},
    {"threads", "N", C_CONVERT, "every core this process may use",
     "convert: decoding threads (the output is the same bytes for any N)"},
    {"shard-size", "N", C_CONVERT, "about 256 MiB of images",
     "convert: images per shard file (a stopped conversion redoes at most its unfinished "
     "shards)"},
    {"skip-bad", NULL, C_CONVERT, "off (stop at the first)",
     "convert: leave out files that are not readable JPEG or PNG images, and list them in "
     "DST/SPLIT_skipped.txt"},
    {"text", NULL, C_CONVERT, "off (images)",
     "convert: SRC is a text file or a folder of them; DST gets byte-level token shards "
     "(train.bin, val.bin; vocab 256) for a language model"},
    {"val-fraction", "F", C_CONVERT, "0.1",
     "convert --text: the last fraction of each file that goes to val.bin"},
    {"output", "FILE", C_PREDICT | C_EXPORT, "none (required)",
     "where predict writes its .npy, export its model file"},
    {"format", "onnx", C_EXPORT, "onnx", "export: the file format (ONNX, opset 21, dynamic batch)"},
    {"batchnorm", "fold|keep", C_EXPORT, "fold",
     "export: fold each batchnorm into the convolution before it where it can, or keep every "
     "one a BatchNormalization node"},
    {"prompt", "TEXT", C_GENERATE, "none (required)",
     "generate: the text to continue (a byte-level model), or token ids separated by spaces"},
    {"max-new-tokens", "N", C_GENERATE, "256", "generate: the tokens to sample after the prompt"},
    {"temperature", "T", C_GENERATE, "1", "generate: the logits are divided by T before the "
                                          "softmax; 0: the most likely token every step"},
    {"top-k", "K", C_GENERATE, "0 (every token)", "generate: sample among the K most likely tokens"},
    {"help", NULL, C_ALL | C_CONVERT | C_EXPORT | C_GENERATE, "", "show this help (also -h)"},
    {"version", NULL, C_ALL | C_CONVERT | C_EXPORT | C_GENERATE, "", "print the version and the backends built in"},
};
/* clang-format on */
enum { NFLAGS = sizeof flags / sizeof flags[0] };

/* Flags that set a [train] key: the plan checks their values as the model file's. */
static const struct {
    const char *flag, *key;
} key_flags[] = {{"lr-schedule", "lr_schedule"},        {"warmup-steps", "warmup_steps"},
                 {"warmup-epochs", "warmup_epochs"},    {"clip-norm", "clip_norm"},
                 {"clip-value", "clip_value"},          {"label-smoothing", "label_smoothing"},
                 {"early-stop", "early_stop_patience"}, {"reproducible", "reproducible"},
                 {"repro-chunk", "repro_chunk"},        {"freeze", "freeze"},
                 {"class-weight", "class_weight"}};

static const char *key_of_flag(const char *name) {
    for (size_t i = 0; i < sizeof key_flags / sizeof key_flags[0]; i++)
        if (!strcmp(key_flags[i].flag, name))
            return key_flags[i].key;
    return NULL;
}

/* Flags whose value is a path: never empty, never longer than MGT_CLI_MAX_PATH. */
static const char *const path_flags[] = {"model",   "data",   "out", "init-weights", "timeline",
                                         "weights", "output", "run", "algo-cache",   "name-map"};
enum { NPATH_FLAGS = sizeof path_flags / sizeof path_flags[0] };
static int is_path_flag(const char *name);

static const char *const commands[] = {"train",   "eval",   "predict",  "summary", "plot",
                                       "convert", "export", "generate", "help"};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

/* "train, eval, ..., generate": the commands a message lists (help, the last, aside). */
static const char *command_list(void) {
    static char list[128];
    if (!list[0])
        for (int i = 0; i < NCOMMANDS - 1; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     commands[i]);
    return list;
}

static int command_bit(const char *cmd) {
    return !strcmp(cmd, "train")     ? C_TRAIN
           : !strcmp(cmd, "eval")    ? C_EVAL
           : !strcmp(cmd, "predict") ? C_PREDICT
           : !strcmp(cmd, "convert") ? C_CONVERT
           : !strcmp(cmd, "export")  ? C_EXPORT
           : !strcmp(cmd, "generate") ? C_GENERATE
                                     : C_SUMMARY;
}

static int is_command(const char *s) {
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(s, commands[i]))
            return 1;
    return 0;
}

int mgt_cli_flag(const char *name, const char **def, int *takes_value, int *is_path) {
    const flag *f = NULL;
    for (int i = 0; i < NFLAGS && !f; i++)
        if (!strcmp(flags[i].name, name))
            f = &flags[i];
    if (!f)
        return -1;
    if (def)
        *def = f->def;
    if (takes_value)
        *takes_value = f->arg != NULL;
    if (is_path)
        *is_path = is_path_flag(name);
    return 0;
}

void mgt_cli_usage(FILE *f, const char *cmd) {
    if (cmd && !strcmp(cmd, "plot")) {
        fprintf(f, "usage: mgtrain plot RUN_DIR\n\nwrites RUN_DIR/curves.png (loss and accuracy, "
                   "train and validation, per epoch, and the learning rate; per step too where "
                   "the run logged steps with --log-every) from RUN_DIR/metrics.csv and "
                   "metrics_steps.csv with gnuplot\n");
        return;
    }
    if (cmd && (!strcmp(cmd, "help") || !is_command(cmd)))
        cmd = NULL;
    int bit = cmd ? command_bit(cmd) : C_TRAIN;
    if (!cmd) {
        fprintf(f,
                "mgtrain %s: data-parallel neural-network training, one MPI rank per device\n\n"
                "usage: mpirun -np N mgtrain [COMMAND] [FLAGS]\n\n"
                "commands:\n"
                "  train     train a model (the default; with no arguments at all: the built-in\n"
                "            MLP on Fashion-MNIST for one epoch)\n"
                "  eval      loss and accuracy of saved weights on a dataset split\n"
                "  predict   write the last layer's outputs for a split to a .npy file\n"
                "  summary   print the model's layer table\n"
                "  plot      mgtrain plot RUN_DIR: draw RUN_DIR/curves.png from metrics.csv\n"
                "  convert   mgtrain convert SRC DST: a folder of JPEG/PNG images, one folder per\n"
                "            class, into an image set that --data DST trains on\n"
                "  export    write a trained model as an ONNX file (--run DIR --output FILE)\n"
                "  generate  text sampled from a trained language model (--run DIR --prompt TEXT)\n\n"
                "flags of train (see 'mgtrain COMMAND --help' for the others):\n",
                MGT_VERSION);
    } else if (bit == C_CONVERT) {
        fprintf(
            f, "usage: mgtrain convert SRC DST [FLAGS]\n\n"
               "SRC holds one folder per class (SRC/cat/1.jpg, SRC/dog/2.png, ...: Keras'\n"
               "flow_from_directory, torchvision's ImageFolder); classes are numbered in sorted\n"
               "order, DST/classes.txt lists them. Every JPEG and PNG image is decoded, its short\n"
               "side resized to --size and its centre kept, and stored in DST as shards of uint8\n"
               "arrays (SPLIT-NNNNN_x.npy, labels SPLIT-NNNNN_y.npy) with a manifest\n"
               "(images.json). Running the same command again finishes a stopped conversion.\n\n"
               "flags:\n");
    } else {
        fprintf(f, "usage: mgtrain %s [FLAGS]\n\nflags:\n", cmd);
    }
    for (int i = 0; i < NFLAGS; i++) {
        if (!(flags[i].commands & bit))
            continue;
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", flags[i].name, flags[i].arg ? " " : "",
                 flags[i].arg ? flags[i].arg : "");
        char names[128];
        fprintf(f, "  %-30s %s", left,
                flags[i].help ? flags[i].help : mgt_opt_names(names, sizeof names));
        if (flags[i].def[0])
            fprintf(f, " (default: %s)", flags[i].def);
        fprintf(f, "\n");
    }
}

static const flag *find_flag(const char *name, size_t len) {
    for (int i = 0; i < NFLAGS; i++)
        if (strlen(flags[i].name) == len && !strncmp(flags[i].name, name, len))
            return &flags[i];
    return NULL;
}

/* Other trainers' names for flags mgtrain has (Keras' fit arguments, PyTorch's and Hugging Face's
 * example scripts, Horovod's): no typo of the name, so no edit distance finds it. */
static const struct {
    const char *other, *ours;
} flag_synonyms[] = {
    {"learning-rate", "lr"},
    {"num-epochs", "epochs"},
    {"n-epochs", "epochs"},
    {"validation-split", "val-split"},
    {"output-dir", "out"},
    {"log-dir", "out"},
    {"checkpoint-dir", "out"},
    {"resume-from-checkpoint", "resume"},
    {"grad-accum", "accum-steps"},
    {"gradient-accumulation-steps", "accum-steps"},
    {"clip-grad-norm", "clip-norm"},
    {"max-grad-norm", "clip-norm"},
    {"mixed-precision", "precision"},
    {"amp", "precision"},
};

/* "unknown flag --x for mgtrain CMD; did you mean --y? (see ...)", for `len` bytes of `name`. */
static int unknown_flag(const char *shown, const char *name, size_t len, const char *cmd,
                        mgt_err *err) {
    const char *cands[NFLAGS];
    int n = 0, bit = command_bit(cmd);
    for (int i = 0; i < NFLAGS; i++)
        if (flags[i].commands & bit)
            cands[n++] = flags[i].name;
    char given[64];
    const char *near = NULL;
    if (len < sizeof given) { /* longer names are no typo of a short one */
        memcpy(given, name, len);
        given[len] = 0;
        for (char *c = given; *c; c++) /* Python's spelling: --batch_size, --learning_rate */
            if (*c == '_')
                *c = '-';
        for (size_t k = 0; !near && k < sizeof flag_synonyms / sizeof flag_synonyms[0]; k++)
            if (!strcasecmp(given, flag_synonyms[k].other))
                for (int i = 0; i < n; i++)
                    if (!strcmp(cands[i], flag_synonyms[k].ours))
                        near = cands[i];
        if (!near)
            near = mgt_nearest(given, cands, n);
    }
    return mgt_errf(err, "unknown flag %.80s%s for mgtrain %s%s%s%s (see mgtrain %s --help)", shown,
                    strlen(shown) > 80 ? "..." : "", cmd, near ? "; did you mean --" : "",
                    near ? near : "", near ? "?" : "", cmd);
}

/* The first pass: every word that looks like a flag must be one mgtrain has, spelled out. */
static int check_spelling(int argc, char **argv, int first, const char *cmd, mgt_err *err) {
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--"))
            return 0; /* the rest are operands */
        if (a[0] != '-' || !a[1] || !strcmp(a, "-h"))
            continue;
        if (a[1] != '-') {
            const char *near = NULL;
            if (strlen(a) <= 3) { /* -e, -lr: the long flag it abbreviates, if one is close */
                const char *cands[NFLAGS];
                for (int k = 0; k < NFLAGS; k++)
                    cands[k] = flags[k].name;
                near = mgt_nearest(a + 1, cands, NFLAGS);
            }
            return mgt_errf(err,
                            "unknown flag %.80s for mgtrain %s: flags are spelled out and start "
                            "with --%s%s%s (see mgtrain %s --help)",
                            a, cmd, near ? ", e.g. --" : "", near ? near : "", near ? "" : "", cmd);
        }
        const char *name = a + 2;
        size_t len = strcspn(name, "=");
        const flag *f = find_flag(name, len);
        if (!f)
            return unknown_flag(a, name, len, cmd, err);
        if (!f->arg && name[len])
            return mgt_errf(err,
                            "--%s takes no value, but was given '%.80s' (see mgtrain %s "
                            "--help)",
                            f->name, name + len + 1, cmd);
        if (f->arg && !name[len])
            i++; /* skip the flag's value */
    }
    return 0;
}

static int is_path_flag(const char *name) {
    for (int i = 0; i < NPATH_FLAGS; i++)
        if (!strcmp(path_flags[i], name))
            return 1;
    return 0;
}

static int check_path(const char *what, const char *v, mgt_err *err) {
    size_t n = strlen(v);
    if (n == 0)
        return mgt_errf(err, "%s: the path is empty; name a file or folder", what);
    if (n > MGT_CLI_MAX_PATH)
        return mgt_errf(err,
                        "%s %.40s...: the path has %zu characters, more than the %d mgtrain "
                        "supports; use a shorter path (e.g. a relative one, or a symbolic link)",
                        what, v, n, MGT_CLI_MAX_PATH);
    return 0;
}

static int need_i64(const char *name, const char *v, int64_t min, int64_t *out, mgt_err *err) {
    if (mgt_parse_i64(v, out) < 0 || *out < min)
        return mgt_errf(err, "--%s %.80s: expected a whole number of at least %lld", name, v,
                        (long long)min);
    return 0;
}

static int need_double(const char *name, const char *v, double min, double max, double *out,
                       mgt_err *err) {
    float x;
    if (mgt_parse_float(v, &x) < 0 || x < min || x > max)
        return mgt_errf(err, "--%s %.80s: expected a number from %g to %g", name, v, min, max);
    *out = x;
    return 0;
}

/* --resume's optional value. */
static int resume_mode(const char *v, int *mode, mgt_err *err) {
    if (!strcmp(v, "auto"))
        *mode = MGT_RESUME_AUTO;
    else if (!strcmp(v, "require"))
        *mode = MGT_RESUME_REQUIRE;
    else
        return mgt_errf(err,
                        "--resume %.80s: use --resume (the checkpoint must be there), --resume "
                        "require (the same) or --resume auto (resume if there is one, else start)",
                        v);
    return 0;
}

void mgt_options_defaults(mgt_options *o) {
    memset(o, 0, sizeof *o);
    o->command = "train";
    o->val_split = -1;
    o->verbose = -1;
    o->comm_timeout = 300;
    o->device = "auto";
    o->synthetic_samples = 60000;
    o->device_data = 1;
    o->keep_checkpoints = 1;
    o->bucket_mb = -1;
    o->convert_size = 256;
    o->val_fraction = 0.1;
    o->cuda_graph = 1;
}

/* Stores one flag's value in the options. */
static int take(mgt_options *o, const char *n, const char *v, mgt_err *err) {
    int64_t i64 = 0;
    int rc = 0;
    if (o->ngiven == MGT_MAX_GIVEN_FLAGS)
        return mgt_errf(err, "more than %d flags; put [train] settings in the model file",
                        MGT_MAX_GIVEN_FLAGS);
    o->given[o->ngiven].name = n;
    o->given[o->ngiven++].value = v;
    if (v && is_path_flag(n)) {
        char what[32];
        snprintf(what, sizeof what, "--%s", n);
        if (check_path(what, v, err) < 0)
            return -1;
    }
    if (key_of_flag(n)) {
        if (o->ntrain_keys == (int)(sizeof o->train_keys / sizeof o->train_keys[0]))
            return mgt_errf(err, "too many [train] flags; put some in the model file's [train]");
        o->train_keys[o->ntrain_keys].flag = n;
        o->train_keys[o->ntrain_keys].key = key_of_flag(n);
        o->train_keys[o->ntrain_keys++].value = v ? v : "true"; /* a switch: --reproducible */
        return 0;
    }
    /* clang-format off */
    if (!strcmp(n, "model")) o->model = v;
    else if (!strcmp(n, "data")) o->data = v;
    else if (!strcmp(n, "epochs")) o->epochs = v;
    else if (!strcmp(n, "batch-size")) o->batch_size = v;
    else if (!strcmp(n, "optimizer")) o->optimizer = v;
    else if (!strcmp(n, "lr")) o->lr = v;
    else if (!strcmp(n, "seed")) o->seed = v;
    else if (!strcmp(n, "max-steps")) rc = need_i64(n, v, 0, &o->max_steps, err);
    else if (!strcmp(n, "out")) o->out = v;
    else if (!strcmp(n, "init-weights")) o->init_weights = v;
    else if (!strcmp(n, "init-partial")) o->init_partial = 1;
    else if (!strcmp(n, "name-map")) o->name_map = v;
    else if (!strcmp(n, "val-split")) rc = need_double(n, v, 1e-6, 0.999, &o->val_split, err);
    else if (!strcmp(n, "save-every")) rc = need_i64(n, v, 0, &o->save_every, err);
    else if (!strcmp(n, "resume")) {
        o->resume = MGT_RESUME_REQUIRE;
        if (v)
            rc = resume_mode(v, &o->resume, err);
    }
    else if (!strcmp(n, "no-validation")) o->no_validation = 1;
    else if (!strcmp(n, "overwrite")) o->overwrite = 1;
    else if (!strcmp(n, "keep-checkpoints")) rc = need_i64(n, v, 1, &o->keep_checkpoints, err);
    else if (!strcmp(n, "run")) o->run = v;
    else if (!strcmp(n, "profile")) o->profile = 1;
    else if (!strcmp(n, "profile-layers")) o->profile = o->profile_layers = 1;
    else if (!strcmp(n, "floor")) o->floor = 1;
    else if (!strcmp(n, "algo-cache")) o->algo_cache = v;
    else if (!strcmp(n, "cuda-graph")) {
        if (strcmp(v, "on") && strcmp(v, "off"))
            rc = mgt_errf(err, "--cuda-graph %.80s: use on or off", v);
        o->cuda_graph = !strcmp(v, "on");
    }
    else if (!strcmp(n, "no-tensorboard")) o->no_tensorboard = 1;
    else if (!strcmp(n, "timeline")) o->timeline = v;
    else if (!strcmp(n, "verbose")) {
        if (mgt_parse_int(v, &o->verbose) < 0 || o->verbose < 0 || o->verbose > 2)
            rc = mgt_errf(err, "--verbose %.80s: use 0 (quiet), 1 (progress bar) or 2 (epoch "
                               "lines)", v);
    }
    else if (!strcmp(n, "device")) o->device = v;
    else if (!strcmp(n, "gpus")) o->gpus = v;
    else if (!strcmp(n, "share-gpu")) o->share_gpu = 1;
    else if (!strcmp(n, "tf32")) o->tf32 = 1;
    else if (!strcmp(n, "precision")) {
        if (strcmp(v, "fp32") && strcmp(v, "bf16"))
            rc = mgt_errf(err, "--precision %.80s: use fp32 or bf16", v);
        o->bf16 = !strcmp(v, "bf16");
    }
    else if (!strcmp(n, "conv-algo")) o->conv_algo = v;
    else if (!strcmp(n, "input-shape")) o->input_shape = v;
    else if (!strcmp(n, "transport")) o->transport = v;
    else if (!strcmp(n, "device-data")) {
        if (strcmp(v, "auto") && strcmp(v, "off"))
            rc = mgt_errf(err, "--device-data %.80s: use auto or off", v);
        o->device_data = !strcmp(v, "auto");
    }
    else if (!strcmp(n, "comm-timeout")) rc = need_double(n, v, 1, 1e7, &o->comm_timeout, err);
    else if (!strcmp(n, "debug-check")) rc = need_i64(n, v, 0, &o->debug_check, err);
    else if (!strcmp(n, "log-every")) rc = need_i64(n, v, 0, &o->log_every, err);
    else if (!strcmp(n, "synthetic-samples")) {
        /* Sample indices and counts are int64 everywhere, but one epoch's permutation is held
         * in memory: a billion samples is 8 GB of indices. */
        rc = need_i64(n, v, 1, &i64, err);
        if (!rc && i64 > (int64_t)1 << 30)
            rc = mgt_errf(err, "--synthetic-samples %.80s: at most %lld samples", v,
                          (long long)1 << 30);
        o->synthetic_samples = i64;
    }
    else if (!strcmp(n, "accum-steps")) o->accum_steps = v;
    else if (!strcmp(n, "bucket-mb")) rc = need_double(n, v, 0, 1e6, &o->bucket_mb, err);
    else if (!strcmp(n, "zero")) {
        if (strcmp(v, "0") && strcmp(v, "1"))
            rc = mgt_errf(err, "--zero %.80s: use 1 (ZeRO stage 1: sharded optimizer state) or 0",
                          v);
        o->zero = !strcmp(v, "1");
    }
    else if (!strcmp(n, "comm-progress")) {
        if (strcmp(v, "test") && strcmp(v, "thread"))
            rc = mgt_errf(err, "--comm-progress %.80s: use test or thread", v);
        o->comm_progress = v;
    }
    else if (!strcmp(n, "weights")) o->weights = v;
    else if (!strcmp(n, "split")) {
        if (strcmp(v, "train") && strcmp(v, "test"))
            rc = mgt_errf(err, "--split %.80s: use train or test", v);
        o->split = v;
    }
    else if (!strcmp(n, "loader-threads")) {
        rc = need_i64(n, v, 1, &i64, err);
        if (!rc && i64 > 256)
            rc = mgt_errf(err, "--loader-threads %.80s: at most 256", v);
        o->loader_threads = (int)i64;
    }
    else if (!strcmp(n, "size")) {
        rc = need_i64(n, v, 8, &i64, err);
        if (!rc && i64 > 4096)
            rc = mgt_errf(err, "--size %.80s: at most 4096 pixels", v);
        o->convert_size = (int)i64;
    }
    else if (!strcmp(n, "threads")) {
        rc = need_i64(n, v, 1, &i64, err);
        if (!rc && i64 > 1024)
            rc = mgt_errf(err, "--threads %.80s: at most 1024", v);
        o->convert_threads = (int)i64;
    }
    else if (!strcmp(n, "shard-size")) rc = need_i64(n, v, 1, &o->shard_size, err);
    else if (!strcmp(n, "skip-bad")) o->skip_bad = 1;
    else if (!strcmp(n, "square")) o->convert_square = 1;
    else if (!strcmp(n, "text")) o->convert_text = 1;
    else if (!strcmp(n, "prompt")) o->prompt = v;
    else if (!strcmp(n, "max-new-tokens")) rc = need_i64(n, v, 1, &o->max_new_tokens, err);
    else if (!strcmp(n, "temperature")) rc = need_double(n, v, 0, 100, &o->temperature, err);
    else if (!strcmp(n, "top-k")) {
        rc = need_i64(n, v, 0, &i64, err);
        if (!rc && i64 > 16777216)
            rc = mgt_errf(err, "--top-k %.80s: at most 16777216 (the largest vocabulary)", v);
        o->top_k = (int)i64;
    }
    else if (!strcmp(n, "val-fraction")) rc = need_double(n, v, 0, 0.5, &o->val_fraction, err);
    else if (!strcmp(n, "output")) o->output = v;
    else if (!strcmp(n, "format")) {
        if (strcmp(v, "onnx"))
            rc = mgt_errf(err, "--format %.80s: the one format export writes is onnx", v);
    }
    else if (!strcmp(n, "batchnorm")) {
        if (strcmp(v, "fold") && strcmp(v, "keep"))
            rc = mgt_errf(err, "--batchnorm %.80s: use fold or keep", v);
        o->keep_bn = !strcmp(v, "keep");
    }
    /* clang-format on */
    return rc;
}

/* `mgtrain plot RUN_DIR` and `mgtrain plot --help`: a positional argument, no flags. */
static int parse_plot(int argc, char **argv, mgt_cli *c, mgt_err *err) {
    if (argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        c->action = MGT_CLI_HELP;
        c->help_cmd = "plot";
        return 0;
    }
    if (argc != 3 || argv[2][0] == '-')
        return mgt_errf(err, "usage: mgtrain plot RUN_DIR (the --out folder of a training run)");
    if (check_path("mgtrain plot", argv[2], err) < 0)
        return -1;
    c->action = MGT_CLI_PLOT;
    c->plot_dir = argv[2];
    return 0;
}

int mgt_cli_parse(int argc, char **argv, mgt_cli *c, mgt_err *err) {
    memset(c, 0, sizeof *c);
    mgt_options_defaults(&c->o);
    c->action = MGT_CLI_RUN;
    if (argc < 1 || !argv)
        return mgt_errf(err, "no arguments at all, not even the program name");

    int first = 1;
    if (argc > 1 && argv[1][0] != '-') {
        if (!is_command(argv[1])) {
            const char *near = mgt_nearest(argv[1], commands, NCOMMANDS);
            return mgt_errf(err,
                            "unknown command '%.80s'%s%s%s; commands are %s (see mgtrain --help)",
                            argv[1], near ? " (did you mean '" : "", near ? near : "",
                            near ? "'?)" : "", command_list());
        }
        c->o.command = argv[1];
        first = 2;
    }
    const char *cmd = c->o.command;
    if (!strcmp(cmd, "help")) {
        if (argc > 3)
            return mgt_errf(err, "usage: mgtrain help [COMMAND]");
        c->action = MGT_CLI_HELP;
        c->help_cmd = argc > 2 ? argv[2] : NULL;
        if (c->help_cmd && !is_command(c->help_cmd))
            return mgt_errf(err,
                            "unknown command '%.80s' for mgtrain help; commands are %s",
                            c->help_cmd, command_list());
        return 0;
    }
    if (!strcmp(cmd, "plot"))
        return parse_plot(argc, argv, c, err);
    int bit = command_bit(cmd);

    if (check_spelling(argc, argv, first, cmd, err) < 0)
        return -1;

    /* getopt_long sees the flags only: argv[first - 1] stands in for the program name. Its
     * state is global; optind = 0 makes glibc start over completely. */
    struct option lopts[NFLAGS + 1];
    for (int i = 0; i < NFLAGS; i++)
        lopts[i] = (struct option){flags[i].name, flags[i].arg ? required_argument : no_argument,
                                   NULL, 1000 + i};
    lopts[NFLAGS] = (struct option){0, 0, 0, 0};
    /* --resume has an optional value, given as --resume=auto or as the next word, --resume auto:
     * "-" makes getopt_long hand over the words that are not flags in order (as code 1), so the
     * one right after --resume can be taken as its value. */
    for (int i = 0; i < NFLAGS; i++)
        if (!strcmp(flags[i].name, "resume"))
            lopts[i].has_arg = optional_argument;
    int sub_argc = argc - (first - 1);
    char **sub = argv + (first - 1);
    opterr = 0;
    optind = 0;
    int ch, li, after_resume = 0, operands = 0;
    while ((ch = getopt_long(sub_argc, sub, "-:h", lopts, &li)) != -1) {
        const int resume_value = after_resume;
        after_resume = 0;
        if (ch == 1 && bit == C_CONVERT) { /* SRC, then DST */
            if (operands == 2)
                return mgt_errf(err,
                                "unexpected argument '%.80s': mgtrain convert takes SRC and DST "
                                "(see mgtrain convert --help)",
                                optarg);
            if (check_path(operands ? "DST" : "SRC", optarg, err) < 0)
                return -1;
            *(operands++ ? &c->o.convert_dst : &c->o.convert_src) = optarg;
            continue;
        }
        if (ch == 1) {
            if (!resume_value)
                return mgt_errf(err,
                                "unexpected argument '%.80s' (flags start with --; see mgtrain "
                                "%s --help)",
                                optarg, cmd);
            if (resume_mode(optarg, &c->o.resume, err) < 0)
                return -1;
            continue;
        }
        if (ch == ':')
            return mgt_errf(err, "%.80s needs a value (see mgtrain %s --help)", sub[optind - 1],
                            cmd);
        if (ch == '?') /* check_spelling names these first; kept for safety */
            return mgt_errf(err, "unknown flag for mgtrain %s (see mgtrain %s --help)", cmd, cmd);
        if (ch == 'h') {
            c->action = MGT_CLI_HELP;
            c->help_cmd = first == 2 ? cmd : NULL;
            return 0;
        }
        const flag *f = &flags[ch - 1000];
        if (!strcmp(f->name, "help") || !strcmp(f->name, "version")) {
            c->action = f->name[0] == 'h' ? MGT_CLI_HELP : MGT_CLI_VERSION;
            c->help_cmd = first == 2 ? cmd : NULL;
            return 0;
        }
        if (!(f->commands & bit))
            return mgt_errf(err, "--%s does not apply to mgtrain %s (see mgtrain %s --help)",
                            f->name, cmd, cmd);
        if (take(&c->o, f->name, optarg, err) < 0)
            return -1;
        after_resume = !strcmp(f->name, "resume") && !optarg;
    }
    if (optind < sub_argc && bit == C_CONVERT) /* operands after "--" */
        for (; optind < sub_argc; optind++) {
            if (operands == 2 || check_path(operands ? "DST" : "SRC", sub[optind], err) < 0)
                return operands == 2 ? mgt_errf(err,
                                                "unexpected argument '%.80s': mgtrain convert "
                                                "takes SRC and DST",
                                                sub[optind])
                                     : -1;
            *(operands++ ? &c->o.convert_dst : &c->o.convert_src) = sub[optind];
        }
    if (optind < sub_argc)
        return mgt_errf(err,
                        "unexpected argument '%.80s' (flags start with --; see mgtrain %s "
                        "--help)",
                        sub[optind], cmd);
    if (bit == C_CONVERT && operands < 2)
        return mgt_errf(err,
                        "usage: mgtrain convert SRC DST [--size N] [--split train|test]: SRC is "
                        "a folder of class folders of images, DST the image set to write (see "
                        "mgtrain convert --help)");
    if (c->o.resume && c->o.overwrite)
        return mgt_errf(err, "--resume and --overwrite exclude each other: one continues the run "
                             "in the folder, the other replaces it");
    if (c->o.resume == MGT_RESUME_REQUIRE && c->o.init_weights)
        return mgt_errf(err, "--resume and --init-weights exclude each other: a resumed run "
                             "takes its weights from the checkpoint (--resume auto with "
                             "--init-weights starts from them when there is no checkpoint yet)");
    return 0;
}
