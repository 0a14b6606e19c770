/* fault.c: the MGT_FAULT test hook (see fault.h). */
#include "fault.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "runtime.h"
#include "tensor_io.h"

void mgt_fault_init(mgt_fault *f, int rank) {
    memset(f, 0, sizeof *f);
    f->rank = rank;
    const char *d = getenv("MGT_DUMP_GRADIENTS");
    f->dump_gradients = d && *d ? d : NULL;
    const char *v = getenv("MGT_FAULT");
    if (!v)
        return;
    int who;
    long long step;
    char what[16];
    if (sscanf(v, "%d:%lld:%15s", &who, &step, what) != 3 ||
        (strcmp(what, "exit") && strcmp(what, "sleep") && strcmp(what, "nan")))
        mgt_die_all("MGT_FAULT=%s: expected RANK:STEP:exit|sleep|nan", v);
    if (who != rank)
        return;
    f->step = step;
    f->kind = !strcmp(what, "exit")    ? MGT_FAULT_EXIT
              : !strcmp(what, "sleep") ? MGT_FAULT_SLEEP
                                       : MGT_FAULT_NAN;
}

void mgt_fault_point(const mgt_fault *f, int64_t step) {
    if (step != f->step || (f->kind != MGT_FAULT_EXIT && f->kind != MGT_FAULT_SLEEP))
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

void mgt_fault_dump_gradients(const mgt_fault *f, const mgt_model *m, const float *g) {
    mgt_tensor_entry *t = calloc((size_t)m->nparams + 1, sizeof *t);
    if (!t)
        mgt_die("out of host memory for the gradient dump");
    for (int i = 0; i < m->nparams; i++) {
        const mgt_param *p = &m->params[i];
        snprintf(t[i].name, sizeof t[i].name, "%s", p->name);
        t[i].ndim = p->ndim;
        for (int k = 0; k < p->ndim; k++)
            t[i].shape[k] = p->shape[k];
        t[i].data = g + p->offset;
    }
    mgt_err e;
    if (mgt_safetensors_write(f->dump_gradients, t, m->nparams, NULL, 0, &e) < 0)
        mgt_die("MGT_DUMP_GRADIENTS: %s", e.msg);
    free(t);
}
