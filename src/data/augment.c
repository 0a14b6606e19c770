/* augment.c: random crop with zero padding and horizontal flip (see augment.h).
 *
 * One 64-bit draw per (epoch, row) decides everything: bit 63 the flip, bits 0-31 the vertical
 * offset and bits 32-62 the horizontal one, each mapped to 0..2p by the high half of a product
 * (bias below 2p / 2^31, nothing measurable). Crop then flip is torchvision's order; since the
 * offset is symmetric the two orders give the same distribution anyway. */
#include "augment.h"

#include <stdio.h>
#include <string.h>

#include "../util.h"

#define AUG_PURPOSE 0x4155474DULL /* "AUGM" */

mgt_augment_draw mgt_augment_pick(const mgt_augment *a, uint64_t seed, int64_t epoch, int64_t row) {
    mgt_augment_draw d = {0, 0, 0};
    const uint64_t r = mgt_rand64(mgt_key3(seed, AUG_PURPOSE, (uint64_t)epoch), (uint64_t)row);
    if (a->flip)
        d.flip = (int)(r >> 63);
    if (a->crop > 0) {
        const uint64_t span = 2 * (uint64_t)a->crop + 1;
        d.dy = (int)(((r & 0xffffffffu) * span) >> 32) - a->crop;
        d.dx = (int)((((r >> 32) & 0x7fffffffu) * span) >> 31) - a->crop;
    }
    return d;
}

void mgt_augment_apply(const mgt_augment_draw *d, int h, int w, int c, const float *src,
                       float *dst) {
    const size_t pix = sizeof(float) * (size_t)c;
    for (int y = 0; y < h; y++) {
        float *out = dst + (size_t)y * (size_t)w * (size_t)c;
        const int sy = y + d->dy;
        if (sy < 0 || sy >= h) { /* a padding row */
            memset(out, 0, pix * (size_t)w);
            continue;
        }
        const float *in = src + (size_t)sy * (size_t)w * (size_t)c;
        if (!d->flip) {
            /* A shifted copy: zeros, the columns that stay inside, zeros. */
            const int x0 = d->dx < 0 ? -d->dx : 0, x1 = d->dx > 0 ? w - d->dx : w;
            if (x1 <= x0) {
                memset(out, 0, pix * (size_t)w);
                continue;
            }
            memset(out, 0, pix * (size_t)x0);
            memcpy(out + (size_t)x0 * (size_t)c, in + (size_t)(x0 + d->dx) * (size_t)c,
                   pix * (size_t)(x1 - x0));
            memset(out + (size_t)x1 * (size_t)c, 0, pix * (size_t)(w - x1));
            continue;
        }
        for (int x = 0; x < w; x++) {
            const int sx = w - 1 - x + d->dx;
            if (sx < 0 || sx >= w)
                memset(out + (size_t)x * (size_t)c, 0, pix);
            else
                memcpy(out + (size_t)x * (size_t)c, in + (size_t)sx * (size_t)c, pix);
        }
    }
}

void mgt_augment_batch(const mgt_augment *a, uint64_t seed, int64_t epoch, const int64_t *rows,
                       int n, int h, int w, int c, float *x, float *scratch) {
    if (!mgt_augment_on(a))
        return;
    const size_t elems = (size_t)h * (size_t)w * (size_t)c;
    for (int i = 0; i < n; i++) {
        const mgt_augment_draw d = mgt_augment_pick(a, seed, epoch, rows[i]);
        if (!d.flip && !d.dx && !d.dy)
            continue; /* the identity */
        float *s = x + (size_t)i * elems;
        memcpy(scratch, s, sizeof(float) * elems);
        mgt_augment_apply(&d, h, w, c, scratch, s);
    }
}

const char *mgt_augment_describe(const mgt_augment *a, char *buf, int cap) {
    if (a->resized_crop)
        snprintf(buf, (size_t)cap, "random-resized crop (scale %g-%g, ratio %.3g-%.3g)%s",
                 a->scale[0], a->scale[1], a->ratio[0], a->ratio[1],
                 a->flip ? " and horizontal flip" : "");
    else if (!mgt_augment_on(a))
        snprintf(buf, (size_t)cap, "off");
    else if (a->flip && a->crop > 0)
        snprintf(buf, (size_t)cap, "horizontal flip, pad %d and random crop", a->crop);
    else if (a->flip)
        snprintf(buf, (size_t)cap, "horizontal flip");
    else
        snprintf(buf, (size_t)cap, "pad %d and random crop", a->crop);
    return buf;
}

void mgt_input_normalize(const mgt_input_tf *tf, float *x, int n, int64_t elems, int c) {
    if (!tf->norm || c < 1)
        return;
    float mean[MGT_NORM_MAX_C], sd[MGT_NORM_MAX_C];
    for (int ch = 0; ch < c && ch < MGT_NORM_MAX_C; ch++) {
        mean[ch] = tf->mean[tf->nvalues == 1 ? 0 : ch];
        sd[ch] = tf->std[tf->nvalues == 1 ? 0 : ch];
    }
    /* (x - mean) / std, a subtraction and a division, as torchvision's Normalize does them. */
    const int64_t pixels = (int64_t)n * (elems / c);
    for (int64_t p = 0; p < pixels; p++)
        for (int ch = 0; ch < c; ch++)
            x[p * c + ch] = (x[p * c + ch] - mean[ch]) / sd[ch];
}

const char *mgt_input_describe(const mgt_input_tf *tf, char *buf, int cap) {
    buf[0] = 0;
    if (!tf->norm)
        return buf;
    int o = snprintf(buf, (size_t)cap, "normalised (mean");
    for (int i = 0; i < tf->nvalues && o < cap; i++)
        o += snprintf(buf + o, (size_t)(cap - o), "%s %g", i ? "," : "", tf->mean[i]);
    if (o < cap)
        o += snprintf(buf + o, (size_t)(cap - o), "; std");
    for (int i = 0; i < tf->nvalues && o < cap; i++)
        o += snprintf(buf + o, (size_t)(cap - o), "%s %g", i ? "," : "", tf->std[i]);
    if (o < cap)
        snprintf(buf + o, (size_t)(cap - o), ")");
    return buf;
}
