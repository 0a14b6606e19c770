/* modelstep.h: what the model tests share (test_graph.c, test_fuse.c): one step of a model over
 * the batch in its own buffers, a layer by its name, and a listener that records the gradient
 * ranges handed over during backward (grads_ready) with a copy of each as it was when heard. */
#ifndef MGT_TEST_MODELSTEP_H
#define MGT_TEST_MODELSTEP_H

#include <stdlib.h>
#include <string.h>

#include "model.h"

enum { MAX_HEARD = 32 };

/* The index of the layer named `name`, or -1. */
static int layer_at(const mgt_model *m, const char *name) {
    for (int i = 0; i < m->nlayers; i++)
        if (!strcmp(m->layers[i].name, name))
            return i;
    return -1;
}

/* The ranges heard, in order; order_ok stays 1 while each lies below the one before (the
 * listener's contract: highest offset first), if it was 1 to begin with. */
typedef struct heard {
    const mgt_model *m;
    int n, order_ok;
    int layer[MAX_HEARD];
    size_t offset[MAX_HEARD], count[MAX_HEARD];
    float *copy[MAX_HEARD];
} heard;

static void on_ready(void *ctx, const mgt_layer *l, size_t offset, size_t count) {
    heard *h = ctx;
    if (h->n >= MAX_HEARD)
        return;
    const int k = h->n++;
    if (k > 0 && offset + count > h->offset[k - 1])
        h->order_ok = 0;
    h->layer[k] = l->index;
    h->offset[k] = offset;
    h->count[k] = count;
    h->copy[k] = malloc(count * sizeof(float) + 1);
    if (h->copy[k])
        memcpy(h->copy[k], h->m->g + offset, count * sizeof(float));
}

/* One forward over the n rows in m's buffers (in training mode or not), and with backward the
 * loss's gradient through the model, heard by h when given; returns the loss sum. */
static double model_step(mgt_model *m, mgt_backend *be, int n, uint64_t seed, int training,
                         int backward, heard *h) {
    const mgt_step s = {.in = {m->x, m->labels, m->targets},
                        .be = be,
                        .n = n,
                        .training = training,
                        .global_n = n,
                        .seed = seed,
                        .grads_ready = h ? on_ready : NULL,
                        .grads_ctx = h};
    be->ops->zero(be, m->sums, (size_t)m->nsums * sizeof(float));
    mgt_model_forward(m, &s);
    mgt_model_loss_backward(m, &s, backward);
    return m->sums[0];
}

#endif
