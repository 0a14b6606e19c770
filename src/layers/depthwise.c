/* depthwise.c: depthwise and depthwise-separable convolutions, Keras' DepthwiseConv2D (depth
 * multiplier 1) and SeparableConv2D, on the backend's dwconv ops.
 *
 *   [depthwise_conv2d]  each channel convolved with its own kh x kw filter. Weights
 *                       <name>.weight [c][1][kh][kw] and <name>.bias [c]: PyTorch's
 *                       Conv2d(c, c, k, groups=c).
 *   [separable_conv2d]  that, then a 1x1 convolution to `filters` channels (no activation in
 *                       between), the bias after the pointwise step. Weights as two modules,
 *                       <name>.depthwise.weight [c][1][kh][kw] and <name>.pointwise.weight
 *                       [filters][c][1][1] (+ <name>.pointwise.bias): a PyTorch module with
 *                       depthwise = Conv2d(c, c, k, groups=c, bias=False) and pointwise =
 *                       Conv2d(c, filters, 1) loads them as they are.
 * Keys as conv2d's: kernel, stride, padding (valid|same, Keras' rule), use_bias (true, as in
 * Keras), activation. Initialisation is Keras' Glorot uniform with its fans: the depthwise
 * kernel (kh, kw, c, 1) has fan_in kh*kw*c and fan_out kh*kw; the pointwise one fan_in c and
 * fan_out filters.
 *
 * The separable layer keeps the depthwise output for backward (temps: saved; the pointwise
 * weights' gradient needs it) and computes the gradient w.r.t. it in a work tensor. */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const dw_keys[] = {"kernel", "stride", "padding", "use_bias", NULL};
static const char *const dw_required[] = {"kernel", NULL};
static const char *const sep_keys[] = {"filters", "kernel", "stride", "padding", "use_bias", NULL};
static const char *const sep_required[] = {"filters", "kernel", NULL};

static void defaults(mgt_layer *l) {
    l->cfg.bias = 1;
    l->cfg.stride = 1;
}

/* The depthwise step's geometry (oc = c). */
static mgt_conv_shape dw_geometry(const mgt_layer *l, int n) {
    const mgt_layer_cfg *c = &l->cfg;
    return mgt_conv2d_geometry(n, l->in.h, l->in.w, l->in.c, l->in.c, c->kernel, c->kernel_w,
                               c->stride, c->same);
}

/* The separable layer's pointwise step: 1x1, stride 1, on the depthwise output. */
static mgt_conv_shape pw_geometry(const mgt_layer *l, int n) {
    const mgt_conv_shape d = dw_geometry(l, n);
    return mgt_conv2d_geometry(n, d.oh, d.ow, d.c, l->cfg.filters, 1, 1, 1, 0);
}

/* The depthwise kernel: [c][1][kh][kw] with Keras' fans. */
static int add_depthwise(mgt_model *m, mgt_layer *l, const char *name, mgt_err *err) {
    const mgt_conv_shape s = dw_geometry(l, 1);
    if (s.oh < 1 || s.ow < 1)
        return mgt_errf(err,
                        "kernel = %d,%d does not fit the %dx%d input; use a smaller kernel "
                        "or padding = same",
                        s.kh, s.kw, s.h, s.w);
    const int64_t ws[4] = {s.c, 1, s.kh, s.kw};
    const float area = (float)(s.kh * s.kw);
    l->param[0] =
        mgt_model_add_param(m, l, name, 4, ws, MGT_INIT_GLOROT, area * (float)s.c, area, err);
    return l->param[0] < 0 ? -1 : 0;
}

static int dw_build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    if (add_depthwise(m, l, "weight", err) < 0)
        return -1;
    const mgt_conv_shape s = dw_geometry(l, 1);
    l->out = (mgt_shape){s.oh, s.ow, s.c, 0};
    const int64_t bs[1] = {s.c};
    if (l->cfg.bias &&
        (l->param[1] = mgt_model_add_param(m, l, "bias", 1, bs, MGT_INIT_ZERO, 0, 0, err)) < 0)
        return -1;
    return 0;
}

static size_t dw_scratch(mgt_backend *be, const mgt_layer *l, int max_batch) {
    const mgt_conv_shape s = dw_geometry(l, max_batch);
    return be->ops->dwconv_scratch(be, &s);
}

static void dw_fwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x, float *y) {
    const mgt_conv_shape s = dw_geometry(l, st->n);
    st->be->ops->dwconv_fwd(st->be, &s, x, mgt_w(m, l, 0), mgt_w(m, l, 1), y);
}

static void dw_bwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x, const float *y,
                   float *dy, float *dx) {
    (void)y;
    const mgt_conv_shape s = dw_geometry(l, st->n);
    st->be->ops->dwconv_bwd(st->be, &s, x, mgt_w(m, l, 0), dy, dx, mgt_g(m, l, 0), mgt_g(m, l, 1));
}

