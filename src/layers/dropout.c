/* dropout.c: inverted dropout. The mask is never stored: it is regenerated from a key made of
 * (seed, layer, optimizer step) and each element's position in the GLOBAL batch, so it does not
 * depend on how many ranks share the batch, nor on the backend. */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"rate", NULL};
static const char *const required[] = {"rate", NULL};

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)key;
    float x;
    if (mgt_parse_float(v, &x) < 0 || x < 0 || x >= 1)
        return mgt_errf(err, "expected a fraction in [0, 1), e.g. rate = 0.25");
    l->cfg.rate = x;
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m, (void)err;
    l->out = l->in;
    return 0;
}

static uint64_t key(const mgt_layer *l, const mgt_step *s) {
    return mgt_key3(s->seed, 0x44524f50ULL + (uint64_t)l->index, (uint64_t)s->global_step);
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    (void)m;
    int row = (int)mgt_shape_elems(l->in);
    if (y != x) /* in place where the planner allows it */
        s->be->ops->copy(s->be, y, x, mgt_dtype_size(s->be->act) * (size_t)s->n * (size_t)row);
    if (s->training)
        s->be->ops->dropout_fwd(s->be, s->n, row, l->cfg.rate, key(l, s),
                                (uint64_t)s->first_sample, y);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                     const float *y, float *dy, float *dx) {
    (void)m, (void)x, (void)y;
    if (!dx)
        return;
    int row = (int)mgt_shape_elems(l->in);
    s->be->ops->copy(s->be, dx, dy, mgt_dtype_size(s->be->act) * (size_t)s->n * (size_t)row);
    s->be->ops->dropout_bwd(s->be, s->n, row, l->cfg.rate, key(l, s),
                            (uint64_t)s->first_sample, dx);
}

/* Gone in inference: the output is the input. */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    (void)m, (void)l, (void)err;
    x->alias = 0;
    return 0;
}

const mgt_layer_type mgt_layer_dropout = {
    .name = "dropout", .keys = keys, .required = required, .set = set, .build = build,
    .forward = forward, .backward = backward, .inplace = 1, .onnx = onnx,
};
