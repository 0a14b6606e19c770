/* model.c: parameter arenas, the activation memory plan, forward and backward over the layer
 * graph, the summary table, and weights in PyTorch's names and layouts. */
#include "model.h"

#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

/* Appends a tensor to a table that grows as needed: its name, shape, element count (checked in
 * 64 bits against MGT_MAX_TENSOR_ELEMS) and a 16-float-aligned offset in its arena. */
static int add(mgt_param **tab, int *n, int *cap, size_t *count, const mgt_layer *l,
               const char *suffix, int ndim, const int64_t *shape, int init, mgt_err *err) {
    int64_t c = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(c, shape[i], &c) || c > MGT_MAX_TENSOR_ELEMS)
            return mgt_errf(err,
                            "model too large: its %s would hold more than %lld values, the most "
                            "one tensor may hold; use fewer units, filters or a smaller input",
                            suffix, (long long)MGT_MAX_TENSOR_ELEMS);
    if (*n == *cap) {
        int grow = *cap ? 2 * *cap : 32;
        mgt_param *t = realloc(*tab, sizeof *t * (size_t)grow);
        if (!t)
            return mgt_errf(err, "out of host memory for the model's tensor table");
        *tab = t;
        *cap = grow;
    }
    mgt_param *p = &(*tab)[*n];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s.%s", l->name, suffix);
    p->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        p->shape[i] = shape[i];
    p->count = (size_t)c;
    /* 16-float (64-byte) alignment for every tensor: vector loads, and cuDNN/cuBLAS alignment. */
    p->offset = (*count + 15) & ~(size_t)15;
    *count = p->offset + p->count;
    p->init = init;
    return (*n)++;
}

int mgt_model_add_param(mgt_model *m, mgt_layer *l, const char *suffix, int ndim,
                        const int64_t *shape, int init, float fan_in, float fan_out, mgt_err *err) {
    int i = add(&m->params, &m->nparams, &m->params_cap, &m->param_count, l, suffix, ndim, shape,
                init, err);
    if (i >= 0) {
        m->params[i].fan_in = fan_in;
        m->params[i].fan_out = fan_out;
    } else {
        m->add_failed = 1;
    }
    return i;
}

int mgt_model_add_buffer(mgt_model *m, mgt_layer *l, const char *suffix, int ndim,
                         const int64_t *shape, int init, mgt_err *err) {
    return add(&m->buffers, &m->nbuffers, &m->buffers_cap, &m->buffer_count, l, suffix, ndim, shape,
               init, err);
}

void mgt_model_layout(mgt_model *m) {
    size_t at = 0;
    for (int pass = 0; pass < 2; pass++) { /* the trainable tensors, then the frozen ones */
        for (int i = 0; i < m->nlayers; i++) {
            const mgt_layer *l = &m->layers[i];
            if (l->frozen != pass)
                continue;
            for (int j = 0; j < 4; j++)
                if (l->param[j] >= 0) {
                    mgt_param *p = &m->params[l->param[j]];
                    p->offset = (at + 15) & ~(size_t)15;
                    at = p->offset + p->count;
                }
        }
        if (pass == 0)
            m->grad_count = at;
    }
    m->param_count = at;
}

/* One pattern of --freeze against a layer name, of len bytes at pat. */
static int name_matches(const char *pat, size_t len, const char *name) {
    char p[128];
    if (len >= sizeof p)
        return 0;
    memcpy(p, pat, len);
    p[len] = 0;
    return fnmatch(p, name, 0) == 0;
}

int mgt_model_freeze(mgt_model *m, const char *patterns, mgt_err *err) {
    int *frozen = calloc((size_t)(m->nlayers > 0 ? m->nlayers : 1), sizeof *frozen);
    if (!frozen)
        return mgt_errf(err, "out of host memory");
    int any = 0;
    /* Each positive pattern must name a layer; then the exemptions (!) are taken out. */
    for (int neg = 0; neg < 2; neg++)
        for (const char *p = patterns; *p;) {
            size_t len = strcspn(p, ",");
            const char *q = p;
            while (len && (*q == ' ' || *q == '\t'))
                q++, len--;
            while (len && (q[len - 1] == ' ' || q[len - 1] == '\t'))
                len--;
            const int is_neg = len && *q == '!';
            if (len && is_neg == neg) {
                any += !neg;
                int hits = 0;
                for (int i = 0; i < m->nlayers; i++)
                    if (name_matches(q + neg, len - (size_t)neg, m->layers[i].name)) {
                        frozen[i] = !neg;
                        hits++;
                    }
                if (!hits && !neg) {
                    free(frozen);
                    return mgt_errf(err,
                                    "'%.*s' names no layer of model %s; give layer names or "
                                    "patterns such as conv*, bn1 or '*,!fc' (all but fc); "
                                    "mgtrain summary lists the layers",
                                    (int)len, q, m->name);
                }
            }
            p += strcspn(p, ",");
            p += *p == ',';
        }
    if (!any) {
        free(frozen);
        return mgt_errf(err,
                        "'%s' names no layer to freeze; give layer names or patterns such "
                        "as conv*, bn1 or '*,!fc' (all but fc)",
                        patterns);
    }
    for (int i = 0; i < m->nlayers; i++)
        m->layers[i].frozen |= frozen[i];
    free(frozen);
    mgt_model_layout(m);
    return 0;
}

int mgt_model_count_params(const mgt_model *m, size_t *trainable, size_t *frozen) {
    int nfrozen = 0;
    *trainable = *frozen = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        nfrozen += l->frozen && l->param[0] >= 0;
        for (int j = 0; j < 4; j++)
            if (l->param[j] >= 0)
                *(l->frozen ? frozen : trainable) += m->params[l->param[j]].count;
    }
    return nfrozen;
}

void mgt_model_frozen_id(const mgt_model *m, char *buf, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    int count = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        if (!l->frozen || l->param[0] < 0)
            continue;
        count++;
        for (const char *c = l->name; *c; c++)
            h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        h = (h ^ ';') * 1099511628211ULL;
    }
    snprintf(buf, n, "%d %016llx", count, (unsigned long long)(count ? h : 0));
}

int mgt_model_check_batch(const mgt_model *m, int max_batch, mgt_err *err) {
    int64_t mb = max_batch < 1 ? 1 : max_batch, most = mgt_shape_elems(m->input);
    const char *where = "the input";
    for (int i = 0; i < m->nlayers; i++)
        if (mgt_shape_elems(m->layers[i].out) > most) {
            most = mgt_shape_elems(m->layers[i].out);
            where = m->layers[i].name;
        }
    if (most > MGT_MAX_TENSOR_ELEMS / mb)
        return mgt_errf(err,
                        "model too large for a local batch of %lld: %s holds %lld values per "
                        "sample, and one tensor may hold at most %lld values (%lld samples); use "
                        "a smaller global batch or more ranks",
                        (long long)mb, where, (long long)most, (long long)MGT_MAX_TENSOR_ELEMS,
                        (long long)(MGT_MAX_TENSOR_ELEMS / most));
    return 0;
}

mgt_shape mgt_layer_input_shape(const mgt_model *m, const mgt_layer *l, int k) {
    const int j = l->inputs[k];
    return j < 0 ? m->input : m->layers[j].out;
}

