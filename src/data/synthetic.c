/* synthetic.c: the synthetic dataset, and the parts of the dataset API shared by all sources
 * (gather, slice, free).
 *
 * Synthetic samples are generated on demand from (seed, split_salt, sample index), so a dataset
 * of any size costs no memory and every rank, thread count and backend sees the same sample i.
 * What a sample is (its label drawn first, then its values: the label's class template plus
 * noise) is synthetic_def.h's, shared with the GPU's generator: two counter-based draws per 8
 * values, whatever the class count. The draws are batched so that they vectorise: a 256 x 784
 * gather took 0.30 ms on one core of a Xeon, 0.063 ms batched. */
#include "dataset.h"
#include "images.h"
#include "tokens.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../simd.h"
#include "synthetic_def.h"

#define SYN_PIXELS 0x53594E5448ULL  /* "SYNTH": the noise stream */
#define SYN_TEMPLATES 0x544D504CULL /* "TMPL": the class template stream */

void mgt_dataset_synthetic(mgt_dataset *ds, int64_t n, int h, int w, int c, int classes,
                           uint64_t seed, uint64_t split_salt) {
    memset(ds, 0, sizeof *ds);
    ds->n = n;
    ds->h = h;
    ds->w = w;
    ds->c = c;
    ds->classes = classes;
    ds->seed = seed;
    ds->split_salt = split_salt;
    snprintf(ds->source, sizeof ds->source, "synthetic");
}

void mgt_dataset_synthetic_keys(const mgt_dataset *ds, uint64_t *pixel_key,
                                uint64_t *template_key) {
    *pixel_key = mgt_key3(ds->seed, ds->split_salt, SYN_PIXELS);
    *template_key = mgt_key3(ds->seed, SYN_TEMPLATES, 0);
}

/* Values [0, 8 * words) of a sample whose draws are t = template stream at t0 + w and u = noise
 * stream at u0 + w, in blocks: the draws first (the 64-bit mixes vectorise 8 wide with AVX-512),
 * then their bytes to values (byte k of a draw is its value k: little-endian memory order).
 * Integer mixing and an exact conversion, so every variant (simd.h) writes the same bits as
 * mgt_syn_value. */
MGT_SIMD
static void synthetic_words(uint64_t tkey, uint64_t t0, const uint64_t *tpl, uint64_t pkey,
                            uint64_t u0, uint64_t words, float *restrict xs) {
    enum { BLOCK = 64 };
    uint64_t t[BLOCK], u[BLOCK];
    for (uint64_t w0 = 0; w0 < words; w0 += BLOCK) {
        const uint64_t nw = words - w0 < BLOCK ? words - w0 : BLOCK;
        if (tpl) /* the class's draws, made once (mgt_synthetic_templates) */
            memcpy(t, tpl + w0, sizeof(uint64_t) * nw);
        else
            for (uint64_t w = 0; w < nw; w++)
                t[w] = mgt_rand64(tkey, t0 + w0 + w);
        for (uint64_t w = 0; w < nw; w++)
            u[w] = mgt_rand64(pkey, u0 + w0 + w);
        float *restrict out = xs + 8 * w0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        const uint8_t *tb = (const uint8_t *)t, *ub = (const uint8_t *)u;
        for (uint64_t j = 0; j < 8 * nw; j++)
            out[j] = mgt_syn_value_of(tb[j], ub[j]);
#else
        for (uint64_t j = 0; j < 8 * nw; j++)
            out[j] = mgt_syn_value(t[j / 8], u[j / 8], (int)(j % 8));
#endif
    }
}

/* The template draws of every class, classes x words of them (words = ceil(h w c / 8)), where
 * they take at most MGT_SYN_TEMPLATES_MAX bytes: 0, or the count. */
size_t mgt_synthetic_templates_count(const mgt_dataset *ds) {
    const uint64_t elems = (uint64_t)ds->h * (uint64_t)ds->w * (uint64_t)ds->c;
    const uint64_t words = (elems + 7) / 8, classes = ds->classes > 0 ? (uint64_t)ds->classes : 1;
    if (!mgt_dataset_is_synthetic(ds) || words == 0 ||
        classes > MGT_SYN_TEMPLATES_MAX / sizeof(uint64_t) / words)
        return 0;
    return (size_t)(classes * words);
}

void mgt_synthetic_templates(const mgt_dataset *ds, uint64_t *out) {
    const size_t count = mgt_synthetic_templates_count(ds);
    uint64_t pkey, tkey;
    mgt_dataset_synthetic_keys(ds, &pkey, &tkey);
    for (size_t k = 0; k < count; k++) /* class L's word w at L * words + w, as gathered */
        out[k] = mgt_rand64(tkey, (uint64_t)k);
}

