/* model.h: a model file becomes a graph of layers over two flat arenas.
 *
 * The model file is INI: [input], one section per layer, then [train] (how the model is trained,
 * which the model itself does not read: train_cfg.h). A layer takes the
 * previous layer's output unless it names its inputs (input = NAME, inputs = A, B: layers above
 * it, or "input" for the model's input), so the file order is an order of computation and the
 * graph has no cycles by construction; the last layer is the output. Merge layers ([add],
 * [concat]) take two or more inputs. Every trainable tensor lives in ONE parameter arena and its
 * gradient at the same offset in ONE gradient arena, so an optimizer step is one call and the
 * gradient all-reduce is one collective. Non-trainable state (batchnorm running statistics) lives
 * in a third arena. Tensors are in PyTorch's layouts and named <layer>.weight, <layer>.bias,
 * <layer>.running_mean, <layer>.running_var (a separable convolution: <layer>.depthwise.weight,
 * <layer>.pointwise.weight, <layer>.pointwise.bias).
 *
 * Activations are NHWC values (a sequence's: (T, C), one row a position: mgt_shape) of the
 * backend's activation type (float32, or bfloat16 on a GPU
 * with --precision bf16: backend.h), in one arena allocated for the largest local batch when the
 * model is built. A planner (mgt_model_plan) places every activation, every gradient of an
 * activation and every layer's temporary tensor at an offset of that arena for the span of the
 * step in which it is needed (forward, and backward where backward reads it), so memory a later
 * layer no longer needs is used again. A batchnorm and the ReLU or residual sum after it run as
 * one fusion group (fuse.c, mgt_group), whose inner tensors take no memory. */
#ifndef MGT_MODEL_H
#define MGT_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "data/augment.h" /* the input transform of [input] */
#include "tensor_io.h"
#include "util.h"

struct mgt_comm;

/* A tensor's shape per sample: an image h x w x c (NHWC; dense outputs 1 x 1 x units), or, with
 * seq set, a sequence of w positions of c channels each (h = 1): a transformer's (T, C), one row
 * of c values per position, so a batch is n * w rows (the (B, T, C) of llm.c and nanoGPT). */
typedef struct mgt_shape {
    int h, w, c;
    int seq;
} mgt_shape;

/* Capacities. The backends take element counts as int (BLAS, cuBLAS and cuDNN do too), so every
 * tensor, a parameter or one layer's activations for the whole local batch, holds at most
 * MGT_MAX_TENSOR_ELEMS values; sizes are computed in 64 bits and checked against it, and a model
 * past it is refused as "too large" when it is parsed (per sample) or allocated (per batch).
 * A model file has at most MGT_MAX_LAYERS layers (ResNet-152 has about 500 in Keras' count). */
#define MGT_MAX_TENSOR_ELEMS ((int64_t)2147483647)
#define MGT_MAX_LAYERS 4096

static inline int64_t mgt_shape_elems(mgt_shape s) { return (int64_t)s.h * s.w * s.c; }

/* The loss the last layer's output is scored with: cross-entropy against integer labels (sparse)
 * or one-hot targets; or, against float targets of the output's shape (model.h: mgt_input's
 * targets), Keras' binary cross-entropy (a sigmoid per output, so one or several labels per
 * sample), mean squared error, mean absolute error or Huber's loss. A sample's loss is the mean
 * over its outputs (Keras' and PyTorch's "mean" reduction both come to this). */
typedef enum {
    MGT_LOSS_SPARSE_CE = 0,
    MGT_LOSS_CE,
    MGT_LOSS_BCE,
    MGT_LOSS_MSE,
    MGT_LOSS_MAE,
    MGT_LOSS_HUBER
} mgt_loss;

/* Whether loss l is a softmax cross-entropy (integer labels or one-hot targets, one class per
 * sample); the others score float targets element by element (backend.h: elem_loss). */
static inline int mgt_loss_is_xent(mgt_loss l) {
    return l == MGT_LOSS_SPARSE_CE || l == MGT_LOSS_CE;
}
/* Whether loss l is a regression loss (no accuracy: mean absolute error and its root mean
 * square instead). */
static inline int mgt_loss_is_regression(mgt_loss l) {
    return l == MGT_LOSS_MSE || l == MGT_LOSS_MAE || l == MGT_LOSS_HUBER;
}

