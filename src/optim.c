/* optim.c: the optimizer table and the [train] keys the optimizers read (see optim.h); SGD
 * (momentum, Nesterov), RMSprop and Adam with Keras' formulas and defaults. */
#include "optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "comm.h"
#include "runtime.h"

/* SGD keeps a velocity only with momentum. */
static int sgd_slots(const mgt_opt_settings *s) {
    return s->momentum > 0 ? 1 : 0;
}

/* Adam's bias correction: lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t). */
static float adam_lr(float lr, const mgt_opt_settings *s, int64_t t) {
    const double td = (double)t;
    return (float)(lr * sqrt(1.0 - pow(s->beta2, td)) / (1.0 - pow(s->beta1, td)));
}

/* AdamW's: lr / (1 - beta1^t); sqrt(1 - beta2^t) goes with it (mgt_optim_begin). */
static float adamw_lr(float lr, const mgt_opt_settings *s, int64_t t) {
    return (float)(lr / (1.0 - pow(s->beta1, (double)t)));
}

/* Keras' defaults: learning rate 0.01 for SGD and 0.001 otherwise. */
static const mgt_optimizer table[] = {
    [MGT_OPT_SGD] = {.name = "sgd",
                     .default_lr = 0.01f,
                     .keys = {"momentum", "nesterov"},
                     .slot_names = {"optimizer.velocity"},
                     .slots = sgd_slots},
    [MGT_OPT_RMSPROP] = {.name = "rmsprop",
                         .default_lr = 0.001f,
                         .keys = {"rho", "epsilon"},
                         .slot_names = {"optimizer.mean_square"}},
    [MGT_OPT_ADAM] = {.name = "adam",
                      .default_lr = 0.001f,
                      .keys = {"beta_1", "beta_2", "epsilon"},
                      .slot_names = {"optimizer.m", "optimizer.v"},
                      .lr_at = adam_lr},
    [MGT_OPT_ADAMW] = {.name = "adamw",
                       .default_lr = 0.001f,
                       .keys = {"beta_1", "beta_2", "epsilon", "decay_all"},
                       .slot_names = {"optimizer.m", "optimizer.v"},
                       .lr_at = adamw_lr},
};
_Static_assert(sizeof table / sizeof table[0] == MGT_OPT_COUNT,
               "the optimizer table needs one row per kind of cpu/optim_math.h");

/* Keras' defaults: RMSprop rho 0.9, Adam 0.9 / 0.999, epsilon 1e-7; no momentum, no decay. */
static const mgt_opt_key keys[] = {
    {"momentum", offsetof(mgt_opt_settings, momentum), MGT_OPT_KEY_BELOW_ONE, 0.0f, "0.9"},
    {"nesterov", offsetof(mgt_opt_settings, nesterov), MGT_OPT_KEY_BOOL, 0.0f, "true"},
    {"rho", offsetof(mgt_opt_settings, rho), MGT_OPT_KEY_FRACTION, 0.9f, "0.9"},
    {"beta_1", offsetof(mgt_opt_settings, beta1), MGT_OPT_KEY_FRACTION, 0.9f, "0.9"},
    {"beta_2", offsetof(mgt_opt_settings, beta2), MGT_OPT_KEY_FRACTION, 0.999f, "0.9"},
    {"epsilon", offsetof(mgt_opt_settings, epsilon), MGT_OPT_KEY_POSITIVE, 1e-7f, "1e-7"},
    {"weight_decay", offsetof(mgt_opt_settings, weight_decay), MGT_OPT_KEY_NONNEG, 0.0f, "0.0001"},
    {"decay_all", offsetof(mgt_opt_settings, decay_all), MGT_OPT_KEY_BOOL, 0.0f, "true"},
};
enum { NKEYS = sizeof keys / sizeof keys[0] };

const mgt_optimizer *mgt_optimizer_of(mgt_opt_kind k) {
    return &table[k];
}

const char *mgt_opt_name(mgt_opt_kind k) {
    return table[k].name;
}

int mgt_opt_find(const char *name) {
    for (int i = 0; i < MGT_OPT_COUNT; i++)
        if (!strcasecmp(name, table[i].name))
            return i;
    return -1;
}

const char *mgt_opt_names(char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < MGT_OPT_COUNT && at < n; i++) {
        const char *sep = i == 0 ? "" : i == MGT_OPT_COUNT - 1 ? " or " : ", ";
        at += (size_t)snprintf(buf + at, n - at, "%s%s", sep, table[i].name);
    }
    return buf;
}

