/* profile_layers.c: the device marks of --profile (the data phase's parts) and
 * --profile-layers (every layer's passes), and their tables (profile.h).
 *
 * A step's marks form one set of timing events on the compute queue, each labelled with the
 * slot its interval (from the mark before it) counts to. Sets alternate between steps, and a
 * set is read (waiting for its last mark, long run by then) when its turn comes again two
 * steps later, or at the report: no wait is added in between. Marks tile the step's device
 * timeline from its first mark on, so a layer's interval holds its ops and the time the device
 * waited for them; a mark at each layer's start as well as its end splits that wait off, as
 * the time between layers (launch overhead, or a host late with the next op). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "layer_cost.h"
#include "profile.h"
#include "runtime.h"

/* The slots besides the layers' (profile.h's MGT_MARK_*), and the names of the data ones. */
static const char *const fixed_names[] = {
    [MGT_MARK_DATA_WAIT] = "waiting for the batch's copy",
    [MGT_MARK_DATA_MAKE] = "making the batch on the device",
};

struct mgt_layer_prof {
    const mgt_model *m;
    mgt_backend *be;
    int layers; /* every layer's marks (--profile-layers), else the data marks only */
    int nslots; /* MGT_MARK_LAYERS + 2 L */
    int cap;    /* marks a set holds */
    int set;    /* the current step's set (-1: none) */
    int64_t set_step[MGT_MARK_SETS];
    int n[MGT_MARK_SETS];
    int32_t *label[MGT_MARK_SETS];
    double *sec;  /* marks_read's output */
    double *rows; /* per step read: nslots seconds */
    int64_t nrows, row_cap;
    int lost; /* marks past a set's room (many micro-batches): left out */
    const char *precision;
    const char *make_what; /* "synthetic generation" or "gather" (NULL: host batches) */
};

int mgt_profile_marks_init(mgt_profile *p, const mgt_model *m, int layers, const char *precision,
                           mgt_err *err) {
    mgt_backend *be = p->be;
    if (p->on && layers && (!p->device || !be->ops->marks_reserve))
        mgt_log0("notice: --profile-layers times layers on a GPU; on the %s backend it is "
                 "--profile (bench/layer_times gives a CPU step's layers)\n",
                 be ? be->ops->name : "this");
    if (!p->on || !p->device || !be->ops->marks_reserve)
        return 0;
    mgt_layer_prof *lp = calloc(1, sizeof *lp);
    if (!lp)
        return mgt_errf(err, "out of host memory for the profile's marks");
    p->lp = lp;
    lp->m = m;
    lp->be = be;
    lp->layers = layers;
    lp->precision = precision;
    lp->nslots = MGT_MARK_LAYERS + 2 * m->nlayers;
    /* a micro-batch: the data marks, each layer's start and end both ways, the loss; a step
     * may hold a few micro-batches (gradient accumulation), past which marks are left out */
    const int per = 2 + 4 * m->nlayers + 2;
    lp->cap = 1 + (layers ? 4 * per : 16);
    lp->set = -1;
    /* the tables are means: the first thousand steps hold plenty of them */
    lp->row_cap = p->step_cap < 1000 ? p->step_cap : 1000;
    for (int k = 0; k < MGT_MARK_SETS; k++) {
        lp->set_step[k] = -1;
        lp->label[k] = malloc(sizeof(int32_t) * (size_t)lp->cap);
    }
    lp->sec = malloc(sizeof(double) * (size_t)lp->cap);
    lp->rows = calloc((size_t)lp->row_cap * (size_t)lp->nslots, sizeof(double));
    if (!lp->label[0] || !lp->label[1] || !lp->sec || !lp->rows)
        return mgt_errf(err, "out of host memory for the profile of %d layers over %lld steps",
                        m->nlayers, (long long)lp->row_cap);
    if (be->ops->marks_reserve(be, lp->cap) < 0)
        return mgt_errf(err, "out of %s memory for %d timing events", be->ops->name, lp->cap);
    return 0;
}

void mgt_profile_marks_source(mgt_profile *p, const char *make_what) {
    if (p->lp)
        p->lp->make_what = make_what;
}

