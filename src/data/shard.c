/* shard.c: which samples each rank reads at each step (see shard.h).
 *
 * Pure index math: the epoch's permutation depends only on (seed, epoch), the batch boundaries on
 * (n, B), and a rank's part of a batch on (batch size, rank, world). Every rank can therefore
 * compute the same permutation on its own, without communication, and the concatenation of all
 * ranks' parts in rank order is the global batch whatever the world size. */
#include "shard.h"

#include "../util.h"

#define SHARD_PURPOSE 0x5348554646ULL /* "SHUFF" */

__extension__ typedef unsigned __int128 u128; /* GCC/Clang; __extension__ keeps -pedantic quiet */

int64_t mgt_shard_steps(int64_t n, int64_t batch) {
    if (n <= 0 || batch <= 0)
        return 0;
    return (n + batch - 1) / batch;
}

int64_t mgt_shard_batch_size(int64_t n, int64_t batch, int64_t step) {
    if (n <= 0 || batch <= 0 || step < 0)
        return 0;
    int64_t left = n - step * batch;
    if (left <= 0)
        return 0;
    return left < batch ? left : batch;
}

mgt_range mgt_shard_range(int64_t total, int rank, int world) {
    mgt_range r = {0, 0};
    if (total <= 0 || world <= 0 || rank < 0 || rank >= world)
        return r;
    /* The first total % world ranks take one extra item, so sizes differ by at most one. */
    const int64_t base = total / world, rem = total % world;
    r.first = rank * base + (rank < rem ? rank : rem);
    r.count = base + (rank < rem ? 1 : 0);
    return r;
}

mgt_range mgt_shard_chunks(int64_t total, int64_t chunk, int rank, int world) {
    mgt_range r = {0, 0};
    if (total <= 0 || chunk <= 0 || world <= 0 || rank < 0 || rank >= world)
        return r;
    const int64_t chunks = (total + chunk - 1) / chunk;
    const int64_t lo = chunks * rank / world, hi = chunks * (rank + 1) / world;
    const int64_t end = hi * chunk < total ? hi * chunk : total;
    r.first = lo * chunk < total ? lo * chunk : total;
    r.count = end - r.first;
    return r;
}

int64_t mgt_shard_chunks_max(int64_t total, int64_t chunk, int world) {
    if (total <= 0 || chunk <= 0 || world <= 0)
        return 0;
    const int64_t chunks = (total + chunk - 1) / chunk, most = (chunks + world - 1) / world;
    return most * chunk < total ? most * chunk : total;
}

void mgt_shard_permutation(uint64_t seed, int64_t epoch, int64_t n, int64_t *perm) {
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    const uint64_t key = mgt_key3(seed, SHARD_PURPOSE, (uint64_t)epoch);
    /* Fisher-Yates from the top: j uniform in [0, i] from the high half of the 128-bit product
     * r * (i + 1), whose bias (at most (i + 1) / 2^64) is far below anything measurable. */
    for (int64_t i = n - 1; i > 0; i--) {
        const uint64_t r = mgt_rand64(key, (uint64_t)i);
        const int64_t j = (int64_t)(((u128)r * (uint64_t)(i + 1)) >> 64);
        const int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}
