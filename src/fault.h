/* fault.h: the MGT_FAULT test hook, which makes one rank fail at a chosen optimizer step so that
 * the tests can check that a failure never hangs the job and never loses work.
 *
 *   MGT_FAULT=RANK:STEP:exit   that rank exits (status 3) before the step;
 *   MGT_FAULT=RANK:STEP:sleep  that rank stops for good before the step (a hung peer);
 *   MGT_FAULT=RANK:STEP:nan    that rank's input batches are NaN from that step on;
 *   MGT_FAULT=RANK:STEP:slow   that rank takes 3 s longer before the step (a slow step: longer
 *                              than Open MPI's 2 s from SIGCONT to SIGKILL when it ends a job).
 *
 * Unset, the hook does nothing. The "nan" fault poisons host buffers, so a run with it makes its
 * batches on the host (mgt_fault_host_batches).
 *
 * A second hook exposes what the tests compare across rank counts and backends:
 *   MGT_DUMP_GRADIENTS=FILE    rank 0 writes the all-reduced gradient of the run's first
 *                              optimizer step to FILE (safetensors, one tensor per parameter,
 *                              named and shaped as in the weights file): the SUM over the global
 *                              batch of the per-sample gradients, before the optimizer scales it.
 */
#ifndef MGT_FAULT_H
#define MGT_FAULT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    MGT_FAULT_NONE = 0,
    MGT_FAULT_EXIT,
    MGT_FAULT_SLEEP,
    MGT_FAULT_NAN,
    MGT_FAULT_SLOW
} mgt_fault_kind;

typedef struct mgt_fault {
    mgt_fault_kind kind; /* for this rank; MGT_FAULT_NONE when the hook names another rank */
    int64_t step;
    int rank;
    const char *dump_gradients; /* MGT_DUMP_GRADIENTS on rank 0, else NULL */
} mgt_fault;

struct mgt_model;

/* Reads MGT_FAULT for this rank; a malformed value ends the job (every rank sees the same). */
void mgt_fault_init(mgt_fault *f, int rank);
/* Before optimizer step `step`: exits, stops or slows this rank if the hook says so. */
void mgt_fault_point(const mgt_fault *f, int64_t step);
/* Poisons the `count` input values of a host batch of step `step`, from the fault's step on. */
void mgt_fault_poison(const mgt_fault *f, int64_t step, float *x, size_t count);
/* 1 when batches must pass through host memory for the hook to reach them. */
int mgt_fault_host_batches(const mgt_fault *f);
/* After the all-reduce of the run's first step: writes m->g as MGT_DUMP_GRADIENTS says (rank 0;
 * a no-op elsewhere or when unset). A write that fails ends the job. */
void mgt_fault_dump_gradients(const mgt_fault *f, const struct mgt_model *m, int64_t step);

#endif