/* ---- the activation memory plan ----
 *
 * Timeline of one training step with L layers: layer i runs forward at time at[i] and backward
 * at 2L - at[i], the loss at L; at[i] = i, except for the layers of a fusion group (fuse.c),
 * which all run at their tail's time. Every block of memory has a span [start, end] of times:
 *   - layer i's output: from its forward to the last time anything reads it: the forward of its
 *     last consumer, the backward of a consumer that reads its input there (MGT_BWD_READS_X),
 *     layer i's own backward when its activation reads y (a group's tail: where the group reads
 *     its ReLU's mask from it, mask_from_y), and the end of the step for the last layer (the
 *     loss and the caller read it). A layer that may work in place (inplace) shares its input's
 *     block when it is that input's only consumer and nothing reads the input later; the
 *     block's span then covers both. The tensors inside a fusion group (its batchnorm's output
 *     and an add's before its ReLU) are never written, and get no block.
 *   - the gradient of layer i's output: from the backward of its last consumer (the loss for the
 *     last layer), which writes it, to layer i's backward, which reads it. Where that writer is
 *     an [activation] layer (identity) or an [add] outside any group, and only writes it (it is
 *     not adding to another reader's share), the gradient is the writer's own output gradient
 *     (the act's dx = f'(y) dy computed in place, the add's dx = dy): the two share one block
 *     instead of being copied (an add lends its block to one input);
 *   - a layer's saved tensor: its forward to its backward; its work tensor: its backward;
 *   - the accumulation buffer: the backward steps in which a consumer other than a tensor's last
 *     computes its share of the tensor's gradient, to be added in (merge and identity layers add
 *     in place instead).
 * Blocks whose spans do not meet may share memory. Placement is greedy by size (TensorFlow
 * Lite's "greedy by size" arena planner): the largest block first, each at the lowest offset
 * where it overlaps no placed block whose span meets its own. Layers whose backward never runs
 * (no parameters at or above them) get no gradient, and their temporaries no backward span. */

enum { PLAN_ALIGN = 256 }; /* bytes: cuDNN's and AVX-512's alignment, with room to spare */

typedef struct block {
    size_t bytes, off;
    int start, end;
} block;

static size_t align_up(size_t b) {
    return (b + PLAN_ALIGN - 1) & ~(size_t)(PLAN_ALIGN - 1);
}

static int spans_meet(const block *a, const block *b) {
    return a->start <= b->end && b->start <= a->end;
}

static int by_size(const void *pa, const void *pb, void *ctx) {
    const block *bl = ctx;
    const block *a = &bl[*(const int *)pa], *b = &bl[*(const int *)pb];
    if (a->bytes != b->bytes)
        return a->bytes < b->bytes ? 1 : -1;
    return a->start - b->start;
}

/* qsort_r is a GNU extension; a plain insertion sort keeps the order deterministic and
 * portable, and the block counts (a few hundred) make its cost nothing. */
static void sort_blocks(int *idx, int n, const block *bl) {
    for (int i = 1; i < n; i++) {
        const int v = idx[i];
        int j = i - 1;
        while (j >= 0 && by_size(&idx[j], &v, (void *)bl) > 0) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = v;
    }
}

/* Greedy by size; returns the arena's size. tmp: room for n ints and n blocks' pointers. */
static size_t place(block *bl, int n, int *order, const block **near) {
    for (int i = 0; i < n; i++)
        order[i] = i;
    sort_blocks(order, n, bl);
    size_t arena = 0;
    for (int k = 0; k < n; k++) {
        block *b = &bl[order[k]];
        int nn = 0;
        for (int q = 0; q < k; q++)
            if (spans_meet(&bl[order[q]], b))
                near[nn++] = &bl[order[q]];
        /* The placed neighbours by offset; the first gap that holds b. */
        for (int i = 1; i < nn; i++) {
            const block *v = near[i];
            int j = i - 1;
            while (j >= 0 && near[j]->off > v->off) {
                near[j + 1] = near[j];
                j--;
            }
            near[j + 1] = v;
        }
        size_t off = 0;
        for (int i = 0; i < nn; i++) {
            if (near[i]->off >= off + b->bytes)
                break;
            const size_t end = near[i]->off + near[i]->bytes;
            off = end > off ? end : off;
        }
        b->off = off;
        arena = off + b->bytes > arena ? off + b->bytes : arena;
    }
    return arena;
}

/* Whether layer l's output gradient is needed: it or a layer above it has parameters that train
 * (a frozen layer's need none: below a frozen backbone, backward stops at the first trainable
 * layer). */
static void needs_grad_of(const mgt_model *m, int *ng) {
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        ng[i] = mgt_layer_trains(l) || mgt_layer_trains_tied(m, l);
        for (int k = 0; k < l->ninputs; k++)
            if (l->inputs[k] >= 0 && ng[l->inputs[k]])
                ng[i] = 1;
    }
}

void mgt_plan_free(mgt_plan *p) {
    free(p->y);
    free(p->dy);
    free(p->saved);
    free(p->work);
    free(p->y_from);
    memset(p, 0, sizeof *p);
}

/* The graph as the planner and the executor see it: each layer's time, whether its output is a
 * group's inner tensor, the groups. */
typedef struct graph {
    int L, ngroups;
    mgt_group *groups;
    int *group_of, *bias_of, *at, *inner;
} graph;

static void graph_free(graph *g) {
    free(g->groups), free(g->group_of), free(g->bias_of), free(g->at), free(g->inner);
    memset(g, 0, sizeof *g);
}

static int graph_of(const mgt_model *m, graph *g) {
    const int L = m->nlayers;
    memset(g, 0, sizeof *g);
    g->L = L;
    g->groups = malloc(sizeof *g->groups * (size_t)(L > 0 ? L : 1));
    g->group_of = malloc(sizeof *g->group_of * (size_t)(L > 0 ? L : 1));
    g->bias_of = malloc(sizeof *g->bias_of * (size_t)(L > 0 ? L : 1));
    g->at = malloc(sizeof *g->at * (size_t)(L > 0 ? L : 1));
    g->inner = malloc(sizeof *g->inner * (size_t)(L > 0 ? L : 1));
    if (!g->groups || !g->group_of || !g->bias_of || !g->at || !g->inner) {
        graph_free(g);
        return -1;
    }
    g->ngroups = mgt_fuse_find(m, g->groups, g->group_of, g->bias_of);
    for (int i = 0; i < L; i++) {
        const int q = g->group_of[i];
        g->at[i] = q >= 0 ? g->groups[q].tail : i;
        g->inner[i] = q >= 0 && g->groups[q].tail != i;
    }
    return 0;
}

/* Whether a fusion group's backward reads its ReLU's mask from its output (the tail's y): with
 * a residual sum, whose other input would otherwise have to outlive its own readers (a
 * projection shortcut's batchnorm output, in ResNet), while the group's output lives until
 * about then anyway (the next block's readers); without one the mask is recomputed from the
 * batchnorm's input, which its backward reads in any case. */
static int mask_from_y(const mgt_group *g) {
    return g->add >= 0 && g->act >= 0;
}

/* Whether layer j's backward reads its input slot k (which must then outlive it): its type's,
 * or an [activation] whose gradient needs its input (a GELU's). */
static int reads_input_in_bwd(const mgt_model *m, int j) {
    const mgt_layer *l = &m->layers[j];
    return (l->type->bwd_reads & MGT_BWD_READS_X) != 0 ||
           (l->type->identity && mgt_act_bwd_reads_x(l->act));
}

/* Whether layer l's own backward reads its output y: its activation's gradient (a group's:
 * mask_from_y), unless the loss took the activation over. */
static int reads_own_y(const graph *g, const mgt_layer *l) {
    const int q = g->group_of[l->index];
    if (q >= 0)
        return g->groups[q].tail == l->index && mask_from_y(&g->groups[q]);
    return (l->act != MGT_ACT_NONE && !l->fused_act && !mgt_act_bwd_reads_x(l->act)) ||
           (l->type->bwd_reads & MGT_BWD_READS_Y);
}

