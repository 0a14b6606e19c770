/* test_images.c: the parts of image sets that need no image tree (tests/cli/images.sh compares
 * the rest with Pillow):
 *  - resample.c against a direct double-precision evaluation of the same filter (the triangle
 *    of width max(scale, 1) around each output pixel's centre, normalised): Pillow's two passes
 *    each round to bytes and its weights have 22 fractional bits, so the result is within 1 of
 *    the reference rounded (a convex combination of values rounded by at most 0.5, rounded once
 *    more, against the reference rounded once: |difference| <= 1.5, hence <= 1 in whole
 *    numbers); a constant image stays exactly constant, equal sizes copy exactly, and a window
 *    is exactly the crop of the whole result;
 *  - the random-resized crop's draws: inside the image, areas and ratios in their ranges (up to
 *    the rounding of the sides), flips and offsets balanced, a function of (seed, epoch, row)
 *    alone, the fallback centre crop when no try can fit;
 *  - the thread pool: every item exactly once, for any thread count and from two callers;
 *  - the decoder: tiny JPEG and PNG files decode to their pixels; truncated and foreign files
 *    are refused with what they are. */
#include <math.h>
#include <pthread.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <sys/resource.h>
#include <sys/stat.h>

#include <jpeglib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/convert.h"
#include "data/decode.h"
#include "data/images.h"
#include "data/pool.h"
#include "data/resample.h"
#include "tally.h"

/* ---- resample ---- */

static double tri(double x) {
    x = fabs(x);
    return x < 1 ? 1 - x : 0;
}

/* One axis of the reference: out[i] from in[0..n) with stride st, resized n -> m. */
static void ref_axis(const double *in, int n, size_t st, int m, double *out, size_t ost) {
    const double scale = (double)n / m, s = scale > 1 ? scale : 1;
    for (int i = 0; i < m; i++) {
        const double c = (i + 0.5) * scale;
        double sum = 0, acc = 0;
        for (int x = 0; x < n; x++) {
            const double w = tri((x + 0.5 - c) / s);
            sum += w;
            acc += w * in[(size_t)x * st];
        }
        out[(size_t)i * ost] = acc / sum;
    }
}

static void test_resample(tally *t) {
    const int sizes[][4] = {{37, 23, 11, 9}, {16, 16, 32, 32},     {100, 60, 24, 24},
                            {7, 50, 20, 3},  {256, 256, 224, 224}, {45, 45, 45, 30},
                            {3, 2, 64, 48},  {300, 17, 17, 300}};
    mgt_resample_work w = {0};
    int worst = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int sw = sizes[k][0], sh = sizes[k][1], fw = sizes[k][2], fh = sizes[k][3], c = 3;
        uint8_t *src = malloc((size_t)sw * sh * c), *dst = malloc((size_t)fw * fh * c);
        double *in = malloc(sizeof(double) * (size_t)sw * sh),
               *mid = malloc(sizeof(double) * (size_t)fw * sh),
               *ref = malloc(sizeof(double) * (size_t)fw * fh);
        for (size_t i = 0; i < (size_t)sw * sh * c; i++)
            src[i] = (uint8_t)(mgt_rand64(k, i) >> 56);
        CHECK(t,
              mgt_resample_u8(src, sw, sh, (size_t)sw * c, c, fw, fh, 0, 0, fw, fh, dst, &w) == 0);
        for (int ch = 0; ch < c; ch++) {
            for (int i = 0; i < sw * sh; i++)
                in[i] = src[(size_t)i * c + ch];
            for (int y = 0; y < sh; y++)
                ref_axis(in + (size_t)y * sw, sw, 1, fw, mid + (size_t)y * fw, 1);
            for (int x = 0; x < fw; x++)
                ref_axis(mid + x, sh, (size_t)fw, fh, ref + x, (size_t)fw);
            for (int i = 0; i < fw * fh; i++) {
                const int d = abs((int)dst[(size_t)i * c + ch] - (int)lround(ref[i]));
                worst = d > worst ? d : worst;
            }
        }
        /* a window is the crop of the whole result, byte for byte */
        const int ox = fw / 3, oy = fh / 4, ow = fw - ox - fw / 5, oh = fh - oy;
        uint8_t *win = malloc((size_t)ow * oh * c);
        CHECK(t, mgt_resample_u8(src, sw, sh, (size_t)sw * c, c, fw, fh, ox, oy, ow, oh, win, &w) ==
                     0);
        int same = 1;
        for (int y = 0; y < oh; y++)
            same &= !memcmp(win + (size_t)y * ow * c, dst + ((size_t)(oy + y) * fw + ox) * c,
                            (size_t)ow * c);
        CHECK(t, same);
        free(win);
        free(src);
        free(dst);
        free(in);
        free(mid);
        free(ref);
    }
    printf("resample: largest difference from the double-precision reference %d (bound 1)\n",
           worst);
    CHECK(t, worst <= 1);
    /* constant stays constant; equal sizes copy; one channel and four */
    for (int c = 1; c <= 4; c += 3) {
        uint8_t src[40 * 30 * 4], dst[33 * 17 * 4];
        memset(src, 173, sizeof src);
        CHECK(t,
              mgt_resample_u8(src, 40, 30, 40 * (size_t)c, c, 33, 17, 0, 0, 33, 17, dst, &w) == 0);
        int flat = 1;
        for (size_t i = 0; i < (size_t)33 * 17 * c; i++)
            flat &= dst[i] == 173;
        CHECK(t, flat);
        for (size_t i = 0; i < sizeof src; i++)
            src[i] = (uint8_t)i;
        CHECK(t,
              mgt_resample_u8(src, 40, 30, 40 * (size_t)c, c, 40, 30, 5, 7, 20, 10, dst, &w) == 0);
        int copy = 1;
        for (int y = 0; y < 10; y++)
            copy &= !memcmp(dst + (size_t)y * 20 * c, src + ((size_t)(7 + y) * 40 + 5) * c,
                            (size_t)20 * c);
        CHECK(t, copy);
    }
    mgt_resample_work_free(&w);
}

