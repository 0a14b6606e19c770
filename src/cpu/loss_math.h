/* loss_math.h: one output's term of the float-target losses (backend.h: elem_loss), shared by the
 * CPU backend and the GPU kernel (compiled for the device under nvcc) so both compute the same
 * values.
 *
 * Binary cross-entropy from the logit v, in PyTorch's BCEWithLogits form: softplus(v) =
 * max(v, 0) + log1p(exp(-|v|)) never overflows and keeps its precision for large |v| (Keras,
 * from probabilities, clips them to [1e-7, 1 - 1e-7] instead: the same values in between), and
 * softplus(-v) = softplus(v) - v. The term is w1 t softplus(-v) + w0 (1 - t) softplus(v), its
 * derivative w0 (1 - t) p - w1 t (1 - p) with p = sigmoid(v), which is p - t for unit weights.
 * The term is returned in double (the loss sums in double), the derivative in float. */
#ifndef MGT_LOSS_MATH_H
#define MGT_LOSS_MATH_H

#include <math.h>

#include "../backend.h"
#include "../util.h"

/* 1 / (1 + e^-v) without overflow. */
MGT_HD static inline float mgt_sigmoid(float v) {
    if (v >= 0.0f)
        return 1.0f / (1.0f + expf(-v));
    const float e = expf(v);
    return e / (1.0f + e);
}

/* The term of output value y against target t, and its derivative in *g; p (binary: the
 * sigmoid of y) in *p. t is already smoothed (mgt_loss_target). */
MGT_HD static inline double mgt_loss_term(mgt_elem_kind kind, float y, float t, float delta,
                                          float w0, float w1, float *g, float *p) {
    if (kind == MGT_ELEM_BCE) {
        const double sp = (y > 0.0f ? (double)y : 0.0) + log1p(exp(-fabs((double)y)));
        const float q = mgt_sigmoid(y);
        *p = q;
        *g = w0 * (1.0f - t) * q - w1 * t * (1.0f - q);
        return (double)w1 * t * (sp - y) + (double)w0 * (1.0f - t) * sp;
    }
    const float e = y - t;
    *p = y;
    if (kind == MGT_ELEM_MSE) {
        *g = 2.0f * e;
        return (double)e * e;
    }
    const float a = fabsf(e);
    if (kind == MGT_ELEM_MAE) {
        *g = e > 0.0f ? 1.0f : e < 0.0f ? -1.0f : 0.0f;
        return a;
    }
    if (a <= delta) { /* huber */
        *g = e;
        return 0.5 * (double)e * e;
    }
    *g = e > 0.0f ? delta : -delta;
    return (double)delta * ((double)a - 0.5 * delta);
}

/* Binary cross-entropy's target under label smoothing s (Keras': t (1 - s) + s / 2). */
MGT_HD static inline float mgt_loss_target(mgt_elem_kind kind, float t, float s) {
    return kind == MGT_ELEM_BCE && s > 0.0f ? t * (1.0f - s) + 0.5f * s : t;
}

#endif
