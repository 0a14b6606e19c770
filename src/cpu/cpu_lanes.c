/* cpu_lanes.c: the CPU backend's worker threads for the passes that split their work in lanes
 * (Winograd, the element-wise, BatchNorm and pooling passes, the optimizer's update, and the
 * split GEMMs of cpu_gemm.c), and the ranges such a pass cuts in parts. Started once, with the backend; a pass hands them a
 * function and waits for them, so no op starts a thread or allocates a stack inside the step
 * loop.
 *
 * Protocol: run() publishes (fn, ctx, want), then bumps the generation; worker i runs lane i + 1
 * if that lane is wanted, then counts itself done. The calling thread runs lane 0 and waits for
 * the count. If a worker could not be started, the caller runs its lane too.
 *
 * Hand-offs spin before they sleep. A step of a small model hands work to the lanes a dozen times
 * or more (the MLP's: each GEMM, each bucket's update), and waking a thread that sleeps on a
 * condition variable costs tens of microseconds on a virtual machine (the host must schedule the
 * idle vCPU again), as much as the part it is woken for. So a worker that finished its part
 * watches the generation for SPIN_NS before it sleeps, and the caller watches the done count as
 * long before it sleeps, as OpenMP's threads do (GOMP_SPINCOUNT) under PyTorch and TensorFlow.
 * Sleepers are counted, so a hand-off to spinning workers takes no lock and no system call, and
 * one to sleeping workers wakes them as before. Lanes are at most the cores a rank was given,
 * so a spinning worker holds a core nobody in the job wanted; and the spin is bounded, so
 * between steps and after training the workers sleep.
 *
 * OpenBLAS runs on one thread: the backend sets it so when it starts, and while lanes run it is
 * held there whatever a caller has set since. The lanes are the parallelism; a GEMM a lane calls
 * must not start OpenBLAS's own threads on the same cores. Which GEMMs would is up to the
 * kernel OpenBLAS picks for the CPU: its SkylakeX / Cooperlake kernels take a single-threaded
 * small-matrix path up to 10^6 multiply-adds, but the Haswell and Zen kernels that AMD EPYCs
 * get have no such path, and OpenBLAS 0.3.21 threads any GEMM past 2.6 x 10^5 multiply-adds.
 * Two lanes then each ran every GEMM on two OpenBLAS threads, which serialise on OpenBLAS's lock
 * and spin on each other's cores: with the Haswell kernel the seed ConvNet's step (batch 128,
 * two lanes) took 3.8 times the CPU time it takes with one OpenBLAS thread per lane
 * (bench/layer_times.c, on a 2-core AMD EPYC). */
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_internal.h"

enum { LANES_MAX = 64, GEN_STEP = 128 };

/* How long a hand-off is watched before its thread sleeps (see the top): longer than the gaps
 * inside a step. In the MLP's step (batch 256, 2 lanes) a worker waits up to 0.1-0.3 ms between
 * its parts (the caller's single-lane passes, the loss, a part of the caller's that runs longer);
 * with 0.1 ms it slept about 3 times a step, and each wake took some 90 us on a 2-core VM, which
 * the caller waited for in a pair or took over in a split. With 0.4 ms it sleeps only between
 * steps that leave it idle that long, and the MLP trained 5% faster (medians of 12 interleaved
 * runs; 2 ms gave the same). */
#define SPIN_NS 400000

struct mgt_cpu_lanes {
    int n, workers; /* lanes; worker threads started (lanes 1..workers) */
    pthread_t th[LANES_MAX];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    /* The generation: run()'s count times GEN_STEP plus the lanes it wants, one word so that a
     * worker reads both at once (a worker left out of one run must not read the next run's
     * count). Bumped once per run(), after fn and ctx are set. */
    atomic_uint_fast64_t gen;
    atomic_int stop;
    atomic_int pending;       /* workers still running the current generation's lanes */
    atomic_int sleepers;      /* workers waiting on `go` (or about to) */
    atomic_int caller_asleep; /* the caller waits on `done` (or is about to) */
    void (*fn)(void *ctx, int lane);
    void *ctx;
};

typedef struct {
    mgt_cpu_lanes *l;
    int lane;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Spins until the generation moves past `seen` (1) or SPIN_NS pass (0). */
static int spin_for_gen(mgt_cpu_lanes *l, uint64_t seen) {
    const uint64_t t0 = now_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load(&l->gen) != seen || atomic_load(&l->stop))
            return 1;
        cpu_relax();
        if (i % 64 == 0 && now_ns() - t0 > SPIN_NS)
            return 0;
    }
}

