/* clip.h: gradient clipping, by the global norm (clip_norm: PyTorch's clip_grad_norm_, Keras'
 * global_clipnorm) and by value (clip_value: clip_grad_value_, Keras' clipvalue).
 *
 * It works on the ALL-REDUCED gradient arena, between the all-reduce and the update, so every
 * rank clips the same numbers the same way and the result does not depend on the rank count.
 * The arena holds SUMS over the global batch of N samples, while the limits are meant for the
 * mean gradient (the loss's gradient, as in Keras and PyTorch): |g/N| <= v is |g| <= v*N, and
 * ||g/N|| <= c is ||g|| <= c*N, so the sums are clipped at limits scaled by N. The optimizer's
 * weight decay is added after clipping (inside its rule), as in PyTorch, where clipping sees
 * p.grad before optimizer.step() adds it.
 *
 * With both set, values are clipped first and the norm after, so the norm bound holds for the
 * update. On a GPU the norm is reduced on the device and the scaling reads it there: the host
 * never waits for it. */
#ifndef MGT_CLIP_H
#define MGT_CLIP_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "util.h"

typedef struct mgt_clip_cfg {
    float norm;  /* clip_norm: largest L2 norm of the whole mean gradient; 0: off */
    float value; /* clip_value: largest magnitude of each mean-gradient element; 0: off */
} mgt_clip_cfg;

/* One [train] key: 1 if taken, 0 if `key` is not clipping's, -1 on a bad value. */
int mgt_clip_set(mgt_clip_cfg *c, const char *key, const char *value, mgt_err *err);
const char *mgt_clip_key_at(int i); /* NULL past the last */

typedef struct mgt_clip {
    mgt_clip_cfg cfg;
    double *work; /* backend memory for the norm's reduction (NULL when clip_norm is off) */
} mgt_clip;

int mgt_clip_init(mgt_clip *c, const mgt_clip_cfg *cfg, mgt_backend *be, mgt_err *err);
/* Clips the `count` gradient sums g over a global batch of global_n samples, in place. */
void mgt_clip_apply(mgt_clip *c, mgt_backend *be, float *g, size_t count, int64_t global_n);
void mgt_clip_free(mgt_clip *c, mgt_backend *be);

#endif
