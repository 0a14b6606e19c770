/* trainer.h: the commands train, eval, predict, summary and convert, run from the options main.c
 * parses for them (options.h).
 *
 * Every rank holds a full replica. For each step the global batch (the model's batch_size) is the
 * next slice of the epoch's permutation; each rank reads only its contiguous part, sums its
 * per-sample gradients, and ONE all-reduce (which also carries the step's loss and accuracy sums)
 * adds them up; the update divides by the global batch. So N ranks compute what one process would
 * on the whole batch. Only rank 0 prints and writes files. The commands only wire the modules
 * that do this (trainer.c names them). */
#ifndef MGT_TRAINER_H
#define MGT_TRAINER_H

#include "options.h"
#include "runtime.h"

/* Each returns the process exit status; errors end the job through mgt_die / mgt_die_all. */
int mgt_cmd_train(mgt_runtime *rt, const mgt_options *o);
int mgt_cmd_eval(mgt_runtime *rt, const mgt_options *o);
int mgt_cmd_predict(mgt_runtime *rt, const mgt_options *o);
int mgt_cmd_summary(mgt_runtime *rt, const mgt_options *o);
/* generate: text from a trained language model (generate.h), on one process. */
int mgt_cmd_generate(mgt_runtime *rt, const mgt_options *o);
int mgt_cmd_convert(mgt_runtime *rt, const mgt_options *o);
int mgt_cmd_export(mgt_runtime *rt, const mgt_options *o);

#endif
