/* dense.c: y = x W^T + b, W in PyTorch's [out][in] layout. Needs a flat input, or a sequence
 * (T, C), where it applies to every position: one GEMM over the batch's n * T rows (Keras' Dense
 * on the last axis, llm.c's matmul).
 *
 * Keys beyond units and use_bias:
 *   weight_layout = in_out  W stored [in][out], y = x W + b: Hugging Face's Conv1D, the layout
 *                           of GPT-2's c_attn, c_proj and c_fc (so its tensors load as they are);
 *   tied = NAME             the layer's weight is the tensor NAME of a layer above it, of shape
 *                           [units][in] (an output layer tied to the token embedding: tied =
 *                           transformer.wte.weight, GPT-2's lm_head), and the layer has no
 *                           weight of its own (model.h: tied);
 *   init_std = 0.02         a normal initial weight of that deviation instead of Glorot's;
 *   activation = gelu | gelu_tanh: the product before the GELU is kept for backward (the
 *                           layer's saved memory), as the GELU's gradient needs it. */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"units", "use_bias", "weight_layout", "tied", "init_std", NULL};
static const char *const required[] = {"units", NULL};

static void defaults(mgt_layer *l) {
    l->cfg.bias = 1;
}

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "units"))
        return mgt_set_pos_int(v, &l->cfg.units, err);
    if (!strcmp(key, "weight_layout")) {
        if (strcmp(v, "out_in") && strcmp(v, "in_out"))
            return mgt_errf(err, "expected out_in (PyTorch's Linear, the default) or in_out "
                                 "(Hugging Face's Conv1D, GPT-2's)");
        l->cfg.w_in_out = !strcmp(v, "in_out");
        return 0;
    }
    if (!strcmp(key, "tied")) {
        if (strlen(v) >= sizeof l->tied_name)
            return mgt_errf(err, "the tensor's name is too long");
        snprintf(l->tied_name, sizeof l->tied_name, "%s", v);
        return 0;
    }
    if (!strcmp(key, "init_std")) {
        if (mgt_parse_float(v, &l->cfg.init_std) < 0 || !(l->cfg.init_std > 0) ||
            l->cfg.init_std > 1)
            return mgt_errf(err, "expected a deviation in (0, 1], e.g. init_std = 0.02");
        return 0;
    }
    return mgt_set_bool(v, &l->cfg.bias, err);
}

/* tied = NAME: the tensor of a layer above, [units][in]. */
static int find_tied(mgt_model *m, mgt_layer *l, int in, mgt_err *err) {
    int at = -1;
    for (int i = 0; i < m->nparams && at < 0; i++)
        if (!strcmp(m->params[i].name, l->tied_name))
            at = i;
    if (at < 0)
        return mgt_errf(err,
                        "tied = %s: no layer above it has that tensor; name one as the weights "
                        "file does, e.g. tied = transformer.wte.weight",
                        l->tied_name);
    const mgt_param *p = &m->params[at];
    if (l->cfg.w_in_out || p->ndim != 2 || p->shape[1] != in || p->shape[0] != l->cfg.units)
        return mgt_errf(err,
                        "tied = %s: a tensor of shape [%lld, %lld] cannot be the [%d, %d] "
                        "[units][in] weight of this layer (weight_layout = out_in)",
                        l->tied_name, (long long)p->shape[0],
                        (long long)(p->ndim > 1 ? p->shape[1] : 1), l->cfg.units, in);
    l->tied = at;
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    if (!l->in.seq && (l->in.h != 1 || l->in.w != 1))
        return mgt_errf(err,
                        "needs a flat input but gets %dx%dx%d per sample; put a [flatten] "
                        "section before it",
                        l->in.h, l->in.w, l->in.c);
    const int in = l->in.c;
    if (l->tied_name[0] && find_tied(m, l, in, err) < 0)
        return -1;
    const int out = l->cfg.units;
    l->out = l->in.seq ? (mgt_shape){1, l->in.w, out, 1} : (mgt_shape){1, 1, out, 0};
    int64_t ws[2] = {out, in}, bs[1] = {out};
    if (l->cfg.w_in_out)
        ws[0] = in, ws[1] = out;
    const int init = l->cfg.init_std > 0 ? MGT_INIT_NORMAL : MGT_INIT_GLOROT;
    if (l->tied < 0) {
        l->param[0] = mgt_model_add_param(m, l, "weight", 2, ws, init, (float)in, (float)out, err);
        if (l->param[0] < 0)
            return -1;
        m->params[l->param[0]].std = l->cfg.init_std;
    }
    int *b = &l->param[l->tied < 0 ? 1 : 0];
    if (l->cfg.bias &&
        (*b = mgt_model_add_param(m, l, "bias", 1, bs, MGT_INIT_ZERO, 0, 0, err)) < 0)
        return -1;
    return 0;
}

