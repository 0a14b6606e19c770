/* flatten.c: H x W x C -> one vector per sample in C, H, W order (PyTorch's nn.Flatten on NCHW),
 * so a following dense layer's weights load unchanged into the equivalent PyTorch model. */
#include "layer_util.h"

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)l, (void)key, (void)v;
    return mgt_errf(err, "flatten takes no settings");
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m;
    int64_t n = mgt_shape_elems(l->in);
    if (n > MGT_MAX_TENSOR_ELEMS) /* the model checks every layer's input; this cast must hold */
        return mgt_errf(err, "model too large: %lld values per sample", (long long)n);
    l->out = (mgt_shape){1, 1, (int)n};
    return 0;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    (void)m;
    s->be->ops->nhwc_to_chw(s->be, s->n, l->in.h, l->in.w, l->in.c, x, y);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                     const float *y, float *dy, float *dx) {
    (void)m, (void)x, (void)y;
    if (dx)
        s->be->ops->chw_to_nhwc(s->be, s->n, l->in.h, l->in.w, l->in.c, dy, dx);
}

static int same_bytes(const mgt_layer *l) {
    return mgt_nhwc_is_chw(l->in.h, l->in.w, l->in.c);
}

const mgt_layer_type mgt_layer_flatten = {
    .name = "flatten", .set = set, .build = build, .forward = forward, .backward = backward,
    .same_bytes = same_bytes,
};
