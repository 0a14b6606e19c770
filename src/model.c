/* model.c: parameter arenas, activation memory, forward and backward over the layer list,
 * the summary table, and weights in PyTorch's names and layouts. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "repro.h"

static int add(mgt_param *tab, int *n, int cap, size_t *count, const mgt_layer *l,
               const char *suffix, int ndim, const int64_t *shape, int init) {
    if (*n == cap)
        return -1;
    mgt_param *p = &tab[*n];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s.%s", l->name, suffix);
    p->ndim = ndim;
    size_t c = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        c *= (size_t)shape[i];
    }
    p->count = c;
    /* 16-float (64-byte) alignment for every tensor: vector loads, and cuDNN/cuBLAS alignment. */
    p->offset = (*count + 15) & ~(size_t)15;
    *count = p->offset + c;
    p->init = init;
    return (*n)++;
}

int mgt_model_add_param(mgt_model *m, mgt_layer *l, const char *suffix, int ndim,
                        const int64_t *shape, int init, float fan_in, float fan_out) {
    int i = add(m->params, &m->nparams, 256, &m->param_count, l, suffix, ndim, shape, init);
    if (i >= 0) {
        m->params[i].fan_in = fan_in;
        m->params[i].fan_out = fan_out;
    }
    return i;
}

int mgt_model_add_buffer(mgt_model *m, mgt_layer *l, const char *suffix, int ndim,
                         const int64_t *shape, int init) {
    return add(m->buffers, &m->nbuffers, 64, &m->buffer_count, l, suffix, ndim, shape, init);
}

int mgt_model_alloc(mgt_model *m, mgt_backend *be, int max_batch, mgt_err *err) {
    const mgt_ops *o = be->ops;
    m->be = be;
    m->max_batch = max_batch < 1 ? 1 : max_batch;
    size_t mb = (size_t)m->max_batch;
    size_t in = (size_t)mgt_shape_elems(m->input), most = in, scratch = 0;
    m->first_trainable = m->nlayers;
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        size_t out = (size_t)mgt_shape_elems(l->out);
        most = out > most ? out : most;
        if (l->param[0] >= 0 && i < m->first_trainable)
            m->first_trainable = i;
        if (l->type->scratch) {
            size_t s = l->type->scratch(be, l, m->max_batch);
            scratch = s > scratch ? s : scratch;
        }
    }
#define ALLOC(ptr, bytes)                                                                      \
    do {                                                                                       \
        size_t b_ = (bytes);                                                                   \
        if (!((ptr) = o->alloc(be, b_ ? b_ : 16)))                                             \
            return mgt_errf(err, "out of %s memory: %zu bytes for %s; try a smaller batch "    \
                            "per rank (--batch-size or more ranks)", o->name, b_, #ptr);      \
    } while (0)
    ALLOC(m->w, m->param_count * sizeof(float));
    /* The step's loss and accuracy sums sit right after the gradients, so one all-reduce carries
     * both. */
    size_t sums_at = (m->param_count + 15) & ~(size_t)15;
    ALLOC(m->g, (sums_at + 16) * sizeof(float));
    m->sums = m->g + sums_at;
    ALLOC(m->buf, m->buffer_count * sizeof(float));
    ALLOC(m->x, mb * in * sizeof(float));
    ALLOC(m->labels, mb * sizeof(int32_t));
    ALLOC(m->targets, mb * (size_t)m->classes * sizeof(float));
    ALLOC(m->probs, mb * (size_t)m->classes * sizeof(float));
    ALLOC(m->grad[0], mb * most * sizeof(float));
    ALLOC(m->grad[1], mb * most * sizeof(float));
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        ALLOC(l->y, mb * (size_t)mgt_shape_elems(l->out) * sizeof(float));
        if (l->type->alloc && l->type->alloc(m, l, m->max_batch, err) < 0)
            return -1;
    }