/* ---- the crop draws ---- */

static void test_pick(tally *t) {
    const mgt_augment a = {
        .flip = 1, .resized_crop = 1, .scale = {0.08f, 1.0f}, .ratio = {3.0f / 4.0f, 4.0f / 3.0f}};
    enum { ROWS = 20000, S = 256 };
    int inside = 1, area_ok = 1, ratio_ok = 1, same = 1;
    long flips = 0, moved = 0;
    double top_frac = 0, left_frac = 0, log_ratio = 0;
    int n_off = 0;
    for (int64_t r = 0; r < ROWS; r++) {
        const mgt_crop c = mgt_images_pick(&a, S, S, 42, 5, r);
        const mgt_crop again = mgt_images_pick(&a, S, S, 42, 5, r);
        const mgt_crop other = mgt_images_pick(&a, S, S, 42, 6, r);
        same &= !memcmp(&c, &again, sizeof c);
        moved += memcmp(&c, &other, sizeof c) != 0;
        inside &= c.h >= 1 && c.w >= 1 && c.top >= 0 && c.left >= 0 && c.top + c.h <= S &&
                  c.left + c.w <= S;
        /* sides rounded by at most 0.5: the area and ratio within that of their ranges */
        const double area = (double)c.h * c.w / (S * S), hw = S * sqrt(0.08 * 0.75);
        area_ok &= area >= 0.08 * (1 - 1 / hw) * (1 - 1 / hw) - 1e-12 && area <= 1;
        const double ratio = (double)c.w / c.h;
        ratio_ok &= ratio >= 0.75 * (1 - 1.0 / hw) / (1 + 1.0 / hw) &&
                    ratio <= 4.0 / 3 * (1 + 1.0 / hw) / (1 - 1.0 / hw);
        flips += c.flip;
        log_ratio += log(ratio);
        if (c.h < S && c.w < S) {
            top_frac += (double)c.top / (S - c.h);
            left_frac += (double)c.left / (S - c.w);
            n_off++;
        }
    }
    CHECK(t, same && inside && area_ok && ratio_ok);
    CHECK(t, moved > ROWS * 0.99); /* another epoch, other crops */
    /* binomial / uniform means: 5 standard deviations */
    CHECK(t, fabs(flips / (double)ROWS - 0.5) < 5 * 0.5 / sqrt(ROWS));
    CHECK(t, fabs(top_frac / n_off - 0.5) < 5 * 0.29 / sqrt(n_off));
    CHECK(t, fabs(left_frac / n_off - 0.5) < 5 * 0.29 / sqrt(n_off));
    CHECK(t, fabs(log_ratio / ROWS) < 5 * 0.17 / sqrt(ROWS)); /* log-uniform, symmetric */
    printf("crops: flips %.4f, mean offsets %.4f %.4f, mean log-ratio %.4f over %d rows\n",
           flips / (double)ROWS, top_frac / n_off, left_frac / n_off, log_ratio / ROWS, ROWS);
    /* no try fits a ratio of 2 to 3 in 80-90% of a square: the centre crop of ratio 2 */
    const mgt_augment wide = {.resized_crop = 1, .scale = {0.8f, 0.9f}, .ratio = {2.0f, 3.0f}};
    const mgt_crop f = mgt_images_pick(&wide, 100, 100, 1, 0, 3);
    CHECK(t, f.w == 100 && f.h == 50 && f.top == 25 && f.left == 0 && f.flip == 0);
    const mgt_augment tall = {.resized_crop = 1, .scale = {0.9f, 1.0f}, .ratio = {0.2f, 0.3f}};
    const mgt_crop g = mgt_images_pick(&tall, 40, 90, 1, 0, 3); /* 90 wide: ratio 2.25 > 0.3 */
    CHECK(t, g.h == 40 && g.w == 12 && g.top == 0 && g.left == 39);
    /* without the resized crop: the whole image, the flip alone */
    const mgt_augment flip_only = {.flip = 1};
    const mgt_crop h = mgt_images_pick(&flip_only, 30, 20, 7, 0, 1);
    CHECK(t, h.top == 0 && h.left == 0 && h.h == 30 && h.w == 20);
    CHECK(t, mgt_images_eval_side(224, 224, 0.875f) == 256 &&
                 mgt_images_eval_side(128, 128, 0) == 146 &&
                 mgt_images_eval_side(32, 24, 1.0f) == 32);
}

