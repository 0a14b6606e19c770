/* repro.c: chunked steps and exact sums for --reproducible (see repro.h). */
#include "repro.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exactsum.h"
#include "runtime.h"

/* The accumulators live in backend memory, in one block so the step's all-reduce is one
 * collective: the gradient arena's (grad_count elements), then the step's m->nsums metric sums
 * (model.h: the loss op's, then the stop votes), then one counter of values that could not be summed. Batchnorm's
 * sums have their own small block of the same shape (2c elements and a counter), reduced where
 * the layer needs them. */
struct mgt_repro {
    mgt_model *m;
    mgt_comm *comm;
    int64_t chunk;
    int64_t *words;    /* [grad_count + nsums][MGT_XS_WORDS], then the counter */
    size_t nwords;     /* all of it, counter included */
    int64_t *bn_words; /* [2 * widest batchnorm][MGT_XS_WORDS], then the counter */
    float *part;       /* one chunk's batchnorm partial sums (2c) */
    int bn_c;          /* the widest batchnorm's channels */
    /* Where backend memory is not host memory (a GPU), the words cross MPI through this host
     * copy, as large as `words` (NULL on the CPU backend). */
    int64_t *host;
};

/* The metric sums (model.h: nsums of them): the loss op adds to all but the last, which is the
 * ranks' stop votes (fit.c). */
static size_t sums_from_loss(const mgt_model *m) {
    return (size_t)m->nsums - 1;
}

/* The layer types whose ops treat every sample alone (so a chunk's rows give the same results
 * wherever the chunk sits), and batchnorm, which sums over samples through the hooks below. */
static const char *const chunkable[] = {
    "dense",          "conv2d",  "depthwise_conv2d", "separable_conv2d", "maxpool",    "avgpool",
    "global_avgpool", "zeropad", "dropout",          "flatten",          "activation", "add",
    "concat",         "embedding", "layernorm",      "attention",        NULL};

static int is_batchnorm(const mgt_layer *l) {
    return !strcmp(l->type->name, "batchnorm");
}

/* What the run asks for besides the mode that the mode cannot honour (see repro.h), or 0. */
static int check_run(const mgt_repro_opts *o, mgt_err *err) {
    if (o->zero)
        return mgt_errf(err, "--reproducible and --zero 1 exclude each other: the exact all-reduce "
                             "gives every rank the whole gradient; train with --zero 0, or without "
                             "--reproducible");
    if (o->validation_decider)
        return mgt_errf(err,
                        "--reproducible does not go with %s: it acts on validation figures, "
                        "which are not computed bit for bit alike on every rank count; drop it, "
                        "or train without --reproducible",
                        o->validation_decider);
    return 0;
}

int mgt_repro_check(const mgt_model *m, const mgt_backend *be, const mgt_repro_opts *o,
                    mgt_err *err) {
    const int64_t chunk = o->chunk, batch = o->batch;
    if (!be->ops->xs_add || !be->ops->xs_round)
        return mgt_errf(err,
                        "--reproducible is not available on the %s backend yet; train with "
                        "--device cpu, or without --reproducible",
                        be->ops->name);
    if (check_run(o, err) < 0)
        return -1;
    /* Every chunk of every micro-batch of a step adds once to each gradient accumulator. */
    const int64_t accum = o->accum_steps > 1 ? o->accum_steps : 1;
    const int64_t chunks = (batch + chunk - 1) / chunk * accum;
    if (chunks > MGT_XS_MAX_TERMS)
        return mgt_errf(err,
                        "--reproducible: a step of %lld x %lld samples makes %lld chunks of "
                        "%lld, more than the %d an exact sum can take; raise --repro-chunk to "
                        "at least %lld",
                        (long long)accum, (long long)batch, (long long)chunks, (long long)chunk,
                        MGT_XS_MAX_TERMS,
                        (long long)((batch * accum + MGT_XS_MAX_TERMS - 1) / MGT_XS_MAX_TERMS));
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        if (is_batchnorm(l)) {
            if (!l->cfg.sync && !l->frozen) /* frozen: per sample, moving statistics */
                return mgt_errf(err,
                                "--reproducible: batchnorm layer '%s' normalises with each "
                                "rank's own statistics, which depend on the rank count; set "
                                "sync = true in its section of %s",
                                l->name, m->path);
            continue;
        }
        int known = 0;
        for (int k = 0; chunkable[k] && !known; k++)
            known = !strcmp(l->type->name, chunkable[k]);
        if (!known)
            return mgt_errf(err,
                            "--reproducible does not support layer '%s' (%s) yet; train "
                            "this model without --reproducible",
                            l->name, l->type->name);
    }
    return 0;
}