int mgt_model_plan(const mgt_model *m, int batch, int share, mgt_plan *p, mgt_err *err) {
    const int L = m->nlayers, T_END = 2 * L + 1;
    const size_t nb = (size_t)(batch > 0 ? batch : 1);
    const size_t ab = m->act_bytes ? m->act_bytes : sizeof(float); /* an activation value */
    memset(p, 0, sizeof *p);
    p->acc = SIZE_MAX;
    /* Blocks: per layer its output (if it owns it), gradient, saved and work; one more for the
     * accumulation buffer. blk[4 * i + kind]; -1 where a layer has none. */
    graph g;
    int *ng = calloc((size_t)L, sizeof *ng), *last_use = calloc((size_t)L, sizeof *last_use);
    int *blk = malloc(sizeof *blk * (size_t)(4 * L + 1));
    int *lent = calloc((size_t)L, sizeof *lent); /* an add's gradient block lent to an input */
    block *bl = calloc((size_t)(4 * L + 1), sizeof *bl);
    int *order = malloc(sizeof *order * (size_t)(4 * L + 1));
    const block **near = malloc(sizeof *near * (size_t)(4 * L + 1));
    p->y = malloc(sizeof *p->y * (size_t)L);
    p->dy = malloc(sizeof *p->dy * (size_t)L);
    p->saved = malloc(sizeof *p->saved * (size_t)L);
    p->work = malloc(sizeof *p->work * (size_t)L);
    p->y_from = malloc(sizeof *p->y_from * (size_t)L);
    const int graph_ok = graph_of(m, &g) == 0;
    if (!graph_ok || !ng || !last_use || !blk || !lent || !bl || !order || !near || !p->y ||
        !p->dy || !p->saved || !p->work || !p->y_from) {
        free(ng), free(last_use), free(blk), free(lent), free(bl), free(order), free(near);
        if (graph_ok)
            graph_free(&g);
        mgt_plan_free(p);
        return mgt_errf(err, "out of host memory planning the activations of %d layers", L);
    }
    const int *at = g.at;
    needs_grad_of(m, ng);
    /* The last time each output is read (see the comment above). */
    for (int i = 0; i < L; i++) {
        const mgt_layer *l = &m->layers[i];
        last_use[i] = i == L - 1 ? T_END : at[i];
        if (reads_own_y(&g, l) && ng[i])
            last_use[i] = 2 * L - at[i] > last_use[i] ? 2 * L - at[i] : last_use[i];
    }
    for (int j = 0; j < L; j++) {
        const mgt_layer *l = &m->layers[j];
        for (int k = 0; k < l->ninputs; k++) {
            const int i = l->inputs[k];
            if (i < 0)
                continue;
            int t = at[j];
            if (reads_input_in_bwd(m, j) && ng[j])
                t = 2 * L - at[j];
            last_use[i] = t > last_use[i] ? t : last_use[i];
        }
    }
    int n = 0;
    for (int i = 0; i < L; i++) {
        const mgt_layer *l = &m->layers[i];
        const size_t ybytes = align_up(nb * (size_t)mgt_shape_elems(l->out) * ab);
        for (int kind = 0; kind < 4; kind++)
            blk[4 * i + kind] = -1;
        p->unplanned += ybytes;
        /* In place: the input's block, when this layer is its only reader from now on. */
        const int in = l->ninputs == 1 ? l->inputs[0] : -1;
        if (g.inner[i]) {
            p->y_from[i] = -1;
        } else if (share && l->type->inplace && in >= 0 && !g.inner[in] &&
                   m->layers[in].consumers == 1 && last_use[in] == at[i]) {
            p->y_from[i] = p->y_from[in];
            block *b = &bl[blk[4 * p->y_from[i]]];
            b->end = last_use[i] > b->end ? last_use[i] : b->end;
        } else {
            p->y_from[i] = i;
            blk[4 * i] = n;
            bl[n++] = (block){ybytes, 0, at[i], last_use[i]};
        }
        size_t saved = 0, work = 0;
        if (l->type->temps)
            l->type->temps(l, ab, &saved, &work);
        if (saved) {
            blk[4 * i + 2] = n;
            bl[n++] = (block){align_up(nb * saved), 0, at[i], ng[i] ? 2 * L - at[i] : at[i]};
            p->unplanned += bl[n - 1].bytes;
        }
        if (work && ng[i]) {
            blk[4 * i + 3] = n;
            bl[n++] = (block){align_up(nb * work), 0, 2 * L - at[i], 2 * L - at[i]};
            p->unplanned += bl[n - 1].bytes;
        }
    }
    /* Gradients, from the last layer down (a block lent by a reader exists by then): written
     * first by the reader that runs backward first (the loss for the last layer), read by the
     * layer's own backward. A reader that is not the first to write, and neither a merge nor an
     * identity layer (which add in place), computes its share into the accumulation buffer. */
    size_t acc_bytes = 0;
    int acc_start = T_END, acc_end = 0;
    for (int i = L - 1; i >= 0; i--) {
        if (!ng[i] || g.inner[i])
            continue;
        const size_t bytes = nb * (size_t)mgt_shape_elems(m->layers[i].out) * ab;
        int first = i == L - 1 ? L : T_END, writer = -1, slots = 0;
        for (int j = L - 1; j > i; j--) {
            const mgt_layer *c = &m->layers[j];
            for (int k = 0; k < c->ninputs; k++)
                if (c->inputs[k] == i) {
                    const int t = 2 * L - at[j];
                    if (first < T_END && !c->type->merge && !c->type->identity) {
                        acc_bytes = bytes > acc_bytes ? bytes : acc_bytes;
                        acc_start = t < acc_start ? t : acc_start;
                        acc_end = t > acc_end ? t : acc_end;
                    }
                    if (t < first || (t == first && j == writer)) {
                        slots = t < first ? 1 : slots + 1;
                        first = t;
                        writer = j;
                    }
                }
        }
        /* The first writer's own gradient block, where it only writes this one (see above). */
        const mgt_layer *w = writer >= 0 ? &m->layers[writer] : NULL;
        if (share && w && slots == 1 && g.group_of[writer] < 0 && blk[4 * writer + 1] >= 0 &&
            ((w->type->identity && !w->fused_act) || (w->type->residual_sum && !lent[writer]))) {
            block *b = &bl[blk[4 * writer + 1]];
            blk[4 * i + 1] = blk[4 * writer + 1];
            b->end = 2 * L - at[i] > b->end ? 2 * L - at[i] : b->end;
            lent[writer] = 1;
            p->unplanned += align_up(bytes); /* a block of its own without sharing */
            continue;
        }
        /* A sequence model's logits (B * T * V values: GPT-2's are 6 times its activations at
         * batch 4): the loss writes their gradient over them, nothing reading them afterwards
         * in a training step (model.h: mgt_model_loss). */
        if (share && i == L - 1 && m->labels_per_sample > 1 && p->y_from[i] == i) {
            block *b = &bl[blk[4 * i]];
            blk[4 * i + 1] = blk[4 * i];
            b->end = 2 * L - at[i] > b->end ? 2 * L - at[i] : b->end;
            p->unplanned += align_up(bytes);
            continue;
        }
        blk[4 * i + 1] = n;
        bl[n++] = (block){align_up(bytes), 0, first, 2 * L - at[i]};
        p->unplanned += bl[n - 1].bytes;
    }
    int acc_blk = -1;
    if (acc_bytes) {
        acc_blk = n;
        bl[n++] = (block){align_up(acc_bytes), 0, acc_start, acc_end};
        p->unplanned += bl[n - 1].bytes;
    }
    /* The most bytes alive at one time, a bound no placement can beat. */
    for (int t = 0; t <= T_END; t++) {
        size_t live = 0;
        for (int b = 0; b < n; b++)
            if (bl[b].start <= t && t <= bl[b].end)
                live += bl[b].bytes;
        p->live_peak = live > p->live_peak ? live : p->live_peak;
    }
    if (share) {
        p->arena = place(bl, n, order, near);
    } else { /* every block its own memory, one after another */
        for (int b = 0; b < n; b++) {
            bl[b].off = p->arena;
            p->arena += bl[b].bytes;
        }
    }
    for (int i = 0; i < L; i++) {
        p->y[i] = p->y_from[i] >= 0 ? bl[blk[4 * p->y_from[i]]].off : SIZE_MAX;
        p->dy[i] = blk[4 * i + 1] >= 0 ? bl[blk[4 * i + 1]].off : SIZE_MAX;
        p->saved[i] = blk[4 * i + 2] >= 0 ? bl[blk[4 * i + 2]].off : SIZE_MAX;
        p->work[i] = blk[4 * i + 3] >= 0 ? bl[blk[4 * i + 3]].off : SIZE_MAX;
    }
    if (acc_blk >= 0)
        p->acc = bl[acc_blk].off;
    free(ng), free(last_use), free(blk), free(lent), free(bl), free(order), free(near);
    graph_free(&g);
    return 0;
}