/* ---- the pool ---- */

typedef struct counts {
    int *hits;
    int bad_k, size;
} counts;

static void count(void *ctx, int64_t i, int k) {
    counts *c = ctx;
    __atomic_add_fetch(&c->hits[i], 1, __ATOMIC_RELAXED);
    if (k < 0 || k >= c->size)
        __atomic_store_n(&c->bad_k, 1, __ATOMIC_RELAXED);
}

typedef struct caller {
    mgt_pool *p;
    counts c;
    int n;
} caller;

static void *call(void *arg) {
    caller *c = arg;
    for (int r = 0; r < 50; r++)
        mgt_pool_run(c->p, c->n, count, &c->c);
    return NULL;
}

static void test_pool(tally *t) {
    for (int threads = 1; threads <= 4; threads++) {
        mgt_pool *p = mgt_pool_create(threads);
        CHECK(t, p && mgt_pool_size(p) == threads);
        const int ns[] = {0, 1, 5, 1000};
        for (size_t k = 0; k < 4; k++) {
            counts c = {calloc((size_t)ns[k] + 1, sizeof(int)), 0, mgt_pool_size(p)};
            mgt_pool_run(p, ns[k], count, &c);
            int once = !c.bad_k;
            for (int i = 0; i < ns[k]; i++)
                once &= c.hits[i] == 1;
            CHECK(t, once);
            free(c.hits);
        }
        /* two callers at once: their jobs take turns */
        caller a = {p, {calloc(300, sizeof(int)), 0, mgt_pool_size(p)}, 300};
        caller b = {p, {calloc(77, sizeof(int)), 0, mgt_pool_size(p)}, 77};
        pthread_t ta, tb;
        pthread_create(&ta, NULL, call, &a);
        pthread_create(&tb, NULL, call, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        int ok = !a.c.bad_k && !b.c.bad_k;
        for (int i = 0; i < 300; i++)
            ok &= a.c.hits[i] == 50;
        for (int i = 0; i < 77; i++)
            ok &= b.c.hits[i] == 50;
        CHECK(t, ok);
        free(a.c.hits);
        free(b.c.hits);
        mgt_pool_destroy(p);
    }
}

/* ---- decoding ---- */

/* Pillow wrote these: a 3x2 RGB PNG and a 16x8 JPEG of one colour (quality 95). */
static const uint8_t png_3x2[85] = {
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
    0x52, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0x12,
    0x16, 0xf1, 0x4d, 0x00, 0x00, 0x00, 0x1c, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8,
    0xcf, 0xc0, 0xc0, 0xf0, 0x9f, 0x81, 0x81, 0xe1, 0x3f, 0x23, 0x97, 0x88, 0xdc, 0xbe, 0x00,
    0x91, 0x1d, 0x32, 0x7e, 0x00, 0x37, 0xbf, 0x05, 0x7f, 0xc2, 0xc1, 0x80, 0x80, 0x00, 0x00,
    0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};
static const uint8_t jpeg_16x8[634] = {
    0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01, 0x01, 0x00, 0x00, 0x01,
    0x00, 0x01, 0x00, 0x00, 0xff, 0xdb, 0x00, 0x43, 0x00, 0x02, 0x01, 0x01, 0x01, 0x01, 0x01, 0x02,
    0x01, 0x01, 0x01, 0x02, 0x02, 0x02, 0x02, 0x02, 0x04, 0x03, 0x02, 0x02, 0x02, 0x02, 0x05, 0x04,
    0x04, 0x03, 0x04, 0x06, 0x05, 0x06, 0x06, 0x06, 0x05, 0x06, 0x06, 0x06, 0x07, 0x09, 0x08, 0x06,
    0x07, 0x09, 0x07, 0x06, 0x06, 0x08, 0x0b, 0x08, 0x09, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x06, 0x08,
    0x0b, 0x0c, 0x0b, 0x0a, 0x0c, 0x09, 0x0a, 0x0a, 0x0a, 0xff, 0xdb, 0x00, 0x43, 0x01, 0x02, 0x02,
    0x02, 0x02, 0x02, 0x02, 0x05, 0x03, 0x03, 0x05, 0x0a, 0x07, 0x06, 0x07, 0x0a, 0x0a, 0x0a, 0x0a,
    0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a,
    0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a,
    0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0xff, 0xc0,
    0x00, 0x11, 0x08, 0x00, 0x08, 0x00, 0x10, 0x03, 0x01, 0x22, 0x00, 0x02, 0x11, 0x01, 0x03, 0x11,
    0x01, 0xff, 0xc4, 0x00, 0x1f, 0x00, 0x00, 0x01, 0x05, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09,
    0x0a, 0x0b, 0xff, 0xc4, 0x00, 0xb5, 0x10, 0x00, 0x02, 0x01, 0x03, 0x03, 0x02, 0x04, 0x03, 0x05,
    0x05, 0x04, 0x04, 0x00, 0x00, 0x01, 0x7d, 0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21,
    0x31, 0x41, 0x06, 0x13, 0x51, 0x61, 0x07, 0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xa1, 0x08, 0x23,
    0x42, 0xb1, 0xc1, 0x15, 0x52, 0xd1, 0xf0, 0x24, 0x33, 0x62, 0x72, 0x82, 0x09, 0x0a, 0x16, 0x17,
    0x18, 0x19, 0x1a, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a,
    0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a,
    0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a,
    0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99,
    0x9a, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7,
    0xb8, 0xb9, 0xba, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5,
    0xd6, 0xd7, 0xd8, 0xd9, 0xda, 0xe1, 0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf1,
    0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xff, 0xc4, 0x00, 0x1f, 0x01, 0x00, 0x03,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0xff, 0xc4, 0x00, 0xb5, 0x11, 0x00,
    0x02, 0x01, 0x02, 0x04, 0x04, 0x03, 0x04, 0x07, 0x05, 0x04, 0x04, 0x00, 0x01, 0x02, 0x77, 0x00,
    0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0x07, 0x61, 0x71, 0x13,
    0x22, 0x32, 0x81, 0x08, 0x14, 0x42, 0x91, 0xa1, 0xb1, 0xc1, 0x09, 0x23, 0x33, 0x52, 0xf0, 0x15,
    0x62, 0x72, 0xd1, 0x0a, 0x16, 0x24, 0x34, 0xe1, 0x25, 0xf1, 0x17, 0x18, 0x19, 0x1a, 0x26, 0x27,
    0x28, 0x29, 0x2a, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49,
    0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69,
    0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88,
    0x89, 0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6,
    0xa7, 0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xc2, 0xc3, 0xc4,
    0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9, 0xda, 0xe2,
    0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9,
    0xfa, 0xff, 0xda, 0x00, 0x0c, 0x03, 0x01, 0x00, 0x02, 0x11, 0x03, 0x11, 0x00, 0x3f, 0x00, 0xf9,
    0xde, 0x8a, 0x28, 0xae, 0x73, 0xfd, 0x30, 0x3f, 0xff, 0xd9};

static void test_decode(tally *t) {
    mgt_rgb img = {0};
    mgt_err e;
    CHECK(t, mgt_decode(png_3x2, sizeof png_3x2, &img, &e) == 0 && img.w == 3 && img.h == 2);
    const uint8_t want[18] = {255, 0,  0,  0,   255, 0,  0,   0,   255,
                              10,  20, 30, 200, 100, 50, 128, 128, 128};
    CHECK(t, img.px && !memcmp(img.px, want, sizeof want));
    CHECK(t, mgt_decode(jpeg_16x8, sizeof jpeg_16x8, &img, &e) == 0 && img.w == 16 && img.h == 8);
    int close = 1; /* Pillow decodes it to (201, 40, 90) with the same library */
    for (int i = 0; i < 16 * 8; i++)
        close &= img.px[3 * i] == 201 && img.px[3 * i + 1] == 40 && img.px[3 * i + 2] == 90;
    CHECK(t, close);
    CHECK_ERR(t, mgt_decode(jpeg_16x8, sizeof jpeg_16x8 - 5, &img, &e), &e, "truncated JPEG");
    CHECK_ERR(t, mgt_decode(png_3x2, 60, &img, &e), &e, "damaged PNG", "libpng");
    CHECK_ERR(t, mgt_decode(jpeg_16x8, 3, &img, &e), &e, "damaged JPEG");
    CHECK_ERR(t, mgt_decode((const uint8_t *)"hello, world\n", 13, &img, &e), &e,
              "not a JPEG or PNG image (it starts with 'hello, world.')");
    CHECK_ERR(t, mgt_decode((const uint8_t *)"GIF89a\1\0\1\0", 10, &img, &e), &e, "a GIF image",
              "mogrify");
    CHECK_ERR(t, mgt_decode((const uint8_t *)"RIFF\0\0\0\0WEBPVP8 ", 16, &img, &e), &e,
              "a WebP image");
    CHECK_ERR(t, mgt_decode((const uint8_t *)"", 0, &img, &e), &e, "an empty file");
    free(img.px);
}

/* A valid lossless JPEG (SOF3, predictor 1) of 8 x 8 grey 128: every difference is 0, coded
 * by a one-symbol Huffman table as one 0 bit; and a valid 12-bit extended JPEG (SOF1) of one
 * 8 x 8 block of 2048: DC difference 0 and an end of block, a 0 bit each. Hand-assembled. */
static const uint8_t jpeg_lossless[] = {
    0xff, 0xd8, 0xff, 0xc3, 0x00, 0x0b, 0x08, 0x00, 0x08, 0x00, 0x08, 0x01, 0x01, 0x11, 0x00,
    0xff, 0xc4, 0x00, 0x14, 0x00, 0x01, 0,    0,    0,    0,    0,    0,    0,    0,    0,
    0,    0,    0,    0,    0,    0,    0x00, 0xff, 0xda, 0x00, 0x08, 0x01, 0x01, 0x00, 0x01,
    0x00, 0x00, 0,    0,    0,    0,    0,    0,    0,    0,    0xff, 0xd9};

static uint8_t jpeg_12bit[256];

static size_t make_jpeg_12bit(void) {
    uint8_t *p = jpeg_12bit;
    const uint8_t head[] = {0xff, 0xd8, 0xff, 0xc1, 0x00, 0x0b, 12, 0x00, 0x08, 0x00, 0x08, 0x01,
                            0x01, 0x11, 0x00};
    memcpy(p, head, sizeof head);
    p += sizeof head;
    const uint8_t dqt[] = {0xff, 0xdb, 0x00, 0x83, 0x10};
    memcpy(p, dqt, sizeof dqt);
    p += sizeof dqt;
    for (int i = 0; i < 64; i++)
        *p++ = 0, *p++ = 1; /* 16-bit quantisation values of 1 */
    for (int tc = 0; tc < 2; tc++) { /* DC table 0, AC table 0: symbol 0 coded as '0' */
        const uint8_t dht[] = {0xff, 0xc4, 0x00, 0x14, (uint8_t)(tc << 4), 1};
        memcpy(p, dht, sizeof dht);
        p += sizeof dht;
        memset(p, 0, 15);
        p += 15;
        *p++ = 0x00;
    }
    const uint8_t sos[] = {0xff, 0xda, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3f, 0x00};
    memcpy(p, sos, sizeof sos);
    p += sizeof sos;
    *p++ = 0x3f; /* '0' (DC 0), '0' (EOB), six 1 bits of padding */
    *p++ = 0xff;
    *p++ = 0xd9;
    return (size_t)(p - jpeg_12bit);
}

/* A progressive JPEG of 16 x 16 from libjpeg, its header then made to claim w x h. */
static size_t make_bomb(uint8_t **out, int w, int h) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr jerr;
    c.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&c);
    unsigned long len = 0;
    *out = NULL;
    jpeg_mem_dest(&c, out, &len);
    c.image_width = c.image_height = 16;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    uint8_t row[16 * 3];
    for (int i = 0; i < 48; i++)
        row[i] = (uint8_t)(i * 5);
    while (c.next_scanline < 16) {
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    for (unsigned long i = 0; i + 9 < len; i++)
        if ((*out)[i] == 0xff && (*out)[i + 1] == 0xc2) { /* SOF2: length, precision, h, w */
            (*out)[i + 5] = (uint8_t)(h >> 8), (*out)[i + 6] = (uint8_t)h;
            (*out)[i + 7] = (uint8_t)(w >> 8), (*out)[i + 8] = (uint8_t)w;
            break;
        }
    return len;
}

