/* batchnorm.c: batch normalisation over the channels (the last axis), Keras' defaults
 * (momentum 0.99, epsilon 0.001).
 *
 * Training uses the statistics of this replica's batch, as Keras' multi_gpu_model and PyTorch
 * DDP do; with sync = true the per-channel sums are all-reduced first so every rank normalises
 * with the global batch's statistics (and the input gradient uses global sums likewise). The
 * parameter gradients stay local sums: the step's gradient all-reduce adds them up.
 *
 * A fusion group (fuse.c) runs its residual sum and ReLU inside the normalisation's passes
 * (forward_fused, backward_fused); alone the layer is the same with neither. */
#include <string.h>

#include "../comm.h"
#include "../repro.h"
#include "../export.h"
#include "layer_util.h"

static const char *const keys[] = {"momentum", "epsilon", "sync", NULL};

static void defaults(mgt_layer *l) {
    l->cfg.momentum = 0.99f;
    l->cfg.epsilon = 0.001f;
}

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    if (!strcmp(key, "sync"))
        return mgt_set_bool(v, &l->cfg.sync, err);
    float x;
    if (mgt_parse_float(v, &x) < 0)
        return mgt_errf(err, "expected a number");
    if (!strcmp(key, "momentum")) {
        if (x < 0 || x >= 1)
            return mgt_errf(err, "expected a number in [0, 1), e.g. momentum = 0.99");
        l->cfg.momentum = x;
    } else {
        if (!(x > 0) || x > 1)
            return mgt_errf(err, "expected a number in (0, 1], e.g. epsilon = 0.001");
        l->cfg.epsilon = x;
    }
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    l->out = l->in;
    int64_t cs[1] = {l->in.c};
    l->param[0] = mgt_model_add_param(m, l, "weight", 1, cs, MGT_INIT_ONE, 0, 0, err);
    if (l->param[0] < 0)
        return -1;
    l->param[1] = mgt_model_add_param(m, l, "bias", 1, cs, MGT_INIT_ZERO, 0, 0, err);
    if (l->param[1] < 0)
        return -1;
    l->buffer[0] = mgt_model_add_buffer(m, l, "running_mean", 1, cs, MGT_INIT_ZERO, err);
    if (l->buffer[0] < 0)
        return -1;
    l->buffer[1] = mgt_model_add_buffer(m, l, "running_var", 1, cs, MGT_INIT_ONE, err);
    return l->buffer[1] < 0 ? -1 : 0;
}

/* state[0]: mean[c] and invstd[c]; state[1]: sums[2c] (sum|sumsq, or dgamma|dbeta copies). */
static int alloc(mgt_model *m, mgt_layer *l, int max_batch, mgt_err *err) {
    (void)max_batch;
    size_t c = (size_t)l->in.c;
    l->state[0] = m->be->ops->alloc(m->be, 2 * c * sizeof(float));
    l->state[1] = m->be->ops->alloc(m->be, 2 * c * sizeof(float));
    if (!l->state[0] || !l->state[1])
        return mgt_errf(err, "cannot allocate batchnorm statistics for %s", l->name);
    return 0;
}

static void release(mgt_model *m, mgt_layer *l) {
    m->be->ops->free(m->be, l->state[0]);
    m->be->ops->free(m->be, l->state[1]);
}

static int synced(const mgt_layer *l, const mgt_step *s) {
    return l->cfg.sync && s->comm && s->comm->world > 1;
}

/* The normalisation, with what a fusion group runs in the same pass (f: the residual, the
 * ReLU, and the bias of the convolution before it that the normalisation cancels, which in
 * training the convolution left out: the running mean gets it back through bn_finalize). */
static void forward_fused(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                          const mgt_fused *f, float *y) {
    const mgt_ops *o = s->be->ops;
    int c = l->in.c, hw = l->in.h * l->in.w, rows = s->n * hw;
    float *mean = l->state[0], *invstd = mean + c, *sum = l->state[1], *sumsq = sum + c;
    if (s->training && !l->frozen) {
        float count = (float)rows;
        if (s->repro) { /* exact global sums, chunk by chunk (repro.h) */
            mgt_repro_bn_stats(s, hw, c, x, sum);
            count = (float)(s->global_n * hw);
        } else {
            o->bn_stats(s->be, rows, c, x, sum, sumsq);
        }
        if (synced(l, s) && !s->repro) {
            mgt_allreduce_sum(s->comm, sum, 2 * (size_t)c, "synchronised batchnorm statistics");
            count = (float)(s->global_n * hw);
        }
        o->bn_finalize(s->be, c, count, sum, sumsq, l->cfg.epsilon, l->cfg.momentum, f->shift, mean,
                       invstd, mgt_buf(m, l, 0), mgt_buf(m, l, 1));
    } else {
        o->bn_running(s->be, c, l->cfg.epsilon, mgt_buf(m, l, 0), mgt_buf(m, l, 1), mean, invstd);
    }
    const mgt_bn_pass p = {rows, c, x, mean, invstd, mgt_w(m, l, 0), mgt_w(m, l, 1),
                           f->r, f->act, NULL, 0};
    o->bn_apply(s->be, &p, y);
}