/* The weight and its gradient (a tied layer's: its tensor's), and the bias and its gradient. */
static float *weight(mgt_model *m, const mgt_layer *l) {
    return l->tied >= 0 ? m->w + m->params[l->tied].offset : mgt_w(m, l, 0);
}
static float *weight_grad(mgt_model *m, const mgt_layer *l) {
    if (l->tied >= 0)
        return mgt_layer_trains_tied(m, l) ? m->g + m->params[l->tied].offset : NULL;
    return mgt_g(m, l, 0);
}
static int bias_slot(const mgt_layer *l) {
    return l->tied >= 0 ? 0 : 1;
}

static int gelu(const mgt_layer *l) {
    return mgt_act_bwd_reads_x(l->act) && !l->fused_act;
}

static int alloc(mgt_model *m, mgt_layer *l, int max_batch, mgt_err *err) {
    (void)max_batch;
    const mgt_ops *o = m->be->ops;
    if (l->cfg.w_in_out && (!o->dense_io_fwd || !o->dense_io_bwd))
        return mgt_errf(err,
                        "layer %s: the %s backend has no dense layers with weight_layout = "
                        "in_out yet; train this model with --device cpu",
                        l->name, o->name);
    return 0;
}

/* The product before a GELU, per sample (saved from forward to backward). */
static void temps(const mgt_layer *l, size_t act_bytes, size_t *saved, size_t *work) {
    *saved = gelu(l) ? act_bytes * (size_t)mgt_shape_elems(l->out) : 0;
    *work = 0;
}

static float *pre_of(const mgt_layer *l, const mgt_step *s) {
    return mgt_step_rows(l->saved, s, (size_t)mgt_shape_elems(l->out));
}

/* The layer's own activation where the backend writes it with the product: a ReLU
 * (dense_fwd_relu), a GELU (always: from the product it keeps). */
static int applies_act(const mgt_model *m, const mgt_layer *l, const mgt_backend *be) {
    if (gelu(l))
        return 1;
    return !m->no_fusion && be->ops->dense_fwd_relu && l->act == MGT_ACT_RELU && !l->fused_act &&
           !l->cfg.w_in_out;
}

