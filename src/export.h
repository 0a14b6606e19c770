/* export.h: a trained model as an ONNX file (`mgtrain export --format onnx`).
 *
 * The graph takes what mgtrain's layers take: a float32 input [batch, H, W, C] (NHWC, the batch
 * dynamic) on the scale the data loaders give (8-bit images divided by 255), normalised inside
 * the graph where [input] has mean and std; one Transpose makes it NCHW, ONNX's layout, and every
 * layer after it is written in NCHW: [batch, C, H, W] for images, [batch, C] for flat values
 * (after [flatten], [global_avgpool] and [dense]). The output is the last layer's, [batch,
 * classes], its softmax applied where the layer has one (what `mgtrain predict` writes).
 * A language model ([input] context and vocab) takes int64 token ids [batch, sequence], both
 * dynamic (a sequence at most the context long), and gives [batch, sequence, vocab]: its layers
 * work on [batch, T, C] values, channels last, as PyTorch's do. Dropout
 * is gone; a batchnorm is folded into the convolution before it (its only reader, with no
 * activation between) unless the caller keeps it, and is otherwise a BatchNormalization node
 * with its moving statistics.
 *
 * Each layer type writes its own op (model.h: mgt_layer_type.onnx) through the values and
 * helpers below; the exporter adds its activation, and resolves the ranks and names between
 * layers. A type without an export function is refused by name. */
#ifndef MGT_EXPORT_H
#define MGT_EXPORT_H

#include "model.h"
#include "onnx.h"

/* What a layer's export function works with. */
struct mgt_onnx_layer {
    mgt_onnx *g;
    const float *w, *buf; /* the model's parameter and buffer arenas (host) */
    int ninputs;
    const char *in[MGT_MAX_INPUTS]; /* the inputs' values, as the exporter holds them */
    int in_rank[MGT_MAX_INPUTS];    /* 4: [batch, C, H, W]; 2: [batch, C]; 3: [batch, T, C] */
    char out[160];                  /* the value the layer writes */
    int out_rank;                   /* the layer sets it: 4, 2 or 3 */
    /* conv2d and separable_conv2d: a batchnorm after the layer folded into its weights: each
     * output channel's weights times scale[c], its bias times scale[c] plus shift[c] (NULL:
     * none). */
    const float *fold_scale, *fold_shift;
    /* A layer whose output is its input's value (dropout, a folded batchnorm, a flatten of a
     * flat value) sets alias to that input's index instead of writing a node. */
    int alias;
    char tmp[4][192]; /* names the helpers make */
    int ntmp;
};

/* Input k as a 4-D [batch, C, H, W] or 2-D [batch, C] value (a Reshape where it is the other). */
const char *mgt_onnx_input4(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int k);
const char *mgt_onnx_input2(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int k);
/* Tensor i of the layer (its param[i]) as an initializer named as in the weights file; returns
 * that name (NULL when out of memory). */
const char *mgt_onnx_param(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int i);
/* A value name of the layer's own: "<out>/<suffix>". */
const char *mgt_onnx_name(mgt_onnx_layer *x, const char *suffix);

/* A convolution's weight (tensor wi, output channels first) and bias (tensor bi; -1 or absent:
 * none) as initializers, with a folded batchnorm (fold_scale) applied; their names into *wn and
 * *bn (NULL: no bias). */
int mgt_onnx_conv_params(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, int wi, int bi,
                         const char **wn, const char **bn);
/* A Conv node of geometry s (its padding as mgtrain computes it) and group count. */
int mgt_onnx_conv_node(mgt_onnx_layer *x, const char *in, const char *wn, const char *bn,
                       const mgt_conv_shape *s, int group, const char *out);

typedef struct mgt_export_opts {
    int keep_bn;         /* batchnorms stay BatchNormalization nodes (no folding) */
    const char *version; /* the producer's version, for the file */
} mgt_export_opts;

/* Writes model m with the host arenas w and buf to path as ONNX (atomically). */
/* What the model's output is, for the messages of export and predict: "softmax probabilities",
 * "sigmoid probabilities", "logits", or a regression's "values". */
const char *mgt_export_output_kind(const mgt_model *m);
int mgt_export_onnx(const mgt_model *m, const float *w, const float *buf, const mgt_export_opts *o,
                    const char *path, mgt_err *err);

#endif
