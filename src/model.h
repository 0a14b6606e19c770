/* model.h: a model file becomes a list of layers over two flat arenas.
 *
 * The model file is INI: [input], one section per layer in order, then [train]. Every trainable
 * tensor lives in ONE parameter arena and its gradient at the same offset in ONE gradient arena,
 * so an optimizer step is one call and the gradient all-reduce is one collective. Non-trainable
 * state (batchnorm running statistics) lives in a third arena. Tensors are in PyTorch's layouts
 * and named <layer>.weight, <layer>.bias, <layer>.running_mean, <layer>.running_var.
 *
 * Activations are NHWC, allocated once for the largest local batch when the model is built. */
#ifndef MGT_MODEL_H
#define MGT_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "cpu/optim_math.h" /* the optimizer kinds and their settings */
#include "tensor_io.h"
#include "util.h"

struct mgt_comm;

typedef struct mgt_shape {
    int h, w, c; /* per sample; dense outputs are 1 x 1 x units */
} mgt_shape;

static inline int64_t mgt_shape_elems(mgt_shape s) { return (int64_t)s.h * s.w * s.c; }

typedef enum { MGT_LOSS_SPARSE_CE = 0, MGT_LOSS_CE } mgt_loss;

/* [train]: everything the CLI may override. */
typedef struct mgt_train_cfg {
    mgt_opt_kind optimizer;
    float lr;             /* < 0: the optimizer's default (optim.h) */
    mgt_opt_settings opt; /* the optimizer's other keys (optim.c's key table) */
    mgt_loss loss;
    int64_t batch_size; /* GLOBAL batch */
    int epochs;
    uint64_t seed;
    int augment_flip, augment_crop; /* training augmentation (data/augment.h); 0: off */
} mgt_train_cfg;

/* One named tensor of an arena. */
typedef struct mgt_param {
    char name[128];
    int ndim;
    int64_t shape[4];
    size_t offset, count; /* in floats, within its arena */
    float fan_in, fan_out;  /* for Glorot initialisation (weights) */
    int init;               /* MGT_INIT_* */
} mgt_param;

enum { MGT_INIT_ZERO = 0, MGT_INIT_ONE, MGT_INIT_GLOROT };

typedef struct mgt_layer mgt_layer;
typedef struct mgt_model mgt_model;

/* A batch in backend memory, as forward and the loss read it (staging.h hands it over). */
typedef struct mgt_input {
    const float *x;        /* [n][input], NHWC */
    const int32_t *labels; /* [n] */
    const float *targets;  /* [n][classes] one-hot, for categorical_crossentropy (else NULL) */
} mgt_input;

/* What a layer's forward/backward needs to know about the current step. */
typedef struct mgt_step {
    mgt_input in;           /* the batch */
    mgt_backend *be;
    int n;                  /* local batch (rows of this rank) */
    int training;           /* batch statistics, dropout on */
    int64_t global_step;    /* optimizer steps taken before this one: dropout key */
    int64_t first_sample;   /* position of this rank's first sample within the global batch */
    int64_t global_n;       /* samples in the global batch (all ranks) */
    uint64_t seed;          /* run seed: with global_step and the layer, keys dropout */
    struct mgt_comm *comm;  /* for synchronised batchnorm; NULL: local statistics */
    /* --reproducible (repro.h): the step runs chunk by chunk with exact sums; NULL: off. A chunk
     * is handed to a layer as a step of its own, whose rows start at row0 among the rank's
     * rows: a layer keeping per-row state (maxpool's argmax) offsets it by row0 (0 otherwise). */
    struct mgt_repro *repro;
    int64_t row0;
    /* Backward calls grads_ready(grads_ctx, l, offset, count) as soon as layer l's parameter
     * gradients are final: layer by layer from the last, for each layer with parameters, once
     * the ops writing m->g[offset .. offset + count) (all of l's tensors) are issued and before
     * any op of the layers below it. A bucketed all-reduce starts its buckets' reductions here,
     * overlapping the rest of backward. NULL: nobody listens. */
    void (*grads_ready)(void *grads_ctx, const mgt_layer *l, size_t offset, size_t count);
    void *grads_ctx;
} mgt_step;

