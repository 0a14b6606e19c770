/* optim_math.h: the optimizers' element rules (Keras' formulas) and their list. One source for
 * both backends: the CPU loops (cpu_optim.c) and the GPU kernels (cuda/gpu_optim.cu, compiled for
 * the device under nvcc) are both made from each rule, so the two update alike.
 *
 * g is the element's SUM of per-sample gradients over the global batch; every rule but AdamW's
 * uses gt = g * scale + weight_decay * w (scale = 1 / global batch; L2, with w before the
 * update); AdamW decays w itself (Loshchilov and Hutter's decoupled weight decay).
 *
 * Adding an optimizer: its rule here, with any new setting in mgt_opt_settings, its line in
 * MGT_OPTIMIZERS, and its row in optim.c's table (name, default learning rate, keys, state slots).
 * The kinds, the CPU loop and the GPU kernel follow from the list. */
#ifndef MGT_OPTIM_MATH_H
#define MGT_OPTIM_MATH_H

#include <float.h>
#include <math.h>
#include <stddef.h>

#include "../util.h"

/* The most state arenas an optimizer keeps (Adam: m and v). */
#define MGT_OPT_MAX_SLOTS 2

/* The [train] settings the rules read (optim.c's key table parses them). */
typedef struct mgt_opt_settings {
    float momentum;     /* sgd */
    int nesterov;       /* sgd */
    float rho;          /* rmsprop */
    float beta1, beta2; /* adam */
    float epsilon;      /* rmsprop, adam, adamw */
    float weight_decay; /* every rule: L2; adamw: decoupled */
    int decay_all;      /* adamw: every tensor decays (else the matrices only: optim.h) */
} mgt_opt_settings;

/* What a rule reads for one step. */
typedef struct mgt_opt_hyper {
    mgt_opt_settings s;
    float lr;    /* this step's learning rate (Adam's carries its bias correction) */
    float scale; /* 1 / global batch */
    /* AdamW: the scheduled rate (lr is it over 1 - beta_1^t) and sqrt(1 - beta_2^t) */
    float lr_decay, bc2_sqrt;
} mgt_opt_hyper;

/* State below the smallest normal float (2^-126, about 1.2e-38) is stored as zero.
 *
 * The state of a parameter whose gradient stops (a ReLU unit that no longer fires, an input that
 * is always 0) decays geometrically: Adam's first moment by beta_1 = 0.9 a step reaches 2^-126
 * some 700 steps after its last gradient, then spends about 150 more steps in the subnormal range
 * before it rounds to 0. x86 cores compute with subnormal operands or results in microcode, at
 * about a hundred times the cost of a normal operation, and a vector pays that if any of its
 * elements is subnormal. Training the MLP (batch 256, synthetic data), 157,000 of Adam's 269,000
 * first moments reached it together, around step 700: the update took 0.5-0.9 ms a step there,
 * against 0.17-0.19 before, and 0.45 ms on average over 4 epochs (2-core Xeon). With the flush
 * (and Adam's lr * m below, subnormal in the same steps) it stays at 0.15-0.23 ms. TensorFlow's
 * CPU kernels avoid this by running with flush-to-zero set; these rules do it for their own state
 * only, so that nothing else rounds differently.
 *
 * What a flushed value would have done is below what a weight can show. A velocity (SGD's
 * momentum) is added to w, and below 2^-126 it is less than half a unit in the last place of any
 * |w| above 2^-102. The moments reach w only through lr * m / (sqrt(v) + epsilon) (RMSprop:
 * lr * gt / sqrt(ms + epsilon)): with epsilon at or above MGT_OPT_FLUSH_EPS, a v below 2^-126 has
 * sqrt(v) < 2^-63, and v or ms is less than half a unit in the last place of epsilon, so the
 * denominator is the same float; and an m below 2^-126 moves w by less than lr * 2^-93. Below
 * that epsilon (one chosen for tiny gradients, where sqrt(v) and epsilon compete) the moments are
 * kept as computed. The rule is the same on every backend and every element, so results stay the
 * same on any number of ranks and threads. */
#define MGT_OPT_FLUSH_EPS 0x1p-33f /* about 1.2e-10; Keras' default epsilon is 1e-7 */

MGT_HD static inline float mgt_opt_flush(float x) {
    return fabsf(x) < FLT_MIN ? 0.0f : x; /* FLT_MIN: 2^-126 */
}

/* Whether the rule's epsilon lets the moments be flushed (see above). */
MGT_HD static inline int mgt_opt_flushing(const mgt_opt_hyper *h) {
    return h->s.epsilon >= MGT_OPT_FLUSH_EPS;
}

/* A moment, flushed where the rule's epsilon lets it be. */
MGT_HD static inline float mgt_opt_flush_by(float x, const mgt_opt_hyper *h) {
    return mgt_opt_flushing(h) ? mgt_opt_flush(x) : x;
}

/* Every rule updates one element w with its state s0, s1 (NULL where the optimizer keeps none). */

