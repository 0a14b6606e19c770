/* passes.c: a micro-batch's forward and backward, issued eagerly, between marks, or replayed
 * (passes.h). */
#include "passes.h"

#include <stdio.h>
#include <string.h>

#include "runtime.h"

/* Eager runs of an input set before its passes are captured: the first chooses every
 * convolution's algorithm and grows the workspaces, the second shows they stay put. */
enum { WARM_RUNS = 2 };

/* Why replay cannot hold this model's passes (NULL: it can). */
static const char *model_varies(const mgt_model *m) {
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        if (!strcmp(l->type->name, "dropout") && l->cfg.rate > 0)
            return "dropout draws a new mask each step";
        if (!strcmp(l->type->name, "batchnorm") && l->cfg.sync)
            return "synchronised batch normalisation communicates inside the passes";
    }
    return NULL;
}

void mgt_passes_init(mgt_passes *p, mgt_model *m, mgt_backend *be, mgt_profile *prof,
                     const mgt_passes_opts *o) {
    memset(p, 0, sizeof *p);
    p->m = m;
    p->be = be;
    p->prof = prof;
    p->cur = -1;
    const mgt_ops *ops = be->ops;
    const char *varies = model_varies(m);
    p->why_not = !ops->capture_begin           ? "the backend launches nothing worth replaying"
                 : !o->graphs                  ? "--cuda-graph off"
                 : mgt_profile_layers_on(prof) ? "--profile-layers marks every layer"
                 : o->reproducible             ? "--reproducible runs the passes chunk by chunk"
                 : o->accum > 1                ? "gradient accumulation changes the passes between "
                                                 "micro-batches"
                 : o->comm_inside              ? "the gradient buckets are sent while backward runs"
                                               : varies;
    p->replay = p->why_not == NULL;
}

/* The key slot of step s's input set (a new one while there is room; -1: none). */
static int key_of(mgt_passes *p, const mgt_step *s) {
    for (int k = 0; k < p->nkeys; k++)
        if (p->key[k].x == s->in.x && p->key[k].labels == s->in.labels &&
            p->key[k].targets == s->in.targets && p->key[k].n == s->n &&
            p->key[k].global_n == s->global_n)
            return k;
    if (p->nkeys == MGT_PASS_KEYS)
        return -1;
    const int k = p->nkeys++;
    p->key[k].x = s->in.x;
    p->key[k].labels = s->in.labels;
    p->key[k].targets = s->in.targets;
    p->key[k].n = s->n;
    p->key[k].global_n = s->global_n;
    return k;
}

/* Input set k's graphs are gone (the backend dropped them): it warms up and is captured again. */
static void forget(mgt_passes *p, int k) {
    p->key[k].fwd = p->key[k].bwd = 0;
    p->key[k].runs = 0;
}

/* A capture failed: said once, on every rank that met it; the passes go on eagerly. */
static void give_up(mgt_passes *p, const char *what) {
    p->failed = 1;
    mgt_log0("notice: the %s pass could not be captured as a CUDA graph; every pass is "
             "launched op by op from now on (--cuda-graph off says so from the start)\n",
             what);
}

/* Captures `issue` as graph g and replays it; returns 0, or -1 (nothing kept, nothing run)
 * when the capture failed. */
static int capture(mgt_passes *p, int g, void (*issue)(mgt_passes *, const mgt_step *),
                   const mgt_step *s) {
    const mgt_ops *o = p->be->ops;
    if (o->capture_begin(p->be) < 0)
        return -1;
    issue(p, s);
    if (o->capture_end(p->be, g) < 0)
        return -1;
    return o->replay(p->be, g);
}

static void issue_forward(mgt_passes *p, const mgt_step *s) {
    mgt_model_forward(p->m, s);
}

static void issue_backward(mgt_passes *p, const mgt_step *s) {
    mgt_model_loss_backward(p->m, s, 1);
}