/* Reads set k, if it holds a step, into the next row. */
static void collect_marks(mgt_layer_prof *lp, int k) {
    if (lp->set_step[k] < 0)
        return;
    const int n = lp->n[k];
    lp->set_step[k] = -1;
    if (n < 2 || lp->nrows >= lp->row_cap)
        return;
    lp->be->ops->marks_read(lp->be, k, n, lp->sec);
    double *row = lp->rows + (size_t)lp->nrows++ * (size_t)lp->nslots;
    for (int i = 1; i < n; i++)
        row[lp->label[k][i]] += lp->sec[i] - lp->sec[i - 1];
}

void mgt_profile_marks_step(mgt_profile *p, int64_t step) {
    mgt_layer_prof *lp = p->lp;
    if (!lp)
        return;
    const int k = (int)(step % MGT_MARK_SETS);
    collect_marks(lp, k);
    lp->set = k;
    lp->set_step[k] = step;
    lp->n[k] = 1;
    lp->be->ops->mark(lp->be, k, 0);
}

void mgt_profile_mark(mgt_profile *p, int slot) {
    mgt_layer_prof *lp = p->lp;
    if (!lp || lp->set < 0 || (!lp->layers && slot >= MGT_MARK_LOSS))
        return;
    const int k = lp->set;
    if (lp->n[k] >= lp->cap) {
        lp->lost = 1;
        return;
    }
    lp->label[k][lp->n[k]] = slot;
    lp->be->ops->mark(lp->be, k, lp->n[k]++);
}

int mgt_profile_layers_on(const mgt_profile *p) {
    return p->lp && p->lp->layers;
}

/* The first steps warm caches and allocators (and choose algorithms): as profile.c leaves out. */
static int64_t warm_rows(int64_t n) {
    return n > 20 ? 5 : n > 4 ? 2 : 0;
}

/* The algorithms a layer's convolution runs with (conv2d, or a separable layer's pointwise
 * step), from the backend, into buf ("" when none). */
static void layer_algos(const mgt_layer_prof *lp, const mgt_layer *l, int n, char *buf,
                        size_t len) {
    buf[0] = '\0';
    mgt_backend *be = lp->be;
    if (!be->ops->describe_conv)
        return;
    mgt_conv_shape s;
    if (!strcmp(l->type->name, "conv2d")) {
        s = mgt_conv2d_geometry(n, l->in.h, l->in.w, l->in.c, l->cfg.filters, l->cfg.kernel,
                                l->cfg.kernel_w, l->cfg.stride, l->cfg.same);
        s.algo = l->cfg.algo;
    } else if (!strcmp(l->type->name, "separable_conv2d")) {
        const mgt_conv_shape d =
            mgt_conv2d_geometry(n, l->in.h, l->in.w, l->in.c, l->in.c, l->cfg.kernel,
                                l->cfg.kernel_w, l->cfg.stride, l->cfg.same);
        s = mgt_conv2d_geometry(n, d.oh, d.ow, d.c, l->cfg.filters, 1, 1, 1, 0);
        strcpy(buf, "pointwise: ");
    } else {
        return;
    }
    const size_t at = strlen(buf);
    if (be->ops->describe_conv(be, &s, buf + at, len - at) == 0)
        buf[0] = '\0';
}

/* One pass's cells: ms, GB/s, TFLOP/s and the share of its floor reached (dashes where the
 * pass does not run). */
static void pass_cells(double ms, const mgt_cost *c, const mgt_rates *r) {
    if (c->bytes == 0 && c->flops == 0) {
        printf(" - | - | - | - |");
        return;
    }
    const double s = ms * 1e-3;
    if (s <= 0) {
        printf(" %.4f | - | - | - |", ms);
        return;
    }
    printf(" %.4f | %.0f | %.2f | %.0f%% |", ms, c->bytes / s / 1e9, c->flops / s / 1e12,
           r ? 100.0 * mgt_cost_floor(c, r, NULL) / s : 0.0);
}

