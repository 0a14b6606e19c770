/* embedding.c: [embedding], the token and learned position embeddings that start a language
 * model: y[p] = wte[id_p] + wpe[p] for the input's token ids (model.h: [input] context and vocab),
 * a (T, units) sequence. Its tensors are wte.weight [vocab][units] and wpe.weight
 * [positions][units], GPT-2's names: a layer named transformer gives Hugging Face's
 * transformer.wte.weight and transformer.wpe.weight. Both start normal with deviation 0.02
 * (GPT-2's, nanoGPT's; init_std = changes it). positions = 0 leaves the position table out; by
 * default it has a row for each position of the context.
 *
 *   [embedding]
 *   name = transformer
 *   units = 768
 *
 * An output layer may use wte as its weight ([dense] tied = transformer.wte.weight): the
 * gradient of the table is then the sum of both layers' (model.h: tied). */
#include <string.h>

#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"units", "positions", "init_std", NULL};
static const char *const required[] = {"units", NULL};

static void defaults(mgt_layer *l) {
    l->cfg.positions = -1; /* the context */
    l->cfg.init_std = 0.02f;
}

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "units"))
        return mgt_set_pos_int(v, &l->cfg.units, err);
    if (!strcmp(key, "init_std")) {
        if (mgt_parse_float(v, &l->cfg.init_std) < 0 || !(l->cfg.init_std > 0) ||
            l->cfg.init_std > 1)
            return mgt_errf(err, "expected a deviation in (0, 1], e.g. init_std = 0.02");
        return 0;
    }
    if (mgt_parse_int(v, &l->cfg.positions) < 0 || l->cfg.positions < 0)
        return mgt_errf(err, "expected the rows of the position table, 0 (none) or at least the "
                             "context, e.g. positions = 1024");
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    if (m->vocab <= 0 || l->inputs[0] >= 0)
        return mgt_errf(err, "reads token ids: give it the model's input, and [input] a context "
                             "and a vocab (e.g. context = 256, vocab = 256)");
    const int t = m->input.w, c = l->cfg.units;
    const int pos = l->cfg.positions < 0 ? t : l->cfg.positions;
    if (pos > 0 && pos < t)
        return mgt_errf(err,
                        "positions = %d is fewer than the context's %d positions; give at least "
                        "%d, or 0 for no position table",
                        pos, t, t);
    l->out = (mgt_shape){1, t, c, 1};
    const int64_t te[2] = {m->vocab, c}, pe[2] = {pos, c};
    if ((l->param[0] = mgt_model_add_param(m, l, "wte.weight", 2, te, MGT_INIT_NORMAL, 0, 0, err)) <
        0)
        return -1;
    m->params[l->param[0]].std = l->cfg.init_std;
    if (pos > 0) {
        if ((l->param[1] =
                 mgt_model_add_param(m, l, "wpe.weight", 2, pe, MGT_INIT_NORMAL, 0, 0, err)) < 0)
            return -1;
        m->params[l->param[1]].std = l->cfg.init_std;
    }
    return 0;
}

static int alloc(mgt_model *m, mgt_layer *l, int max_batch, mgt_err *err) {
    (void)max_batch;
    if (!m->be->ops->embed_fwd || !m->be->ops->embed_bwd)
        return mgt_errf(err,
                        "layer %s: the %s backend has no embedding ops yet; train this model "
                        "with --device cpu",
                        l->name, m->be->ops->name);
    return 0;
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    s->be->ops->embed_fwd(s->be, s->n, l->out.w, l->out.c, m->vocab, x, mgt_w(m, l, 0),
                          mgt_w(m, l, 1), y);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, const float *y,
                     float *dy, float *dx) {
    (void)y, (void)dx; /* token ids have no gradient */
    s->be->ops->embed_bwd(s->be, s->n, l->out.w, l->out.c, m->vocab, x, dy, mgt_g(m, l, 0),
                          l->grad_accumulate, mgt_g(m, l, 1));
}

/* Gather(wte, ids) + the first T rows of wpe, T the ids' sequence length (dynamic). */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const char *wte = mgt_onnx_param(x, m, l, 0);
    const char *wpe = l->param[1] >= 0 ? mgt_onnx_param(x, m, l, 1) : NULL;
    char tok[192], t[192], zero[192], axis[192], rows[192];
    snprintf(tok, sizeof tok, "%s/tokens", x->out);
    snprintf(t, sizeof t, "%s/T", x->out);
    snprintf(zero, sizeof zero, "%s/zero", x->out);
    snprintf(axis, sizeof axis, "%s/axis", x->out);
    snprintf(rows, sizeof rows, "%s/positions", x->out);
    const mgt_onnx_attr a0 = {.name = "axis", .kind = MGT_ONNX_INT, .i = 0};
    const mgt_onnx_attr sh[2] = {{.name = "start", .kind = MGT_ONNX_INT, .i = 1},
                                 {.name = "end", .kind = MGT_ONNX_INT, .i = 2}};
    const char *g[2] = {wte, x->in[0]};
    const int64_t one = 1, z = 0;
    const char *sl[4] = {wpe, zero, t, axis}, *add[2] = {tok, rows};
    x->out_rank = 3;
    int rc = !wte || (l->param[1] >= 0 && !wpe);
    if (!wpe)
        rc |= mgt_onnx_node(x->g, "Gather", g, 2, x->out, &a0, 1) < 0;
    else
        rc |= mgt_onnx_node(x->g, "Gather", g, 2, tok, &a0, 1) < 0 ||
              mgt_onnx_node(x->g, "Shape", &x->in[0], 1, t, sh, 2) < 0 ||
              mgt_onnx_init_i64(x->g, zero, &z, 1, &one) < 0 ||
              mgt_onnx_init_i64(x->g, axis, &z, 1, &one) < 0 ||
              mgt_onnx_node(x->g, "Slice", sl, 4, rows, NULL, 0) < 0 ||
              mgt_onnx_node(x->g, "Add", add, 2, x->out, NULL, 0) < 0;
    return rc ? mgt_errf(err, "out of host memory exporting %s", l->name) : 0;
}

const mgt_layer_type mgt_layer_embedding = {
    .name = "embedding",
    .keys = keys,
    .required = required,
    .defaults = defaults,
    .set = set,
    .build = build,
    .alloc = alloc,
    .forward = forward,
    .backward = backward,
    .bwd_reads = MGT_BWD_READS_X,
    .onnx = onnx,
};