/* Which input slots add their gradient to one already written (see mgt_layer.accumulate): the
 * layers run backward in decreasing time (at: a fusion group's at its tail's), and within a merge
 * layer slot by slot, so a slot accumulates when a layer that runs backward earlier, or an
 * earlier slot of the same layer, takes the same input. */
static void set_accumulate(mgt_model *m, const int *at) {
    for (int j = 0; j < m->nlayers; j++) {
        mgt_layer *l = &m->layers[j];
        l->accumulate = 0;
        for (int k = 0; k < l->ninputs; k++) {
            const int i = l->inputs[k];
            int before = 0;
            for (int q = 0; q < k && !before; q++)
                before = l->inputs[q] == i;
            for (int q = 0; q < m->nlayers && !before && i >= 0; q++)
                if (at[q] > at[j])
                    for (int r = 0; r < m->layers[q].ninputs && !before; r++)
                        before = m->layers[q].inputs[r] == i;
            if (before && i >= 0)
                l->accumulate |= 1u << k;
        }
    }
}

/* The fusion groups into the model (mgt_fuse_find), each layer's time into at. */
static int take_groups(mgt_model *m, int *at, mgt_err *err) {
    const size_t L = (size_t)(m->nlayers > 0 ? m->nlayers : 1);
    m->groups = malloc(sizeof *m->groups * L);
    m->group_of = malloc(sizeof *m->group_of * L);
    m->bias_of = malloc(sizeof *m->bias_of * L);
    if (!m->groups || !m->group_of || !m->bias_of)
        return mgt_errf(err, "out of host memory for the layer table of %d layers", m->nlayers);
    m->ngroups = mgt_fuse_find(m, m->groups, m->group_of, m->bias_of);
    for (int i = 0; i < m->nlayers; i++) {
        const int q = m->group_of[i];
        at[i] = q >= 0 ? m->groups[q].tail : i;
        m->layers[i].bias_cancelled = 0;
    }
    for (int i = 0; i < m->nlayers; i++)
        if (m->bias_of[i] >= 0)
            m->layers[m->bias_of[i]].bias_cancelled = 1;
    mgt_fuse_relu_grads(m);
    return 0;
}

int mgt_model_alloc(mgt_model *m, mgt_backend *be, int max_batch, mgt_err *err) {
    const mgt_ops *o = be->ops;
    if (mgt_model_check_batch(m, max_batch, err) < 0)
        return -1;
    if (m->labels_per_sample > 1 && m->loss != MGT_LOSS_SPARSE_CE)
        return mgt_errf(err,
                        "model %s scores every position of a sequence against the next token: "
                        "train it with loss = sparse_categorical_crossentropy",
                        m->name);
    for (int i = 0; i < m->nlayers; i++)
        if (mgt_act_bwd_reads_x(m->layers[i].act) && !o->gelu)
            return mgt_errf(err,
                            "layer %s: the %s backend has no %s activation yet; train this "
                            "model with --device cpu",
                            m->layers[i].name, o->name, mgt_act_name(m->layers[i].act));
    if (!mgt_loss_is_xent(m->loss) && !o->elem_loss)
        return mgt_errf(err,
                        "the %s backend has no binary cross-entropy or regression losses yet; "
                        "train this model with --device cpu",
                        o->name);
    m->be = be;
    m->max_batch = max_batch < 1 ? 1 : max_batch;
    m->act_bytes = mgt_dtype_size(be->act);
    size_t mb = (size_t)m->max_batch;
    size_t in = (size_t)mgt_shape_elems(m->input), scratch = 0;
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        if (l->type->scratch) {
            size_t s = l->type->scratch(be, l, m->max_batch);
            scratch = s > scratch ? s : scratch;
        }
    }
    if (mgt_model_plan(m, m->max_batch, !m->no_memory_sharing, &m->plan, err) < 0)
        return -1;
    m->dy = calloc((size_t)m->nlayers, sizeof *m->dy);
    m->needs_grad = calloc((size_t)m->nlayers, sizeof *m->needs_grad);
    int *at = calloc((size_t)(m->nlayers > 0 ? m->nlayers : 1), sizeof *at);
    if (!m->dy || !m->needs_grad || !at) {
        free(at);
        return mgt_errf(err, "out of host memory for the layer table of %d layers", m->nlayers);
    }
    if (take_groups(m, at, err) < 0) {
        free(at);
        return -1;
    }
    needs_grad_of(m, m->needs_grad);
    set_accumulate(m, at);
    free(at);
    /* A tied tensor's gradient: written by its last user in the file (the first to run
     * backward), added to by the layer that owns it (model.h: tied). */
    for (int i = 0; i < m->nlayers; i++)
        m->layers[i].grad_accumulate = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        for (int j = 0; mgt_layer_trains_tied(m, l) && j < i; j++)
            for (int k = 0; k < 4; k++)
                if (m->layers[j].param[k] == l->tied)
                    m->layers[j].grad_accumulate = 1;
    }
