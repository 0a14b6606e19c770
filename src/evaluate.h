/* evaluate.h: the model on a dataset without training: loss and accuracy (validation, eval), and
 * the last layer's outputs (predict).
 *
 * Each rank takes one contiguous shard of the dataset (shard.h), in batches of up to the model's
 * max_batch uploaded through the stager, so the ranks' outputs in rank order are the dataset's in
 * order. BatchNorm uses its running statistics and dropout is off. */
#ifndef MGT_EVALUATE_H
#define MGT_EVALUATE_H

#include <stdint.h>

#include "comm.h"
#include "data/dataset.h"
#include "model.h"
#include "staging.h"

typedef struct mgt_eval {
    mgt_model *m;
    mgt_stage *st;
    mgt_comm *comm;
    int64_t step; /* optimizer steps taken so far (the step an op sees) */
} mgt_eval;

/* Sums over every rank's samples: top5 counts the samples whose label is among the 5 most
 * probable classes (backend.h: xent); task: the task's own sums (model.h: MGT_SUM_TASK on,
 * mgt_model_task_sums of them). */
typedef struct mgt_eval_sums {
    double loss, correct, samples, top5;
    double task[MGT_TASK_SUMS_MAX];
} mgt_eval_sums;

/* Collective: loss sum, correct predictions, top-5 hits and sample count over the whole of ds. */
mgt_eval_sums mgt_eval_metrics(const mgt_eval *e, const mgt_dataset *ds);

/* Collective: the last layer's outputs for every sample of ds ([n][classes]: softmax
 * probabilities where the model ends in softmax, else logits), in dataset order, in a malloc'ed
 * array on rank 0 (NULL on the other ranks). */
float *mgt_eval_outputs(const mgt_eval *e, const mgt_dataset *ds);

#endif