/* One named tensor of an arena. */
typedef struct mgt_param {
    char name[128];
    int ndim;
    int64_t shape[4];
    size_t offset, count; /* in floats, within its arena */
    float fan_in, fan_out;  /* for Glorot initialisation (weights) */
    int init;               /* MGT_INIT_* */
    float std;              /* MGT_INIT_NORMAL's standard deviation */
} mgt_param;

/* Zeros, ones, Keras' Glorot-uniform, or a normal distribution of mean 0 (GPT-2's 0.02). */
enum { MGT_INIT_ZERO = 0, MGT_INIT_ONE, MGT_INIT_GLOROT, MGT_INIT_NORMAL };

/* The step's sums that travel with the gradients, right after the arena (m->sums, m->nsums of
 * them), each an exact count or a sum the loss op adds to: the loss, the correct predictions
 * (one per sample; with binary cross-entropy one per output, Keras' binary accuracy), the top-5
 * hits (softmax cross-entropy), then the task's own sums (MGT_SUM_TASK on, mgt_task_sums), and
 * last the count of ranks asking to stop (fit.c). The task's own:
 *   binary cross-entropy: true positives, false positives and false negatives over every output
 *     (micro), then the same three for each output (label) where there are 2 to
 *     MGT_LABEL_SUMS_MAX of them (per-label precision, recall and F1);
 *   regression: the sum of |y - t| and of (y - t)^2 over every output (MAE and RMSE).
 * A model's count is fixed by its loss and outputs (mgt_model_check_output sets it). */
/* (The indices, MGT_SUM_*, are backend.h's: the loss ops write them.) */
#define MGT_LABEL_SUMS_MAX 64
/* The most sums of a task, and of a step (the task's and the four others). */
#define MGT_TASK_SUMS_MAX (MGT_SUM_LABELS + 3 * MGT_LABEL_SUMS_MAX)
#define MGT_SUMS_MAX (MGT_SUM_TASK + MGT_TASK_SUMS_MAX + 1)
/* The most class weights a model takes (a [train] list is at most 255 characters anyway). */
#define MGT_CW_MAX 128

typedef struct mgt_layer mgt_layer;
typedef struct mgt_model mgt_model;
typedef struct mgt_fused mgt_fused;
typedef struct mgt_onnx_layer mgt_onnx_layer; /* export.h */

/* A batch in backend memory, as forward and the loss read it (staging.h hands it over). */
typedef struct mgt_input {
    const float *x;        /* [n][input], NHWC */
    const int32_t *labels; /* [n] */
    /* [n][classes]: one-hot for categorical_crossentropy, the float targets of the losses that
     * read them (mgt_loss_is_xent false); NULL for sparse_categorical_crossentropy */
    const float *targets;
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
     * is a step of its own whose n rows are rows row0 .. row0 + n - 1 of the rank's batch in
     * every per-sample tensor (s->in, the activations and their gradients, the layers' saved and
     * work memory): model.c hands each layer its rows of x, y, dy and dx, and a layer that uses
     * its own saved or work memory takes its rows with mgt_step_rows. row0 is 0 otherwise. */
    struct mgt_repro *repro;
    int64_t row0;
    /* Backward calls grads_ready(grads_ctx, l, offset, count) as soon as layer l's parameter
     * gradients are final: layer by layer from the last, for each layer with parameters, once
     * the ops writing m->g[offset .. offset + count) (all of l's tensors) are issued and before
     * any op of the layers below it. A bucketed all-reduce starts its buckets' reductions here,
     * overlapping the rest of backward. NULL: nobody listens.
     * A layer whose type has grad_rows may hand over parts of its range first, each as soon as
     * it is final, from the highest offset down (mgt_step_grads_part); the whole range still
     * comes after them. So every call's range ends at or below the start of the ranges heard
     * before it, or covers them (the whole layer's). */
    void (*grads_ready)(void *grads_ctx, const mgt_layer *l, size_t offset, size_t count);
    void *grads_ctx;
    /* 1: no reduction waits on the parts (one rank), so a layer with grad_rows computes and
     * hands over its gradients whole, as one product: the row blocks would only cost their
     * repeated packing of the layer's input. */
    int whole_grads;
} mgt_step;

