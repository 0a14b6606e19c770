/* model.c: parameter arenas, the activation memory plan, forward and backward over the layer
 * graph, the summary table, and weights in PyTorch's names and layouts. */
#include "model.h"

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
 * Timeline of one training step with L layers: layer i's forward runs at time i, the loss at L,
 * layer i's backward at 2L - i. Every block of memory has a span [start, end] of times:
 *   - layer i's output: from its forward to the last time anything reads it: the forward of its
 *     last consumer, the backward of a consumer that reads its input there (MGT_BWD_READS_X),
 *     layer i's own backward when its activation reads y, and the end of the step for the last
 *     layer (the loss and the caller read it). A layer that may work in place (inplace) shares
 *     its input's block when it is that input's only consumer and nothing reads the input
 *     later; the block's span then covers both.
 *   - the gradient of layer i's output: from the backward of its last consumer (the loss for the
 *     last layer), which writes it, to layer i's backward, which reads it;
 *   - a layer's saved tensor: its forward to its backward; its work tensor: its backward;
 *   - the accumulation buffer: the backward steps in which a consumer other than a tensor's last
 *     computes its share of the tensor's gradient, to be added in.
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

/* Whether layer l's output gradient is needed: it or a layer above it has parameters. */
static void needs_grad_of(const mgt_model *m, int *ng) {
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        ng[i] = l->param[0] >= 0;
        for (int k = 0; k < l->ninputs; k++)
            if (l->inputs[k] >= 0 && ng[l->inputs[k]])
                ng[i] = 1;
    }
}

static int reads_own_y(const mgt_layer *l) {
    return l->act != MGT_ACT_NONE && !l->fused_act;
}

void mgt_plan_free(mgt_plan *p) {
    free(p->y);
    free(p->dy);
    free(p->saved);
    free(p->work);
    free(p->y_from);
    memset(p, 0, sizeof *p);
}

