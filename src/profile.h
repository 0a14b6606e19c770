/* profile.h: where a step's time goes. One mechanism for --profile (per-rank mean and p95 of each
 * phase, printed by rank 0) and --timeline FILE (a Chrome-trace JSON: each rank a process, each
 * phase a span, rank 0 merging every rank's spans). Spans live in a buffer sized before the loop.
 *
 * On a backend with device timing (a GPU: time_mark/time_read) a phase is timed on the device,
 * between timing points queued at the phase boundaries, so the host keeps running ahead and the
 * figures are the device's: "data" is how long the device waited for its batch. A step's points
 * are read MGT_TIME_SETS - 1 steps later, when they have long run. Elsewhere the host's clock
 * times each phase.
 *
 * Communication is asynchronous (reducer.h): a bucket's request runs while backward goes on. The
 * "allreduce" phase is the EXPOSED part only: the time the step waits for communication after
 * backward (and, with ZeRO-1, for the weights' all-gather). With host timing, each request is
 * also a span of its own (in the timeline, on each rank's second row: from its start to when
 * the rank saw it complete), and the time at least one request was in flight, hidden or not, is
 * reported beside the table, as is the split of each rank's wait in two: until the last rank has
 * handed over its last gradients (the latest start of a gradient request on any rank) it waits
 * for a slower rank's backward; after that, for the communication itself. */
#ifndef MGT_PROFILE_H
#define MGT_PROFILE_H

#include <stdint.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "tb.h"
#include "util.h"

/* How a timeline begins: a Chrome trace's "otherData" naming its writer, so that a later run
 * knows a file at its --timeline path as one mgtrain wrote (outputs.h), which it may replace. */
#define MGT_TIMELINE_HEAD "{\"otherData\": {\"generator\": \"mgtrain\"}"

enum { MGT_PH_DATA = 0, MGT_PH_FORWARD, MGT_PH_BACKWARD, MGT_PH_ALLREDUCE, MGT_PH_UPDATE,
       MGT_PH_COUNT };

typedef struct mgt_span {
    double start, dur; /* seconds since the profile's origin */
    int32_t phase;
    int32_t step;
    int32_t bucket; /* a request's bucket (-1: the whole arena); phases: -2 */
    int32_t coll;   /* a request's kind (comm.h's mgt_coll) */
    int64_t bytes;  /* a request's size */
    double cpu;     /* host-timed phases: the process's CPU seconds in it (all threads); else -1 */
} mgt_span;

typedef struct mgt_layer_prof mgt_layer_prof; /* profile_layers.c */

typedef struct mgt_profile {
    int on;            /* --profile or --timeline */
    mgt_backend *be;   /* device timing when its ops have time_mark */
    int device;        /* timing on the device */
    /* Device timing: per set, its step (-1: free), points queued, the phase each point ends and
     * the host time of point 0. */
    int64_t set_step[MGT_TIME_SETS];
    int set_points[MGT_TIME_SETS];
    int set_phase[MGT_TIME_SETS][MGT_TIME_POINTS];
    double set_t0[MGT_TIME_SETS];
    int set;
    double origin;     /* mgt_now() at a common barrier */
    mgt_span *spans;
    int64_t nspans, cap;
    double *dur[MGT_PH_COUNT]; /* per-step durations, for mean and p95 */
    double *inflight;          /* per step: time any request was in flight (host timing) */
    double cur_inflight;
    int requests; /* spans of requests were recorded */
    int64_t nsteps, step_cap;
    double mark;       /* start of the current phase */
    double cpu_mark;   /* the process's CPU seconds at that start (host timing) */
    double cur[MGT_PH_COUNT];
    int64_t step;
    int64_t first_step; /* the first step profiled (-1: none yet) */
    mgt_tb *tb;        /* rank 0, when set: the report's means also go there as scalars */
    mgt_layer_prof *lp; /* device marks (profile_layers.c), or NULL */
    /* The data phase's host part: the seconds the host spent getting each step's batches
     * (waiting for the loader, issuing the copies or the device's making of them). */
    double data_host, cur_data_host;
    int64_t data_host_steps;
} mgt_profile;

/* be: the backend whose queued work each phase includes. */
int mgt_profile_init(mgt_profile *p, int on, int64_t max_steps, mgt_backend *be, mgt_err *err);
/* Collective, before the first step: every rank takes its time origin as it leaves one barrier,
 * so that the ranks' spans share one time axis (to within the barrier's exit skew) and a
 * timeline shows which rank waited for which. */
void mgt_profile_sync(mgt_profile *p, mgt_comm *c);
void mgt_profile_begin_step(mgt_profile *p, int64_t step);
/* Ends the phase that started at the last mark, and starts the next one. */
void mgt_profile_phase(mgt_profile *p, int phase);
void mgt_profile_end_step(mgt_profile *p);
/* Room for `per_step` request spans per step (reducer.h), beside the phases'. */
int mgt_profile_reserve_requests(mgt_profile *p, int per_step, mgt_err *err);
/* A request of the current step: bucket (-1: the whole arena), kind, bytes, host-clock start
 * and completion. */
void mgt_profile_request(mgt_profile *p, int bucket, int coll, size_t bytes, double t0, double t1);
/* The current step's time with at least one request in flight. */
void mgt_profile_inflight(mgt_profile *p, double seconds);
/* Between steps the host does other work (evaluation, a checkpoint): not the next step's time. */
void mgt_profile_gap(mgt_profile *p);
/* Collective: rank 0 prints the per-rank table and, if path != NULL, writes the trace. With
 * p->tb set, rank 0 also writes the mean over ranks of each phase's mean as the TensorBoard
 * scalar profile/<phase>_ms, and of the whole step as profile/step_ms, at the last step. */
int mgt_profile_report(mgt_profile *p, mgt_comm *c, const char *timeline_path, mgt_err *err);
void mgt_profile_free(mgt_profile *p);
/* The host's part of the data phase (seconds), for the current step. */
void mgt_profile_data_host(mgt_profile *p, double seconds);

/* Device marks (profile_layers.c), on a backend with marks: with the profile on, the data
 * phase's parts; with layers (--profile-layers), each layer's passes too, and a table per
 * layer and direction in the report (precision "fp32", "tf32" or "bf16" for its floors). A
 * mark ends an interval of the step's device timeline that counts to `slot`: */
enum {
    MGT_MARK_DATA_WAIT = 0, /* the device waited for the batch's copy */
    MGT_MARK_DATA_MAKE,     /* it made the batch (synthetic generation, gather) */
    MGT_MARK_LOSS,          /* the loss */
    MGT_MARK_GAP_FWD,       /* idle before a layer's forward: marked at the layer's start */
    MGT_MARK_GAP_BWD,       /* idle before a layer's backward */
    MGT_MARK_LAYERS         /* layer i's forward: MGT_MARK_LAYERS + i; backward: + L + i */
};
int mgt_profile_marks_init(mgt_profile *p, const mgt_model *m, int layers, const char *precision,
                           mgt_err *err);
/* What makes the batches on the device ("synthetic generation", "gather"; NULL: the host). */
void mgt_profile_marks_source(mgt_profile *p, const char *make_what);
void mgt_profile_mark(mgt_profile *p, int slot);
/* Whether every layer is marked (--profile-layers on a backend with marks). */
int mgt_profile_layers_on(const mgt_profile *p);
/* (profile.c's) the step's first mark; the tables; freeing. */
void mgt_profile_marks_step(mgt_profile *p, int64_t step);
void mgt_profile_marks_report(mgt_profile *p);
void mgt_profile_marks_free(mgt_profile *p);

#endif
