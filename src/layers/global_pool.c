/* global_pool.c: global average pooling, Keras' GlobalAveragePooling2D: the mean of each channel
 * over the image, (H, W, C) -> C (PyTorch: x.mean((2, 3)), or AdaptiveAvgPool2d(1) and
 * flatten). Its output is flat, so a [dense] layer may follow directly. */
#include "layer_util.h"

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)l, (void)key, (void)v;
    return mgt_errf(err, "takes no settings");
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m, (void)err;
    l->out = (mgt_shape){1, 1, l->in.c};
    return 0;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    (void)m;
    s->be->ops->gap_fwd(s->be, s->n, l->in.h * l->in.w, l->in.c, x, y);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, const float *y,
                     float *dy, float *dx) {
    (void)m, (void)x, (void)y;
    if (dx)
        s->be->ops->gap_bwd(s->be, s->n, l->in.h * l->in.w, l->in.c, dy, dx);
}

const mgt_layer_type mgt_layer_global_avgpool = {
    .name = "global_avgpool",
    .set = set,
    .build = build,
    .forward = forward,
    .backward = backward,
};
