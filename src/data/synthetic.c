/* synthetic.c: the synthetic dataset, and the parts of the dataset API shared by all sources
 * (gather, slice, free).
 *
 * Synthetic samples are generated on demand from (seed, split_salt, sample index), so a dataset
 * of any size costs no memory and every rank, thread count and backend sees the same sample i.
 * Each value is one byte of a counter-based 64-bit draw (8 values per mgt_rand64 call, which keeps
 * a 256 x 784 gather well below a millisecond), mapped to (byte + 0.5) / 256: uniform on 256
 * levels in (0, 1), mean exactly 0.5.
 *
 * The label is learnable by construction: every class has a fixed random template (same byte
 * scheme, keyed by the seed alone so the train and test splits share them), and a sample's label
 * is the class whose template has the largest dot product with the sample centred at 0.5. Both
 * sides are centred as odd integers 2*byte - 255 (int16), so the dot product is exact integer
 * arithmetic: the same label on every machine and build, ties going to the lowest class. By
 * symmetry the classes come out roughly balanced.
 *
 * The computation uses fixed stack blocks (no allocation, about 20 KB of stack whatever the shape
 * or class count): samples in blocks of SB, classes in blocks of CB, elements in chunks of CH.
 * The templates of a class block are regenerated per (sample block, chunk), which costs 1/SB of
 * generating the pixels. */
#include "dataset.h"
#include "images.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SYN_PIXELS 0x53594E5448ULL  /* "SYNTH": the pixel stream */
#define SYN_TEMPLATES 0x544D504CULL /* "TMPL": the class template stream */
#define SB 32                       /* samples per block */
#define CB 16                       /* classes per block */
#define CH 512 /* elements per chunk: a multiple of 16; CH * 255 * 255 fits an int32 */

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

/* Byte -> value tables, built per gather (256 entries each, negligible) rather than kept as
 * global state: a table load is cheaper than an int-to-float conversion per value. */
typedef struct value_luts {
    int16_t centred[256]; /* 2*b - 255: the integers the labels are computed from */
    float pixel[256];     /* (b + 0.5) / 256: the sample values handed out */
} value_luts;

/* Values [j0, j1) of row `row` (of `words` draws) of stream `key`: centred into out, then zeros
 * up to the next multiple of 16 (so dot16 needs no tail loop); as pixels into xs unless NULL.
 * j0 is a multiple of 8, so value j is byte j % 8 of draw row * words + j / 8. The 8 bytes of a
 * draw are unpacked with constant shifts: a loop over the byte index is left rolled at -O2, with
 * a variable shift, and then costs more than the dot products. */
static void row_values(const value_luts *lut, uint64_t key, uint64_t row, int64_t words, int64_t j0,
                       int64_t j1, int16_t *out, float *xs) {
    const int len = (int)(j1 - j0);
    const uint64_t base = row * (uint64_t)words + (uint64_t)(j0 / 8);
    uint8_t b[8];
    int j = 0;
#define UNPACK8(r)                                                                                 \
    b[0] = (uint8_t)(r), b[1] = (uint8_t)((r) >> 8), b[2] = (uint8_t)((r) >> 16),                  \
    b[3] = (uint8_t)((r) >> 24), b[4] = (uint8_t)((r) >> 32), b[5] = (uint8_t)((r) >> 40),         \
    b[6] = (uint8_t)((r) >> 48), b[7] = (uint8_t)((r) >> 56)
    if (xs) {
        for (; j + 8 <= len; j += 8) {
            const uint64_t r = mgt_rand64(key, base + (uint64_t)(j / 8));
            UNPACK8(r);
            for (int k = 0; k < 8; k++) {
                out[j + k] = lut->centred[b[k]];
                xs[j + k] = lut->pixel[b[k]];
            }
        }
    } else {
        for (; j + 8 <= len; j += 8) {
            const uint64_t r = mgt_rand64(key, base + (uint64_t)(j / 8));
            UNPACK8(r);
            for (int k = 0; k < 8; k++)
                out[j + k] = lut->centred[b[k]];
        }
    }
    if (j < len) { /* a last, partial draw */
        const uint64_t r = mgt_rand64(key, base + (uint64_t)(j / 8));
        UNPACK8(r);
        for (int k = 0; j + k < len; k++) {
            out[j + k] = lut->centred[b[k]];
            if (xs)
                xs[j + k] = lut->pixel[b[k]];
        }
    }
#undef UNPACK8
    for (j = len; j % 16 != 0; j++)
        out[j] = 0;
}