int mgt_model_plan(const mgt_model *m, int batch, int share, mgt_plan *p, mgt_err *err) {
    const int L = m->nlayers, T_END = 2 * L + 1;
    const size_t nb = (size_t)(batch > 0 ? batch : 1);
    memset(p, 0, sizeof *p);
    p->acc = SIZE_MAX;
    /* Blocks: per layer its output (if it owns it), gradient, saved and work; one more for the
     * accumulation buffer. blk[4 * i + kind]; -1 where a layer has none. */
    int *ng = calloc((size_t)L, sizeof *ng), *last_use = calloc((size_t)L, sizeof *last_use);
    int *blk = malloc(sizeof *blk * (size_t)(4 * L + 1));
    block *bl = calloc((size_t)(4 * L + 1), sizeof *bl);
    int *order = malloc(sizeof *order * (size_t)(4 * L + 1));
    const block **near = malloc(sizeof *near * (size_t)(4 * L + 1));
    p->y = malloc(sizeof *p->y * (size_t)L);
    p->dy = malloc(sizeof *p->dy * (size_t)L);
    p->saved = malloc(sizeof *p->saved * (size_t)L);
    p->work = malloc(sizeof *p->work * (size_t)L);
    p->y_from = malloc(sizeof *p->y_from * (size_t)L);
    if (!ng || !last_use || !blk || !bl || !order || !near || !p->y || !p->dy || !p->saved ||
        !p->work || !p->y_from) {
        free(ng), free(last_use), free(blk), free(bl), free(order), free(near);
        mgt_plan_free(p);
        return mgt_errf(err, "out of host memory planning the activations of %d layers", L);
    }
    needs_grad_of(m, ng);
    /* The last time each output is read (see the comment above). */
    for (int i = 0; i < L; i++) {
        const mgt_layer *l = &m->layers[i];
        last_use[i] = i == L - 1 ? T_END : i;
        if (reads_own_y(l) && ng[i])
            last_use[i] = 2 * L - i > last_use[i] ? 2 * L - i : last_use[i];
    }
    for (int j = 0; j < L; j++) {
        const mgt_layer *l = &m->layers[j];
        for (int k = 0; k < l->ninputs; k++) {
            const int i = l->inputs[k];
            if (i < 0)
                continue;
            int t = j;
            if ((l->type->bwd_reads & MGT_BWD_READS_X) && ng[j])
                t = 2 * L - j;
            last_use[i] = t > last_use[i] ? t : last_use[i];
        }
    }
    int n = 0;
    for (int i = 0; i < L; i++) {
        const mgt_layer *l = &m->layers[i];
        const size_t ybytes = align_up(nb * (size_t)mgt_shape_elems(l->out) * sizeof(float));
        for (int kind = 0; kind < 4; kind++)
            blk[4 * i + kind] = -1;
        p->unplanned += ybytes;
        /* In place: the input's block, when this layer is its only reader from now on. */
        const int in = l->ninputs == 1 ? l->inputs[0] : -1;
        if (share && l->type->inplace && in >= 0 && m->layers[in].consumers == 1 &&
            last_use[in] == i) {
            p->y_from[i] = p->y_from[in];
            block *b = &bl[blk[4 * p->y_from[i]]];
            b->end = last_use[i] > b->end ? last_use[i] : b->end;
        } else {
            p->y_from[i] = i;
            blk[4 * i] = n;
            bl[n++] = (block){ybytes, 0, i, last_use[i]};
        }
        size_t saved = 0, work = 0;
        if (l->type->temps)
            l->type->temps(l, &saved, &work);
        if (saved) {
            blk[4 * i + 2] = n;
            bl[n++] = (block){align_up(nb * saved * sizeof(float)), 0, i, ng[i] ? 2 * L - i : i};
            p->unplanned += bl[n - 1].bytes;
        }
        if (work && ng[i]) {
            blk[4 * i + 3] = n;
            bl[n++] = (block){align_up(nb * work * sizeof(float)), 0, 2 * L - i, 2 * L - i};
            p->unplanned += bl[n - 1].bytes;
        }
    }
    /* Gradients: written first by the last consumer (the loss for the last layer), read by the
     * layer's own backward. A consumer that is not the first to write, and not a merge (which
     * adds in place), computes its share into the accumulation buffer. */
    size_t acc_bytes = 0;
    int acc_start = T_END, acc_end = 0;
    for (int i = 0; i < L; i++) {
        if (!ng[i])
            continue;
        int first = i == L - 1 ? L : T_END; /* when the first writer runs */
        for (int j = L - 1; j > i; j--) {   /* the consumers in backward order */
            const mgt_layer *c = &m->layers[j];
            for (int k = 0; k < c->ninputs; k++)
                if (c->inputs[k] == i) {
                    const int t = 2 * L - j;
                    if (first < T_END && !c->type->merge) { /* not the first writer */
                        const size_t b =
                            nb * (size_t)mgt_shape_elems(m->layers[i].out) * sizeof(float);
                        acc_bytes = b > acc_bytes ? b : acc_bytes;
                        acc_start = t < acc_start ? t : acc_start;
                        acc_end = t > acc_end ? t : acc_end;
                    }
                    first = t < first ? t : first;
                }
        }
        blk[4 * i + 1] = n;
        bl[n++] = (block){align_up(nb * (size_t)mgt_shape_elems(m->layers[i].out) * sizeof(float)),
                          0, first, 2 * L - i};
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
        p->y[i] = SIZE_MAX;
        p->dy[i] = blk[4 * i + 1] >= 0 ? bl[blk[4 * i + 1]].off : SIZE_MAX;
        p->saved[i] = blk[4 * i + 2] >= 0 ? bl[blk[4 * i + 2]].off : SIZE_MAX;
        p->work[i] = blk[4 * i + 3] >= 0 ? bl[blk[4 * i + 3]].off : SIZE_MAX;
    }
    for (int i = 0; i < L; i++)
        p->y[i] = bl[blk[4 * p->y_from[i]]].off;
    if (acc_blk >= 0)
        p->acc = bl[acc_blk].off;
    free(ng), free(last_use), free(blk), free(bl), free(order), free(near);
    return 0;
}

/* Which input slots add their gradient to one already written (see mgt_layer.accumulate):
 * consumers run backward from the last, and within a merge layer slot by slot, so a slot
 * accumulates when a later layer, or an earlier slot of the same layer, takes the same input. */
static void set_accumulate(mgt_model *m) {
    for (int j = 0; j < m->nlayers; j++) {
        mgt_layer *l = &m->layers[j];
        l->accumulate = 0;
        for (int k = 0; k < l->ninputs; k++) {
            const int i = l->inputs[k];
            int before = 0;
            for (int q = 0; q < k && !before; q++)
                before = l->inputs[q] == i;
            for (int q = j + 1; q < m->nlayers && !before && i >= 0; q++)
                for (int r = 0; r < m->layers[q].ninputs && !before; r++)
                    before = m->layers[q].inputs[r] == i;
            if (before && i >= 0)
                l->accumulate |= 1u << k;
        }
    }
}

