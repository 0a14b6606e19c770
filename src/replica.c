/* replica.c: the state every rank holds, started, checked, averaged and saved (see replica.h). */
#include "replica.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pretrained.h"
#include "runtime.h"

int mgt_replica_init(mgt_replica *r, mgt_model *m, mgt_optim *opt, mgt_backend *be, mgt_comm *comm,
                     const mgt_replica_files *files, mgt_err *err) {
    memset(r, 0, sizeof *r);
    r->m = m;
    r->opt = opt;
    r->be = be;
    r->comm = comm;
    r->files = files ? *files : (mgt_replica_files){.keep_checkpoints = 1};
    r->saved_step = -1;
    /* One float more than needed: a model without buffers still gets a valid pointer. */
    r->host.w = calloc(m->param_count + 1, sizeof(float));
    r->host.buf = calloc(m->buffer_count + 1, sizeof(float));
    int ok = r->host.w && r->host.buf;
    /* Sharded optimizer state (ZeRO-1) is whole on rank 0 only, which reads and writes the
     * files: the other ranks keep their slice, and nothing more. */
    const int whole_state = opt->shards == 1 || comm->rank == 0;
    for (int i = 0; whole_state && i < opt->nslots; i++)
        ok = ok && (r->host.slot[i] = calloc(m->grad_count + 1, sizeof(float)));
    if (!ok)
        return mgt_errf(err, "out of host memory for a copy of the model's %zu parameters",
                        m->param_count);
    return 0;
}

/* The model's arenas between backend memory and their host copies (the optimizer's state moves
 * with mgt_optim_state_put / _get, which know its slices). */
static void to_backend(mgt_replica *r) {
    const mgt_ops *o = r->be->ops;
    const size_t wb = r->m->param_count * sizeof(float);
    o->to_device(r->be, r->m->w, r->host.w, wb);
    o->to_device(r->be, r->m->buf, r->host.buf, r->m->buffer_count * sizeof(float));
}

static void to_host(mgt_replica *r) {
    const mgt_ops *o = r->be->ops;
    const size_t wb = r->m->param_count * sizeof(float);
    o->to_host(r->be, r->host.w, r->m->w, wb);
    o->to_host(r->be, r->host.buf, r->m->buf, r->m->buffer_count * sizeof(float));
}

/* Rank 0's host copies of the weights and buffers to every rank's host copies. */
static void share_weights(mgt_replica *r) {
    mgt_bcast(r->comm, r->host.w, r->m->param_count * sizeof(float), 0, "weight broadcast");
    mgt_bcast(r->comm, r->host.buf, r->m->buffer_count * sizeof(float), 0, "buffer broadcast");
}

void mgt_replica_start(mgt_replica *r, const mgt_replica_source *src, mgt_ckpt_pos *pos) {
    mgt_model *m = r->m;
    memset(pos, 0, sizeof *pos);
    pos->seed = src->seed;
    pos->best_val_loss = -1;
    /* Rank 0 alone reads the file, but a bad one (another model's, damaged) is the job's error,
     * not the rank's: it ends every rank alike. */
    mgt_err e;
    int rc = 0;
    if (r->comm->rank == 0) {
        if (src->resume_dir)
            rc = mgt_ckpt_read(src->resume_dir, m, r->opt, &r->files.run, &r->host, pos, &e);
        else if (src->weights && (src->pretrained || src->map)) {
            const mgt_pretrained_opts po = {src->weights, src->map, src->partial, src->flag};
            mgt_model_init_host(m, src->seed, r->host.w, r->host.buf); /* what is left */
            rc = mgt_pretrained_load(m, &po, r->host.w, r->host.buf, &r->weights_report, &e);
            if (rc < 0 && r->weights_report) /* what did not match, before the error */
                fputs(r->weights_report, stderr);
        } else if (src->weights)
            rc = mgt_model_load_weights(m, src->weights, r->host.w, r->host.buf, &e);
        else
            mgt_model_init_host(m, src->seed, r->host.w, r->host.buf);
    }
    mgt_die_all_if_root(rc < 0 ? e.msg : NULL);
    share_weights(r);
    mgt_optim_state_put(r->opt, r->be, r->comm, r->host.slot, 0);
    mgt_ckpt_bcast_pos(r->comm, pos, 0);
    to_backend(r);
    r->opt->t = pos->optimizer_t;
    r->saved_step = src->resume_dir ? pos->step : -1;
    mgt_replica_check(r, "after the initial broadcast");
}