static void gather_synthetic(const mgt_dataset *ds, const uint64_t *templates,
                             const int64_t *idx, int count, float *x, int32_t *labels) {
    const int64_t elems = (int64_t)ds->h * ds->w * ds->c;
    const uint64_t words = (uint64_t)(elems + 7) / 8, full = (uint64_t)elems / 8;
    uint64_t pkey, tkey;
    mgt_dataset_synthetic_keys(ds, &pkey, &tkey);
    const uint64_t lkey = mgt_syn_label_key(pkey);
    const int classes = ds->classes > 0 ? ds->classes : 1;
    for (int s = 0; s < count; s++) {
        const uint64_t i = (uint64_t)(ds->first + idx[s]);
        const int32_t label = mgt_syn_label(lkey, i, classes);
        float *xs = x + (int64_t)s * elems;
        synthetic_words(tkey, (uint64_t)label * words,
                        templates ? templates + (uint64_t)label * words : NULL, pkey, i * words,
                        full, xs);
        if (full < words) { /* a last, partial draw */
            const uint64_t t = mgt_rand64(tkey, (uint64_t)label * words + full);
            const uint64_t u = mgt_rand64(pkey, i * words + full);
            for (int k = 0; (int64_t)(8 * full) + k < elems; k++)
                xs[8 * full + (uint64_t)k] = mgt_syn_value(t, u, k);
        }
        labels[s] = label;
    }
}

/* A float32 sample as stored: a straight copy, byte-swapped for a big-endian file. */
static void copy_floats(const uint8_t *src, int64_t elems, int swap, float *dst) {
    memcpy(dst, src, sizeof(float) * (size_t)elems);
    if (!swap)
        return;
    uint32_t *u = (uint32_t *)(void *)dst;
    for (int64_t j = 0; j < elems; j++)
        u[j] = __builtin_bswap32(u[j]);
}

void mgt_dataset_gather_with(const mgt_dataset *ds, const uint64_t *templates,
                             const int64_t *idx, int count, float *x, int32_t *labels) {
    if (mgt_dataset_is_synthetic(ds)) {
        gather_synthetic(ds, templates, idx, count, x, labels);
        return;
    }
    if (ds->images) { /* the evaluation transform (images.h) */
        mgt_images_gather(ds, idx, count, NULL, 0, 0, 0, x, labels);
        return;
    }
    if (ds->tokens) {
        mgt_tokens_gather(ds, idx, count, x, labels);
        return;
    }
    const int64_t elems = (int64_t)ds->h * ds->w * ds->c;
    for (int k = 0; k < count; k++) {
        float *xs = x + (int64_t)k * elems;
        if (ds->pixels) {
            const uint8_t *p = ds->pixels + idx[k] * elems;
            for (int64_t j = 0; j < elems; j++)
                xs[j] = (float)p[j] / 255.0f;
        } else {
            copy_floats(ds->fpixels + idx[k] * elems * (int64_t)sizeof(float), elems, ds->fswap,
                        xs);
        }
        labels[k] = ds->labels     ? ds->labels[idx[k]]
                    : ds->labels32 ? ds->labels32[idx[k]]
                                   : 0; /* float targets instead (mgt_dataset_gather_targets) */
    }
}

void mgt_dataset_gather(const mgt_dataset *ds, const int64_t *idx, int count, float *x,
                        int32_t *labels) {
    mgt_dataset_gather_with(ds, NULL, idx, count, x, labels);
}

mgt_dataset mgt_dataset_slice(const mgt_dataset *ds, int64_t first, int64_t count) {
    mgt_dataset v = *ds;
    /* Clamp to the parent so a bad request gives a smaller view, never out-of-bounds memory. */
    if (first < 0)
        first = 0;
    if (first > ds->n)
        first = ds->n;
    if (count < 0)
        count = 0;
    if (count > ds->n - first)
        count = ds->n - first;
    v.n = count;
    v.owned = 0;
    const int64_t elems = (int64_t)ds->h * ds->w * ds->c;
    if (mgt_dataset_is_synthetic(ds)) {
        v.first = ds->first + first;
        return v;
    }
    if (ds->images && ds->rows) { /* the rows' map moves; the labels stay the set's */
        v.rows = ds->rows + first;
        return v;
    }
    if (ds->images || ds->tokens)
        v.first = ds->first + first;
    else if (ds->pixels)
        v.pixels = ds->pixels + first * elems;
    else
        v.fpixels = ds->fpixels + first * elems * (int64_t)sizeof(float);
    if (ds->labels)
        v.labels = ds->labels + first;
    else if (ds->labels32)
        v.labels32 = ds->labels32 + first;
    else
        v.targets = ds->targets + first * ds->target_elems;
    return v;
}

void mgt_dataset_free(mgt_dataset *ds) {
    if (!ds)
        return;
    if (ds->owned) {
        if (ds->map)
            munmap(ds->map, ds->map_len); /* the samples were the file's pages */
        else
            free(ds->pixels);
        mgt_images_free(ds->images);
        mgt_tokens_free(ds->tokens);
        free(ds->labels);
        free(ds->labels32);
        free(ds->targets);
    }
    ds->targets = NULL;
    ds->pixels = NULL;
    ds->fpixels = NULL;
    ds->labels = NULL;
    ds->labels32 = NULL;
    ds->images = NULL;
    ds->tokens = NULL;
    ds->map = NULL;
    ds->owned = 0;
    ds->n = 0;
}
