/* registry.c: the layer types a model file may name. Adding a layer: a file in layers/, one line
 * here, and the ops it needs in cpu/ and cuda/. */
#include <stddef.h>
#include <string.h>

#include "../model.h"
#include "../parse.h"

extern const mgt_layer_type mgt_layer_dense, mgt_layer_conv2d, mgt_layer_maxpool,
    mgt_layer_avgpool, mgt_layer_batchnorm, mgt_layer_dropout, mgt_layer_flatten,
    mgt_layer_activation;
extern const mgt_layer_type mgt_layer_add, mgt_layer_concat, mgt_layer_depthwise_conv2d,
    mgt_layer_separable_conv2d, mgt_layer_global_avgpool, mgt_layer_zeropad;
extern const mgt_layer_type mgt_layer_embedding, mgt_layer_layernorm, mgt_layer_attention;

static const mgt_layer_type *const types[] = {
    &mgt_layer_dense,   &mgt_layer_conv2d,  &mgt_layer_maxpool, &mgt_layer_avgpool,
    &mgt_layer_batchnorm, &mgt_layer_dropout, &mgt_layer_flatten, &mgt_layer_activation,
    &mgt_layer_add, &mgt_layer_concat, &mgt_layer_depthwise_conv2d, &mgt_layer_separable_conv2d,
    &mgt_layer_global_avgpool, &mgt_layer_zeropad, &mgt_layer_embedding, &mgt_layer_layernorm,
    &mgt_layer_attention,
};
enum { NTYPES = sizeof types / sizeof types[0] };

int mgt_layer_type_index(const char *section) {
    for (int i = 0; i < NTYPES; i++)
        if (!strcmp(types[i]->name, section))
            return i;
    return -1;
}

const mgt_layer_type *mgt_layer_type_at(int index) { return types[index]; }

const char *mgt_layer_type_nearest(const char *section) {
    const char *names[NTYPES + 2];
    for (int i = 0; i < NTYPES; i++)
        names[i] = types[i]->name;
    names[NTYPES] = "input";
    names[NTYPES + 1] = "train";
    return mgt_nearest(section, names, NTYPES + 2);
}

/* The type names in registry order, for messages: a new type must be added here too. */
_Static_assert(NTYPES == 17, "a layer type was added or removed: update mgt_layer_type_names");
const char *mgt_layer_type_names(void) {
    static const char names[] = "dense, conv2d, maxpool, avgpool, batchnorm, dropout, flatten, "
                                "activation, add, concat, depthwise_conv2d, separable_conv2d, "
                                "global_avgpool, zeropad, embedding, layernorm, attention";
    return names;
}

const char *const *mgt_layer_required_keys(const mgt_layer_type *t) { return t->required; }

void mgt_layer_defaults(mgt_layer *l) {
    if (l->type->defaults)
        l->type->defaults(l);
}
