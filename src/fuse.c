/* fuse.c: the fusion groups of a model's layer graph (model.h: mgt_fuse_find).
 *
 * A batchnorm is followed, in the models that use it, by element-wise layers that each read the
 * whole tensor and write it again: a ReLU ([activation]), a residual sum ([add]) and a ReLU
 * after it. Run one after another they pass over the activation three times forward and more
 * backward; run as one group they pass once each way (backend.h: bn_apply, bn_bwd_reduce,
 * bn_bwd_apply take the residual and the ReLU), as NVIDIA's NHWC batchnorm-add-relu kernels do.
 * A group is
 *   bn [-> add (bn's output and one other tensor, the residual)] [-> relu]
 * where each tensor inside the group has no other reader, so nothing else needs it written out;
 * the group runs, forward and backward, where its last layer (the tail) runs, and its inner
 * tensors are never planned (model.c). The relu is an [activation] layer of type relu or the
 * add's own activation = relu. Of two batchnorms summed by one add, the later in the file heads
 * the group (both inputs exist by then).
 *
 * A convolution whose only reader is a batchnorm has its bias cancelled by the normalisation
 * (the batch mean absorbs it, exactly). On a backend that takes this (mgt_backend.cancel_bias:
 * the GPU) the batchnorm is then a group, of itself alone if nothing follows it: in training the
 * convolution leaves the bias out and writes a zero gradient for it (its exact value), and the
 * batchnorm adds it to the batch mean that enters the running mean, so the running statistics,
 * and the weights saved, mean what they meant with it (backend.h: bn_finalize's shift).
 * Evaluation uses the bias as usual.
 *
 * A layer that ends in its own ReLU (a convolution's or dense layer's activation = relu) and
 * whose only reader is a batchnorm, a max pooling or a dense layer outside any group, as in
 * Keras' conv -> relu -> batchnorm, conv -> relu -> maxpool and an MLP's dense -> relu -> dense,
 * leaves that ReLU's gradient to the reader, on a backend that takes it (takes_x_relu: the
 * CPU's): the reader's input x is the ReLU's output, so its backward masks the gradient it
 * writes by x > 0 in the same pass (a dense layer's: each lane's part of dx, as it is written),
 * and the layer skips a pass over its gradient that reads its output (act_bwd's y > 0 ? g : 0,
 * the same values). The layer's output stays
 * planned as one its backward reads, so it outlives the reader's backward.
 *
 * The groups change no result: each fused op rounds as the unfused ops did (on the CPU bit for
 * bit; tests/unit/test_fuse.c). A cancelled bias changes the batchnorm's input by a constant per
 * channel, so its statistics by rounding only, and its gradient from rounding noise to zero; the
 * CPU backend keeps the bias, so its results stay those of the layers run one by one. The
 * groups depend on the graph and the backend's kind alone, so every rank and the planner find
 * the same. */
#include <string.h>

#include "model.h"

/* The layer reading i's output, where exactly one input slot of one layer does; else -1. */
static int only_reader(const mgt_model *m, int i) {
    if (m->layers[i].consumers != 1)
        return -1;
    for (int j = i + 1; j < m->nlayers; j++)
        for (int k = 0; k < m->layers[j].ninputs; k++)
            if (m->layers[j].inputs[k] == i)
                return j;
    return -1;
}

static int is_relu_layer(const mgt_layer *l) {
    return l->type->identity && l->act == MGT_ACT_RELU;
}

static int is_bn(const mgt_layer *l) {
    return l->type->forward_fused != NULL;
}

int mgt_fuse_find(const mgt_model *m, mgt_group *groups, int *group_of, int *bias_of) {
    const int L = m->nlayers;
    for (int i = 0; i < L; i++)
        group_of[i] = bias_of[i] = -1;
    if (m->no_fusion)
        return 0;
    int n = 0;
    for (int b = 0; b < L; b++) {
        const mgt_layer *bl = &m->layers[b];
        if (!is_bn(bl) || bl->act != MGT_ACT_NONE)
            continue;
        /* the convolution before it */
        const int cv = bl->inputs[0];
        if (cv >= 0 && m->be && m->be->cancel_bias && !bl->frozen) { /* frozen: no batch mean */
            const mgt_layer *c = &m->layers[cv];
            if (c->type->cancellable_bias && c->param[1] >= 0 && c->act == MGT_ACT_NONE &&
                only_reader(m, cv) == b)
                bias_of[b] = cv;
        }
        mgt_group g = {.bn = b, .add = -1, .res = -1, .act = -1, .tail = b};
        const int j = only_reader(m, b);
        const mgt_layer *jl = j >= 0 ? &m->layers[j] : NULL;
        if (jl && is_relu_layer(jl)) {
            g.act = g.tail = j;
        } else if (jl && jl->type->residual_sum && jl->ninputs == 2 &&
                   (jl->act == MGT_ACT_NONE || jl->act == MGT_ACT_RELU)) {
            const int slot = jl->inputs[0] == b ? 1 : 0, other = jl->inputs[slot];
            /* the residual: another tensor than bn's input, and not a later batchnorm's output
             * that would head the group itself */
            const int later_bn = other > b && is_bn(&m->layers[other]) &&
                                 m->layers[other].act == MGT_ACT_NONE && only_reader(m, other) == j;
            if (other != b && other != bl->inputs[0] && !later_bn) {
                g.add = g.tail = j;
                g.res = slot;
                if (jl->act == MGT_ACT_RELU) {
                    g.act = j;
                } else {
                    const int a = only_reader(m, j);
                    if (a >= 0 && is_relu_layer(&m->layers[a]))
                        g.act = g.tail = a;
                }
            }
        }
        if (g.tail == b && bias_of[b] < 0)
            continue; /* nothing to fuse: the batchnorm runs alone */
        groups[n] = g;
        group_of[b] = n;
        if (g.add >= 0)
            group_of[g.add] = n;
        if (g.act >= 0)
            group_of[g.act] = n;
        n++;
    }
    return n;
}

void mgt_fuse_relu_grads(mgt_model *m) {
    for (int i = 0; i < m->nlayers; i++)
        m->layers[i].relu_grad_by_reader = m->layers[i].x_relu_grad = 0;
    if (m->no_fusion || !m->be)
        return;
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        const int b = only_reader(m, i);
        if (b < 0 || l->act != MGT_ACT_RELU || l->fused_act || l->type->identity ||
            l->type->merge || (m->group_of && m->group_of[i] >= 0))
            continue;
        mgt_layer *bl = &m->layers[b];
        if (!bl->type->takes_x_relu || !bl->type->takes_x_relu(bl, m->be) || bl->ninputs != 1 ||
            bl->inputs[0] != i || (m->group_of && m->group_of[b] >= 0))
            continue;
        l->relu_grad_by_reader = bl->x_relu_grad = 1;
    }
}