#undef ALLOC
    if (scratch && o->reserve(be, scratch) < 0)
        return mgt_errf(err, "out of %s memory: %zu bytes of convolution workspace; try a "
                        "smaller batch per rank", o->name, scratch);
    return 0;
}

void mgt_model_free(mgt_model *m) {
    if (m->be) {
        const mgt_ops *o = m->be->ops;
        for (int i = 0; i < m->nlayers; i++) {
            mgt_layer *l = &m->layers[i];
            if (l->type->release)
                l->type->release(m, l);
            o->free(m->be, l->y);
        }
        void *ptrs[] = {m->w, m->g, m->buf, m->x, m->labels, m->targets, m->probs,
                        m->grad[0], m->grad[1]};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
            o->free(m->be, ptrs[i]);
    }
    free(m->layers);
    memset(m, 0, sizeof *m);
}

void mgt_model_init_host(const mgt_model *m, uint64_t seed, float *w, float *buf) {
    memset(w, 0, m->param_count * sizeof(float));
    memset(buf, 0, m->buffer_count * sizeof(float));
    for (int i = 0; i < m->nparams; i++) {
        const mgt_param *p = &m->params[i];
        float *d = w + p->offset;
        if (p->init == MGT_INIT_ONE)
            for (size_t j = 0; j < p->count; j++)
                d[j] = 1.0f;
        if (p->init == MGT_INIT_GLOROT) {
            float limit = sqrtf(6.0f / (p->fan_in + p->fan_out));
            uint64_t key = mgt_key3(seed, 0x494e4954ULL /* "INIT" */, (uint64_t)i);
            for (size_t j = 0; j < p->count; j++)
                d[j] = (2.0f * mgt_uniform(key, j) - 1.0f) * limit;
        }
    }
    for (int i = 0; i < m->nbuffers; i++)
        if (m->buffers[i].init == MGT_INIT_ONE)
            for (size_t j = 0; j < m->buffers[i].count; j++)
                buf[m->buffers[i].offset + j] = 1.0f;
}

float *mgt_model_forward(mgt_model *m, const mgt_step *s) {
    if (s->repro)
        return mgt_repro_forward(m, s);
    const float *x = s->in.x;
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        l->type->forward(m, l, s, x, l->y);
        if (l->act != MGT_ACT_NONE && !l->fused_act)
            s->be->ops->act_fwd(s->be, l->act, s->n, (int)mgt_shape_elems(l->out), l->y);
        x = l->y;
    }
    return m->layers[m->nlayers - 1].y;
}

size_t mgt_layer_param_range(const mgt_model *m, const mgt_layer *l, size_t *lo) {
    size_t low = (size_t)-1, hi = 0;
    for (int j = 0; j < 4; j++)
        if (l->param[j] >= 0) {
            const mgt_param *p = &m->params[l->param[j]];
            low = p->offset < low ? p->offset : low;
            hi = p->offset + p->count > hi ? p->offset + p->count : hi;
        }
    *lo = hi ? low : 0;
    return hi ? hi - low : 0;
}

/* Layer l's gradients to the step's listener. */
static void grads_ready(const mgt_model *m, const mgt_layer *l, const mgt_step *s) {
    size_t lo;
    const size_t count = mgt_layer_param_range(m, l, &lo);
    s->grads_ready(s->grads_ctx, l, lo, count);
}

