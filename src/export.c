/* export.c: a trained model as an ONNX file (see export.h). */
#include "export.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mgt_onnx_name(mgt_onnx_layer *x, const char *suffix) {
    if (x->ntmp == 4)
        x->ntmp = 0; /* the oldest is done with by now: a layer keeps at most four alive */
    char *t = x->tmp[x->ntmp++];
    snprintf(t, sizeof x->tmp[0], "%s/%s", x->out, suffix);
    return t;
}

/* Input k reshaped to the rank asked for: [batch, C, 1, 1] from [batch, C] or back (mgtrain
 * takes a 1x1xC value for flat where its layers allow it). */
static const char *input_as(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int k,
                            int rank) {
    if (x->in_rank[k] == rank)
        return x->in[k];
    const mgt_shape s = mgt_layer_input_shape(m, l, k);
    char suffix[32];
    snprintf(suffix, sizeof suffix, "in%d_%dd", k, rank);
    const char *name = mgt_onnx_name(x, suffix);
    char shape_name[224];
    snprintf(shape_name, sizeof shape_name, "%s/shape", name);
    const int64_t dims4[4] = {0, s.c * s.h * s.w, 1, 1}, dims2[2] = {0, s.c * s.h * s.w};
    const int64_t n = rank;
    if (rank == 2 && (s.h != 1 || s.w != 1)) { /* a flat view of an image: not a reshape */
        const mgt_onnx_attr a = {.name = "axis", .kind = MGT_ONNX_INT, .i = 1};
        mgt_onnx_node(x->g, "Flatten", &x->in[k], 1, name, &a, 1);
        return name;
    }
    mgt_onnx_init_i64(x->g, shape_name, rank == 4 ? dims4 : dims2, 1, &n);
    const char *in[2] = {x->in[k], shape_name};
    mgt_onnx_node(x->g, "Reshape", in, 2, name, NULL, 0);
    return name;
}

const char *mgt_onnx_input4(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int k) {
    return input_as(x, m, l, k, 4);
}

const char *mgt_onnx_input2(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int k) {
    return input_as(x, m, l, k, 2);
}

const char *mgt_onnx_param(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int i) {
    const mgt_param *p = &m->params[l->param[i]];
    return mgt_onnx_init_f32(x->g, p->name, x->w + p->offset, p->ndim, p->shape) < 0 ? NULL
                                                                                     : p->name;
}

int mgt_onnx_conv_params(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int wi, int bi,
                         const char **wn, const char **bn) {
    const mgt_param *p = &m->params[l->param[wi]];
    const int has_bias = bi >= 0 && l->param[bi] >= 0;
    *bn = NULL;
    if (!x->fold_scale) {
        *wn = mgt_onnx_param(x, m, l, wi);
        if (has_bias)
            *bn = mgt_onnx_param(x, m, l, bi);
        return *wn && (!has_bias || *bn) ? 0 : -1;
    }
    /* folded: W[c] * scale[c], (b[c] or 0) * scale[c] + shift[c] */
    const int64_t oc = p->shape[0];
    const size_t per = p->count / (size_t)oc;
    float *fw = malloc(sizeof *fw * p->count), *fb = malloc(sizeof *fb * (size_t)oc);
    int rc = fw && fb ? 0 : -1;
    const float *src = x->w + p->offset;
    const float *b = has_bias ? x->w + m->params[l->param[bi]].offset : NULL;
    for (int64_t c = 0; !rc && c < oc; c++) {
        for (size_t j = 0; j < per; j++)
            fw[(size_t)c * per + j] = src[(size_t)c * per + j] * x->fold_scale[c];
        fb[c] = (b ? b[c] : 0.0f) * x->fold_scale[c] + x->fold_shift[c];
    }
    *wn = mgt_onnx_name(x, "folded_weight");
    *bn = mgt_onnx_name(x, "folded_bias");
    if (!rc)
        rc = mgt_onnx_init_f32(x->g, *wn, fw, p->ndim, p->shape) |
             mgt_onnx_init_f32(x->g, *bn, fb, 1, &oc);
    free(fw);
    free(fb);
    return rc;
}