mgt_repro *mgt_repro_create(mgt_model *m, mgt_comm *comm, int64_t chunk, mgt_err *err) {
    mgt_backend *be = m->be;
    mgt_repro *r = calloc(1, sizeof *r);
    if (!r) {
        mgt_errf(err, "out of host memory");
        return NULL;
    }
    r->m = m;
    r->comm = comm;
    r->chunk = chunk;
    for (int i = 0; i < m->nlayers; i++)
        if (is_batchnorm(&m->layers[i]) && m->layers[i].in.c > r->bn_c)
            r->bn_c = m->layers[i].in.c;
    r->nwords = (m->grad_count + (size_t)m->nsums) * MGT_XS_WORDS + 1;
    const size_t part = (size_t)(2 * r->bn_c > 2 ? 2 * r->bn_c : 2);
    r->words = be->ops->alloc(be, r->nwords * sizeof(int64_t));
    r->bn_words = be->ops->alloc(be, (part * MGT_XS_WORDS + 1) * sizeof(int64_t));
    r->part = be->ops->alloc(be, part * sizeof(float));
    /* staging (stage) exists only where backend memory is not the host's (backend.h) */
    const int via_host = be->ops->stage != NULL && comm->world > 1;
    const size_t words_bytes = r->nwords * sizeof(int64_t),
                 bn_bytes = (part * MGT_XS_WORDS + 1) * sizeof(int64_t);
    if (via_host)
        r->host = malloc(words_bytes > bn_bytes ? words_bytes : bn_bytes);
    if (!r->words || !r->bn_words || !r->part || (via_host && !r->host)) {
        mgt_errf(err,
                 "out of %s memory for --reproducible's accumulators (%zu MiB); use a "
                 "smaller model or train without --reproducible",
                 be->ops->name, r->nwords * sizeof(int64_t) >> 20);
        mgt_repro_free(r);
        return NULL;
    }
    return r;
}

void mgt_repro_free(mgt_repro *r) {
    if (!r)
        return;
    mgt_backend *be = r->m->be;
    be->ops->free(be, r->words);
    be->ops->free(be, r->bn_words);
    be->ops->free(be, r->part);
    free(r->host);
    free(r);
}

void mgt_repro_describe(const mgt_repro *r, int64_t batch, char *buf, size_t n) {
    const int64_t b = batch, c = r->chunk;
    const double kib = (double)(r->nwords * sizeof(int64_t)) / 1024;
    snprintf(buf, n,
             "reproducible: %lld chunks of %lld samples (the last %lld) per batch, exact "
             "integer sums; one all-reduce of %.1f %s after backward",
             (long long)((b + c - 1) / c), (long long)c, (long long)(b - (b - 1) / c * c),
             kib < 1024 ? kib : kib / 1024, kib < 1024 ? "KiB" : "MiB");
}

/* ---- chunks ---- */

/* A rank's rows start on a chunk boundary (mgt_shard_chunks), so its chunks start every
 * `chunk` rows and only its last may be shorter (the global batch's remainder). */
static int chunks_of(const mgt_step *s) {
    const int64_t c = s->repro->chunk;
    return (int)((s->n + c - 1) / c);
}

/* Chunk i of the step as a step of its own (model.h: row0): its rows, and its first sample's
 * global position (dropout keys). */
static mgt_step chunk_step(const mgt_step *s, int i) {
    const int64_t c = s->repro->chunk, row0 = (int64_t)i * c;
    mgt_step q = *s;
    q.n = (int)(s->n - row0 < c ? s->n - row0 : c);
    q.first_sample = s->first_sample + row0;
    q.row0 = s->row0 + row0;
    return q;
}

float *mgt_repro_forward(mgt_model *m, const mgt_step *s) {
    const int nch = chunks_of(s);
    for (int i = 0; i < m->nlayers; i++) {
        if (mgt_model_layer_whole(m, i) && s->training) { /* sums over the batch: chunked inside */
            mgt_model_layer_forward(m, i, s);
            continue;
        }
        for (int k = 0; k < nch; k++) {
            const mgt_step q = chunk_step(s, k);
            mgt_model_layer_forward(m, i, &q);
        }
    }
    return mgt_model_output(m, s);
}

