/* conv2d.c: 2-D convolution, NHWC activations, OIHW weights, padding valid or same (Keras'
 * rule: "same" pads so that out = ceil(in / stride), the extra row/column at the bottom/right). */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"filters", "kernel", "stride", "padding", "use_bias", "algo",
                                   NULL};
static const char *const required[] = {"filters", "kernel", NULL};

static void defaults(mgt_layer *l) {
    l->cfg.bias = 1;
    l->cfg.stride = 1;
}

extern const mgt_layer_type mgt_layer_conv2d;

static int parse_algo(const char *v, mgt_conv_algo *algo, mgt_err *err) {
    static const char *const names[] = {"auto", "direct", "winograd"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) {
            *algo = (mgt_conv_algo)i;
            return 0;
        }
    return mgt_errf(err, "expected auto, direct or winograd");
}

/* Winograd's minimal filtering is defined here for 3x3 kernels at stride 1 only. */
static int winograd_applies(const mgt_layer_cfg *c) {
    return c->kernel == 3 && c->kernel_w == 3 && c->stride == 1;
}

int mgt_conv_set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    mgt_layer_cfg *c = &l->cfg;
    if (!strcmp(key, "filters"))
        return mgt_set_pos_int(v, &c->filters, err);
    if (!strcmp(key, "stride"))
        return mgt_set_pos_int(v, &c->stride, err);
    if (!strcmp(key, "use_bias"))
        return mgt_set_bool(v, &c->bias, err);
    if (!strcmp(key, "algo"))
        return parse_algo(v, &c->algo, err);
    if (!strcmp(key, "padding")) {
        if (strcmp(v, "valid") && strcmp(v, "same"))
            return mgt_errf(err, "expected valid or same");
        c->same = !strcmp(v, "same");
        return 0;
    }
    int k[2];
    int n = mgt_parse_int_list(v, k, 2);
    if (n < 1 || k[0] < 1 || (n == 2 && k[1] < 1))
        return mgt_errf(err, "expected a kernel size like 3 or 3,3");
    c->kernel = k[0];
    c->kernel_w = n == 2 ? k[1] : k[0];
    return 0;
}

mgt_conv_shape mgt_conv2d_geometry(int n, int h, int w, int c, int oc, int kh, int kw, int stride,
                                   int same) {
    mgt_conv_shape s = {
        .n = n, .h = h, .w = w, .c = c, .oc = oc, .kh = kh, .kw = kw, .stride = stride};
    if (same) {
        /* In 64 bits: h + stride and the kernel's overhang may pass INT_MAX for any int inputs.
         * The results fit an int again: oh <= h, and as (oh - 1) * stride < h, the padding is
         * below the kernel size. */
        int64_t oh = ((int64_t)h + stride - 1) / stride, ow = ((int64_t)w + stride - 1) / stride;
        int64_t ph = (oh - 1) * stride + kh - h, pw = (ow - 1) * stride + kw - w;
        s.oh = (int)oh;
        s.ow = (int)ow;
        s.pad_top = ph > 0 ? (int)(ph / 2) : 0;
        s.pad_left = pw > 0 ? (int)(pw / 2) : 0;
    } else {
        s.oh = s.h >= s.kh ? (s.h - s.kh) / s.stride + 1 : 0;
        s.ow = s.w >= s.kw ? (s.w - s.kw) / s.stride + 1 : 0;
    }
    return s;
}

static mgt_conv_shape geometry(const mgt_layer *l, int n) {
    const mgt_layer_cfg *c = &l->cfg;
    mgt_conv_shape s = mgt_conv2d_geometry(n, l->in.h, l->in.w, l->in.c, c->filters, c->kernel,
                                           c->kernel_w, c->stride, c->same);
    s.algo = c->algo;
    return s;
}

