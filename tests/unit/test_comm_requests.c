/* test_comm_requests.c: the transports' asynchronous requests (comm.h): MPI's in both progress
 * modes (tests between "layers", and the progress thread), and shared memory's (comm_shm.c).
 * Run alone it is a world of one with the transports forced on (c.always); tests/cli/pipeline.sh
 * runs it on 2, 3 and 4 ranks.
 *
 * Every rank's addends are a pure function of (rank, element), so each rank knows them all,
 * their float sum in rank order F = ((x0 + x1) + x2) + ..., and the exact sum S and the sum of
 * magnitudes T of every element (in double). Values span ten orders of magnitude with both
 * signs, so that a change of summation order shows. Checks:
 *   - ALLREDUCE in buckets (started one after another, tested in between, waited for in order)
 *     equals F bit for bit on any number of ranks (both transports sum in rank order whatever the
 *     buckets, so they agree bit for bit), and is within the error bound of a sum of W addends,
 *     |R - S| <= g(W-1) T (Higham, Accuracy and Stability, (4.4); g(n) = n u / (1 - n u),
 *     u = 2^-24), and so within 2 g(W-1) T of the one-shot blocking MPI_Allreduce; on 2 ranks
 *     those two are equal bit for bit (a + b = b + a exactly). Whether they agree bit for bit on
 *     more ranks is printed: that is the MPI library's choice of order;
 *   - REDUCE_OWNERS leaves each owner's part equal to F bit for bit and every part this rank does
 *     not own exactly as it was;
 *   - the same when every other rank starts the buckets in the reverse order and each rank waits
 *     for them in an order of its own;
 *   - GATHER_OWNERS gives every rank each owner's values exactly, started in another order on
 *     odd ranks;
 *   - empty ranges, a range inside one owner, a range across all of them. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "reducer.h"
#include "tally.h"
#include "util.h"

enum { N = 100003 };

static float addend(int rank, size_t i) {
    const uint64_t key = mgt_key3(7, (uint64_t)rank, 0x5245445543ULL /* "REDUC" */);
    const float mag = powf(10.0f, 10.0f * mgt_uniform(key, 2 * i) - 5.0f);
    return mgt_uniform(key, 2 * i + 1) < 0.5f ? -mag : mag;
}

static double gamma_n(int n) {
    const double u = ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}

typedef struct expect {
    double *sum, *abs; /* exact sum and sum of magnitudes of every element */
    int world;
} expect;

/* The addends' float sum in rank order. */
static float rank_order(int world, size_t i) {
    float v = addend(0, i);
    for (int r = 1; r < world; r++)
        v += addend(r, i);
    return v;
}

static int within(const expect *x, size_t i, float r, double factor) {
    return fabs((double)r - x->sum[i]) <= factor * gamma_n(x->world - 1) * x->abs[i];
}

static void fill(float *b, int rank) {
    for (size_t i = 0; i < N; i++)
        b[i] = addend(rank, i);
}

/* Bucket boundaries from the end of the buffer down, as the reducer makes them. */
static const size_t cuts[] = {N, 99000, 70001, 70000, 40000, 1234, 0};
enum { NB = sizeof cuts / sizeof cuts[0] - 1 };