static long max_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* What is checked before memory is taken: the header's size against the pixel limit, libjpeg's
 * own memory, the file's size and kind from its first bytes; and JPEGs libjpeg-turbo 2.1 does not
 * decode, refused as not supported rather than damaged. */
static void test_decode_limits(tally *t) {
    mgt_rgb img = {0};
    mgt_err e;
    uint8_t *bomb;
    size_t len = make_bomb(&bomb, 16, 16);
    CHECK(t, mgt_decode(bomb, len, &img, &e) == 0 && img.w == 16 && img.h == 16);
    free(bomb);
    len = make_bomb(&bomb, 65000, 65000);
    const long rss0 = max_rss_kib();
    const double t0 = mgt_now();
    CHECK_ERR(t, mgt_decode(bomb, len, &img, &e), &e, "65000 x 65000 pixels, more than the");
    const double secs = mgt_now() - t0;
    const long grew = max_rss_kib() - rss0;
    printf("decode: a %zu-byte progressive JPEG claiming 65000 x 65000 refused in %.1f ms, peak "
           "memory +%ld KiB\n",
           len, 1e3 * secs, grew);
    /* bounds far above the few microseconds and kilobytes it takes, far below a decode's
     * seconds and gigabytes */
    CHECK(t, secs < 0.5 && grew < 64 * 1024);
    free(bomb);
    CHECK_ERR(t, mgt_decode(jpeg_lossless, sizeof jpeg_lossless, &img, &e), &e,
              "a lossless JPEG: not supported", "convert it to PNG");
    const size_t n12 = make_jpeg_12bit();
    CHECK_ERR(t, mgt_decode(jpeg_12bit, n12, &img, &e), &e, "a 12-bit JPEG: not supported");
    CHECK(t, mgt_decode_sniff(jpeg_16x8, 16, (int64_t)2 << 30, &e) < 0 &&
                 strstr(e.msg, "a JPEG file of 2.0 GiB, more than the 1 GiB"));
    CHECK(t, mgt_decode_sniff(jpeg_16x8, 16, sizeof jpeg_16x8, &e) == 0);
    CHECK(t, mgt_decode_sniff(png_3x2, 16, sizeof png_3x2, &e) == 0);
    CHECK_ERR(t, mgt_decode_sniff((const uint8_t *)"GIF89a\1\0\1\0", 10, (int64_t)2 << 30, &e),
              &e, "a GIF image");
    free(img.px);
}

