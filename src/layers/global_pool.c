/* global_pool.c: global average pooling, Keras' GlobalAveragePooling2D: the mean of each channel
 * over the image, (H, W, C) -> C (PyTorch: x.mean((2, 3)), or AdaptiveAvgPool2d(1) and
 * flatten). Its output is flat, so a [dense] layer may follow directly. */
#include "../export.h"
#include "layer_util.h"

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)l, (void)key, (void)v;
    return mgt_errf(err, "takes no settings");
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m, (void)err;
    l->out = (mgt_shape){1, 1, l->in.c, 0};
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

/* GlobalAveragePool, then flat: [batch, C]. */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const char *in = mgt_onnx_input4(x, m, l, 0), *mean = mgt_onnx_name(x, "mean");
    const mgt_onnx_attr a = {.name = "axis", .kind = MGT_ONNX_INT, .i = 1};
    x->out_rank = 2;
    if (mgt_onnx_node(x->g, "GlobalAveragePool", &in, 1, mean, NULL, 0) < 0 ||
        mgt_onnx_node(x->g, "Flatten", &mean, 1, x->out, &a, 1) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

const mgt_layer_type mgt_layer_global_avgpool = {
    .name = "global_avgpool",
    .set = set,
    .build = build,
    .forward = forward,
    .backward = backward,
    .onnx = onnx,
};