/* b: the buffer the requests work on (N floats; the transport's shared memory for shm). */
static void run(tally *t, mgt_comm *c, const expect *x, const char *mode, float *b) {
    float *one = malloc(sizeof(float) * N);
    CHECK(t, one && b);
    /* The one-shot reference. */
    fill(one, c->rank);
    MPI_Allreduce(MPI_IN_PLACE, one, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

    /* ALLREDUCE in buckets, started in backward's order with test calls between them. */
    fill(b, c->rank);
    for (int k = 0; k < NB; k++) {
        mgt_comm_start(c, k, MGT_COLL_ALLREDUCE, b, cuts[k + 1], cuts[k] - cuts[k + 1]);
        for (int j = 0; j <= k; j++)
            (void)mgt_comm_test(c, j);
    }
    for (int k = 0; k < NB; k++)
        mgt_comm_wait(c, k, "test buckets");
    int bound_ok = 1, same = 1, ordered = 1;
    for (size_t i = 0; i < N; i++) {
        bound_ok &= within(x, i, b[i], 1.0) &&
                    fabsf(b[i] - one[i]) <= 2.0 * gamma_n(x->world - 1) * x->abs[i];
        same &= b[i] == one[i];
        ordered &= b[i] == rank_order(x->world, i);
    }
    CHECK(t, bound_ok);
    CHECK(t, ordered);
    if (x->world <= 2)
        CHECK(t, same); /* two addends: one order */
    printf("%s: %d buckets against one MPI_Allreduce on %d ranks: %s\n", mode, NB, x->world,
           same ? "bit for bit equal" : "within the bound, not bit for bit");

    /* The same buckets started in another order on every other rank (the reverse), and waited
     * for in another order again: requests never match another slot's messages, so the sums
     * are the same (a rank's update takes the buckets as they arrive, in its own order). */
    fill(b, c->rank);
    for (int j = 0; j < NB; j++) {
        const int k = c->rank % 2 ? NB - 1 - j : j;
        mgt_comm_start(c, k, MGT_COLL_ALLREDUCE, b, cuts[k + 1], cuts[k] - cuts[k + 1]);
        (void)mgt_comm_test(c, k);
    }
    for (int j = 0; j < NB; j++)
        mgt_comm_wait(c, (j + c->rank) % NB, "test buckets in any order");
    int any_order = 1;
    for (size_t i = 0; i < N; i++)
        any_order &= b[i] == rank_order(x->world, i);
    CHECK(t, any_order);

    /* REDUCE_OWNERS over the same buckets: owners get the sums, the rest stays. */
    fill(b, c->rank);
    for (int k = 0; k < NB; k++)
        mgt_comm_start(c, k, MGT_COLL_REDUCE_OWNERS, b, cuts[k + 1], cuts[k] - cuts[k + 1]);
    for (int k = NB - 1; k >= 0; k--) /* any order of waits */
        mgt_comm_wait(c, k, "test reduce to owners");
    size_t lo = c->owners[c->rank], hi = c->owners[c->rank + 1];
    int owned_ok = 1, rest_ok = 1, owned_same = 1;
    for (size_t i = 0; i < N; i++) {
        if (i >= lo && i < hi) {
            owned_ok &= within(x, i, b[i], 1.0) && b[i] == rank_order(x->world, i);
            owned_same &= b[i] == one[i];
        } else {
            rest_ok &= b[i] == addend(c->rank, i);
        }
    }
    CHECK(t, owned_ok);
    CHECK(t, rest_ok);
    if (x->world <= 2)
        CHECK(t, owned_same);
    printf("%s: reduce to owners against MPI_Allreduce: %s\n", mode,
           owned_same ? "bit for bit equal" : "within the bound, not bit for bit");

    /* GATHER_OWNERS: each owner's values everywhere; a range within one owner, one across all,
     * and an empty one, started in another order on odd ranks. */
    for (size_t i = 0; i < N; i++)
        b[i] = i >= lo && i < hi ? (float)i * 0.5f + 0.25f : NAN;
    for (int j = 0; j < 3; j++) {
        const int k = c->rank % 2 ? 2 - j : j;
        const size_t at = k == 0 ? 0 : N / 2, n = k == 0 ? N / 2 : k == 1 ? 0 : N - N / 2;
        mgt_comm_start(c, k, MGT_COLL_GATHER_OWNERS, b, at, n);
    }
    for (int k = 0; k < 3; k++)
        mgt_comm_wait(c, k, "test gather");
    int gather_ok = 1;
    for (size_t i = 0; i < N; i++)
        gather_ok &= b[i] == (float)i * 0.5f + 0.25f;
    CHECK(t, gather_ok);
    /* A range inside the last rank's slice only. */
    for (size_t i = 0; i < N; i++)
        b[i] = (int)(i >= lo && i < hi) ? 3.0f : -1.0f;
    const size_t last = c->owners[c->world - 1];
    mgt_comm_start(c, 0, MGT_COLL_REDUCE_OWNERS, b, last + 1, N - last - 1);
    mgt_comm_wait(c, 0, "test reduce within one owner");
    int one_ok = 1;
    for (size_t i = last + 1; i < N; i++)
        one_ok &= b[i] == (c->rank == c->world - 1 ? 3.0f + -1.0f * (float)(c->world - 1) : -1.0f);
    CHECK(t, one_ok);
    free(one);
}

int main(int argc, char **argv) {
    tally t = {0, 0};
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    int world = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    expect x = {malloc(sizeof(double) * N), malloc(sizeof(double) * N), world};
    CHECK(&t, x.sum && x.abs);
    for (size_t i = 0; i < N; i++) {
        x.sum[i] = x.abs[i] = 0;
        for (int r = 0; r < world; r++) {
            x.sum[i] += addend(r, i);
            x.abs[i] += fabs(addend(r, i));
        }
    }
    size_t *owners = malloc(sizeof(size_t) * (size_t)(world + 1));
    CHECK(&t, owners != NULL);
    for (int r = 0; r < world; r++) {
        size_t n;
        mgt_comm_slice(N, r, world, &owners[r], &n);
    }
    owners[world] = N;
    /* The MPI transport in both progress modes, then the shared-memory one; twice each, so that
     * reserving more slots after a first use is covered too. */
    const char *modes[] = {"mpi, test", "mpi, thread", "shm"};
    for (int m = 0; m < 3; m++) {
        mgt_comm c;
        mgt_err e;
        if (m < 2) {
            mgt_comm_init_mpi(&c, MPI_COMM_WORLD, 60);
        } else {
            const int rc = mgt_comm_init_shm(&c, MPI_COMM_WORLD, 60, &e);
            CHECK(&t, rc == 0);
            if (rc < 0) {
                printf("shm: %s\n", e.msg);
                mgt_comm_destroy(&c);
                continue;
            }
        }
        c.always = 1; /* a world of one runs the requests too */
        mgt_comm_set_owners(&c, owners);
        CHECK(&t, mgt_comm_reserve(&c, 2, &e) == 0);
        CHECK(&t, mgt_comm_reserve(&c, NB, &e) == 0);
        CHECK(&t,
              mgt_comm_set_progress(&c, m == 1 ? MGT_PROGRESS_THREAD : MGT_PROGRESS_TEST, &e) == 0);
        float *b = mgt_comm_shares(&c) ? mgt_comm_share(&c, sizeof(float) * N, &e)
                                       : malloc(sizeof(float) * N);
        for (int rep = 0; rep < 2; rep++)
            run(&t, &c, &x, modes[m], b);
        if (!mgt_comm_shares(&c))
            free(b);
        mgt_comm_destroy(&c);
    }
    int fails = t.fail;
    MPI_Allreduce(MPI_IN_PLACE, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_comm_requests on %d rank(s): %d checks passed, %d failed (all ranks)\n", world,
               t.pass, fails);
    free(x.sum);
    free(x.abs);
    free(owners);
    MPI_Finalize();
    return fails ? 1 : 0;
}