/* The rows of one GEMM: the samples, or their positions. */
static int rows_of(const mgt_layer *l, const mgt_step *s) {
    return s->n * l->in.h * l->in.w;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    const mgt_ops *o = s->be->ops;
    const int n = rows_of(l, s), in = l->in.c, out = l->out.c;
    const float *w = weight(m, l), *b = mgt_w(m, l, bias_slot(l));
    const mgt_act act = gelu(l) ? l->act : MGT_ACT_NONE;
    float *pre = gelu(l) ? pre_of(l, s) : y;
    if (l->cfg.w_in_out) {
        o->dense_io_fwd(s->be, n, in, out, act, x, w, b, pre, y);
        return;
    }
    const int relu = applies_act(m, l, s->be) && l->act == MGT_ACT_RELU;
    (relu ? o->dense_fwd_relu : o->dense_fwd)(s->be, n, in, out, x, w, b, pre);
    if (act != MGT_ACT_NONE)
        o->act_fwd(s->be, act, n, out, pre, y);
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
 * product: in 4 blocks the MLP's 784 -> 256 layer took about half as long again. A tied weight
 * (whose gradient another layer completes) and an [in][out] one are written whole. */
enum { GRAD_BLOCK = 32768, GRAD_BLOCKS = 4 };

static int grad_rows(const mgt_layer *l, const mgt_ops *o) {
    if (!o->dense_bwd_rows || l->tied >= 0 || l->cfg.w_in_out)
        return 0;
    const int64_t out = l->out.c, in = l->in.c;
    int64_t blocks = out * in / GRAD_BLOCK;
    blocks = blocks < GRAD_BLOCKS ? blocks : GRAD_BLOCKS;
    if (blocks < 2)
        return 0;
    const int64_t rows = ((out + blocks - 1) / blocks + 15) / 16 * 16;
    return rows < out ? (int)rows : 0;
}

/* The gradient of the layer's own activation applied by its backward: a ReLU's with the bias
 * gradient's sums, in one pass over dy (dense_bias_grad), where the backend has it; a GELU's
 * always (from the product it kept). */
static int applies_act_grad(const mgt_model *m, const mgt_layer *l, const mgt_backend *be) {
    if (gelu(l))
        return 1;
    return !m->no_fusion && be->ops->dense_bias_grad && l->act == MGT_ACT_RELU && !l->fused_act &&
           !l->relu_grad_by_reader;
}

/* The gradient of the ReLU before it (its input's) applied to dx as its lanes write it
 * (dense_bwd_x_relu; fuse.c: mgt_fuse_relu_grads), where the backend has it. */
static int takes_x_relu(const mgt_layer *l, const mgt_backend *be) {
    return be->ops->dense_bwd_x_relu != NULL && !l->cfg.w_in_out;
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, const float *y,
                     float *dy, float *dx) {
    const mgt_ops *o = s->be->ops;
    void (*const bwd)(mgt_backend *, int, int, int, const float *, const float *, const float *,
                      float *, float *, float *) = l->cfg.w_in_out  ? o->dense_io_bwd
                                                   : l->x_relu_grad ? o->dense_bwd_x_relu
                                                                    : o->dense_bwd;
    const int n = rows_of(l, s), in = l->in.c, out = l->out.c;
    const int rows = s->whole_grads || l->frozen ? 0 : grad_rows(l, o);
    float *w = weight(m, l), *gw = weight_grad(m, l), *gb = mgt_g(m, l, bias_slot(l));
    if (gelu(l)) /* dy = dy * GELU'(pre), in place */
        o->act_bwd(s->be, l->act, n, out, pre_of(l, s), dy, dy, 0);
    /* dense_bias_grad first where fusion is on: the ReLU's gradient (if the layer applies it)
     * and the bias's sums in one pass over dy; dense_bwd then sums nothing */
    if (!m->no_fusion && o->dense_bias_grad) {
        const float *mask = applies_act_grad(m, l, s->be) && !gelu(l) ? y : NULL;
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

/* Gemm(x, W, b), W's [out][in] transposed (ONNX's Linear) or an [in][out] weight as it is; on a
 * sequence, MatMul([batch, T, in], [in, out]) and the bias added. A tied layer's weight is the
 * other layer's tensor, already in the graph under its name (written as the layer that owns it
 * was). */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const int bs = bias_slot(l);
    const char *w = l->tied >= 0 ? m->params[l->tied].name : mgt_onnx_param(x, m, l, 0);
    const char *b = l->param[bs] >= 0 ? mgt_onnx_param(x, m, l, bs) : NULL;
    int rc = !w || (l->param[bs] >= 0 && !b);
    if (!l->in.seq) {
        const mgt_onnx_attr t = {.name = "transB", .kind = MGT_ONNX_INT, .i = !l->cfg.w_in_out};
        const char *in[3] = {mgt_onnx_input2(x, m, l, 0), w, b};
        x->out_rank = 2;
        rc |= mgt_onnx_node(x->g, "Gemm", in, b ? 3 : 2, x->out, &t, 1) < 0;
        return rc ? mgt_errf(err, "out of host memory exporting %s", l->name) : 0;
    }
    char wt[192], prod[192];
    snprintf(wt, sizeof wt, "%s/weight_in_out", x->out);
    snprintf(prod, sizeof prod, "%s/matmul", x->out);
    const int64_t perm[2] = {1, 0};
    const mgt_onnx_attr t = {.name = "perm", .kind = MGT_ONNX_INTS, .ints = perm, .nints = 2};
    if (!l->cfg.w_in_out) /* [out][in]: its transpose */
        rc |= mgt_onnx_node(x->g, "Transpose", &w, 1, wt, &t, 1) < 0;
    const char *mm[2] = {x->in[0], l->cfg.w_in_out ? w : wt}, *add[2] = {prod, b};
    x->out_rank = 3;
    rc |= mgt_onnx_node(x->g, "MatMul", mm, 2, b ? prod : x->out, NULL, 0) < 0 ||
          (b && mgt_onnx_node(x->g, "Add", add, 2, x->out, NULL, 0) < 0);
    return rc ? mgt_errf(err, "out of host memory exporting %s", l->name) : 0;
}

const mgt_layer_type mgt_layer_dense = {
    .name = "dense",
    .keys = keys,
    .required = required,
    .has_act = 1,
    .defaults = defaults,
    .set = set,
    .build = build,
    .alloc = alloc,
    .temps = temps,
    .forward = forward,
    .backward = backward,
    .applies_act = applies_act,
    .applies_act_grad = applies_act_grad,
    .takes_x_relu = takes_x_relu,
    .grad_rows = grad_rows,
    .bwd_reads = MGT_BWD_READS_X,
    .onnx = onnx,
};
