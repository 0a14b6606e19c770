/* passes.h: how a micro-batch's forward and backward passes are issued to the backend:
 *   - eagerly, every op launched as the layers call it (the CPU; a GPU where replay does not
 *     apply);
 *   - layer by layer between device marks, for --profile-layers' table (profile.h);
 *   - replayed (a GPU, --cuda-graph on): once a batch's shapes and memory have run eagerly twice
 *     (every convolution's algorithm chosen, every workspace grown), its forward and its
 *     backward are each captured once as a CUDA graph (backend.h: capture_begin) and from then
 *     on replayed, one launch each, where the ops would have been launched one by one. A step
 *     is the same function of the same memory each time: the batch lives at the same place
 *     (the input sets are keyed by their pointers, two at most), and nothing a pass does depends
 *     on the step's number. Replay is left off, and every pass launched eagerly, where that
 *     does not hold or the graph could not hold the step: dropout (a new mask each step),
 *     synchronised batch normalisation and gradient buckets sent while backward runs (more
 *     than one rank: communication inside the passes), gradient accumulation, --reproducible's
 *     chunks, --profile-layers (the marks between layers); and for a batch of another size (an
 *     epoch's short last batch). A capture that fails (the backend could not record something)
 *     is given up for the run, the passes issued again eagerly, and said once.
 * The host's time spent issuing the passes is kept both ways, for --profile: the launch
 * overhead eager, and as replays. */
#ifndef MGT_PASSES_H
#define MGT_PASSES_H

#include <stdint.h>

#include "model.h"
#include "profile.h"

typedef struct mgt_passes_opts {
    int graphs;       /* --cuda-graph on */
    int comm_inside;  /* communication runs inside the passes (requests on, several ranks) */
    int accum;        /* micro-batches per optimizer step */
    int reproducible; /* --reproducible's chunked passes (not issued here) */
} mgt_passes_opts;

enum { MGT_PASS_KEYS = MGT_GRAPHS / 2 };

typedef struct mgt_passes {
    mgt_model *m;
    mgt_backend *be;
    mgt_profile *prof;
    int replay;          /* replay applies */
    const char *why_not; /* why it does not (for --profile) */
    int failed;          /* a capture failed: eager from then on */
    /* The input sets seen, each with its graphs 2k (forward) and 2k + 1 (backward). */
    struct {
        const float *x, *targets;
        const int32_t *labels;
        int n;
        int64_t global_n;
        int64_t runs; /* eager micro-batches with it so far */
        int fwd, bwd; /* its graphs are made */
    } key[MGT_PASS_KEYS];
    int nkeys, cur; /* the current micro-batch's key (-1: none) */
    int way;        /* how it is issued: 0 eagerly, 1 replayed, 2 captured now */
    double t_issue; /* host clock when the current forward was issued */
    /* Host seconds issuing forward + backward, and micro-batches: [0] eager, [1] replayed. */
    double host[2];
    int64_t count[2];
} mgt_passes;

/* Decides whether replay applies (the reasons above), for model m on backend be. */
void mgt_passes_init(mgt_passes *p, mgt_model *m, mgt_backend *be, mgt_profile *prof,
                     const mgt_passes_opts *o);
/* The forward pass of step s, then the loss and the backward pass: as mgt_model_forward and
 * mgt_model_loss_backward(m, s, 1) do. */
void mgt_passes_forward(mgt_passes *p, const mgt_step *s);
void mgt_passes_backward(mgt_passes *p, const mgt_step *s);
/* The replay's line for --profile (rank 0): on or why not, and the host's issue time per
 * micro-batch both ways. */
void mgt_passes_report(const mgt_passes *p);
void mgt_passes_free(mgt_passes *p);

#endif