int mgt_onnx_conv_node(mgt_onnx_layer *x, const char *in, const char *wn, const char *bn,
                       const mgt_conv_shape *s, int group, const char *out) {
    /* mgtrain's padding: pad_top and pad_left, and what the last window needs below and right */
    const int64_t bottom = (int64_t)(s->oh - 1) * s->stride + s->kh - s->h - s->pad_top;
    const int64_t right = (int64_t)(s->ow - 1) * s->stride + s->kw - s->w - s->pad_left;
    const int64_t k[2] = {s->kh, s->kw}, st[2] = {s->stride, s->stride};
    const int64_t pads[4] = {s->pad_top, s->pad_left, bottom > 0 ? bottom : 0,
                             right > 0 ? right : 0};
    const mgt_onnx_attr a[4] = {
        {.name = "kernel_shape", .kind = MGT_ONNX_INTS, .ints = k, .nints = 2},
        {.name = "strides", .kind = MGT_ONNX_INTS, .ints = st, .nints = 2},
        {.name = "pads", .kind = MGT_ONNX_INTS, .ints = pads, .nints = 4},
        {.name = "group", .kind = MGT_ONNX_INT, .i = group}};
    const char *in3[3] = {in, wn, bn};
    x->out_rank = 4;
    return mgt_onnx_node(x->g, "Conv", in3, bn ? 3 : 2, out, a, 4);
}

/* ---- batchnorm folding ---- */

/* The batchnorm that layer i's output feeds alone, with no activation between, where i is a
 * convolution that can take it into its weights; else -1. */
static int folds_into(const mgt_model *m, int i) {
    const mgt_layer *c = &m->layers[i];
    const char *t = c->type->name;
    if (strcmp(t, "conv2d") && strcmp(t, "separable_conv2d") && strcmp(t, "depthwise_conv2d"))
        return -1;
    if (c->act != MGT_ACT_NONE || c->consumers != 1)
        return -1;
    for (int j = i + 1; j < m->nlayers; j++) {
        const mgt_layer *b = &m->layers[j];
        for (int k = 0; k < b->ninputs; k++)
            if (b->inputs[k] == i)
                return b->type->forward_fused && b->ninputs == 1 ? j : -1;
    }
    return -1;
}

/* The per-channel scale gamma / sqrt(var + eps) and shift beta - mean * scale of batchnorm b, in
 * double then rounded (the same formula as its inference pass, applied once to the weights). */
static void bn_affine(const mgt_model *m, const float *w, const float *buf, const mgt_layer *b,
                      float *scale, float *shift) {
    const float *gamma = w + m->params[b->param[0]].offset,
                *beta = w + m->params[b->param[1]].offset;
    const float *mean = buf + m->buffers[b->buffer[0]].offset;
    const float *var = buf + m->buffers[b->buffer[1]].offset;
    for (int c = 0; c < b->in.c; c++) {
        const double s = (double)gamma[c] / sqrt((double)var[c] + (double)b->cfg.epsilon);
        scale[c] = (float)s;
        shift[c] = (float)((double)beta[c] - (double)mean[c] * s);
    }
}

/* ---- the graph ---- */

static const char *act_op(mgt_act a) {
    switch (a) {
    case MGT_ACT_RELU:
        return "Relu";
    case MGT_ACT_SIGMOID:
        return "Sigmoid";
    case MGT_ACT_TANH:
        return "Tanh";
    case MGT_ACT_SOFTMAX:
        return "Softmax";
    case MGT_ACT_GELU:
    case MGT_ACT_GELU_TANH:
        return "Gelu";
    default:
        return NULL;
    }
}

/* The model's input: NHWC to NCHW (rows of values, [input] shape = F: [batch, F] as they are),
 * normalised as [input] says. Its value name into name. */
