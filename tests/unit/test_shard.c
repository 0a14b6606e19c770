/* test_shard.c: the data sharding index math (src/data/shard.c), no MPI needed.
 *
 * For several (n, batch, world), including a last batch smaller than the world size: every
 * sample is read exactly once per epoch across all steps and ranks, a rank's part is contiguous
 * and follows the previous rank's, sizes differ by at most one, and the ranks' parts in rank
 * order are exactly the global batch (so the sample order does not depend on the world size).
 * The permutation is a permutation, is reproducible for (seed, epoch), changes with the epoch and
 * the seed, and puts a given sample at each position about equally often. --reproducible's split
 * into whole chunks: check_chunks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/shard.h"

#include "tally.h"


static int is_permutation(const int64_t *p, int64_t n) {
    char *seen = calloc((size_t)n + 1, 1);
    int ok = seen != NULL;
    for (int64_t i = 0; ok && i < n; i++) {
        ok = p[i] >= 0 && p[i] < n && !seen[p[i]];
        if (ok)
            seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

/* One (n, B, W) configuration over two epochs. */
static void check_config(tally *t, int64_t n, int64_t B, int W, uint64_t seed) {
    int64_t *perm = malloc((size_t)n * sizeof *perm);
    int64_t *order = malloc((size_t)n * sizeof *order); /* ranks' parts, concatenated */
    int *hits = malloc((size_t)n * sizeof *hits);
    if (!perm || !order || !hits) {
        CHECK(t, !"out of memory");
        goto out;
    }
    for (int64_t epoch = 0; epoch < 2; epoch++) {
        mgt_shard_permutation(seed, epoch, n, perm);
        CHECK(t, is_permutation(perm, n));
        memset(hits, 0, (size_t)n * sizeof *hits);
        const int64_t steps = mgt_shard_steps(n, B);
        CHECK(t, steps == (n + B - 1) / B);
        int64_t done = 0, k = 0;
        int ok_contig = 1, ok_sizes = 1, ok_batch = 1;
        for (int64_t s = 0; s < steps; s++) {
            const int64_t b = mgt_shard_batch_size(n, B, s);
            ok_batch &= b == (s < steps - 1 ? B : n - (steps - 1) * B) && b > 0;
            int64_t next = 0, minc = b, maxc = 0;
            for (int r = 0; r < W; r++) {
                const mgt_range rg = mgt_shard_range(b, r, W);
                ok_contig &= rg.first == next && rg.count >= 0;
                next = rg.first + rg.count;
                if (rg.count < minc)
                    minc = rg.count;
                if (rg.count > maxc)
                    maxc = rg.count;
                for (int64_t i = 0; i < rg.count; i++) {
                    const int64_t sample = perm[s * B + rg.first + i];
                    hits[sample]++;
                    order[k++] = sample;
                }
            }
            ok_contig &= next == b;
            ok_sizes &= maxc - minc <= 1;
            done += b;
        }
        CHECK(t, ok_batch);
        CHECK(t, ok_contig);
        CHECK(t, ok_sizes);
        CHECK(t, done == n && k == n);
        CHECK(t, mgt_shard_batch_size(n, B, steps) == 0);
        int once = 1;
        for (int64_t i = 0; i < n; i++)
            once &= hits[i] == 1;
        CHECK(t, once);
        /* The ranks' parts in rank order are the global batch order: world-size independent. */
        CHECK(t, memcmp(order, perm, (size_t)n * sizeof *perm) == 0);
    }
out:
    free(perm);
    free(order);
    free(hits);
}

/* --reproducible's split (mgt_shard_chunks): for batches of 1..100 on 1..6 ranks with chunks of
 * 1, 3 and 8, the ranks' parts follow each other and make up the batch, every part starts on a
 * chunk boundary and ends on one or at the batch's end, and none exceeds mgt_shard_chunks_max
 * of the full batch. */
static void check_chunks(tally *t) {
    const int64_t chunks[] = {1, 3, 8};
    int ok_contig = 1, ok_bounds = 1, ok_max = 1;
    for (int ci = 0; ci < 3; ci++)
        for (int W = 1; W <= 6; W++)
            for (int64_t full = 1; full <= 100; full++) {
                const int64_t c = chunks[ci], most = mgt_shard_chunks_max(full, c, W);
                for (int64_t b = 1; b <= full; b++) { /* the full batch, or a shorter last one */
                    int64_t next = 0;
                    for (int r = 0; r < W; r++) {
                        const mgt_range rg = mgt_shard_chunks(b, c, r, W);
                        ok_contig &= rg.first == next && rg.count >= 0;
                        ok_bounds &=
                            rg.first % c == 0 && (rg.count == 0 || (rg.first + rg.count) % c == 0 ||
                                                  rg.first + rg.count == b);
                        ok_max &= rg.count <= most;
                        next = rg.first + rg.count;
                    }
                    ok_contig &= next == b;
                }
            }
    CHECK(t, ok_contig);
    CHECK(t, ok_bounds);
    CHECK(t, ok_max);
    /* 37 in chunks of 8 (the last of 5) on 4 ranks: chunks [0,1) [1,2) [2,3) [3,5) */
    const mgt_range r3 = mgt_shard_chunks(37, 8, 3, 4);
    CHECK(t, r3.first == 24 && r3.count == 13);
    CHECK(t, mgt_shard_chunks_max(37, 8, 4) == 16);
    /* more ranks than chunks: some ranks get nothing (here the one chunk goes to rank 3) */
    CHECK(t, mgt_shard_chunks(3, 8, 3, 4).count == 3 && mgt_shard_chunks(3, 8, 0, 4).count == 0);
}

