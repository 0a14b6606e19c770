/* pool.c: max and average pooling over size x size windows (stride defaults to size), as Keras'
 * MaxPooling2D / AveragePooling2D: padding = valid (whole windows only) or same, which is
 * TensorFlow's: out = ceil(in / stride), the windows overhanging by pad = (out - 1) * stride +
 * size - in split with the odd one at the bottom/right, and the overhang left out of each window
 * (a maximum over the real values, an average divided by their count). PyTorch's MaxPool2d(3, 2,
 * padding=1) gives the same shape on even inputs but centres its windows differently: padding = 1
 * asks for PyTorch's, p rows and columns on every side (at most half the size), left out of each
 * window alike (a max over them is PyTorch's; an average divides by the real values, as PyTorch's
 * count_include_pad = False).
 *
 * Max pooling keeps, per output, the index of the input it picked for backward: planned memory
 * (temps: saved), alive from forward to backward only. */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"size", "stride", "padding", NULL};

static void defaults(mgt_layer *l) { l->cfg.kernel = 2; }

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "size"))
        return mgt_set_pos_int(v, &l->cfg.kernel, err);
    if (!strcmp(key, "padding")) {
        int p;
        if (mgt_parse_int(v, &p) == 0 && p >= 0) { /* PyTorch's padding = p, on every side */
            l->cfg.same = 0;
            l->cfg.pad[0] = p;
            return 0;
        }
        if (strcmp(v, "valid") && strcmp(v, "same"))
            return mgt_errf(err, "expected valid, same (TensorFlow's: the border windows "
                                 "overhang, the odd row/column at the bottom/right) or a number "
                                 "of rows and columns on every side (PyTorch's padding)");
        l->cfg.same = !strcmp(v, "same");
        l->cfg.pad[0] = 0;
        return 0;
    }
    l->cfg.stride_set = 1;
    return mgt_set_pos_int(v, &l->cfg.stride, err);
}

static mgt_pool_shape geometry(const mgt_layer *l, int n) {
    int stride = l->cfg.stride_set ? l->cfg.stride : l->cfg.kernel;
    mgt_pool_shape s = {.n = n, .h = l->in.h, .w = l->in.w, .c = l->in.c,
                        .size = l->cfg.kernel, .stride = stride};
    if (l->cfg.same) {
        /* conv2d's rule: the same output size and padding split */
        const mgt_conv_shape g =
            mgt_conv2d_geometry(n, s.h, s.w, s.c, s.c, s.size, s.size, stride, 1);
        s.oh = g.oh;
        s.ow = g.ow;
        s.pad_top = g.pad_top;
        s.pad_left = g.pad_left;
    } else { /* valid, or PyTorch's padding p on every side */
        const int p = l->cfg.pad[0];
        s.oh = s.h + 2 * p >= s.size ? (s.h + 2 * p - s.size) / stride + 1 : 0;
        s.ow = s.w + 2 * p >= s.size ? (s.w + 2 * p - s.size) / stride + 1 : 0;
        s.pad_top = s.pad_left = p;
    }
    return s;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m;
    mgt_pool_shape s = geometry(l, 1);
    if (s.oh < 1 || s.ow < 1)
        return mgt_errf(err,
                        "size = %d does not fit the %dx%d input; use a smaller size or "
                        "padding = same",
                        s.size, s.h, s.w);
    if (!l->cfg.same && 2 * l->cfg.pad[0] > s.size)
        return mgt_errf(err,
                        "padding = %d is more than half of size %d, so windows would hold no "
                        "input; pad at most %d (PyTorch's rule)",
                        l->cfg.pad[0], s.size, s.size / 2);
    if (s.pad_top >= s.size || s.pad_left >= s.size)
        return mgt_errf(err,
                        "stride %d is larger than size %d, so padding = same would leave "
                        "windows with no input in them; use a stride up to the size",
                        s.stride, s.size);
    l->out = (mgt_shape){s.oh, s.ow, s.c, 0};
    return 0;
}

