/* cli.h: the command line, as data and a parser that never prints and never exits.
 *
 *   mgtrain [train] [flags]     mgtrain eval|predict|summary [flags]     mgtrain plot RUN_DIR
 *   mgtrain convert SRC DST [flags]
 *   mgtrain help [COMMAND]      mgtrain [COMMAND] --help | -h      mgtrain --version
 *
 * mgt_cli_parse turns argv into what main.c should do: run a command with its options, print a
 * help text or the version, or draw a plot. Every mistake (an unknown or misspelled flag, a flag
 * of another command, a bad value, a path too long for the buffers it is copied into) comes back
 * as one sentence in an mgt_err, so main.c ends the job the same way on every rank and the parser
 * can be fuzzed in-process. */
#ifndef MGT_CLI_H
#define MGT_CLI_H

#include <stdio.h>

#include "options.h"
#include "util.h"

/* The longest path a flag may name: the plan and the data reader copy paths into 512-byte
 * buffers (the output folder, the data folder), and a path cut short would silently name
 * another place. */
#define MGT_CLI_MAX_PATH 511

typedef enum {
    MGT_CLI_RUN = 0, /* run o.command (train, eval, predict, summary, convert) */
    MGT_CLI_HELP,    /* print mgt_cli_usage(help_cmd) */
    MGT_CLI_VERSION, /* print the version and the backends built in */
    MGT_CLI_PLOT,    /* draw plot_dir/curves.png */
} mgt_cli_action;

typedef struct mgt_cli {
    mgt_cli_action action;
    mgt_options o;        /* RUN: the command and its flags (strings point into argv) */
    const char *help_cmd; /* HELP: the command whose flags to list; NULL: the general help */
    const char *plot_dir; /* PLOT */
} mgt_cli;

/* The options before any flag: each flag's default. */
void mgt_options_defaults(mgt_options *o);

/* Parses argv[1..argc) into c. Returns 0, or -1 with the message in err. Uses getopt_long, whose
 * state it resets on every call (so it is not reentrant), and lets it reorder argv. */
int mgt_cli_parse(int argc, char **argv, mgt_cli *c, mgt_err *err);

/* What the flag table says of flag `name` (without --): its default as the help text gives it,
 * whether it takes a value, whether the value is a path. -1 if there is no such flag. */
int mgt_cli_flag(const char *name, const char **def, int *takes_value, int *is_path);

/* The help text: the general one (cmd NULL), or one command's flags with their defaults. */
void mgt_cli_usage(FILE *f, const char *cmd);

#endif