static int input_nodes(mgt_onnx *g, const mgt_model *m, char *name, size_t n, int *rank) {
    if (m->vocab > 0) { /* token ids, [batch, sequence]: the embedding reads them */
        const int64_t ids[2] = {-1, -2};
        snprintf(name, n, "input");
        *rank = 2;
        return mgt_onnx_input_ids(g, "input", 2, ids);
    }
    const int rows = m->input_rank == 1;
    if (rows) {
        const int64_t in[2] = {-1, m->input.c};
        mgt_onnx_input(g, "input", 2, in);
        snprintf(name, n, "input");
        *rank = 2;
    } else {
        const int64_t in[4] = {-1, m->input.h, m->input.w, m->input.c};
        mgt_onnx_input(g, "input", 4, in);
        const int64_t perm[4] = {0, 3, 1, 2};
        const mgt_onnx_attr a = {.name = "perm", .kind = MGT_ONNX_INTS, .ints = perm, .nints = 4};
        const char *x = "input";
        mgt_onnx_node(g, "Transpose", &x, 1, "input/nchw", &a, 1);
        snprintf(name, n, "input/nchw");
        *rank = 4;
    }
    const mgt_input_tf *tf = &m->input_tf;
    if (!tf->norm)
        return 0;
    const int c = m->input.c;
    float mean[MGT_NORM_MAX_C], sd[MGT_NORM_MAX_C];
    for (int k = 0; k < c && k < MGT_NORM_MAX_C; k++) {
        mean[k] = tf->mean[tf->nvalues == 1 ? 0 : k];
        sd[k] = tf->std[tf->nvalues == 1 ? 0 : k];
    }
    if (c > MGT_NORM_MAX_C)
        return -1;
    const int64_t d[4] = {1, c, 1, 1};
    mgt_onnx_init_f32(g, "input/mean", mean, rows ? 2 : 4, d);
    mgt_onnx_init_f32(g, "input/std", sd, rows ? 2 : 4, d);
    const char *s[2] = {rows ? "input" : "input/nchw", "input/mean"},
               *q[2] = {"input/centred", "input/std"};
    mgt_onnx_node(g, "Sub", s, 2, "input/centred", NULL, 0);
    mgt_onnx_node(g, "Div", q, 2, "input/normalised", NULL, 0);
    snprintf(name, n, "input/normalised");
    return 0;
}

const char *mgt_export_output_kind(const mgt_model *m) {
    const mgt_act a = m->layers[m->nlayers - 1].act;
    if (mgt_loss_is_regression(m->loss))
        return "values";
    return a == MGT_ACT_SOFTMAX   ? "softmax probabilities"
           : a == MGT_ACT_SIGMOID ? "sigmoid probabilities"
                                  : "logits";
}