#define ALLOC(ptr, bytes)                                                                          \
    do {                                                                                           \
        size_t b_ = (bytes);                                                                       \
        if (!((ptr) = o->alloc(be, b_ ? b_ : 16)))                                                 \
            return mgt_errf(err,                                                                   \
                            "out of %s memory: %zu bytes for %s; try a smaller batch "             \
                            "per rank (--batch-size or more ranks)",                               \
                            o->name, b_, #ptr);                                                    \
    } while (0)
    /* The step's loss and accuracy sums sit right after the gradients, so one all-reduce carries
     * both. The gradient arena covers the trainable tensors only (grad_count). */
    size_t sums_at = (m->grad_count + 15) & ~(size_t)15;
    if (m->nsums < MGT_SUM_TASK + 1) /* a model whose loss was never checked: cross-entropy's */
        m->nsums = MGT_SUM_TASK + 1;
    const size_t nsums = ((size_t)m->nsums + 15) & ~(size_t)15;
    if (m->share) {
        m->w = m->share(m->share_ctx, m->param_count * sizeof(float) + 16);
        m->g = m->share(m->share_ctx, (sums_at + nsums) * sizeof(float));
        if (!m->w || !m->g)
            return mgt_errf(err,
                            "out of memory shared between the ranks for the weights and "
                            "gradients (%zu bytes each); use --transport mpi",
                            (sums_at + nsums) * sizeof(float));
    } else {
        ALLOC(m->w, m->param_count * sizeof(float));
        ALLOC(m->g, (sums_at + nsums) * sizeof(float));
    }
    m->sums = m->g + sums_at;
    ALLOC(m->buf, m->buffer_count * sizeof(float));
    /* labels and one-hot targets per sample: one, or one per position of a sequence output
     * (whose probabilities are not kept: mgt_model_loss) */
    const size_t per = (size_t)(m->labels_per_sample > 1 ? m->labels_per_sample : 1);
    const size_t outs = (size_t)mgt_shape_elems(m->layers[m->nlayers - 1].out);
    ALLOC(m->x, mb * in * sizeof(float));
    ALLOC(m->labels, mb * per * sizeof(int32_t));
    ALLOC(m->targets, per > 1 ? 0 : mb * (size_t)m->classes * sizeof(float));
    ALLOC(m->probs, per > 1 ? 0 : mb * (size_t)m->classes * sizeof(float));
    if (m->loss == MGT_LOSS_BCE && m->ncw) { /* the negative's and positive's weights */
        ALLOC(m->cw_dev, 2 * sizeof(float));
        o->to_device(be, m->cw_dev, m->cw, 2 * sizeof(float));
    }
    ALLOC(m->act, m->plan.arena);
    if (be->act != MGT_F32) { /* the input and the output cross into and out of the type here */
        if (!m->vocab) /* token ids stay float32 (model.h) */
            ALLOC(m->x_act, mb * in * m->act_bytes);
        ALLOC(m->out_f, mb * outs * sizeof(float));
        ALLOC(m->dout_f, mb * outs * sizeof(float));
    }
    m->input_reader = -1;
    for (int i = m->nlayers - 1; i >= 0; i--)
        for (int k = 0; k < m->layers[i].ninputs; k++)
            if (m->layers[i].inputs[k] < 0)
                m->input_reader = i;
    for (int i = 0; i + 1 < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        l->input_view = !m->x_act && l->ninputs == 1 && l->inputs[0] < 0 && l->type->same_bytes &&
                        l->type->same_bytes(l) && (!m->group_of || m->group_of[i] < 0);
    }
#undef ALLOC
    char *arena = (char *)m->act;
    m->grad_acc = m->plan.acc != SIZE_MAX ? (float *)(arena + m->plan.acc) : NULL;
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        const mgt_plan *p = &m->plan;
        l->y = p->y[i] != SIZE_MAX ? (float *)(arena + p->y[i]) : NULL;
        m->dy[i] = p->dy[i] != SIZE_MAX ? (float *)(arena + p->dy[i]) : NULL;
        l->saved = p->saved[i] != SIZE_MAX ? (float *)(arena + p->saved[i]) : NULL;
        l->work = p->work[i] != SIZE_MAX ? (float *)(arena + p->work[i]) : NULL;
        if (l->type->alloc && l->type->alloc(m, l, m->max_batch, err) < 0)
            return -1;
    }
    if (scratch && o->reserve(be, scratch) < 0)
        return mgt_errf(err,
                        "out of %s memory: %zu bytes of convolution workspace; try a "
                        "smaller batch per rank",
                        o->name, scratch);
    return 0;
}