/* A part of layer l's gradients, m->g[offset .. offset + count), is final (see grads_ready). */
static inline void mgt_step_grads_part(const mgt_step *s, const mgt_layer *l, size_t offset,
                                       size_t count) {
    if (s->grads_ready)
        s->grads_ready(s->grads_ctx, l, offset, count);
}

/* The step's rows of a per-sample tensor of `per_sample` bytes a sample (see row0). */
static inline void *mgt_step_bytes(void *base, const mgt_step *s, size_t per_sample) {
    return base ? (char *)base + (size_t)s->row0 * per_sample : NULL;
}

/* The step's rows of a per-sample activation tensor of `per_sample` values a sample, values of
 * the backend's activation type (backend.h: mgt_backend.act). */
static inline float *mgt_step_rows(float *base, const mgt_step *s, size_t per_sample) {
    return (float *)mgt_step_bytes(base, s, per_sample * mgt_dtype_size(s->be->act));
}

/* What a layer type's backward reads of its forward pass (the planner keeps those alive): its
 * input x, its own output y (besides what its activation reads: attention's output). */
enum { MGT_BWD_READS_X = 1, MGT_BWD_READS_Y = 2 };

/* A layer type: one file in layers/, one line in layers/registry.c. */
typedef struct mgt_layer_type {
    const char *name;        /* the section name */
    /* accepted keys besides "name", "input"/"inputs" (and "activation" if has_act) */
    const char *const *keys;
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
    /* May be NULL. 1 when forward on backend be writes the layer's activation (l->act, not
     * left to the loss) itself: the executor then runs no pass of its own for it. Never with
     * m->no_fusion, which runs every op by itself. */
    int (*applies_act)(const mgt_model *m, const mgt_layer *l, const mgt_backend *be);
    /* May be NULL. 1 when backward on backend be applies the gradient of the layer's own
     * activation to dy itself (in the pass that reads dy first): the executor then runs no pass
     * of its own for it. Never with m->no_fusion, nor where the layer's reader applies it
     * (l->relu_grad_by_reader). */
    int (*applies_act_grad)(const mgt_model *m, const mgt_layer *l, const mgt_backend *be);
    /* May be NULL. 1 when backward on backend be can apply the gradient of the ReLU that wrote
     * its input x (x > 0 ? g : 0) to the gradient it writes (fuse.c: mgt_fuse_relu_grads; it
     * then finds l->x_relu_grad set). */
    int (*takes_x_relu)(const mgt_layer *l, const mgt_backend *be);
    /* May be NULL. How backward on a backend with ops o writes and hands over (grads_ready)
     * the layer's gradients: 0, whole; rows > 0, the tensors above its first one first, then
     * the first tensor (shape[0] rows, laid out row after row) in blocks of `rows` rows from
     * the last block down. The bucket plan cuts buckets between those parts only. */
    int (*grad_rows)(const mgt_layer *l, const mgt_ops *o);
    void (*release)(mgt_model *m, mgt_layer *l);          /* may be NULL */
    /* MGT_BWD_READS_X when backward reads its input x (the planner keeps x until then). A
     * layer's own output y is kept for backward only where its activation needs it. */
    int bwd_reads;
    /* The output may take the input's memory (an elementwise op whose backward reads neither x
     * nor y): the planner lets it where nothing else needs the input afterwards. */
    int inplace;
    /* May be NULL. 1 when the output holds the input's bytes unchanged (a flatten of one channel
     * or of one pixel per sample): where that input is the model's float32 input, the layer is a
     * view of it (mgt_layer.input_view). */
    int (*same_bytes)(const mgt_layer *l);
    /* Per-sample bytes of layer-private memory the planner places, where an activation value
     * takes act_bytes (mgt_dtype_size of the backend's): `saved` lives from the layer's forward
     * to its backward (l->saved), `work` during its backward only (l->work). May be NULL. */
    void (*temps)(const mgt_layer *l, size_t act_bytes, size_t *saved, size_t *work);
    /* Merge layers (two or more inputs: inputs = a, b, ...) have these instead of forward and
     * backward, with one x and one dx per input. dx[k] is NULL where input k needs no gradient;
     * accumulate[k] says to add to dx[k] instead of overwriting it (the input already holds the
     * gradient from another of its consumers). */
    int merge;
    void (*forward_n)(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *const *x,
                      float *y);
    void (*backward_n)(mgt_model *m, mgt_layer *l, const mgt_step *s, float *dy, float *const *dx,
                       const int *accumulate);
    /* What the fusion pass (fuse.c) may join into a group, and how:
     *  identity: the layer's own op is y = x ([activation]): the executor applies its activation
     *    from x to y in one pass and its gradient straight into dx (backend.h: act_fwd,
     *    act_bwd); forward and backward are not called;
     *  residual_sum: the layer adds its inputs ([add]);
     *  cancellable_bias: its bias (param[1]) is a per-channel constant added to the output, which
     *    a batchnorm reading the output alone cancels; the layer leaves it out in training where
     *    l->bias_cancelled says so, and writes a zero gradient for it;
     *  forward_fused / backward_fused: a normalisation (batchnorm) that runs a group's residual
     *    sum and ReLU in its own passes (mgt_fused); its forward and backward are these with
     *    nothing fused. */
    int identity, residual_sum, cancellable_bias;
    void (*forward_fused)(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                          const mgt_fused *f, float *y);
    void (*backward_fused)(mgt_model *m, mgt_layer *l, const mgt_step *s, const float *x,
                           const mgt_fused *f, float *dy, float *dx);
    /* May be NULL (the type cannot be exported yet). Writes the layer's own op as ONNX nodes
     * (export.h: its inputs, weights and output value; the layer's activation is added after
     * it). -1 with err when out of memory or the layer's settings have no ONNX equivalent. */
    int (*onnx)(mgt_onnx_layer *x, const mgt_model *m, const mgt_layer *l, mgt_err *err);
} mgt_layer_type;

