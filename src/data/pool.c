/* pool.c: threads sharing a job's items (see pool.h).
 *
 * Protocol, under one mutex: run() publishes the job (fn, ctx, n), resets the item counter and
 * bumps the generation; each worker that sees a new generation takes items until none are left,
 * then counts itself done. The caller takes items too, then waits until every worker has counted
 * itself done for this generation (so none still runs fn when run returns). Items are handed out
 * under the mutex: a per-sample item takes hundreds of microseconds, so the lock costs nothing
 * measurable, and every item runs exactly once. */
#include "pool.h"

#include <pthread.h>
#include <stdlib.h>

enum { POOL_MAX = 256 };

struct mgt_pool {
    int workers;
    pthread_t th[POOL_MAX];
    pthread_mutex_t mu, run_mu; /* run_mu: one job at a time */
    pthread_cond_t go, done;
    uint64_t gen;
    int stop, active; /* workers still on the current job */
    int64_t next, n;
    void (*fn)(void *, int64_t, int);
    void *ctx;
};

typedef struct {
    mgt_pool *p;
    int k;
} worker_arg;

/* Items of the current job until none are left (called with the mutex held; returns with it). */
static void take_items(mgt_pool *p, int k) {
    while (p->next < p->n) {
        const int64_t i = p->next++;
        void (*fn)(void *, int64_t, int) = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, i, k);
        pthread_mutex_lock(&p->mu);
    }
}

static void *worker(void *arg) {
    mgt_pool *p = ((worker_arg *)arg)->p;
    const int k = ((worker_arg *)arg)->k;
    free(arg);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        take_items(p, k);
        if (--p->active == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

mgt_pool *mgt_pool_create(int threads) {
    mgt_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    const int want = threads < 1 ? 0 : threads - 1 > POOL_MAX ? POOL_MAX : threads - 1;
    for (int i = 0; i < want; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a)
            break;
        a->p = p;
        a->k = i + 1;
        if (pthread_create(&p->th[i], NULL, worker, a) != 0) {
            free(a);
            break;
        }
        p->workers++;
    }
    return p;
}

int mgt_pool_size(const mgt_pool *p) {
    return p ? 1 + p->workers : 1;
}

void mgt_pool_run(mgt_pool *p, int64_t n, void (*fn)(void *ctx, int64_t i, int k), void *ctx) {
    if (!p) {
        for (int64_t i = 0; i < n; i++)
            fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->run_mu); /* thread 0's memory is the caller's: one caller at a time */
    if (p->workers == 0 || n <= 1) {
        for (int64_t i = 0; i < n; i++)
            fn(ctx, i, 0);
        pthread_mutex_unlock(&p->run_mu);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->next = 0;
    p->active = p->workers;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    take_items(p, 0);
    while (p->active > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}

void mgt_pool_destroy(mgt_pool *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->workers; i++)
        pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p);
}