/* --val-split on an image set: a tree of 3 classes of 7, 4 and 10 tiny PNGs converted here, then
 * split: int(0.3 x each class) held out (2, 1, 3), the same rows for the same seed, other rows for
 * another, the two parts disjoint and whole, in the set's order, and gathered with their labels. */
static void test_val_split(tally *t) {
    char root[] = "/tmp/mgt-valsplit-XXXXXX", path[256];
    if (!mkdtemp(root)) {
        CHECK(t, 0);
        return;
    }
    const int per[3] = {7, 4, 10};
    for (int c = 0; c < 3; c++) {
        snprintf(path, sizeof path, "%s/src/c%d", root, c);
        char src[256];
        snprintf(src, sizeof src, "%s/src", root);
        mkdir(src, 0755);
        mkdir(path, 0755);
        for (int i = 0; i < per[c]; i++) {
            snprintf(path, sizeof path, "%s/src/c%d/%02d.png", root, c, i);
            FILE *f = fopen(path, "wb");
            fwrite(png_3x2, 1, sizeof png_3x2, f);
            fclose(f);
        }
    }
    char src[256], dst[256];
    snprintf(src, sizeof src, "%s/src", root);
    snprintf(dst, sizeof dst, "%s/set", root);
    mgt_convert_opts o = {.src = src, .dst = dst, .split = "train", .size = 8, .threads = 1,
                          .verbose = 0, .host = "test"};
    mgt_err e;
    CHECK(t, mgt_convert(&o, &e) == 0);
    const mgt_input_tf tf = {0};
    int64_t seen[2][21];
    for (int run = 0; run < 2; run++) {
        mgt_dataset ds, val;
        CHECK(t, mgt_dataset_load_images(&ds, dst, "train", 2, 2, 3, 3, &tf, &e) == 0);
        CHECK(t, mgt_images_val_split(&ds, 0.3, 7 + (uint64_t)run, &val, &e) == 0);
        CHECK(t, ds.n == 15 && val.n == 6);
        int held[3] = {0, 0, 0}, all[21] = {0};
        float x[6 * 2 * 2 * 3];
        int32_t labels[6];
        int64_t rows[6] = {0, 1, 2, 3, 4, 5};
        mgt_images_gather(&val, rows, 6, NULL, 0, 0, 0, x, labels);
        for (int i = 0; i < 6; i++) {
            const int64_t r = val.rows[i];
            CHECK(t, labels[i] == (r < 7 ? 0 : r < 11 ? 1 : 2)); /* the label of the row */
            held[labels[i]]++;
            all[r]++;
            CHECK(t, i == 0 || val.rows[i - 1] < r); /* in the set's order */
            seen[run][i] = r;
        }
        for (int64_t i = 0; i < ds.n; i++)
            all[ds.rows[i]]++;
        int whole = 1;
        for (int r = 0; r < 21; r++)
            whole &= all[r] == 1;
        CHECK(t, whole && held[0] == 2 && held[1] == 1 && held[2] == 3);
        mgt_dataset again, val2;
        CHECK(t, mgt_dataset_load_images(&again, dst, "train", 2, 2, 3, 3, &tf, &e) == 0);
        CHECK(t, mgt_images_val_split(&again, 0.3, 7 + (uint64_t)run, &val2, &e) == 0);
        CHECK(t, !memcmp(val2.rows, val.rows, sizeof(int64_t) * 6)); /* the same seed, the same */
        mgt_dataset_free(&again);
        mgt_dataset sl = mgt_dataset_slice(&val, 2, 3); /* a slice of a split keeps its rows */
        int32_t l3[3];
        mgt_images_gather(&sl, rows, 3, NULL, 0, 0, 0, x, l3);
        CHECK(t, sl.n == 3 && sl.rows[0] == val.rows[2] && l3[0] == labels[2] && l3[2] == labels[4]);
        mgt_dataset_free(&ds);
    }
    CHECK(t, memcmp(seen[0], seen[1], sizeof(int64_t) * 6) != 0); /* another seed, others */
    mgt_dataset ds, val;
    CHECK(t, mgt_dataset_load_images(&ds, dst, "train", 2, 2, 3, 3, &tf, &e) == 0);
    CHECK_ERR(t, mgt_images_val_split(&ds, 0.05, 1, &val, &e), &e, "holds out 0 of the 21 images");
    mgt_dataset_free(&ds);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(t, system(cmd) == 0);
}

int main(void) {
    tally t = {0, 0};
    test_resample(&t);
    test_pick(&t);
    test_pool(&t);
    test_decode(&t);
    test_decode_limits(&t);
    test_val_split(&t);
    printf("test_images: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