/* FNV-1a over the parameter arena as this rank holds it. */
static uint64_t weights_checksum(mgt_replica *r) {
    const size_t bytes = r->m->param_count * sizeof(float);
    r->be->ops->to_host(r->be, r->host.w, r->m->w, bytes);
    const unsigned char *p = (const unsigned char *)r->host.w;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

void mgt_replica_check(mgt_replica *r, const char *when) {
    uint64_t mine = weights_checksum(r), root = mine;
    mgt_bcast(r->comm, &root, sizeof root, 0, "weight checksum");
    if (mine != root)
        mgt_die("weights differ from rank 0's %s (checksum %016llx, rank 0 has %016llx): the "
                "replicas are out of step; please report this with the command line",
                when, (unsigned long long)mine, (unsigned long long)root);
}

void mgt_replica_average_buffers(mgt_replica *r) {
    mgt_model *m = r->m;
    const int world = r->comm->world;
    if (!m->buffer_count || world == 1)
        return;
    const mgt_ops *o = r->be->ops;
    float *hb = r->host.buf;
    o->to_host(r->be, hb, m->buf, m->buffer_count * sizeof(float));
    /* Summed in double: the average of the same value on every rank is then that value. */
    double *d = malloc(sizeof(double) * m->buffer_count);
    if (!d)
        mgt_die("out of host memory");
    for (size_t i = 0; i < m->buffer_count; i++)
        d[i] = hb[i];
    mgt_allreduce_host_f64(r->comm, d, m->buffer_count, "batchnorm statistics average");
    for (size_t i = 0; i < m->buffer_count; i++)
        hb[i] = (float)(d[i] / world);
    free(d);
    o->to_device(r->be, m->buf, hb, m->buffer_count * sizeof(float));
}

/* Rank 0: the host copies, refusing to save weights that are no longer finite. */
static void fetch_finite(mgt_replica *r, const char *dir, int64_t step) {
    to_host(r);
    for (size_t i = 0; i < r->m->param_count; i++)
        if (!isfinite(r->host.w[i]))
            mgt_die("the weights hold non-finite values at step %lld; nothing was saved and the "
                    "last good checkpoint in %s is kept; lower --lr and resume",
                    (long long)step, dir);
}

void mgt_replica_save_checkpoint(mgt_replica *r, const char *dir, const mgt_ckpt_pos *pos) {
    mgt_replica_average_buffers(r);
    mgt_optim_state_get(r->opt, r->be, r->comm, r->host.slot, 0);
    if (r->comm->rank != 0)
        return;
    fetch_finite(r, dir, pos->step);
    mgt_err e;
    const int64_t keep = r->files.keep_checkpoints;
    const int keep_prev = keep > 1 && r->saved_step >= 0 && r->saved_step != pos->step;
    if ((keep_prev && mgt_ckpt_keep_previous(dir, r->saved_step, &e) < 0) ||
        mgt_ckpt_write(dir, r->m, r->opt, &r->files.run, &r->host, pos, r->comm->world, &e) < 0 ||
        mgt_ckpt_prune(dir, keep, &e) < 0)
        mgt_die("%s", e.msg);
    r->saved_step = pos->step;
}

static void save_weights(mgt_replica *r, const char *dir, const char *file, int64_t step,
                         double val_loss) {
    mgt_replica_average_buffers(r);
    if (r->comm->rank != 0)
        return;
    fetch_finite(r, dir, step);
    mgt_err e;
    if (mgt_ckpt_write_weights(dir, file, r->m, r->host.w, r->host.buf, step, val_loss, &e) < 0)
        mgt_die("%s", e.msg);
}

void mgt_replica_save_weights(mgt_replica *r, const char *dir, int64_t step) {
    save_weights(r, dir, "weights.safetensors", step, -1);
}

void mgt_replica_save_best(mgt_replica *r, const char *dir, int64_t step, double val_loss) {
    save_weights(r, dir, "best.safetensors", step, val_loss);
}

void mgt_replica_load_weights(mgt_replica *r, const char *path) {
    mgt_model *m = r->m;
    mgt_err e;
    if (r->comm->rank == 0 && mgt_model_load_weights(m, path, r->host.w, r->host.buf, &e) < 0)
        mgt_die("%s", e.msg);
    share_weights(r);
    const mgt_ops *o = r->be->ops;
    o->to_device(r->be, m->w, r->host.w, m->param_count * sizeof(float));
    o->to_device(r->be, m->buf, r->host.buf, m->buffer_count * sizeof(float));
    mgt_replica_check(r, "after loading weights");
}

void mgt_replica_free(mgt_replica *r) {
    free(r->weights_report);
    free(r->host.w);
    free(r->host.buf);
    for (int i = 0; i < MGT_OPT_MAX_SLOTS; i++)
        free(r->host.slot[i]);
    memset(r, 0, sizeof *r);
}
