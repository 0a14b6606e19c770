/* test_npy_augment.c: training augmentation (src/data/augment.c) and the loader that applies it
 * (src/data/loader.c).
 *
 *  - The transform against an independent reference (pad with zeros, crop, then mirror, done the
 *    long way on a padded copy) for many draws, shapes (h != w, several channels) and paddings,
 *    the padding wider than the image included.
 *  - The draws: the identity when off, flips only or offsets only when only one is on, flips
 *    about half the time and every offset pair (dy, dx) about equally often (bounds of 6 standard
 *    deviations of a binomial count: a false failure has odds below 1e-8), a function of (seed,
 *    epoch, row) that changes with the epoch and the seed.
 *  - The loader: with augmentation off its batches are exactly the plain gather; with it on they
 *    are the plain gather transformed sample by sample (labels untouched), they differ from it,
 *    and the global batch (ranks' parts concatenated) is bit for bit the same for 1, 2 and 3
 *    ranks, with and without the loader thread, over several epochs and a batch that does not
 *    divide by the rank count. A resumed epoch (first_step > 0) sees the same batches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shard.h"
#include "tally.h"

/* The reference: an (h + 2p) x (w + 2p) zero-padded copy, the h x w window at (p + dy, p + dx),
 * mirrored left-right if d->flip. */
static void reference(const mgt_augment_draw *d, int pad, int h, int w, int c, const float *src,
                      float *dst) {
    const int ph = h + 2 * pad, pw = w + 2 * pad;
    float *padded = calloc((size_t)ph * (size_t)pw * (size_t)c, sizeof(float));
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++)
                padded[((size_t)(y + pad) * (size_t)pw + (size_t)(x + pad)) * (size_t)c +
                       (size_t)k] =
                    src[((size_t)y * (size_t)w + (size_t)x) * (size_t)c + (size_t)k];
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            const int cx = d->flip ? w - 1 - x : x; /* the cropped image's column */
            for (int k = 0; k < c; k++)
                dst[((size_t)y * (size_t)w + (size_t)x) * (size_t)c + (size_t)k] =
                    padded[((size_t)(y + pad + d->dy) * (size_t)pw + (size_t)(cx + pad + d->dx)) *
                               (size_t)c +
                           (size_t)k];
        }
    free(padded);
}

static void test_transform(tally *t) {
    const int shapes[][3] = {{8, 8, 3}, {5, 7, 2}, {1, 6, 1}, {6, 1, 4}, {3, 3, 1}};
    const int pads[] = {1, 2, 4, 9};
    int all = 1, some_changed = 0, tried = 0;
    for (int s = 0; s < 5; s++) {
        const int h = shapes[s][0], w = shapes[s][1], c = shapes[s][2], e = h * w * c;
        float *src = malloc(sizeof(float) * (size_t)e), *got = malloc(sizeof(float) * (size_t)e),
              *want = malloc(sizeof(float) * (size_t)e);
        for (int i = 0; i < e; i++)
            src[i] = 1.0f + (float)i; /* all distinct and non-zero, so padding shows */
        for (int p = 0; p < 4; p++)
            for (int flip = 0; flip < 2; flip++) {
                const mgt_augment a = {.flip = flip, .crop = pads[p]};
                for (int64_t row = 0; row < 200; row++) {
                    const mgt_augment_draw d = mgt_augment_pick(&a, 7, 3, row);
                    mgt_augment_apply(&d, h, w, c, src, got);
                    reference(&d, pads[p], h, w, c, src, want);
                    all &= memcmp(got, want, sizeof(float) * (size_t)e) == 0;
                    some_changed |= memcmp(got, src, sizeof(float) * (size_t)e) != 0;
                    tried++;
                }
            }
        free(src);
        free(got);
        free(want);
    }
    CHECK(t, all);
    CHECK(t, some_changed && tried == 5 * 4 * 2 * 200);
}

