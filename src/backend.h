/* backend.h: the op table. One struct of function pointers that every compute backend fills
 * (the CPU reference in cpu/, the GPU one in cuda/). Layers call only these; a backend never
 * knows which layer calls it.
 *
 * Conventions shared by every op:
 *  - float32 data, row-major, except the activations on a backend whose be->act is MGT_BF16
 *    (the GPU with --precision bf16): there every activation an op reads or writes (its x, y, r,
 *    dy, dx: layer outputs and their gradients, the model's activation arena) holds bfloat16
 *    values behind its float pointer, and the op computes in float and rounds what it stores
 *    once. Weights, parameter gradients, statistics, the loss's inputs and outputs (xent_*),
 *    metric sums and optimizer state stay float32 on every backend;
 *  - activations are NHWC: a batch of n samples of shape (h, w, c) is n*h*w rows of c values;
 *  - weights are in PyTorch's layouts: dense [out][in], conv OIHW ([oc][c][kh][kw]);
 *  - pointers are backend memory (host for the CPU backend, device for the GPU one);
 *  - backward ops OVERWRITE their parameter gradients (dW, db, dgamma, ...): the gradient arena
 *    needs no zeroing, and n == 0 (a rank with no sample in a short last batch) must write zeros;
 *  - an input gradient pointer (dx) may be NULL when the caller does not need it (first layer);
 *  - every op accepts n == 0.
 */
#ifndef MGT_BACKEND_H
#define MGT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/optim_math.h" /* the optimizers' kinds and per-step values */

/* The element type of a backend's activations (mgt_backend.act). */
typedef enum { MGT_F32 = 0, MGT_BF16 = 1 } mgt_dtype;

static inline size_t mgt_dtype_size(mgt_dtype t) {
    return t == MGT_BF16 ? 2 : 4;
}

/* GELU: x Phi(x) with the normal distribution's Phi (MGT_ACT_GELU, PyTorch's GELU()), or its tanh
 * form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (MGT_ACT_GELU_TANH, GPT-2's, PyTorch's
 * GELU(approximate="tanh")). */
typedef enum {
    MGT_ACT_NONE = 0,
    MGT_ACT_RELU,
    MGT_ACT_SIGMOID,
    MGT_ACT_TANH,
    MGT_ACT_SOFTMAX,
    MGT_ACT_GELU,
    MGT_ACT_GELU_TANH
} mgt_act;

/* Whether an activation's gradient needs its input: GELU's derivative is no function of its
 * output (which is not monotonic), so act_bwd reads the input x where the others read y. */
static inline int mgt_act_bwd_reads_x(mgt_act a) {
    return a == MGT_ACT_GELU || a == MGT_ACT_GELU_TANH;
}

/* Which algorithm a convolution may use ([conv2d] algo, --conv-algo), as cuDNN's algorithm
 * choice: AUTO lets the backend take the fastest (on the CPU: Winograd for every 3x3 stride-1
 * layer, a direct convolution for the other stride-1 layers, im2col + GEMM for strided ones);
 * DIRECT never uses Winograd, so the products are plain fp32
 * dot products (an all-zero window gives exactly 0, as PyTorch's CPU convolution does);
 * WINOGRAD asks for Winograd where the shape allows it. */
typedef enum { MGT_CONV_AUTO = 0, MGT_CONV_DIRECT, MGT_CONV_WINOGRAD } mgt_conv_algo;

/* Geometry of one 2-D convolution (NHWC in, NHWC out, OIHW weights). */
typedef struct mgt_conv_shape {
    int n, h, w, c;        /* input */
    int oc, kh, kw;        /* filters */
    int stride;            /* same in both directions */
    int pad_top, pad_left; /* zero padding before the first row/column ("same" pads the rest) */
    int oh, ow;            /* output, computed by the caller */
    mgt_conv_algo algo;    /* zero (AUTO) unless the layer or --conv-algo says otherwise */
    /* conv2d_fwd: MGT_ACT_RELU to write act_fwd's ReLU of the output instead of the output
     * itself, where the backend takes it (mgt_ops.conv_relu); otherwise MGT_ACT_NONE. */
    mgt_act act;
} mgt_conv_shape;

/* Geometry of one pooling window (NHWC). Output (oy, ox) sees input rows oy*stride - pad_top ..
 * + size - 1 and the same for columns; positions outside the input are left out of the window
 * (TensorFlow's "same" pooling: a maximum over the real values, an average divided by their
 * count). pad_top = pad_left = 0 and oh, ow that fit: valid windows. */
typedef struct mgt_pool_shape {
    int n, h, w, c;
    int size, stride;
    int oh, ow;
    int pad_top, pad_left;
} mgt_pool_shape;

