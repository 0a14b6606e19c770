/* attention.c: [attention], multi-head self-attention on the fused projection before it, as
 * GPT-2 has it: the layer before (a [dense] of 3c units, GPT-2's attn.c_attn) gives each
 * position its queries, keys and values side by side, (T, 3c), and this layer gives (T, c), each
 * head's softmax(q k^T / sqrt(d)) v in its d = c / heads channels; the output projection is the
 * [dense] after it (attn.c_proj). It has no tensors of its own.
 *
 *   [attention]
 *   heads = 12
 *   causal = true      ; position i attends to positions 0 .. i (the default); false: to all
 *   dropout = 0.1      ; on the attention weights in training (GPT-2's attn_pdrop)
 *
 * backend.h (attn_fwd) says how: the weights are never stored, each query's log-sum-exp is
 * (saved memory, heads floats a position), and backward recomputes them block by block. The
 * dropout mask is regenerated from (seed, layer, step) and each weight's place in the global
 * batch, so it is the same on any number of ranks. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"heads", "causal", "dropout", NULL};
static const char *const required[] = {"heads", NULL};

static void defaults(mgt_layer *l) {
    l->cfg.causal = 1;
}

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "heads"))
        return mgt_set_pos_int(v, &l->cfg.heads, err);
    if (!strcmp(key, "causal"))
        return mgt_set_bool(v, &l->cfg.causal, err);
    float x;
    if (mgt_parse_float(v, &x) < 0 || x < 0 || x >= 1)
        return mgt_errf(err, "expected a fraction in [0, 1), e.g. dropout = 0.1");
    l->cfg.rate = x;
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m;
    const int c3 = l->in.c, heads = l->cfg.heads;
    if (!l->in.seq)
        return mgt_errf(err, "needs a sequence (T, 3C) from a [dense] of 3C units on the "
                             "output of an [embedding] block, not an image");
    if (c3 % 3 || (c3 / 3) % heads)
        return mgt_errf(err,
                        "gets %d channels a position: it needs the queries, keys and values side "
                        "by side (3C, from a [dense] of 3C units), with C a multiple of heads = "
                        "%d",
                        c3, heads);
    l->out = (mgt_shape){1, l->in.w, c3 / 3, 1};
    return 0;
}

static mgt_attn_shape shape_of(const mgt_layer *l, const mgt_step *s) {
    mgt_attn_shape a = {.n = s ? s->n : 0,
                        .t = l->out.w,
                        .c = l->out.c,
                        .heads = l->cfg.heads,
                        .causal = l->cfg.causal};
    if (s && s->training && l->cfg.rate > 0) {
        a.rate = l->cfg.rate;
        a.key = mgt_key3(s->seed, 0x41545444ULL /* "ATTD" */ + (uint64_t)l->index,
                         (uint64_t)s->global_step);
        a.first_sample = (uint64_t)s->first_sample;
    }
    return a;
}

static int alloc(mgt_model *m, mgt_layer *l, int max_batch, mgt_err *err) {
    (void)max_batch;
    const mgt_ops *o = m->be->ops;
    if (!o->attn_fwd || !o->attn_bwd || !o->attn_scratch)
        return mgt_errf(err,
                        "layer %s: the %s backend has no attention kernels yet; train this "
                        "model with --device cpu",
                        l->name, o->name);
    return 0;
}

static size_t scratch(mgt_backend *be, const mgt_layer *l, int max_batch) {
    if (!be->ops->attn_scratch)
        return 0;
    mgt_attn_shape a = shape_of(l, NULL);
    a.n = max_batch; /* the largest batch a pass takes */
    return be->ops->attn_scratch(be, &a);
}

/* Per sample: each head's log-sum-exp at each position (float32). */
static void temps(const mgt_layer *l, size_t act_bytes, size_t *saved, size_t *work) {
    (void)act_bytes;
    *saved = sizeof(float) * (size_t)l->cfg.heads * (size_t)l->out.w;
    *work = 0;
}