/* What a fusion group hands its batchnorm (forward_fused, backward_fused). */
struct mgt_fused {
    const float *r;     /* forward: the residual sum's other input (the step's rows), or NULL */
    const float *y;     /* backward: the group's output, its ReLU's mask (NULL: from x) */
    mgt_act act;        /* MGT_ACT_RELU to end in a ReLU, or MGT_ACT_NONE */
    const float *shift; /* forward: the bias of the convolution before it, which it cancels */
    float *dr;          /* backward: the residual's gradient (NULL: none wanted) */
    int accumulate;     /* backward: add to dr instead of writing it */
};

/* A fusion group (fuse.c): a batchnorm and the element-wise layers after it that run in its
 * passes; layer indices, -1 where the group has none. The group runs, forward and backward,
 * where its tail runs (the executor skips its other layers), its output is the tail's, and the
 * tensors inside it are not planned. */
typedef struct mgt_group {
    int bn;   /* the batchnorm */
    int add;  /* the residual sum reading bn's output */
    int res;  /* the add's input slot of the residual (its other input) */
    int act;  /* the layer whose ReLU ends the group: an [activation] layer, or the add itself */
    int tail; /* the group's last layer */
} mgt_group;

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

/* Layer-type-specific settings, one struct for all (small and plain). */
typedef struct mgt_layer_cfg {
    int units;                   /* dense */
    int filters, kernel, kernel_w, stride; /* conv2d; pool: kernel = size */
    int same;                              /* conv2d, pool padding */
    int bias;                    /* dense, conv2d */
    int pad[4];                  /* zeropad: top, bottom, left, right */
    float rate;                  /* dropout */
    float momentum, epsilon;     /* batchnorm */
    int sync;                    /* batchnorm: global statistics */
    mgt_act act_type;            /* [activation] */
    int size_set, stride_set;    /* pool keys seen */
    mgt_conv_algo algo;          /* conv2d: algo = auto|direct|winograd */
    int w_in_out;                /* dense: weight_layout = in_out ([in][out], GPT-2's Conv1D) */
    float init_std;              /* dense, embedding: > 0: normal weights of this deviation */
    int heads, causal;           /* attention */
    int positions;               /* embedding: the position table's rows (0: none) */
} mgt_layer_cfg;

enum { MGT_MAX_INPUTS = 16 };

