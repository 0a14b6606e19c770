/* test_grads_ready.c: the "gradients ready" callback of backward (model.h: mgt_step.grads_ready),
 * on the CPU backend, for a model whose first layer has no parameters and whose others mix layers
 * with and without them (convolution, batchnorm, pooling, dropout, flatten, dense).
 *
 * The first dense layer is large enough (16 x 4096 floats) to hand its gradients over in parts
 * (model.h: grad_rows): its bias, then its weight's row blocks from the last.
 *
 * The gradient arena is filled with NaN before backward. Then:
 *   - the callback hears each layer with parameters whole exactly once, from the last to the
 *     first; the ranges it is given whole are exactly the spans of the layers' tensors in the
 *     arena: disjoint, together holding every parameter;
 *   - before the large layer's whole range it hears its parts: the bias, then the weight's row
 *     blocks of grad_rows rows from the last, each range contiguous with the one before;
 *   - when a range is heard, it is written (no NaN left) and nothing below it in the arena has
 *     been written yet (all NaN): the callback comes as soon as the range is done;
 *   - a range is final then: a copy taken in the callback equals the arena after backward, bit
 *     for bit;
 *   - listening changes nothing: the arena after a backward without a listener is the same;
 *   - on one rank (mgt_step.whole_grads) the large layer is heard whole only, no parts, and each
 *     range is final when heard. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "tally.h"
#include "train_cfg.h"

static const char *model_text = "[input]\nshape = 8,8,2\n"
                                "[avgpool]\nsize = 2\n"
                                "[conv2d]\nfilters = 4\nkernel = 3\npadding = same\n"
                                "activation = relu\n"
                                "[batchnorm]\n"
                                "[maxpool]\nsize = 2\n"
                                "[flatten]\n"
                                "[dropout]\nrate = 0.25\n"
                                "[dense]\nunits = 4096\nactivation = tanh\n"
                                "[dense]\nunits = 3\n"
                                "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\n"
                                "batch_size = 5\nseed = 11\n";

enum { MAX_HEARD = 32 };

/* The model file's [train] section: the batch and the seed. */
static mgt_train_cfg train;

typedef struct heard {
    tally *t;
    const mgt_model *m;
    int n;
    int layer[MAX_HEARD];
    size_t offset[MAX_HEARD], count[MAX_HEARD];
    float *copy[MAX_HEARD];
} heard;

/* Whether m->g[lo .. hi) holds no NaN (written) or only NaN (untouched). */
static int range_is(const mgt_model *m, size_t lo, size_t hi, int untouched) {
    for (size_t i = lo; i < hi; i++)
        if (isnan(m->g[i]) != untouched)
            return 0;
    return 1;
}

static void on_ready(void *ctx, const mgt_layer *l, size_t offset, size_t count) {
    heard *h = ctx;
    if (h->n == MAX_HEARD) {
        CHECK(h->t, !"more ranges heard than the model has");
        return;
    }
    const int k = h->n++;
    h->layer[k] = l->index;
    h->offset[k] = offset;
    h->count[k] = count;
    /* Every tensor's part in it written (the gaps between tensors stay NaN), and nothing
     * below it yet: every tensor lies above its lower layers' ones. */
    for (int j = 0; j < h->m->nparams; j++) {
        const mgt_param *p = &h->m->params[j];
        const size_t a = p->offset > offset ? p->offset : offset;
        const size_t b = p->offset + p->count < offset + count ? p->offset + p->count
                                                                : offset + count;
        if (a < b)
            CHECK(h->t, range_is(h->m, a, b, 0));
    }
    CHECK(h->t, range_is(h->m, 0, offset, 1));
    h->copy[k] = malloc(count * sizeof(float) + 1);
    if (h->copy[k])
        memcpy(h->copy[k], h->m->g + offset, count * sizeof(float));
}

/* Forward and backward on the batch in the model's input buffers, the arena NaN before. */
static void backward(mgt_model *m, mgt_backend *be, heard *h, int whole) {
    for (size_t i = 0; i < m->param_count; i++)
        m->g[i] = NAN;
    const int n = (int)train.batch_size;
    const mgt_step s = {.in = {m->x, m->labels, m->targets},
                        .be = be,
                        .n = n,
                        .training = 1,
                        .global_step = 3,
                        .first_sample = 0,
                        .global_n = n,
                        .seed = train.seed,
                        .grads_ready = h ? on_ready : NULL,
                        .grads_ctx = h,
                        .whole_grads = whole};
    be->ops->zero(be, m->sums, 2 * sizeof(float));
    mgt_model_forward(m, &s);
    mgt_model_loss_backward(m, &s, 1);
}