static void *worker(void *p) {
    mgt_cpu_lanes *l = ((worker_arg *)p)->l;
    const int lane = ((worker_arg *)p)->lane;
    free(p);
    uint64_t seen = 0;
    for (;;) {
        if (!spin_for_gen(l, seen)) {
            /* Counted as a sleeper before the last look at the generation: run() bumps the
             * generation before it counts the sleepers, so one of the two sees the other. */
            pthread_mutex_lock(&l->mu);
            atomic_fetch_add(&l->sleepers, 1);
            while (!atomic_load(&l->stop) && atomic_load(&l->gen) == seen)
                pthread_cond_wait(&l->go, &l->mu);
            atomic_fetch_sub(&l->sleepers, 1);
            pthread_mutex_unlock(&l->mu);
        }
        if (atomic_load(&l->stop))
            break;
        seen = atomic_load(&l->gen);
        if (lane >= (int)(seen % GEN_STEP)) /* not wanted this time */
            continue;
        l->fn(l->ctx, lane);
        if (atomic_fetch_sub(&l->pending, 1) == 1 && atomic_load(&l->caller_asleep)) {
            pthread_mutex_lock(&l->mu);
            pthread_cond_signal(&l->done);
            pthread_mutex_unlock(&l->mu);
        }
    }
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
    atomic_init(&l->gen, 0);
    atomic_init(&l->stop, 0);
    atomic_init(&l->pending, 0);
    atomic_init(&l->sleepers, 0);
    atomic_init(&l->caller_asleep, 0);
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

/* Waits until every worker of this run is done: spins, then sleeps on `done`. */
static void wait_done(mgt_cpu_lanes *l) {
    const uint64_t t0 = now_ns();
    for (unsigned i = 1; atomic_load(&l->pending) > 0; i++) {
        cpu_relax();
        if (i % 64 == 0 && now_ns() - t0 > SPIN_NS) {
            pthread_mutex_lock(&l->mu);
            atomic_store(&l->caller_asleep, 1); /* before the last look, as for the workers */
            while (atomic_load(&l->pending) > 0)
                pthread_cond_wait(&l->done, &l->mu);
            atomic_store(&l->caller_asleep, 0);
            pthread_mutex_unlock(&l->mu);
            return;
        }
    }
}

void mgt_cpu_lanes_run(mgt_cpu_lanes *l, int lanes, void (*fn)(void *ctx, int lane), void *ctx) {
    if (lanes < 1)
        lanes = 1;
    const int threaded = l ? (lanes - 1 < l->workers ? lanes - 1 : l->workers) : 0;
    /* one OpenBLAS thread per lane (see the top of the file), a lone lane too: which kernel
     * OpenBLAS takes for a GEMM can depend on its thread count, and results must not depend on
     * how many lanes ran */
    const int blas = openblas_get_num_threads();
    if (blas > 1)
        openblas_set_num_threads(1);
    if (threaded > 0) {
        l->fn = fn;
        l->ctx = ctx;
        atomic_store(&l->pending, threaded);
        const uint64_t g = atomic_load(&l->gen) / GEN_STEP + 1;
        atomic_store(&l->gen, g * GEN_STEP + (uint64_t)(threaded + 1)); /* publishes the rest */
        if (atomic_load(&l->sleepers) > 0) {
            pthread_mutex_lock(&l->mu);
            pthread_cond_broadcast(&l->go);
            pthread_mutex_unlock(&l->mu);
        }
    }
    fn(ctx, 0);
    for (int lane = threaded + 1; lane < lanes; lane++) /* lanes no worker runs */
        fn(ctx, lane);
    if (threaded > 0)
        wait_done(l);
    if (blas > 1)
        openblas_set_num_threads(blas);
}

void mgt_cpu_lanes_destroy(mgt_cpu_lanes *l) {
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    atomic_store(&l->stop, 1);
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
    SPLIT_ALIGN = MGT_CPU_SPLIT_ALIGN,
};

typedef struct {
    void (*fn)(void *ctx, size_t lo, size_t hi);
    void *ctx;
    size_t n, parts;
    atomic_size_t next;
} split_job;

/* Where part k of a split_job starts: the SPLIT_ALIGN-item units of [0, n) shared out evenly
 * (the shares differ by one unit at most, the last taking the remainder of n), so that two lanes
 * sharing four parts get within a unit of each other; fixed by n and the part count alone. */
static size_t part_start(const split_job *j, size_t k) {
    const size_t units = (j->n + SPLIT_ALIGN - 1) / SPLIT_ALIGN;
    const size_t lo = k * units / j->parts * SPLIT_ALIGN;
    return k >= j->parts || lo > j->n ? j->n : lo;
}

static void split_lane(void *p, int lane) {
    (void)lane;
    split_job *j = p;
    for (;;) {
        const size_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->parts)
            return;
        const size_t lo = part_start(j, k), hi = part_start(j, k + 1);
        if (hi > lo)
            j->fn(j->ctx, lo, hi);
    }
}

void mgt_cpu_lanes_parts(mgt_cpu_lanes *l, size_t n, size_t parts,
                         void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx) {
    const int lanes = mgt_cpu_lanes_count(l);
    split_job j = {.fn = fn, .ctx = ctx, .n = n, .parts = parts < 1 ? 1 : parts};
    atomic_init(&j.next, 0);
    mgt_cpu_lanes_run(l, (size_t)lanes < j.parts ? lanes : (int)j.parts, split_lane, &j);
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
    if (lanes < 2 || parts < 2) { /* no BLAS in these passes: straight on the calling thread */
        fn(ctx, 0, n);
        return;
    }
    mgt_cpu_lanes_parts(l, n, parts, fn, ctx);
}