int main(void) {
    tally T = {0, 0}, *t = &T;
    check_chunks(t);

    /* Basic arithmetic. */
    CHECK(t, mgt_shard_steps(60000, 256) == 235);
    CHECK(t, mgt_shard_batch_size(60000, 256, 0) == 256);
    CHECK(t, mgt_shard_batch_size(60000, 256, 234) == 60000 - 234 * 256);
    CHECK(t, mgt_shard_batch_size(60000, 256, 235) == 0);
    CHECK(t, mgt_shard_steps(0, 256) == 0);
    CHECK(t, mgt_shard_steps(256, 256) == 1);
    CHECK(t, mgt_shard_steps(257, 256) == 2);
    mgt_range r = mgt_shard_range(256, 0, 3);
    CHECK(t, r.first == 0 && r.count == 86);
    r = mgt_shard_range(256, 1, 3);
    CHECK(t, r.first == 86 && r.count == 85);
    r = mgt_shard_range(256, 2, 3);
    CHECK(t, r.first == 171 && r.count == 85);
    r = mgt_shard_range(1, 2, 3); /* fewer items than ranks: empty, positioned at the end */
    CHECK(t, r.first == 1 && r.count == 0);
    r = mgt_shard_range(1, 0, 3);
    CHECK(t, r.first == 0 && r.count == 1);
    r = mgt_shard_range(10, 3, 3); /* a rank outside the world gets nothing */
    CHECK(t, r.count == 0);

    /* Coverage and layout for several configurations. */
    static const struct {
        int64_t n, B;
        int W;
    } cfg[] = {
        {60000, 256, 3},            /* Fashion-MNIST, 3 ranks: last batch 96 */
        {1000, 100, 3},             /* B not divisible by W */
        {1001, 100, 3},             /* last batch of 1 sample, smaller than W */
        {1002, 100, 4},             /* last batch of 2, smaller than W */
        {10, 4, 4},      {7, 7, 8}, /* batch smaller than the world */
        {1, 1, 1},       {5, 2, 1}, {97, 10, 7},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        check_config(t, cfg[i].n, cfg[i].B, cfg[i].W, 1234 + i);

    /* Reproducible, epoch- and seed-dependent. */
    enum { N = 60000 };
    int64_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    if (!a || !b) {
        CHECK(t, !"out of memory");
        return 1;
    }
    mgt_shard_permutation(42, 3, N, a);
    mgt_shard_permutation(42, 3, N, b);
    CHECK(t, memcmp(a, b, N * sizeof *a) == 0);
    mgt_shard_permutation(42, 4, N, b);
    CHECK(t, memcmp(a, b, N * sizeof *a) != 0);
    mgt_shard_permutation(43, 3, N, b);
    CHECK(t, memcmp(a, b, N * sizeof *a) != 0);
    int64_t fixed = 0;
    for (int64_t i = 0; i < N; i++)
        fixed += a[i] == i;
    CHECK(t, fixed < 20); /* a random permutation has about 1 fixed point */

    /* Uniformity: where sample 0 lands over many epochs (n = 10): each position ~1/10. */
    enum { EPOCHS = 20000, SMALL = 10 };
    int count[SMALL] = {0};
    for (int64_t e = 0; e < EPOCHS; e++) {
        int64_t p[SMALL];
        mgt_shard_permutation(7, e, SMALL, p);
        for (int i = 0; i < SMALL; i++)
            if (p[i] == 0)
                count[i]++;
    }
    int uniform = 1;
    for (int i = 0; i < SMALL; i++) /* expected 2000, sd ~42: allow 6 sd */
        uniform &= count[i] > 2000 - 250 && count[i] < 2000 + 250;
    CHECK(t, uniform);
    free(a);
    free(b);

    printf("test_shard: %d checks passed", T.pass);
    if (T.fail)
        printf(", %d FAILED", T.fail);
    printf("\n");
    return T.fail ? 1 : 0;
}