static int sep_build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    if (add_depthwise(m, l, "depthwise.weight", err) < 0)
        return -1;
    const mgt_conv_shape p = pw_geometry(l, 1);
    l->out = (mgt_shape){p.oh, p.ow, p.oc, 0};
    const int64_t ws[4] = {p.oc, p.c, 1, 1}, bs[1] = {p.oc};
    l->param[1] = mgt_model_add_param(m, l, "pointwise.weight", 4, ws, MGT_INIT_GLOROT, (float)p.c,
                                      (float)p.oc, err);
    if (l->param[1] < 0)
        return -1;
    if (l->cfg.bias && (l->param[2] = mgt_model_add_param(m, l, "pointwise.bias", 1, bs,
                                                          MGT_INIT_ZERO, 0, 0, err)) < 0)
        return -1;
    return 0;
}

/* The depthwise output (saved for the pointwise weights' gradient) and its gradient (work). */
static void sep_temps(const mgt_layer *l, size_t act_bytes, size_t *saved, size_t *work) {
    const mgt_conv_shape d = dw_geometry(l, 1);
    *saved = *work = (size_t)d.oh * (size_t)d.ow * (size_t)d.c * act_bytes;
}

static size_t sep_scratch(mgt_backend *be, const mgt_layer *l, int max_batch) {
    const mgt_conv_shape d = dw_geometry(l, max_batch), p = pw_geometry(l, max_batch);
    const size_t a = be->ops->dwconv_scratch(be, &d), b = be->ops->conv2d_scratch(&p);
    return a > b ? a : b;
}

/* The step's rows of the saved or work tensor (a chunk's under --reproducible, model.h: row0). */
static float *sep_rows(float *base, const mgt_layer *l, const mgt_step *st) {
    const mgt_conv_shape d = dw_geometry(l, 1);
    return mgt_step_rows(base, st, (size_t)d.oh * (size_t)d.ow * (size_t)d.c);
}

static void sep_fwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x, float *y) {
    const mgt_conv_shape d = dw_geometry(l, st->n), p = pw_geometry(l, st->n);
    float *saved = sep_rows(l->saved, l, st);
    st->be->ops->dwconv_fwd(st->be, &d, x, mgt_w(m, l, 0), NULL, saved);
    st->be->ops->conv2d_fwd(st->be, &p, saved, mgt_w(m, l, 1), mgt_w(m, l, 2), y);
}

static void sep_bwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x, const float *y,
                    float *dy, float *dx) {
    (void)y;
    const mgt_conv_shape d = dw_geometry(l, st->n), p = pw_geometry(l, st->n);
    float *saved = sep_rows(l->saved, l, st), *work = sep_rows(l->work, l, st);
    st->be->ops->conv2d_bwd(st->be, &p, saved, mgt_w(m, l, 1), dy, work, mgt_g(m, l, 1),
                            mgt_g(m, l, 2));
    st->be->ops->dwconv_bwd(st->be, &d, x, mgt_w(m, l, 0), work, dx, mgt_g(m, l, 0), NULL);
}

/* A Conv of one group per channel; the separable layer's pointwise 1x1 Conv after it. */
static int dw_onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const mgt_conv_shape s = dw_geometry(l, 1);
    const char *wn, *bn;
    if (mgt_onnx_conv_params(x, m, l, 0, 1, &wn, &bn) < 0 ||
        mgt_onnx_conv_node(x, mgt_onnx_input4(x, m, l, 0), wn, bn, &s, s.c, x->out) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

static int sep_onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const mgt_conv_shape d = dw_geometry(l, 1), p = pw_geometry(l, 1);
    const char *dw = mgt_onnx_param(x, m, l, 0), *mid = mgt_onnx_name(x, "depthwise"), *wn, *bn;
    if (!dw || mgt_onnx_conv_node(x, mgt_onnx_input4(x, m, l, 0), dw, NULL, &d, d.c, mid) < 0 ||
        mgt_onnx_conv_params(x, m, l, 1, 2, &wn, &bn) < 0 ||
        mgt_onnx_conv_node(x, mid, wn, bn, &p, 1, x->out) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

const mgt_layer_type mgt_layer_depthwise_conv2d = {
    .name = "depthwise_conv2d",
    .keys = dw_keys,
    .required = dw_required,
    .has_act = 1,
    .defaults = defaults,
    .set = mgt_conv_set,
    .build = dw_build,
    .forward = dw_fwd,
    .backward = dw_bwd,
    .scratch = dw_scratch,
    .bwd_reads = MGT_BWD_READS_X,
    .onnx = dw_onnx,
};

const mgt_layer_type mgt_layer_separable_conv2d = {
    .name = "separable_conv2d",
    .keys = sep_keys,
    .required = sep_required,
    .has_act = 1,
    .defaults = defaults,
    .set = mgt_conv_set,
    .build = sep_build,
    .forward = sep_fwd,
    .backward = sep_bwd,
    .scratch = sep_scratch,
    .bwd_reads = MGT_BWD_READS_X,
    .temps = sep_temps,
    .onnx = sep_onnx,
};
