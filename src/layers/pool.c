/* pool.c: max and average pooling over size x size windows (stride defaults to size), valid
 * windows only, as Keras' MaxPooling2D / AveragePooling2D with padding="valid". */
#include <string.h>

#include "layer_util.h"

static const char *const keys[] = {"size", "stride", NULL};

static void defaults(mgt_layer *l) { l->cfg.kernel = 2; }

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "size"))
        return mgt_set_pos_int(v, &l->cfg.kernel, err);
    l->cfg.stride_set = 1;
    return mgt_set_pos_int(v, &l->cfg.stride, err);
}

static mgt_pool_shape geometry(const mgt_layer *l, int n) {
    int stride = l->cfg.stride_set ? l->cfg.stride : l->cfg.kernel;
    mgt_pool_shape s = {.n = n, .h = l->in.h, .w = l->in.w, .c = l->in.c,
                        .size = l->cfg.kernel, .stride = stride};
    s.oh = s.h >= s.size ? (s.h - s.size) / stride + 1 : 0;
    s.ow = s.w >= s.size ? (s.w - s.size) / stride + 1 : 0;
    return s;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m;
    mgt_pool_shape s = geometry(l, 1);
    if (s.oh < 1 || s.ow < 1)
        return mgt_errf(err, "size = %d does not fit the %dx%d input", s.size, s.h, s.w);
    l->out = (mgt_shape){s.oh, s.ow, s.c};
    return 0;
}

static int alloc_max(mgt_model *m, mgt_layer *l, int max_batch, mgt_err *err) {
    size_t bytes = sizeof(int32_t) * (size_t)max_batch * (size_t)mgt_shape_elems(l->out);
    l->state[0] = m->be->ops->alloc(m->be, bytes ? bytes : 4);
    if (!l->state[0])
        return mgt_errf(err, "cannot allocate %zu bytes for %s", bytes, l->name);
    return 0;
}

static void release(mgt_model *m, mgt_layer *l) { m->be->ops->free(m->be, l->state[0]); }

/* The argmax of the step's rows (a chunk's, under --reproducible: model.h's row0). */
static int32_t *argmax(const mgt_layer *l, const mgt_step *st) {
    return (int32_t *)l->state[0] + st->row0 * mgt_shape_elems(l->out);
}

static void max_fwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x, float *y) {
    (void)m;
    mgt_pool_shape s = geometry(l, st->n);
    st->be->ops->maxpool_fwd(st->be, &s, x, y, argmax(l, st));
}

static void max_bwd(mgt_model *m, mgt_layer *l, const mgt_step *st, const float *x,
                    const float *y, float *dy, float *dx) {
    (void)m, (void)x, (void)y;
    if (!dx)
        return;
    mgt_pool_shape s = geometry(l, st->n);
    st->be->ops->maxpool_bwd(st->be, &s, dy, argmax(l, st), dx);
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

const mgt_layer_type mgt_layer_maxpool = {
    .name = "maxpool", .keys = keys, .defaults = defaults, .set = set, .build = build,
    .alloc = alloc_max, .forward = max_fwd, .backward = max_bwd, .release = release,
};

const mgt_layer_type mgt_layer_avgpool = {
    .name = "avgpool", .keys = keys, .defaults = defaults, .set = set, .build = build,
    .forward = avg_fwd, .backward = avg_bwd,
};