static void test_draws(tally *t) {
    const mgt_augment off = {.flip = 0}, flip = {.flip = 1}, crop = {.crop = 4},
                      both = {.flip = 1, .crop = 4};
    enum { ROWS = 40000, P = 4, S = 2 * P + 1 };
    int ident = 1, flip_only = 1, crop_only = 1, in_range = 1;
    long flips = 0, cells[S][S] = {{0}}, epoch_diff = 0, seed_diff = 0;
    for (int64_t r = 0; r < ROWS; r++) {
        const mgt_augment_draw d0 = mgt_augment_pick(&off, 1, 0, r);
        ident &= !d0.flip && !d0.dy && !d0.dx;
        const mgt_augment_draw d1 = mgt_augment_pick(&flip, 1, 0, r);
        flip_only &= !d1.dy && !d1.dx;
        const mgt_augment_draw d2 = mgt_augment_pick(&crop, 1, 0, r);
        crop_only &= !d2.flip;
        const mgt_augment_draw d = mgt_augment_pick(&both, 1, 0, r);
        in_range &= d.dy >= -P && d.dy <= P && d.dx >= -P && d.dx <= P;
        if (!in_range)
            break;
        flips += d.flip;
        cells[d.dy + P][d.dx + P]++;
        /* The same row in another epoch, or under another seed: a fresh draw. */
        const mgt_augment_draw e = mgt_augment_pick(&both, 1, 1, r);
        const mgt_augment_draw g = mgt_augment_pick(&both, 2, 0, r);
        epoch_diff += e.flip != d.flip || e.dy != d.dy || e.dx != d.dx;
        seed_diff += g.flip != d.flip || g.dy != d.dy || g.dx != d.dx;
    }
    CHECK(t, ident && flip_only && crop_only && in_range);
    /* Binomial counts: flips ~ (ROWS, 1/2), sd 100; a cell ~ (ROWS, 1/81): mean 494, sd 22. */
    CHECK(t, fabs((double)flips - ROWS / 2.0) < 6 * sqrt(ROWS * 0.25));
    const double pc = 1.0 / (S * S), mean = ROWS * pc, sd = sqrt(ROWS * pc * (1 - pc));
    int cells_ok = 1;
    for (int i = 0; i < S; i++)
        for (int j = 0; j < S; j++)
            cells_ok &= fabs((double)cells[i][j] - mean) < 6 * sd;
    CHECK(t, cells_ok);
    /* Two independent draws agree with probability 1/162: about 250 of 40000. */
    CHECK(t, epoch_diff > ROWS * 0.98 && seed_diff > ROWS * 0.98);
    /* Pure function: the same arguments, the same draw. */
    const mgt_augment_draw a = mgt_augment_pick(&both, 9, 4, 12345),
                           b = mgt_augment_pick(&both, 9, 4, 12345);
    CHECK(t, a.flip == b.flip && a.dy == b.dy && a.dx == b.dx);
}

/* ---- the loader ----------------------------------------------------------------------------- */

enum { NS = 61, HH = 6, WW = 5, CC = 3, EE = HH * WW * CC, BATCH = 16, EPOCHS = 3 };

/* The global batches of `epochs` epochs as `world` ranks' loaders produce them, concatenated in
 * rank order: x[epoch][position in epoch][EE], labels alike. */
static int run_loaders(const mgt_dataset *ds, const mgt_augment *aug, int world, int threaded,
                       float *x, int32_t *labels, int64_t *rows) {
    mgt_ops ops;
    memset(&ops, 0, sizeof ops); /* host buffers from malloc */
    mgt_backend be = {.ops = &ops, .impl = NULL};
    const int64_t steps = mgt_shard_steps(NS, BATCH);
    const int max_local = (BATCH + world - 1) / world;
    for (int r = 0; r < world; r++) {
        mgt_err err;
        mgt_loader *l =
            mgt_loader_create(&be, ds, 42, BATCH, r, world, max_local, threaded, 0, &err);
        if (!l || mgt_loader_augment(l, aug, &err) < 0) {
            fprintf(stderr, "loader: %s\n", err.msg);
            return -1;
        }
        for (int e = 0; e < EPOCHS; e++) {
            mgt_loader_begin_epoch(l, e, 0);
            for (int64_t s = 0; s < steps; s++) {
                const mgt_batch *b = mgt_loader_next(l);
                const int64_t at = (int64_t)e * NS + s * BATCH + b->first;
                memcpy(x + at * EE, b->x, sizeof(float) * EE * (size_t)b->n);
                memcpy(labels + at, b->labels, sizeof(int32_t) * (size_t)b->n);
                memcpy(rows + at, b->ids, sizeof(int64_t) * (size_t)b->n);
            }
        }
        /* A resumed epoch: from step 2 of epoch 1, the same batches as before. */
        mgt_loader_begin_epoch(l, 1, 2);
        const mgt_batch *b = mgt_loader_next(l);
        const int64_t at = (int64_t)1 * NS + 2 * BATCH + b->first;
        const int same =
            b->step == 2 && memcmp(x + at * EE, b->x, sizeof(float) * EE * (size_t)b->n) == 0;
        mgt_loader_destroy(l);
        if (!same)
            return -2;
    }
    return 0;
}