struct mgt_layer {
    const mgt_layer_type *type;
    char name[64];
    int index;  /* 0-based position */
    int line;   /* section header line in the model file */
    mgt_shape in, out; /* in: the first input's shape */
    /* The layers whose outputs this one takes (-1: the model's input), in the order given. */
    int ninputs;
    int inputs[MGT_MAX_INPUTS];
    char inputs_text[256]; /* the input / inputs key as written ("" : the previous layer) */
    int inputs_line;
    int consumers; /* how many input slots of later layers take this one's output */
    /* Bit k: backward adds input k's gradient to what a later consumer of the same tensor
     * wrote (set by mgt_model_alloc). */
    unsigned accumulate;
    mgt_act act;      /* applied after the layer's own op (activation = key) */
    int fused_act;    /* softmax left to the loss op (last layer, cross-entropy) */
    mgt_layer_cfg cfg;
    int param[4];     /* indices into m->params (-1: none) */
    /* A tensor of another layer that this one uses as its weight (dense's tied = NAME: an output
     * layer tied to the token embedding), an index into m->params, -1 for none; the name as
     * written. The layer then has no weight of its own. The tensor's gradient is written by
     * whichever of its users runs backward first (the later one in the file) and added to by
     * the others, whose grad_accumulate is set (mgt_model_alloc). */
    int tied;
    char tied_name[128];
    int grad_accumulate;
    int buffer[2];    /* indices into m->buffers */
    float *y;         /* output activations [max_batch][out] (in the activation arena) */
    float *saved, *work; /* the planner's layer-private memory (temps), or NULL */
    void *state[4];      /* layer-private backend memory (mean, invstd, ...) */
    int bias_cancelled;  /* cancellable_bias: a batchnorm cancels the bias (fuse.c) */
    /* The gradient of the layer's own ReLU is applied by the layer that alone reads its output
     * (relu_grad_by_reader), which masks its input's gradient (x_relu_grad): fuse.c. */
    int relu_grad_by_reader, x_relu_grad;
    /* trainable = false in its section, or named by mgt_model_freeze (Keras' layer.trainable =
     * False): its tensors never move and get no gradient (they sit after every trainable one in
     * the parameter arena, past m->grad_count), and a batchnorm normalises with its moving
     * statistics, as Keras' frozen BatchNormalization runs in inference mode. */
    int frozen;
    /* A view of the model's input (same_bytes, reading the float32 input, not the last layer):
     * its forward does nothing and its readers read the step's input itself, as PyTorch's
     * flatten of a contiguous tensor is a view (the MLP's copied 0.8 MB a step at batch 256). */
    int input_view;
};

/* The activation memory plan (mgt_model_plan): where each tensor lives in the arena. Blocks are
 * the layers' outputs, the gradients of those outputs, the layers' saved and work tensors and
 * one buffer for gradients a second consumer adds in; each has a life span in the step's
 * timeline (layer i's forward at time i, the loss at L, layer i's backward at 2L - i). */
typedef struct mgt_plan {
    size_t *y, *dy, *saved, *work; /* per layer: byte offsets into the arena (SIZE_MAX: none) */
    size_t acc;                    /* the accumulation buffer's offset (SIZE_MAX: none) */
    int *y_from;                   /* per layer: the layer whose memory y shares (itself if none) */
    size_t arena;                  /* bytes of the arena */
    size_t unplanned;              /* bytes if every block had its own memory (share = 0) */
    size_t live_peak;              /* the most bytes alive at one time: no plan needs less */
} mgt_plan;