void mgt_model_free(mgt_model *m) {
    if (m->be) {
        const mgt_ops *o = m->be->ops;
        for (int i = 0; i < m->nlayers; i++) {
            mgt_layer *l = &m->layers[i];
            if (l->type->release)
                l->type->release(m, l);
        }
        if (m->share) /* the transport's memory, released with it */
            m->w = m->g = NULL;
        void *ptrs[] = {m->w,   m->g,     m->buf,   m->x,      m->labels, m->targets,
                        m->probs, m->act, m->x_act, m->out_f, m->dout_f, m->cw_dev};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
            o->free(m->be, ptrs[i]);
    }
    mgt_plan_free(&m->plan);
    free(m->dy);
    free(m->needs_grad);
    free(m->groups);
    free(m->group_of);
    free(m->bias_of);
    free(m->params);
    free(m->buffers);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

void mgt_model_init_host(const mgt_model *m, uint64_t seed, float *w, float *buf) {
    memset(w, 0, m->param_count * sizeof(float));
    memset(buf, 0, m->buffer_count * sizeof(float));
    for (int i = 0; i < m->nparams; i++) {
        const mgt_param *p = &m->params[i];
        float *d = w + p->offset;
        if (p->init == MGT_INIT_ONE)
            for (size_t j = 0; j < p->count; j++)
                d[j] = 1.0f;
        if (p->init == MGT_INIT_GLOROT) {
            float limit = sqrtf(6.0f / (p->fan_in + p->fan_out));
            uint64_t key = mgt_key3(seed, 0x494e4954ULL /* "INIT" */, (uint64_t)i);
            for (size_t j = 0; j < p->count; j++)
                d[j] = (2.0f * mgt_uniform(key, j) - 1.0f) * limit;
        }
        if (p->init == MGT_INIT_NORMAL) { /* Box-Muller on two 53-bit uniforms in (0, 1] */
            const uint64_t key = mgt_key3(seed, 0x494e4954ULL, (uint64_t)i);
            for (size_t j = 0; j < p->count; j++) {
                const double u1 = ((double)(mgt_rand64(key, 2 * j) >> 11) + 1.0) * 0x1p-53;
                const double u2 = (double)(mgt_rand64(key, 2 * j + 1) >> 11) * 0x1p-53;
                d[j] = (float)((double)p->std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
            }
        }
    }
    for (int i = 0; i < m->nbuffers; i++)
        if (m->buffers[i].init == MGT_INIT_ONE)
            for (size_t j = 0; j < m->buffers[i].count; j++)
                buf[m->buffers[i].offset + j] = 1.0f;
}

/* The step's rows of a per-sample activation tensor of shape sh (model.h: row0, a chunk's
 * rows), and of a float32 one (the input batch, the output's float copy, the probabilities). */
static float *rows_of(float *base, const mgt_step *s, mgt_shape sh) {
    return mgt_step_rows(base, s, (size_t)mgt_shape_elems(sh));
}

static float *f32_rows(float *base, const mgt_step *s, size_t per_sample) {
    return base ? base + (size_t)s->row0 * per_sample : NULL;
}

static const float *input_of(const mgt_model *m, const mgt_step *s, int j) {
    if (j >= 0 && m->layers[j].input_view)
        j = -1;
    if (j >= 0)
        return rows_of(m->layers[j].y, s, m->layers[j].out);
    return m->x_act ? rows_of(m->x_act, s, m->input)
                    : f32_rows((float *)s->in.x, s, (size_t)mgt_shape_elems(m->input));
}

/* The step's rows of the gradient of layer j's output (NULL: the model's input, or none). */
static float *dy_of(const mgt_model *m, const mgt_step *s, int j) {
    return j >= 0 ? rows_of(m->dy[j], s, m->layers[j].out) : NULL;
}

/* The activation a layer applies itself (the loss may have taken the last layer's over). */
static mgt_act own_act(const mgt_layer *l) {
    return l->fused_act ? MGT_ACT_NONE : l->act;
}

/* A fusion group's forward, run at its tail: the batchnorm's statistics and one pass writing
 * the tail's output, with the residual and the ReLU (fuse.c). */
static void group_forward(mgt_model *m, const mgt_group *g, const mgt_step *s) {
    mgt_layer *bn = &m->layers[g->bn], *tail = &m->layers[g->tail];
    const int cv = m->bias_of[g->bn];
    mgt_fused f = {.act = g->act >= 0 ? MGT_ACT_RELU : MGT_ACT_NONE};
    if (g->add >= 0)
        f.r = input_of(m, s, m->layers[g->add].inputs[g->res]);
    if (cv >= 0) /* its bias, left out of the convolution in training */
        f.shift = m->w + m->params[m->layers[cv].param[1]].offset;
    bn->type->forward_fused(m, bn, s, input_of(m, s, bn->inputs[0]), &f,
                            rows_of(tail->y, s, tail->out));
}

void mgt_model_layer_forward(mgt_model *m, int i, const mgt_step *s) {
    mgt_layer *l = &m->layers[i];
    const int q = m->group_of ? m->group_of[i] : -1;
    if (i == m->input_reader && m->x_act) { /* the step's input into the activation type */
        const size_t per = (size_t)mgt_shape_elems(m->input);
        s->be->ops->act_from_f32(s->be, (size_t)s->n * per, f32_rows((float *)s->in.x, s, per),
                                 rows_of(m->x_act, s, m->input));
    }
    if (q >= 0) { /* a group runs at its tail; its other layers have nothing of their own */
        if (m->groups[q].tail == i)
            group_forward(m, &m->groups[q], s);
        return;
    }
    if (l->input_view)
        return;
    float *y = rows_of(l->y, s, l->out);
    const int row = (int)mgt_shape_elems(l->out);
    if (l->type->identity) { /* y = act(x), one pass (none at all in place without an act) */
        s->be->ops->act_fwd(s->be, own_act(l), s->n, row, input_of(m, s, l->inputs[0]), y);
        return;
    }
    if (l->type->merge) {
        const float *x[MGT_MAX_INPUTS];
        for (int k = 0; k < l->ninputs; k++)
            x[k] = input_of(m, s, l->inputs[k]);
        l->type->forward_n(m, l, s, x, y);
    } else {
        l->type->forward(m, l, s, input_of(m, s, l->inputs[0]), y);
    }
    if (own_act(l) != MGT_ACT_NONE && !(l->type->applies_act && l->type->applies_act(m, l, s->be)))
        s->be->ops->act_fwd(s->be, l->act, s->n, row, y, y);
}

float *mgt_model_output(mgt_model *m, const mgt_step *s) {
    mgt_layer *last = &m->layers[m->nlayers - 1];
    float *y = rows_of(last->y, s, last->out);
    if (!m->out_f)
        return y;
    const int per = (int)mgt_shape_elems(last->out);
    float *out = f32_rows(m->out_f, s, (size_t)per);
    s->be->ops->act_to_f32(s->be, MGT_ACT_NONE, s->n, per, y, out);
    return out;
}

float *mgt_model_forward(mgt_model *m, const mgt_step *s) {
    for (int i = 0; i < m->nlayers; i++)
        mgt_model_layer_forward(m, i, s);
    return mgt_model_output(m, s);
}

size_t mgt_layer_param_range(const mgt_model *m, const mgt_layer *l, size_t *lo) {
    size_t low = (size_t)-1, hi = 0;
    for (int j = 0; j < 4 && !l->frozen; j++)
        if (l->param[j] >= 0) {
            const mgt_param *p = &m->params[l->param[j]];
            low = p->offset < low ? p->offset : low;
            hi = p->offset + p->count > hi ? p->offset + p->count : hi;
        }
    *lo = hi ? low : 0;
    return hi ? hi - low : 0;
}

/* Layer l's gradients to the step's listener. */
static void grads_ready(const mgt_model *m, const mgt_layer *l, const mgt_step *s) {
    size_t lo;
    const size_t count = mgt_layer_param_range(m, l, &lo);
    s->grads_ready(s->grads_ctx, l, lo, count);
}

/* Where a layer's share of input j's gradient goes: straight to j's gradient memory when it is
 * the first to write it (the consumers run from the last), else into the accumulation buffer, to
 * be added (mgt_model_layer_backward's callers). */
typedef struct grad_dest {
    float *dx, *into;
    int acc;
} grad_dest;

static grad_dest dest_of(const mgt_model *m, const mgt_layer *l, const mgt_step *s, int slot) {
    grad_dest d = {dy_of(m, s, l->inputs[slot]), NULL, 0};
    d.acc = d.dx && ((l->accumulate >> slot) & 1);
    d.into = d.acc ? rows_of(m->grad_acc, s, mgt_layer_input_shape(m, l, slot)) : d.dx;
    return d;
}

static void dest_done(const mgt_model *m, const mgt_layer *l, const mgt_step *s, int slot,
                      const grad_dest *d) {
    if (d->acc) /* dx += into: MGT_ACT_NONE's gradient, added */
        s->be->ops->act_bwd(s->be, MGT_ACT_NONE, s->n,
                            (int)mgt_shape_elems(mgt_layer_input_shape(m, l, slot)), NULL, d->into,
                            d->dx, 1);
}

/* A fusion group's backward, run at its tail: the batchnorm's gradients with the ReLU's mask and
 * the residual's gradient in its passes. */
static void group_backward(mgt_model *m, const mgt_group *g, const mgt_step *s) {
    mgt_layer *bn = &m->layers[g->bn], *tail = &m->layers[g->tail];
    mgt_fused f = {.act = g->act >= 0 ? MGT_ACT_RELU : MGT_ACT_NONE};
    if (g->add >= 0) {
        const mgt_layer *a = &m->layers[g->add];
        f.dr = dy_of(m, s, a->inputs[g->res]);
        f.accumulate = f.dr && ((a->accumulate >> g->res) & 1);
        if (mask_from_y(g))
            f.y = rows_of(tail->y, s, tail->out);
    }
    const grad_dest d = dest_of(m, bn, s, 0);
    bn->type->backward_fused(m, bn, s, input_of(m, s, bn->inputs[0]), &f,
                             rows_of(m->dy[tail->index], s, tail->out), d.into);
    dest_done(m, bn, s, 0, &d);
}

/* Layer l's backward: its input gradients go where dest_of says; a merge layer adds its share
 * in place, and so does an identity layer (its activation's gradient straight into dx, in one
 * pass). Inputs that need no gradient get NULL. */
static void layer_backward(mgt_model *m, mgt_layer *l, const mgt_step *s) {
    const mgt_ops *o = s->be->ops;
    float *y = rows_of(l->y, s, l->out), *dy = rows_of(m->dy[l->index], s, l->out);
    const int row = (int)mgt_shape_elems(l->out);
    if (l->type->identity) { /* a GELU's gradient reads its input (backend.h: act_bwd) */
        float *dx = dy_of(m, s, l->inputs[0]);
        const float *fx = mgt_act_bwd_reads_x(l->act) ? input_of(m, s, l->inputs[0]) : y;
        if (dx)
            o->act_bwd(s->be, own_act(l), s->n, row, fx, dy, dx, (int)(l->accumulate & 1));
        return;
    }
    /* else done by its reader, or by the layer's backward */
    if (own_act(l) != MGT_ACT_NONE && !l->relu_grad_by_reader &&
        !(l->type->applies_act_grad && l->type->applies_act_grad(m, l, s->be)))
        o->act_bwd(s->be, l->act, s->n, row, y, dy, dy, 0);
    if (l->type->merge) {
        float *dx[MGT_MAX_INPUTS];
        int acc[MGT_MAX_INPUTS];
        for (int k = 0; k < l->ninputs; k++) {
            dx[k] = dy_of(m, s, l->inputs[k]); /* NULL also where it needs no gradient */
            acc[k] = (int)(l->accumulate >> k) & 1;
        }
        l->type->backward_n(m, l, s, dy, dx, acc);
        return;
    }
    const grad_dest d = dest_of(m, l, s, 0);
    l->type->backward(m, l, s, input_of(m, s, l->inputs[0]), y, dy, d.into);
    dest_done(m, l, s, 0, &d);
}

int mgt_model_layer_backward(mgt_model *m, int i, const mgt_step *s) {
    mgt_layer *l = &m->layers[i];
    if (!m->needs_grad[i])
        return 0;
    const int q = m->group_of ? m->group_of[i] : -1;
    if (q < 0)
        layer_backward(m, l, s);
    else if (m->groups[q].tail == i)
        group_backward(m, &m->groups[q], s);
    /* A group's batchnorm hands its gradients over here, where its place in the file puts it
     * (they were written at the group's tail, earlier): the listeners hear each layer's range
     * from the highest offset down. */
    if (s->grads_ready && mgt_layer_trains(l))
        grads_ready(m, l, s);
    return 1;
}

int mgt_model_layer_inner(const mgt_model *m, int i) {
    const int q = m->group_of ? m->group_of[i] : -1;
    return q >= 0 && m->groups[q].tail != i;
}

int mgt_model_layer_whole(const mgt_model *m, int i) {
    const int q = m->group_of ? m->group_of[i] : -1;
    const mgt_layer *l = &m->layers[i];
    if (q >= 0)
        return m->groups[q].tail == i && !m->layers[m->groups[q].bn].frozen;
    return l->type->forward_fused != NULL && !l->frozen;
}

/* The float-target losses' op settings (backend.h: elem_loss); the class weights in training
 * only (Keras weighs the training loss, not validation's nor evaluate's). */
static mgt_elem_loss elem_loss_of(const mgt_model *m, int training) {
    const mgt_elem_kind kind = m->loss == MGT_LOSS_BCE   ? MGT_ELEM_BCE
                               : m->loss == MGT_LOSS_MSE ? MGT_ELEM_MSE
                               : m->loss == MGT_LOSS_MAE ? MGT_ELEM_MAE
                                                         : MGT_ELEM_HUBER;
    return (mgt_elem_loss){.kind = kind,
                           .smoothing = m->label_smoothing,
                           .delta = m->huber_delta,
                           .cw = training ? m->cw_dev : NULL,
                           .per_label = mgt_model_task_sums(m) > MGT_SUM_LABELS};
}

void mgt_model_loss(mgt_model *m, const mgt_step *s, int backward) {
    const mgt_ops *o = s->be->ops;
    mgt_layer *last = &m->layers[m->nlayers - 1];
    int k = m->classes;
    /* The loss works in float32: the last layer's output, or its float copy (mgt_model_output).
     * With a softmax (sigmoid) last layer the probabilities replace the logits there (what
     * predict reports); with a logits layer they go to a separate buffer and the output stays
     * logits. */
    float *y = mgt_model_output(m, s);
    /* A sequence model scores every position: its n samples are n * T rows of logits, each
     * sample's loss the mean over its positions (scale 1 / T: xent's gradient and sums), and
     * the probabilities are not kept (predict applies the softmax to the logits). */
    const int per = m->labels_per_sample > 1 ? m->labels_per_sample : 1;
    const size_t kk = (size_t)k * (size_t)per;
    float *probs = per > 1 ? NULL : last->fused_act ? y : f32_rows(m->probs, s, (size_t)k);
    float *dy = backward ? rows_of(m->dy[m->nlayers - 1], s, last->out) : NULL;
    float *dlogits = backward && m->dout_f ? f32_rows(m->dout_f, s, kk) : dy;
    const size_t r0 = (size_t)s->row0;
    const int rows = s->n * per;
    const float scale = 1.0f / (float)per;
    if (!mgt_loss_is_xent(m->loss)) {
        const mgt_elem_loss L = elem_loss_of(m, s->training);
        o->elem_loss(s->be, &L, s->n, k, y, s->in.targets + r0 * (size_t)k,
                     last->fused_act ? y : NULL, dlogits, 1.0f, m->sums);
    } else if (m->loss == MGT_LOSS_CE || m->ncw) /* one-hot: categorical, or class-weighted */
        o->xent_dense(s->be, rows, k, y, s->in.targets + r0 * kk, probs, dlogits, scale,
                      m->ncw ? 0.0f : m->label_smoothing, m->sums);
    else
        o->xent_sparse(s->be, rows, k, y, s->in.labels + r0 * (size_t)per, probs, dlogits, scale,
                       m->label_smoothing, m->sums);
    if (dlogits && dlogits != dy) /* the logits' gradient into the activation type */
        o->act_from_f32(s->be, (size_t)rows * (size_t)k, dlogits, dy);
}

void mgt_model_loss_backward(mgt_model *m, const mgt_step *s, int backward) {
    mgt_model_loss(m, s, backward);
    if (!backward)
        return;
    /* File order is an order of computation, so its reverse runs every consumer of a tensor
     * before the layer that made it. Layers with no parameters at or above them are skipped:
     * no gradient reaches anything that needs it. */
    for (int i = m->nlayers - 1; i >= 0; i--)
        mgt_model_layer_backward(m, i, s);
}

void mgt_model_finish_output(mgt_model *m, const mgt_step *s, float *out) {
    mgt_layer *last = &m->layers[m->nlayers - 1];
    if (!last->fused_act)
        return;
    if (last->act == MGT_ACT_SIGMOID) /* out holds the logits in float32 already */
        s->be->ops->act_fwd(s->be, MGT_ACT_SIGMOID, s->n, m->classes, out, out);
    else if (m->out_f) /* the softmax in float32 from the logits as stored */
        s->be->ops->act_to_f32(s->be, MGT_ACT_SOFTMAX, s->n, m->classes,
                               rows_of(last->y, s, last->out), out);
    else
        s->be->ops->act_fwd(s->be, MGT_ACT_SOFTMAX, s->n, m->classes, out, out);
}

static void shape_str(mgt_shape s, char *buf, size_t n) {
    if (s.seq && s.c == 1) /* token ids */
        snprintf(buf, n, "(%d)", s.w);
    else if (s.seq)
        snprintf(buf, n, "(%d, %d)", s.w, s.c);
    else if (s.h == 1 && s.w == 1)
        snprintf(buf, n, "(%d)", s.c);
    else
        snprintf(buf, n, "(%d, %d, %d)", s.h, s.w, s.c);
}

static void commas(size_t v, char *buf, size_t n) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%zu", v);
    size_t len = strlen(tmp), j = 0;
    for (size_t i = 0; i < len && j + 1 < n; i++) {
        if (i && (len - i) % 3 == 0 && j + 2 < n)
            buf[j++] = ',';
        buf[j++] = tmp[i];
    }
    buf[j] = 0;
}

/* bytes in MiB to the nearest tenth, as printf's %.1f rounds (the memory estimate's figures) */
static void mib(size_t bytes, char *buf, size_t n) {
    const size_t tenths = (size_t)((double)bytes / (1 << 20) * 10 + 0.5);
    char whole[32];
    commas(tenths / 10, whole, sizeof whole);
    snprintf(buf, n, "%s.%d MiB", whole, (int)(tenths % 10));
}

/* Keras' table, with the inputs of each layer ("Connected to") since a layer may take any layer
 * above it. Params counts every tensor of the layer, trainable or not (batchnorm's moving mean and
 * variance included, as Keras counts them); the totals then split them. */
void mgt_model_summary(const mgt_model *m, FILE *f) {
    char s[64], c[32];
    const char *rule = "==================================================================="
                       "=================================";
    fprintf(f, "Model: %s (%s)\n", m->name, m->path);
    fprintf(f, "%-36s %-22s %12s  %s\n", "Layer (type)", "Output shape", "Params", "Connected to");
    fprintf(f, "%.*s\n", 100, rule);
    shape_str(m->input, s, sizeof s);
    fprintf(f, "%-36s %-22s %12s\n", "input", s, "0");
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        size_t n = 0;
        for (int j = 0; j < 4; j++)
            if (l->param[j] >= 0)
                n += m->params[l->param[j]].count;
        for (int j = 0; j < 2; j++)
            if (l->buffer[j] >= 0)
                n += m->buffers[l->buffer[j]].count;
        char name[96];
        snprintf(name, sizeof name, "%s (%s)%s", l->name, l->type->name,
                 l->frozen && l->param[0] >= 0 ? " frozen" : "");
        shape_str(l->out, s, sizeof s);
        if (l->act != MGT_ACT_NONE && l->type->has_act) {
            size_t len = strlen(s);
            snprintf(s + len, sizeof s - len, " %s", mgt_act_name(l->act));
        }
        commas(n, c, sizeof c);
        fprintf(f, "%-36s %-22s %12s ", name, s, c);
        for (int k = 0; k < l->ninputs; k++)
            fprintf(f, " %s%s", l->inputs[k] < 0 ? "input" : m->layers[l->inputs[k]].name,
                    k + 1 < l->ninputs ? "," : "");
        fprintf(f, "\n");
    }
    size_t trainable, fixed = 0, frozen;
    const int nfrozen = mgt_model_count_params(m, &trainable, &frozen);
    for (int i = 0; i < m->nbuffers; i++)
        fixed += m->buffers[i].count;
    fprintf(f, "%.*s\n", 100, rule);
    commas(trainable + frozen + fixed, c, sizeof c);
    fprintf(f, "Total params: %s\n", c);
    commas(trainable, c, sizeof c);
    fprintf(f, "Trainable params: %s\n", c);
    commas(fixed + frozen, c, sizeof c);
    if (!nfrozen) {
        fprintf(f, "Non-trainable params: %s (batchnorm moving statistics)\n", c);
        return;
    }
    char fz[32];
    commas(frozen, fz, sizeof fz);
    fprintf(f, "Non-trainable params: %s (%s in %d frozen layer%s%s)\n", c, fz, nfrozen,
            nfrozen == 1 ? "" : "s", fixed ? ", the rest batchnorm moving statistics" : "");
}