int mgt_conv2d_set_algo(mgt_model *m, const char *algo, mgt_err *err) {
    mgt_conv_algo a = MGT_CONV_AUTO;
    if (parse_algo(algo, &a, err) < 0)
        return -1;
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        if (l->type == &mgt_layer_conv2d)
            l->cfg.algo = a == MGT_CONV_WINOGRAD && !winograd_applies(&l->cfg) ? MGT_CONV_AUTO : a;
    }
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    if (l->cfg.algo == MGT_CONV_WINOGRAD && !winograd_applies(&l->cfg))
        return mgt_errf(err, "algo = winograd needs a 3x3 kernel at stride 1 (this layer has "
                        "kernel %d,%d and stride %d); use algo = auto or direct", l->cfg.kernel,
                        l->cfg.kernel_w, l->cfg.stride);
    mgt_conv_shape s = geometry(l, 1);
    if (s.oh < 1 || s.ow < 1)
        return mgt_errf(err, "kernel = %d,%d does not fit the %dx%d input; use a smaller kernel "
                        "or padding = same", s.kh, s.kw, s.h, s.w);
    l->out = (mgt_shape){s.oh, s.ow, s.oc, 0};
    int64_t ws[4] = {s.oc, s.c, s.kh, s.kw}, bs[1] = {s.oc};
    float area = (float)s.kh * (float)s.kw;
    l->param[0] = mgt_model_add_param(m, l, "weight", 4, ws, MGT_INIT_GLOROT, area * (float)s.c,
                                      area * (float)s.oc, err);
    if (l->param[0] < 0)
        return -1;
    if (l->cfg.bias &&
        (l->param[1] = mgt_model_add_param(m, l, "bias", 1, bs, MGT_INIT_ZERO, 0, 0, err)) < 0)
        return -1;
    return 0;
}

static size_t scratch(mgt_backend *be, const mgt_layer *l, int max_batch) {
    mgt_conv_shape s = geometry(l, max_batch);
    return be->ops->conv2d_scratch(&s);
}

/* A bias that the batchnorm after the layer cancels (fuse.c) is left out in training, and its
 * gradient is zero, its exact value; evaluation adds it, as the running mean includes it. */
/* A ReLU of the layer's own, where the backend writes it as it stores the output. */
static int applies_act(const mgt_model *m, const mgt_layer *l, const mgt_backend *be) {
    return !m->no_fusion && be->ops->conv_relu && l->act == MGT_ACT_RELU && !l->fused_act;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x, float *y) {
    mgt_conv_shape s = geometry(l, st->n);
    if (applies_act(m, l, st->be))
        s.act = MGT_ACT_RELU;
    const float *b = l->bias_cancelled && st->training ? NULL : mgt_w(m, l, 1);
    st->be->ops->conv2d_fwd(st->be, &s, x, mgt_w(m, l, 0), b, y);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x,
                     const float *y, float *dy, float *dx) {
    (void)y;
    mgt_conv_shape s = geometry(l, st->n);
    float *db = mgt_g(m, l, 1);
    if (db && l->bias_cancelled) {
        st->be->ops->zero(st->be, db, sizeof(float) * (size_t)s.oc);
        db = NULL;
    }
    st->be->ops->conv2d_bwd(st->be, &s, x, mgt_w(m, l, 0), dy, dx, mgt_g(m, l, 0), db);
}

static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const mgt_conv_shape s = geometry(l, 1);
    const char *wn, *bn;
    if (mgt_onnx_conv_params(x, m, l, 0, 1, &wn, &bn) < 0 ||
        mgt_onnx_conv_node(x, mgt_onnx_input4(x, m, l, 0), wn, bn, &s, 1, x->out) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

const mgt_layer_type mgt_layer_conv2d = {
    .name = "conv2d", .keys = keys, .required = required, .has_act = 1, .defaults = defaults,
    .set = mgt_conv_set, .build = build, .forward = forward, .backward = backward,
    .scratch = scratch, .applies_act = applies_act, .bwd_reads = MGT_BWD_READS_X,
    .cancellable_bias = 1, .onnx = onnx,
};