/* Adds n floats of backend memory at `from` into the accumulators of arena elements starting
 * at `at` (the metric sums count as elements grad_count, grad_count + 1, ...). */
static void add_arena(mgt_repro *r, const mgt_backend *be, size_t at, size_t n, const float *from) {
    be->ops->xs_add((mgt_backend *)be, n, from, r->words + at * MGT_XS_WORDS,
                    r->words + r->nwords - 1);
}

void mgt_repro_backward(mgt_model *m, const mgt_step *s, int first) {
    mgt_repro *r = s->repro;
    mgt_backend *be = s->be;
    const mgt_ops *o = be->ops;
    const int nch = chunks_of(s);
    if (first)
        o->zero(be, r->words, r->nwords * sizeof(int64_t));
    /* The loss: each chunk's sums alone in m->sums (the votes after them left as they are),
     * then into the accumulators. */
    for (int c = 0; c < nch; c++) {
        const mgt_step q = chunk_step(s, c);
        o->zero(be, m->sums, sums_from_loss(m) * sizeof(float));
        mgt_model_loss(m, &q, 1);
        add_arena(r, be, m->grad_count, sums_from_loss(m), m->sums);
    }
    o->zero(be, m->sums, sums_from_loss(m) * sizeof(float));
    /* Backward in the executor's order, each layer over every chunk; a layer's gradients
     * (which backward overwrites, backend.h) go into the accumulators after each chunk. */
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const mgt_layer *l = &m->layers[i];
        if (mgt_model_layer_inner(m, i)) /* its group's tail did its part */
            continue;
        if (mgt_model_layer_whole(m, i)) { /* accumulates its own gradients (mgt_repro_bn_grads) */
            mgt_model_layer_backward(m, i, s);
            continue;
        }
        /* A layer that adds to a tied tensor's gradient (model.h: tied) adds to zeros here,
         * its own share alone; a tied layer's share of the tensor is summed as its own. */
        size_t lo, tlo = 0, tcount = 0;
        const size_t count = mgt_layer_param_range(m, l, &lo);
        if (mgt_layer_trains_tied(m, l))
            tlo = m->params[l->tied].offset, tcount = m->params[l->tied].count;
        for (int c = 0; c < nch; c++) {
            const mgt_step q = chunk_step(s, c);
            if (l->grad_accumulate && count)
                o->zero(be, m->g + lo, count * sizeof(float));
            if (!mgt_model_layer_backward(m, i, &q))
                continue;
            if (count)
                add_arena(r, be, lo, count, m->g + lo);
            if (tcount)
                add_arena(r, be, tlo, tcount, m->g + tlo);
        }
    }
}

/* ---- exact all-reduce ---- */

/* The words w (backend memory) summed over the ranks as integers, through r->host where the
 * backend's memory is a device's. */
static void allreduce_words(const mgt_repro *r, int64_t *w, size_t count, const char *what) {
    mgt_comm *c = r->comm;
    mgt_backend *be = r->m->be;
    if (c->world == 1)
        return;
    int64_t *h = r->host ? r->host : w;
    if (r->host)
        be->ops->to_host(be, h, w, count * sizeof(int64_t));
    mgt_comm_enter(c, what);
    for (size_t off = 0; off < count; off += INT_MAX) {
        const size_t n = count - off < INT_MAX ? count - off : INT_MAX;
        const int rc = MPI_Allreduce(MPI_IN_PLACE, h + off, (int)n, MPI_INT64_T, MPI_SUM, c->mpi);
        if (rc != MPI_SUCCESS)
            mgt_die("MPI_Allreduce failed during %s (code %d)", what, rc);
    }
    mgt_comm_leave(c);
    if (r->host)
        be->ops->to_device(be, w, h, count * sizeof(int64_t));
}

/* The counter after an all-reduce: the same on every rank, so every rank stops alike. */
static void check_bad(const mgt_backend *be, const int64_t *counter, const char *what,
                      int64_t step) {
    int64_t bad = 0;
    be->ops->to_host((mgt_backend *)be, &bad, counter, sizeof bad);
    if (bad)
        mgt_die_all("step %lld: %lld %s not finite or of magnitude 2^64 or more, which "
                    "--reproducible cannot sum exactly: training stopped, nothing was saved over "
                    "the last checkpoint; lower --lr or check the data",
                    (long long)step, (long long)bad, what);
}