void mgt_model_summary_memory(const mgt_model *m, int64_t global_batch, size_t act_bytes,
                              FILE *f) {
    mgt_plan p;
    mgt_err e;
    const int batch = global_batch < INT32_MAX ? (int)global_batch : INT32_MAX;
    mgt_model sized = *m; /* planned for activations of act_bytes (model.h) */
    sized.act_bytes = act_bytes;
    if (mgt_model_plan(&sized, batch, 1, &p, &e) == 0) {
        char a[48], b[48], q[48];
        mib(p.arena, a, sizeof a);
        mib(p.unplanned, b, sizeof b);
        mib(p.live_peak, q, sizeof q);
        fprintf(f,
                "Activation memory of one rank training a batch of %d: %s planned (%s with "
                "a buffer per tensor; at most %s alive at once%s)\n",
                batch, a, b, q, act_bytes == 2 ? "; bfloat16 activations" : "");
        mgt_plan_free(&p);
    }
}

static void entry(mgt_tensor_entry *e, const mgt_param *p, const float *base) {
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", p->name);
    e->ndim = p->ndim;
    for (int i = 0; i < p->ndim; i++)
        e->shape[i] = p->shape[i];
    e->data = base + p->offset;
}

int mgt_model_weights_entries(const mgt_model *m, const float *w, const float *buf,
                              mgt_tensor_entry *out, int max) {
    int n = 0;
    /* Layer by layer, each layer's parameters then its buffers (PyTorch's state_dict order). */
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        for (int j = 0; j < 4 && n < max; j++)
            if (l->param[j] >= 0)
                entry(&out[n++], &m->params[l->param[j]], w);
        for (int j = 0; j < 2 && n < max; j++)
            if (l->buffer[j] >= 0)
                entry(&out[n++], &m->buffers[l->buffer[j]], buf);
    }
    return n;
}

