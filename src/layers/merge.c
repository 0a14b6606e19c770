/* merge.c: the layers that join branches of the graph, with Keras' semantics.
 *
 *   [add]     inputs = A, B, ...   the elementwise sum of equal-shaped inputs (a residual
 *                                  connection); backward hands dy to every input;
 *   [concat]  inputs = A, B, ...   the inputs side by side along the channels, in the order
 *                                  listed (Keras' Concatenate(axis=-1), PyTorch's torch.cat on
 *                                  dim 1); backward hands each input its slice of dy.
 * Both accept activation = (applied to the result, e.g. the ReLU after a residual sum). A
 * gradient that an input already holds from another of its consumers is added to, not
 * overwritten (accumulate). */
#include <stdio.h>
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static int no_keys(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)l, (void)key, (void)v;
    return mgt_errf(err, "takes no settings");
}

static void shape_text(mgt_shape s, char *buf, size_t n) {
    snprintf(buf, n, "(%d, %d, %d)", s.h, s.w, s.c);
}

static const char *input_name(const mgt_model *m, const mgt_layer *l, int k) {
    return l->inputs[k] < 0 ? "input" : m->layers[l->inputs[k]].name;
}

/* "inputs A (shape) and B (shape) <why>": input 0 against input k. */
static int mismatch(const mgt_model *m, const mgt_layer *l, int k, const char *why, mgt_err *err) {
    char sa[48], sb[48];
    shape_text(mgt_layer_input_shape(m, l, 0), sa, sizeof sa);
    shape_text(mgt_layer_input_shape(m, l, k), sb, sizeof sb);
    return mgt_errf(err, "inputs %s %s and %s %s %s", input_name(m, l, 0), sa, input_name(m, l, k),
                    sb, why);
}

static int add_build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    for (int k = 1; k < l->ninputs; k++) {
        const mgt_shape a = mgt_layer_input_shape(m, l, 0), b = mgt_layer_input_shape(m, l, k);
        if (a.h != b.h || a.w != b.w || a.c != b.c)
            return mismatch(m, l, k,
                            "differ in shape; add needs equal shapes: make the branches agree "
                            "(e.g. a 1x1 [conv2d] with the filters and stride of the other "
                            "branch on the shortcut)",
                            err);
    }
    l->out = l->in;
    return 0;
}

static void add_fwd(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *const *x,
                    float *y) {
    (void)m;
    const size_t count = (size_t)s->n * (size_t)mgt_shape_elems(l->out);
    s->be->ops->add2(s->be, count, x[0], x[1], y);
    for (int k = 2; k < l->ninputs; k++)
        s->be->ops->add2(s->be, count, y, x[k], y);
}

static void add_bwd(mgt_model *m, mgt_layer *l, const mgt_step *s, float *dy, float *const *dx,
                    const int *accumulate) {
    (void)m;
    const int row = (int)mgt_shape_elems(l->out);
    for (int k = 0; k < l->ninputs; k++) /* dx = dy, or dx += dy: MGT_ACT_NONE's gradient */
        if (dx[k] && dx[k] != dy)        /* not the planner giving dy's memory to this input */
            s->be->ops->act_bwd(s->be, MGT_ACT_NONE, s->n, row, NULL, dy, dx[k], accumulate[k]);
}

/* Column `at` of an activation matrix (values of the backend's type, backend.h). */
static float *act_col(const mgt_step *s, float *base, int at) {
    return (float *)((char *)base + (size_t)at * mgt_dtype_size(s->be->act));
}

static int concat_build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    int c = 0;
    for (int k = 0; k < l->ninputs; k++) {
        const mgt_shape a = mgt_layer_input_shape(m, l, 0), b = mgt_layer_input_shape(m, l, k);
        if (a.h != b.h || a.w != b.w)
            return mismatch(m, l, k,
                            "differ in height or width; concat joins along the channels and "
                            "needs the same H and W: pool, stride or pad the branches to one "
                            "size",
                            err);
        c += b.c;
    }
    l->out = (mgt_shape){l->in.h, l->in.w, c, l->in.seq};
    return 0;
}

static void concat_fwd(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *const *x,
                       float *y) {
    const size_t rows = (size_t)s->n * (size_t)l->out.h * (size_t)l->out.w;
    int at = 0;
    for (int k = 0; k < l->ninputs; k++) {
        const int c = mgt_layer_input_shape(m, l, k).c;
        s->be->ops->copy_cols(s->be, rows, c, x[k], c, act_col(s, y, at), l->out.c, 0);
        at += c;
    }
}

static void concat_bwd(mgt_model *m, mgt_layer *l, const mgt_step *s, float *dy, float *const *dx,
                       const int *accumulate) {
    const size_t rows = (size_t)s->n * (size_t)l->out.h * (size_t)l->out.w;
    int at = 0;
    for (int k = 0; k < l->ninputs; k++) {
        const int c = mgt_layer_input_shape(m, l, k).c;
        if (dx[k])
            s->be->ops->copy_cols(s->be, rows, c, act_col(s, dy, at), l->out.c, dx[k], c,
                                  accumulate[k]);
        at += c;
    }
}

/* Sum or Concat (along the channels) of the inputs, all at one rank: 4-D if any is; sequences'
 * [batch, T, C] as they are. */
static int merge_onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, const char *op,
                      mgt_err *err) {
    int rank = 2;
    for (int k = 0; k < l->ninputs; k++)
        rank = x->in_rank[k] > rank ? x->in_rank[k] : rank;
    /* each input's name is copied into the node as it is written, but the helpers' names are
     * reused after four: kept here */
    char names[MGT_MAX_INPUTS][192];
    const char *in[MGT_MAX_INPUTS];
    for (int k = 0; k < l->ninputs; k++) {
        snprintf(names[k], sizeof names[k], "%s",
                 rank == 3   ? x->in[k] /* sequences: every input is one, [batch, T, C] */
                 : rank == 4 ? mgt_onnx_input4(x, m, l, k)
                             : mgt_onnx_input2(x, m, l, k));
        in[k] = names[k];
    }
    const mgt_onnx_attr a = {.name = "axis", .kind = MGT_ONNX_INT, .i = rank == 3 ? 2 : 1};
    x->out_rank = rank;
    if (mgt_onnx_node(x->g, op, in, l->ninputs, x->out, &a, op[0] == 'C') < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

static int add_onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    return merge_onnx(x, m, l, "Sum", err);
}

static int concat_onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    return merge_onnx(x, m, l, "Concat", err);
}

const mgt_layer_type mgt_layer_add = {
    .name = "add",
    .has_act = 1,
    .residual_sum = 1,
    .set = no_keys,
    .build = add_build,
    .merge = 1,
    .forward_n = add_fwd,
    .backward_n = add_bwd,
    .onnx = add_onnx,
};

const mgt_layer_type mgt_layer_concat = {
    .name = "concat",
    .has_act = 1,
    .set = no_keys,
    .build = concat_build,
    .merge = 1,
    .forward_n = concat_fwd,
    .backward_n = concat_bwd,
    .onnx = concat_onnx,
};
