/* optim.h: the optimizers. One table (optim.c) says everything about each: its name, default
 * learning rate, the [train] keys it reads, its state slots (as checkpoints name them) and how its
 * learning rate moves per step; its element rule is in cpu/optim_math.h, whose list of rules makes
 * the kinds (mgt_opt_kind), the CPU loops and the GPU kernels. The parser of [train]
 * (train_cfg.c), the help text and the checkpoint's slot names are read from the tables here.
 *
 * An optimizer instance (mgt_optim) works over the flat parameter arena: its slots are arenas of
 * the same layout, and a step is one backend call. Under ZeRO-1 an instance keeps the state of
 * its rank's slice [lo, lo + n) of the arena only and updates only that slice (reducer.h sends
 * the updated weights to the other ranks); the rule is element-wise, so the slice's new weights
 * and state are bit for bit those of the whole-arena update. Checkpoints stay world-size free:
 * mgt_optim_state_get gathers the slices into whole arenas on one rank, and
 * mgt_optim_state_put scatters whole arenas into slices, for any rank count. */
#ifndef MGT_OPTIM_H
#define MGT_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "util.h"

struct mgt_comm;

/* One optimizer: a row of the table. */
typedef struct mgt_optimizer {
    const char *name;    /* as in [train] optimizer = and --optimizer */
    float default_lr;    /* learning_rate when neither the model file nor --lr gives one */
    const char *keys[4]; /* the [train] keys its rule reads besides learning_rate and
                            weight_decay (NULL-terminated) */
    const char *slot_names[MGT_OPT_MAX_SLOTS]; /* its state arenas, as checkpoints name them */
    /* How many of the slots it keeps with these settings (NULL: every named one). */
    int (*slots)(const mgt_opt_settings *s);
    /* The learning rate of step t (from 1), given the set one (NULL: constant). */
    float (*lr_at)(float lr, const mgt_opt_settings *s, int64_t t);
} mgt_optimizer;

const mgt_optimizer *mgt_optimizer_of(mgt_opt_kind k);
const char *mgt_opt_name(mgt_opt_kind k); /* its name */
/* The kind named `name` (case-insensitive), or -1. */
int mgt_opt_find(const char *name);
/* "sgd, rmsprop or adam": the names, for help texts and messages, into buf. Returns buf. */
const char *mgt_opt_names(char *buf, size_t n);

/* A [train] key an optimizer reads (besides learning_rate): where its value goes in
 * mgt_opt_settings, which values it takes, its default, and an example for messages. */
typedef enum {
    MGT_OPT_KEY_NONNEG = 0, /* a number >= 0 */
    MGT_OPT_KEY_POSITIVE,   /* a number > 0 */
    MGT_OPT_KEY_BELOW_ONE,  /* a number >= 0 and < 1 (momentum) */
    MGT_OPT_KEY_FRACTION,   /* a number in [0, 1) (decay rates) */
    MGT_OPT_KEY_BOOL,       /* true or false */
} mgt_opt_key_kind;

typedef struct mgt_opt_key {
    const char *key;
    size_t offset; /* of its float (int for MGT_OPT_KEY_BOOL) in mgt_opt_settings */
    mgt_opt_key_kind kind;
    float def;
    const char *example;
} mgt_opt_key;

/* The key named `key`, or NULL; the i-th key, or NULL past the last. */
const mgt_opt_key *mgt_opt_key_find(const char *key);
const mgt_opt_key *mgt_opt_key_at(int i);
/* Every key's default. */
void mgt_opt_defaults(mgt_opt_settings *s);

/* The optimizer a run uses: [train] optimizer, learning_rate (the run's, from which the schedule
 * starts: never the "not given" of the file) and the optimizers' other keys. */
typedef struct mgt_optim_cfg {
    mgt_opt_kind optimizer;
    float lr;
    mgt_opt_settings opt;
} mgt_optim_cfg;

typedef struct mgt_optim {
    mgt_optim_cfg cfg;
    size_t count;
    int nslots;
    float *slot[MGT_OPT_MAX_SLOTS]; /* backend memory: n floats each, element 0 = arena's lo */
    const char *slot_name[MGT_OPT_MAX_SLOTS];
    int64_t t; /* steps taken (Adam's bias correction) */
    size_t lo, n;       /* the slice this instance keeps state for and updates (all: 0, count) */
    int rank, shards;   /* ZeRO-1: this rank of `shards` (1: not sharded) */
    mgt_opt_hyper step; /* the current step's values (mgt_optim_begin) */
    /* AdamW: the ranges of the arena that take no weight decay (mgt_optim_skip_decay) */
    size_t *skip_lo, *skip_n;
    int nskip;
    float lr;  /* the next step's learning rate: cfg.lr until the schedule sets it (schedule.h) */
} mgt_optim;

int mgt_optim_init(mgt_optim *o, const mgt_optim_cfg *cfg, mgt_backend *be, size_t count,
                   mgt_err *err);
/* ZeRO-1: state for rank `rank`'s slice of `shards` only (comm.h: mgt_comm_slice). */
int mgt_optim_init_sharded(mgt_optim *o, const mgt_optim_cfg *cfg, mgt_backend *be, size_t count,
                           int rank, int shards, mgt_err *err);
/* g holds gradient sums over the global batch of `global_n` samples. Updates the instance's
 * slice: mgt_optim_begin, then mgt_optim_update of [lo, lo + n). */
void mgt_optim_step(mgt_optim *o, mgt_backend *be, float *w, const float *g, int64_t global_n);
/* The same in parts, for an update that follows the gradients' arrival: begin counts the step
 * and fixes its values; each update applies them to [lo, lo + count), which must lie within the
 * instance's slice (count 0: nothing). */
void mgt_optim_begin(mgt_optim *o, int64_t global_n);
void mgt_optim_update(mgt_optim *o, mgt_backend *be, float *w, const float *g, size_t lo,
                      size_t count);
/* AdamW's decay applies to the matrices only, as GPT-2's recipes have it (decay_all = true: to
 * every tensor): the n ranges [lo[i], lo[i] + count[i]) of the arena, in arena order (the
 * biases, norms' gains and other vectors), are updated without it. */
int mgt_optim_skip_decay(mgt_optim *o, const size_t *lo, const size_t *count, int n,
                         mgt_err *err);
/* Collective: the state from whole host arenas full[i][count], read on `root` only, into every
 * rank's backend memory (broadcast, or scattered into the slices). */
void mgt_optim_state_put(mgt_optim *o, mgt_backend *be, struct mgt_comm *c, float *const *full,
                         int root);
/* Collective: the state into `root`'s whole host arenas full[i][count] (copied, or gathered from
 * the slices); other ranks' full may be NULL. */
void mgt_optim_state_get(mgt_optim *o, mgt_backend *be, struct mgt_comm *c, float *const *full,
                         int root);
void mgt_optim_free(mgt_optim *o, mgt_backend *be);

#endif
