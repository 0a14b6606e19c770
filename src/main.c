/* main.c: the program. Parses the command line (cli.c) and hands over to the trainer or the
 * plotter; no logic of its own beyond ending the job the right way.
 *
 * Before anything, the program may execute itself again with OPENBLAS_CORETYPE set, where
 * OpenBLAS has fallen back to an old kernel on a CPU it does not know (src/cpu/cpu_blas.c says
 * why this cannot wait); libmgt, which compiles this file as mgt_train_argv's entry
 * (MGT_LIBRARY_ENTRY), never replaces its host process.
 *
 * MPI starts next, so that a bad flag, which every rank parses identically, ends every rank the
 * same way: one line from rank 0 and exit status 2 everywhere (mgt_die_all). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend.h"
#include "cli.h"
#include "default_model.h"
#include "model.h"
#include "outputs.h"
#include "plot.h"
#include "rundir.h"
#include "runtime.h"
#include "splits.h" /* MGT_DEFAULT_DATA */
#include "trainer.h"
#include "version.h"

static int replaceable(const char *path) {
    (void)path;
    return 1;
}

/* Rank 0 writes the outputs, so rank 0 checks them before any work (outputs.h): a wrong one
 * would otherwise be found only when the run ends, or replace what the run reads. NULL if all
 * is well, else the message in err. */
static const char *check_outputs(const mgt_options *o, mgt_err *err) {
    mgt_outputs_plan p = {.overwrite = o->overwrite};
    if (o->timeline)
        p.out[p.nout++] = (mgt_output){o->timeline, "--timeline", mgt_timeline_is_ours};
    if (o->output)
        p.out[p.nout++] = (mgt_output){o->output, "--output", NULL};
    /* read and saved again by design: any file there may be replaced, but never one of a run,
     * of an image set or of the command's inputs */
    if (o->algo_cache)
        p.out[p.nout++] = (mgt_output){o->algo_cache, "--algo-cache", replaceable};
    char run_model[600], run_weights[600], name[64], out[600], copy[80];
    mgt_err ignored; /* a --run folder that names no model: the command says so */
    if (o->run &&
        mgt_rundir_find(o->run, run_model, run_weights, sizeof run_model, &ignored) == 0) {
        p.reads[p.nreads] = run_model, p.read_what[p.nreads++] = "the model copy of --run";
        p.reads[p.nreads] = run_weights, p.read_what[p.nreads++] = "the weights of --run";
    }
    const char *const reads[3] = {o->model, o->weights, o->init_weights};
    const char *const what[3] = {"the model file (--model)", "the weights (--weights)",
                                 "the initial weights (--init-weights)"};
    for (int i = 0; i < 3; i++)
        if (reads[i])
            p.reads[p.nreads] = reads[i], p.read_what[p.nreads++] = what[i];
    if (!o->data || strcmp(o->data, "synthetic"))
        p.data_dir = o->data ? o->data : MGT_DEFAULT_DATA;
    /* Training's own folder: --out, or runs/<model> (run_plan.c), with the model's copy. */
    if (!strcmp(o->command, "train") &&
        mgt_model_name_of(o->model ? o->model : MGT_DEFAULT_MODEL_NAME, name, sizeof name) == 0) {
        snprintf(out, sizeof out, "runs/%s", name);
        snprintf(copy, sizeof copy, "%s.cfg", name);
        p.run_dir = o->out ? o->out : out;
        p.model_copy = copy;
    }
    if (mgt_outputs_check(&p, err) < 0)
        return err->msg;
    struct stat sb;
    if (o->out && stat(o->out, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        mgt_errf(err,
                 "--out %s exists and is not a folder; pass --out with a folder (new or "
                 "existing)",
                 o->out);
        return err->msg;
    }
    return NULL;
}

#ifndef MGT_LIBRARY_ENTRY
/* What the command printed must have reached standard output: a full device (>/dev/full), a
 * closed one or an I/O error would otherwise leave it lost with status 0. NULL if all is well,
 * else the message in err (rank 0; ferror holds a failure of any earlier write). */
static const char *stdout_failed(mgt_err *err) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return NULL;
    const int why = errno;
    char reason[128] = "";
    if (why)
        snprintf(reason, sizeof reason, " (%s)", strerror(why));
    mgt_errf(err,
             "cannot write to standard output%s: what mgtrain printed is incomplete; give it "
             "room, or send it elsewhere",
             reason);
    return err->msg;
}
#endif

int main(int argc, char **argv) {
#ifndef MGT_LIBRARY_ENTRY
    mgt_cpu_blas_choose(argv);
#endif
    mgt_runtime rt;
    mgt_runtime_init(&rt, &argc, &argv);
    mgt_cli c;
    mgt_err e;
    if (mgt_cli_parse(argc, argv, &c, &e) < 0)
        mgt_die_all("%s", e.msg);

    int rc = 0;
    switch (c.action) {
    case MGT_CLI_HELP:
        if (rt.rank == 0)
            mgt_cli_usage(stdout, c.help_cmd);
        break;
    case MGT_CLI_VERSION:
        if (rt.rank == 0) {
            char v[1024];
            mgt_version_text(v, sizeof v);
            fputs(v, stdout);
        }
        break;
    case MGT_CLI_PLOT: /* rank 0 draws; a run folder it cannot plot ends every rank alike */
        mgt_die_all_if_root(rt.rank == 0 && mgt_plot(c.plot_dir, &e) < 0 ? e.msg : NULL);
        break;
    case MGT_CLI_RUN: {
        const mgt_options *o = &c.o;
        mgt_die_all_if_root(rt.rank == 0 ? check_outputs(o, &e) : NULL);
        if (!strcmp(o->command, "eval"))
            rc = mgt_cmd_eval(&rt, o);
        else if (!strcmp(o->command, "predict"))
            rc = mgt_cmd_predict(&rt, o);
        else if (!strcmp(o->command, "summary"))
            rc = mgt_cmd_summary(&rt, o);
        else if (!strcmp(o->command, "convert"))
            rc = mgt_cmd_convert(&rt, o);
        else if (!strcmp(o->command, "export"))
            rc = mgt_cmd_export(&rt, o);
        else if (!strcmp(o->command, "generate"))
            rc = mgt_cmd_generate(&rt, o);
        else
            rc = mgt_cmd_train(&rt, o);
        break;
    }
    }
#ifndef MGT_LIBRARY_ENTRY
    /* A run stopped by SIGPIPE already said why, on stderr, and its status says it: the reader of
     * standard output is gone, so that its last lines were lost is no news. */
    if (rc == 128 + SIGPIPE)
        fflush(stdout);
    else
        mgt_die_all_if_root(rt.rank == 0 ? stdout_failed(&e) : NULL);
#else
    fflush(stdout); /* the program's own: it says what its errors on it mean */
#endif
    mgt_runtime_finalize(&rt);
    return rc;
}