const mgt_opt_key *mgt_opt_key_find(const char *key) {
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(key, keys[i].key))
            return &keys[i];
    return NULL;
}

const mgt_opt_key *mgt_opt_key_at(int i) {
    return i >= 0 && i < NKEYS ? &keys[i] : NULL;
}

void mgt_opt_defaults(mgt_opt_settings *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < NKEYS; i++) {
        char *at = (char *)s + keys[i].offset;
        if (keys[i].kind == MGT_OPT_KEY_BOOL)
            *(int *)at = keys[i].def != 0.0f;
        else
            *(float *)at = keys[i].def;
    }
}

int mgt_optim_init(mgt_optim *o, const mgt_optim_cfg *cfg, mgt_backend *be, size_t count,
                   mgt_err *err) {
    return mgt_optim_init_sharded(o, cfg, be, count, 0, 1, err);
}

int mgt_optim_init_sharded(mgt_optim *o, const mgt_optim_cfg *cfg, mgt_backend *be, size_t count,
                           int rank, int shards, mgt_err *err) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->count = count;
    o->shards = shards < 1 ? 1 : shards;
    o->rank = o->shards == 1 ? 0 : rank;
    mgt_comm_slice(count, o->rank, o->shards, &o->lo, &o->n);
    o->lr = cfg->lr;
    const mgt_optimizer *d = &table[cfg->optimizer];
    for (int i = 0; i < MGT_OPT_MAX_SLOTS && d->slot_names[i]; i++) {
        o->slot_name[i] = d->slot_names[i];
        o->nslots++;
    }
    if (d->slots)
        o->nslots = d->slots(&cfg->opt);
    for (int i = 0; i < o->nslots; i++) {
        o->slot[i] = be->ops->alloc(be, o->n * sizeof(float) + 16);
        if (!o->slot[i])
            return mgt_errf(err, "out of %s memory for the optimizer's state (%zu bytes)",
                            be->ops->name, o->n * sizeof(float));
    }
    return 0;
}

void mgt_optim_begin(mgt_optim *o, int64_t global_n) {
    const mgt_optim_cfg *c = &o->cfg;
    const mgt_optimizer *d = &table[c->optimizer];
    o->t++;
    o->step = (mgt_opt_hyper){.s = c->opt,
                              .lr = d->lr_at ? d->lr_at(o->lr, &c->opt, o->t) : o->lr,
                              .scale = global_n > 0 ? 1.0f / (float)global_n : 0.0f,
                              .lr_decay = o->lr,
                              .bc2_sqrt = (float)sqrt(1.0 - pow(c->opt.beta2, (double)o->t))};
}

int mgt_optim_skip_decay(mgt_optim *o, const size_t *lo, const size_t *count, int n, mgt_err *err) {
    free(o->skip_lo);
    free(o->skip_n);
    o->skip_lo = o->skip_n = NULL;
    o->nskip = 0;
    if (n <= 0)
        return 0;
    o->skip_lo = malloc(sizeof *o->skip_lo * (size_t)n);
    o->skip_n = malloc(sizeof *o->skip_n * (size_t)n);
    if (!o->skip_lo || !o->skip_n)
        return mgt_errf(err, "out of host memory for the optimizer's %d tensors", n);
    for (int i = 0; i < n; i++) {
        if (i > 0 && lo[i] < lo[i - 1] + count[i - 1])
            return mgt_errf(err, "the tensors without weight decay are not in arena order");
        o->skip_lo[i] = lo[i];
        o->skip_n[i] = count[i];
    }
    o->nskip = n;
    return 0;
}

/* One backend call over [lo, lo + count), its state at the instance's slice. */
static void step_range(mgt_optim *o, mgt_backend *be, float *w, const float *g, size_t lo,
                       size_t count, const mgt_opt_hyper *h) {
    if (count == 0)
        return;
    float *slots[MGT_OPT_MAX_SLOTS] = {0};
    for (int i = 0; i < o->nslots; i++)
        slots[i] = o->slot[i] + (lo - o->lo);
    be->ops->optim_step(be, o->cfg.optimizer, count, w + lo, g + lo, slots, h);
}

