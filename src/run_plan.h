/* run_plan.h: what a command will do, resolved once. The command line (options.h) and the model
 * file's [train] section (train_cfg.h) become one plan, checked once before any work and cut into
 * one part per concern, each in the types of the module it is handed to:
 *   data   which data and splits (splits.h);
 *   place  where the ranks compute and how their gradients travel (placement.h);
 *   step   what one optimizer step is made of: its batch, accumulation, --reproducible chunk,
 *          buckets, ZeRO-1 and progress (fit.h), its optimizer (optim.h), the seed it starts
 *          from, and whether the training set may be kept in backend memory (staging.h);
 *   loop   how long training runs, at what rate, what it decides on validation (fit.h);
 *   out    checkpoints and the run folder: where, to resume or to overwrite, how many to keep;
 *          the weights eval and predict read, and predict's output;
 *   log    what rank 0 shows and writes, profiling, and the checks between steps (fit.h).
 * No module below the commands sees the command line: each is handed its part. The model comes
 * out of the same resolution: the model file parsed, its input shape and convolution algorithms
 * as the command line sets them, its loss as [train] says.
 *
 * Resolution makes the checks every rank makes alike, in the order the commands have always made
 * them: the run folder --run names (eval, predict), the model file, its [train] keys and their
 * overrides, that --run's model copy is the model its checkpoint was trained with (checked by
 * rank 0), the batch against the ranks, the command's own requirements, the placement flags,
 * then --split; each failure ends the job on every rank alike (mgt_die_all). What can only be
 * known once a part is set up (a usable GPU, the data, the run folder's state) is checked by the
 * module that meets it. */
#ifndef MGT_RUN_PLAN_H
#define MGT_RUN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "fit.h"
#include "model.h"
#include "optim.h"
#include "options.h"
#include "placement.h"
#include "repro.h"
#include "runtime.h"
#include "splits.h"
#include "train_cfg.h"

typedef enum {
    MGT_CMD_TRAIN = 0,
    MGT_CMD_EVAL,
    MGT_CMD_PREDICT,
    MGT_CMD_SUMMARY,
    MGT_CMD_EXPORT,
    MGT_CMD_GENERATE
} mgt_command;

typedef struct mgt_step_plan {
    mgt_pipeline pipeline; /* bucket_mb < 0: the backend's default (reducer.h) */
    mgt_repro_opts repro;  /* what the run asks of --reproducible (pipeline.chunk > 0) */
    mgt_optim_cfg optim;
    uint64_t seed;          /* the run's seed (a resumed run takes its checkpoint's) */
    const char *seed_given; /* --seed as given (NULL: not given), which a resumed run must match */
    int device_data; /* the training set may be kept in backend memory (--device-data auto) */
} mgt_step_plan;

typedef struct mgt_out_plan {
    char dir[512];            /* train: --out, or runs/<model>; eval, predict: "." */
    int resume;               /* MGT_RESUME_* */
    int overwrite;            /* replace another run's files in the folder */
    int64_t keep_checkpoints; /* the last K checkpoints are kept */
    int64_t save_every;       /* also checkpoint every N steps (0: at epoch ends only) */
    const char *init_weights; /* train: start from these weights (NULL: from the seed) */
    int init_partial;         /* train: what does not match keeps its initial value */
    const char *name_map;     /* the weights file's renames (pretrained.h; NULL: none) */
    const char *weights;      /* eval, predict: --weights, or the weights of --run's folder */
    const char *output;       /* predict: the .npy it writes; export: the model file */
    int keep_bn;              /* export: every batchnorm a node of its own (no folding) */
    char run_model[600], run_weights[600]; /* --run DIR: the files the folder names */
    char run_input_shape[32]; /* --run DIR without --model: the --input-shape it trained with */
} mgt_out_plan;

typedef struct mgt_run_plan {
    mgt_command command;
    /* The model file: its path (NULL: the built-in one, examples/mlp.cfg), and its text as parsed
     * (NULL: the built-in text), which a run keeps a copy of. */
    const char *model_file;
    char *model_text;
    size_t model_len;
    /* [train] with the command line's overrides, as resolved: what a run reports about itself
     * (run.json, the summary); the modules take their parts below. */
    mgt_train_cfg train;
    int validate; /* train: validation after every epoch, and the test split at the end */
    mgt_splits_opts data;
    mgt_place_opts place;
    mgt_step_plan step;
    mgt_regime loop;
    mgt_out_plan out;
    mgt_fit_log log;
    int floor; /* summary --floor: each layer's floor on an H100 */
} mgt_run_plan;

/* A [train] key the command line sets: the flag (its name without --), the key and the value. */
typedef struct mgt_train_override {
    const char *flag, *key, *value;
} mgt_train_override;

/* The [train] keys o sets, in the order the plan applies them (later ones win), into out[max];
 * returns their count. */
int mgt_run_plan_overrides(const mgt_options *o, mgt_train_override *out, int max);
/* The [train] section a run resolves to from the model file's text (len bytes, named path in
 * messages) and o's overrides, as mgt_run_plan_make resolves it (the optimizer's default
 * learning rate filled in). -1 with err, which names the file's line or the flag. */
int mgt_run_plan_train_cfg(mgt_train_cfg *t, const char *path, const char *text, size_t len,
                           const mgt_options *o, mgt_err *err);

/* Resolves the command line o on the runtime rt into p, and parses the model into m; every rank
 * calls it alike. Errors end the job (see the top). */
void mgt_run_plan_make(mgt_run_plan *p, mgt_model *m, const mgt_options *o, const mgt_runtime *rt);
void mgt_run_plan_free(mgt_run_plan *p);

#endif
