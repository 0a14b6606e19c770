/* mgtrain/mgt.h: libmgt, mgtrain as a C library (the one public header).
 *
 * Two things a program can do with it:
 *
 *  - Inference: open a model file and its weights (a weights.safetensors that `mgtrain train`
 *    saved) as a predictor, then run it on float buffers. The outputs are exactly those of
 *    `mgtrain predict` on one rank: the same code runs the same batches in the same order.
 *
 *        char err[1024];
 *        mgt_predictor *p = mgt_predictor_open("examples/mlp.cfg", NULL,
 *                                              "runs/mlp/weights.safetensors", NULL,
 *                                              err, sizeof err);
 *        if (!p) { fprintf(stderr, "%s\n", err); return 1; }
 *        float *out = malloc(sizeof(float) * n * mgt_predictor_output_size(p));
 *        if (mgt_predictor_predict(p, x, n, out, err, sizeof err) < 0) ...
 *        mgt_predictor_close(p);
 *
 *  - Training: mgt_train_argv runs `mgtrain train` with command-line flags, in this process
 *    (as one rank of an MPI job when started by mpirun or srun).
 *
 * Build against it with pkg-config:  cc prog.c $(pkg-config --cflags --libs mgtrain)
 *
 * Handles are opaque; nothing here depends on MPI's, OpenBLAS's or CUDA's headers. Functions
 * that can fail return NULL or -1 and write one sentence (what failed, and what to do) into the
 * caller's err buffer (err may be NULL). No function keeps global state: separate predictors
 * are independent, but one predictor must not be used by two threads at once. Two settings are
 * the process's, not the predictor's: OpenBLAS's thread count (the last predictor opened on the
 * CPU sets it) and, on a GPU, the current CUDA device (a predictor makes its GPU current when it
 * opens), so GPU predictors of one process share one GPU.
 *
 * OpenBLAS picks its kernel by CPU model when it loads, before any of this runs, and on a model
 * newer than the library it falls back to an old one (Debian 12's OpenBLAS 0.3.21 runs its SSE3
 * Prescott kernel, 5 times slower, on Intel's Emerald Rapids Xeons). The mgtrain program then
 * executes itself again with OPENBLAS_CORETYPE set; a library must not replace its host process,
 * so a program using libmgt sets the variable itself before it starts (OPENBLAS_CORETYPE=SkylakeX
 * on a CPU with AVX-512, Haswell on one with AVX2 and FMA). mgt_train_argv's start-up block names
 * the kernel that runs, and the variable that fits where it is an old one. */
#ifndef MGTRAIN_MGT_H
#define MGTRAIN_MGT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, "MAJOR.MINOR.PATCH" (that of the mgtrain it was built with). */
const char *mgt_library_version(void);

/* ---- inference ----------------------------------------------------------------------------- */

typedef struct mgt_predictor mgt_predictor;

typedef struct mgt_predictor_options {
    /* "cpu" (the default), "gpu" or "auto" (a GPU when this build has the GPU backend and one is
     * usable, else the CPU), as mgtrain's --device. */
    const char *device;
    int gpu;  /* the GPU's number with "gpu" or "auto" (default 0), as --gpus */
    int tf32; /* let cuDNN and cuBLAS use TF32 (default 0: fp32), as --tf32 */
    /* Rows per forward pass. 0 (the default): the model's [train] batch_size, which is what
     * `mgtrain predict` uses on one rank, so that the outputs match it bit for bit (another
     * batch can change the last bits of the matrix products' sums). */
    int batch;
    /* CPU threads for OpenBLAS and the convolutions; 0 (the default): the cores this process
     * may run on, as mgtrain uses on one rank. */
    int threads;
} mgt_predictor_options;

/* Fills o with the defaults above. */
void mgt_predictor_options_init(mgt_predictor_options *o);

/* Opens the model `model_file` (an INI model file, as mgtrain's --model) with the weights in
 * `weights_file`, whose tensor names and shapes must be the model's.
 *   - model_text != NULL: the model is that text, and model_file only names it in messages.
 *   - model_file == NULL and model_text == NULL: mgtrain's built-in model (examples/mlp.cfg).
 *   - options == NULL: the defaults (see mgt_predictor_options).
 * Returns NULL with the reason in err on any error (a bad model file names file:line). */
mgt_predictor *mgt_predictor_open(const char *model_file, const char *model_text,
                                  const char *weights_file, const mgt_predictor_options *options,
                                  char *err, size_t err_size);

/* The shape of one input sample, [input] shape = h,w,c: an input row is h*w*c floats in HWC
 * order (channels last), as mgtrain feeds its data: IDX pixels scaled to [0,1] by /255. */
void mgt_predictor_input_shape(const mgt_predictor *p, int *h, int *w, int *c);
int64_t mgt_predictor_input_size(const mgt_predictor *p);  /* h*w*c */
int64_t mgt_predictor_output_size(const mgt_predictor *p); /* the last layer's units */
/* 1 when the outputs are softmax probabilities (the last layer has activation = softmax), 0 when
 * they are logits, as `mgtrain predict` reports. */
int mgt_predictor_outputs_probabilities(const mgt_predictor *p);

/* Runs the model on n rows of x (n * input_size floats) and writes n * output_size floats to
 * out, in batches of options.batch rows. Returns 0, or -1 with the reason in err. */
int mgt_predictor_predict(mgt_predictor *p, const float *x, int64_t n, float *out, char *err,
                          size_t err_size);

/* Frees everything the predictor holds. NULL is fine. */
void mgt_predictor_close(mgt_predictor *p);

/* ---- training ------------------------------------------------------------------------------ */

/* Trains as `mgtrain train ARGS...` does, with the same flags, parsed and checked by the same
 * code (see `mgtrain --help`); argv[0] is a program name and is skipped, so a main() can pass
 * its own argc and argv on. Output files go where --out says, progress to stdout.
 *
 * MPI: run the program under mpirun or srun for several ranks (every rank calls this), or alone
 * for one, which then needs no MPI at all (as `mgtrain` alone). If the caller has initialised MPI
 * (MPI_Init_thread with at least MPI_THREAD_FUNNELED), training uses MPI_COMM_WORLD and leaves
 * MPI running. Otherwise, under a launcher, this call initialises MPI and finalises it before it
 * returns; since MPI cannot start twice in one process, a second call there fails (returns 2
 * with a message on stderr): initialise MPI yourself to train more than once per job.
 *
 * Returns 0 when training finished (and also after --help, which prints the flags). Errors end
 * the process as they end the command: a bad flag, model file or data folder prints one message
 * and exits with a non-zero status, and a failure on any rank ends every rank of the job,
 * because a rank cannot return while the others wait for it in a collective. */
int mgt_train_argv(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