static float *lse_of(const mgt_layer *l, const mgt_step *s) {
    return (float *)l->saved + (size_t)s->row0 * (size_t)l->cfg.heads * (size_t)l->out.w;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    (void)m;
    const mgt_attn_shape a = shape_of(l, s);
    s->be->ops->attn_fwd(s->be, &a, x, y, lse_of(l, s));
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, const float *y,
                     float *dy, float *dx) {
    (void)m;
    const mgt_attn_shape a = shape_of(l, s);
    s->be->ops->attn_bwd(s->be, &a, x, y, lse_of(l, s), dy, dx);
}

/* The same attention in ONNX's operators, on [batch, T, 3C]: the queries, keys and values sliced
 * out and split into heads, [batch, heads, T, d]; softmax(q k^T / sqrt(d)) with the positions
 * after each query masked out (a causal layer; T is dynamic, so the mask is made from a Range of
 * T); the heads' outputs side by side again, [batch, T, C]. */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    (void)m;
    const int c = l->out.c, h = l->cfg.heads, d = c / h;
    char n[24][192];
    const char *const suf[24] = {"zero", "one", "axis2", "heads_shape", "out_shape", "scale",
                                 "q",    "k",   "v",     "q_heads",     "k_heads",   "v_heads",
                                 "qh",   "kt",  "vh",    "scores",      "scaled",    "T",
                                 "pos",  "row", "col",   "allowed",     "masked",    "probs"};
    for (int i = 0; i < 24; i++)
        snprintf(n[i], sizeof n[i], "%s/%s", x->out, suf[i]);
    char starts[3][192], ends[3][192], ctx[192], ohd[192], ot[192], neg[192], ax0[192], ax1[192],
        tsc[192];
    const int64_t one1 = 1, z = 0, o = 1, two = 2, hs[4] = {0, 0, h, d}, os[3] = {0, 0, c},
                  four = 4, three = 3, axis0 = 0, axis1 = 1;
    int rc = mgt_onnx_init_i64(x->g, n[2], &two, 1, &one1) < 0 ||
             mgt_onnx_init_i64(x->g, n[3], hs, 1, &four) < 0 ||
             mgt_onnx_init_i64(x->g, n[4], os, 1, &three) < 0;
    const float scale = (float)(1.0 / sqrt((double)d));
    rc |= mgt_onnx_init_f32(x->g, n[5], &scale, 0, NULL) < 0;
    for (int j = 0; j < 3; j++) { /* q, k, v: channels j c .. (j + 1) c */
        const int64_t st = (int64_t)j * c, en = (int64_t)(j + 1) * c;
        snprintf(starts[j], sizeof starts[j], "%s/start%d", x->out, j);
        snprintf(ends[j], sizeof ends[j], "%s/end%d", x->out, j);
        const char *in[4] = {x->in[0], starts[j], ends[j], n[2]};
        const char *rs[2] = {n[6 + j], n[3]};
        rc |= mgt_onnx_init_i64(x->g, starts[j], &st, 1, &one1) < 0 ||
              mgt_onnx_init_i64(x->g, ends[j], &en, 1, &one1) < 0 ||
              mgt_onnx_node(x->g, "Slice", in, 4, n[6 + j], NULL, 0) < 0 ||
              mgt_onnx_node(x->g, "Reshape", rs, 2, n[9 + j], NULL, 0) < 0;
    }
    const int64_t p0213[4] = {0, 2, 1, 3}, p0231[4] = {0, 2, 3, 1};
    const mgt_onnx_attr tq = {.name = "perm", .kind = MGT_ONNX_INTS, .ints = p0213, .nints = 4},
                        tk = {.name = "perm", .kind = MGT_ONNX_INTS, .ints = p0231, .nints = 4};
    const char *qk[2] = {n[12], n[13]}, *sc[2] = {n[15], n[5]};
    rc |= mgt_onnx_node(x->g, "Transpose", (const char *[]){n[9]}, 1, n[12], &tq, 1) < 0 ||
          mgt_onnx_node(x->g, "Transpose", (const char *[]){n[10]}, 1, n[13], &tk, 1) < 0 ||
          mgt_onnx_node(x->g, "Transpose", (const char *[]){n[11]}, 1, n[14], &tq, 1) < 0 ||
          mgt_onnx_node(x->g, "MatMul", qk, 2, n[15], NULL, 0) < 0 ||
          mgt_onnx_node(x->g, "Mul", sc, 2, n[16], NULL, 0) < 0;
    const char *logits = n[16];
    if (l->cfg.causal) { /* position j is seen from i when j <= i */
        snprintf(tsc, sizeof tsc, "%s/T_scalar", x->out);
        snprintf(ax0, sizeof ax0, "%s/axes0", x->out);
        snprintf(ax1, sizeof ax1, "%s/axes1", x->out);
        snprintf(neg, sizeof neg, "%s/minus_inf", x->out);
        const mgt_onnx_attr sh[2] = {{.name = "start", .kind = MGT_ONNX_INT, .i = 1},
                                     {.name = "end", .kind = MGT_ONNX_INT, .i = 2}};
        const float ninf = -INFINITY;
        const char *sq[2] = {n[17], ax0}, *rg[3] = {n[0], tsc, n[1]}, *ur[2] = {n[18], ax1},
                   *uc[2] = {n[18], ax0}, *le[2] = {n[20], n[19]}, *wh[3] = {n[21], n[16], neg};
        rc |= mgt_onnx_init_i64(x->g, n[0], &z, 0, NULL) < 0 ||
              mgt_onnx_init_i64(x->g, n[1], &o, 0, NULL) < 0 ||
              mgt_onnx_init_i64(x->g, ax0, &axis0, 1, &one1) < 0 ||
              mgt_onnx_init_i64(x->g, ax1, &axis1, 1, &one1) < 0 ||
              mgt_onnx_init_f32(x->g, neg, &ninf, 0, NULL) < 0 ||
              mgt_onnx_node(x->g, "Shape", &x->in[0], 1, n[17], sh, 2) < 0 ||
              mgt_onnx_node(x->g, "Squeeze", sq, 2, tsc, NULL, 0) < 0 ||
              mgt_onnx_node(x->g, "Range", rg, 3, n[18], NULL, 0) < 0 ||
              mgt_onnx_node(x->g, "Unsqueeze", ur, 2, n[19], NULL, 0) < 0 ||
              mgt_onnx_node(x->g, "Unsqueeze", uc, 2, n[20], NULL, 0) < 0 ||
              mgt_onnx_node(x->g, "LessOrEqual", le, 2, n[21], NULL, 0) < 0 ||
              mgt_onnx_node(x->g, "Where", wh, 3, n[22], NULL, 0) < 0;
        logits = n[22];
    }
    const mgt_onnx_attr last = {.name = "axis", .kind = MGT_ONNX_INT, .i = -1};
    snprintf(ohd, sizeof ohd, "%s/heads_out", x->out);
    snprintf(ot, sizeof ot, "%s/positions_out", x->out);
    snprintf(ctx, sizeof ctx, "%s", x->out);
    const char *pv[2] = {n[23], n[14]}, *back[2] = {ot, n[4]};
    x->out_rank = 3;
    rc |= mgt_onnx_node(x->g, "Softmax", &logits, 1, n[23], &last, 1) < 0 ||
          mgt_onnx_node(x->g, "MatMul", pv, 2, ohd, NULL, 0) < 0 ||
          mgt_onnx_node(x->g, "Transpose", (const char *[]){ohd}, 1, ot, &tq, 1) < 0 ||
          mgt_onnx_node(x->g, "Reshape", back, 2, ctx, NULL, 0) < 0;
    return rc ? mgt_errf(err, "out of host memory exporting %s", l->name) : 0;
}

const mgt_layer_type mgt_layer_attention = {
    .name = "attention",
    .keys = keys,
    .required = required,
    .defaults = defaults,
    .set = set,
    .build = build,
    .alloc = alloc,
    .scratch = scratch,
    .temps = temps,
    .forward = forward,
    .backward = backward,
    .bwd_reads = MGT_BWD_READS_X | MGT_BWD_READS_Y,
    .onnx = onnx,
};
