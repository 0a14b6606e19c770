/* fault.c: the MGT_FAULT test hook (see fault.h). */
#include "fault.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "runtime.h"
#include "tensor_io.h"

void mgt_fault_init(mgt_fault *f, int rank) {
    memset(f, 0, sizeof *f);
    f->rank = rank;
    const char *d = getenv("MGT_DUMP_GRADIENTS");
    f->dump_gradients = rank == 0 && d && *d ? d : NULL;
    const char *v = getenv("MGT_FAULT");
    if (!v)
        return;
    int who;
    long long step;
    char what[16];
    if (sscanf(v, "%d:%lld:%15s", &who, &step, what) != 3 ||
        (strcmp(what, "exit") && strcmp(what, "sleep") && strcmp(what, "nan") &&
         strcmp(what, "slow")))
        mgt_die_all("MGT_FAULT=%s: expected RANK:STEP:exit|sleep|nan|slow", v);
    if (who != rank)
        return;
    f->step = step;
    f->kind = !strcmp(what, "exit")    ? MGT_FAULT_EXIT
              : !strcmp(what, "sleep") ? MGT_FAULT_SLEEP
              : !strcmp(what, "slow")  ? MGT_FAULT_SLOW
                                       : MGT_FAULT_NAN;
}

void mgt_fault_point(const mgt_fault *f, int64_t step) {
    if (step != f->step)
        return;
    if (f->kind == MGT_FAULT_SLOW) {
        fprintf(stderr, "rank %d: MGT_FAULT: step %lld takes 3 s longer\n", f->rank,
                (long long)step);
        fflush(stderr);
        /* The whole 3 s, signals or not (a stop signal's handler interrupts the sleep). */
        struct timespec left = {3, 0};
        while (nanosleep(&left, &left) != 0 && errno == EINTR) {
        }
        return;
    }
    if (f->kind != MGT_FAULT_EXIT && f->kind != MGT_FAULT_SLEEP)
        return;
    /* _exit and pause, not mgt_die: the point is a rank that vanishes or hangs without a word to
     * the others, as a crashed or stopped process does. */
    fprintf(stderr, "rank %d: MGT_FAULT: %s at step %lld\n", f->rank,
            f->kind == MGT_FAULT_EXIT ? "exiting" : "stopping", (long long)step);
    fflush(stderr);
    if (f->kind == MGT_FAULT_EXIT)
        _exit(3);
    for (;;)
        pause();
}

void mgt_fault_poison(const mgt_fault *f, int64_t step, float *x, size_t count) {
    if (f->kind == MGT_FAULT_NAN && step >= f->step)
        for (size_t i = 0; i < count; i++)
            x[i] = NAN;
}

int mgt_fault_host_batches(const mgt_fault *f) {
    return f->kind == MGT_FAULT_NAN;
}

void mgt_fault_dump_gradients(const mgt_fault *f, const mgt_model *m, int64_t step) {
    if (!f->dump_gradients)
        return;
    mgt_backend *be = m->be;
    float *g = malloc(sizeof(float) * (m->grad_count + 1));
    mgt_tensor_entry *t = calloc((size_t)m->nparams + 1, sizeof *t);
    if (!g || !t)
        mgt_die("out of host memory for the gradient dump");
    be->ops->to_host(be, g, m->g, sizeof(float) * m->grad_count);
    int n = 0;
    for (int i = 0; i < m->nparams; i++) {
        const mgt_param *p = &m->params[i];
        if (p->offset >= m->grad_count) /* a frozen layer's: no gradient */
            continue;
        snprintf(t[n].name, sizeof t[n].name, "%s", p->name);
        t[n].ndim = p->ndim;
        memcpy(t[n].shape, p->shape, sizeof t[n].shape);
        t[n++].data = g + p->offset;
    }
    mgt_meta_entry meta[2];
    snprintf(meta[0].key, sizeof meta[0].key, "format");
    snprintf(meta[0].value, sizeof meta[0].value, "mgtrain-gradient-sum");
    snprintf(meta[1].key, sizeof meta[1].key, "step");
    snprintf(meta[1].value, sizeof meta[1].value, "%lld", (long long)step);
    mgt_err e;
    if (mgt_safetensors_write(f->dump_gradients, t, n, meta, 2, &e) < 0)
        mgt_die("MGT_DUMP_GRADIENTS: %s", e.msg);
    free(g);
    free(t);
}