/* Zero padding of an NHWC tensor: [n][h][w][c] -> [n][h + top + bottom][w + left + right][c]. */
typedef struct mgt_pad_shape {
    int n, h, w, c;
    int top, bottom, left, right;
} mgt_pad_shape;

/* One batch-normalisation pass over `rows` rows of c channels and what a fusion group (model.h)
 * adds to it: z = (x - mean) * (invstd * gamma) + beta, plus r where r is not NULL (the other
 * input of a residual sum, [rows][c]), and y = act(z), act MGT_ACT_NONE or MGT_ACT_RELU. gamma
 * NULL means 1, beta NULL 0. Backward, the ReLU's mask (z > 0) is read from the group's output
 * y (y > 0) where y is not NULL, else recomputed from x and r. */
typedef struct mgt_bn_pass {
    int rows, c;
    const float *x, *mean, *invstd, *gamma, *beta;
    const float *r;
    mgt_act act;
    const float *y;
    /* bn_bwd_apply: dx = x > 0 ? dx : 0, the gradient of the ReLU that wrote x (a layer's own
     * activation, fuse.c), where the backend takes it (mgt_ops.bn_x_relu). */
    int x_relu;
} mgt_bn_pass;

/* Causal multi-head self-attention over n sequences of t positions (backend.h: attn_fwd). The
 * input is the fused projection of GPT-2, [n][t][3c]: per position the c queries, then the c
 * keys, then the c values, each split into `heads` heads of d = c / heads channels (head h: the
 * channels h d .. h d + d - 1 of each). Position i attends to positions j <= i (causal) or all
 * t (not causal), with scores (q_i . k_j) / sqrt(d) and a softmax over j; the output [n][t][c]
 * holds each head's weighted sum of values in its channels. Dropout on the attention weights
 * (rate > 0, training): weight (sample s, head h, i, j) is kept when mgt_uniform(key,
 * ((s * heads + h) * t + i) * t + j) >= rate, s counted from first_sample (the position of the
 * batch's first sequence in the global batch), and scaled by 1 / (1 - rate), so the mask is
 * regenerated in backward and does not depend on the rank count. */
typedef struct mgt_attn_shape {
    int n, t, c, heads;
    int causal;
    float rate;
    uint64_t key, first_sample;
} mgt_attn_shape;

/* Where the loss ops add their metric sums (model.h says what each is). */
enum { MGT_SUM_LOSS = 0, MGT_SUM_CORRECT, MGT_SUM_TOP5, MGT_SUM_TASK };
enum { MGT_SUM_TP = 0, MGT_SUM_FP, MGT_SUM_FN, MGT_SUM_LABELS }; /* within the task's, binary */
enum { MGT_SUM_ABS = 0, MGT_SUM_SQ };                            /* within the task's, regression */

/* What elem_loss computes (model.h: mgt_loss's float-target losses). */
typedef enum { MGT_ELEM_BCE = 0, MGT_ELEM_MSE, MGT_ELEM_MAE, MGT_ELEM_HUBER } mgt_elem_kind;
typedef struct mgt_elem_loss {
    mgt_elem_kind kind;
    float smoothing;  /* binary: Keras' label_smoothing */
    float delta;      /* huber */
    const float *cw;  /* binary: the negative's and the positive's weight (backend memory), or NULL */
    int per_label;    /* binary: the per-output counts too */
} mgt_elem_loss;

typedef struct mgt_ops mgt_ops;

enum { MGT_TIME_SETS = 4, MGT_TIME_POINTS = 16, MGT_MARK_SETS = 2, MGT_GRAPHS = 4 };

/* A backend instance: the table plus its private state (BLAS threads, scratch, handles). */
typedef struct mgt_backend {
    const mgt_ops *ops;
    void *impl;
    mgt_dtype act; /* the element type of its activations (see the top); MGT_F32 unless set */
    /* Leave a convolution's bias out where a batchnorm cancels it (fuse.c): the GPU's choice;
     * the CPU backend, the reference, computes it (0) and so keeps its results bit for bit. */
    int cancel_bias;
} mgt_backend;

/* Whether an h x w x c sample's NHWC and C, H, W orders are the same bytes: one channel, or one
 * pixel (nhwc_to_chw and chw_to_nhwc are then plain copies). */
static inline int mgt_nhwc_is_chw(int h, int w, int c) {
    return c == 1 || (size_t)h * (size_t)w == 1;
}

struct mgt_ops {
    const char *name; /* "cpu", "gpu" */