static int take(const mgt_param *p, const mgt_safetensors *st, const char *path, const char *model,
                float *dst, mgt_err *err) {
    const mgt_tensor_entry *e = mgt_safetensors_find(st, p->name);
    if (!e)
        return mgt_errf(err,
                        "%s has no tensor '%s', which model %s needs: it was saved from "
                        "another model; pass weights saved from this model file",
                        path, p->name, model);
    int same = e->ndim == p->ndim;
    for (int i = 0; same && i < p->ndim; i++)
        same = e->shape[i] == p->shape[i];
    if (!same) {
        char a[96] = "", b[96] = "";
        for (int i = 0; i < e->ndim; i++)
            snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", i ? "," : "",
                     (long long)e->shape[i]);
        for (int i = 0; i < p->ndim; i++)
            snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", i ? "," : "",
                     (long long)p->shape[i]);
        return mgt_errf(err,
                        "%s: tensor '%s' has shape [%s] but model %s needs [%s]; the "
                        "weights come from a different model file",
                        path, p->name, a, model, b);
    }
    /* A NaN or an infinity would surface only as "the loss became NaN" steps later. */
    for (size_t i = 0; i < p->count; i++)
        if (!isfinite(e->data[i]))
            return mgt_errf(err,
                            "%s: tensor '%s' holds %s at index %zu: the weights are damaged or "
                            "come from a run that diverged; pass weights with finite values",
                            path, p->name, isnan(e->data[i]) ? "a NaN" : "an infinity", i);
    memcpy(dst + p->offset, e->data, p->count * sizeof(float));
    return 0;
}

int mgt_model_take_weights(const mgt_model *m, const mgt_safetensors *st, const char *path,
                           float *w, float *buf, mgt_err *err) {
    for (int i = 0; i < m->nparams; i++)
        if (take(&m->params[i], st, path, m->name, w, err) < 0)
            return -1;
    for (int i = 0; i < m->nbuffers; i++)
        if (take(&m->buffers[i], st, path, m->name, buf, err) < 0)
            return -1;
    /* Anything else in the file must be optimizer state (checkpoints); a stray layer tensor
     * means the file belongs to another model. */
    for (int i = 0; i < st->nt; i++) {
        const char *name = st->t[i].name;
        if (!strncmp(name, "optimizer.", 10))
            continue;
        int known = 0;
        for (int j = 0; j < m->nparams && !known; j++)
            known = !strcmp(m->params[j].name, name);
        for (int j = 0; j < m->nbuffers && !known; j++)
            known = !strcmp(m->buffers[j].name, name);
        if (!known)
            return mgt_errf(err,
                            "%s holds tensor '%s', which model %s does not have: the "
                            "weights come from a different model file",
                            path, name, m->name);
    }
    return 0;
}

int mgt_model_load_weights(const mgt_model *m, const char *path, float *w, float *buf,
                           mgt_err *err) {
    mgt_safetensors st;
    if (mgt_safetensors_read(path, &st, err) < 0)
        return -1;
    int rc = mgt_model_take_weights(m, &st, path, w, buf, err);
    mgt_safetensors_free(&st);
    return rc;
}

int mgt_model_task_sums(const mgt_model *m) {
    if (m->loss == MGT_LOSS_BCE)
        return MGT_SUM_LABELS +
               (m->classes > 1 && m->classes <= MGT_LABEL_SUMS_MAX ? 3 * m->classes : 0);
    return mgt_loss_is_regression(m->loss) ? 2 : 0;
}
