/* cpu_lanes.c: the CPU backend's worker threads for the passes that split their work in lanes
 * (Winograd, and the element-wise, BatchNorm and pooling passes). Started once, with the
 * backend; a pass hands them a function and waits for them, so no op starts a thread or
 * allocates a stack inside the step loop.
 *
 * Protocol, under one mutex: run() publishes (fn, ctx, lanes), bumps the generation and wakes
 * the workers; worker i runs lane i + 1 if that lane is wanted, then counts itself done. The
 * calling thread runs lane 0. If a worker could not be started, the caller runs its lane too.
 *
 * While lanes run, OpenBLAS is held at one thread. The lanes are the parallelism: a GEMM a lane
 * calls must not start OpenBLAS's own threads on the same cores. Which GEMMs would is up to the
 * kernel OpenBLAS picks for the CPU: its SkylakeX / Cooperlake kernels take a single-threaded
 * small-matrix path up to 10^6 multiply-adds (Winograd's chunks are sized for it), but the
 * Haswell and Zen kernels that AMD EPYCs get have no such path, and OpenBLAS 0.3.21 threads any
 * GEMM past 2.6 x 10^5 multiply-adds. Two lanes then each ran every GEMM on two OpenBLAS threads,
 * which serialise on OpenBLAS's lock and spin on each other's cores: with the Haswell kernel the
 * seed ConvNet's step (batch 128, two lanes) took 3.8 times the CPU time it takes with one
 * OpenBLAS thread per lane (bench/layer_times.c, on a 2-core AMD EPYC). */
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_internal.h"

enum { LANES_MAX = 64 };

struct mgt_cpu_lanes {
    int n, workers; /* lanes; worker threads started (lanes 1..workers) */
    pthread_t th[LANES_MAX];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int stop, pending, want;
    void (*fn)(void *ctx, int lane);
    void *ctx;
};

typedef struct {
    mgt_cpu_lanes *l;
    int lane;
} worker_arg;

static void *worker(void *p) {
    mgt_cpu_lanes *l = ((worker_arg *)p)->l;
    const int lane = ((worker_arg *)p)->lane;
    free(p);
    uint64_t seen = 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->gen == seen)
            pthread_cond_wait(&l->go, &l->mu);
        if (l->stop)
            break;
        seen = l->gen;
        if (lane >= l->want)
            continue;
        void (*fn)(void *, int) = l->fn;
        void *ctx = l->ctx;
        pthread_mutex_unlock(&l->mu);
        fn(ctx, lane);
        pthread_mutex_lock(&l->mu);
        if (--l->pending == 0)
            pthread_cond_signal(&l->done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

mgt_cpu_lanes *mgt_cpu_lanes_create(int n) {
    mgt_cpu_lanes *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->n = n < 1 ? 1 : n > LANES_MAX ? LANES_MAX : n;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->go, NULL);
    pthread_cond_init(&l->done, NULL);
    for (int i = 1; i < l->n; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a)
            break;
        *a = (worker_arg){l, i};
        if (pthread_create(&l->th[i], NULL, worker, a) != 0) {
            free(a);
            break;
        }
        l->workers = i;
    }
    return l;
}

int mgt_cpu_lanes_count(const mgt_cpu_lanes *l) {
    return l ? l->n : 1;
}

void mgt_cpu_lanes_run(mgt_cpu_lanes *l, int lanes, void (*fn)(void *ctx, int lane), void *ctx) {
    if (lanes < 1)
        lanes = 1;
    const int threaded = l ? (lanes - 1 < l->workers ? lanes - 1 : l->workers) : 0;
    /* one OpenBLAS thread per lane (see the top of the file); a lone lane keeps the setting */
    const int blas = threaded > 0 ? openblas_get_num_threads() : 1;
    if (blas > 1)
        openblas_set_num_threads(1);
    if (threaded > 0) {
        pthread_mutex_lock(&l->mu);
        l->fn = fn;
        l->ctx = ctx;
        l->want = threaded + 1;
        l->pending = threaded;
        l->gen++;
        pthread_cond_broadcast(&l->go);
        pthread_mutex_unlock(&l->mu);
    }
    fn(ctx, 0);
    for (int lane = threaded + 1; lane < lanes; lane++) /* lanes no worker runs */
        fn(ctx, lane);
    if (threaded > 0) {
        pthread_mutex_lock(&l->mu);
        while (l->pending > 0)
            pthread_cond_wait(&l->done, &l->mu);
        pthread_mutex_unlock(&l->mu);
    }
    if (blas > 1)
        openblas_set_num_threads(blas);
}

void mgt_cpu_lanes_destroy(mgt_cpu_lanes *l) {
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->go);
    pthread_mutex_unlock(&l->mu);
    for (int i = 1; i <= l->workers; i++)
        pthread_join(l->th[i], NULL);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->go);
    pthread_cond_destroy(&l->done);
    free(l);
}

/* ---- ranges split in parts ------------------------------------------------------------------ */

enum {
    SPLIT_PARTS_PER_LANE = 4, /* parts a lane may take: a late or slowed lane leaves less behind */
    SPLIT_ALIGN = 16,         /* part boundaries at multiples of 16 items (64 bytes of floats) */
};

typedef struct {
    void (*fn)(void *ctx, size_t lo, size_t hi);
    void *ctx;
    size_t n, part, parts;
    atomic_size_t next;
} split_job;

static void split_lane(void *p, int lane) {
    (void)lane;
    split_job *j = p;
    for (;;) {
        const size_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->parts)
            return;
        const size_t lo = k * j->part, hi = lo + j->part < j->n ? lo + j->part : j->n;
        j->fn(j->ctx, lo, hi);
    }
}

void mgt_cpu_lanes_for(mgt_cpu_lanes *l, size_t n, size_t min_part,
                       void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx) {
    if (n == 0)
        return;
    const int lanes = mgt_cpu_lanes_count(l);
    if (min_part < 1)
        min_part = 1;
    size_t parts = (size_t)lanes * SPLIT_PARTS_PER_LANE;
    if (parts > n / min_part)
        parts = n / min_part;
    if (lanes < 2 || parts < 2) {
        fn(ctx, 0, n);
        return;
    }
    size_t part = (n + parts - 1) / parts;
    part = (part + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN;
    split_job j = {.fn = fn, .ctx = ctx, .n = n, .part = part, .parts = (n + part - 1) / part};
    atomic_init(&j.next, 0);
    mgt_cpu_lanes_run(l, lanes, split_lane, &j);
}
