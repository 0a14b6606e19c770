/* layer_util.h: small helpers shared by the layer files. */
#ifndef MGT_LAYER_UTIL_H
#define MGT_LAYER_UTIL_H

#include "../model.h"
#include "../parse.h"

static inline float *mgt_w(mgt_model *m, const mgt_layer *l, int i) {
    return l->param[i] < 0 ? NULL : m->w + m->params[l->param[i]].offset;
}
/* The gradient of tensor i: NULL where there is none (no such tensor, or a frozen layer's). */
static inline float *mgt_g(mgt_model *m, const mgt_layer *l, int i) {
    return l->param[i] < 0 || l->frozen ? NULL : m->g + m->params[l->param[i]].offset;
}
static inline float *mgt_buf(mgt_model *m, const mgt_layer *l, int i) {
    return m->buf + m->buffers[l->buffer[i]].offset;
}
static inline int mgt_set_pos_int(const char *v, int *out, mgt_err *err) {
    if (mgt_parse_int(v, out) < 0 || *out < 1)
        return mgt_errf(err, "expected a positive whole number");
    return 0;
}
/* The convolution keys (filters, kernel, stride, padding, use_bias, algo), shared by conv2d,
 * depthwise_conv2d and separable_conv2d (layers/conv2d.c). */
int mgt_conv_set(mgt_layer *l, const char *key, const char *v, mgt_err *err);
static inline int mgt_set_bool(const char *v, int *out, mgt_err *err) {
    if (mgt_parse_bool(v, out) < 0)
        return mgt_errf(err, "expected true or false");
    return 0;
}

#endif