/* The argmax of each output (int32). */
static void max_temps(const mgt_layer *l, size_t act_bytes, size_t *saved, size_t *work) {
    (void)act_bytes;
    *saved = (size_t)mgt_shape_elems(l->out) * sizeof(int32_t);
    *work = 0;
}

/* The step's rows of the argmax (a chunk's under --reproducible, model.h: row0). */
static int32_t *argmax(mgt_layer *l, const mgt_step *st) {
    return mgt_step_bytes(l->saved, st, (size_t)mgt_shape_elems(l->out) * sizeof(int32_t));
}

static void max_fwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x, float *y) {
    (void)m;
    mgt_pool_shape s = geometry(l, st->n);
    st->be->ops->maxpool_fwd(st->be, &s, x, y, argmax(l, st));
}

static void max_bwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x,
                    const float *y, float *dy, float *dx) {
    (void)m, (void)y;
    if (!dx)
        return;
    mgt_pool_shape s = geometry(l, st->n);
    if (l->x_relu_grad) /* the ReLU before it, its gradient taken over (fuse.c) */
        st->be->ops->maxpool_bwd_relu(st->be, &s, x, dy, argmax(l, st), dx);
    else
        st->be->ops->maxpool_bwd(st->be, &s, dy, argmax(l, st), dx);
}

static int max_takes_x_relu(const mgt_layer *l, const mgt_backend *be) {
    (void)l;
    return be->ops->maxpool_bwd_relu != NULL;
}

static void avg_fwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x, float *y) {
    (void)m;
    mgt_pool_shape s = geometry(l, st->n);
    st->be->ops->avgpool_fwd(st->be, &s, x, y);
}

static void avg_bwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x,
                    const float *y, float *dy, float *dx) {
    (void)m, (void)x, (void)y;
    if (!dx)
        return;
    mgt_pool_shape s = geometry(l, st->n);
    st->be->ops->avgpool_bwd(st->be, &s, dy, dx);
}

/* MaxPool or AveragePool with mgtrain's padding; an average over the real values only
 * (count_include_pad = 0), as the layer takes it. */
static int pool_onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, const char *op,
                     mgt_err *err) {
    const mgt_pool_shape s = geometry(l, 1);
    const int64_t bottom = (int64_t)(s.oh - 1) * s.stride + s.size - s.h - s.pad_top;
    const int64_t right = (int64_t)(s.ow - 1) * s.stride + s.size - s.w - s.pad_left;
    const int64_t k[2] = {s.size, s.size}, st[2] = {s.stride, s.stride};
    const int64_t pads[4] = {s.pad_top, s.pad_left, bottom > 0 ? bottom : 0, right > 0 ? right : 0};
    const mgt_onnx_attr a[3] = {
        {.name = "kernel_shape", .kind = MGT_ONNX_INTS, .ints = k, .nints = 2},
        {.name = "strides", .kind = MGT_ONNX_INTS, .ints = st, .nints = 2},
        {.name = "pads", .kind = MGT_ONNX_INTS, .ints = pads, .nints = 4}};
    const char *in = mgt_onnx_input4(x, m, l, 0);
    x->out_rank = 4;
    if (mgt_onnx_node(x->g, op, &in, 1, x->out, a, 3) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

static int max_onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    return pool_onnx(x, m, l, "MaxPool", err);
}

static int avg_onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    return pool_onnx(x, m, l, "AveragePool", err);
}

const mgt_layer_type mgt_layer_maxpool = {
    .name = "maxpool", .keys = keys, .defaults = defaults, .set = set, .build = build,
    .temps = max_temps, .forward = max_fwd, .backward = max_bwd, .takes_x_relu = max_takes_x_relu,
    .onnx = max_onnx,
};

const mgt_layer_type mgt_layer_avgpool = {
    .name = "avgpool", .keys = keys, .defaults = defaults, .set = set, .build = build,
    .forward = avg_fwd, .backward = avg_bwd, .onnx = avg_onnx,
};