int mgt_export_onnx(const mgt_model *m, const float *w, const float *buf, const mgt_export_opts *o,
                    const char *path, mgt_err *err) {
    const int L = m->nlayers;
    for (int i = 0; i < L; i++)
        if (!m->layers[i].type->onnx && !m->layers[i].type->identity)
            return mgt_errf(err,
                            "%s:%d: [%s] %s: layer type %s has no ONNX export yet; the model "
                            "cannot be exported",
                            m->path, m->layers[i].line, m->layers[i].type->name, m->layers[i].name,
                            m->layers[i].type->name);
    mgt_onnx *g = mgt_onnx_new(m->name);
    char(*names)[160] = calloc((size_t)L + 1, sizeof *names);
    int *rank = calloc((size_t)L + 1, sizeof *rank), *fold = calloc((size_t)L + 1, sizeof *fold);
    int maxc = 1;
    for (int i = 0; i < L; i++)
        maxc = m->layers[i].out.c > maxc ? m->layers[i].out.c : maxc;
    float *scale = malloc(sizeof *scale * (size_t)maxc),
          *shift = malloc(sizeof *shift * (size_t)maxc);
    char input[160];
    int input_rank = 4, rc = 0;
    if (!g || !names || !rank || !fold || !scale || !shift) {
        rc = mgt_errf(err, "out of host memory exporting %s", m->name);
        goto out;
    }
    if (input_nodes(g, m, input, sizeof input, &input_rank) < 0) {
        rc = mgt_errf(err, "%s: [input] has more channels than mean and std may describe", m->path);
        goto out;
    }
    for (int i = 0; i < L; i++)
        fold[i] = o->keep_bn ? -1 : folds_into(m, i);
    for (int i = 0; i < L && !rc; i++) {
        const mgt_layer *l = &m->layers[i];
        mgt_onnx_layer x = {.g = g, .w = w, .buf = buf, .ninputs = l->ninputs, .alias = -1};
        for (int k = 0; k < l->ninputs; k++) {
            const int j = l->inputs[k];
            x.in[k] = j < 0 ? input : names[j];
            x.in_rank[k] = j < 0 ? input_rank : rank[j];
        }
        snprintf(x.out, sizeof x.out, "%s", l->name);
        x.out_rank = x.in_rank[0];
        const int folded_bn =
            i > 0 && l->ninputs == 1 && l->inputs[0] >= 0 && fold[l->inputs[0]] == i;
        if (fold[i] >= 0) {
            bn_affine(m, w, buf, &m->layers[fold[i]], scale, shift);
            x.fold_scale = scale;
            x.fold_shift = shift;
        }
        const mgt_act act = l->act;
        const char *op = act_op(act);
        /* The layer's own op into its name, or into "<name>/pre" when an activation follows. */
        if (op && !l->type->identity)
            snprintf(x.out, sizeof x.out, "%s/pre", l->name);
        if (folded_bn)
            x.alias = 0;
        else if (l->type->identity)
            x.alias = 0;
        else if (l->type->onnx(&x, m, l, err) < 0)
            rc = -1;
        const char *own = x.alias >= 0 ? x.in[x.alias] : x.out;
        const int r = x.alias >= 0 ? x.in_rank[x.alias] : x.out_rank;
        if (!op || rc) {
            snprintf(names[i], sizeof names[i], "%s", own);
            rank[i] = r;
            continue;
        }
        /* softmax over the channels: axis 1 of NCHW and of [batch, C], the last of a sequence's */
        const mgt_onnx_attr axis = {.name = "axis", .kind = MGT_ONNX_INT, .i = r == 3 ? 2 : 1};
        const mgt_onnx_attr approx = {.name = "approximate",
                                      .kind = MGT_ONNX_STRING,
                                      .s = act == MGT_ACT_GELU_TANH ? "tanh" : "none"};
        const int gelu = act == MGT_ACT_GELU || act == MGT_ACT_GELU_TANH;
        mgt_onnx_node(g, op, &own, 1, l->name, gelu ? &approx : &axis,
                      act == MGT_ACT_SOFTMAX || gelu);
        snprintf(names[i], sizeof names[i], "%s", l->name);
        rank[i] = r;
    }
    if (rc)
        goto out;
    /* The output: the last layer's value, flat. */
    const char *y = names[L - 1];
    const mgt_onnx_attr flat = {.name = "axis", .kind = MGT_ONNX_INT, .i = 1};
    const int as_is = rank[L - 1] != 4; /* [batch, C], or a sequence's [batch, T, C] */
    mgt_onnx_node(g, as_is ? "Identity" : "Flatten", &y, 1, "output", &flat, !as_is);
    const int64_t od[2] = {-1, m->classes}, os[3] = {-1, -2, m->classes};
    if (rank[L - 1] == 3)
        mgt_onnx_output(g, "output", 3, os);
    else
        mgt_onnx_output(g, "output", 2, od);
    char doc[1024], in[96];
    if (m->vocab > 0)
        snprintf(in, sizeof in, "int64 token ids [batch, sequence <= %d] below %d", m->input.w,
                 m->vocab);
    else if (m->input_rank == 1)
        snprintf(in, sizeof in, "[batch, %d]", m->input.c);
    else
        snprintf(in, sizeof in, "[batch, %d, %d, %d] (NHWC)", m->input.h, m->input.w, m->input.c);
    snprintf(doc, sizeof doc, "mgtrain model %s (%s): input %s%s%s; output [batch, %s%d] (%s)",
             m->name, m->path, m->vocab > 0 ? "" : "float32 ", in,
             m->input_tf.norm ? ", normalised inside the graph" : "",
             rank[L - 1] == 3 ? "sequence, " : "", m->classes, mgt_export_output_kind(m));
    rc = mgt_onnx_write(g, path, "mgtrain", o->version, doc, err);
out:
    mgt_onnx_free(g);
    free(names);
    free(rank);
    free(fold);
    free(scale);
    free(shift);
    return rc ? -1 : 0;
}