void mgt_profile_marks_report(mgt_profile *p) {
    mgt_layer_prof *lp = p->lp;
    if (!lp)
        return;
    for (int64_t s = p->step - MGT_MARK_SETS + 1; s <= p->step; s++) /* oldest first */
        if (s >= 0)
            collect_marks(lp, (int)(s % MGT_MARK_SETS));
    const int64_t skip = warm_rows(lp->nrows), rows = lp->nrows - skip;
    if (rows <= 0)
        return;
    double *mean = calloc((size_t)lp->nslots, sizeof *mean);
    if (!mean)
        return;
    for (int64_t r = skip; r < lp->nrows; r++)
        for (int j = 0; j < lp->nslots; j++)
            mean[j] += 1e3 * lp->rows[(size_t)r * (size_t)lp->nslots + (size_t)j] / (double)rows;
    printf("data phase on the device (rank 0, ms per step over %lld steps): %.3f %s",
           (long long)rows, mean[MGT_MARK_DATA_WAIT], fixed_names[MGT_MARK_DATA_WAIT]);
    if (lp->make_what)
        printf(", %.3f %s (%s)", mean[MGT_MARK_DATA_MAKE], fixed_names[MGT_MARK_DATA_MAKE],
               lp->make_what);
    printf("\n");
    int marked = 0;
    for (int j = MGT_MARK_LOSS; j < lp->nslots; j++)
        marked |= mean[j] > 0;
    if (lp->layers && !marked)
        printf("(no layer was marked: --reproducible runs its passes chunk by chunk, unmarked)\n");
    if (lp->layers && marked) {
        const mgt_model *m = lp->m;
        const int L = m->nlayers, n = m->max_batch;
        /* the floors at this GPU's rates, its memory's as a copy measured on it now */
        char gpu[128] = "";
        double copy = 0;
#ifdef MGT_HAVE_CUDA
        if (!strcmp(lp->be->ops->name, "gpu"))
            copy = mgt_gpu_copy_rate(lp->be, gpu, sizeof gpu);
#endif
        mgt_rates rates, *r = mgt_rates_for(gpu, lp->precision, copy, &rates) == 0 ? &rates : NULL;
        printf("Per layer on the device (rank 0, ms per step over %lld steps at a batch of %d; "
               "GB/s and TFLOP/s against each pass's own bytes and FLOPs (layer_cost.h, "
               "activations %zu bytes a value; a fusion group's at its last layer), and the "
               "share of its floor at %s):\n",
               (long long)rows, n, mgt_dtype_size(lp->be->act), r ? r->name : lp->precision);
        printf("| # | layer | type | fwd ms | GB/s | TFLOP/s | of floor | bwd ms | GB/s | TFLOP/s "
               "| of floor | cuDNN |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        double sf = 0, sb = 0;
        for (int i = 0; i < L; i++) {
            const mgt_layer *l = &m->layers[i];
            mgt_cost cf, cb;
            mgt_layer_cost(m, i, n, (int)mgt_dtype_size(lp->be->act), &cf, &cb);
            const double f = mean[MGT_MARK_LAYERS + i], b = mean[MGT_MARK_LAYERS + L + i];
            sf += f;
            sb += b;
            char algos[256];
            layer_algos(lp, l, n, algos, sizeof algos);
            char kind[320];
            mgt_layer_label(m, i, kind, sizeof kind);
            printf("| %d | %s | %s |", i, l->name, kind);
            pass_cells(f, &cf, r);
            pass_cells(b, &cb, r);
            printf(" %s |\n", algos);
        }
        printf("forward: %.3f ms in the layers + %.3f ms between them (the device idle: launch "
               "overhead, or the host late); loss %.3f ms; backward: %.3f ms in the layers + %.3f "
               "ms between them\n",
               sf, mean[MGT_MARK_GAP_FWD], mean[MGT_MARK_LOSS], sb, mean[MGT_MARK_GAP_BWD]);
        if (lp->lost)
            printf("(a step held more marks than were reserved: its last micro-batches are left "
                   "out of this table)\n");
    }
    free(mean);
}

void mgt_profile_marks_free(mgt_profile *p) {
    mgt_layer_prof *lp = p->lp;
    if (!lp)
        return;
    for (int k = 0; k < MGT_MARK_SETS; k++)
        free(lp->label[k]);
    free(lp->sec);
    free(lp->rows);
    free(lp);
    p->lp = NULL;
}
