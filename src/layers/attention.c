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
#include <string.h>

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
    (void)max_batch;
    if (!be->ops->attn_scratch)
        return 0;
    const mgt_attn_shape a = shape_of(l, NULL);
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
};