void mgt_model_loss_backward(mgt_model *m, const mgt_step *s, int backward) {
    if (s->repro) {
        mgt_repro_loss_backward(m, s, backward);
        return;
    }
    const mgt_ops *o = s->be->ops;
    mgt_layer *last = &m->layers[m->nlayers - 1];
    int k = m->classes;
    /* With a softmax last layer the probabilities replace the logits in its output (what predict
     * reports); with a logits layer they go to a separate buffer and the output stays logits. */
    float *probs = last->fused_act ? last->y : m->probs;
    float *dlogits = backward ? m->grad[0] : NULL;
    if (m->train.loss == MGT_LOSS_SPARSE_CE)
        o->xent_sparse(s->be, s->n, k, last->y, s->in.labels, probs, dlogits, 1.0f, m->sums);
    else
        o->xent_dense(s->be, s->n, k, last->y, s->in.targets, probs, dlogits, 1.0f, m->sums);
    if (!backward)
        return;
    int cur = 0;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        mgt_layer *l = &m->layers[i];
        float *dy = m->grad[cur];
        float *dx = i > m->first_trainable ? m->grad[cur ^ 1] : NULL;
        if (l->act != MGT_ACT_NONE && !l->fused_act)
            o->act_bwd(s->be, l->act, s->n, (int)mgt_shape_elems(l->out), l->y, dy);
        const float *x = i ? m->layers[i - 1].y : s->in.x;
        l->type->backward(m, l, s, x, l->y, dy, dx);
        if (s->grads_ready && l->param[0] >= 0)
            grads_ready(m, l, s);
        if (!dx)
            break; /* nothing below has parameters */
        cur ^= 1;
    }
}

void mgt_model_finish_output(mgt_model *m, const mgt_step *s, float *out) {
    mgt_layer *last = &m->layers[m->nlayers - 1];
    if (last->fused_act)
        s->be->ops->act_fwd(s->be, MGT_ACT_SOFTMAX, s->n, m->classes, out);
}

static void shape_str(mgt_shape s, char *buf, size_t n) {
    if (s.h == 1 && s.w == 1)
        snprintf(buf, n, "(%d)", s.c);
    else
        snprintf(buf, n, "(%d, %d, %d)", s.h, s.w, s.c);
}

static void commas(size_t v, char *buf, size_t n) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%zu", v);
    size_t len = strlen(tmp), j = 0;
    for (size_t i = 0; i < len && j + 1 < n; i++) {
        if (i && (len - i) % 3 == 0 && j + 2 < n)
            buf[j++] = ',';
        buf[j++] = tmp[i];
    }
    buf[j] = 0;
}

void mgt_model_summary(const mgt_model *m, FILE *f) {
    char s[64], c[32];
    fprintf(f, "Model: %s (%s)\n", m->name, m->path);
    fprintf(f, "%-28s %-18s %12s\n", "Layer (type)", "Output shape", "Params");
    fprintf(f, "%.*s\n", 60, "==============================================================");
    shape_str(m->input, s, sizeof s);
    fprintf(f, "%-28s %-18s %12s\n", "input", s, "0");
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        size_t n = 0;
        for (int j = 0; j < 4; j++)
            if (l->param[j] >= 0)
                n += m->params[l->param[j]].count;
        for (int j = 0; j < 2; j++)
            if (l->buffer[j] >= 0)
                n += m->buffers[l->buffer[j]].count;
        char name[80];
        snprintf(name, sizeof name, "%s (%s)", l->name, l->type->name);
        shape_str(l->out, s, sizeof s);
        if (l->act != MGT_ACT_NONE && l->type->has_act) {
            size_t len = strlen(s);
            snprintf(s + len, sizeof s - len, " %s", mgt_act_name(l->act));
        }
        commas(n, c, sizeof c);
        fprintf(f, "%-28s %-18s %12s\n", name, s, c);
    }
    size_t trainable = 0, fixed = 0;
    for (int i = 0; i < m->nparams; i++)
        trainable += m->params[i].count;
    for (int i = 0; i < m->nbuffers; i++)
        fixed += m->buffers[i].count;
    fprintf(f, "%.*s\n", 60, "==============================================================");
    commas(trainable + fixed, c, sizeof c);
    fprintf(f, "Total params: %s\n", c);
    commas(trainable, c, sizeof c);
    fprintf(f, "Trainable params: %s\n", c);
    commas(fixed, c, sizeof c);
    fprintf(f, "Non-trainable params: %s\n", c);
    fprintf(f, "Loss: %s, optimizer: %s, global batch: %lld, epochs: %d\n",
            mgt_loss_name(m->train.loss), mgt_opt_name(m->train.optimizer),
            (long long)m->train.batch_size, m->train.epochs);
}