void mgt_optim_update(mgt_optim *o, mgt_backend *be, float *w, const float *g, size_t lo,
                      size_t count) {
    if (count == 0)
        return;
    if (lo < o->lo || lo + count > o->lo + o->n)
        mgt_die("optimizer update of [%zu, %zu) outside this rank's slice [%zu, %zu); please "
                "report this",
                lo, lo + count, o->lo, o->lo + o->n);
    /* AdamW's decay on the matrices only: the ranges of the other tensors (biases, norms'
     * gains) take the rule without it, between them the decaying ones; the same elements get
     * the same arithmetic however the range is cut (ZeRO-1's slices, buckets). */
    if (o->cfg.optimizer != MGT_OPT_ADAMW || o->cfg.opt.decay_all || !o->nskip ||
        o->step.s.weight_decay == 0.0f) {
        step_range(o, be, w, g, lo, count, &o->step);
        return;
    }
    mgt_opt_hyper plain = o->step;
    plain.s.weight_decay = 0.0f;
    const size_t end = lo + count;
    size_t at = lo;
    for (int i = 0; i < o->nskip && at < end; i++) {
        const size_t s0 = o->skip_lo[i], s1 = o->skip_lo[i] + o->skip_n[i];
        if (s1 <= at)
            continue;
        if (s0 >= end)
            break;
        if (s0 > at)
            step_range(o, be, w, g, at, s0 - at, &o->step);
        const size_t a = s0 > at ? s0 : at, b = s1 < end ? s1 : end;
        step_range(o, be, w, g, a, b - a, &plain);
        at = b;
    }
    step_range(o, be, w, g, at, end - at, &o->step);
}

void mgt_optim_step(mgt_optim *o, mgt_backend *be, float *w, const float *g, int64_t global_n) {
    mgt_optim_begin(o, global_n);
    mgt_optim_update(o, be, w, g, o->lo, o->n);
}

/* For the scatter and the gather of sharded state: the slices' sizes in rank order (root only,
 * else NULL: the slices tile the arena in that order, so the whole arena is their
 * concatenation) into *sizes, and a host buffer for this rank's slice, returned. */
static float *slice_layout(const mgt_optim *o, const mgt_comm *c, int root, size_t **sizes) {
    size_t *k = NULL, lo;
    if (c->rank == root) {
        k = malloc(sizeof *k * (size_t)c->world);
        if (!k)
            mgt_die("out of host memory for the optimizer state's layout");
        for (int r = 0; r < c->world; r++)
            mgt_comm_slice(o->count, r, o->shards, &lo, &k[r]);
    }
    float *mine = malloc(o->n * sizeof(float) + sizeof(float));
    if (!mine)
        mgt_die("out of host memory for the optimizer state's slice (%zu bytes)",
                o->n * sizeof(float));
    *sizes = k;
    return mine;
}

void mgt_optim_state_put(mgt_optim *o, mgt_backend *be, mgt_comm *c, float *const *full, int root) {
    const size_t bytes = o->n * sizeof(float);
    if (o->shards == 1) { /* the whole arenas on every rank */
        for (int i = 0; i < o->nslots; i++) {
            mgt_bcast(c, full[i], o->count * sizeof(float), root, "optimizer state broadcast");
            be->ops->to_device(be, o->slot[i], full[i], bytes);
        }
        return;
    }
    size_t *k;
    float *mine = slice_layout(o, c, root, &k);
    for (int i = 0; i < o->nslots; i++) {
        mgt_scatterv(c, c->rank == root ? full[i] : NULL, k, mine, o->n, root,
                     "optimizer state scatter");
        be->ops->to_device(be, o->slot[i], mine, bytes);
    }
    free(mine);
    free(k);
}

void mgt_optim_state_get(mgt_optim *o, mgt_backend *be, mgt_comm *c, float *const *full, int root) {
    const size_t bytes = o->n * sizeof(float);
    if (o->shards == 1) { /* root's own copy is the state */
        for (int i = 0; c->rank == root && i < o->nslots; i++)
            be->ops->to_host(be, full[i], o->slot[i], bytes);
        return;
    }
    size_t *k;
    float *mine = slice_layout(o, c, root, &k);
    for (int i = 0; i < o->nslots; i++) {
        be->ops->to_host(be, mine, o->slot[i], bytes);
        mgt_gatherv(c, mine, o->n, c->rank == root ? full[i] : NULL, k, root,
                    "optimizer state gather");
    }
    free(mine);
    free(k);
}

void mgt_optim_free(mgt_optim *o, mgt_backend *be) {
    for (int i = 0; i < o->nslots; i++)
        be->ops->free(be, o->slot[i]);
    free(o->skip_lo);
    free(o->skip_n);
    memset(o, 0, sizeof *o);
}