/* Plain:     w -= lr * gt                                  (no velocity: momentum 0)
 * Momentum:  v = momentum * v - lr * gt;  w += v
 * Nesterov:  v as above;  w += momentum * v - lr * gt      (with the new v)
 * Without momentum no velocity is passed (optim.c keeps none), so the rule does not test the
 * momentum itself: that test lets the compiler share lr * gt between the two paths and round
 * differently from the plain and the momentum loops it was split into before. */
MGT_HD static inline void mgt_sgd_rule(float *w, float *vel, float *unused, float g,
                                       const mgt_opt_hyper *h) {
    (void)unused;
    const float gt = g * h->scale + h->s.weight_decay * *w;
    if (!vel) {
        *w -= h->lr * gt;
        return;
    }
    const float v = mgt_opt_flush(h->s.momentum * *vel - h->lr * gt);
    *vel = v;
    *w += h->s.nesterov ? h->s.momentum * v - h->lr * gt : v;
}

/* ms = rho * ms + (1 - rho) * gt^2;  w -= lr * gt / sqrt(ms + eps)  (Keras: epsilon inside the
 * root; PyTorch puts it outside) */
MGT_HD static inline void mgt_rmsprop_rule(float *w, float *ms, float *unused, float g,
                                           const mgt_opt_hyper *h) {
    (void)unused;
    const float gt = g * h->scale + h->s.weight_decay * *w;
    const float m = mgt_opt_flush_by(h->s.rho * *ms + (1.0f - h->s.rho) * gt * gt, h);
    *ms = m;
    *w -= h->lr * gt / sqrtf(m + h->s.epsilon);
}

/* m = b1 * m + (1 - b1) * gt;  v = b2 * v + (1 - b2) * gt^2;  w -= lr_t * m / (sqrt(v) + eps),
 * lr_t carrying the bias correction (optim.c computes it per step). */
MGT_HD static inline void mgt_adam_rule(float *w, float *m, float *v, float g,
                                        const mgt_opt_hyper *h) {
    const float gt = g * h->scale + h->s.weight_decay * *w;
    const float mi = mgt_opt_flush_by(h->s.beta1 * *m + (1.0f - h->s.beta1) * gt, h);
    const float vi = mgt_opt_flush_by(h->s.beta2 * *v + (1.0f - h->s.beta2) * gt * gt, h);
    *m = mi;
    *v = vi;
    /* A product lr * m below 2^-126 would be subnormal too (a decaying m's last 65 or so steps
     * before it is flushed, at lr 1e-3): it is left out where the moments are flushed, as it
     * would move w by less than 2^-126 / epsilon <= 2^-93. (The setting's test outside the
     * element's: a short-circuit && of the two kept GCC from vectorising the AVX2 loop.) */
    const float mu = mgt_opt_flushing(h) ? (fabsf(mi) < FLT_MIN / h->lr ? 0.0f : mi) : mi;
    *w -= h->lr * mu / (sqrtf(vi) + h->s.epsilon);
}

/* PyTorch's AdamW (torch.optim.AdamW), in its order of operations:
 *   w *= 1 - lr_sched * weight_decay                 (decoupled: no part of the moments)
 *   m = b1 * m + (1 - b1) * gt;  v = b2 * v + (1 - b2) * gt^2
 *   w -= (lr_sched / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * with gt = g * scale, lr = lr_sched / (1 - b1^t) and bc2_sqrt = sqrt(1 - b2^t) (optim.c). The
 * decay is the optimizer's to skip on biases and norms (optim.h: weight_decay is 0 in their
 * update). The moments are flushed as Adam's are (above). */
MGT_HD static inline void mgt_adamw_rule(float *w, float *m, float *v, float g,
                                         const mgt_opt_hyper *h) {
    const float gt = g * h->scale;
    const float wd = *w * (1.0f - h->lr_decay * h->s.weight_decay);
    const float mi = mgt_opt_flush_by(h->s.beta1 * *m + (1.0f - h->s.beta1) * gt, h);
    const float vi = mgt_opt_flush_by(h->s.beta2 * *v + (1.0f - h->s.beta2) * gt * gt, h);
    *m = mi;
    *v = vi;
    const float mu = mgt_opt_flushing(h) ? (fabsf(mi) < FLT_MIN / h->lr ? 0.0f : mi) : mi;
    *w = wd - h->lr * mu / (sqrtf(vi) / h->bc2_sqrt + h->s.epsilon);
}

/* The optimizers, X(ID, rule) each, in the order of optim.c's table. */
#define MGT_OPTIMIZERS(X)                                                                          \
    X(SGD, mgt_sgd_rule)                                                                           \
    X(RMSPROP, mgt_rmsprop_rule)                                                                   \
    X(ADAM, mgt_adam_rule)                                                                         \
    X(ADAMW, mgt_adamw_rule)

#define MGT_OPT_KIND_(id, rule) MGT_OPT_##id,
typedef enum { MGT_OPTIMIZERS(MGT_OPT_KIND_) MGT_OPT_COUNT } mgt_opt_kind;
#undef MGT_OPT_KIND_

#endif