    /* What the table's ops take over from the layers around them (0, the default of a table
     * that leaves them out: nothing).
     * conv_relu: conv2d_fwd applies the ReLU that mgt_conv_shape.act asks for (the CPU's: in
     *   its direct kernels' stores, sparing a pass over the output); else the layer's
     *   activation runs as a pass of its own.
     * bn_x_relu: bn_bwd_apply applies mgt_bn_pass.x_relu, so that a batchnorm's backward takes
     *   over the gradient of the ReLU before it (fuse.c); else that gradient is a pass of its
     *   own. */
    int conv_relu, bn_x_relu;
    /* gelu: act_fwd and act_bwd take the GELUs (MGT_ACT_GELU, MGT_ACT_GELU_TANH). */
    int gelu;

    /* Memory. alloc returns zeroed memory or NULL. */
    void *(*alloc)(mgt_backend *be, size_t bytes);
    void (*free)(mgt_backend *be, void *p);
    void (*to_device)(mgt_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(mgt_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(mgt_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(mgt_backend *be, void *p, size_t bytes);
    /* y[i] += x[i] for i < n (metric sums accumulated on the device between reads). */
    void (*add)(mgt_backend *be, size_t n, const float *x, float *y);
    /* Host memory for staging batches (pinned on a GPU, so copies can overlap compute). May be
     * NULL: callers then use malloc/free. */
    void *(*host_alloc)(mgt_backend *be, size_t bytes);
    void (*host_free)(mgt_backend *be, void *p);
    /* Host work split over the threads the ops run on (optional; NULL where they are not the
     * host's: the caller then runs it whole): fn(ctx, lo, hi) over parts of [0, n) of at least
     * min_part items, in any order and on any of those threads, returning when every part is
     * done. Only for the thread that issues the ops, between ops (the CPU's lanes). */
    void (*host_for)(mgt_backend *be, size_t n, size_t min_part,
                     void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx);
    /* Waits until every op issued so far has finished (no-op on the CPU). */
    void (*sync)(mgt_backend *be);

    /* Batch staging (optional; NULL where host memory is the backend's, as on the CPU): the
     * copies of a batch run on their own queue, overlapping the steps before it. Two slots, used
     * in turn, each with its own device buffers:
     *   stage(slot, count, dst, src, bytes): copies count host buffers (host_alloc memory) into
     *     the slot's device buffers once the step that used the slot before has released it, and
     *     makes every op issued afterwards wait for the copies;
     *   stage_release(slot): the ops issued so far are the last to read the slot's buffers;
     *   stage_wait(slot): returns when the slot's copies are done (its host buffers may then be
     *     refilled). */
    void (*stage)(mgt_backend *be, int slot, int count, void *const *dst, const void *const *src,
                  const size_t *bytes);
    void (*stage_release)(mgt_backend *be, int slot);
    void (*stage_wait)(mgt_backend *be, int slot);

    /* Device-side timing (optional; NULL where the host's clock times the ops, as on the CPU):
     * time_mark(set, point) queues point `point` of timing set `set`; time_read(set, npoints,
     * sec) waits until the set's points have run and gives sec[i], the seconds from point 0 to
     * point i. Up to MGT_TIME_SETS sets of MGT_TIME_POINTS points. */
    void (*time_mark)(mgt_backend *be, int set, int point);
    void (*time_read)(mgt_backend *be, int set, int npoints, double *sec);
    /* Device marks for --profile-layers (optional; NULL where the host's clock times the ops):
     * marks_reserve(n) makes room for n marks in each of MGT_MARK_SETS sets, outside the step
     * loop (-1: no memory); mark(set, i) queues mark i of a set; marks_read(set, n, sec) waits
     * until mark n - 1 of the set has run and gives sec[i], the seconds from mark 0 to mark i. */
    int (*marks_reserve)(mgt_backend *be, int n);
    void (*mark)(mgt_backend *be, int set, int i);
    void (*marks_read)(mgt_backend *be, int set, int n, double *sec);

    /* Replay (optional; NULL where launching an op costs nothing to speak of, as on the CPU).
     * The ops queued between capture_begin() and capture_end(g) do not run: they are recorded
     * as graph g (0 <= g < MGT_GRAPHS), which replay(g) then queues at once, as often as asked:
     * the same ops on the same memory with the same arguments. capture_end returns -1, and
     * keeps nothing, when something in between could not be recorded (a wait for the device,
     * an allocation); the ops then have to be issued again the ordinary way. capture_begin
     * returns -1 when recording cannot start. The backend drops its graphs when memory they use
     * moves (its workspace grows for a new shape): replay(g) then returns -1 and queues
     * nothing. drop(g) frees graph g (if any). */
    int (*capture_begin)(mgt_backend *be);
    int (*capture_end)(mgt_backend *be, int g);
    int (*replay)(mgt_backend *be, int g);
    void (*drop)(mgt_backend *be, int g);

    /* Synthetic samples generated in backend memory (optional): for generated sample indices
     * first + ids[i] (ids: backend memory), the values x[i], labels[i] and, if targets is not
     * NULL, one-hot targets[i], exactly as data/synthetic_def.h defines them (mgt_dataset_synthetic_keys).
     * elems = values per sample. */
    void (*synthetic)(mgt_backend *be, int n, int64_t elems, int classes, uint64_t pixel_key,
                      uint64_t template_key, int64_t first, const int64_t *ids, float *x,
                      int32_t *labels, float *targets);
    /* A batch gathered from a byte dataset kept in backend memory (optional): x[i] = the elems
     * bytes of sample ids[i] of `pixels`, each as (float)byte / 255 (dataset.h's scaling),
     * labels[i] = its byte of `labels`, and one-hot targets unless NULL. ids: backend memory. */
    void (*gather_u8)(mgt_backend *be, int n, int64_t elems, int classes, const uint8_t *pixels,
                      const uint8_t *labels, const int64_t *ids, float *x, int32_t *labels_out,
                      float *targets);

    /* Scratch memory: reserve() is called while the model is built with the largest size any op
     * will ask for (conv2d_scratch); the ops then use it without allocating in the step loop.
     * Returns -1 when the memory cannot be had. */
    int (*reserve)(mgt_backend *be, size_t bytes);
    void (*destroy)(mgt_backend *be);
    /* The choices the backend made that change its numbers or its speed, as lines of text for
     * --profile (the GPU: its arithmetic, and each convolution shape's cuDNN algorithm per
     * direction with its math type, workspace and determinism). Optional (NULL: nothing to
     * say). Writes at most n bytes, NUL-terminated when n > 0, and returns the length of the
     * whole text (snprintf's rule). */
    size_t (*describe)(mgt_backend *be, char *buf, size_t n);
    /* The algorithms the backend runs a convolution of shape s with, briefly, for a layer's row
     * of --profile-layers ("fwd IMPLICIT_PRECOMP_GEMM, bwd-data ALGO_1, ..."): snprintf's rule;
     * optional (NULL, or 0 written: nothing to say). */
    size_t (*describe_conv)(mgt_backend *be, const mgt_conv_shape *s, char *buf, size_t n);

    /* Dense: y[n][out] = x[n][in] * W^T + b (b may be NULL). */
    void (*dense_fwd)(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                      const float *b, float *y);
    /* dense_fwd, then act_fwd's ReLU on y (y < 0 ? 0 : y; NaN stays NaN). Optional: NULL where
     * a dense layer's ReLU is a pass of its own. */
    void (*dense_fwd_relu)(mgt_backend *be, int n, int in, int out, const float *x,
                           const float *w, const float *b, float *y);
    /* A dense layer's bias gradient, first in its backward: with y, dy = y > 0 ? dy : 0 in
     * place (the gradient of the layer's own ReLU, act_bwd's), then db[out] = column sums of dy
     * as dense_bwd sums them (db may be NULL). One pass over dy. Optional: NULL where the ReLU's
     * gradient is a pass of its own and dense_bwd sums the bias gradient. */
    void (*dense_bias_grad)(mgt_backend *be, int n, int out, const float *y, float *dy,
                            float *db);
    /* dx[n][in] = dy * W; dW[out][in] = dy^T * x; db[out] = column sums of dy. */
    void (*dense_bwd)(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                      const float *dy, float *dx, float *dw, float *db);
    /* dense_bwd, dx then masked, x > 0 ? dx : 0: the gradient of the ReLU that wrote x (a
     * layer's own, which then runs no pass of its own for it: fuse.c). Optional: NULL where
     * the ReLU's gradient is a pass of its own. */
    void (*dense_bwd_x_relu)(mgt_backend *be, int n, int in, int out, const float *x,
                             const float *w, const float *dy, float *dx, float *dw, float *db);
    /* Rows r0 .. r1 - 1 of dW only (the rest untouched): dW[r][in] = sum over the batch of
     * dy[i][r] x[i][in]. Optional (NULL: a dense layer's weight gradient comes whole from
     * dense_bwd). With it, a large layer's backward writes and hands over its weight gradient in
     * row blocks (layers/dense.c), so that their all-reduce starts before the layer ends. */
    void (*dense_bwd_rows)(mgt_backend *be, int n, int in, int out, int r0, int r1,
                           const float *x, const float *dy, float *dw);

    /* Dense with the weights in the [in][out] layout (Hugging Face's Conv1D, GPT-2's): y[n][out]
     * = x[n][in] * W + b (b may be NULL); backward dx = dy * W^T, dW[in][out] = x^T * dy,
     * db = column sums of dy as dense_bwd sums them. With act GELU or GELU_TANH (else NONE),
     * forward writes the product in pre and act_fwd's GELU of it in y (the layer keeps pre for
     * backward; pre may be y where act is NONE). Optional, as every op down to optim_step: NULL
     * where the backend has no sequence ops (a model that needs one is then refused). */
    void (*dense_io_fwd)(mgt_backend *be, int n, int in, int out, mgt_act act, const float *x,
                         const float *w, const float *b, float *pre, float *y);
    void (*dense_io_bwd)(mgt_backend *be, int n, int in, int out, const float *x, const float *w,
                         const float *dy, float *dx, float *dw, float *db);

    /* ---- sequence models: (n, t, c) activations, row-major, one row per position ---- */

    /* Token and position embeddings: y[i][p] = wte[ids[i][p]] + wpe[p] (wpe NULL: none), ids
     * [n][t] holding token ids in [0, v) as float32 values (whole numbers, exact below 2^24;
     * the data readers refuse others, which the CPU clamps into the table).
     * Backward: dwte[v][c] = sum over the positions holding each token of dy, added to what dwte
     * holds with accumulate (a tied output layer wrote its part first), else written (rows of
     * tokens that do not occur: 0); dwpe[t][c] = sum over the sequences of dy (wpe's gradient,
     * NULL: none). */
    void (*embed_fwd)(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                      const float *wte, const float *wpe, float *y);
    void (*embed_bwd)(mgt_backend *be, int n, int t, int c, int v, const float *ids,
                      const float *dy, float *dwte, int accumulate, float *dwpe);
    /* Layer normalisation of `rows` rows of c values: mean and rstd = 1 / sqrt(var + eps)
     * (biased variance) per row, saved for backward, y = (x - mean) * rstd * gamma + beta.
     * Backward: dx, and dgamma, dbeta summed over the rows (written). */
    void (*layernorm_fwd)(mgt_backend *be, int rows, int c, float eps, const float *x,
                          const float *gamma, const float *beta, float *y, float *mean,
                          float *rstd);
    void (*layernorm_bwd)(mgt_backend *be, int rows, int c, const float *x, const float *gamma,
                          const float *mean, const float *rstd, const float *dy, float *dx,
                          float *dgamma, float *dbeta);
    /* Attention (mgt_attn_shape): y[n][t][c] from qkv[n][t][3c], and lse[n][heads][t], each
     * query's log of its softmax's sum (in the scores' units: max + log sum exp(score - max)),
     * which backward needs to recompute the weights without keeping them. Backward: dqkv from
     * dy, reading qkv, y and lse. attn_scratch: the bytes of scratch (reserve) both need. */
    size_t (*attn_scratch)(mgt_backend *be, const mgt_attn_shape *s);
    /* One position's attention during generation: the query q (the first c values of its qkv
     * row) against a cache of keys kc and values vc, [t][c] each, of positions 0 .. p (row p
     * included): y[c] = each head's softmax(q k^T / sqrt(d)) v over them. It uses p + 1 floats
     * of scratch (reserve). */
    void (*attn_decode)(mgt_backend *be, int c, int heads, int p, const float *q,
                        const float *kc, const float *vc, float *y);
    void (*attn_fwd)(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, float *y,
                     float *lse);
    void (*attn_bwd)(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, const float *y,
                     const float *lse, const float *dy, float *dqkv);

    /* Convolution (cross-correlation, as in PyTorch and Keras). */
    size_t (*conv2d_scratch)(const mgt_conv_shape *s); /* bytes of scratch fwd/bwd need */
    void (*conv2d_fwd)(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                       const float *b, float *y);
    void (*conv2d_bwd)(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                       const float *dy, float *dx, float *dw, float *db);

    /* Max pooling records the flat input index of each maximum in argmax (int32, one per output). */
    void (*maxpool_fwd)(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y,
                        int32_t *argmax);
    void (*maxpool_bwd)(mgt_backend *be, const mgt_pool_shape *s, const float *dy,
                        const int32_t *argmax, float *dx);
    /* Optional (NULL: none): maxpool_bwd with each maximum's gradient masked by x > 0, x the
     * pooled input: the gradient of the ReLU that wrote x, taken over from its layer (fuse.c). */
    void (*maxpool_bwd_relu)(mgt_backend *be, const mgt_pool_shape *s, const float *x,
                             const float *dy, const int32_t *argmax, float *dx);
    void (*avgpool_fwd)(mgt_backend *be, const mgt_pool_shape *s, const float *x, float *y);
    void (*avgpool_bwd)(mgt_backend *be, const mgt_pool_shape *s, const float *dy, float *dx);

    /* Batch normalisation over `rows` rows of c channels (rows = n*h*w).
     * stats: sum[c] and sumsq[c] of x over rows (sums, so ranks can add them up). */
    void (*bn_stats)(mgt_backend *be, int rows, int c, const float *x, float *sum, float *sumsq);
    /* From sum/sumsq over `count` rows: mean, invstd = 1/sqrt(var + eps) (biased var), and
     * running = momentum * running + (1 - momentum) * batch (Keras' convention), unless
     * running_mean is NULL. shift (NULL: none) is a per-channel constant the caller left out of
     * x (a convolution bias the normalisation cancels, model.h): the batch mean that enters
     * running_mean is then mean + shift, that of the values with it. */
    void (*bn_finalize)(mgt_backend *be, int c, float count, const float *sum, const float *sumsq,
                        float eps, float momentum, const float *shift, float *mean, float *invstd,
                        float *running_mean, float *running_var);
    /* mean/invstd from running statistics (inference). */
    void (*bn_running)(mgt_backend *be, int c, float eps, const float *running_mean,
                       const float *running_var, float *mean, float *invstd);
    /* y = act((x - mean) * (invstd * gamma) + beta + r) per channel (mgt_bn_pass): the
     * normalisation with the residual sum and the ReLU of a fusion group (model.h) in the same
     * pass; each step rounds as the unfused ops would (the sum with r one float addition), so
     * the results are theirs bit for bit on the CPU. y may not alias x or r. */
    void (*bn_apply)(mgt_backend *be, const mgt_bn_pass *p, float *y);
    /* Backward, with dz the gradient reaching the normalisation: dy where p's ReLU passed
     * (dz = z > 0 ? dy : 0, z > 0 read as p->y > 0, or z recomputed as bn_apply computes it),
     * dy itself without one.
     * bn_bwd_reduce: dbeta[c] = sum dz; dgamma[c] = sum dz * xhat, xhat = (x - mean) * invstd.
     * bn_bwd_apply: dx = gamma * invstd * (dz - (dbeta + xhat * dgamma) / count), with dgamma /
     * dbeta summed over the `count` rows the statistics came from (all ranks' rows when
     * synchronised); dx may be NULL. And where dr is not NULL, the residual's gradient: dr = dz,
     * or dr += dz with accumulate. */
    void (*bn_bwd_reduce)(mgt_backend *be, const mgt_bn_pass *p, const float *dy, float *dgamma,
                          float *dbeta);
    void (*bn_bwd_apply)(mgt_backend *be, const mgt_bn_pass *p, float count, const float *dy,
                         const float *dgamma, const float *dbeta, float *dx, float *dr,
                         int accumulate);

    /* Inverted dropout, in place, mask regenerated from (key, counter) in backward so nothing
     * is stored: element j of sample i (i counted from `first_sample`, the global index of the
     * batch's first row on this rank) is kept when mgt_uniform(key, (first_sample+i)*row+j) >= rate,
     * and then scaled by 1/(1-rate); dropped elements become 0. */
    void (*dropout_fwd)(mgt_backend *be, int n, int row, float rate, uint64_t key,
                        uint64_t first_sample, float *x);
    void (*dropout_bwd)(mgt_backend *be, int n, int row, float rate, uint64_t key,
                        uint64_t first_sample, float *dx);

    /* Activations over n rows of `row` values (softmax: across each row): y = f(x), y may be x
     * (in place); MGT_ACT_NONE copies. Backward uses the forward OUTPUT y: g = dy * f'(y), and
     * dx = g, or dx += g with accumulate (one pass either way); dx may be dy without accumulate.
     * For the GELUs (mgt_act_bwd_reads_x) backward's y is the forward's INPUT x instead. The
     * GELUs are optional: a backend without them (GPU) refuses a model that has one. */
    void (*act_fwd)(mgt_backend *be, mgt_act act, int n, int row, const float *x, float *y);
    void (*act_bwd)(mgt_backend *be, mgt_act act, int n, int row, const float *y, const float *dy,
                    float *dx, int accumulate);

    /* Fused, stable softmax + cross-entropy from logits [n][k].
     *  probs[n][k] = softmax(logits) (may alias logits);
     *  sparse: labels int32[n];  dense: targets float[n][k] (one-hot or soft);
     *  label smoothing s in [0, 1] (Keras' label_smoothing): the target t becomes
     *  (1 - s) * t + s / k (sparse: t the label's one-hot; an out-of-range label stays an
     *  all-zero target); s = 0 leaves t as it is, bit for bit;
     *  dlogits (may be NULL) = (probs - target) * scale  (dense: probs * sum(t) - t);
     *  scale multiplies what is added to sums[0..2] too: a sequence model's n rows are the
     *  positions of its samples, each sample's loss their mean (scale = 1 / positions);
     *  sums[0] += sum of per-sample losses, sums[1] += number of correct argmax predictions
     *  (against the label, or the largest target; smoothing does not change which), sums[2] +=
     *  number of samples whose label is among the 5 most probable classes (top-5 accuracy: the
     *  label's rank, counting the classes of larger probability and those of equal probability
     *  at a lower index, is below 5; rank 0 is the argmax).
     *  sums is backend memory so metrics stay on the device until they are read. */
    void (*xent_sparse)(mgt_backend *be, int n, int k, const float *logits, const int32_t *labels,
                        float *probs, float *dlogits, float scale, float smoothing, float *sums);
    void (*xent_dense)(mgt_backend *be, int n, int k, const float *logits, const float *targets,
                       float *probs, float *dlogits, float scale, float smoothing, float *sums);

    /* Losses of float targets t[n][k] (model.h: mgt_loss), element by element from the outputs
     * y[n][k] (binary cross-entropy: logits), each sample's loss the mean of its k terms:
     *  binary cross-entropy, with p = sigmoid(y) and t' = t (1 - s) + s / 2 (label smoothing s):
     *    w1 t' softplus(-y) + w0 (1 - t') softplus(y) (softplus(v) = max(v, 0) + log1p(e^-|v|),
     *    PyTorch's BCEWithLogits, stable for any y), gradient w0 (1 - t') p - w1 t' (1 - p), where
     *    cw = {w0, w1} (NULL: 1, 1); probs[n][k] (may be NULL, may alias y) = p;
     *  mse: e^2, gradient 2 e (e = y - t); mae: |e|, gradient sign(e) (0 at 0);
     *  huber: e^2 / 2 where |e| <= delta, else delta (|e| - delta / 2), gradient e clipped to
     *    [-delta, delta] (Keras' and PyTorch's HuberLoss).
     *  dy (may be NULL) = gradient * scale / k.
     *  sums (backend memory, model.h's MGT_SUM_* layout): [0] += the samples' losses; binary:
     *  [1] += outputs predicted right (y > 0 against t > 0.5: Keras' binary accuracy), and the
     *  task's sums from [3] += true positives, false positives, false negatives over all outputs,
     *  then (per_label) those three for each output; regression: [3] += sum of |e|, [4] += sum of
     *  e^2. Every count is exact; the sums of a call are the same bits for the same rows. */
    void (*elem_loss)(mgt_backend *be, const mgt_elem_loss *L, int n, int k, const float *y,
                      const float *t, float *probs, float *dy, float scale, float *sums);

    /* Between the activation type and float32 (be->act != MGT_F32 only; NULL elsewhere): the
     * model's input batch into its first layers, their output to the loss and the caller, the
     * logits' gradient back. act_from_f32: y = x rounded to be->act (n values). act_to_f32: y =
     * f(x) in float over n rows of `row` values, x widened exactly first; act MGT_ACT_NONE
     * (the values themselves) or MGT_ACT_SOFTMAX (per row, as act_fwd's, in float). */
    void (*act_from_f32)(mgt_backend *be, size_t n, const float *x, float *y);
    void (*act_to_f32)(mgt_backend *be, mgt_act act, int n, int row, const float *x, float *y);

    /* Layout change for Flatten: NHWC sample -> C,H,W order (PyTorch's flatten) and back. */
    void (*nhwc_to_chw)(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y);
    void (*chw_to_nhwc)(mgt_backend *be, int n, int h, int w, int c, const float *x, float *y);

    /* ---- graph models: merges, padding, global pooling, depthwise convolution ---- */

    /* y[i] = a[i] + b[i] for i < count; y may be a or b (a residual sum). */
    void (*add2)(mgt_backend *be, size_t count, const float *a, const float *b, float *y);
    /* A block of columns between two row-major matrices, for concatenation along the channels
     * and its adjoint: for r < rows, j < width, dst[r * dst_ld + j] = src[r * src_ld + j], or
     * += with accumulate. */
    void (*copy_cols)(mgt_backend *be, size_t rows, int width, const float *src, int src_ld,
                      float *dst, int dst_ld, int accumulate);
    /* Zero padding (pad_fwd: x [n][h][w][c] into the middle of y, zeros around) and its adjoint
     * (pad_bwd: dx = the middle of dy). */
    void (*pad_fwd)(mgt_backend *be, const mgt_pad_shape *s, const float *x, float *y);
    void (*pad_bwd)(mgt_backend *be, const mgt_pad_shape *s, const float *dy, float *dx);
    /* Global average pooling: y[i][ch] = mean over the hw positions of x[i][.][ch] (sums in
     * double); backward dx[i][p][ch] = dy[i][ch] / hw. */
    void (*gap_fwd)(mgt_backend *be, int n, int hw, int c, const float *x, float *y);
    void (*gap_bwd)(mgt_backend *be, int n, int hw, int c, const float *dy, float *dx);
    /* Depthwise convolution, depth multiplier 1 (s->oc == s->c): each channel with its own
     * kh x kw filter, weights [c][1][kh][kw] (PyTorch's Conv2d with groups = c), bias [c] or
     * NULL. Padding and stride as for conv2d. dwconv_scratch: bytes of scratch (reserve) the
     * two passes need on this backend. */
    size_t (*dwconv_scratch)(mgt_backend *be, const mgt_conv_shape *s);
    void (*dwconv_fwd)(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                       const float *b, float *y);
    void (*dwconv_bwd)(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                       const float *dy, float *dx, float *dw, float *db);

    /* One step of optimizer `kind` over a whole flat arena of `count` floats: its rule
     * (cpu/optim_math.h) on every element of w, with the state slots[0 .. MGT_OPT_MAX_SLOTS)
     * (arenas of w's layout; NULL where the optimizer keeps none with these settings, as SGD
     * without momentum) and the step's values h. g is the SUM of per-sample gradients over the
     * global batch. */
    void (*optim_step)(mgt_backend *be, mgt_opt_kind kind, size_t count, float *w, const float *g,
                       float *const *slots, const mgt_opt_hyper *h);

    /* Exact sums (exactsum.h, for --reproducible; optional: NULL where the backend has none).
     * xs_add: words[i * MGT_XS_WORDS ...] += x[i] exactly for i < n, and *bad += 1 for each x[i]
     * that cannot be held (|x| >= 2^64, inf, NaN); xs_round: out[i] = the float32 nearest to
     * accumulator i's value (ties to even). words and bad: backend memory. */
    void (*xs_add)(mgt_backend *be, size_t n, const float *x, int64_t *words, int64_t *bad);
    void (*xs_round)(mgt_backend *be, size_t n, int64_t *words, float *out);
    /* Gradient clipping (clip.h) over the n floats of g, in place, between the all-reduce and
     * optim_step:
     *  clip_value: g[i] = min(max(g[i], -limit), limit), a NaN staying NaN;
     *  clip_norm:  S = sum of g[i]^2, accumulated in double in an order that depends on n alone
     *              (no float atomics: the same bits on every run and rank); when sqrt(S) > limit,
     *              every g[i] *= (float)(limit / sqrt(S)) (never when S is NaN). Leaves S in
     *              work[0] (work: backend memory for 2 doubles). Nothing is read by the host. */
    void (*clip_value)(mgt_backend *be, size_t n, float *g, float limit);
    void (*clip_norm)(mgt_backend *be, size_t n, float *g, double limit, double *work);
};

/* The CPU reference backend; threads = OpenBLAS threads for this rank (0: leave as is). */
int mgt_cpu_backend_init(mgt_backend *be, int threads);
void mgt_backend_destroy(mgt_backend *be);
/* OpenBLAS's kernel (src/cpu/cpu_blas.c). mgt_cpu_blas_choose(argv), for a program's main
 * before anything else: where OpenBLAS has fallen back to an old kernel on a CPU it does not know
 * (its SSE3 Prescott kernel on a CPU with AVX-512, 5 times slower) and OPENBLAS_CORETYPE is not
 * set, sets it to the kernel the CPU calls for and executes the program again with the same
 * argv; returns only where it did not (0: nothing to do; -1: the exec failed). Never in a
 * library. Where OPENBLAS_CORETYPE names a kernel whose instructions the CPU lacks, it says so on
 * stderr and exits with status 2 instead; mgt_cpu_blas_unfit puts that message into buf (n
 * bytes) and returns 1 (else 0), for a library to refuse with. mgt_cpu_blas_notice: which kernel
 * runs and why, in a phrase for the start-up block (into buf, n bytes); 1 when it is a warning
 * (an old kernel runs that a variable would replace), else 0. */
int mgt_cpu_blas_choose(char **argv);
int mgt_cpu_blas_unfit(char *buf, size_t n);
int mgt_cpu_blas_notice(char *buf, size_t n);

#endif