struct mgt_model {
    char name[64];    /* from the file name: examples/mlp.cfg -> "mlp" */
    char path[512];
    mgt_shape input;
    /* Token input ([input] context and vocab): the input is a sequence of input.w token ids in
     * [0, vocab), float32 values (whole numbers) read by an [embedding], never converted to
     * another activation type; 0 for an image input. labels_per_sample: the integer labels each
     * sample has, 1, or a sequence output's positions (the next token at every position). */
    int vocab;
    int labels_per_sample;
    /* [input] shape's rank: 3 (H, W, C) or 1 (F values a sample, tabular rows: the shape is then
     * (1, 1, F)). */
    int input_rank;
    mgt_input_tf input_tf; /* [input] mean, std, center_crop (data/augment.h) */
    int nlayers;
    mgt_layer *layers;
    /* The loss ([train] loss and label_smoothing, set by whoever reads the [train] section:
     * train_cfg.h): Keras' label_smoothing of the cross-entropy, in [0, 1]. */
    mgt_loss loss;
    float label_smoothing;
    /* Huber's delta (Keras' default 1), and the class weights ([train] class_weight; NULL:
     * none): sparse and categorical cross-entropy weigh each sample's loss by its class's
     * (ncw = classes), binary cross-entropy each output's term by the weight of its target, the
     * negative's cw[0] and the positive's cw[1] (ncw = 2), as Keras' class_weight weighs a
     * single sigmoid output's samples (for several labels: PyTorch's pos_weight, with cw[0] too).
     * The loss is divided by the samples, not by the weights (Keras' sum over the batch size).
     * They weigh training's loss only, as Keras' fit(class_weight): evaluation's is unweighted. */
    float huber_delta;
    float cw[MGT_CW_MAX];
    int ncw;
    /* The last layer's outputs a sample: its units (the classes of cross-entropy, the labels
     * of binary cross-entropy), all of its values for a regression. */
    int classes;
    int nsums;        /* the step's metric sums (MGT_SUM_*), set with the loss */

    int nparams, nbuffers;
    mgt_param *params, *buffers; /* grown as layers declare tensors; freed by mgt_model_free */
    int params_cap, buffers_cap;
    int add_failed; /* a declaration failed (the build then fails) */
    /* Bytes of an activation value in the arena: the backend's type (mgt_model_alloc sets it;
     * 0 before, which plans float32, as mgt_model_summary does). */
    size_t act_bytes;
    int no_memory_sharing; /* set before mgt_model_alloc: plan with share = 0 (tests) */
    int no_fusion;         /* set before mgt_model_alloc: no fusion groups (tests, comparisons) */
    /* Set before mgt_model_alloc to place w and g in host memory a transport shares between the
     * ranks (comm.h: mgt_comm_share; asked once for each, on every rank alike). That memory is
     * the transport's and is not freed with the model. NULL: the backend's memory. */
    void *(*share)(void *ctx, size_t bytes);
    void *share_ctx;
    size_t param_count, buffer_count; /* floats */
    /* Floats of the trainable tensors: the parameter arena's first grad_count floats, which the
     * gradient arena, its all-reduce and the optimizer cover; the frozen layers' tensors follow
     * them (mgt_model_layout). Without frozen layers, param_count. */
    size_t grad_count;

    /* Backend memory, after mgt_model_alloc. */
    mgt_backend *be;
    int max_batch;
    float *w, *g, *buf; /* parameter, gradient and buffer arenas */
    float *x;           /* input batch [max_batch][input] */
    int32_t *labels;    /* [max_batch] */
    float *targets;     /* one-hot targets for categorical CE */
    float *probs;       /* softmax when the last layer outputs logits */
    float *sums;        /* nsums step sums: inside the gradient arena, after it */
    float *cw_dev;      /* the class weights in backend memory (NULL: none) */
    float *act;         /* the activation arena (plan.arena bytes) */
    /* Where the backend's activations are not float32 (be->act): the input batch in their type
     * (the first layer reading it converts the step's rows), the output in float32 (the loss,
     * predict and evaluate read it) and its gradient in float32 (the loss writes it, converted
     * into the last layer's dy); NULL otherwise. input_reader: the first layer reading the
     * model's input. */
    float *x_act, *out_f, *dout_f;
    int input_reader;
    float *grad_acc; /* where a second consumer's input gradient goes before it is added */
    mgt_plan plan;
    float **dy;      /* per layer: the gradient of its output in the arena, or NULL */
    int *needs_grad; /* per layer: its output's gradient is needed (params at or above it) */
    /* The fusion groups (mgt_fuse_find): ngroups of them, group_of[i] layer i's (-1: none),
     * bias_of[i] for a batchnorm the convolution whose bias it cancels (-1: none). */
    int ngroups;
    mgt_group *groups;
    int *group_of, *bias_of;
};

/* The fusion groups of m's graph (fuse.c; none with m->no_fusion): returns their count and fills
 * groups (room for nlayers), group_of (nlayers) and bias_of (nlayers), as mgt_model's fields
 * say. A function of the graph and of m->be's cancel_bias (none without a backend) alone, so
 * every rank and the planner find the same. */