void mgt_repro_allreduce(mgt_repro *r, int64_t step) {
    mgt_model *m = r->m;
    mgt_backend *be = m->be;
    const size_t votes = sums_from_loss(m);
    add_arena(r, be, m->grad_count + votes, 1, m->sums + votes); /* this rank's vote */
    allreduce_words(r, r->words, r->nwords, "gradient all-reduce (exact)");
    check_bad(be, r->words + r->nwords - 1, "gradient or loss values were", step);
    be->ops->xs_round(be, m->grad_count, r->words, m->g);
    be->ops->xs_round(be, (size_t)m->nsums, r->words + m->grad_count * MGT_XS_WORDS, m->sums);
}

/* ---- batchnorm ---- */

/* The batchnorm block's words: zeroed, for n sums. */
static int64_t *bn_begin(mgt_repro *r, const mgt_backend *be, size_t n) {
    be->ops->zero((mgt_backend *)be, r->bn_words, (n * MGT_XS_WORDS + 1) * sizeof(int64_t));
    return r->bn_words;
}

static void bn_end(mgt_repro *r, const mgt_step *s, size_t n, float *out, const char *what) {
    const mgt_backend *be = s->be;
    allreduce_words(r, r->bn_words, n * MGT_XS_WORDS + 1, what);
    check_bad(be, r->bn_words + n * MGT_XS_WORDS, "batchnorm sums were", s->global_step);
    be->ops->xs_round((mgt_backend *)be, n, r->bn_words, out);
}

/* p advanced by `values` activation values (the backend's type: backend.h). */
static const float *act_at(const mgt_step *s, const float *p, size_t values) {
    return p ? (const float *)((const char *)p + values * mgt_dtype_size(s->be->act)) : NULL;
}

void mgt_repro_bn_stats(const mgt_step *s, int hw, int c, const float *x, float *sum) {
    mgt_repro *r = s->repro;
    mgt_backend *be = s->be;
    const size_t n = 2 * (size_t)c;
    int64_t *w = bn_begin(r, be, n);
    for (int k = 0; k < chunks_of(s); k++) {
        const mgt_step q = chunk_step(s, k);
        const size_t r0 = (size_t)(q.row0 - s->row0) * (size_t)hw * (size_t)c;
        be->ops->bn_stats(be, q.n * hw, c, act_at(s, x, r0), r->part, r->part + c);
        be->ops->xs_add(be, n, r->part, w, w + n * MGT_XS_WORDS);
    }
    bn_end(r, s, n, sum, "synchronised batchnorm statistics (exact)");
}

void mgt_repro_bn_grads(const mgt_step *s, int hw, const mgt_bn_pass *p, const float *dy,
                        float *dgamma, float *dbeta, float *out) {
    mgt_repro *r = s->repro;
    mgt_backend *be = s->be;
    const int c = p->c;
    const size_t n = 2 * (size_t)c;
    int64_t *w = bn_begin(r, be, n), *bad = w + n * MGT_XS_WORDS;
    for (int k = 0; k < chunks_of(s); k++) {
        const mgt_step q = chunk_step(s, k);
        const size_t r0 = (size_t)(q.row0 - s->row0) * (size_t)hw * (size_t)c;
        mgt_bn_pass pc = *p; /* the chunk's rows of x, the residual, the output and dy */
        pc.rows = q.n * hw;
        pc.x = act_at(s, p->x, r0);
        pc.r = act_at(s, p->r, r0);
        pc.y = act_at(s, p->y, r0);
        be->ops->bn_bwd_reduce(be, &pc, act_at(s, dy, r0), dgamma, dbeta);
        add_arena(r, be, (size_t)(dgamma - r->m->g), (size_t)c, dgamma);
        add_arena(r, be, (size_t)(dbeta - r->m->g), (size_t)c, dbeta);
        be->ops->xs_add(be, (size_t)c, dgamma, w, bad);
        be->ops->xs_add(be, (size_t)c, dbeta, w + (size_t)c * MGT_XS_WORDS, bad);
    }
    bn_end(r, s, n, out, "synchronised batchnorm gradients (exact)");
}
