/* text.h: `mgtrain convert --text SRC DST`: text files into byte-level token shards (vocabulary
 * 256, one token a byte), for training a language model without a tokenizer.
 *
 * SRC is a text file, or a folder whose regular files are read in name order (files holding a
 * NUL byte are binary, not text, and are left out and named; a file reached by two names, a link
 * beside its target, is read once). Each file's last val_fraction of
 * bytes, from the start of a line, go to the validation split, the rest to the training split, so
 * that both see every file; the splits are written to DST/train.bin and DST/val.bin as llm.c
 * shards (tokens.h), each atomically. DST is made if needed; a shard already there is not
 * replaced. */
#ifndef MGT_TEXT_H
#define MGT_TEXT_H

#include <stdint.h>

#include "../util.h"

typedef struct mgt_text_opts {
    const char *src, *dst;
    double val_fraction; /* of each file's bytes, in [0, 0.5] */
    int verbose;
} mgt_text_opts;

/* What was written: the files read and left out (binary; second names of a file), and each
 * split's tokens. */
typedef struct mgt_text_result {
    int files, skipped, links;
    int64_t train_tokens, val_tokens;
} mgt_text_result;

int mgt_text_convert(const mgt_text_opts *o, mgt_text_result *r, mgt_err *err);

#endif