int mgt_fuse_find(const mgt_model *m, mgt_group *groups, int *group_of, int *bias_of);
/* Sets the layers' relu_grad_by_reader and x_relu_grad (fuse.c) from the graph, the groups
 * found and what the readers take on m->be (takes_x_relu). */
void mgt_fuse_relu_grads(mgt_model *m);
/* Whether layer i's pass sums over the step's samples (a batchnorm, alone or at the tail of its
 * group, in training): --reproducible runs it on the whole step, not chunk by chunk. */
int mgt_model_layer_whole(const mgt_model *m, int i);
/* Whether layer i runs inside its fusion group's tail, with no pass of its own (its parameters'
 * gradients, if any, are written there). */
int mgt_model_layer_inner(const mgt_model *m, int i);

/* The section of a model file that the model does not own: [train], the last one, which says how
 * the model is trained (train_cfg.h reads it). The parser checks each of its keys against `keys`,
 * hands the value to `set` (whose message it reports at the key's line, after "[train] "), and
 * requires the `required` keys; both lists are NULL-terminated. */
typedef struct mgt_model_section {
    const char *const *keys;
    const char *const *required;
    int (*set)(void *ctx, const char *key, const char *value, mgt_err *err);
    void *ctx;
} mgt_model_section;

/* Parses a model file (or, when text != NULL, that text under the name `path`), its [train]
 * section through `train`. Every error names file:line and the key. */
int mgt_model_parse(mgt_model *m, const char *path, const char *text,
                    const mgt_model_section *train, mgt_err *err);
/* The same for the len bytes at text, as read from a file: a NUL byte among them is an error
 * (a C string would end there). */
int mgt_model_parse_len(mgt_model *m, const char *path, const char *text, size_t len,
                        const mgt_model_section *train, mgt_err *err);
/* The model's name that a model file's path gives (its file name without the extension), into
 * name[n]; -1 when it is empty or does not fit. */
int mgt_model_name_of(const char *path, char *name, size_t n);
/* --input-shape: replaces the [input] shape ("H,W,C", or "F") and builds the layers again, shapes
 * and parameters; errors name the flag's value or the layer that no longer fits. */
int mgt_model_set_input_shape(mgt_model *m, const char *hwc, mgt_err *err);
/* The last layer against the loss (m->loss, set before): one score per class for cross-entropy
 * (softmax or no activation), a sigmoid or none for binary cross-entropy, any for a regression;
 * a softmax or sigmoid the loss computes with it is taken over (fused_act), and m->classes and
 * m->nsums follow. Errors name the file, the line and the layer. */
int mgt_model_check_output(mgt_model *m, mgt_err *err);
/* The task's own metric sums (see MGT_SUM_TASK) of a model whose loss is set. */
int mgt_model_task_sums(const mgt_model *m);
/* The shape of layer l's k-th input. */
mgt_shape mgt_layer_input_shape(const mgt_model *m, const mgt_layer *l, int k);
/* Plans the activation memory for local batches of `batch` (see mgt_plan); frees with
 * mgt_plan_free. share = 0 gives every block its own memory and no layer works in place (the
 * baseline the plan is measured against). -1 when out of host memory. */
int mgt_model_plan(const mgt_model *m, int batch, int share, mgt_plan *p, mgt_err *err);
void mgt_plan_free(mgt_plan *p);
/* Declares a tensor (used by layers' build). Returns its index, or -1 with the message in err
 * when it is too large (MGT_MAX_TENSOR_ELEMS) or memory runs out. */
int mgt_model_add_param(mgt_model *m, mgt_layer *l, const char *suffix, int ndim,
                        const int64_t *shape, int init, float fan_in, float fan_out, mgt_err *err);
int mgt_model_add_buffer(mgt_model *m, mgt_layer *l, const char *suffix, int ndim,
                         const int64_t *shape, int init, mgt_err *err);
/* Whether every activation tensor fits MGT_MAX_TENSOR_ELEMS for local batches of max_batch rows.
 * Depends on the model and the batch only, so every rank gets the same answer. */