static void entry(mgt_tensor_entry *e, const mgt_param *p, const float *base) {
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", p->name);
    e->ndim = p->ndim;
    for (int i = 0; i < p->ndim; i++)
        e->shape[i] = p->shape[i];
    e->data = base + p->offset;
}

int mgt_model_weights_entries(const mgt_model *m, const float *w, const float *buf,
                              mgt_tensor_entry *out, int max) {
    int n = 0;
    /* Layer by layer, each layer's parameters then its buffers (PyTorch's state_dict order). */
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        for (int j = 0; j < 4 && n < max; j++)
            if (l->param[j] >= 0)
                entry(&out[n++], &m->params[l->param[j]], w);
        for (int j = 0; j < 2 && n < max; j++)
            if (l->buffer[j] >= 0)
                entry(&out[n++], &m->buffers[l->buffer[j]], buf);
    }
    return n;
}

static int take(const mgt_param *p, const mgt_safetensors *st, const char *path,
                const char *model, float *dst, mgt_err *err) {
    const mgt_tensor_entry *e = mgt_safetensors_find(st, p->name);
    if (!e)
        return mgt_errf(err, "%s has no tensor '%s', which model %s needs: it was saved from "
                        "another model; pass weights saved from this model file", path, p->name,
                        model);
    int same = e->ndim == p->ndim;
    for (int i = 0; same && i < p->ndim; i++)
        same = e->shape[i] == p->shape[i];
    if (!same) {
        char a[96] = "", b[96] = "";
        for (int i = 0; i < e->ndim; i++)
            snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", i ? "," : "",
                     (long long)e->shape[i]);
        for (int i = 0; i < p->ndim; i++)
            snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", i ? "," : "",
                     (long long)p->shape[i]);
        return mgt_errf(err, "%s: tensor '%s' has shape [%s] but model %s needs [%s]; the "
                        "weights come from a different model file", path, p->name, a, model, b);
    }
    memcpy(dst + p->offset, e->data, p->count * sizeof(float));
    return 0;
}

int mgt_model_take_weights(const mgt_model *m, const mgt_safetensors *st, const char *path,
                           float *w, float *buf, mgt_err *err) {
    for (int i = 0; i < m->nparams; i++)
        if (take(&m->params[i], st, path, m->name, w, err) < 0)
            return -1;
    for (int i = 0; i < m->nbuffers; i++)
        if (take(&m->buffers[i], st, path, m->name, buf, err) < 0)
            return -1;
    /* Anything else in the file must be optimizer state (checkpoints); a stray layer tensor
     * means the file belongs to another model. */
    for (int i = 0; i < st->nt; i++) {
        const char *name = st->t[i].name;
        if (!strncmp(name, "optimizer.", 10))
            continue;
        int known = 0;
        for (int j = 0; j < m->nparams && !known; j++)
            known = !strcmp(m->params[j].name, name);
        for (int j = 0; j < m->nbuffers && !known; j++)
            known = !strcmp(m->buffers[j].name, name);
        if (!known)
            return mgt_errf(err, "%s holds tensor '%s', which model %s does not have: the "
                            "weights come from a different model file", path, name, m->name);
    }
    return 0;
}

int mgt_model_load_weights(const mgt_model *m, const char *path, float *w, float *buf,
                           mgt_err *err) {
    mgt_safetensors st;
    if (mgt_safetensors_read(path, &st, err) < 0)
        return -1;
    int rc = mgt_model_take_weights(m, &st, path, w, buf, err);
    mgt_safetensors_free(&st);
    return rc;
}