void mgt_passes_forward(mgt_passes *p, const mgt_step *s) {
    mgt_model *m = p->m;
    p->t_issue = mgt_now();
    p->cur = -1;
    p->way = 0;
    if (mgt_profile_layers_on(p->prof)) {
        for (int i = 0; i < m->nlayers; i++) {
            mgt_profile_mark(p->prof, MGT_MARK_GAP_FWD);
            mgt_model_layer_forward(m, i, s);
            mgt_profile_mark(p->prof, MGT_MARK_LAYERS + i);
        }
        return;
    }
    if (p->replay && !p->failed)
        p->cur = key_of(p, s);
    const int k = p->cur;
    if (k >= 0 && p->key[k].fwd) {
        if (p->be->ops->replay(p->be, 2 * k) == 0) {
            p->way = 1;
            return;
        }
        forget(p, k); /* the backend dropped its graphs: captured again once warm */
    }
    if (k >= 0 && p->key[k].runs >= WARM_RUNS) {
        if (capture(p, 2 * k, issue_forward, s) == 0) {
            p->key[k].fwd = 1;
            p->way = 2;
            return;
        }
        give_up(p, "forward");
        p->cur = -1;
    }
    issue_forward(p, s);
}

void mgt_passes_backward(mgt_passes *p, const mgt_step *s) {
    mgt_model *m = p->m;
    const int k = p->cur;
    if (mgt_profile_layers_on(p->prof)) {
        mgt_model_loss(m, s, 1);
        mgt_profile_mark(p->prof, MGT_MARK_LOSS);
        for (int i = m->nlayers - 1; i >= 0; i--) {
            mgt_profile_mark(p->prof, MGT_MARK_GAP_BWD);
            mgt_model_layer_backward(m, i, s);
            mgt_profile_mark(p->prof, MGT_MARK_LAYERS + m->nlayers + i);
        }
    } else if (k >= 0 && p->key[k].bwd && p->be->ops->replay(p->be, 2 * k + 1) == 0) {
        /* replayed */
    } else if (k >= 0 && p->key[k].bwd) { /* dropped since forward replayed: ops, then again */
        issue_backward(p, s);
        forget(p, k);
    } else if (k >= 0 && p->key[k].fwd) { /* forward was captured just now */
        if (capture(p, 2 * k + 1, issue_backward, s) == 0) {
            p->key[k].bwd = 1;
        } else {
            give_up(p, "backward");
            issue_backward(p, s);
        }
    } else {
        issue_backward(p, s);
        if (k >= 0)
            p->key[k].runs++;
    }
    if (p->way < 2) { /* the micro-batch that captures is neither */
        p->host[p->way] += mgt_now() - p->t_issue;
        p->count[p->way]++;
    }
}

void mgt_passes_report(const mgt_passes *p) {
    const double eager = p->count[0] ? 1e3 * p->host[0] / (double)p->count[0] : 0;
    const double graph = p->count[1] ? 1e3 * p->host[1] / (double)p->count[1] : 0;
    if (!p->be->ops->capture_begin)
        return;
    if (!p->replay || p->failed) {
        printf("CUDA graphs: off (%s); the host issued forward and backward in %.3f ms per "
               "micro-batch\n",
               p->failed ? "a capture failed" : p->why_not, eager);
        return;
    }
    printf("CUDA graphs: forward and backward replayed as 2 graphs from micro-batch %d of an "
           "input set on; the host issued them in %.3f ms per micro-batch launched op by op "
           "(%lld micro-batches), %.3f ms replayed (%lld)\n",
           WARM_RUNS + 1, eager, (long long)p->count[0], graph, (long long)p->count[1]);
}

void mgt_passes_free(mgt_passes *p) {
    if (p->be && p->be->ops->drop)
        for (int g = 0; g < MGT_GRAPHS; g++)
            p->be->ops->drop(p->be, g);
    memset(p, 0, sizeof *p);
}
