/* outputs.h: the files a command writes outside its run folder (train's --timeline, predict's
 * --output), checked by rank 0 before any work, as `gcc -o x.c x.c` is refused:
 *
 *  - not a device, pipe or folder (mgtrain writes a new file and renames it onto the path);
 *  - not a file the command reads: the model file, --weights or --init-weights, a file of the
 *    data folder; compared by identity (device and inode, so a link or another spelling of the
 *    path is the same file), not by name;
 *  - not a file mgtrain keeps in a run folder (rundir.h): the run's own --out, which may not
 *    exist yet (compared by its resolved path), or any folder that holds a run;
 *  - not an existing file mgtrain did not write, unless --overwrite says to replace it (a run
 *    folder that holds a run is treated the same way); an empty file holds nothing to lose;
 *  - in a folder that exists and can be written (a file created there and removed again), or in
 *    the run's own --out, which training creates: a wrong path is said at the start, not after
 *    the last epoch.
 * The run folder is an output too: a file the command reads that training would write there
 * (or --overwrite remove) is refused the same way. The check runs even when there is no other
 * output.
 *
 * Library code: returns -1 with one sentence in err; nothing here prints or exits. */
#ifndef MGT_OUTPUTS_H
#define MGT_OUTPUTS_H

#include <stddef.h>

#include "util.h"

enum { MGT_OUTPUTS_MAX = 4, MGT_OUTPUTS_READS_MAX = 8 };

/* An output of the command: its path and the flag that names it ("--timeline"). */
typedef struct mgt_output {
    const char *path, *flag;
    /* Recognises a file mgtrain wrote at this path before (it may be replaced without
     * --overwrite); NULL: none can be recognised, every existing file is the user's. */
    int (*ours)(const char *path);
} mgt_output;

typedef struct mgt_outputs_plan {
    mgt_output out[MGT_OUTPUTS_MAX];
    int nout;
    /* The files the command reads, and what each is ("the model file (--model)"). */
    const char *reads[MGT_OUTPUTS_READS_MAX], *read_what[MGT_OUTPUTS_READS_MAX];
    int nreads;
    const char *data_dir;   /* the data folder (NULL: synthetic data) */
    const char *run_dir;    /* train: its run folder, which may not exist yet (else NULL) */
    const char *model_copy; /* the name of its model copy there ("mlp.cfg") */
    int overwrite;          /* --overwrite */
} mgt_outputs_plan;

int mgt_outputs_check(const mgt_outputs_plan *p, mgt_err *err);

/* PATH as an absolute path with every link resolved, into out[n]; PATH need not exist (the part
 * that does not is taken as written, "." dropped and ".." taking off the last name). */
void mgt_path_resolve(const char *path, char *out, size_t n);

/* A --timeline file mgtrain wrote (its first bytes say so; profile.c writes them). */
int mgt_timeline_is_ours(const char *path);

#endif
