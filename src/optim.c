/* optim.c: SGD (momentum, Nesterov), RMSprop and Adam with Keras' formulas and defaults. */
#include "optim.h"

#include <math.h>
#include <string.h>

int mgt_optim_init(mgt_optim *o, const mgt_train_cfg *cfg, mgt_backend *be, size_t count,
                   mgt_err *err) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->count = count;
    switch (cfg->optimizer) {
    case MGT_OPT_SGD:
        o->nslots = cfg->momentum > 0 ? 1 : 0;
        o->slot_name[0] = "optimizer.velocity";
        break;
    case MGT_OPT_RMSPROP:
        o->nslots = 1;
        o->slot_name[0] = "optimizer.mean_square";
        break;
    case MGT_OPT_ADAM:
        o->nslots = 2;
        o->slot_name[0] = "optimizer.m";
        o->slot_name[1] = "optimizer.v";
        break;
    }
    for (int i = 0; i < o->nslots; i++) {
        o->slot[i] = be->ops->alloc(be, count * sizeof(float) + 16);
        if (!o->slot[i])
            return mgt_errf(err, "out of %s memory for the optimizer's state (%zu bytes)",
                            be->ops->name, count * sizeof(float));
    }
    return 0;
}

void mgt_optim_step(mgt_optim *o, mgt_backend *be, float *w, const float *g, int64_t global_n) {
    const mgt_train_cfg *c = &o->cfg;
    float scale = global_n > 0 ? 1.0f / (float)global_n : 0.0f;
    o->t++;
    switch (c->optimizer) {
    case MGT_OPT_SGD:
        be->ops->sgd_step(be, o->count, w, g, o->slot[0], c->lr, c->momentum, c->nesterov,
                          c->weight_decay, scale);
        break;
    case MGT_OPT_RMSPROP:
        be->ops->rmsprop_step(be, o->count, w, g, o->slot[0], c->lr, c->rho, c->epsilon,
                              c->weight_decay, scale);
        break;
    case MGT_OPT_ADAM: {
        double t = (double)o->t;
        float lr_t = (float)(c->lr * sqrt(1.0 - pow(c->beta2, t)) / (1.0 - pow(c->beta1, t)));
        be->ops->adam_step(be, o->count, w, g, o->slot[0], o->slot[1], lr_t, c->beta1, c->beta2,
                           c->epsilon, c->weight_decay, scale);
        break;
    }
    }
}

void mgt_optim_free(mgt_optim *o, mgt_backend *be) {
    for (int i = 0; i < o->nslots; i++)
        be->ops->free(be, o->slot[i]);
    memset(o, 0, sizeof *o);
}