int mgt_model_alloc(mgt_model *m, mgt_backend *be, int max_batch, mgt_err *err) {
    const mgt_ops *o = be->ops;
    if (mgt_model_check_batch(m, max_batch, err) < 0)
        return -1;
    m->be = be;
    m->max_batch = max_batch < 1 ? 1 : max_batch;
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
    if (!m->dy || !m->needs_grad)
        return mgt_errf(err, "out of host memory for the layer table of %d layers", m->nlayers);
    needs_grad_of(m, m->needs_grad);
    set_accumulate(m);
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
     * both. */
    size_t sums_at = (m->param_count + 15) & ~(size_t)15;
    if (m->share) {
        m->w = m->share(m->share_ctx, m->param_count * sizeof(float) + 16);
        m->g = m->share(m->share_ctx, (sums_at + 16) * sizeof(float));
        if (!m->w || !m->g)
            return mgt_errf(err,
                            "out of memory shared between the ranks for the weights and "
                            "gradients (%zu bytes each); use --transport mpi",
                            (sums_at + 16) * sizeof(float));
    } else {
        ALLOC(m->w, m->param_count * sizeof(float));
        ALLOC(m->g, (sums_at + 16) * sizeof(float));
    }
    m->sums = m->g + sums_at;
    ALLOC(m->buf, m->buffer_count * sizeof(float));
    ALLOC(m->x, mb * in * sizeof(float));
    ALLOC(m->labels, mb * sizeof(int32_t));
    ALLOC(m->targets, mb * (size_t)m->classes * sizeof(float));
    ALLOC(m->probs, mb * (size_t)m->classes * sizeof(float));
    ALLOC(m->act, m->plan.arena);
#undef ALLOC
    char *arena = (char *)m->act;
    m->grad_acc = m->plan.acc != SIZE_MAX ? (float *)(arena + m->plan.acc) : NULL;
    for (int i = 0; i < m->nlayers; i++) {
        mgt_layer *l = &m->layers[i];
        const mgt_plan *p = &m->plan;
        l->y = (float *)(arena + p->y[i]);
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
        void *ptrs[] = {m->w, m->g, m->buf, m->x, m->labels, m->targets, m->probs, m->act};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
            o->free(m->be, ptrs[i]);
    }
    mgt_plan_free(&m->plan);
    free(m->dy);
    free(m->needs_grad);
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
    }
    for (int i = 0; i < m->nbuffers; i++)
        if (m->buffers[i].init == MGT_INIT_ONE)
            for (size_t j = 0; j < m->buffers[i].count; j++)
                buf[m->buffers[i].offset + j] = 1.0f;
}

/* The step's rows of a per-sample tensor of shape sh (model.h: row0, a chunk's rows). */
static float *rows_of(float *base, const mgt_step *s, mgt_shape sh) {
    return mgt_step_rows(base, s, (size_t)mgt_shape_elems(sh));
}

static const float *input_of(const mgt_model *m, const mgt_step *s, int j) {
    return j < 0 ? rows_of((float *)s->in.x, s, m->input)
                 : rows_of(m->layers[j].y, s, m->layers[j].out);
}

/* The step's rows of the gradient of layer j's output (NULL: the model's input, or none). */
static float *dy_of(const mgt_model *m, const mgt_step *s, int j) {
    return j >= 0 ? rows_of(m->dy[j], s, m->layers[j].out) : NULL;
}

void mgt_model_layer_forward(mgt_model *m, int i, const mgt_step *s) {
    mgt_layer *l = &m->layers[i];
    float *y = rows_of(l->y, s, l->out);
    if (l->type->merge) {
        const float *x[MGT_MAX_INPUTS];
        for (int k = 0; k < l->ninputs; k++)
            x[k] = input_of(m, s, l->inputs[k]);
        l->type->forward_n(m, l, s, x, y);
    } else {
        l->type->forward(m, l, s, input_of(m, s, l->inputs[0]), y);
    }
    if (l->act != MGT_ACT_NONE && !l->fused_act)
        s->be->ops->act_fwd(s->be, l->act, s->n, (int)mgt_shape_elems(l->out), y);
}

float *mgt_model_forward(mgt_model *m, const mgt_step *s) {
    for (int i = 0; i < m->nlayers; i++)
        mgt_model_layer_forward(m, i, s);
    return m->layers[m->nlayers - 1].y;
}

