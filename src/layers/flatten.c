/* flatten.c: H x W x C -> one vector per sample in C, H, W order (PyTorch's nn.Flatten on NCHW),
 * so a following dense layer's weights load unchanged into the equivalent PyTorch model. */
#include "../export.h"
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
    l->out = (mgt_shape){1, 1, (int)n, 0};
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

/* C, H, W order: ONNX's Flatten of NCHW (a flat input stays as it is). */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    (void)m;
    const mgt_onnx_attr a = {.name = "axis", .kind = MGT_ONNX_INT, .i = 1};
    if (x->in_rank[0] == 2) {
        x->alias = 0;
        return 0;
    }
    x->out_rank = 2;
    if (mgt_onnx_node(x->g, "Flatten", x->in, 1, x->out, &a, 1) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

const mgt_layer_type mgt_layer_flatten = {
    .name = "flatten", .set = set, .build = build, .forward = forward, .backward = backward,
    .same_bytes = same_bytes, .onnx = onnx,
};