int mgt_model_check_batch(const mgt_model *m, int max_batch, mgt_err *err);
/* Allocates arenas and activations for local batches up to max_batch (checked as above). */
int mgt_model_alloc(mgt_model *m, mgt_backend *be, int max_batch, mgt_err *err);
void mgt_model_free(mgt_model *m);

/* Glorot-uniform weights, zero biases, batchnorm gamma 1 / running var 1: Keras' defaults,
 * a pure function of the seed. Host arrays [param_count] and [buffer_count]. */
void mgt_model_init_host(const mgt_model *m, uint64_t seed, float *w, float *buf);

/* Whether layer l has tensors that train (parameters, and not frozen). */
static inline int mgt_layer_trains(const mgt_layer *l) {
    return l->param[0] >= 0 && !l->frozen;
}
/* Whether layer l trains a tied tensor (model.h: tied): it is not frozen, nor is the layer that
 * owns the tensor (whose tensors then lie past the gradient arena: mgt_model_layout). */
static inline int mgt_layer_trains_tied(const mgt_model *m, const mgt_layer *l) {
    return l->tied >= 0 && !l->frozen && m->params[l->tied].offset < m->grad_count;
}
/* Layer l's trainable tensors in the parameter and gradient arenas: one range holds them all, as
 * a layer declares them one after another (mgt_model_add_param). Returns the range's floats (0:
 * no parameters, or a frozen layer, whose tensors have no gradient) and its first in *lo. */
size_t mgt_layer_param_range(const mgt_model *m, const mgt_layer *l, size_t *lo);
/* Places the tensors in the parameter arena: the trainable ones first, in the order the layers
 * declared them, then the frozen layers' (each 16-float aligned); sets grad_count. The parser
 * calls it once the layers are built, and mgt_model_freeze after it freezes layers. */
void mgt_model_layout(mgt_model *m);
/* Freezes the layers whose names match the comma-separated glob patterns (fnmatch: *, ?, [..]);
 * a pattern starting with ! exempts the layers it matches (--freeze '*,!fc': all but fc). A
 * positive pattern that matches no layer is an error (a misspelt name would freeze nothing).
 * Before mgt_model_alloc. */
int mgt_model_freeze(mgt_model *m, const char *patterns, mgt_err *err);
/* The parameters' values that train and those of frozen layers; returns the frozen layers that
 * have parameters. */
int mgt_model_count_params(const mgt_model *m, size_t *trainable, size_t *frozen);
/* The frozen layers, described for a checkpoint: their count and a hash of their names. */
void mgt_model_frozen_id(const mgt_model *m, char *buf, size_t n);
/* Forward pass over the s->n rows of s->in. Returns the output (logits or probabilities), in
 * float32 (mgt_model_output). */
float *mgt_model_forward(mgt_model *m, const mgt_step *s);
/* The step's rows of the last layer's output in float32: its y, or (activations in another
 * type) its float32 copy, made now. */
float *mgt_model_output(mgt_model *m, const mgt_step *s);
/* Loss on the last forward's output against s->in: adds to m->sums; when backward is set, also
 * back-propagates, writing the SUM over the rows of per-sample gradients into m->g. */
void mgt_model_loss_backward(mgt_model *m, const mgt_step *s, int backward);
/* The same passes one piece at a time (bench/layer_times.c times them): layer i's forward with
 * its activation; the loss alone (and the logits' gradient when backward is set); layer i's
 * backward, which returns 0 and does nothing where no gradient is needed at or below it. Run the
 * layers forward in file order and backward in reverse. */
void mgt_model_layer_forward(mgt_model *m, int i, const mgt_step *s);
void mgt_model_loss(mgt_model *m, const mgt_step *s, int backward);
int mgt_model_layer_backward(mgt_model *m, int i, const mgt_step *s);
/* Applies the final softmax where it was fused into the loss (predict without labels). */
void mgt_model_finish_output(mgt_model *m, const mgt_step *s, float *out);

/* Prints the layer table (name, type, output shape, parameters, inputs) and the totals. */
void mgt_model_summary(const mgt_model *m, FILE *f);
/* Prints the activation memory of one rank training a global batch of `batch`, planned and
 * unplanned, for activations of act_bytes a value (4, or 2 with --precision bf16 on a GPU). */
void mgt_model_summary_memory(const mgt_model *m, int64_t batch, size_t act_bytes, FILE *f);

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