size_t mgt_layer_param_range(const mgt_model *m, const mgt_layer *l, size_t *lo) {
    size_t low = (size_t)-1, hi = 0;
    for (int j = 0; j < 4; j++)
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

/* Layer l's backward: its input gradients go straight to the inputs' gradient memory when it
 * is the first to write them (the consumers run from the last), otherwise a merge layer adds
 * its share in place and any other layer computes it into the accumulation buffer, which is
 * then added. Inputs that need no gradient get NULL. */
static void layer_backward(mgt_model *m, mgt_layer *l, const mgt_step *s) {
    const mgt_ops *o = s->be->ops;
    float *y = rows_of(l->y, s, l->out), *dy = rows_of(m->dy[l->index], s, l->out);
    if (l->act != MGT_ACT_NONE && !l->fused_act)
        o->act_bwd(s->be, l->act, s->n, (int)mgt_shape_elems(l->out), y, dy);
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
    const int j = l->inputs[0];
    float *dx = dy_of(m, s, j);
    const int acc = dx && (l->accumulate & 1);
    float *into = acc ? rows_of(m->grad_acc, s, l->in) : dx;
    l->type->backward(m, l, s, input_of(m, s, j), y, dy, into);
    if (acc)
        o->add(s->be, (size_t)s->n * (size_t)mgt_shape_elems(l->in), into, dx);
}

int mgt_model_layer_backward(mgt_model *m, int i, const mgt_step *s) {
    mgt_layer *l = &m->layers[i];
    if (!m->needs_grad[i])
        return 0;
    layer_backward(m, l, s);
    if (s->grads_ready && l->param[0] >= 0)
        grads_ready(m, l, s);
    return 1;
}

void mgt_model_loss(mgt_model *m, const mgt_step *s, int backward) {
    const mgt_ops *o = s->be->ops;
    mgt_layer *last = &m->layers[m->nlayers - 1];
    int k = m->classes;
    /* With a softmax last layer the probabilities replace the logits in its output (what predict
     * reports); with a logits layer they go to a separate buffer and the output stays logits. */
    float *y = rows_of(last->y, s, last->out);
    float *probs = last->fused_act ? y : rows_of(m->probs, s, last->out);
    float *dlogits = backward ? rows_of(m->dy[m->nlayers - 1], s, last->out) : NULL;
    const size_t r0 = (size_t)s->row0;
    if (m->loss == MGT_LOSS_SPARSE_CE)
        o->xent_sparse(s->be, s->n, k, y, s->in.labels + r0, probs, dlogits, 1.0f,
                       m->label_smoothing, m->sums);
    else
        o->xent_dense(s->be, s->n, k, y, s->in.targets + r0 * (size_t)k, probs, dlogits, 1.0f,
                      m->label_smoothing, m->sums);
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
    if (last->fused_act)
        s->be->ops->act_fwd(s->be, MGT_ACT_SOFTMAX, s->n, m->classes, out);
}

static void shape_str(mgt_shape s, char *buf, size_t n) {
    if (s.h == 1 && s.w == 1)
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

static void mib(size_t bytes, char *buf, size_t n) {
    const double v = (double)bytes / (1 << 20);
    char whole[32];
    commas((size_t)v, whole, sizeof whole);
    snprintf(buf, n, "%s.%d MiB", whole, (int)((v - (double)(size_t)v) * 10));
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
        char name[80];
        snprintf(name, sizeof name, "%s (%s)", l->name, l->type->name);
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
    size_t trainable = 0, fixed = 0;
    for (int i = 0; i < m->nparams; i++)
        trainable += m->params[i].count;
    for (int i = 0; i < m->nbuffers; i++)
        fixed += m->buffers[i].count;
    fprintf(f, "%.*s\n", 100, rule);
    commas(trainable + fixed, c, sizeof c);
    fprintf(f, "Total params: %s\n", c);
    commas(trainable, c, sizeof c);
    fprintf(f, "Trainable params: %s\n", c);
    commas(fixed, c, sizeof c);
    fprintf(f, "Non-trainable params: %s (batchnorm moving statistics)\n", c);
}

void mgt_model_summary_memory(const mgt_model *m, int64_t global_batch, FILE *f) {
    mgt_plan p;
    mgt_err e;
    const int batch = global_batch < INT32_MAX ? (int)global_batch : INT32_MAX;
    if (mgt_model_plan(m, batch, 1, &p, &e) == 0) {
        char a[48], b[48], q[48];
        mib(p.arena, a, sizeof a);
        mib(p.unplanned, b, sizeof b);
        mib(p.live_peak, q, sizeof q);
        fprintf(f,
                "Activation memory of one rank training a batch of %d: %s planned (%s with "
                "a buffer per tensor; at most %s alive at once)\n",
                batch, a, b, q);
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
