/* generate.h: `mgtrain generate`: text (or token ids) sampled from a language model, one token at
 * a time, with a key/value cache.
 *
 * The model runs position by position on one sequence: each layer computes the one new row of
 * its output from the new rows of its inputs (a dense layer one product, a layer norm one row),
 * and each [attention] layer keeps the keys and values of every position so far (its cache,
 * [context][C] each), so that the new position's query attends to them without recomputing the
 * positions before it (backend.h: attn_decode). The prompt's tokens go in first; from its last,
 * each step's logits give the next token: divided by the temperature, cut to the top_k largest,
 * softmax, and drawn with the counter-based RNG keyed by the seed (temperature 0: the largest).
 * When the context is full, the last half of the tokens is kept and run through again (the model
 * has no positions beyond its context).
 *
 * A byte-level model (vocab 256) takes the prompt's bytes and writes the text; another takes and
 * writes token ids, separated by spaces or commas. */
#ifndef MGT_GENERATE_H
#define MGT_GENERATE_H

#include <stdint.h>
#include <stdio.h>

#include "model.h"
#include "util.h"

typedef struct mgt_generate_opts {
    const char *prompt; /* bytes, or token ids for another vocabulary */
    int64_t max_new;    /* tokens to generate */
    double temperature; /* 0: the most likely token */
    int top_k;          /* 0: every token */
    uint64_t seed;
} mgt_generate_opts;

/* Writes the prompt and the tokens generated after it to out. m: allocated (batch 1 or more)
 * with its weights. -1 with err on a model or prompt it cannot take. */
int mgt_generate(mgt_model *m, const mgt_generate_opts *o, FILE *out, mgt_err *err);

#endif
