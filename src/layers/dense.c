/* dense.c: y = x W^T + b, W in PyTorch's [out][in] layout. Needs a flat input. */
#include <string.h>

#include "layer_util.h"

static const char *const keys[] = {"units", "use_bias", NULL};
static const char *const required[] = {"units", NULL};

static void defaults(mgt_layer *l) { l->cfg.bias = 1; }

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "units"))
        return mgt_set_pos_int(v, &l->cfg.units, err);
    return mgt_set_bool(v, &l->cfg.bias, err);
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    if (l->in.h != 1 || l->in.w != 1)
        return mgt_errf(err, "needs a flat input but gets %dx%dx%d per sample; put a [flatten] "
                        "section before it", l->in.h, l->in.w, l->in.c);
    int in = l->in.c, out = l->cfg.units;
    l->out = (mgt_shape){1, 1, out};
    int64_t ws[2] = {out, in}, bs[1] = {out};
    l->param[0] =
        mgt_model_add_param(m, l, "weight", 2, ws, MGT_INIT_GLOROT, (float)in, (float)out, err);
    if (l->param[0] < 0)
        return -1;
    if (l->cfg.bias &&
        (l->param[1] = mgt_model_add_param(m, l, "bias", 1, bs, MGT_INIT_ZERO, 0, 0, err)) < 0)
        return -1;
    return 0;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    s->be->ops->dense_fwd(s->be, s->n, l->in.c, l->out.c, x, mgt_w(m, l, 0), mgt_w(m, l, 1), y);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                     const float *y, float *dy, float *dx) {
    (void)y;
    s->be->ops->dense_bwd(s->be, s->n, l->in.c, l->out.c, x, mgt_w(m, l, 0), dy, dx,
                          mgt_g(m, l, 0), mgt_g(m, l, 1));
}

const mgt_layer_type mgt_layer_dense = {
    .name = "dense", .keys = keys, .required = required, .has_act = 1, .defaults = defaults,
    .set = set, .build = build, .forward = forward, .backward = backward,
    .bwd_reads = MGT_BWD_READS_X,
};
