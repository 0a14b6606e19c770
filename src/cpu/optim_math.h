/* optim_math.h: the optimizers' element rules (Keras' formulas) and their list. One source for
 * both backends: the CPU loops (cpu_optim.c) and the GPU kernels (cuda/gpu_optim.cu, compiled for
 * the device under nvcc) are both made from each rule, so the two update alike.
 *
 * g is the element's SUM of per-sample gradients over the global batch; every rule uses
 * gt = g * scale + weight_decay * w (scale = 1 / global batch; L2, with w before the update).
 *
 * Adding an optimizer: its rule here, with any new setting in mgt_opt_settings, its line in
 * MGT_OPTIMIZERS, and its row in optim.c's table (name, default learning rate, keys, state slots).
 * The kinds, the CPU loop and the GPU kernel follow from the list. */
#ifndef MGT_OPTIM_MATH_H
#define MGT_OPTIM_MATH_H

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
    float epsilon;      /* rmsprop, adam */
    float weight_decay; /* every rule: L2 */
} mgt_opt_settings;

/* What a rule reads for one step. */
typedef struct mgt_opt_hyper {
    mgt_opt_settings s;
    float lr;    /* this step's learning rate (Adam's carries its bias correction) */
    float scale; /* 1 / global batch */
} mgt_opt_hyper;

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
    const float v = h->s.momentum * *vel - h->lr * gt;
    *vel = v;
    *w += h->s.nesterov ? h->s.momentum * v - h->lr * gt : v;
}

/* ms = rho * ms + (1 - rho) * gt^2;  w -= lr * gt / sqrt(ms + eps)  (Keras: epsilon inside the
 * root; PyTorch puts it outside) */
MGT_HD static inline void mgt_rmsprop_rule(float *w, float *ms, float *unused, float g,
                                           const mgt_opt_hyper *h) {
    (void)unused;
    const float gt = g * h->scale + h->s.weight_decay * *w;
    const float m = h->s.rho * *ms + (1.0f - h->s.rho) * gt * gt;
    *ms = m;
    *w -= h->lr * gt / sqrtf(m + h->s.epsilon);
}

/* m = b1 * m + (1 - b1) * gt;  v = b2 * v + (1 - b2) * gt^2;  w -= lr_t * m / (sqrt(v) + eps),
 * lr_t carrying the bias correction (optim.c computes it per step). */
MGT_HD static inline void mgt_adam_rule(float *w, float *m, float *v, float g,
                                        const mgt_opt_hyper *h) {
    const float gt = g * h->scale + h->s.weight_decay * *w;
    const float mi = h->s.beta1 * *m + (1.0f - h->s.beta1) * gt;
    const float vi = h->s.beta2 * *v + (1.0f - h->s.beta2) * gt * gt;
    *m = mi;
    *v = vi;
    *w -= h->lr * mi / (sqrtf(vi) + h->s.epsilon);
}

/* The optimizers, X(ID, rule) each, in the order of optim.c's table. */
#define MGT_OPTIMIZERS(X)                                                                          \
    X(SGD, mgt_sgd_rule)                                                                           \
    X(RMSPROP, mgt_rmsprop_rule)                                                                   \
    X(ADAM, mgt_adam_rule)

#define MGT_OPT_KIND_(id, rule) MGT_OPT_##id,
typedef enum { MGT_OPTIMIZERS(MGT_OPT_KIND_) MGT_OPT_COUNT } mgt_opt_kind;
#undef MGT_OPT_KIND_

#endif