/* A layer type: one file in layers/, one line in layers/registry.c. */
typedef struct mgt_layer_type {
    const char *name;        /* the section name */
    const char *const *keys;     /* accepted keys besides "name" (and "activation" if has_act) */
    const char *const *required; /* keys that must be given (NULL: none) */
    int has_act;                 /* accepts activation = */
    void (*defaults)(mgt_layer *l); /* default settings before the section's keys, may be NULL */
    /* Takes one key of its section; returns -1 with a message about the VALUE if it is bad. */
    int (*set)(mgt_layer *l, const char *key, const char *value, mgt_err *err);
    /* Checks the configuration against the input shape, sets l->out, declares parameters with
     * mgt_model_add_param / mgt_model_add_buffer. */
    int (*build)(mgt_model *m, mgt_layer *l, mgt_err *err);
    /* Extra per-layer memory once the batch size is known (argmax, statistics). */
    int (*alloc)(mgt_model *m, mgt_layer *l, int max_batch, mgt_err *err);
    void (*forward)(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x, float *y);
    /* dy: gradient w.r.t. y (may be modified); dx: gradient w.r.t. x, NULL for the first layer. */
    void (*backward)(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                     const float *y, float *dy, float *dx);
    size_t (*scratch)(mgt_backend *be, const mgt_layer *l, int max_batch); /* may be NULL */
    void (*release)(mgt_model *m, mgt_layer *l);          /* may be NULL */
} mgt_layer_type;

/* The registry (layers/registry.c). */
int mgt_layer_type_index(const char *section); /* -1 if unknown */
const mgt_layer_type *mgt_layer_type_at(int index);
const char *mgt_layer_type_nearest(const char *section); /* closest name, or NULL */
const char *mgt_layer_type_names(void);                  /* "dense, conv2d, ..." */
const char *const *mgt_layer_required_keys(const mgt_layer_type *t);
void mgt_layer_defaults(mgt_layer *l);

/* A conv2d layer's geometry (layers/conv2d.c), Keras' rule: "valid" (same = 0) pads nothing, an
 * input smaller than the kernel giving oh or ow 0; "same" gives out = ceil(in / stride), padding
 * split with the odd row/column at the bottom/right. */
mgt_conv_shape mgt_conv2d_geometry(int n, int h, int w, int c, int oc, int kh, int kw, int stride,
                                   int same);
/* --conv-algo: sets every conv2d layer's algorithm ("auto", "direct" or "winograd"; winograd
 * only on the layers it applies to, 3x3 stride 1, the others keeping auto). -1 on a bad name. */
int mgt_conv2d_set_algo(mgt_model *m, const char *algo, mgt_err *err);

/* [train] keys (train_cfg.c): shared by the model file and the CLI's overrides. */
void mgt_train_defaults(mgt_train_cfg *t);
int mgt_train_set(mgt_train_cfg *t, const char *key, const char *value, mgt_err *err);
/* The keys [train] accepts, NULL-terminated in keys[max]; returns their count. */
int mgt_train_keys(const char **keys, int max);
const char *mgt_opt_name(mgt_opt_kind k);
const char *mgt_loss_name(mgt_loss l);

/* Layer-type-specific settings, one struct for all (small and plain). */
typedef struct mgt_layer_cfg {
    int units;                   /* dense */
    int filters, kernel, kernel_w, stride; /* conv2d; pool: kernel = size */
    int same;                    /* conv2d padding */
    int bias;                    /* dense, conv2d */
    float rate;                  /* dropout */
    float momentum, epsilon;     /* batchnorm */
    int sync;                    /* batchnorm: global statistics */
    mgt_act act_type;            /* [activation] */
    int size_set, stride_set;    /* pool keys seen */
    mgt_conv_algo algo;          /* conv2d: algo = auto|direct|winograd */
} mgt_layer_cfg;

