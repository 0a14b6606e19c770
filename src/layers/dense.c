/* dense.c: y = x W^T + b, W in PyTorch's [out][in] layout. Needs a flat input. */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"units", "use_bias", NULL};
static const char *const required[] = {"units", NULL};

static void defaults(mgt_layer *l) { l->cfg.bias = 1; }

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "units"))
        return mgt_set_pos_int(v, &l->cfg.units, err);
    return mgt_set_bool(v, &l->cfg.bias, err);
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    if (l->in.h != 1 || l->in.w != 1)
        return mgt_errf(err, "needs a flat input but gets %dx%dx%d per sample; put a [flatten] "
                        "section before it", l->in.h, l->in.w, l->in.c);
    int in = l->in.c, out = l->cfg.units;
    l->out = (mgt_shape){1, 1, out};
    int64_t ws[2] = {out, in}, bs[1] = {out};
    l->param[0] =
        mgt_model_add_param(m, l, "weight", 2, ws, MGT_INIT_GLOROT, (float)in, (float)out, err);
    if (l->param[0] < 0)
        return -1;
    if (l->cfg.bias &&
        (l->param[1] = mgt_model_add_param(m, l, "bias", 1, bs, MGT_INIT_ZERO, 0, 0, err)) < 0)
        return -1;
    return 0;
}

/* A ReLU of the layer's own, where the backend writes it with the product (dense_fwd_relu). */
static int applies_act(const mgt_model *m, const mgt_layer *l, const mgt_backend *be) {
    return !m->no_fusion && be->ops->dense_fwd_relu && l->act == MGT_ACT_RELU && !l->fused_act;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    const mgt_ops *o = s->be->ops;
    (applies_act(m, l, s->be) ? o->dense_fwd_relu : o->dense_fwd)(
        s->be, s->n, l->in.c, l->out.c, x, mgt_w(m, l, 0), mgt_w(m, l, 1), y);
}

/* A weight gradient of at least two blocks of GRAD_BLOCK floats (128 KiB) is written in row
 * blocks, at most GRAD_BLOCKS of them, each a multiple of 16 rows: the blocks leave for their
 * all-reduce one by one while the next is computed, and the layer's last block is all that
 * waits for the end of backward (a layer holding most of a model's gradients, like the first
 * layer of an MLP, would otherwise keep all of them until then). Smaller messages than that
 * would cost more in per-message latency than they hide, and every block repacks the layer's
 * input for its GEMM, hence few. The blocks depend on the shape alone, so the gradients are the
 * same whatever the buckets (and whether anyone listens): each row is one GEMM call's output.
 * On one rank (s->whole_grads) nothing waits for the blocks, and the weight gradient is one
 * product: in 4 blocks the MLP's 784 -> 256 layer took about half as long again. */
enum { GRAD_BLOCK = 32768, GRAD_BLOCKS = 4 };

static int grad_rows(const mgt_layer *l, const mgt_ops *o) {
    if (!o->dense_bwd_rows)
        return 0;
    const int64_t out = l->out.c, in = l->in.c;
    int64_t blocks = out * in / GRAD_BLOCK;
    blocks = blocks < GRAD_BLOCKS ? blocks : GRAD_BLOCKS;
    if (blocks < 2)
        return 0;
    const int64_t rows = ((out + blocks - 1) / blocks + 15) / 16 * 16;
    return rows < out ? (int)rows : 0;
}

/* The gradient of the layer's own ReLU applied with the bias gradient's sums, in one pass over
 * dy (dense_bias_grad), where the backend has it. */
static int applies_act_grad(const mgt_model *m, const mgt_layer *l, const mgt_backend *be) {
    return !m->no_fusion && be->ops->dense_bias_grad && l->act == MGT_ACT_RELU &&
           !l->fused_act && !l->relu_grad_by_reader;
}

/* The gradient of the ReLU before it (its input's) applied to dx as its lanes write it
 * (dense_bwd_x_relu; fuse.c: mgt_fuse_relu_grads), where the backend has it. */
static int takes_x_relu(const mgt_layer *l, const mgt_backend *be) {
    (void)l;
    return be->ops->dense_bwd_x_relu != NULL;
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                     const float *y, float *dy, float *dx) {
    const mgt_ops *o = s->be->ops;
    void (*const bwd)(mgt_backend *, int, int, int, const float *, const float *, const float *,
                      float *, float *, float *) =
        l->x_relu_grad ? o->dense_bwd_x_relu : o->dense_bwd;
    const int n = s->n, in = l->in.c, out = l->out.c;
    const int rows = s->whole_grads || l->frozen ? 0 : grad_rows(l, o);
    float *w = mgt_w(m, l, 0), *gw = mgt_g(m, l, 0), *gb = mgt_g(m, l, 1);
    /* dense_bias_grad first where fusion is on: the ReLU's gradient (if the layer applies it)
     * and the bias's sums in one pass over dy; dense_bwd then sums nothing */
    if (!m->no_fusion && o->dense_bias_grad) {
        const float *mask = applies_act_grad(m, l, s->be) ? y : NULL;
        if (mask || gb)
            o->dense_bias_grad(s->be, n, out, mask, dy, gb);
        if (gb && rows)
            mgt_step_grads_part(s, l, (size_t)(gb - m->g), (size_t)out);
        gb = NULL;
    }
    if (!rows) {
        bwd(s->be, n, in, out, x, w, dy, dx, gw, gb);
        return;
    }
    /* The bias, then the weight's row blocks from the last: their order in the arena from the
     * top (model.h: grads_ready), each handed over as written; dx after them. */
    if (gb) {
        o->dense_bwd(s->be, n, in, out, x, w, dy, NULL, NULL, gb);
        mgt_step_grads_part(s, l, (size_t)(gb - m->g), (size_t)out);
    }
    for (int hi = out; hi > 0;) {
        const int lo = (hi - 1) / rows * rows;
        o->dense_bwd_rows(s->be, n, in, out, lo, hi, x, dy, gw);
        mgt_step_grads_part(s, l, (size_t)(gw - m->g) + (size_t)lo * in, (size_t)(hi - lo) * in);
        hi = lo;
    }
    if (dx)
        bwd(s->be, n, in, out, x, w, dy, dx, NULL, NULL);
}

/* Gemm(x, W, b) with W's [out][in] transposed: ONNX's Linear. */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const mgt_onnx_attr t = {.name = "transB", .kind = MGT_ONNX_INT, .i = 1};
    const char *in[3] = {mgt_onnx_input2(x, m, l, 0), mgt_onnx_param(x, m, l, 0),
                         l->param[1] >= 0 ? mgt_onnx_param(x, m, l, 1) : NULL};
    x->out_rank = 2;
    if (!in[1] || (l->param[1] >= 0 && !in[2]) ||
        mgt_onnx_node(x->g, "Gemm", in, in[2] ? 3 : 2, x->out, &t, 1) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

const mgt_layer_type mgt_layer_dense = {
    .name = "dense", .keys = keys, .required = required, .has_act = 1, .defaults = defaults,
    .set = set, .build = build, .forward = forward, .backward = backward,
    .applies_act = applies_act, .applies_act_grad = applies_act_grad,
    .takes_x_relu = takes_x_relu, .grad_rows = grad_rows, .bwd_reads = MGT_BWD_READS_X,
    .onnx = onnx,
};
