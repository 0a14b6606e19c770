/* activation.c: a stand-alone activation layer ([activation] type = relu). Its own op is y = x
 * (identity): the executor applies l->act from x into y in one pass (in place where the planner
 * lets y take x's memory) and its gradient straight into dx, adding where dx gathers several
 * gradients (model.c); a ReLU after a batchnorm or a residual sum runs inside their group
 * (fuse.c). */
#include <string.h>

#include "layer_util.h"

static const char *const keys[] = {"type", NULL};
static const char *const required[] = {"type", NULL};

static int set(mgt_layer *l, const char *key, const char *v, mgt_err *err) {
    (void)key;
    if (mgt_parse_act(v, &l->act) < 0)
        return mgt_errf(err, "unknown; use relu, sigmoid, tanh, softmax, gelu, gelu_tanh or none");
    return 0;
}

static int build(mgt_model *m, mgt_layer *l, mgt_err *err) {
    (void)m, (void)err;
    l->out = l->in;
    return 0;
}

const mgt_layer_type mgt_layer_activation = {
    .name = "activation", .keys = keys, .required = required, .set = set, .build = build,
    .inplace = 1, .identity = 1,
};