struct mgt_layer {
    const mgt_layer_type *type;
    char name[64];
    int index;  /* 0-based position */
    int line;   /* section header line in the model file */
    mgt_shape in, out;
    mgt_act act;      /* applied after the layer's own op (activation = key) */
    int fused_act;    /* softmax left to the loss op (last layer, cross-entropy) */
    mgt_layer_cfg cfg;
    int param[4];     /* indices into m->params (-1: none) */
    int buffer[2];    /* indices into m->buffers */
    float *y;         /* output activations [max_batch][out] */
    void *state[4];   /* layer-private backend memory (argmax, mean, invstd, ...) */
};

struct mgt_model {
    char name[64];    /* from the file name: examples/mlp.cfg -> "mlp" */
    char path[512];
    mgt_shape input;
    int nlayers;
    mgt_layer *layers;
    mgt_train_cfg train;
    int classes;      /* the last layer's units */

    int nparams, nbuffers;
    mgt_param params[256], buffers[64];
    size_t param_count, buffer_count; /* floats */

    /* Backend memory, after mgt_model_alloc. */
    mgt_backend *be;
    int max_batch;
    float *w, *g, *buf;  /* parameter, gradient and buffer arenas */
    float *x;            /* input batch [max_batch][input] */
    int32_t *labels;     /* [max_batch] */
    float *targets;      /* one-hot targets for categorical CE */
    float *probs;        /* softmax when the last layer outputs logits */
    float *grad[2];      /* ping-pong activation gradients */
    float *sums;         /* loss sum, correct count: inside the gradient arena, after it */
    int first_trainable; /* layers up to this one need no input gradient */
};

/* Parses a model file (or, when text != NULL, that text under the name `path`). Every error names
 * file:line and the key. */
int mgt_model_parse(mgt_model *m, const char *path, const char *text, mgt_err *err);
/* Declares a tensor (used by layers' build). Returns its index. */
int mgt_model_add_param(mgt_model *m, mgt_layer *l, const char *suffix, int ndim,
                        const int64_t *shape, int init, float fan_in, float fan_out);
int mgt_model_add_buffer(mgt_model *m, mgt_layer *l, const char *suffix, int ndim,
                         const int64_t *shape, int init);
/* Allocates arenas and activations for local batches up to max_batch. */
int mgt_model_alloc(mgt_model *m, mgt_backend *be, int max_batch, mgt_err *err);
void mgt_model_free(mgt_model *m);

/* Glorot-uniform weights, zero biases, batchnorm gamma 1 / running var 1: Keras' defaults,
 * a pure function of the seed. Host arrays [param_count] and [buffer_count]. */
void mgt_model_init_host(const mgt_model *m, uint64_t seed, float *w, float *buf);

/* Layer l's tensors in the parameter arena: one range holds them all, as a layer declares them
 * one after another (mgt_model_add_param). Returns the range's floats (0: no parameters) and
 * its first in *lo. */
size_t mgt_layer_param_range(const mgt_model *m, const mgt_layer *l, size_t *lo);
/* Forward pass over the s->n rows of s->in. Returns the output (logits or probabilities). */
float *mgt_model_forward(mgt_model *m, const mgt_step *s);
/* Loss on the last forward's output against s->in: adds to m->sums; when backward is set, also
 * back-propagates, writing the SUM over the rows of per-sample gradients into m->g. */
void mgt_model_loss_backward(mgt_model *m, const mgt_step *s, int backward);
/* Applies the final softmax where it was fused into the loss (predict without labels). */
void mgt_model_finish_output(mgt_model *m, const mgt_step *s, float *out);

/* Prints the layer table (name, type, output shape, parameters) and totals. */
void mgt_model_summary(const mgt_model *m, FILE *f);

/* Weights file I/O in PyTorch layout/names: writes params and buffers from host arrays; reads and
 * checks names and shapes against the model. */
int mgt_model_weights_entries(const mgt_model *m, const float *w, const float *buf,
                              mgt_tensor_entry *out, int max);
int mgt_model_load_weights(const mgt_model *m, const char *path, float *w, float *buf,
                           mgt_err *err);
/* Copies tensors by name from a loaded file into host arenas (names and shapes checked). */
int mgt_model_take_weights(const mgt_model *m, const mgt_safetensors *st, const char *path,
                           float *w, float *buf, mgt_err *err);

#endif