static void test_loader(tally *t) {
    /* A byte dataset in memory, as IDX or a uint8 .npy set gives one. */
    uint8_t *px = malloc(NS * EE);
    uint8_t lb[NS];
    for (int i = 0; i < NS * EE; i++)
        px[i] = (uint8_t)(1 + (i * 131 + i / 7) % 255); /* never 0: padding is visible */
    for (int i = 0; i < NS; i++)
        lb[i] = (uint8_t)(i % 10);
    mgt_dataset ds;
    memset(&ds, 0, sizeof ds);
    ds.n = NS;
    ds.h = HH;
    ds.w = WW;
    ds.c = CC;
    ds.classes = 10;
    ds.pixels = px;
    ds.labels = lb;

    const size_t total = (size_t)EPOCHS * NS;
    float *x[4], *plain = malloc(sizeof(float) * total * EE);
    int32_t *l[4];
    int64_t *rows[4];
    for (int k = 0; k < 4; k++) {
        x[k] = malloc(sizeof(float) * total * EE);
        l[k] = malloc(sizeof(int32_t) * total);
        rows[k] = malloc(sizeof(int64_t) * total);
    }
    const mgt_augment off = {.flip = 0}, on = {.flip = 1, .crop = 2};

    /* Off: exactly the plain gather of the epoch's rows. */
    CHECK(t, run_loaders(&ds, &off, 1, 1, x[0], l[0], rows[0]) == 0);
    int32_t lab[1];
    int exact = 1;
    for (size_t i = 0; i < total; i++) {
        mgt_dataset_gather(&ds, &rows[0][i], 1, plain + i * EE, lab);
        exact &= lab[0] == l[0][i];
    }
    CHECK(t, exact && memcmp(plain, x[0], sizeof(float) * total * EE) == 0);

    /* On: 1, 2 and 3 ranks, threaded or not, give the same global batches. */
    const int worlds[4] = {1, 2, 3, 3}, threads[4] = {1, 1, 0, 1};
    for (int k = 0; k < 4; k++)
        CHECK(t, run_loaders(&ds, &on, worlds[k], threads[k], x[k], l[k], rows[k]) == 0);
    for (int k = 1; k < 4; k++) {
        CHECK(t, memcmp(rows[k], rows[0], sizeof(int64_t) * total) == 0);
        CHECK(t, memcmp(l[k], l[0], sizeof(int32_t) * total) == 0);
        CHECK(t, memcmp(x[k], x[0], sizeof(float) * total * EE) == 0);
    }
    /* ... each sample the plain one transformed by its own (seed, epoch, row) draw, labels as
     * they were; and most samples changed. */
    int each = 1;
    size_t changed = 0;
    float want[EE];
    for (size_t i = 0; i < total; i++) {
        const int64_t epoch = (int64_t)(i / NS);
        const mgt_augment_draw d = mgt_augment_pick(&on, 42, epoch, rows[0][i]);
        mgt_augment_apply(&d, HH, WW, CC, plain + i * EE, want);
        each &= memcmp(want, x[0] + i * EE, sizeof want) == 0;
        changed += memcmp(plain + i * EE, x[0] + i * EE, sizeof want) != 0;
    }
    CHECK(t, each);
    CHECK(t, memcmp(l[0], l[1], sizeof(int32_t) * total) == 0);
    /* Unchanged only for the identity draw: no flip and offset (0, 0), 1/50 of samples. */
    CHECK(t, changed > total * 9 / 10);
    printf("  augmentation changed %zu of %zu samples (1/50 draw the identity)\n", changed, total);

    for (int k = 0; k < 4; k++) {
        free(x[k]);
        free(l[k]);
        free(rows[k]);
    }
    free(plain);
    free(px);
}

/* A loader that hands out rows only (batches made on a device) cannot augment. */
static void test_ids_only(tally *t) {
    mgt_ops ops;
    memset(&ops, 0, sizeof ops);
    mgt_backend be = {.ops = &ops, .impl = NULL};
    mgt_dataset ds;
    mgt_dataset_synthetic(&ds, 10, 2, 2, 1, 2, 1, 1);
    mgt_err err;
    mgt_loader *l = mgt_loader_create(&be, &ds, 1, 4, 0, 1, 4, 0, 1, &err);
    CHECK(t, l != NULL);
    if (!l)
        return;
    const mgt_augment on = {.flip = 1}, off = {.flip = 0};
    CHECK(t, mgt_loader_augment(l, &off, &err) == 0);
    CHECK_ERR(t, mgt_loader_augment(l, &on, &err), &err,
              "augmentation needs batches gathered on the host");
    mgt_loader_destroy(l);
}

int main(void) {
    tally T = {0, 0}, *t = &T;
    test_transform(t);
    test_draws(t);
    test_loader(t);
    test_ids_only(t);
    printf("test_npy_augment: %d checks passed", T.pass);
    if (T.fail)
        printf(", %d FAILED", T.fail);
    printf("\n");
    return T.fail ? 1 : 0;
}
