/* fuzz_cli.c: the command-line parser (src/cli.c).
 *
 * The input is an argument list: the bytes split at NUL characters (at most 64 arguments) after
 * the program name. Whatever the list, the parser returns: a command to run, a help text (which
 * then prints), the version, a plot, or an error message. A command to run (convert included)
 * has its path flags and operands within MGT_CLI_MAX_PATH and its numbers in their ranges. */
#include <string.h>

#include "cli.h"
#include "fuzz.h"

static void check_path(const char *p) {
    FUZZ_CHECK(!p || (p[0] && strlen(p) <= MGT_CLI_MAX_PATH), "path of %zu characters",
               p ? strlen(p) : 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    enum { MAX_ARGS = 64 };
    char *text = fuzz_text(data, size);
    if (!text)
        return 0;
    char prog[] = "mgtrain", *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = prog;
    for (size_t i = 0; i <= size && argc <= MAX_ARGS; i += strlen(text + i) + 1)
        argv[argc++] = text + i;
    argv[argc] = NULL;

    mgt_cli c;
    mgt_err e = {{0}};
    if (mgt_cli_parse(argc, argv, &c, &e) < 0) {
        FUZZ_CHECK(e.msg[0], "an error without a message");
        free(text);
        return 0;
    }
    switch (c.action) {
    case MGT_CLI_HELP: {
        FILE *null = fopen("/dev/null", "w");
        if (null) {
            mgt_cli_usage(null, c.help_cmd);
            fclose(null);
        }
        break;
    }
    case MGT_CLI_PLOT:
        check_path(c.plot_dir);
        FUZZ_CHECK(c.plot_dir != NULL, "plot without a folder");
        break;
    case MGT_CLI_VERSION:
        break;
    case MGT_CLI_RUN: {
        const mgt_options *o = &c.o;
        const char *cmds[] = {"train", "eval", "predict", "summary", "convert", "export", "generate"};
        int known = 0;
        for (int i = 0; i < 7; i++)
            known |= !strcmp(o->command, cmds[i]);
        FUZZ_CHECK(known, "command %s", o->command);
        if (!strcmp(o->command, "convert")) {
            FUZZ_CHECK(o->convert_src && o->convert_dst, "convert without SRC and DST");
            check_path(o->convert_src);
            check_path(o->convert_dst);
        }
        const char *paths[] = {o->model,    o->data,    o->out,   o->init_weights,
                               o->timeline, o->weights, o->output};
        for (int i = 0; i < 7; i++)
            check_path(paths[i]);
        FUZZ_CHECK(o->max_steps >= 0 && o->save_every >= 0 && o->debug_check >= 0, "counts");
        FUZZ_CHECK(o->verbose >= -1 && o->verbose <= 2, "--verbose %d", o->verbose);
        FUZZ_CHECK(!(o->resume && o->init_weights), "--resume with --init-weights");
        break;
    }
    default:
        FUZZ_CHECK(0, "action %d", (int)c.action);
    }
    free(text);
    return 0;
}
