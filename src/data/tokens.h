/* tokens.h: token sets, the data of language models (dataset.h: a sample is a window of the
 * token stream, its input T tokens and its labels the T tokens after each).
 *
 * A folder of token shards: files NAME.bin whose name holds "train" (the training split) or
 * "val" (the test split), each read whole in name order. Two formats, told apart by their first
 * four bytes:
 *   - llm.c's shards: a header of 256 little-endian int32 (magic 20240520, version 1 for uint16
 *     tokens or 2 for uint32, the token count), then the tokens;
 *   - nanoGPT's train.bin / val.bin: uint16 tokens and nothing else.
 * The files are memory-mapped, so a set larger than memory trains (the pages a batch touches are
 * read then); every token is checked against the model's vocabulary once, when the set is
 * opened.
 *
 * Windows: a shard of N tokens holds floor((N - 1) / T) samples, sample w the tokens
 * w T .. w T + T (T + 1 of them: the input is the first T, the labels the last T), so the
 * windows of a shard share only their boundary tokens and cover it once an epoch. The samples of
 * all shards are numbered in order, and which ones a step reads is the image sets' index math
 * (shard.h: a permutation of (seed, epoch), each rank's part of each global batch), so the
 * batches do not depend on the rank count.
 *
 * Synthetic tokens (--data synthetic for a token model): a stream whose token at position p is
 * drawn from (seed, split, p), T tokens a sample: speed and memory runs without a corpus. */
#ifndef MGT_TOKENS_H
#define MGT_TOKENS_H

#include <stdint.h>

#include "dataset.h"

/* llm.c's header: 256 int32, magic, version, token count. */
#define MGT_TOKENS_MAGIC 20240520
#define MGT_TOKENS_HEADER 256

/* 1 when DIR holds token shards of either split (a .bin file named with train or val). */
int mgt_tokens_dir(const char *dir);
/* 1 when DIR holds shards of the split (test = 0: train, 1: val). */
int mgt_tokens_has_split(const char *dir, int test);
/* The shards of one split of DIR as a dataset of windows of `context` + 1 tokens, each token
 * checked to be below vocab (errors name the file and the token's place). */
int mgt_dataset_load_tokens(mgt_dataset *ds, const char *dir, int test, int context, int vocab,
                            mgt_err *err);
/* n synthetic windows of `context` + 1 tokens below vocab (split_salt tells the splits apart). */
int mgt_dataset_synthetic_tokens(mgt_dataset *ds, int64_t n, int context, int vocab, uint64_t seed,
                                 uint64_t split_salt, mgt_err *err);
/* Samples idx[0 .. count) (rows of this view, ds->first added) into x (count * T token ids as
 * float32) and labels (count * T). */
void mgt_tokens_gather(const mgt_dataset *ds, const int64_t *idx, int count, float *x,
                       int32_t *labels);
/* A description for the start-up block ("2 shards, 2,517,324 tokens (llm.c, uint16)"). */
const char *mgt_tokens_describe(const mgt_dataset *ds, char *buf, size_t n);
void mgt_tokens_free(mgt_tokens *t);

/* llm.c's shard of n tokens into path, atomically (tensor_io.h's writer): the header, then the
 * tokens as uint16 (every token below 65536). */
int mgt_tokens_write(const char *path, const uint16_t *tok, int64_t n, mgt_err *err);

#endif