static void forward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y) {
    const mgt_fused none = {.act = MGT_ACT_NONE};
    forward_fused(m, l, s, x, &none, y);
}

static void backward_fused(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                           const mgt_fused *f, float *dy, float *dx) {
    const mgt_ops *o = s->be->ops;
    int c = l->in.c, hw = l->in.h * l->in.w, rows = s->n * hw;
    float *mean = l->state[0], *invstd = mean + c;
    float *dgamma = mgt_g(m, l, 0), *dbeta = mgt_g(m, l, 1);
    float count = (float)rows;
    const float *dg = dgamma, *db = dbeta;
    const mgt_bn_pass p = {rows, c, x, mean, invstd, mgt_w(m, l, 0), mgt_w(m, l, 1),
                           NULL, f->act, f->y, l->x_relu_grad};
    if (l->frozen) {
        /* The moving statistics are constants: dx = gamma * invstd * dz, bn_bwd_apply's formula
         * with zero dgamma and dbeta (exactly: their terms add 0 to dz). */
        if (!dx && !f->dr)
            return;
        float *zeros = l->state[1];
        o->zero(s->be, zeros, 2 * (size_t)c * sizeof(float));
        o->bn_bwd_apply(s->be, &p, 1.0f, dy, zeros, zeros + c, dx, f->dr, f->accumulate);
        return;
    }
    if (s->repro) { /* exact global sums, chunk by chunk (repro.h) */
        float *tmp = l->state[1];
        mgt_repro_bn_grads(s, hw, &p, dy, dgamma, dbeta, tmp);
        dg = tmp;
        db = tmp + c;
        count = (float)(s->global_n * hw);
    } else {
        o->bn_bwd_reduce(s->be, &p, dy, dgamma, dbeta);
    }
    if (!dx && !f->dr)
        return;
    if (synced(l, s) && !s->repro) {
        float *tmp = l->state[1];
        o->copy(s->be, tmp, dgamma, (size_t)c * sizeof(float));
        o->copy(s->be, tmp + c, dbeta, (size_t)c * sizeof(float));
        mgt_allreduce_sum(s->comm, tmp, 2 * (size_t)c, "synchronised batchnorm gradients");
        dg = tmp;
        db = tmp + c;
        count = (float)(s->global_n * hw);
    }
    o->bn_bwd_apply(s->be, &p, count, dy, dg, db, dx, f->dr, f->accumulate);
}

static void backward(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, const float *y,
                     float *dy, float *dx) {
    (void)y;
    const mgt_fused none = {.act = MGT_ACT_NONE};
    backward_fused(m, l, s, x, &none, dy, dx);
}

static int takes_x_relu(const mgt_layer *l, const mgt_backend *be) {
    (void)l;
    return be->ops->bn_x_relu;
}

/* BatchNormalization in inference mode, with the moving statistics (the exporter folds a
 * batchnorm into the convolution before it instead, where it can). */
static int onnx(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err) {
    const char *in[5] = {x->in[0], mgt_onnx_param(x, m, l, 0), mgt_onnx_param(x, m, l, 1),
                         m->buffers[l->buffer[0]].name, m->buffers[l->buffer[1]].name};
    const mgt_param *mean = &m->buffers[l->buffer[0]], *var = &m->buffers[l->buffer[1]];
    const mgt_onnx_attr a = {.name = "epsilon", .kind = MGT_ONNX_FLOAT, .f = l->cfg.epsilon};
    x->out_rank = x->in_rank[0];
    if (!in[1] || !in[2] ||
        mgt_onnx_init_f32(x->g, mean->name, x->buf + mean->offset, 1, mean->shape) < 0 ||
        mgt_onnx_init_f32(x->g, var->name, x->buf + var->offset, 1, var->shape) < 0 ||
        mgt_onnx_node(x->g, "BatchNormalization", in, 5, x->out, &a, 1) < 0)
        return mgt_errf(err, "out of host memory exporting %s", l->name);
    return 0;
}

const mgt_layer_type mgt_layer_batchnorm = {
    .name = "batchnorm", .keys = keys, .defaults = defaults, .set = set, .build = build,
    .alloc = alloc, .forward = forward, .backward = backward, .release = release,
    .bwd_reads = MGT_BWD_READS_X,
    .takes_x_relu = takes_x_relu,
    .forward_fused = forward_fused,
    .backward_fused = backward_fused,
    .onnx = onnx,
};
