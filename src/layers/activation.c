/* activation.c: a stand-alone activation layer ([activation] type = relu). The model applies
 * l->act after every layer's own op, so this layer's op is just a copy, and none at all where
 * the planner lets it work in place (y is then x's memory). */
#include <string.h>

#include "layer_util.h"

static const char *const keys[] = {"type", NULL};
static const char *const required[] = {"type", NULL};

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)key;
    if (mgt_parse_act(v, &l->act) < 0)
        return mgt_errf(err, "unknown; use relu, sigmoid, tanh, softmax or none");
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m, (void)err;
    l->out = l->in;
    return 0;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    (void)m;
    if (y != x)
        s->be->ops->copy(s->be, y, x,
                         sizeof(float) * (size_t)s->n * (size_t)mgt_shape_elems(l->in));
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                     const float *y, float *dy, float *dx) {
    (void)m, (void)x, (void)y;
    if (dx)
        s->be->ops->copy(s->be, dx, dy,
                         sizeof(float) * (size_t)s->n * (size_t)mgt_shape_elems(l->in));
}

const mgt_layer_type mgt_layer_activation = {
    .name = "activation", .keys = keys, .required = required, .set = set, .build = build,
    .forward = forward, .backward = backward, .inplace = 1,
};
