/* test_grads_ready.c: the "gradients ready" callback of backward (model.h: mgt_step.grads_ready),
 * on the CPU backend, for a model whose first layer has no parameters and whose others mix layers
 * with and without them (convolution, batchnorm, pooling, dropout, flatten, dense).
 *
 * The gradient arena is filled with NaN before backward. Then:
 *   - the callback hears exactly the layers with parameters, once each, from the last to the
 *     first;
 *   - each range it is given is exactly the span of that layer's tensors in the arena: the ranges
 *     are disjoint and together hold every parameter;
 *   - when a layer is heard, its gradients are written (no NaN left) and no layer below it has
 *     been written yet (all NaN): the callback comes as soon as the layer is done;
 *   - its gradients are final then: a copy taken in the callback equals the arena after backward,
 *     bit for bit;
 *   - listening changes nothing: the arena after a backward without a listener is the same. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "tally.h"

static const char *model_text = "[input]\nshape = 8,8,2\n"
                                "[avgpool]\nsize = 2\n"
                                "[conv2d]\nfilters = 4\nkernel = 3\npadding = same\n"
                                "activation = relu\n"
                                "[batchnorm]\n"
                                "[maxpool]\nsize = 2\n"
                                "[flatten]\n"
                                "[dropout]\nrate = 0.25\n"
                                "[dense]\nunits = 6\nactivation = tanh\n"
                                "[dense]\nunits = 3\n"
                                "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\n"
                                "batch_size = 5\nseed = 11\n";

enum { MAX_HEARD = 16 };

typedef struct heard {
    tally *t;
    const mgt_model *m;
    int n;
    int layer[MAX_HEARD];
    size_t offset[MAX_HEARD], count[MAX_HEARD];
    float *copy[MAX_HEARD];
} heard;

static int tensor_nan(const mgt_model *m, const mgt_param *p, int want_all_nan) {
    for (size_t i = 0; i < p->count; i++)
        if (isnan(m->g[p->offset + i]) != want_all_nan)
            return 0;
    return 1;
}

/* Whether every tensor of layer l is written (no NaN) or untouched (all NaN). */
static int layer_is(const mgt_model *m, const mgt_layer *l, int untouched) {
    for (int j = 0; j < 4; j++)
        if (l->param[j] >= 0 && !tensor_nan(m, &m->params[l->param[j]], untouched))
            return 0;
    return 1;
}

static void on_ready(void *ctx, const mgt_layer *l, size_t offset, size_t count) {
    heard *h = ctx;
    if (h->n == MAX_HEARD) {
        CHECK(h->t, !"more layers heard than the model has");
        return;
    }
    const int k = h->n++;
    h->layer[k] = l->index;
    h->offset[k] = offset;
    h->count[k] = count;
    CHECK(h->t, layer_is(h->m, l, 0));
    for (int i = 0; i < l->index; i++)
        CHECK(h->t, layer_is(h->m, &h->m->layers[i], 1));
    h->copy[k] = malloc(count * sizeof(float) + 1);
    if (h->copy[k])
        memcpy(h->copy[k], h->m->g + offset, count * sizeof(float));
}

/* Forward and backward on the batch in the model's input buffers, the arena NaN before. */
static void backward(mgt_model *m, mgt_backend *be, heard *h) {
    for (size_t i = 0; i < m->param_count; i++)
        m->g[i] = NAN;
    const int n = (int)m->train.batch_size;
    const mgt_step s = {.in = {m->x, m->labels, m->targets},
                        .be = be,
                        .n = n,
                        .training = 1,
                        .global_step = 3,
                        .first_sample = 0,
                        .global_n = n,
                        .seed = m->train.seed,
                        .grads_ready = h ? on_ready : NULL,
                        .grads_ctx = h};
    be->ops->zero(be, m->sums, 2 * sizeof(float));
    mgt_model_forward(m, &s);
    mgt_model_loss_backward(m, &s, 1);
}

int main(void) {
    tally t = {0, 0};
    mgt_model m;
    mgt_backend be;
    mgt_err e;
    if (mgt_model_parse(&m, "grads_ready.cfg", model_text, &e) < 0 ||
        mgt_cpu_backend_init(&be, 1) < 0 ||
        mgt_model_alloc(&m, &be, (int)m.train.batch_size, &e) < 0) {
        fprintf(stderr, "set-up failed: %s\n", e.msg);
        return 2;
    }
    mgt_model_init_host(&m, m.train.seed, m.w, m.buf);
    const int n = (int)m.train.batch_size;
    const size_t in = (size_t)mgt_shape_elems(m.input);
    for (size_t i = 0; i < in * (size_t)n; i++)
        m.x[i] = 2.0f * mgt_uniform(5, i) - 1.0f;
    for (int i = 0; i < n; i++)
        m.labels[i] = i % m.classes;

    heard h = {.t = &t, .m = &m};
    backward(&m, &be, &h);

    /* The layers with parameters, last to first. */
    int want[MAX_HEARD], nwant = 0;
    for (int i = m.nlayers - 1; i >= 0; i--)
        if (m.layers[i].param[0] >= 0)
            want[nwant++] = i;
    CHECK(&t, nwant == 4 && m.layers[0].param[0] < 0); /* the model is what this test is about */
    CHECK(&t, h.n == nwant);
    for (int k = 0; k < h.n && k < nwant; k++)
        CHECK(&t, h.layer[k] == want[k]);

    /* Each range spans its layer's tensors exactly; the ranges are disjoint and hold them all. */
    int covered = 0;
    for (int k = 0; k < h.n; k++) {
        const mgt_layer *l = &m.layers[h.layer[k]];
        size_t lo = (size_t)-1, hi = 0;
        for (int j = 0; j < 4; j++)
            if (l->param[j] >= 0) {
                const mgt_param *p = &m.params[l->param[j]];
                CHECK(&t,
                      p->offset >= h.offset[k] && p->offset + p->count <= h.offset[k] + h.count[k]);
                lo = p->offset < lo ? p->offset : lo;
                hi = p->offset + p->count > hi ? p->offset + p->count : hi;
                covered++;
            }
        CHECK(&t, lo == h.offset[k] && hi == h.offset[k] + h.count[k]);
        for (int q = 0; q < k; q++)
            CHECK(&t, h.offset[k] + h.count[k] <= h.offset[q] ||
                          h.offset[q] + h.count[q] <= h.offset[k]);
    }
    CHECK(&t, covered == m.nparams);

    /* Final when heard; and the same arena without a listener. */
    float *with = malloc(m.param_count * sizeof(float) + 1);
    if (!with)
        return 2;
    memcpy(with, m.g, m.param_count * sizeof(float));
    for (int k = 0; k < h.n; k++)
        CHECK(&t, h.copy[k] && !memcmp(h.copy[k], m.g + h.offset[k], h.count[k] * sizeof(float)));
    backward(&m, &be, NULL);
    CHECK(&t, !memcmp(with, m.g, m.param_count * sizeof(float)));

    for (int k = 0; k < h.n; k++)
        free(h.copy[k]);
    free(with);
    mgt_model_free(&m);
    mgt_backend_destroy(&be);
    printf("test_grads_ready: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
