/* shard.h: which samples a rank reads at each step. Pure index math, no MPI, no I/O, so the
 * same (seed, epoch, step, rank, world) gives the same answer everywhere and tests need no MPI.
 *
 * An epoch is a permutation of the n samples, a function of (seed, epoch) only. Step s of the
 * epoch uses the global batch perm[s*B, min((s+1)*B, n)) (the last, shorter batch is kept).
 * Within a global batch of b samples, rank r of W takes the contiguous part
 * [r*(b/W) + min(r, b%W), ...) of b/W or b/W + 1 samples: sizes differ by at most one. */
#ifndef MGT_SHARD_H
#define MGT_SHARD_H

#include <stdint.h>

typedef struct mgt_range {
    int64_t first, count;
} mgt_range;

/* Steps in an epoch of n samples with global batch B: ceil(n / B). */
int64_t mgt_shard_steps(int64_t n, int64_t batch);
/* Samples in global batch `step`: B, or what is left for the last one. */
int64_t mgt_shard_batch_size(int64_t n, int64_t batch, int64_t step);
/* Rank r's part of `total` items split over `world` ranks. */
mgt_range mgt_shard_range(int64_t total, int rank, int world);
/* Rank r's part of a global batch of `total` items cut into chunks of `chunk` (the last one
 * shorter when chunk does not divide total) for --reproducible (repro.h): rank r takes the
 * whole chunks [r*C/world, (r+1)*C/world) of the C chunks, so its part starts and ends on chunk
 * boundaries whatever the world size. With more ranks than chunks some ranks get none. */
mgt_range mgt_shard_chunks(int64_t total, int64_t chunk, int rank, int world);
/* The most items mgt_shard_chunks gives one rank from a global batch of `total` (or any
 * shorter one). */
int64_t mgt_shard_chunks_max(int64_t total, int64_t chunk, int world);
/* Writes the epoch's permutation of [0, n) into perm (Fisher-Yates driven by mgt_rand64 keyed by
 * (seed, epoch)). */
void mgt_shard_permutation(uint64_t seed, int64_t epoch, int64_t n, int64_t *perm);

#endif
