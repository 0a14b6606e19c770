/* zeropad.c: zero padding around each image, Keras' ZeroPadding2D ([zeropad] pad = top,bottom,
 * left,right, or one number for all four, or two for top/bottom and left/right), PyTorch's
 * nn.ZeroPad2d((left, right, top, bottom)). ResNet-50 pads its input by 3 before the 7x7
 * stride-2 convolution and by 1 before its max pooling. */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"pad", NULL};
static const char *const required[] = {"pad", NULL};

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)key;
    int p[4];
    const int n = mgt_parse_int_list(v, p, 4);
    int ok = n == 1 || n == 2 || n == 4;
    for (int i = 0; ok && i < n; i++)
        ok = p[i] >= 0;
    if (!ok)
        return mgt_errf(err, "expected pad = top,bottom,left,right (or one number for every "
                             "side, or two: top/bottom, left/right), whole numbers >= 0");
    int *d = l->cfg.pad;
    if (n == 1)
        d[0] = d[1] = d[2] = d[3] = p[0];
    else if (n == 2)
        d[0] = d[1] = p[0], d[2] = d[3] = p[1];
    else
        memcpy(d, p, sizeof p);
    return 0;
}

static mgt_pad_shape geometry(const mgt_layer *l, int n) {
    const int *p = l->cfg.pad;
    return (mgt_pad_shape){n, l->in.h, l->in.w, l->in.c, p[0], p[1], p[2], p[3]};
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m, (void)err;
    const int *p = l->cfg.pad;
    l->out = (mgt_shape){l->in.h + p[0] + p[1], l->in.w + p[2] + p[3], l->in.c, 0};
    return 0;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    (void)m;
    const mgt_pad_shape g = geometry(l, s->n);
    s->be->ops->pad_fwd(s->be, &g, x, y);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, const float *y,
                     float *dy, float *dx) {
    (void)m, (void)x, (void)y;
    if (!dx)
        return;
    const mgt_pad_shape g = geometry(l, s->n);
    s->be->ops->pad_bwd(s->be, &g, dy, dx);
}

/* Pad with zeros: top, left, bottom, right of the two spatial axes. */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const int *p = l->cfg.pad; /* top, bottom, left, right */
    const int64_t pads[8] = {0, 0, p[0], p[2], 0, 0, p[1], p[3]}, n = 8;
    const char *in[2] = {mgt_onnx_input4(x, m, l, 0), mgt_onnx_name(x, "pads")};
    x->out_rank = 4;
    if (mgt_onnx_init_i64(x->g, in[1], pads, 1, &n) < 0 ||
        mgt_onnx_node(x->g, "Pad", in, 2, x->out, NULL, 0) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

const mgt_layer_type mgt_layer_zeropad = {
    .name = "zeropad",
    .keys = keys,
    .required = required,
    .set = set,
    .build = build,
    .forward = forward,
    .backward = backward,
    .onnx = onnx,
};
