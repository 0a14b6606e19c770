/* pool.h: a pool of threads that share the items of one job, for the data pipeline's per-sample
 * work (decoding, cropping, resizing), which must not run on the compute backend's own lanes.
 *
 * mgt_pool_run hands out items 0 .. n-1 one at a time, in order, to the calling thread and the
 * pool's workers, and returns once every item is done; worker k of the pool (0: the caller) may
 * keep per-thread memory indexed by k. Jobs are serialised: a second caller waits for the
 * first's job to end. What an item computes must not depend on which thread runs it. */
#ifndef MGT_POOL_H
#define MGT_POOL_H

#include <stdint.h>

typedef struct mgt_pool mgt_pool;

/* A pool of `threads` threads in all (the caller of run counts as one): threads - 1 workers.
 * Returns NULL when memory cannot be had; fewer workers start when threads cannot. */
mgt_pool *mgt_pool_create(int threads);
/* The threads that run items (1 + the workers that started). */
int mgt_pool_size(const mgt_pool *p);
/* Runs fn(ctx, i, k) for i in [0, n), k the running thread's index (< mgt_pool_size). p NULL:
 * every item on the calling thread, as k = 0, with no exclusion. */
void mgt_pool_run(mgt_pool *p, int64_t n, void (*fn)(void *ctx, int64_t i, int k), void *ctx);
void mgt_pool_destroy(mgt_pool *p);

#endif