int main(void) {
    tally t = {0, 0};
    mgt_model m;
    mgt_backend be;
    mgt_err e;
    if (mgt_model_file_parse(&m, &train, "grads_ready.cfg", model_text, &e) < 0 ||
        mgt_cpu_backend_init(&be, 1) < 0 ||
        mgt_model_alloc(&m, &be, (int)train.batch_size, &e) < 0) {
        fprintf(stderr, "set-up failed: %s\n", e.msg);
        return 2;
    }
    mgt_model_init_host(&m, train.seed, m.w, m.buf);
    const int n = (int)train.batch_size;
    const size_t in = (size_t)mgt_shape_elems(m.input);
    for (size_t i = 0; i < in * (size_t)n; i++)
        m.x[i] = 2.0f * mgt_uniform(5, i) - 1.0f;
    for (int i = 0; i < n; i++)
        m.labels[i] = i % m.classes;

    heard h = {.t = &t, .m = &m};
    backward(&m, &be, &h, 0);

    /* The layers with parameters, last to first, each heard whole once; the large one's parts
     * before it. */
    int want[MAX_HEARD], nwant = 0, big = -1;
    for (int i = m.nlayers - 1; i >= 0; i--)
        if (m.layers[i].param[0] >= 0) {
            want[nwant++] = i;
            if (m.layers[i].type->grad_rows && m.layers[i].type->grad_rows(&m.layers[i], be.ops))
                big = i;
        }
    /* the model is what this test is about */
    CHECK(&t, nwant == 4 && m.layers[0].param[0] < 0 && big == want[1]);
    const int rows = big >= 0 ? m.layers[big].type->grad_rows(&m.layers[big], be.ops) : 0;
    CHECK(&t, rows == 2048); /* 65,536 floats: two blocks */
    int whole = 0, covered = 0;
    size_t below = (size_t)-1; /* the lowest start heard */
    for (int k = 0; k < h.n; k++) {
        const mgt_layer *l = &m.layers[h.layer[k]];
        size_t lo;
        const size_t n = mgt_layer_param_range(&m, l, &lo);
        CHECK(&t, h.offset[k] >= lo && h.offset[k] + h.count[k] <= lo + n);
        if (h.offset[k] == lo && h.count[k] == n) { /* the whole layer */
            CHECK(&t, whole < nwant && h.layer[k] == want[whole]);
            whole++;
            for (int j = 0; j < 4; j++)
                covered += l->param[j] >= 0;
        } else { /* a part of the large layer, contiguous with what came before */
            CHECK(&t, h.layer[k] == big && h.offset[k] + h.count[k] == below);
        }
        /* a whole range covers its parts; anything else starts below all before it */
        CHECK(&t, h.offset[k] + h.count[k] <= below || h.offset[k] == lo);
        below = h.offset[k] < below ? h.offset[k] : below;
    }
    CHECK(&t, whole == nwant && covered == m.nparams);
    CHECK(&t, h.n == nwant + 3); /* the bias and two row blocks */
    if (big >= 0) {
        const mgt_layer *l = &m.layers[big];
        const mgt_param *w = &m.params[l->param[0]], *b = &m.params[l->param[1]];
        int k = 0;
        while (k < h.n && h.layer[k] != big)
            k++;
        CHECK(&t, k + 3 < h.n && h.offset[k] == b->offset && h.count[k] == b->count &&
                      h.offset[k + 1] == w->offset + w->count / 2 &&
                      h.count[k + 1] == w->count / 2 && h.offset[k + 2] == w->offset &&
                      h.count[k + 2] == w->count / 2);
    }

    /* Final when heard; and the same arena without a listener. */
    float *with = malloc(m.param_count * sizeof(float) + 1);
    if (!with)
        return 2;
    memcpy(with, m.g, m.param_count * sizeof(float));
    for (int k = 0; k < h.n; k++)
        CHECK(&t, h.copy[k] && !memcmp(h.copy[k], m.g + h.offset[k], h.count[k] * sizeof(float)));
    backward(&m, &be, NULL, 0);
    CHECK(&t, !memcmp(with, m.g, m.param_count * sizeof(float)));

    /* One rank: every layer heard whole once, last to first, and final when heard. */
    heard one = {.t = &t, .m = &m};
    backward(&m, &be, &one, 1);
    CHECK(&t, one.n == nwant);
    for (int k = 0; k < one.n && k < nwant; k++) {
        size_t lo;
        const size_t n = mgt_layer_param_range(&m, &m.layers[one.layer[k]], &lo);
        CHECK(&t, one.layer[k] == want[k] && one.offset[k] == lo && one.count[k] == n);
        CHECK(&t, one.copy[k] &&
                      !memcmp(one.copy[k], m.g + one.offset[k], one.count[k] * sizeof(float)));
    }
    for (int k = 0; k < one.n; k++)
        free(one.copy[k]);

    for (int k = 0; k < h.n; k++)
        free(h.copy[k]);
    free(with);
    mgt_model_free(&m);
    mgt_backend_destroy(&be);
    printf("test_grads_ready: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
