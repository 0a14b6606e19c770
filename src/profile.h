/* profile.h: where a step's time goes. One mechanism for --profile (per-rank mean and p95 of each
 * phase, printed by rank 0) and --timeline FILE (a Chrome-trace JSON: each rank a process, each
 * phase a span, rank 0 merging every rank's spans). Spans live in a buffer sized before the loop. */
#ifndef MGT_PROFILE_H
#define MGT_PROFILE_H

#include <stdint.h>

#include "backend.h"
#include "comm.h"
#include "util.h"

enum { MGT_PH_DATA = 0, MGT_PH_FORWARD, MGT_PH_BACKWARD, MGT_PH_ALLREDUCE, MGT_PH_UPDATE,
       MGT_PH_COUNT };

typedef struct mgt_span {
    double start, dur; /* seconds since the profile's origin */
    int32_t phase;
    int32_t step;
} mgt_span;

typedef struct mgt_profile {
    int on;            /* --profile or --timeline */
    mgt_backend *be;   /* waited for at each phase boundary, so device work is timed too */
    double origin;     /* mgt_now() at a common barrier */
    mgt_span *spans;
    int64_t nspans, cap;
    double *dur[MGT_PH_COUNT]; /* per-step durations, for mean and p95 */
    int64_t nsteps, step_cap;
    double mark;       /* start of the current phase */
    double cur[MGT_PH_COUNT];
    int64_t step;
} mgt_profile;

/* be: the backend whose queued work each phase includes (sync at every boundary while on). */
int mgt_profile_init(mgt_profile *p, int on, int64_t max_steps, mgt_backend *be, mgt_err *err);
void mgt_profile_begin_step(mgt_profile *p, int64_t step);
/* Ends the phase that started at the last mark, and starts the next one. */
void mgt_profile_phase(mgt_profile *p, int phase);
void mgt_profile_end_step(mgt_profile *p);
/* Collective: rank 0 prints the per-rank table and, if path != NULL, writes the trace. */
int mgt_profile_report(mgt_profile *p, mgt_comm *c, const char *timeline_path, mgt_err *err);
void mgt_profile_free(mgt_profile *p);

#endif
