/* api.c: libmgt's public functions (include/mgtrain/mgt.h) over mgtrain's own modules.
 *
 * A predictor is what `mgtrain predict` builds on one rank, without the runtime or the data: the
 * parsed model, a backend, the arenas sized for one batch, and the weights. Its predict runs the
 * rows through mgt_model_forward and mgt_model_finish_output in batches of the same size and
 * order as the command's evaluate() does, which is why the outputs agree bit for bit.
 *
 * Library code must not end the caller's process: everything on the predictor's path returns
 * errors (mgt_err) and this file hands them over as strings. Training is the exception, see
 * mgt_train_argv in the header. */
#include "mgtrain/mgt.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "default_model.h"
#include "gpu.h"
#include "model.h"
#include "runtime.h"
#include "train_cfg.h"

struct mgt_predictor {
    mgt_model m;
    mgt_backend be;
    int batch;
};

/* The command line's entry point, compiled into the shared library from src/main.c with its
 * `main` renamed (see CMakeLists.txt): mgt_train_argv runs the command itself. */
int mgt_cli_entry(int argc, char **argv);

static void give_err(char *err, size_t size, const mgt_err *e) {
    if (err && size > 0)
        snprintf(err, size, "%s", e->msg);
}

const char *mgt_library_version(void) {
    return MGT_VERSION;
}

void mgt_predictor_options_init(mgt_predictor_options *o) {
    memset(o, 0, sizeof *o);
    o->device = "cpu";
}

/* The backend the options ask for: the CPU, or a GPU where this build has the GPU backend. */
static int open_backend(mgt_predictor *p, const mgt_predictor_options *o, mgt_err *e) {
    const char *d = o->device ? o->device : "cpu";
    if (strcmp(d, "cpu") && strcmp(d, "gpu") && strcmp(d, "auto"))
        return mgt_errf(e, "device \"%s\": unknown; use cpu, gpu or auto", d);
#ifdef MGT_HAVE_CUDA
    if (!strcmp(d, "gpu") || (!strcmp(d, "auto") && mgt_gpu_may_exist())) {
        char why[256] = "";
        int n = mgt_gpu_count(why, sizeof why);
        if (n > 0 && (o->gpu < 0 || o->gpu >= n))
            return mgt_errf(e, "GPU %d does not exist: %d GPUs are visible (numbered 0 to %d)",
                            o->gpu, n, n - 1);
        if (n > 0)
            return mgt_gpu_backend_init(&p->be, o->gpu, o->tf32 ? MGT_GPU_TF32 : 0, e);
        if (!strcmp(d, "gpu"))
            return mgt_errf(e, "device gpu: no usable GPU (%s); use device cpu or auto",
                            n == 0 ? "no device is visible" : why);
    }
#else
    if (!strcmp(d, "gpu"))
        return mgt_errf(e, "device gpu: this build of libmgt has no GPU backend (no CUDA toolkit "
                           "was found when it was built); use device cpu or auto");
#endif
    int threads = o->threads;
    if (threads <= 0) {
        mgt_runtime alone = {.local_size = 1}; /* one process: the cores it may run on */
        threads = mgt_runtime_cores(&alone);
    }
    if (mgt_cpu_backend_init(&p->be, threads) < 0)
        return mgt_errf(e, "cannot start the CPU backend (out of memory)");
    return 0;
}

/* Reads the weights into host arenas, checks them against the model, and uploads them. */
static int load_weights(mgt_predictor *p, const char *path, mgt_err *e) {
    mgt_model *m = &p->m;
    float *w = calloc(m->param_count + 1, sizeof(float));
    float *buf = calloc(m->buffer_count + 1, sizeof(float));
    int rc = -1;
    if (!w || !buf)
        mgt_errf(e, "out of memory for the %zu weights of %s", m->param_count, m->name);
    else if (mgt_model_load_weights(m, path, w, buf, e) == 0) {
        const mgt_ops *o = p->be.ops;
        o->to_device(&p->be, m->w, w, m->param_count * sizeof(float));
        o->to_device(&p->be, m->buf, buf, m->buffer_count * sizeof(float));
        rc = 0;
    }
    free(w);
    free(buf);
    return rc;
}

