/* repro.h: --reproducible, training whose every bit is the same on any number of ranks.
 *
 * Everything mgtrain decides about the data (the permutation, the global batch, dropout masks,
 * augmentation) is already independent of the rank count; what is not is the floating-point
 * order of the sums that cross samples: a rank sums the gradients of its own rows, the
 * all-reduce adds the ranks' sums in an order set by the world size, and so do the batchnorm
 * statistics and the loss. In this mode:
 *   - the global batch is cut into chunks of `chunk` samples at fixed positions (the last one
 *     holds the remainder), and each rank takes a run of whole chunks (shard.h:
 *     mgt_shard_chunks), so every chunk exists, whole, on exactly one rank whatever the world;
 *   - the graph executor (model.c) runs each layer chunk by chunk (layer after layer, each over
 *     all of the rank's chunks, a chunk being a step of its own: model.h's row0): its ops see
 *     the same shapes and the same dropout keys for a chunk wherever it runs, so a chunk's
 *     partial sums (parameter gradients, batchnorm sums, loss, correct answers) have the same
 *     bits on any rank; a tensor's gradient summed over its readers is summed per sample, so
 *     chunking leaves it alone;
 *   - the partials are added exactly into integer accumulators (exactsum.h), the accumulators
 *     are all-reduced as integers (exact and associative), and each sum is rounded to float32
 *     once: the same bits on any world size. With gradient accumulation the chunks of all of the
 *     step's micro-batches go into the same accumulators: still one reduction and one rounding.
 * The optimizer then sees the same gradient sums on every world size, and the run is the same
 * bit for bit. This holds on one machine type: another CPU's BLAS kernels give other bits.
 *
 * Which layers: those whose ops treat samples independently run chunk by chunk unchanged;
 * batchnorm (which must be synchronised here: per-rank statistics depend on the rank count)
 * sums its statistics and gradients through mgt_repro_bn_*. Layer types not listed in repro.c
 * are refused, so a new layer type cannot silently break the guarantee.
 *
 * With the rest of training (checked by mgt_repro_check, refused with a message otherwise):
 * gradient clipping works on the rounded gradient, the same on every rank; schedules depend on
 * the step alone; the stop vote of a signal is the third exact sum, so every rank stops at the
 * same step; a checkpoint resumes on any rank count, bit for bit. Refused: ZeRO-1 (each rank
 * would update its slice from the exact sums, but the reduce-to-owners transport carries
 * floats), and whatever acts on validation figures (early stopping, the plateau schedule,
 * restore_best_weights), which are computed as in the default mode and may differ in the last
 * bits between rank counts. */
#ifndef MGT_REPRO_H
#define MGT_REPRO_H

#include <stdint.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "util.h"

/* The default chunk: 8 samples keep the BLAS calls of a dense layer or a convolution's filter
 * gradient (a product over the chunk's rows) efficient, while the remainder of a global batch
 * stays small; fewer, larger chunks cost less per step but allow fewer ranks (one chunk is
 * the least a busy rank does). */
enum { MGT_REPRO_CHUNK_DEFAULT = 8 };

typedef struct mgt_repro mgt_repro;

/* What a run asks of the mode (mgt_repro_check). */
typedef struct mgt_repro_opts {
    int64_t chunk;   /* samples per chunk */
    int64_t batch;   /* the global batch (of a micro-batch) */
    int accum_steps; /* micro-batches per optimizer step */
    int zero;        /* ZeRO-1 asked for: refused */
    /* A training setting that acts on validation figures, named for the message (e.g. "early
     * stopping (early_stop_patience)"): refused. NULL: none. */
    const char *validation_decider;
} mgt_repro_opts;

/* Whether --reproducible can train this model on this backend with these settings: the backend,
 * what the run asks for besides, the chunk count of a step, the layers and batchnorm's sync; an
 * error that every rank meets alike (-1 with err). */
int mgt_repro_check(const mgt_model *m, const mgt_backend *be, const mgt_repro_opts *o,
                    mgt_err *err);

/* The state of the mode for one training run in chunks of `chunk` samples (after
 * mgt_model_alloc); NULL with err when memory cannot be had. */
mgt_repro *mgt_repro_create(mgt_model *m, mgt_comm *comm, int64_t chunk, mgt_err *err);
void mgt_repro_free(mgt_repro *r);
/* One line for the start-up block: the chunks of a global batch of `batch` and the exact
 * all-reduce's size. */
void mgt_repro_describe(const mgt_repro *r, int64_t batch, char *buf, size_t n);

/* The chunked forward, and the loss + backward of one micro-batch (s->repro set, s->row0 0):
 * the executor's layer passes (model.h: mgt_model_layer_forward, _loss, _layer_backward) on
 * each chunk. Backward leaves the parameter gradients and the loss and accuracy sums in the
 * integer accumulators (not yet in m->g and m->sums); first: the step's first micro-batch,
 * which starts them from zero. */
float *mgt_repro_forward(mgt_model *m, const mgt_step *s);
void mgt_repro_backward(mgt_model *m, const mgt_step *s, int first);

/* Collective: the step's one all-reduce in this mode: the accumulators of every rank (with each
 * rank's stop vote, m->sums[2]) are added as integers and rounded once into m->g (gradient
 * sums) and m->sums (loss, correct, stop votes). Ends the job on every rank alike if a value
 * could not be summed (exactsum.h: |g| >= 2^64, inf, NaN); step names the step in that
 * message. */
void mgt_repro_allreduce(mgt_repro *r, int64_t step);

/* Batchnorm's global sums (collective): sum[0 .. c) and sum[c .. 2c) = the sums of x and x^2
 * over every rank's rows, per channel, from per-chunk partials of bn_stats. hw = rows per
 * sample. */
void mgt_repro_bn_stats(const mgt_step *s, int hw, int c, const float *x, float *sum);
/* Batchnorm's backward sums (collective): for each chunk, bn_bwd_reduce's dgamma and dbeta of
 * the pass p (its rows the step's: its x, residual, output and dy are cut into the chunks' rows
 * here) go into the parameter gradients' accumulators, and their global sums into out[0 .. c)
 * (dgamma) and out[c .. 2c) (dbeta). dgamma and dbeta are the layer's slices of m->g (used as
 * scratch). */
void mgt_repro_bn_grads(const mgt_step *s, int hw, const mgt_bn_pass *p, const float *dy,
                        float *dgamma, float *dbeta, float *out);

#endif