/* The dot product of two int16 chunks (len16 a multiple of 16, so compilers vectorize it as
 * whole 8- or 16-lane blocks; each |product| <= 255^2, and CH of them fit an int32). */
static int32_t dot16(const int16_t *a, const int16_t *b, int len16) {
    int32_t s = 0;
    for (int j = 0; j < len16; j++)
        s += (int32_t)a[j] * b[j];
    return s;
}

void mgt_dataset_synthetic_keys(const mgt_dataset *ds, uint64_t *pixel_key,
                                uint64_t *template_key) {
    *pixel_key = mgt_key3(ds->seed, ds->split_salt, SYN_PIXELS);
    *template_key = mgt_key3(ds->seed, SYN_TEMPLATES, 0);
}

static void gather_synthetic(const mgt_dataset *ds, const int64_t *idx, int count, float *x,
                             int32_t *labels) {
    const int64_t elems = (int64_t)ds->h * ds->w * ds->c;
    const int64_t words = (elems + 7) / 8;
    uint64_t pkey, tkey;
    mgt_dataset_synthetic_keys(ds, &pkey, &tkey);
    const int classes = ds->classes > 0 ? ds->classes : 1;

    value_luts lut;
    for (int b = 0; b < 256; b++) {
        lut.centred[b] = (int16_t)(2 * b - 255);
        lut.pixel[b] = ((float)b + 0.5f) * (1.0f / 256.0f);
    }
    int16_t tmpl[CB][CH]; /* one chunk of the templates of one class block */
    int16_t px[CH];       /* one chunk of one sample */
    int64_t acc[SB][CB];  /* dot products of a sample block with a class block */
    int64_t best[SB];
    int32_t bestc[SB];

    for (int s0 = 0; s0 < count; s0 += SB) {
        const int ns = count - s0 < SB ? count - s0 : SB;
        for (int c0 = 0; c0 < classes; c0 += CB) {
            const int nc = classes - c0 < CB ? classes - c0 : CB;
            memset(acc, 0, sizeof acc);
            for (int64_t j0 = 0; j0 < elems; j0 += CH) {
                const int64_t j1 = elems - j0 < CH ? elems : j0 + CH;
                const int len16 = (int)(j1 - j0 + 15) / 16 * 16;
                for (int c = 0; c < nc; c++)
                    row_values(&lut, tkey, (uint64_t)(c0 + c), words, j0, j1, tmpl[c], NULL);
                for (int s = 0; s < ns; s++) {
                    const uint64_t i = (uint64_t)(ds->first + idx[s0 + s]);
                    /* The pixels are written once, with the first class block. */
                    row_values(&lut, pkey, i, words, j0, j1, px,
                               c0 == 0 ? x + (int64_t)(s0 + s) * elems + j0 : NULL);
                    for (int c = 0; c < nc; c++)
                        acc[s][c] += dot16(px, tmpl[c], len16);
                }
            }
            /* Running argmax over class blocks; strict > keeps the lowest class on ties. */
            for (int s = 0; s < ns; s++)
                for (int c = 0; c < nc; c++)
                    if ((c0 == 0 && c == 0) || acc[s][c] > best[s]) {
                        best[s] = acc[s][c];
                        bestc[s] = c0 + c;
                    }
        }
        for (int s = 0; s < ns; s++)
            labels[s0 + s] = bestc[s];
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

void mgt_dataset_gather(const mgt_dataset *ds, const int64_t *idx, int count, float *x,
                        int32_t *labels) {
    if (mgt_dataset_is_synthetic(ds)) {
        gather_synthetic(ds, idx, count, x, labels);
        return;
    }
    if (ds->images) { /* the evaluation transform (images.h) */
        mgt_images_gather(ds, idx, count, NULL, 0, 0, x, labels);
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
        labels[k] = ds->labels ? ds->labels[idx[k]] : ds->labels32[idx[k]];
    }
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
    if (ds->images)
        v.first = ds->first + first;
    else if (ds->pixels)
        v.pixels = ds->pixels + first * elems;
    else
        v.fpixels = ds->fpixels + first * elems * (int64_t)sizeof(float);
    if (ds->labels)
        v.labels = ds->labels + first;
    else
        v.labels32 = ds->labels32 + first;
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
        free(ds->labels);
        free(ds->labels32);
    }
    ds->pixels = NULL;
    ds->fpixels = NULL;
    ds->labels = NULL;
    ds->labels32 = NULL;
    ds->images = NULL;
    ds->map = NULL;
    ds->owned = 0;
    ds->n = 0;
}
