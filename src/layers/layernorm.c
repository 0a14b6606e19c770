/* layernorm.c: [layernorm], layer normalisation over the channels of each position (each row of
 * c values): y = (x - mean) / sqrt(var + epsilon) * weight + bias, PyTorch's LayerNorm(c) with
 * its tensors weight [c] (ones) and bias [c] (zeros), GPT-2's ln_1, ln_2 and ln_f. The row's mean
 * and 1/std are kept from forward to backward (the layer's saved memory, two floats a row), so
 * backward reads the input and these instead of recomputing them. epsilon defaults to 1e-5, as
 * PyTorch's and GPT-2's. */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"epsilon", NULL};

static void defaults(mgt_layer *l) {
    l->cfg.epsilon = 1e-5f;
}

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)key;
    if (mgt_parse_float(v, &l->cfg.epsilon) < 0 || !(l->cfg.epsilon > 0) || l->cfg.epsilon > 1)
        return mgt_errf(err, "expected a number in (0, 1], e.g. epsilon = 1e-5");
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    l->out = l->in;
    const int64_t cs[1] = {l->in.c};
    if ((l->param[0] = mgt_model_add_param(m, l, "weight", 1, cs, MGT_INIT_ONE, 0, 0, err)) < 0 ||
        (l->param[1] = mgt_model_add_param(m, l, "bias", 1, cs, MGT_INIT_ZERO, 0, 0, err)) < 0)
        return -1;
    return 0;
}

static int alloc(mgt_model *m, mgt_layer *l, int max_batch, mgt_err *err) {
    (void)max_batch;
    if (!m->be->ops->layernorm_fwd || !m->be->ops->layernorm_bwd)
        return mgt_errf(err,
                        "layer %s: the %s backend has no layer normalisation yet; train this "
                        "model with --device cpu",
                        l->name, m->be->ops->name);
    return 0;
}

/* Per sample: the mean and 1/std of each of its rows (float32 whatever the activations). */
static void temps(const mgt_layer *l, size_t act_bytes, size_t *saved, size_t *work) {
    (void)act_bytes;
    *saved = 2 * sizeof(float) * (size_t)l->in.h * (size_t)l->in.w;
    *work = 0;
}

/* The step's rows' statistics: mean then rstd, each [rows of the whole batch]. */
static void stats(const mgt_model *m, const mgt_layer *l, const mgt_step *s, float **mean,
                  float **rstd) {
    const size_t per = (size_t)l->in.h * (size_t)l->in.w;
    *mean = (float *)l->saved + (size_t)s->row0 * per;
    *rstd = (float *)l->saved + (size_t)m->max_batch * per + (size_t)s->row0 * per;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    float *mean, *rstd;
    stats(m, l, s, &mean, &rstd);
    s->be->ops->layernorm_fwd(s->be, s->n * l->in.h * l->in.w, l->in.c, l->cfg.epsilon, x,
                              mgt_w(m, l, 0), mgt_w(m, l, 1), y, mean, rstd);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, const float *y,
                     float *dy, float *dx) {
    (void)y;
    float *mean, *rstd;
    stats(m, l, s, &mean, &rstd);
    s->be->ops->layernorm_bwd(s->be, s->n * l->in.h * l->in.w, l->in.c, x, mgt_w(m, l, 0), mean,
                              rstd, dy, dx, mgt_g(m, l, 0), mgt_g(m, l, 1));
}

/* ONNX's LayerNormalization over the last axis (the channels). */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const char *in[3] = {x->in[0], mgt_onnx_param(x, m, l, 0), mgt_onnx_param(x, m, l, 1)};
    const mgt_onnx_attr a[2] = {{.name = "axis", .kind = MGT_ONNX_INT, .i = -1},
                                {.name = "epsilon", .kind = MGT_ONNX_FLOAT, .f = l->cfg.epsilon}};
    if (x->in_rank[0] == 4)
        return mgt_errf(err, "layer %s: the ONNX export takes layer normalisation of sequences "
                             "and flat values, not of images", l->name);
    x->out_rank = x->in_rank[0];
    if (!in[1] || !in[2] || mgt_onnx_node(x->g, "LayerNormalization", in, 3, x->out, a, 2) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

const mgt_layer_type mgt_layer_layernorm = {
    .name = "layernorm",
    .keys = keys,
    .defaults = defaults,
    .set = set,
    .build = build,
    .alloc = alloc,
    .temps = temps,
    .forward = forward,
    .backward = backward,
    .bwd_reads = MGT_BWD_READS_X,
    .onnx = onnx,
};