mgt_predictor *mgt_predictor_open(const char *model_file, const char *model_text,
                                  const char *weights_file, const mgt_predictor_options *options,
                                  char *err, size_t err_size) {
    mgt_predictor_options defaults;
    mgt_predictor_options_init(&defaults);
    const mgt_predictor_options *o = options ? options : &defaults;
    mgt_err e = {{0}};
    mgt_predictor *p = calloc(1, sizeof *p);
    if (!p) {
        mgt_errf(&e, "out of memory for a predictor");
        give_err(err, err_size, &e);
        return NULL;
    }
    int parsed = 0, rc;
    mgt_train_cfg train; /* [train]: its batch_size is the default batch */
    if (!weights_file) {
        rc = mgt_errf(&e, "no weights file given: pass the weights.safetensors that mgtrain "
                          "train saved for this model");
    } else {
        rc = model_file || model_text
                 ? mgt_model_file_parse(&p->m, &train, model_file ? model_file : "model",
                                        model_text, &e)
                 : mgt_model_file_parse(&p->m, &train, "examples/" MGT_DEFAULT_MODEL_NAME ".cfg",
                                        MGT_DEFAULT_MODEL_TEXT, &e);
        parsed = rc == 0;
    }
    if (rc == 0 && o->batch < 0)
        rc = mgt_errf(&e,
                      "batch %d: expected a positive number of rows, or 0 for the model's "
                      "batch_size",
                      o->batch);
    if (rc == 0) {
        int64_t b = o->batch > 0 ? o->batch : train.batch_size;
        p->batch = b > (1 << 20) ? 1 << 20 : (int)b;
        rc = open_backend(p, o, &e);
    }
    if (rc == 0)
        rc = mgt_model_alloc(&p->m, &p->be, p->batch, &e);
    if (rc == 0)
        rc = load_weights(p, weights_file, &e);
    if (rc == 0)
        return p;
    give_err(err, err_size, &e);
    if (parsed)
        mgt_model_free(&p->m);
    if (p->be.ops)
        mgt_backend_destroy(&p->be);
    free(p);
    return NULL;
}

void mgt_predictor_input_shape(const mgt_predictor *p, int *h, int *w, int *c) {
    if (h)
        *h = p->m.input.h;
    if (w)
        *w = p->m.input.w;
    if (c)
        *c = p->m.input.c;
}

int64_t mgt_predictor_input_size(const mgt_predictor *p) {
    return mgt_shape_elems(p->m.input);
}

int64_t mgt_predictor_output_size(const mgt_predictor *p) {
    return p->m.classes;
}

int mgt_predictor_outputs_probabilities(const mgt_predictor *p) {
    return p->m.layers[p->m.nlayers - 1].act == MGT_ACT_SOFTMAX;
}

int mgt_predictor_predict(mgt_predictor *p, const float *x, int64_t n, float *out, char *err,
                          size_t err_size) {
    mgt_err e;
    if (n < 0 || (n > 0 && (!x || !out))) {
        mgt_errf(&e, "predict: %s", n < 0 ? "negative row count" : "x and out must not be NULL");
        give_err(err, err_size, &e);
        return -1;
    }
    mgt_model *m = &p->m;
    const mgt_ops *o = p->be.ops;
    size_t in = (size_t)mgt_shape_elems(m->input), k = (size_t)m->classes;
    /* As the command's evaluate(): consecutive batches of up to max_batch rows, each uploaded,
     * run forward in inference mode, given its final softmax where the loss had fused it, and
     * copied back. */
    for (int64_t done = 0; done < n;) {
        int rows = (int)(n - done < m->max_batch ? n - done : m->max_batch);
        o->to_device(&p->be, m->x, x + (size_t)done * in, sizeof(float) * in * (size_t)rows);
        mgt_step s = {.in = {.x = m->x},
                      .be = &p->be,
                      .n = rows,
                      .training = 0,
                      .global_step = 0,
                      .first_sample = done,
                      .global_n = n,
                      .comm = NULL}; /* no training: no dropout, no seed */
        float *y = mgt_model_forward(m, &s);
        mgt_model_finish_output(m, &s, y);
        o->to_host(&p->be, out + (size_t)done * k, y, sizeof(float) * (size_t)rows * k);
        done += rows;
    }
    return 0;
}

void mgt_predictor_close(mgt_predictor *p) {
    if (!p)
        return;
    mgt_model_free(&p->m);
    mgt_backend_destroy(&p->be);
    free(p);
}

int mgt_train_argv(int argc, char **argv) {
    int done = 0;
    MPI_Finalized(&done);
    if (done) {
        fprintf(stderr, "mgt_train_argv: MPI was finalised by an earlier call in this process "
                        "and cannot start again; initialise MPI yourself (MPI_Init_thread) to "
                        "train more than once per process\n");
        return 2;
    }
    /* "mgtrain train" followed by the caller's flags. */
    char **args = calloc((size_t)(argc > 1 ? argc : 1) + 2, sizeof *args);
    if (!args) {
        fprintf(stderr, "mgt_train_argv: out of memory\n");
        return 2;
    }
    args[0] = "mgtrain";
    args[1] = "train";
    int n = 2;
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    int rc = mgt_cli_entry(n, args);
    free(args);
    return rc;
}
